//! Off-CPU views: blocked time by state, thread, function and stack, with the percentiles of
//! the block durations; the wall-clock view per thread (on-CPU samples scaled to time plus
//! off-CPU time); the block-duration distribution of a function.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::{
    filter::{EventScale, Selection},
    latency::representative_value,
};
use crate::profile::{
    offcpu::{OffCpuBlocks, OffCpuProfile, OffCpuState},
    EventIndex, Profile,
};

/// Blocked time of a group of blocks.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BlockedTime {
    pub total_ns: u64,
    pub blocks: u64,
    /// Percentiles of the block durations, at the histogram's precision (1/16 of the value at
    /// most); `None` when no block of the group was in a histogram.
    pub p50_ns: Option<u64>,
    pub p90_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    /// Exact.
    pub max_ns: u64,
}

/// Accumulates the blocks of one row.
struct Accumulator {
    unit_ns: u64,
    total_ns: u64,
    blocks: u64,
    max_ns: u64,
    distribution: Histogram<u64>,
}

impl Accumulator {
    fn new(unit_ns: u64) -> Accumulator {
        Accumulator {
            unit_ns,
            total_ns: 0,
            blocks: 0,
            max_ns: 0,
            distribution: Histogram::new_with_max(u64::from(u32::MAX), 3)
                .expect("valid hdrhistogram bounds"),
        }
    }

    fn add(&mut self, blocks: &OffCpuBlocks) {
        self.total_ns += blocks.total_ns;
        self.blocks += blocks.count;
        self.max_ns = self.max_ns.max(blocks.max_ns);
        for (bucket, count) in &blocks.buckets {
            let value = representative_value(usize::from(*bucket)).min(self.distribution.high());
            self.distribution
                .record_n(value, *count)
                .expect("bucket values lie within the histogram's range");
        }
    }

    fn finish(&self) -> BlockedTime {
        let percentile = |q: f64| {
            (!self.distribution.is_empty()).then(|| {
                // A bucket's midpoint may lie above the exact maximum of the blocks in it.
                (self.distribution.value_at_quantile(q) * self.unit_ns).min(self.max_ns)
            })
        };
        BlockedTime {
            total_ns: self.total_ns,
            blocks: self.blocks,
            p50_ns: percentile(0.5),
            p90_ns: percentile(0.9),
            p99_ns: percentile(0.99),
            max_ns: self.max_ns,
        }
    }
}

/// A row of an off-CPU view.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OffCpuRow {
    /// The state, thread (`name pid/tid`), function, or the stack's innermost user function.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    /// The stack view: frames, leaf first (kernel then user).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<Vec<String>>,
    #[serde(flatten)]
    pub time: BlockedTime,
}

/// A row of the waker view (`--wakers`): blocks of one thread with one stack that one thread's
/// stack ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WakerRow {
    /// The blocked thread (`name pid/tid`).
    pub thread: String,
    pub pid: u32,
    pub tid: u32,
    pub state: &'static str,
    /// The innermost user function of the blocked stack (its kernel one when it has none).
    pub blocked_in: String,
    /// The waker's thread (`name pid/tid`), or `[interrupt]`.
    pub waker: String,
    pub waker_pid: u32,
    pub waker_tid: u32,
    /// The waker's frames, leaf first (kernel from the wake-up out, then user).
    pub waker_frames: Vec<String>,
    pub total_ns: u64,
    pub blocks: u64,
}

/// A thread's time: on the CPU (its samples of a clock event scaled to time), off it (by state).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WallRow {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub on_cpu_samples: u64,
    /// `None` without a clock event to scale samples by.
    pub on_cpu_ns: Option<u64>,
    pub off_cpu_ns: u64,
    pub off_cpu_by_state: BTreeMap<&'static str, u64>,
    /// On-CPU plus off-CPU time: the thread's lifetime within the recording.
    pub wall_ns: Option<u64>,
}

/// One bucket of a block-duration distribution.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DurationBucket {
    pub from_ns: u64,
    pub to_ns: u64,
    pub blocks: u64,
}

/// The block durations of the blocks whose stacks pass through a function.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OffCpuDistribution {
    pub function: String,
    #[serde(flatten)]
    pub time: BlockedTime,
    pub buckets: Vec<DurationBucket>,
}

/// The off-CPU part of a report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OffCpuReport {
    pub attachment: String,
    pub min_block_ns: u64,
    #[serde(flatten)]
    pub time: BlockedTime,
    pub by_state: Vec<OffCpuRow>,
    pub by_thread: Vec<OffCpuRow>,
    /// Inclusive: each block counts for every function on its stack.
    pub by_function: Vec<OffCpuRow>,
    pub by_stack: Vec<OffCpuRow>,
    /// `--wakers`: heaviest first; empty without.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_waker: Vec<WakerRow>,
    /// The clock event the on-CPU time is scaled from, when there is one.
    pub clock_event: Option<String>,
    pub wall_clock: Vec<WallRow>,
    /// With `--histogram`: the distributions of the top functions, or of `--function`.
    pub distributions: Option<Vec<OffCpuDistribution>>,
    pub counters: BTreeMap<String, u64>,
}

