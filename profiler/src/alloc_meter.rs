//! A counting global allocator for the unit tests: the most bytes a piece of code held at once
//! on its thread, so that fuzz tests can assert a decoder's memory stays under a bound whatever
//! its input.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

struct Meter;

thread_local! {
    /// Bytes allocated minus bytes freed on this thread.
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn record(delta: isize) {
    // `try_with`: the counters need no destructor, but a thread being torn down may still
    // allocate after its locals are gone.
    let _ = HELD.try_with(|held| {
        let now = held.get() + delta;
        held.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is passed on unchanged to the system allocator; the meter only counts.
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is the system allocator's.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            record(layout.size() as isize);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            record(layout.size() as isize);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: `block` came from this allocator with `layout`.
        unsafe { System.dealloc(block, layout) };
        record(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `block` came from this allocator with `layout`.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            record(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

#[global_allocator]
static METER: Meter = Meter;

/// Runs `work` and returns its result with the most bytes it held at once on this thread.
pub fn peak_bytes<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let before = HELD.with(Cell::get);
    PEAK.with(|peak| peak.set(before));
    let result = work();
    let peak = PEAK.with(Cell::get);
    (result, (peak - before).max(0) as usize)
}

#[test]
fn counts_what_is_held_at_once() {
    let ((), peak) = peak_bytes(|| {
        let first = vec![0u8; 1 << 20];
        drop(first);
        let second = std::hint::black_box(vec![0u8; 3 << 20]);
        drop(second);
    });
    assert!((3 << 20..4 << 20).contains(&peak), "{peak}");
}
