//! A parsed perf.data recording turned into our [`Profile`], so `perf record` captures (made on
//! machines with hardware PMUs) get every report a live recording gets.
//!
//! Processes are rebuilt from the file's MMAP/MMAP2, COMM, FORK and EXIT records, applied in time
//! order; each address is then symbolized against its process's newest mapping that contains it.
//! Samples give stacks (kernel then user callchain, leaf first; the IP alone without a
//! callchain), instructions, data cache lines (PERF_SAMPLE_ADDR), load-latency histograms
//! (weight var1, or the IBS data-cache miss latency) and the hardware aggregates: the kernel's
//! `perf_mem_data_src` and, for AMD IBS events (found through the file's PMU mappings), the
//! registers in PERF_SAMPLE_RAW decoded with `profiler_common::hw::ibs`. Arm SPE records arrive
//! in the file's AUX trace data instead of samples: each record becomes a sample of the SPE
//! event, its packets in place of the raw registers, decoded with `profiler_common::hw::spe`.
//!
//! The samples are counted here as the kernel's maps count a live capture's, keyed alike, and
//! the counts become the profile through the live capture's builder ([`ProfileBuilder`]).

use profiler_common::capture::{
    DataLineKey, InstructionKey, LatencyKey, LineLatencyKey, LossKind, SampleStats,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::bail;
use profiler_common::hw::ibs::{IbsErrata, IbsFetchSample, IbsOpSample};
use profiler_common::hw::spe::{DataSourceEncoding, Records as SpeRecords, SpeRecord};
use profiler_common::hw::weight::{SampleWeight, WeightFormat};
use profiler_common::hw::SampleFields;
use profiler_common::latency::bucket_index;

use crate::assemble::{Origin, ProfileBuilder, StackSampleKey};
use crate::drain::hardware::{HardwareAccumulator, HardwareKey, IbsSample, Observation};
use crate::events::catalog::{self, unit};
use crate::perf_data::{
    maps_code, Comm, CpuMode, Features, Mmap, PerfAttr, PerfData, PerfSample, Sampling, TaskEvent,
    PERF_SAMPLE_CALLCHAIN, PERF_SAMPLE_IP,
};
use crate::process::{FileIdentity, FileInode, Mapping, ProcessTable};
use crate::profile::{CpuIdentity, EventIndex, EventInfo, Losses, Profile, ProfileMeta};
use crate::symbolize::FrameTable;
use crate::unwind::copy::{CopyUnwinder, StackCopy, StackEnd, UserRegisters};

/// IBS_OP_CTL bit 19 (the `cnt_ctl` format term): the period counts dispatched ops, not cycles.
const IBS_OP_COUNTS_OPS: u64 = 1 << 19;
/// Where the registers the copy unwinder starts from are in PERF_SAMPLE_REGS_USER, by the
/// recording's architecture (arch/*/include/uapi/asm/perf_regs.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct UserRegisterBits {
    ip: u32,
    sp: u32,
    fp: u32,
    /// aarch64's link register; x86-64 has none.
    link: Option<u32>,
}

impl UserRegisterBits {
    /// For a recording made on `architecture` (perf's `HEADER_ARCH`, `uname -m`), when the copy
    /// unwinder, which walks this machine's architecture, can walk its stacks. Recordings
    /// without the header are taken as x86-64, as all were before aarch64 was read.
    fn for_recording(architecture: Option<&str>) -> Option<UserRegisterBits> {
        let architecture = architecture.unwrap_or("x86_64");
        if architecture != std::env::consts::ARCH {
            return None;
        }
        match architecture {
            "x86_64" => Some(UserRegisterBits {
                ip: 8,
                sp: 7,
                fp: 6,
                link: None,
            }),
            "aarch64" => Some(UserRegisterBits {
                ip: 32,
                sp: 31,
                fp: 29,
                link: Some(30),
            }),
            _ => None,
        }
    }
}
/// PERF_SAMPLE_REGS_ABI_64: the registers are a 64-bit task's.
const PERF_SAMPLE_REGS_ABI_64: u64 = 2;