/// What the off-CPU part of a report shows.
pub struct OffCpuOptions<'a> {
    pub rows: usize,
    /// With `--histogram`: the distributions, of this function only when given.
    pub histograms: bool,
    pub function: Option<&'a str>,
}

/// The functions on a stack, each once, innermost first.
fn functions(profile: &Profile, blocks: &OffCpuBlocks) -> Vec<String> {
    let mut seen = BTreeSet::new();
    blocks
        .frames
        .iter()
        .map(|id| profile.frames[*id as usize].display_name())
        .filter(|name| seen.insert(name.clone()))
        .collect()
}

/// Whether off-CPU blocks of `profile` have `function` on their stacks.
pub fn waited_in(profile: &Profile, function: &str) -> bool {
    profile
        .off_cpu
        .iter()
        .flat_map(|off_cpu| &off_cpu.blocks)
        .any(|blocks| {
            blocks
                .frames
                .iter()
                .any(|id| profile.frames[*id as usize].display_name() == function)
        })
}

/// Rows of the groups `key` puts the blocks in, heaviest first, at most `rows`.
fn rows_by<K: Ord + Clone>(
    selected: &[&OffCpuBlocks],
    unit_ns: u64,
    rows: usize,
    mut keys: impl FnMut(&OffCpuBlocks) -> Vec<K>,
    mut row: impl FnMut(&K, BlockedTime) -> OffCpuRow,
) -> Vec<OffCpuRow> {
    let mut groups: BTreeMap<K, Accumulator> = BTreeMap::new();
    for blocks in selected {
        for key in keys(blocks) {
            groups
                .entry(key)
                .or_insert_with(|| Accumulator::new(unit_ns))
                .add(blocks);
        }
    }
    let mut out: Vec<OffCpuRow> = groups
        .iter()
        .map(|(key, accumulated)| row(key, accumulated.finish()))
        .collect();
    out.sort_by_key(|row| std::cmp::Reverse(row.time.total_ns));
    out.truncate(rows);
    out
}

/// The first clock event of the profile (unit nanoseconds), whose samples scale to time.
fn clock_event(profile: &Profile) -> Option<EventIndex> {
    profile
        .events
        .iter()
        .position(|event| event.unit == "nanoseconds")
        .map(|index| index as EventIndex)
}

/// The off-CPU views of `off_cpu`, of the threads `selection` keeps.
pub fn offcpu_report(
    profile: &Profile,
    off_cpu: &OffCpuProfile,
    selection: &Selection,
    options: &OffCpuOptions,
) -> OffCpuReport {
    let unit_ns = off_cpu.bucket_unit_ns.max(1);
    let selected: Vec<&OffCpuBlocks> = off_cpu
        .blocks
        .iter()
        .filter(|blocks| selection.thread(blocks.pid, blocks.tid))
        .collect();
    let mut all = Accumulator::new(unit_ns);
    selected.iter().for_each(|blocks| all.add(blocks));
    let rows = options.rows;
    let by_state = rows_by(
        &selected,
        unit_ns,
        rows,
        |blocks| vec![blocks.state],
        |state, time| OffCpuRow {
            name: state.name().to_string(),
            pid: None,
            tid: None,
            state: Some(state.name()),
            frames: None,
            time,
        },
    );
    let by_thread = rows_by(
        &selected,
        unit_ns,
        rows,
        |blocks| vec![(blocks.pid, blocks.tid)],
        |&(pid, tid), time| OffCpuRow {
            name: format!("{} {pid}/{tid}", selection.thread_name(pid, tid)),
            pid: Some(pid),
            tid: Some(tid),
            state: None,
            frames: None,
            time,
        },
    );
    let by_function = rows_by(
        &selected,
        unit_ns,
        rows,
        |blocks| functions(profile, blocks),
        |function, time| OffCpuRow {
            name: function.clone(),
            pid: None,
            tid: None,
            state: None,
            frames: None,
            time,
        },
    );
    let by_stack = rows_by(
        &selected,
        unit_ns,
        rows,
        |blocks| vec![(blocks.state, blocks.frames.clone())],
        |(state, frames), time| {
            let names: Vec<String> = frames
                .iter()
                .map(|id| profile.frames[*id as usize].display_name())
                .collect();
            OffCpuRow {
                name: innermost_user_function(profile, frames),
                pid: None,
                tid: None,
                state: Some(state.name()),
                frames: Some(names),
                time,
            }
        },
    );
    let by_waker = off_cpu
        .wakers
        .iter()
        .filter(|woken| selection.thread(woken.pid, woken.tid))
        .take(rows)
        .map(|woken| WakerRow {
            thread: format!(
                "{} {}/{}",
                selection.thread_name(woken.pid, woken.tid),
                woken.pid,
                woken.tid
            ),
            pid: woken.pid,
            tid: woken.tid,
            state: woken.state.name(),
            blocked_in: innermost_user_function(profile, &woken.frames),
            waker: match woken.waker_pid {
                0 => "[interrupt]".to_string(),
                pid => format!(
                    "{} {pid}/{}",
                    selection.thread_name(pid, woken.waker_tid),
                    woken.waker_tid
                ),
            },
            waker_pid: woken.waker_pid,
            waker_tid: woken.waker_tid,
            waker_frames: woken
                .waker_frames
                .iter()
                .map(|id| profile.frames[*id as usize].display_name())
                .collect(),
            total_ns: woken.total_ns,
            blocks: woken.count,
        })
        .collect();
    let distributions = options.histograms.then(|| {
        let wanted: Vec<String> = match options.function {
            Some(function) => vec![function.to_string()],
            None => by_function.iter().map(|row| row.name.clone()).collect(),
        };
        wanted
            .into_iter()
            .map(|function| distribution(profile, &selected, unit_ns, &function))
            .collect()
    });
    let clock = clock_event(profile);
    OffCpuReport {
        attachment: off_cpu.attachment.clone(),
        min_block_ns: off_cpu.min_block_ns,
        time: all.finish(),
        by_state,
        by_thread,
        by_function,
        by_stack,
        by_waker,
        clock_event: clock.map(|event| profile.events[event as usize].name.clone()),
        wall_clock: wall_clock(profile, &selected, selection, clock),
        distributions,
        counters: off_cpu.counters.clone(),
    }
}

