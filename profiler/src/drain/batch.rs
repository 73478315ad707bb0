//! Reading and clearing a whole hash map in a few system calls
//! (`BPF_MAP_LOOKUP_AND_DELETE_BATCH`, Linux 5.6) instead of three per entry: a drain must clear
//! a generation faster than the program fills the other one, and at hundreds of thousands of
//! new keys per second (a page fault per fresh page) one syscall per entry is not.
//!
//! aya 0.14 has no batch operations, so this is the one place that calls `bpf(2)` directly.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use aya::{
    maps::{HashMap, IterableMap, MapData, PerCpuHashMap},
    Pod,
};

const BPF_MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
/// `ENOTSUPP`, the kernel-internal "operation not supported" some map types return.
const ENOTSUPP: i32 = 524;
/// Bytes of value buffer one batch call fills at most: large enough for few calls, small
/// enough not to matter for memory whatever the number of CPUs.
const BATCH_VALUE_BYTES: usize = 8 << 20;
/// Entries the first batch call of a drain asks for.
const FIRST_BATCH_ENTRIES: usize = 256;

/// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// A map's entries, each with its value on every possible CPU.
pub type PerCpuEntries<K, V> = Vec<(K, Vec<V>)>;

/// Every entry of `map` with its per-CPU values (one per possible CPU, `cpus` of them), deleted
/// from the map. `Ok(None)` when the kernel has no batch operations for it (before 5.6): the
/// caller falls back to iterating.
pub fn take_all_batched<K: Pod, V: Pod>(
    map: &PerCpuHashMap<MapData, K, V>,
    cpus: usize,
) -> io::Result<Option<PerCpuEntries<K, V>>> {
    // The kernel lays per-CPU values out at 8-byte strides.
    let stride = std::mem::size_of::<V>().next_multiple_of(8);
    take_batched(IterableMap::<K, _>::map(map), cpus, stride)
}

/// Every entry of the (not per-CPU) hash map `map`, deleted from the map; `Ok(None)` as for
/// [`take_all_batched`].
pub fn take_all_shared_batched<K: Pod, V: Pod>(
    map: &HashMap<MapData, K, V>,
) -> io::Result<Option<Vec<(K, V)>>> {
    let entries = take_batched(IterableMap::<K, V>::map(map), 1, std::mem::size_of::<V>())?;
    Ok(entries.map(|entries| {
        entries
            .into_iter()
            .filter_map(|(key, values)| Some((key, values.into_iter().next()?)))
            .collect()
    }))
}

/// The batch loop: `cpus` values of `V` per entry (one for a map that is not per-CPU), `stride`
/// bytes apart.
fn take_batched<K: Pod, V: Pod>(
    map: &MapData,
    cpus: usize,
    stride: usize,
) -> io::Result<Option<PerCpuEntries<K, V>>> {
    let fd = map.fd().as_fd().as_raw_fd();
    // No batch need hold more than the map can: a map of a few thousand entries gets buffers of
    // that size, not BATCH_VALUE_BYTES.
    let entries = map
        .info()
        .map_or(usize::MAX, |info| info.max_entries() as usize);
    let largest = (BATCH_VALUE_BYTES / (stride * cpus).max(1)).clamp(1, entries.max(1));
    // Start small and double after every full batch: a drain of a few new entries (the usual
    // case at low rates) zeroes kilobytes, not megabytes, and a full map still takes few calls.
    let mut chunk = FIRST_BATCH_ENTRIES.min(largest);
    let mut entries = Vec::new();
    // The position token of a hash map is a bucket index (4 bytes); 8 leaves room.
    let (mut position, mut next) = (0u64, 0u64);
    let mut first = true;
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    loop {
        keys.resize(chunk * std::mem::size_of::<K>(), 0u8);
        values.resize(chunk * stride * cpus, 0u8);
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &position as *const u64 as u64
            },
            out_batch: &mut next as *mut u64 as u64,
            map_fd: fd as u32,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is the kernel's batch attribute layout, its pointers point to live
        // buffers of `count` keys and `count * cpus` value strides and to the position tokens,
        // all of which outlive the call; the kernel writes only within them.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_AND_DELETE_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>() as u32,
            )
        };
        let error = (result < 0).then(io::Error::last_os_error);
        let filled = attr.count as usize;
        for index in 0..filled {
            let key_bytes = &keys[index * std::mem::size_of::<K>()..];
            // SAFETY: `key_bytes` holds at least one K written by the kernel; K is Pod (any bytes
            // are valid) and read_unaligned has no alignment needs.
            let key = unsafe { std::ptr::read_unaligned(key_bytes.as_ptr() as *const K) };
            let per_cpu = (0..cpus)
                .map(|cpu| {
                    let offset = (index * cpus + cpu) * stride;
                    // SAFETY: as for the key, within the value buffer's `count * cpus` strides.
                    unsafe { std::ptr::read_unaligned(values[offset..].as_ptr() as *const V) }
                })
                .collect();
            entries.push((key, per_cpu));
        }
        match error.as_ref().and_then(io::Error::raw_os_error) {
            None => {}
            // The last batch: everything was read.
            Some(libc::ENOENT) => return Ok(Some(entries)),
            // One hash bucket holds more entries than a batch: retry the same position larger.
            Some(libc::ENOSPC) if filled == 0 => {
                chunk *= 2;
                continue;
            }
            Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP) if first && filled == 0 => {
                return Ok(None)
            }
            Some(_) => return Err(error.expect("an errno came from an error")),
        }
        position = next;
        first = false;
        if filled == chunk {
            chunk = (chunk * 2).min(largest);
        }
    }
}