/// Converts a parsed perf.data file into a profile, symbolizing its addresses from the files
/// the recording mapped (as this machine has them now).
pub fn profile_from_perf_data(data: &PerfData) -> anyhow::Result<Profile> {
    let events: Vec<ImportedEvent> = data
        .attrs
        .iter()
        .map(|attr| ImportedEvent::new(attr, &data.features))
        .collect();
    if let Some(event) = data
        .attrs
        .iter()
        .zip(&events)
        .find(|(attr, _)| !attr.samples(PERF_SAMPLE_IP) && !attr.samples(PERF_SAMPLE_CALLCHAIN))
        .map(|(_, event)| event)
    {
        bail!(
            "event '{}' in this perf.data recorded neither instruction pointers nor callchains \
             (sample_type lacks IP and CALLCHAIN), so its samples cannot be attributed to code: \
             record again with -g, or without the options that drop the IP",
            event.info.name
        );
    }
    let cpu = cpu_identity(&data.features);
    let errata = match &cpu {
        Some(cpu) if cpu.vendor == "AuthenticAMD" => IbsErrata::for_cpu(cpu.family, cpu.model),
        _ => IbsErrata::default(),
    };

    let processes = process_table(data);
    let mut user_stacks = UserStacks {
        processes: &processes,
        unwinder: CopyUnwinder::default(),
        registers: UserRegisterBits::for_recording(data.features.arch.as_deref()),
    };
    let mut aggregates = Aggregates::default();
    let spe_samples = aggregates.spe_samples(data, &events);
    let samples = data.samples.iter().map(|sample| (sample, None)).chain(
        spe_samples
            .iter()
            .map(|(sample, record)| (sample, Some(record))),
    );
    for (sample, spe) in samples {
        let attr = &data.attrs[sample.attr_index];
        aggregates.add(
            sample,
            spe,
            attr,
            &events[sample.attr_index],
            errata,
            &mut user_stacks,
        );
    }

    // Losses first: the builder takes the aggregates' hardware observations.
    let losses = losses(data, &aggregates);
    let mut builder = ProfileBuilder::new(FrameTable::new(&processes), Origin::Recording);
    for (key, counts) in &aggregates.stacks {
        let stack = StackSampleKey {
            pid: key.pid,
            tid: key.tid,
            event: key.event,
            cgroup: 0,
            kernel: builder.stack(0, &key.kernel),
            user: builder.stack(key.pid, &key.user),
            kernel_stack_lost: false,
            user_stack_lost: false,
        };
        builder.add_stack(stack, counts.total, counts.per_cpu.clone());
    }
    for &(pid, tid) in &aggregates.threads {
        builder.add_thread(pid, tid, 0);
    }
    for (key, stats) in &aggregates.instructions {
        builder.add_instruction(*key, *stats);
    }
    for (key, (stats, per_cpu)) in &aggregates.data_lines {
        builder.add_data_line(*key, *stats, per_cpu.per_cpu.clone());
    }
    let sparse = |buckets: &BTreeMap<u16, u64>| buckets.iter().map(|(&b, &n)| (b, n)).collect();
    for (key, buckets) in &aggregates.latencies {
        builder.add_latency(*key, sparse(buckets));
    }
    for (key, buckets) in &aggregates.line_latencies {
        builder.add_line_latency(*key, sparse(buckets));
    }
    builder.set_hardware(aggregates.hardware);
    let mut profile = builder.build(
        meta(&data.features),
        events.into_iter().map(|event| event.info).collect(),
        losses,
    );
    profile.hardware.cpu = cpu;
    Ok(profile)
}

