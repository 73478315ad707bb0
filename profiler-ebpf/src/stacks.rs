//! Call stacks, content-addressed: each is written into a per-CPU frames buffer, named by the
//! hash of its frames, and stored once in the stack-frames map (both generations share it);
//! samples and off-CPU blocks are counted under the hashes.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{HashMap, PerCpuArray},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    capture::{Fill, LossKind},
    stack::{
        intern, Refused, StackFrames, StackLoss, StackStore, LOST_STACK, MAX_STACK_DEPTH, NO_STACK,
    },
    unwind_maps::FRAME_POINTERS_ONLY_FRAME,
};

use crate::{
    generations::count_new_keys,
    maps::{add, config, lose, LOSSES},
};

/// Stack hash -> frames, for every stack the agent has not taken into its stack cache yet.
/// Inserted only when new; only the agent deletes (after copying).
#[map]
static STACK_FRAMES: HashMap<u64, StackFrames> = HashMap::with_max_entries(32768, 0);

/// Per-CPU frames buffers ([`FramesBuffer`]): a stack is captured in one, then interned from
/// there.
#[map]
static STACK_SCRATCH: PerCpuArray<StackFrames> =
    PerCpuArray::with_max_entries(FramesBuffer::COUNT, 0);

/// This CPU's frames buffers, by their index in [`STACK_SCRATCH`]: a number, which a global
/// function can be handed on every kernel (a pointer argument needs 5.12, and 6.1 refuses one
/// as a map helper's value), and one map, so that the verifier checks what follows a lookup
/// once for every buffer.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum FramesBuffer {
    /// Samples' stacks.
    Sample = 0,
    /// Stacks of blocked threads: an overflow sample (an NMI) may interrupt the switch and
    /// wake-up programs, and has its own; a switch runs with interrupts off, so a wake-up in an
    /// interrupt never interrupts one.
    OffCpu = 1,
}

impl FramesBuffer {
    const COUNT: u32 = 2;

    /// This CPU's buffer.
    #[inline(always)]
    pub(crate) fn get(self) -> Option<*mut StackFrames> {
        STACK_SCRATCH.get_ptr_mut(self as u32)
    }
}

const EEXIST: i64 = 17;

const EFAULT: i64 = 14;

/// The stack-frames map as interning sees it.
struct FramesMap;

impl StackStore for FramesMap {
    #[inline(always)]
    fn stored(&self, hash: u64) -> Option<&StackFrames> {
        // SAFETY: the value is only read, and only the agent deletes entries (see
        // `profiler_common::stack::intern` on what a concurrent take means).
        unsafe { STACK_FRAMES.get(&hash) }
    }

    #[inline(always)]
    fn insert_new(&self, hash: u64, frames: &StackFrames) -> Result<(), Refused> {
        match STACK_FRAMES.insert(&hash, frames, BPF_NOEXIST as u64) {
            Ok(()) => Ok(()),
            Err(e) if -i64::from(e) == EEXIST => Err(Refused::Exists),
            Err(_) => Err(Refused::Full),
        }
    }
}

/// What a stack that could not be kept is counted as.
pub(crate) struct StackLosses {
    pub(crate) collision: LossKind,
    pub(crate) full: LossKind,
    pub(crate) failed: LossKind,
}

#[inline(always)]
pub(crate) fn user_stack_losses() -> StackLosses {
    StackLosses {
        collision: LossKind::UserStackHashCollision,
        full: LossKind::UserStackFramesFull,
        failed: LossKind::UserStackFailed,
    }
}

/// Captures the stack `flags` selects into this CPU's frames buffer with `bpf_get_stack`; `None`
/// when there is none (a kernel thread has no user stack, a user-mode sample no kernel stack),
/// `Err` when it could not be read (counted as `failed`).
#[inline(always)]
pub(crate) fn capture_stack(
    ctx: &PerfEventContext,
    flags: u64,
    failed: LossKind,
) -> Result<Option<FramesBuffer>, ()> {
    capture_stack_into(ctx, FramesBuffer::Sample, flags, failed)
}

