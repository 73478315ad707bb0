//! The two generations of the drained maps. Every map the agent drains exists twice
//! (generation 0 and 1). The program writes to the generation named in `CONTROL`; the agent
//! flips it, waits until no program is still writing the old one (`INFLIGHT`), drains the old
//! one and clears it. Nothing written during a drain is lost or counted twice.

use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    macros::map,
    maps::{Array, PerCpuArray, RingBuf},
};
use profiler_common::capture::{fill_index, CaptureConfig, Fill, CONTROL_GENERATION};

use crate::maps::add;

/// Index `CONTROL_GENERATION`: the generation the program writes to.
#[map]
static CONTROL: Array<u32> = Array::with_max_entries(1, 0);

/// Entries each generation has created in each of its maps, per CPU (index `fill_index`): the
/// agent drains early when the generation it is not draining fills up.
#[map]
static NEW_KEYS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2 * Fill::COUNT as u32, 0);

/// A `Fill` index each time a CPU has created `drain_request_steps` more entries in one map:
/// wakes the agent to check the fill between its timer ticks, however fast samples come.
#[map]
static DRAIN_REQUESTS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Programs currently writing each generation, per CPU.
#[map]
static INFLIGHT: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

/// The generation a sample or an off-CPU block entered, whose maps count it. Each map is picked
/// where it is used, from the number read anew: once the map's pointers are dead the
/// verifier's states of both generations are the same again and it checks what follows once.
/// Maps picked once, up front, stay in its state to the end, and it checked everything after
/// the pick twice (the kernel stack's hashing among it).
#[derive(Clone, Copy)]
pub(crate) struct Generation<'a> {
    pub(crate) entered: &'a u32,
}

impl Generation<'_> {
    /// 0 or 1. A volatile load, so the compiler keeps no copy that an earlier pick narrowed,
    /// and the `& 1` is a new value to the verifier, whose branch on it narrows nothing else.
    #[inline(always)]
    pub(crate) fn index(self) -> u32 {
        // SAFETY: a reference is valid for reads.
        (unsafe { core::ptr::read_volatile(self.entered) }) & 1
    }

    /// This generation's map of the pair; picked in code, as BPF data sections cannot hold the
    /// maps' relocations.
    #[inline(always)]
    pub(crate) fn pick<T>(self, zero: &'static T, one: &'static T) -> &'static T {
        if self.index() == 0 {
            zero
        } else {
            one
        }
    }
}

/// Counts `new` new entries in the maps of `fill` in `generation`, and asks the agent to look at
/// the fills each time this CPU's count passes a multiple of `drain_request_steps`.
#[inline(always)]
pub(crate) fn count_new_keys(config: &CaptureConfig, generation: u32, fill: Fill, new: u64) {
    let Some(slot) = NEW_KEYS.get_ptr_mut(fill_index(generation, fill)) else {
        return;
    };
    // SAFETY: per-CPU slot, and programs do not nest on one CPU.
    let created = unsafe {
        *slot += new;
        *slot
    };
    let step = u64::from(config.drain_request_steps[fill as usize]);
    if step != 0 && (created - new) / step != created / step {
        // A full request ring only means the agent already has requests to read.
        let _ = DRAIN_REQUESTS.output::<u32>(&(fill as u32), BPF_RB_FORCE_WAKEUP as u64);
    }
}

#[inline(always)]
fn current_generation() -> u32 {
    match CONTROL.get_ptr(CONTROL_GENERATION) {
        // SAFETY: pointer into the control array value; volatile because the agent changes it.
        Some(generation) => (unsafe { core::ptr::read_volatile(generation) }) & 1,
        None => 0,
    }
}

/// Enters the current generation, checking it did not flip in between: the agent waits for
/// `INFLIGHT` of the old generation to reach zero before draining it. Left by
/// [`leave_generation`].
#[inline(always)]
pub(crate) fn enter_generation() -> u32 {
    let mut generation = current_generation();
    add(&INFLIGHT, generation, 1);
    let now = current_generation();
    if now != generation {
        leave_generation(generation);
        generation = now;
        add(&INFLIGHT, generation, 1);
    }
    generation
}

#[inline(always)]
pub(crate) fn leave_generation(generation: u32) {
    add(&INFLIGHT, generation & 1, u64::MAX);
}
