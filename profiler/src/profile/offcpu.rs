//! The off-CPU part of a profile (`record --off-cpu`): blocked time per thread, stack and
//! state, with the distribution of block durations. Appended to the profile file after the
//! on-CPU body (`profile::file`).

use std::collections::BTreeMap;

use profiler_common::offcpu::BlockState;
use serde::{Deserialize, Serialize};

use super::FrameId;

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
    /// `--wakers`: the blocks again, split by who woke them; heaviest first. Appended after
    /// the off-CPU profile from format 7 on.
    #[serde(skip)]
    pub wakers: Vec<WokenBlocks>,
}

/// Blocks of one thread with one stack and state that one waker ended (`--wakers`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WokenBlocks {
    pub pid: u32,
    pub tid: u32,
    pub state: OffCpuState,
    /// The blocked thread's frames, as its [`OffCpuBlocks`] has them.
    pub frames: Vec<FrameId>,
    /// The thread that woke it; 0 for a wake-up from an interrupt (a timer's expiry), whose
    /// frames end at the interrupt's entry.
    pub waker_pid: u32,
    pub waker_tid: u32,
    /// The waker's frames, leaf first: kernel frames from the wake-up out, then user frames.
    pub waker_frames: Vec<FrameId>,
    pub total_ns: u64,
    pub count: u64,
}
