//! A perf event's ring buffer (the mmap page and the data area after it), read a batch at a
//! time: the kernel's head is loaded once per read and the tail stored once. The head and tail
//! share one cache line of the mmap page, which the kernel writes after every record it puts in
//! the ring, so a reader that loaded and stored them per record (perf-event2's `Sampler`) had
//! that line move between CPUs twice per record: under process churn the side-band reads 15,000
//! records a second, and that was the largest part of the agent's CPU.

use std::{ops::Range, ptr::NonNull, sync::atomic};

use perf_event_open_sys::bindings::perf_event_mmap_page;

/// Size of the header every record starts with (type, misc, size).
const HEADER_BYTES: usize = 8;

/// One record, header included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfRecord<'a> {
    pub bytes: &'a [u8],
}

impl<'a> PerfRecord<'a> {
    /// PERF_RECORD_*.
    pub fn kind(&self) -> u32 {
        u32::from_ne_bytes(self.bytes[..4].try_into().expect("a header's 4 bytes"))
    }

    pub fn misc(&self) -> u16 {
        u16::from_ne_bytes([self.bytes[4], self.bytes[5]])
    }

    /// What follows the header.
    pub fn body(&self) -> &'a [u8] {
        &self.bytes[HEADER_BYTES..]
    }
}

/// Where `count` bytes from stream position `at` lie in a ring of `len` bytes: a first piece up
/// to the ring's end and the rest from its start.
pub fn wrapped(len: usize, at: u64, count: usize) -> [Range<usize>; 2] {
    let start = (at % len as u64) as usize;
    let count = count.min(len);
    let first = count.min(len - start);
    [start..start + first, 0..count - first]
}

/// An event's mmap page and data ring, mapped.
pub struct PerfRing {
    /// The mmap page and the data ring after it.
    base: NonNull<u8>,
    base_len: usize,
    ring_len: usize,
    /// Records that wrap the ring's end are copied here whole.
    wrapped_record: Vec<u8>,
}

// SAFETY: the mapping is owned by this value alone and only read or written through `&mut
// self` (or `&self` for copies out); the kernel's concurrent writes are to bytes the reader
// does not own until the head passes them.
unsafe impl Send for PerfRing {}

/// The system's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

/// Maps `len` bytes of the perf event `fd` at `offset`, shared and writable (the reader writes
/// the tails).
pub fn map_event(fd: i32, len: usize, offset: usize) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a new shared mapping of a perf event descriptor the caller holds open; the
    // kernel checks the length and offset.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    match address {
        libc::MAP_FAILED => Err(std::io::Error::last_os_error()),
        address => Ok(NonNull::new(address as *mut u8).expect("mmap never maps page 0")),
    }
}

impl PerfRing {
    /// Maps `fd`'s ring of `ring_bytes`, rounded up to a power of two pages.
    pub fn map(fd: i32, ring_bytes: usize) -> std::io::Result<PerfRing> {
        let ring_len = ring_bytes.max(page_size()).next_power_of_two();
        let base_len = page_size() + ring_len;
        Ok(PerfRing {
            base: map_event(fd, base_len, 0)?,
            base_len,
            ring_len,
            wrapped_record: Vec::new(),
        })
    }

    /// Bytes mapped: where an AUX area's mapping starts.
    pub fn mapped_len(&self) -> usize {
        self.base_len
    }

    pub fn page(&self) -> *mut perf_event_mmap_page {
        self.base.as_ptr() as *mut perf_event_mmap_page
    }

    /// The data ring: one page after the mmap page.
    fn data(&self) -> &[u8] {
        // SAFETY: the data ring lies inside the base mapping, after the mmap page, and stays
        // mapped while `self` lives. The kernel writes only bytes past the head, which no
        // reader looks at until the head covers them.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(self.base_len - self.ring_len),
                self.ring_len,
            )
        }
    }

    /// Copies `count` bytes from stream position `at` of the data ring into `out`.
    pub fn copy_into(&self, at: u64, count: usize, out: &mut Vec<u8>) {
        let data = self.data();
        for piece in wrapped(data.len(), at, count) {
            out.extend_from_slice(&data[piece]);
        }
    }

    /// Hands every record the kernel finished to `each`, in order, then gives their room back
    /// to the kernel. A record whose size the kernel never writes ends the read there and
    /// skips the rest of the batch.
    pub fn read_records(&mut self, mut each: impl FnMut(PerfRecord<'_>)) {
        let page = self.page();
        // SAFETY: `page` is the mapped mmap page; data_head is written by the kernel, read once
        // and ordered before the data it covers by the fence.
        let (head, tail) = unsafe {
            let head = std::ptr::addr_of!((*page).data_head).read_volatile();
            atomic::fence(atomic::Ordering::Acquire);
            (head, std::ptr::addr_of!((*page).data_tail).read_volatile())
        };
        let mut position = tail;
        let mut whole = std::mem::take(&mut self.wrapped_record);
        while position + HEADER_BYTES as u64 <= head {
            let data = self.data();
            let start = (position % data.len() as u64) as usize;
            let size_at = |bytes: &[u8]| u16::from_ne_bytes([bytes[6], bytes[7]]) as usize;
            let size = if start + HEADER_BYTES <= data.len() {
                size_at(&data[start..])
            } else {
                whole.clear();
                self.copy_into(position, HEADER_BYTES, &mut whole);
                size_at(&whole)
            };
            if size < HEADER_BYTES || position + size as u64 > head {
                position = head;
                break;
            }
            let record = if start + size <= data.len() {
                &data[start..start + size]
            } else {
                whole.clear();
                self.copy_into(position, size, &mut whole);
                &whole[..]
            };
            each(PerfRecord { bytes: record });
            position += size as u64;
        }
        self.wrapped_record = whole;
        self.release(position);
    }

    /// Gives the ring up to stream position `position` back to the kernel.
    fn release(&mut self, position: u64) {
        let page = self.page();
        atomic::fence(atomic::Ordering::Release);
        // SAFETY: the records up to `position` were read; writing the tail hands that room
        // back to the kernel.
        unsafe { std::ptr::addr_of_mut!((*page).data_tail).write_volatile(position) };
    }
}

impl Drop for PerfRing {
    fn drop(&mut self) {
        // SAFETY: mapped by `map` with this length and not used after.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.base_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_positions_wrap_at_the_ring_end() {
        assert_eq!(wrapped(4096, 100, 50), [100..150, 0..0]);
        assert_eq!(wrapped(4096, 4096 * 3 + 4000, 200), [4000..4096, 0..104]);
        // Never more than the ring holds.
        assert_eq!(wrapped(4096, 10, 10_000), [10..4096, 0..10]);
    }
}
