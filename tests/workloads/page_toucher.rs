//! Touches a known set of fresh pages, each at a known cache line, so page-fault samples with
//! data addresses can be checked exactly.
//!
//! Usage: page_toucher PAGES [LINE [SECOND_PAGES]]
//! Maps PAGES fresh anonymous pages, writes one byte at cache line LINE (0..63, default 5) of
//! every page, and prints the mapping's start address and the line offset so a test knows which
//! addresses the faults must report. With SECOND_PAGES, another function then touches that many
//! pages of a second region the same way (`second region ...`), so a view that drops samples
//! of a large run shows as a missing function and region.

use std::hint::black_box;

const PAGE: usize = 4096;
const LINE: usize = 64;

#[inline(never)]
fn touch_pages(region: &mut [u8], line: usize) {
    for page in region.chunks_mut(PAGE) {
        // volatile: every page must really be written, in order.
        let byte = &mut page[line * LINE];
        // SAFETY: `byte` is a valid, exclusive reference into the region.
        unsafe { std::ptr::write_volatile(byte, 1) };
    }
}

#[inline(never)]
fn touch_second_pages(region: &mut [u8], line: usize) {
    touch_pages(region, line);
    // Used after the call, so it is not a tail call: stacks show this function as the caller.
    black_box(region.len());
}

/// A fresh page-aligned region of `pages` pages, announced on stderr with `label`, handed to
/// `touch`; returned so it stays mapped and a later region cannot reuse its addresses.
fn with_fresh_region(
    label: &str,
    pages: usize,
    line: usize,
    touch: fn(&mut [u8], usize),
) -> Vec<u8> {
    // A fresh Vec of zeroes is mapped lazily by the allocator (mmap for large sizes), so each
    // first write faults once.
    let mut region = vec![0u8; pages * PAGE + PAGE];
    let offset = region.as_ptr().align_offset(PAGE);
    let aligned = &mut region[offset..offset + pages * PAGE];
    // On stderr: a profiler's report owns stdout.
    eprintln!(
        "{label} {:#x} pages {pages} line {line}",
        aligned.as_ptr() as usize
    );
    touch(aligned, line);
    region
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pages: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let line: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5) % (PAGE / LINE);
    let second: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let first = with_fresh_region("region", pages, line, touch_pages);
    if second > 0 {
        black_box(with_fresh_region(
            "second region",
            second,
            line,
            touch_second_pages,
        ));
    }
    black_box(first);
}
