//! Draining the kernel's per-CPU maps into the agent, losslessly.
//!
//! The program writes one generation of maps while the agent drains the other: flip the
//! generation, wait until no program run on any CPU is still inside the old one, then read and
//! clear it. A sample lands in exactly one generation and each generation is read once per flip,
//! so nothing is lost or counted twice. Call stacks are counted by hash; their frames come from
//! the stack cache ([`stacks`]). Stack copies (`record --unwind copy`) are unwound as they are
//! read ([`stack_copy`]), and with `record --unwind check` compared with the kernel's walks of
//! the same samples ([`unwind_check`]). What precise samplers report beyond the IP is
//! accumulated per sampled instruction ([`hardware`]).

mod batch;
pub mod hardware;
pub mod ibs;
pub mod offcpu;
pub mod spe;
pub mod stack_copy;
pub mod stacks;
pub mod unwind_check;

use std::{
    collections::HashMap,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use aya::{
    maps::{MapData, PerCpuHashMap, PerCpuValues},
    util::nr_cpus,
};
use hardware::HardwareAccumulator;
use profiler_common::{
    capture::{
        fill_index, DataLineKey, DataSourceKey, Fill, InstructionKey, LatencyKey, LineLatencyKey,
        LossKind, SampleStats, StackKey, CONTROL_GENERATION,
    },
    latency::{LatencyBuckets, LATENCY_BUCKETS},
};
use stacks::{FramesMap, StackCache};

use crate::capture::{
    maps::MapSizes,
    program::{CaptureProgram, GenerationMaps, Ring},
    ring::KernelRing,
};

/// The call stacks of one thread and event as drained, by hash: their frames are in
/// [`Drained::stack_cache`]; `NO_STACK` and `LOST_STACK` as the program counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DrainedStack {
    pub pid: u32,
    pub tid: u32,
    pub event: u32,
    pub cgroup: u64,
    pub user: u64,
    pub kernel: u64,
}

/// Everything drained so far, at address level, merged over drains.
#[derive(Debug, Default)]
pub struct Drained {
    /// Samples per stack, per CPU.
    pub stacks: HashMap<DrainedStack, Vec<u64>>,
    /// The frames of every stack hash in `stacks`.
    pub stack_cache: StackCache,
    /// Losses the agent counted itself: samples under a stack hash a take found ambiguous.
    pub losses: [u64; LossKind::COUNT],
    pub instructions: HashMap<InstructionKey, SampleStats>,
    pub data_lines: HashMap<DataLineKey, (SampleStats, Vec<u64>)>,
    /// Counts per latency bucket, per instruction.
    pub latencies: HashMap<LatencyKey, Vec<u64>>,
    /// Counts per latency bucket, per data cache line.
    pub line_latencies: HashMap<LineLatencyKey, Vec<u64>>,
    /// Samples per data source (PMUs that report one).
    pub data_sources: HashMap<DataSourceKey, u64>,
    /// What precise samplers reported beyond the IP: IBS registers the program streamed, SPE
    /// records read from the AUX trace.
    pub hardware: HardwareAccumulator,
    /// `--off-cpu`: blocked time by thread, stacks and state.
    pub offcpu: offcpu::DrainedOffCpu,
}

impl Drained {
    /// Samples drained (each sample is in exactly one stack entry).
    pub fn sample_count(&self) -> u64 {
        self.stacks.values().flatten().sum()
    }

    /// The kernel stacks the samples and off-CPU blocks (their wakers' too) reference: the same
    /// code in every process. With repeats.
    pub fn kernel_stacks(&self) -> impl Iterator<Item = u64> + '_ {
        let blocks = self.offcpu.blocks.keys();
        self.stacks
            .keys()
            .map(|stack| stack.kernel)
            .chain(blocks.flat_map(|key| [key.kernel_stack, key.waker.kernel_stack]))
    }

    /// The user stacks the samples and off-CPU blocks (their wakers' too) reference, with their
    /// process. With repeats.
    pub fn user_stacks(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        let blocks = self.offcpu.blocks.keys();
        self.stacks
            .keys()
            .map(|stack| (stack.pid, stack.user))
            .chain(blocks.flat_map(|key| {
                [
                    (key.pid, key.user_stack),
                    (key.waker.pid, key.waker.user_stack),
                ]
            }))
    }

    /// The processes whose samples or code addresses this holds.
    pub fn referenced_processes(&self) -> std::collections::BTreeSet<u32> {
        let mut pids: std::collections::BTreeSet<u32> =
            self.stacks.keys().map(|stack| stack.pid).collect();
        pids.extend(self.instructions.keys().map(|key| key.pid));
        pids.extend(self.data_lines.keys().map(|key| key.pid));
        pids.extend(self.latencies.keys().map(|key| key.pid));
        pids.extend(self.data_sources.keys().map(|key| key.pid));
        pids.extend(self.hardware.instructions().map(|(pid, _)| pid));
        pids.extend(self.offcpu.blocks.keys().map(|key| key.pid));
        let wakers = self.offcpu.blocks.keys().map(|key| key.waker.pid);
        pids.extend(wakers.filter(|pid| *pid != 0));
        pids
    }
}

