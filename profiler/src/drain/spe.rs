//! Live Arm SPE: the records the AUX trace ([`AuxTrace`]) copied out are decoded with the same
//! profiler-common decoder the perf.data import uses, given a thread, and counted into the same
//! drained maps the capture program fills for other events: one sample per record, its PC the
//! sampled instruction (its only frame: SPE takes no call stacks), its data address, load latency
//! and data source in the data-line, latency and hardware views, its events and latencies in the
//! SPE counters.
//!
//! Which thread a record belongs to: per-task events (a command, `-p`) hand the AUX data over when
//! their thread leaves the CPU, so an AUX record's sample id names it. System-wide, a record's
//! context packet names the thread where Linux writes it (`CONFIG_PID_IN_CONTEXTIDR`); otherwise
//! its timestamp, in perf time, falls after the last switch record of its CPU, which names the
//! thread that ran. Records no rule places are counted under pid 0 and as a loss, not guessed.

use std::collections::HashMap;

use anyhow::Result;
use profiler_common::{
    capture::{DataLineKey, InstructionKey, LatencyKey, LineLatencyKey, LossKind},
    hw::spe::{DataSourceEncoding, Records, SpeRecord},
    latency::{bucket_index, LATENCY_BUCKETS},
};

use super::{
    add_on_cpu,
    hardware::{HardwareKey, Observation},
    Drained, DrainedStack,
};
use crate::capture::{
    aux_trace::{
        AuxTrace, CpuRead, SampleId, TraceRecord, PERF_AUX_FLAG_COLLISION, PERF_AUX_FLAG_TRUNCATED,
    },
    counters::Target,
};

/// What the stream counted beyond the samples: records and trace it could not use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeCounts {
    /// Records decoded and counted as samples.
    pub records: u64,
    /// Records whose packets did not decode, or without a PC.
    pub damaged: u64,
    /// Records no rule gave a thread (counted under pid 0).
    pub without_thread: u64,
    /// AUX records the kernel flagged truncated (the area was full) or colliding (the unit
    /// dropped records), and ring records it lost.
    pub trace_lost: u64,
}

impl SpeCounts {
    /// The counts as losses by kind.
    pub fn add_losses(&self, losses: &mut [u64; LossKind::COUNT]) {
        losses[LossKind::SpeRecordsDamaged as usize] += self.damaged;
        losses[LossKind::SpeRecordsWithoutThread as usize] += self.without_thread;
        losses[LossKind::SpeTraceLost as usize] += self.trace_lost;
    }
}

/// Switches kept per CPU at most: records are read within a second of the switches around
/// them, so only records without timestamps (`ts_enable=0`, which nothing prunes by) could let
/// an always-on agent's timelines grow without bound.
const MAX_SWITCHES_PER_CPU: usize = 1 << 16;

/// Threads named by context packets whose process is remembered at most, for the same reason.
const MAX_CONTEXT_THREADS: usize = 1 << 16;

/// Which thread ran on each CPU from when (system-wide): (perf time, pid, tid), in time order.
#[derive(Default)]
struct RunningThreads {
    per_cpu: HashMap<u32, Vec<(u64, u32, u32)>>,
}

impl RunningThreads {
    fn switched(&mut self, cpu: u32, time: u64, pid: u32, tid: u32) {
        let switches = self.per_cpu.entry(cpu).or_default();
        if switches.len() >= MAX_SWITCHES_PER_CPU {
            switches.drain(..MAX_SWITCHES_PER_CPU / 2);
        }
        switches.push((time, pid, tid));
    }

    /// The thread that ran on `cpu` at `time`.
    fn at(&self, cpu: u32, time: u64) -> Option<(u32, u32)> {
        let switches = self.per_cpu.get(&cpu)?;
        let after = switches.partition_point(|&(at, _, _)| at <= time);
        let &(_, pid, tid) = switches.get(after.checked_sub(1)?)?;
        Some((pid, tid))
    }

