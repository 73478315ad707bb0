//! What a capture session takes in: the events, the target and its filters, the maps' sizes,
//! how stacks are walked and what is streamed, resolved from the command line by `cli` (the
//! session never sees clap's types).

use std::time::Duration;

use profiler_common::capture::KernelOffsets;

use super::map_sizes::MapSizing;
use crate::{
    capture::{counters::StackCapture, offcpu::OffCpuOptions},
    events::{EventSpec, PmuRegistry},
    launch::TargetSpec,
    output::Output,
};

/// What a capture session samples, and how.
pub struct CaptureOptions {
    pub events: Vec<EventSpec>,
    pub pmus: PmuRegistry,
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub drain_interval: Duration,
    /// How often the side-band is read (see [`super::SIDEBAND_INTERVAL`]).
    pub sideband_interval: Duration,
    pub sizes: MapSizing,
    pub stacks: StackCapture,
    /// `--unwind copy`: KiB of user stack each sample copies for the agent to unwind.
    pub stack_copy_kib: Option<u32>,
    pub unwind: Unwind,
    /// Stream every sample, in timestamp order, into this output (JSON lines).
    pub raw: Option<Output>,
    /// Measure the capture's own cost.
    pub stats: bool,
    /// Keep only samples in these cgroups (ids).
    pub cgroups: Vec<u64>,
    pub uid: Option<u32>,
    pub offsets: Option<KernelOffsets>,
    /// `--off-cpu`: also record where the threads in scope wait.
    pub off_cpu: Option<OffCpuOptions>,
    /// Count samples per instruction (see
    /// [`profiler_common::capture::CAPTURE_INSTRUCTIONS`]): what reports read, not the agent's
    /// exports.
    pub per_instruction: bool,
    /// The agent's memory budget (`--memory-max`): over it, the coldest tables' compiled rows
    /// are let go. A recording keeps what it loaded until its end.
    pub memory_budget: Option<u64>,
}

/// How user call stacks are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwind {
    /// In the kernel, from the unwind tables the agent compiles from the executables'
    /// call-frame information; frame pointers where a frame has no table or row.
    Dwarf,
    /// The kernel's frame-pointer walk only.
    Fp,
    /// A copy of the user stack, unwound in the agent.
    Copy,
    /// `Dwarf`, and the same samples' stacks copied and unwound in the agent, to compare the
    /// two unwinders frame by frame; the table walk's stacks are the ones counted.
    Check,
}

impl Unwind {
    /// Whether the kernel walks user stacks with the agent's unwind tables.
    pub fn walks_tables(self) -> bool {
        matches!(self, Unwind::Dwarf | Unwind::Check)
    }
}