/// Counters that are cumulative in the kernel and read, not drained.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Program runs per event index.
    pub samples_fired: Vec<u64>,
    /// Sum of sample periods per event index.
    pub period_sums: Vec<u64>,
    /// Events counted by the sampling counters per event index (read from the counters, not
    /// the program; empty when the counts do not match the samples, as under a filter).
    pub event_counts: Vec<u64>,
    pub samples_filtered: u64,
    pub losses: [u64; LossKind::COUNT],
}

impl Accounting {
    /// What was counted since `earlier`, a reading of the same cumulative counters.
    pub fn since(&self, earlier: &Accounting) -> Accounting {
        let minus = |now: &[u64], then: &[u64]| -> Vec<u64> {
            now.iter()
                .enumerate()
                .map(|(index, value)| value - then.get(index).copied().unwrap_or(0))
                .collect()
        };
        let mut losses = self.losses;
        for (loss, then) in losses.iter_mut().zip(earlier.losses) {
            *loss -= then;
        }
        Accounting {
            samples_fired: minus(&self.samples_fired, &earlier.samples_fired),
            period_sums: minus(&self.period_sums, &earlier.period_sums),
            event_counts: minus(&self.event_counts, &earlier.event_counts),
            samples_filtered: self.samples_filtered - earlier.samples_filtered,
            losses,
        }
    }

    /// Samples that fired and were lost whole (not in any map).
    pub fn samples_lost(&self) -> u64 {
        LossKind::ALL
            .iter()
            .filter(|kind| kind.loses_sample())
            .map(|kind| self.losses[*kind as usize])
            .sum()
    }
}

/// How long a drain may wait for programs to leave the old generation before giving up: a
/// program run takes microseconds, so this only trips when something is badly wrong.
const QUIESCENCE_TIMEOUT: Duration = Duration::from_secs(1);

pub struct Drainer {
    /// The generation the program writes to now.
    active: u32,
    sizes: MapSizes,
    /// The program's requests to check the fills, between the agent's own checks.
    requests: KernelRing,
    /// What the kernel's stack-frames map holds.
    pub frames_map: FramesMap,
    /// Drains done so far, and the time they took.
    pub drains: u32,
    pub drain_time: Duration,
}

impl Drainer {
    /// Takes the drain-request ring of `program`, whose maps have `sizes`.
    pub fn new(program: &mut CaptureProgram, sizes: MapSizes) -> Result<Drainer> {
        Ok(Drainer {
            active: 0,
            sizes,
            requests: KernelRing::new(program.take_ring(Ring::DrainRequests)?)?,
            frames_map: FramesMap::new(sizes.stacks),
            drains: 0,
            drain_time: Duration::ZERO,
        })
    }

    /// Switches the program to the other generation and drains the one it left.
    pub fn drain(&mut self, program: &mut CaptureProgram, into: &mut Drained) -> Result<()> {
        let started = Instant::now();
        let old = self.active;
        let new = old ^ 1;
        program
            .control
            .set(CONTROL_GENERATION, new, 0)
            .context("switching the capture generation")?;
        self.active = new;
        wait_until_left(program, old)?;
        let counts = drain_generation(&mut program.generations[old as usize], into)?;
        let offcpu = match &mut program.offcpu {
            Some(offcpu) => Some(offcpu::TakenGeneration::take(
                &mut offcpu.generations[old as usize],
            )?),
            None => None,
        };
        self.frames_map
            .stored_in_drained_generation(new_keys(program, old, Fill::StackFrames)?);
        let active = new_keys(program, new, Fill::StackFrames)?;
        let referenced = counts
            .iter()
            .flat_map(|(key, _)| [key.user_stack, key.kernel_stack])
            .chain(offcpu.iter().flat_map(|taken| taken.stack_hashes()));
        self.frames_map.read_new_stacks(
            &mut program.stack_frames,
            referenced,
            active,
            &mut into.stack_cache,
        )?;
        add_stack_counts(counts, into);
        if let Some(taken) = offcpu {
            taken.add_to(&into.stack_cache, &mut into.offcpu);
        }
        // The drained generation starts empty again; nothing writes it until the next flip.
        let cpus = nr_cpus().map_err(|(what, e)| anyhow::anyhow!("counting CPUs ({what}): {e}"))?;
        for fill in Fill::ALL {
            let zeros =
                PerCpuValues::try_from(vec![0u64; cpus]).context("building per-CPU zeros")?;
            program
                .new_keys
                .set(fill_index(old, fill), zeros, 0)
                .context("resetting the capture's fill counters")?;
        }
        self.drains += 1;
        self.drain_time += started.elapsed();
        Ok(())
    }