    /// Forgets the switches before the last one up to `time`: later records are later.
    fn forget_before(&mut self, cpu: u32, time: u64) {
        if let Some(switches) = self.per_cpu.get_mut(&cpu) {
            let after = switches.partition_point(|&(at, _, _)| at <= time);
            switches.drain(..after.saturating_sub(1));
        }
    }
}

/// The SPE event's trace, read into samples.
pub struct SpeStream {
    trace: AuxTrace,
    samples: SpeSamples,
}

impl SpeStream {
    /// Reads `trace`, the SPE event of index `event` opened for `target`.
    pub fn new(trace: AuxTrace, event: u32, target: &Target) -> SpeStream {
        SpeStream {
            trace,
            samples: SpeSamples::new(event, running_cpu_encoding(), target),
        }
    }

    pub fn enable(&mut self) -> Result<()> {
        self.trace.enable()
    }

    /// Decodes and counts what the trace holds now.
    pub fn read_into(&mut self, drained: &mut Drained) {
        for read in self.trace.read() {
            self.samples.add_read(read, drained);
        }
    }

    /// Stops the trace: the kernel hands over what the AUX areas hold, for a last read.
    pub fn disable(&mut self) -> Result<()> {
        self.trace.disable()
    }

    pub fn counts(&self) -> SpeCounts {
        self.samples.counts
    }

    /// The index of the SPE event.
    pub fn event(&self) -> u32 {
        self.samples.event
    }
}

/// Turns the records of reads into samples.
struct SpeSamples {
    event: u32,
    encoding: DataSourceEncoding,
    per_task: bool,
    running: RunningThreads,
    /// Processes of the threads context packets name.
    process_of: HashMap<u32, u32>,
    counts: SpeCounts,
}

impl SpeSamples {
    fn new(event: u32, encoding: DataSourceEncoding, target: &Target) -> SpeSamples {
        SpeSamples {
            event,
            encoding,
            per_task: !matches!(target, Target::System),
            running: RunningThreads::default(),
            process_of: HashMap::new(),
            counts: SpeCounts::default(),
        }
    }

    fn add_read(&mut self, read: CpuRead, drained: &mut Drained) {
        for item in read.items {
            match item.record {
                TraceRecord::Switch { out, other, id } => {
                    let (pid, tid) = if out { other } else { (id.pid, id.tid) };
                    self.running.switched(read.cpu, id.time, pid, tid);
                }
                TraceRecord::Lost { lost } => self.counts.trace_lost += lost,
                TraceRecord::Aux { flags, id, .. } => {
                    if flags & (PERF_AUX_FLAG_TRUNCATED | PERF_AUX_FLAG_COLLISION) != 0 {
                        self.counts.trace_lost += 1;
                    }
                    let mut last_time = None;
                    let mut records = Records::new(&item.aux);
                    for (record, _) in records.by_ref() {
                        let time = read.clock.zip(record.timestamp);
                        let time = time.map(|(clock, count)| clock.time_of(count));
                        last_time = time.or(last_time);
                        self.add_record(&record, read.cpu, id, time, drained);
                    }
                    self.counts.damaged += records.damage.records_dropped;
                    if let Some(time) = last_time {
                        self.running.forget_before(read.cpu, time);
                    }
                }
                TraceRecord::Other => {}
            }
        }
    }

    /// The (pid, tid) of a record of `cpu` in AUX data written for `owner`, at perf `time`.
    fn thread_of(
        &mut self,
        record: &SpeRecord,
        cpu: u32,
        owner: SampleId,
        time: Option<u64>,
    ) -> Option<(u32, u32)> {
        if self.per_task {
            return Some((owner.pid, owner.tid));
        }
        if let Some(tid) = record.context.and_then(|id| u32::try_from(id).ok()) {
            if tid != 0 {
                if self.process_of.len() >= MAX_CONTEXT_THREADS {
                    self.process_of.clear();
                }
                let pid = *self
                    .process_of
                    .entry(tid)
                    .or_insert_with(|| process_of_thread(tid).unwrap_or(tid));
                return Some((pid, tid));
            }
        }
        self.running.at(cpu, time?)
    }

