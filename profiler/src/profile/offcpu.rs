//! The off-CPU part of a profile (`record --off-cpu`): blocked time per thread, stack and
//! state, with the distribution of block durations. Appended to the profile file after the
//! on-CPU body (`profile::file`).

use std::collections::{BTreeMap, HashMap};

use profiler_common::{
    offcpu::{BlockState, OffCpuCount, OffCpuKey, HISTOGRAM_UNIT_NS},
    stack::LOST_STACK,
};
use serde::{Deserialize, Serialize};

use super::{from_capture::sparse_buckets, Frame, FrameId};
use crate::drain::offcpu::DrainedOffCpu;

/// Why a thread was off the CPU.
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum OffCpuState {
    /// Interruptible sleep (`S`).
    #[default]
    Sleeping,
    /// Uninterruptible sleep (`D`): disk I/O, mostly.
    Uninterruptible,
    /// Preempted while runnable: time in the run queue.
    RunQueue,
    /// An idle kernel thread, stopped, traced.
    Other,
}

impl OffCpuState {
    pub fn from_code(code: u32) -> OffCpuState {
        match BlockState::from_code(code) {
            BlockState::Sleeping => OffCpuState::Sleeping,
            BlockState::Uninterruptible => OffCpuState::Uninterruptible,
            BlockState::RunQueue => OffCpuState::RunQueue,
            BlockState::Other => OffCpuState::Other,
        }
    }

    /// One word for reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            OffCpuState::Sleeping => "sleeping",
            OffCpuState::Uninterruptible => "uninterruptible",
            OffCpuState::RunQueue => "run-queue",
            OffCpuState::Other => "other",
        }
    }
}

/// Blocks of one thread with one stack and state.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OffCpuBlocks {
    pub pid: u32,
    pub tid: u32,
    pub state: OffCpuState,
    /// Frames leaf first: kernel frames then user frames; empty for blocks shorter than
    /// `--off-cpu-min`.
    pub frames: Vec<FrameId>,
    pub user_stack_lost: bool,
    pub kernel_stack_lost: bool,
    pub total_ns: u64,
    pub count: u64,
    pub max_ns: u64,
    /// Block durations in [`OffCpuProfile::bucket_unit_ns`]: (log-linear bucket index, count),
    /// sparse.
    pub buckets: Vec<(u16, u64)>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OffCpuProfile {
    /// How switches were seen (`tp_btf/sched_switch`, the classic tracepoint).
    pub attachment: String,
    /// `--off-cpu-min`.
    pub min_block_ns: u64,
    /// The unit the histogram buckets count in.
    pub bucket_unit_ns: u64,
    /// The switch programs' counters (switches, blocks, unmatched), by what they count.
    pub counters: BTreeMap<String, u64>,
    /// Heaviest first.
    pub blocks: Vec<OffCpuBlocks>,
}

/// The kernel frames of a switch from `__schedule` out: the frames above it are the switch
/// program's own (the BPF trampoline, the tracepoint), the same in every stack.
pub fn below_scheduler<'a>(kernel: &'a [FrameId], frames: &[Frame]) -> &'a [FrameId] {
    let scheduler = kernel
        .iter()
        .position(|id| frames[*id as usize].function.as_deref() == Some(SCHEDULER_FUNCTION));
    match scheduler {
        Some(at) => &kernel[at..],
        None => kernel,
    }
}

/// Where every context switch is made.
const SCHEDULER_FUNCTION: &str = "__schedule";

/// The off-CPU profile of what was drained; `frames` gives a key's frames (kernel then user,
/// leaf first).
pub fn assemble_offcpu(
    drained: &DrainedOffCpu,
    attachment: &str,
    min_block_ns: u64,
    mut frames: impl FnMut(&OffCpuKey) -> Vec<FrameId>,
) -> OffCpuProfile {
    let mut blocks: Vec<OffCpuBlocks> = drained
        .blocks
        .iter()
        .map(|(key, drained)| OffCpuBlocks {
            pid: key.pid,
            tid: key.tid,
            state: OffCpuState::from_code(key.state),
            frames: frames(key),
            user_stack_lost: key.user_stack == LOST_STACK,
            kernel_stack_lost: key.kernel_stack == LOST_STACK,
            total_ns: drained.stats.total_ns,
            count: drained.stats.count,
            max_ns: drained.stats.max_ns,
            buckets: sparse_buckets(&drained.buckets),
        })
        .collect();
    // Keys that differ only in stack hashes the drain found ambiguous share their frames.
    let mut merged: HashMap<(u32, u32, OffCpuState, Vec<FrameId>), OffCpuBlocks> = HashMap::new();
    for block in blocks.drain(..) {
        let key = (block.pid, block.tid, block.state, block.frames.clone());
        match merged.get_mut(&key) {
            Some(into) => merge_blocks(into, &block),
            None => {
                merged.insert(key, block);
            }
        }
    }
    let mut blocks: Vec<OffCpuBlocks> = merged.into_values().collect();
    blocks.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then((a.pid, a.tid, a.state).cmp(&(b.pid, b.tid, b.state)))
            .then(a.frames.cmp(&b.frames))
    });
    OffCpuProfile {
        attachment: attachment.to_string(),
        min_block_ns,
        bucket_unit_ns: HISTOGRAM_UNIT_NS,
        counters: OffCpuCount::ALL
            .iter()
            .map(|what| (what.describe().to_string(), drained.counts[*what as usize]))
            .collect(),
        blocks,
    }
}

fn merge_blocks(into: &mut OffCpuBlocks, other: &OffCpuBlocks) {
    into.total_ns += other.total_ns;
    into.count += other.count;
    into.max_ns = into.max_ns.max(other.max_ns);
    into.user_stack_lost |= other.user_stack_lost;
    into.kernel_stack_lost |= other.kernel_stack_lost;
    let mut buckets: BTreeMap<u16, u64> = into.buckets.iter().copied().collect();
    for (bucket, count) in &other.buckets {
        *buckets.entry(*bucket).or_default() += count;
    }
    into.buckets = buckets.into_iter().collect();
}