/// How an event's samples are read.
struct ImportedEvent {
    info: EventInfo,
    sampler: Sampler,
    weight: Option<WeightFormat>,
    /// How the recording CPU encodes SPE data sources (perf's HEADER_CPUID holds MIDR_EL1 on
    /// arm64).
    spe_encoding: DataSourceEncoding,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sampler {
    IbsOp,
    IbsFetch,
    /// Arm SPE: samples are the records of the AUX trace data.
    Spe,
    /// Everything else: what the kernel decoded is in the sample's own fields.
    Kernel,
}

impl ImportedEvent {
    fn new(attr: &PerfAttr, features: &Features) -> ImportedEvent {
        let pmu = features
            .pmu_mappings
            .iter()
            .find(|(type_, _)| *type_ == attr.event_type)
            .map(|(_, name)| name.as_str());
        let sampler = match pmu {
            Some("ibs_op") => Sampler::IbsOp,
            Some("ibs_fetch") => Sampler::IbsFetch,
            Some(pmu) if pmu.starts_with("arm_spe") => Sampler::Spe,
            _ => Sampler::Kernel,
        };
        let known = catalog::events()
            .iter()
            .find(|event| event.type_ == attr.event_type && event.config == attr.config);
        let name = match (&attr.name, known, pmu) {
            (Some(name), _, _) => name.clone(),
            (None, Some(event), _) => event.name.clone(),
            (None, None, Some(pmu)) => format!("{pmu}/config={:#x}/", attr.config),
            (None, None, None) => format!("type {} config {:#x}", attr.event_type, attr.config),
        };
        let unit = match (sampler, known) {
            (Sampler::IbsOp, _) if attr.config & IBS_OP_COUNTS_OPS != 0 => "dispatched ops",
            (Sampler::IbsOp, _) => unit::CPU_CYCLES,
            (Sampler::IbsFetch, _) => "fetches",
            (Sampler::Spe, _) => unit::OPERATIONS,
            (Sampler::Kernel, Some(event)) => event.unit,
            (Sampler::Kernel, None) => unit::EVENTS,
        };
        let (period, frequency) = match attr.sampling {
            Sampling::Period(period) => (Some(period), None),
            Sampling::Frequency(hz) => (None, Some(hz)),
        };
        ImportedEvent {
            info: EventInfo {
                name,
                period,
                frequency,
                unit: unit.to_string(),
                // IBS and SPE tag the instruction itself: no skid.
                precise: attr.precise_ip > 0 || sampler != Sampler::Kernel,
            },
            sampler,
            weight: WeightFormat::from_sample_type(attr.sample_type),
            spe_encoding: features
                .cpuid
                .as_deref()
                .and_then(|midr| u64::from_str_radix(midr.trim().trim_start_matches("0x"), 16).ok())
                .map_or(DataSourceEncoding::Unknown, DataSourceEncoding::for_midr),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct StackKey {
    pid: u32,
    tid: u32,
    event: EventIndex,
    kernel: Vec<u64>,
    user: Vec<u64>,
}

/// A sample count, in total and per CPU (index = CPU number; empty when no sample had a CPU).
#[derive(Clone, Debug, Default)]
struct Counts {
    total: u64,
    per_cpu: Vec<u64>,
}

/// CPU numbers above the kernel's largest `NR_CPUS` come from a damaged or crafted file: such
/// samples count in totals, not in a per-CPU row (which would be sized by the number).
const MAX_CPUS: usize = 8192;

impl Counts {
    fn add(&mut self, cpu: Option<u32>) {
        self.total += 1;
        if let Some(cpu) = cpu.map(|cpu| cpu as usize).filter(|&cpu| cpu < MAX_CPUS) {
            if self.per_cpu.len() <= cpu {
                self.per_cpu.resize(cpu + 1, 0);
            }
            self.per_cpu[cpu] += 1;
        }
    }
}

/// Samples aggregated by what they hit, before symbolization.
#[derive(Default)]
struct Aggregates {
    stacks: HashMap<StackKey, Counts>,
    /// Keyed like the live capture's maps.
    instructions: BTreeMap<InstructionKey, SampleStats>,
    data_lines: BTreeMap<DataLineKey, (SampleStats, Counts)>,
    /// Latency buckets per instruction.
    latencies: BTreeMap<LatencyKey, BTreeMap<u16, u64>>,
    /// Latency buckets per data cache line.
    line_latencies: BTreeMap<LineLatencyKey, BTreeMap<u16, u64>>,
    hardware: HardwareAccumulator,
    threads: BTreeSet<(u32, u32)>,
    samples_per_event: BTreeMap<EventIndex, u64>,
    /// Sum of the recorded periods (PERF_SAMPLE_PERIOD) per event: with frequency sampling the
    /// kernel varies them, and their mean estimates the events a sample stands for.
    period_sums: BTreeMap<EventIndex, u64>,
    /// IBS samples whose raw registers could not be read.
    unreadable_ibs: u64,
    /// Arm SPE records lost to packets that did not decode, or cut off by a buffer's end.
    damaged_spe_records: u64,
    /// Arm SPE records without a context packet or a traced thread to name their thread.
    spe_records_without_thread: u64,
    /// Bytes of AUX trace data of tracers other than SPE (Intel PT, CoreSight...), not read.
    unread_aux_bytes: u64,
    /// How the walks of copied user stacks ended.
    unwind_ends: BTreeMap<StackEnd, u64>,
}

/// Unwinds the user stacks that samples recorded with `--call-graph dwarf` carry.
struct UserStacks<'a> {
    processes: &'a ProcessTable,
    unwinder: CopyUnwinder,
    /// `None` when the recording is of another architecture: its recorded call chains stand.
    registers: Option<UserRegisterBits>,
}

impl UserStacks<'_> {
    /// The sample's user frames walked from its user registers and stack copy, when it has
    /// both (PERF_SAMPLE_REGS_USER with IP, SP and BP, and PERF_SAMPLE_STACK_USER).
    fn unwind(
        &mut self,
        sample: &PerfSample,
        attr: &PerfAttr,
        pid: u32,
    ) -> Option<(Vec<u64>, StackEnd)> {
        let registers = sample.regs_user.as_ref()?;
        let stack = sample.stack_user.as_ref()?;
        if registers.abi != PERF_SAMPLE_REGS_ABI_64 || stack.dyn_size == 0 {
            return None;
        }
        let bits = self.registers?;
        let register = |bit| registers.get(attr.sample_regs_user, bit);
        let registers = UserRegisters {
            ip: register(bits.ip)?,
            sp: register(bits.sp)?,
            fp: register(bits.fp)?,
            link: match bits.link {
                Some(bit) => register(bit)?,
                None => 0,
            },
        };
        let copied = usize::try_from(stack.dyn_size)
            .unwrap_or(usize::MAX)
            .min(stack.data.len());
        let unwound = self.unwinder.unwind(
            self.processes,
            pid,
            registers,
            StackCopy {
                start: registers.sp,
                bytes: &stack.data[..copied],
            },
        );
        Some((unwound.frames, unwound.end))
    }
}

impl Aggregates {
    /// `spe`: the SPE record `sample` was made of (see [`Aggregates::spe_samples`]).
    fn add(
        &mut self,
        sample: &PerfSample,
        spe: Option<&SpeRecord>,
        attr: &PerfAttr,
        event: &ImportedEvent,
        errata: IbsErrata,
        user_stacks: &mut UserStacks,
    ) {
        let index = sample.attr_index as EventIndex;
        let pid = sample.pid.unwrap_or(0);
        let tid = sample.tid.unwrap_or(pid);
        *self.samples_per_event.entry(index).or_default() += 1;
        if let Some(period) = sample.period {
            *self.period_sums.entry(index).or_default() += period;
        }
        self.threads.insert((pid, tid));

        let unwound = user_stacks.unwind(sample, attr, pid);
        if let Some((_, end)) = &unwound {
            *self.unwind_ends.entry(*end).or_default() += 1;
        }
        let (kernel, user) = if let Some((user, _)) = unwound {
            let kernel = match sample.ip {
                // A kernel-mode sample without a callchain: its kernel frame is the IP.
                Some(ip)
                    if sample.callchain_kernel.is_empty()
                        && crate::symbolize::is_kernel_address(ip) =>
                {
                    vec![ip]
                }
                _ => sample.callchain_kernel.clone(),
            };
            (kernel, user)
        } else if sample.callchain_kernel.is_empty() && sample.callchain_user.is_empty() {
            let ip = sample.ip.into_iter().collect::<Vec<u64>>();
            if sample.ip.is_some_and(crate::symbolize::is_kernel_address) {
                (ip, Vec::new())
            } else {
                (Vec::new(), ip)
            }
        } else {
            (
                sample.callchain_kernel.clone(),
                sample.callchain_user.clone(),
            )
        };
        let Some(ip) = sample
            .ip
            .or_else(|| kernel.first().or(user.first()).copied())
        else {
            return;
        };
        self.stacks
            .entry(StackKey {
                pid,
                tid,
                event: index,
                kernel,
                user,
            })
            .or_default()
            .add(sample.cpu);

        let (fields, observation) = self.decode(sample, spe, event, errata);
        let latency = fields.load_latency.unwrap_or(0);
        self.instructions
            .entry(InstructionKey {
                pid,
                event: index,
                ip,
            })
            .or_default()
            .add_sample(latency);
        let line = fields.data_line();
        if let Some(line) = line {
            let access = fields.access();
            let (stats, counts) = self
                .data_lines
                .entry(DataLineKey {
                    pid,
                    tid,
                    event: index,
                    access,
                    line,
                    ip,
                })
                .or_default();
            stats.add_sample(latency);
            counts.add(sample.cpu);
        }
        if latency != 0 {
            let bucket = bucket_index(latency) as u16;
            let count = |histogram: &mut BTreeMap<u16, u64>| {
                *histogram.entry(bucket).or_default() += 1;
            };
            count(
                self.latencies
                    .entry(LatencyKey {
                        pid,
                        event: index,
                        ip,
                    })
                    .or_default(),
            );
            if let Some(line) = line {
                count(
                    self.line_latencies
                        .entry(LineLatencyKey {
                            pid,
                            event: index,
                            line,
                        })
                        .or_default(),
                );
            }
        }
        let key = HardwareKey {
            pid,
            event: index,
            ip,
            line,
        };
        self.hardware.add(key, &observation);
    }