    fn add_record(
        &mut self,
        record: &SpeRecord,
        cpu: u32,
        owner: SampleId,
        time: Option<u64>,
        drained: &mut Drained,
    ) {
        let Some(pc) = record.pc else {
            self.counts.damaged += 1;
            return;
        };
        let (pid, tid) = self.thread_of(record, cpu, owner, time).unwrap_or_else(|| {
            self.counts.without_thread += 1;
            (0, 0)
        });
        self.counts.records += 1;
        let event = self.event;
        let cpu = cpu as usize;
        // The PC is the stack: user or kernel by the exception level it ran at.
        let cache = &mut drained.stack_cache;
        let (user, kernel) = match record.exception_level {
            0 => (cache.intern(&[pc]), cache.intern(&[])),
            _ => (cache.intern(&[]), cache.intern(&[pc])),
        };
        let stack = DrainedStack {
            pid,
            tid,
            event,
            cgroup: 0,
            user,
            kernel,
        };
        add_on_cpu(drained.stacks.entry(stack).or_default(), cpu);

        let fields = record.sample_fields(self.encoding);
        let latency = fields.load_latency.unwrap_or(0);
        let ip = pc;
        drained
            .instructions
            .entry(InstructionKey { pid, event, ip })
            .or_default()
            .add_sample(latency);
        let line = fields.data_line();
        if let Some(line) = line {
            let key = DataLineKey {
                pid,
                tid,
                event,
                access: fields.access(),
                line,
                ip,
            };
            let (stats, per_cpu) = drained.data_lines.entry(key).or_default();
            stats.add_sample(latency);
            add_on_cpu(per_cpu, cpu);
        }
        if latency != 0 {
            let bucket = bucket_index(latency);
            let histogram = |buckets: &mut Vec<u64>| {
                buckets.resize(LATENCY_BUCKETS, 0);
                buckets[bucket] += 1;
            };
            histogram(
                drained
                    .latencies
                    .entry(LatencyKey { pid, event, ip })
                    .or_default(),
            );
            if let Some(line) = line {
                histogram(
                    drained
                        .line_latencies
                        .entry(LineLatencyKey { pid, event, line })
                        .or_default(),
                );
            }
        }
        let observation = Observation {
            data_source: fields.data_source,
            ibs: None,
            spe: Some(*record),
        };
        let key = HardwareKey {
            pid,
            event,
            ip,
            line,
        };
        drained.hardware.add(key, &observation);
    }
}