    /// Waits until the program asks for a look at the fills (see [`Drainer::drain_if_filling`]).
    pub async fn requested(&self) -> std::io::Result<()> {
        self.requests.readable().await
    }

    /// Drains now when any map of the generation being written, or the stack-frames map, is a
    /// quarter full (the drain then empties the frames map), rather than lose samples or stacks
    /// to a full map before the next drain (a drain can wait for the CPU on a busy
    /// machine, and the program goes on filling meanwhile); whether it drained.
    pub fn drain_if_filling(
        &mut self,
        program: &mut CaptureProgram,
        into: &mut Drained,
    ) -> Result<bool> {
        // The requests only say "look": their content is the fill, which is read below.
        while self.requests.for_each(usize::MAX, |_: u32| Ok(()))? > 0 {}
        let mut filling = false;
        for fill in Fill::ALL {
            let created = new_keys(program, self.active, fill)?;
            filling |= match fill {
                // Shared by the generations: what earlier ones stored counts too.
                Fill::StackFrames => self.frames_map.filling(created),
                _ => created * 4 > u64::from(self.sizes.entries(fill)),
            };
        }
        if filling {
            self.drain(program, into)?;
        }
        Ok(filling)
    }

    /// Drains both generations: after the counters are disabled, this collects everything.
    pub fn drain_all(&mut self, program: &mut CaptureProgram, into: &mut Drained) -> Result<()> {
        self.drain(program, into)?;
        self.drain(program, into)
    }
}

/// Entries `generation` has created so far in the maps of `fill` (an upper bound for per-CPU
/// maps: one key created on two CPUs counts twice).
fn new_keys(program: &CaptureProgram, generation: u32, fill: Fill) -> Result<u64> {
    Ok(program
        .new_keys
        .get(&fill_index(generation, fill), 0)
        .context("reading the capture's fill counters")?
        .iter()
        .sum())
}

/// Waits until no program run is inside `generation` on any CPU.
fn wait_until_left(program: &CaptureProgram, generation: u32) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        // Give every CPU's store of the new generation and its own in-flight increment time to
        // become visible before we trust a zero count (store buffers drain in nanoseconds).
        thread::sleep(Duration::from_micros(200));
        let inflight = program
            .inflight
            .get(&generation, 0)
            .context("reading the capture program's in-flight counters")?;
        if inflight.iter().all(|count| *count == 0) {
            return Ok(());
        }
        if started.elapsed() > QUIESCENCE_TIMEOUT {
            bail!("capture programs did not leave generation {generation} within 1 s");
        }
    }
}

/// Reads every entry of a per-CPU hash map and deletes it: in batches where the kernel can,
/// else one entry at a time.
fn take_all<K: aya::Pod + Eq + std::hash::Hash, V: aya::Pod>(
    map: &mut PerCpuHashMap<MapData, K, V>,
) -> Result<batch::PerCpuEntries<K, V>> {
    let cpus = nr_cpus().map_err(|(what, e)| anyhow::anyhow!("counting CPUs ({what}): {e}"))?;
    if let Some(entries) =
        batch::take_all_batched(map, cpus).context("reading and clearing a capture map")?
    {
        return Ok(entries);
    }
    let mut entries = Vec::new();
    for entry in map.iter() {
        let (key, values) = entry.context("reading a capture map")?;
        entries.push((key, values.iter().copied().collect::<Vec<V>>()));
    }
    for (key, _) in &entries {
        map.remove(key).context("clearing a capture map")?;
    }
    Ok(entries)
}