    /// The sample's hardware fields and observation: what the kernel put in the sample,
    /// completed from the IBS registers where the kernel left a field out, or an SPE record's.
    fn decode(
        &mut self,
        sample: &PerfSample,
        spe: Option<&SpeRecord>,
        event: &ImportedEvent,
        errata: IbsErrata,
    ) -> (SampleFields, Observation) {
        let (fields, ibs, spe) = self.decode_fields(sample, spe, event, errata);
        let observation = Observation {
            data_source: fields.data_source,
            ibs,
            spe,
        };
        (fields, observation)
    }

    fn decode_fields(
        &mut self,
        sample: &PerfSample,
        spe: Option<&SpeRecord>,
        event: &ImportedEvent,
        errata: IbsErrata,
    ) -> (
        SampleFields,
        Option<(profiler_common::hw::ibs::IbsCaps, IbsSample)>,
        Option<SpeRecord>,
    ) {
        let weight = sample
            .weight
            .zip(event.weight)
            .map(|(weight, format)| SampleWeight::decode(weight.raw, format));
        // Events that do not report a data address leave PERF_SAMPLE_ADDR zero.
        let addr = sample.addr.filter(|&addr| addr != 0);
        let kernel =
            SampleFields::from_perf_sample(addr, sample.phys_addr, weight, sample.data_src);
        if let Some(record) = spe {
            return (
                record.sample_fields(event.spe_encoding),
                None,
                Some(*record),
            );
        }
        let Some(raw) = sample.raw.as_deref() else {
            return (kernel, None, None);
        };
        match event.sampler {
            // SPE samples come with their record, decoded once (above).
            Sampler::Kernel | Sampler::Spe => (kernel, None, None),
            Sampler::IbsOp => match IbsOpSample::parse(raw) {
                Ok(registers) => {
                    let op = registers.decode(errata);
                    let decoded = op.sample_fields();
                    let fields = SampleFields {
                        data_addr: kernel.data_addr.or(decoded.data_addr),
                        phys_addr: kernel.phys_addr.or(decoded.phys_addr),
                        load_latency: kernel.load_latency.or(decoded.load_latency),
                        instruction_latency: kernel
                            .instruction_latency
                            .or(decoded.instruction_latency),
                        data_source: kernel.data_source.or(decoded.data_source),
                        ..decoded
                    };
                    (fields, Some((registers.caps, IbsSample::Op(op))), None)
                }
                Err(_) => {
                    self.unreadable_ibs += 1;
                    (kernel, None, None)
                }
            },
            Sampler::IbsFetch => match IbsFetchSample::parse(raw) {
                Ok(registers) => (
                    kernel,
                    Some((registers.caps, IbsSample::Fetch(registers.decode(errata)))),
                    None,
                ),
                Err(_) => {
                    self.unreadable_ibs += 1;
                    (kernel, None, None)
                }
            },
        }
    }