/// The innermost user function of a blocked stack: it says most about a wait, the kernel's
/// names the how (the innermost kernel function for a stack without user frames).
fn innermost_user_function(profile: &Profile, frames: &[crate::profile::FrameId]) -> String {
    frames
        .iter()
        .find(|id| !profile.frames[**id as usize].kernel)
        .or(frames.first())
        .map_or("[no stack]".to_string(), |id| {
            profile.frames[*id as usize].display_name()
        })
}

/// The distribution of the blocks whose stacks pass through `function`.
fn distribution(
    profile: &Profile,
    selected: &[&OffCpuBlocks],
    unit_ns: u64,
    function: &str,
) -> OffCpuDistribution {
    let mut accumulated = Accumulator::new(unit_ns);
    let mut buckets: BTreeMap<u16, u64> = BTreeMap::new();
    for blocks in selected {
        if functions(profile, blocks)
            .iter()
            .any(|name| name == function)
        {
            accumulated.add(blocks);
            for (bucket, count) in &blocks.buckets {
                *buckets.entry(*bucket).or_default() += count;
            }
        }
    }
    OffCpuDistribution {
        function: function.to_string(),
        time: accumulated.finish(),
        buckets: buckets
            .into_iter()
            .map(|(bucket, blocks)| {
                let (low, high) = profiler_common::latency::bucket_range(usize::from(bucket));
                DurationBucket {
                    from_ns: low * unit_ns,
                    to_ns: (high + 1) * unit_ns,
                    blocks,
                }
            })
            .collect(),
    }
}

/// Each thread's on-CPU time (its samples of the clock event times the period: within one
/// period of the truth), off-CPU time by state, and their sum.
fn wall_clock(
    profile: &Profile,
    selected: &[&OffCpuBlocks],
    selection: &Selection,
    clock: Option<EventIndex>,
) -> Vec<WallRow> {
    let mut samples: HashMap<(u32, u32), u64> = HashMap::new();
    if let Some(clock) = clock {
        for sample in profile.stacks.iter().filter(|s| s.event == clock) {
            if selection.thread(sample.pid, sample.tid) {
                *samples.entry((sample.pid, sample.tid)).or_default() += sample.count;
            }
        }
    }
    let mut off: BTreeMap<(u32, u32), BTreeMap<OffCpuState, u64>> = BTreeMap::new();
    for blocks in selected {
        *off.entry((blocks.pid, blocks.tid))
            .or_default()
            .entry(blocks.state)
            .or_default() += blocks.total_ns;
    }
    for thread in samples.keys() {
        off.entry(*thread).or_default();
    }
    let scale = clock.map(|clock| EventScale::per_thread(profile, clock));
    let mut rows: Vec<WallRow> = off
        .into_iter()
        .map(|((pid, tid), states)| {
            let on_cpu_samples = samples.get(&(pid, tid)).copied().unwrap_or(0);
            let on_cpu_ns = scale
                .and_then(|scale| scale.estimate(on_cpu_samples))
                .map(|ns| ns.round() as u64);
            let off_cpu_ns = states.values().sum();
            WallRow {
                pid,
                tid,
                comm: selection.thread_name(pid, tid).to_string(),
                on_cpu_samples,
                on_cpu_ns,
                off_cpu_ns,
                off_cpu_by_state: states
                    .into_iter()
                    .map(|(state, ns)| (state.name(), ns))
                    .collect(),
                wall_ns: on_cpu_ns.map(|on| on + off_cpu_ns),
            }
        })
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse((row.wall_ns, row.off_cpu_ns)));
    rows
}