/// The thread group of `tid`, from /proc; `None` once it exited.
fn process_of_thread(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// How this machine's CPU encodes SPE data sources, from its MIDR_EL1 (arm64 sysfs).
fn running_cpu_encoding() -> DataSourceEncoding {
    std::fs::read_to_string("/sys/devices/system/cpu/cpu0/regs/identification/midr_el1")
        .ok()
        .and_then(|midr| u64::from_str_radix(midr.trim().trim_start_matches("0x"), 16).ok())
        .map_or(DataSourceEncoding::Unknown, DataSourceEncoding::for_midr)
}

#[cfg(test)]
mod tests {
    use profiler_common::capture::SampleStats;

    use super::*;
    use crate::capture::aux_trace::{PerfClock, TraceItem};

    const USER_PC: u64 = 0xaaaa_e4a9_b600;
    const KERNEL_PC: u64 = 0xffff_8000_1000_0040;
    const DATA: u64 = 0xaaaa_f000_1048;

    /// One SPE record's packets: PC (EL0 for user addresses, EL1 for kernel ones), an optional
    /// context, a load with its data address and total latency, then a timestamp or an End.
    fn spe_record(pc: u64, context: Option<u32>, timestamp: Option<u64>) -> Vec<u8> {
        let el: u64 = if pc >> 63 == 1 { 1 } else { 0 };
        let mut bytes = vec![0xb0];
        bytes.extend(((pc & ((1 << 56) - 1)) | (el << 61) | (1 << 63)).to_le_bytes());
        if let Some(tid) = context {
            bytes.push(0x65);
            bytes.extend(tid.to_le_bytes());
        }
        bytes.extend([0x49, 0x00]); // a load
        bytes.push(0xb2);
        bytes.extend(DATA.to_le_bytes());
        bytes.push(0x98); // total latency: 300 cycles
        bytes.extend(300u16.to_le_bytes());
        match timestamp {
            Some(count) => {
                bytes.push(0x71);
                bytes.extend(count.to_le_bytes());
            }
            None => bytes.push(0x01),
        }
        bytes
    }

    fn id(pid: u32, tid: u32, time: u64) -> SampleId {
        SampleId {
            pid,
            tid,
            time,
            cpu: 1,
        }
    }

    fn aux(owner: SampleId, flags: u64, records: &[Vec<u8>]) -> TraceItem {
        let bytes: Vec<u8> = records.concat();
        TraceItem {
            record: TraceRecord::Aux {
                offset: 0,
                size: bytes.len() as u64,
                flags,
                id: owner,
            },
            aux: bytes,
        }
    }

    fn switch(out: bool, other: (u32, u32), id: SampleId) -> TraceItem {
        TraceItem {
            record: TraceRecord::Switch { out, other, id },
            aux: Vec::new(),
        }
    }

    /// Counts as one, the clock's counts being perf nanoseconds.
    const CLOCK: PerfClock = PerfClock {
        zero: 0,
        mult: 1,
        shift: 0,
        short: None,
    };

    fn read(items: Vec<TraceItem>) -> CpuRead {
        CpuRead {
            cpu: 1,
            clock: Some(CLOCK),
            items,
        }
    }

    /// Samples per (pid, tid).
    fn threads(drained: &Drained) -> Vec<(u32, u32, u64)> {
        let mut threads = std::collections::BTreeMap::new();
        for (stack, per_cpu) in &drained.stacks {
            *threads.entry((stack.pid, stack.tid)).or_default() += per_cpu.iter().sum::<u64>();
        }
        threads
            .into_iter()
            .map(|((pid, tid), samples)| (pid, tid, samples))
            .collect()
    }

    #[test]
    fn per_task_records_belong_to_the_task_the_kernel_wrote_them_for() {
        let mut samples = SpeSamples::new(3, DataSourceEncoding::Unknown, &Target::Command(7));
        let mut drained = Drained::default();
        // A context packet naming another thread does not override the owning task.
        let records = [
            spe_record(USER_PC, Some(99), None),
            spe_record(KERNEL_PC, None, None),
        ];
        samples.add_read(read(vec![aux(id(7, 8, 10), 0, &records)]), &mut drained);
        assert_eq!(threads(&drained), vec![(7, 8, 2)]);
        // Each record is a sample: its PC the only frame, user or kernel by exception level.
        let cache = &drained.stack_cache;
        let mut stacks: Vec<(Vec<u64>, Vec<u64>, Vec<u64>)> = drained
            .stacks
            .iter()
            .map(|(stack, per_cpu)| {
                (
                    cache.frames(stack.user).to_vec(),
                    cache.frames(stack.kernel).to_vec(),
                    per_cpu.clone(),
                )
            })
            .collect();
        stacks.sort();
        assert_eq!(
            stacks,
            vec![
                (vec![], vec![KERNEL_PC], vec![0, 1]),
                (vec![USER_PC], vec![], vec![0, 1]),
            ]
        );
        assert!(drained.stacks.keys().all(|s| s.event == 3));
        // The load's data line and latency, in the data-line and latency views.
        let user = InstructionKey {
            pid: 7,
            event: 3,
            ip: USER_PC,
        };
        assert_eq!(
            drained.instructions[&user],
            SampleStats {
                count: 1,
                latency_count: 1,
                latency_sum: 300,
                latency_max: 300
            }
        );
        let lines: Vec<(u64, u64, u32)> = drained
            .data_lines
            .keys()
            .map(|key| (key.line, key.ip, key.tid))
            .collect();
        assert!(lines.contains(&(0xaaaa_f000_1040, USER_PC, 8)), "{lines:?}");
        let histogram = &drained.latencies[&LatencyKey {
            pid: 7,
            event: 3,
            ip: USER_PC,
        }];
        assert_eq!(histogram[bucket_index(300)], 1);
        assert_eq!(histogram.iter().sum::<u64>(), 1);
        assert_eq!(
            samples.counts,
            SpeCounts {
                records: 2,
                ..SpeCounts::default()
            }
        );
        let hardware = std::mem::take(&mut drained.hardware).finish(|_, _| 0);
        assert_eq!(hardware.iter().map(|h| h.samples).sum::<u64>(), 2);
        assert!(hardware.iter().all(|h| h.spe.is_some()));
    }

    #[test]
    fn system_wide_records_take_the_thread_of_their_context_or_of_the_last_switch() {
        let mut samples = SpeSamples::new(0, DataSourceEncoding::Unknown, &Target::System);
        let mut drained = Drained::default();
        let kernel_owner = id(u32::MAX, u32::MAX, 0);
        samples.add_read(
            read(vec![
                // Before any switch: nobody known to run.
                aux(kernel_owner, 0, &[spe_record(USER_PC, None, Some(500))]),
                // Thread 21 of 20 runs from 1,000, then 31 of 30 (named by the switch out).
                switch(false, (0, 0), id(20, 21, 1_000)),
                switch(true, (30, 31), id(20, 21, 2_000)),
            ]),
            &mut drained,
        );
        samples.add_read(
            read(vec![
                aux(
                    kernel_owner,
                    PERF_AUX_FLAG_TRUNCATED,
                    &[
                        spe_record(USER_PC, None, Some(1_500)),
                        spe_record(USER_PC, None, Some(2_500)),
                        spe_record(USER_PC, Some(1), Some(2_600)),
                        // Cut off: its packets end in the middle of the data address.
                        spe_record(USER_PC, None, None)[..12].to_vec(),
                    ],
                ),
                TraceItem {
                    record: TraceRecord::Lost { lost: 2 },
                    aux: Vec::new(),
                },
            ]),
            &mut drained,
        );
        // Thread 1 is init here (process 1), named by the context packet.
        assert_eq!(
            threads(&drained),
            vec![(0, 0, 1), (1, 1, 1), (20, 21, 1), (30, 31, 1)]
        );
        assert_eq!(
            samples.counts,
            SpeCounts {
                records: 4,
                damaged: 1,
                without_thread: 1,
                trace_lost: 3,
            }
        );
        let mut losses = [0; LossKind::COUNT];
        samples.counts.add_losses(&mut losses);
        assert_eq!(losses[LossKind::SpeRecordsDamaged as usize], 1);
        assert_eq!(losses[LossKind::SpeRecordsWithoutThread as usize], 1);
        assert_eq!(losses[LossKind::SpeTraceLost as usize], 3);
        // Switches older than the last record's are forgotten, the one still running kept.
        assert_eq!(samples.running.per_cpu[&1], vec![(2_000, 30, 31)]);
    }

    #[test]
    fn switches_without_timestamped_records_to_prune_them_stay_bounded() {
        let mut running = RunningThreads::default();
        for time in 0..3 * MAX_SWITCHES_PER_CPU as u64 {
            running.switched(2, time, 1, 1);
        }
        let kept = &running.per_cpu[&2];
        assert!(kept.len() <= MAX_SWITCHES_PER_CPU, "{}", kept.len());
        // The newest are kept, in order.
        assert_eq!(kept.last().unwrap().0, 3 * MAX_SWITCHES_PER_CPU as u64 - 1);
        assert!(kept.windows(2).all(|pair| pair[0].0 < pair[1].0));
    }
}