    /// The Arm SPE records of the file's AUX trace data as samples of its SPE event, each with
    /// the record it was made of: IP the record's PC, thread from its context packet (the
    /// thread id, where the kernel writes it) or the traced thread. AUX data without an SPE
    /// event is counted, not read.
    fn spe_samples(
        &mut self,
        data: &PerfData,
        events: &[ImportedEvent],
    ) -> Vec<(PerfSample, SpeRecord)> {
        let Some(attr_index) = events.iter().position(|e| e.sampler == Sampler::Spe) else {
            self.unread_aux_bytes = data.aux_traces.iter().map(|t| t.data.len() as u64).sum();
            return Vec::new();
        };
        let process_of: HashMap<u32, u32> = data
            .comms
            .iter()
            .map(|comm| (comm.tid, comm.pid))
            .chain(data.forks.iter().map(|fork| (fork.tid, fork.pid)))
            .collect();
        let mut samples = Vec::new();
        for trace in &data.aux_traces {
            let mut records = SpeRecords::new(&trace.data);
            for (record, _) in records.by_ref() {
                let Some(pc) = record.pc else {
                    self.damaged_spe_records += 1;
                    continue;
                };
                let tid = record
                    .context
                    .and_then(|id| u32::try_from(id).ok())
                    .or(trace.tid);
                if tid.is_none() {
                    self.spe_records_without_thread += 1;
                }
                let tid = tid.unwrap_or(0);
                let sample = PerfSample {
                    attr_index,
                    cpumode: if record.exception_level == 0 {
                        CpuMode::User
                    } else {
                        CpuMode::Kernel
                    },
                    exact_ip: true,
                    ip: Some(pc),
                    pid: Some(process_of.get(&tid).copied().unwrap_or(tid)),
                    tid: Some(tid),
                    cpu: trace.cpu,
                    ..PerfSample::default()
                };
                samples.push((sample, record));
            }
            self.damaged_spe_records += records.damage.records_dropped;
        }
        samples
    }
}

/// One side-band record, to be applied in time order.
enum Change<'a> {
    Fork(&'a TaskEvent),
    Comm(&'a Comm),
    Mmap(&'a Mmap),
    Exit(&'a TaskEvent),
}

/// The processes as the recording saw them: side-band records applied in time order; at equal
/// times (records perf synthesized at start) forks first, then names, mappings and exits.
fn process_table(data: &PerfData) -> ProcessTable {
    let mut changes: Vec<(u64, u8, Change)> = Vec::new();
    changes.extend(data.forks.iter().map(|f| (f.time, 0, Change::Fork(f))));
    changes.extend(
        data.comms
            .iter()
            .map(|c| (c.time.unwrap_or(0), 1, Change::Comm(c))),
    );
    changes.extend(
        data.mmaps
            .iter()
            .map(|m| (m.time.unwrap_or(0), 2, Change::Mmap(m))),
    );
    changes.extend(data.exits.iter().map(|e| (e.time, 3, Change::Exit(e))));
    changes.sort_by_key(|(time, rank, _)| (*time, *rank));

    let build_ids: HashMap<&str, &[u8]> = data
        .features
        .build_ids
        .iter()
        .map(|id| (id.filename.as_str(), id.build_id.as_slice()))
        .collect();
    let mut table = ProcessTable::default();
    // Module files on this host, opened once each: nothing of an import is read by path later.
    let mut opened: HashMap<&str, Option<FileIdentity>> = HashMap::new();
    for (_, _, change) in changes {
        match change {
            Change::Fork(fork) => table.fork(fork.pid, fork.ppid),
            Change::Comm(comm) => {
                table.name_thread(comm.pid, comm.tid, comm.comm.clone(), comm.exec)
            }
            // The kernel's own mappings (pid -1): kernel addresses are symbolized from kallsyms.
            Change::Mmap(mmap) if mmap.pid == u32::MAX => {}
            Change::Mmap(mmap) => {
                let executable = maps_code(mmap.prot, mmap.data);
                let build_id = mmap
                    .build_id
                    .clone()
                    .or_else(|| build_ids.get(mmap.filename.as_str()).map(|id| id.to_vec()));
                let inode = mmap.file_id.map(FileInode::from);
                let file = if executable && mmap.filename.starts_with('/') {
                    *opened.entry(mmap.filename.as_str()).or_insert_with(|| {
                        table
                            .files
                            .open_path(&mmap.filename, build_id.as_deref(), inode)
                    })
                } else {
                    None
                };
                table.map(
                    mmap.pid,
                    Mapping {
                        start: mmap.start,
                        end: mmap.start.saturating_add(mmap.len),
                        file_offset: mmap.pgoff,
                        path: mmap.filename.as_str().into(),
                        executable,
                        build_id: build_id.map(Into::into),
                        file,
                    },
                )
            }
            Change::Exit(exit) if exit.pid == exit.tid => table.exit(exit.pid),
            Change::Exit(_) => {}
        }
    }
    table.lost_records = data.lost;
    table
}

/// Vendor, family and model from the CPUID feature ("AuthenticAMD,25,17,1").
fn cpu_identity(features: &Features) -> Option<CpuIdentity> {
    let mut parts = features.cpuid.as_deref()?.split(',');
    let vendor = parts.next()?.to_string();
    let family = parts.next()?.trim().parse().ok()?;
    let model = parts.next()?.trim().parse().ok()?;
    Some(CpuIdentity {
        vendor,
        family,
        model,
    })
}

fn meta(features: &Features) -> ProfileMeta {
    ProfileMeta {
        profiler_version: features
            .perf_version
            .as_ref()
            .map_or_else(|| "perf".to_string(), |version| format!("perf {version}")),
        hostname: features.hostname.clone().unwrap_or_default(),
        kernel_release: features.os_release.clone().unwrap_or_default(),
        target: features.cmdline.join(" "),
        // perf.data keeps sample times on the kernel's monotonic clock, not wall time.
        start_unix_ns: 0,
        duration_ns: features
            .sample_time
            .map_or(0, |(first, last)| last.saturating_sub(first)),
        architecture: features.arch.clone().unwrap_or_default(),
    }
}

fn losses(data: &PerfData, aggregates: &Aggregates) -> Losses {
    let per_event = |counts: &BTreeMap<EventIndex, u64>| -> Vec<u64> {
        (0..data.attrs.len() as EventIndex)
            .map(|event| counts.get(&event).copied().unwrap_or(0))
            .collect()
    };
    let samples_fired = per_event(&aggregates.samples_per_event);
    let throttled = data.throttles.iter().filter(|t| t.throttled).count() as u64;
    let counters = [
        ("perf.data: records lost (PERF_RECORD_LOST)", data.lost),
        (
            "perf.data: samples lost (PERF_RECORD_LOST_SAMPLES)",
            data.lost_samples,
        ),
        (
            "perf.data: samples of unknown events",
            data.samples_with_unknown_id,
        ),
        ("perf.data: times the kernel throttled an event", throttled),
        (
            "IBS samples with unreadable raw registers",
            aggregates.unreadable_ibs,
        ),
        (
            "Arm SPE records lost to undecodable packets or without a PC",
            aggregates.damaged_spe_records,
        ),
        (
            LossKind::SpeRecordsWithoutThread.describe(),
            aggregates.spe_records_without_thread,
        ),
        (
            "perf.data: bytes of AUX trace data of tracers other than Arm SPE, not read",
            aggregates.unread_aux_bytes,
        ),
    ];
    // Walks of the recorded user stacks that ended short of a root, by cause, named as live
    // recordings name them.
    let unwinding = aggregates
        .unwind_ends
        .iter()
        .filter_map(|(end, count)| Some((end.loss()?.describe(), *count)));
    Losses {
        samples_fired,
        period_sums: per_event(&aggregates.period_sums),
        // perf.data holds no counter totals, only samples.
        event_counts: Vec::new(),
        counters: counters
            .into_iter()
            .chain(unwinding)
            .map(|(name, count)| (name.to_string(), count))
            .collect(),
    }
}

#[cfg(test)]
mod tests;
