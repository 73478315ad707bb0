//! The off-CPU part of a profile assembled from what the switch programs drained: blocks
//! merged by their frames, the scheduler's and the wake-up program's own frames cut off, and
//! the blocks again by waker (`--wakers`).

use std::collections::{BTreeMap, HashMap};

use profiler_common::{
    offcpu::{OffCpuCount, OffCpuKey, HISTOGRAM_UNIT_NS},
    stack::LOST_STACK,
};

use super::sparse_buckets;
use crate::{
    drain::offcpu::DrainedOffCpu,
    profile::{
        offcpu::{OffCpuBlocks, OffCpuProfile, OffCpuState, WokenBlocks},
        Frame, FrameId,
    },
};

/// The kernel frames of a switch from `__schedule` out: the frames above it are the switch
/// program's own (the BPF trampoline, the tracepoint), the same in every stack.
pub fn below_scheduler<'a>(kernel: &'a [FrameId], frames: &[Frame]) -> &'a [FrameId] {
    from_function(kernel, frames, SCHEDULER_FUNCTION)
}

/// A waker's frames (leaf first), and whether its wake-up came from an interrupt.
pub struct WakerFrames {
    pub frames: Vec<FrameId>,
    pub interrupt: bool,
}

/// The frames of a wake-up: its kernel frames from `try_to_wake_up` out (the frames above are
/// the wake-up program's own), then the waker's user frames. A wake-up made in an interrupt
/// (a timer's expiry, a device's completion) ends at the interrupt's entry: below it is
/// whatever the interrupt interrupted, the idle task's or another thread's code, no waker.
pub fn waker_frames(
    kernel: &[FrameId],
    user: &[FrameId],
    frames: &[Frame],
    idle: bool,
) -> WakerFrames {
    let kernel = from_function(kernel, frames, WAKE_UP_FUNCTION);
    let entry = kernel.iter().position(|id| {
        frames[*id as usize]
            .function
            .as_deref()
            .is_some_and(is_interrupt_entry)
    });
    match entry {
        Some(at) => WakerFrames {
            frames: kernel[..=at].to_vec(),
            interrupt: true,
        },
        None => WakerFrames {
            frames: [kernel, user].concat(),
            interrupt: idle,
        },
    }
}

/// The kernel's interrupt entries: x86-64's `asm_sysvec_*` and `asm_common_interrupt`, arm64's
/// `el1h_64_irq` and `el0t_64_irq` (exceptions such as page faults are the thread's own).
fn is_interrupt_entry(function: &str) -> bool {
    function.starts_with("asm_sysvec_")
        || function == "asm_common_interrupt"
        || function.starts_with("el1h_64_irq")
        || function.starts_with("el0t_64_irq")
}

fn from_function<'a>(kernel: &'a [FrameId], frames: &[Frame], function: &str) -> &'a [FrameId] {
    let at = kernel
        .iter()
        .position(|id| frames[*id as usize].function.as_deref() == Some(function));
    match at {
        Some(at) => &kernel[at..],
        None => kernel,
    }
}

/// Where every context switch is made.
const SCHEDULER_FUNCTION: &str = "__schedule";
/// Where every wake-up is made (`sched_waking` fires in it).
const WAKE_UP_FUNCTION: &str = "try_to_wake_up";

/// The off-CPU profile of what was drained; `frames` gives a key's frames (kernel then user,
/// leaf first), `wakers_of` its waker's (`--wakers`).
pub fn assemble_offcpu(
    drained: &DrainedOffCpu,
    attachment: &str,
    min_block_ns: u64,
    mut frames: impl FnMut(&OffCpuKey) -> Vec<FrameId>,
    mut wakers_of: impl FnMut(&OffCpuKey) -> WakerFrames,
) -> OffCpuProfile {
    type WokenKey = (
        u32,
        u32,
        OffCpuState,
        Vec<FrameId>,
        (u32, u32),
        Vec<FrameId>,
    );
    let mut wakers: HashMap<WokenKey, WokenBlocks> = HashMap::new();
    for (key, drained) in drained.blocks.iter().filter(|(key, _)| key.waker.seen != 0) {
        let blocked = frames(key);
        let WakerFrames {
            frames: waker,
            interrupt,
        } = wakers_of(key);
        // An interrupt's wake-up has no waker thread: (0, 0).
        let (waker_pid, waker_tid) = match interrupt {
            true => (0, 0),
            false => (key.waker.pid, key.waker.tid),
        };
        let state = OffCpuState::from_code(key.state);
        let woken = wakers
            .entry((
                key.pid,
                key.tid,
                state,
                blocked.clone(),
                (waker_pid, waker_tid),
                waker.clone(),
            ))
            .or_insert_with(|| WokenBlocks {
                pid: key.pid,
                tid: key.tid,
                state,
                frames: blocked,
                waker_pid,
                waker_tid,
                waker_frames: waker,
                total_ns: 0,
                count: 0,
            });
        woken.total_ns += drained.stats.total_ns;
        woken.count += drained.stats.count;
    }
    let mut wakers: Vec<WokenBlocks> = wakers.into_values().collect();
    wakers.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then((a.pid, a.tid, a.state).cmp(&(b.pid, b.tid, b.state)))
            .then((a.waker_pid, a.waker_tid).cmp(&(b.waker_pid, b.waker_tid)))
            .then(a.frames.cmp(&b.frames))
            .then(a.waker_frames.cmp(&b.waker_frames))
    });
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
        wakers,
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