/// [`capture_stack`] into the frames buffer `into`, from any program's context.
#[inline(always)]
pub(crate) fn capture_stack_into(
    ctx: &impl EbpfContext,
    into: FramesBuffer,
    flags: u64,
    failed: LossKind,
) -> Result<Option<FramesBuffer>, ()> {
    let Some(buffer) = into.get() else {
        lose(failed);
        return Err(());
    };
    // SAFETY: `buffer` is this CPU's frames buffer, `MAX_STACK_DEPTH` frames long; programs do
    // not nest on one CPU, so nothing else writes it meanwhile.
    let bytes = unsafe {
        aya_ebpf::helpers::generated::bpf_get_stack(
            ctx.as_ptr(),
            core::ptr::addr_of_mut!((*buffer).frames) as *mut core::ffi::c_void,
            (MAX_STACK_DEPTH * 8) as u32,
            flags,
        )
    };
    if bytes < 0 {
        if -bytes == EFAULT {
            return Ok(None);
        }
        lose(failed);
        return Err(());
    }
    let depth = bytes as u64 / 8;
    if depth == 0 {
        return Ok(None);
    }
    // SAFETY: as above.
    unsafe { (*buffer).depth = depth };
    Ok(Some(into))
}

/// Ends the stack in this CPU's frames buffer `stack` in `FRAME_POINTERS_ONLY_FRAME` (in place
/// of its last frame when it is full).
#[inline(always)]
pub(crate) fn mark_frame_pointers_only(stack: FramesBuffer) -> FramesBuffer {
    let Some(buffer) = stack.get() else {
        return stack;
    };
    // SAFETY: this CPU's frames buffer; programs do not nest on one CPU.
    let buffer = unsafe { &mut *buffer };
    let mut depth = buffer.depth as usize;
    if depth >= MAX_STACK_DEPTH {
        depth = MAX_STACK_DEPTH - 1;
    }
    if let Some(slot) = buffer.frames.get_mut(depth) {
        *slot = FRAME_POINTERS_ONLY_FRAME;
        buffer.depth = depth as u64 + 1;
    }
    stack
}

/// Interns the stack in this CPU's frames buffer `buffer` (a [`FramesBuffer`]) into the
/// stack-frames map: the stack's hash, or `LOST_STACK` (counted as the loss `collision` or
/// `full`, [`LossKind`]s) when a different stack has its hash or the map has no room. Whatever
/// fills a frames buffer (`bpf_get_stack` here, an unwinder of its own) ends here.
///
/// A global function, which the verifier checks once, not again at each of a program's calls
/// (its hash and comparison walk every frame): a third of the capture program's instructions
/// to check. Its arguments are numbers, which every kernel takes.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn intern_frames(generation: u32, buffer: u32, collision: u32, full: u32) -> u64 {
    let Some(frames) = STACK_SCRATCH.get_ptr_mut(buffer) else {
        return LOST_STACK;
    };
    // SAFETY: this CPU's frames buffer; programs do not nest on one CPU.
    match intern(&FramesMap, unsafe { &*frames }) {
        Ok(interned) => {
            if interned.new {
                count_new_keys(&config(), generation & 1, Fill::StackFrames, 1);
            }
            interned.hash
        }
        Err(StackLoss::HashCollision) => {
            add(&LOSSES, collision, 1);
            LOST_STACK
        }
        Err(StackLoss::Full) => {
            add(&LOSSES, full, 1);
            LOST_STACK
        }
    }
}

/// The hash of a captured stack: `NO_STACK` when there is none, `LOST_STACK` (counted) when it
/// could not be kept.
#[inline(always)]
pub(crate) fn stack_hash(
    captured: Result<Option<FramesBuffer>, ()>,
    generation: u32,
    losses: &StackLosses,
) -> u64 {
    match captured {
        Ok(Some(buffer)) => intern_frames(
            generation,
            buffer as u32,
            losses.collision as u32,
            losses.full as u32,
        ),
        Ok(None) => NO_STACK,
        Err(()) => LOST_STACK,
    }
}