/// Drains every map of a generation into `into` but the stack counts, which it returns: their
/// stacks must be read first.
fn drain_generation(
    maps: &mut GenerationMaps,
    into: &mut Drained,
) -> Result<batch::PerCpuEntries<StackKey, u64>> {
    let counts = take_all(&mut maps.stack_counts)?;
    for (key, per_cpu) in take_all(&mut maps.instructions)? {
        let stats = into.instructions.entry(key).or_default();
        per_cpu.iter().for_each(|cpu| stats.merge(cpu));
    }
    for (key, per_cpu) in take_all(&mut maps.data_lines)? {
        let (stats, cpus) = into.data_lines.entry(key).or_default();
        per_cpu.iter().for_each(|cpu| stats.merge(cpu));
        let counts: Vec<u64> = per_cpu.iter().map(|cpu| cpu.count).collect();
        add_per_cpu(cpus, &counts);
    }
    for (key, per_cpu) in take_all(&mut maps.data_sources)? {
        *into.data_sources.entry(key).or_default() += per_cpu.iter().sum::<u64>();
    }
    add_histograms(&mut into.latencies, take_all(&mut maps.latencies)?);
    add_histograms(
        &mut into.line_latencies,
        take_all(&mut maps.line_latencies)?,
    );
    Ok(counts)
}

/// Adds drained stack counts, whose stacks are all in the stack cache, to the totals.
fn add_stack_counts(counts: batch::PerCpuEntries<StackKey, u64>, into: &mut Drained) {
    for (key, per_cpu) in counts {
        let StackKey {
            pid,
            tid,
            event,
            user_stack,
            kernel_stack,
            cgroup,
            ..
        } = key;
        let stack = DrainedStack {
            pid,
            tid,
            event,
            cgroup,
            user: into.stack_cache.resolve(user_stack),
            kernel: into.stack_cache.resolve(kernel_stack),
        };
        let samples: u64 = per_cpu.iter().sum();
        for (hash, resolved, kind) in [
            (user_stack, stack.user, LossKind::UserStackHashCollision),
            (
                kernel_stack,
                stack.kernel,
                LossKind::KernelStackHashCollision,
            ),
        ] {
            if resolved != hash {
                into.losses[kind as usize] += samples;
            }
        }
        add_per_cpu(into.stacks.entry(stack).or_default(), &per_cpu);
    }
}

/// Adds drained per-CPU latency histograms to the totals.
fn add_histograms<K: Eq + std::hash::Hash>(
    totals: &mut HashMap<K, Vec<u64>>,
    drained: Vec<(K, Vec<LatencyBuckets>)>,
) {
    for (key, per_cpu) in drained {
        let buckets = totals
            .entry(key)
            .or_insert_with(|| vec![0; LATENCY_BUCKETS]);
        for cpu in &per_cpu {
            for (total, count) in buckets.iter_mut().zip(cpu.counts.iter()) {
                *total += u64::from(*count);
            }
        }
    }
}

/// Adds one sample on `cpu` to per-CPU counts.
fn add_on_cpu(total: &mut Vec<u64>, cpu: usize) {
    if total.len() <= cpu {
        total.resize(cpu + 1, 0);
    }
    total[cpu] += 1;
}

fn add_per_cpu(total: &mut Vec<u64>, per_cpu: &[u64]) {
    if total.len() < per_cpu.len() {
        total.resize(per_cpu.len(), 0);
    }
    for (sum, count) in total.iter_mut().zip(per_cpu) {
        *sum += count;
    }
}

/// Reads the cumulative counters.
pub fn read_accounting(program: &CaptureProgram, events: usize) -> Result<Accounting> {
    let sum = |map: &aya::maps::PerCpuArray<MapData, u64>, index: u32| -> Result<u64> {
        Ok(map
            .get(&index, 0)
            .context("reading the capture program's counters")?
            .iter()
            .sum())
    };
    let mut accounting = Accounting {
        samples_filtered: sum(&program.samples_filtered, 0)?,
        ..Default::default()
    };
    for event in 0..events as u32 {
        accounting
            .samples_fired
            .push(sum(&program.samples_fired, event)?);
        accounting
            .period_sums
            .push(sum(&program.period_sums, event)?);
    }
    for kind in LossKind::ALL {
        accounting.losses[kind as usize] = sum(&program.losses, kind as u32)?;
    }
    Ok(accounting)
}
