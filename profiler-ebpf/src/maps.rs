//! What the overflow and the off-CPU programs share: the agent's options, the filters and loss
//! counters both apply, and how a program counts into per-CPU maps.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{HashMap, PerCpuArray, PerCpuHashMap},
};
use profiler_common::{
    capture::{CaptureConfig, KernelOffsets, LossKind},
    latency::{bucket_index, LatencyBuckets, LATENCY_BUCKETS},
};

/// Read-only options and kernel offsets, set by the agent at load time.
#[unsafe(no_mangle)]
static CAPTURE_CONFIG: CaptureConfig = CaptureConfig::EMPTY;

#[inline(always)]
pub(crate) fn config() -> CaptureConfig {
    // SAFETY: a plain read of our own read-only global; volatile so the compiler cannot fold
    // the all-zero initializer that the agent overrides at load time.
    unsafe { core::ptr::read_volatile(&CAPTURE_CONFIG) }
}

/// One of the kernel offsets in the options, read alone: the unwinder's frame step has no room on
/// its stack for a copy of all the options.
#[inline(always)]
pub(crate) fn kernel_offset(field: impl FnOnce(&KernelOffsets) -> &u32) -> u32 {
    // SAFETY: as in `config`, one field of it.
    unsafe { core::ptr::read_volatile(field(&CAPTURE_CONFIG.offsets)) }
}

/// Samples dropped by the uid or cgroup filter (not losses: the user asked for it).
#[map]
pub(crate) static SAMPLES_FILTERED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub(crate) static LOSSES: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(LossKind::COUNT as u32, 0);

/// Cgroup ids whose samples are kept, with `CAPTURE_FILTER_CGROUP`.
#[map]
pub(crate) static CGROUP_FILTER: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);

#[inline(always)]
pub(crate) fn add(counter: &PerCpuArray<u64>, index: u32, n: u64) {
    if let Some(slot) = counter.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, and programs do not nest on one CPU (the kernel's
        // bpf_prog_active guard), so nothing else writes it concurrently.
        unsafe { *slot += n };
    }
}

#[inline(always)]
pub(crate) fn lose(kind: LossKind) {
    add(&LOSSES, kind as u32, 1);
}

/// Adds one sample to a per-CPU hash map entry, creating it on first use; whether it created
/// the entry.
#[inline(always)]
pub(crate) fn bump<K, V>(
    map: &PerCpuHashMap<K, V>,
    key: &K,
    init: &V,
    update: impl Fn(&mut V),
    full: LossKind,
) -> bool {
    if let Some(value) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's slot of an existing entry; programs do not nest on one CPU.
        update(unsafe { &mut *value });
        return false;
    }
    if map.insert(key, init, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    // Another CPU may have created the key (EEXIST) between lookup and insert: retry once.
    match map.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(value) => update(unsafe { &mut *value }),
        None => lose(full),
    }
    false
}

/// Adds one latency to its histogram in `map`, creating the histogram on first use; 1 when it
/// created one, else 0.
#[inline(always)]
pub(crate) fn record_latency<K>(
    map: &PerCpuHashMap<K, LatencyBuckets>,
    key: &K,
    latency: u64,
    full: LossKind,
) -> u64 {
    let bucket = bucket_index(latency);
    if bucket >= LATENCY_BUCKETS {
        return 0;
    }
    let mut created = 0;
    if map.get_ptr_mut(key).is_none() {
        // An empty histogram is too large for the 512-byte BPF stack: insert the one kept in
        // read-only data.
        if map
            .insert(key, &EMPTY_HISTOGRAM, BPF_NOEXIST as u64)
            .is_ok()
        {
            created = 1;
        } else if map.get_ptr_mut(key).is_none() {
            lose(full);
            return 0;
        }
    }
    if let Some(histogram) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's slot; `bucket` was bounds-checked above.
        unsafe { (*histogram).counts[bucket] += 1 };
    }
    created
}

static EMPTY_HISTOGRAM: LatencyBuckets = LatencyBuckets {
    counts: [0; LATENCY_BUCKETS],
};
