//! Hands the heap's free pages back to the kernel. glibc keeps freed pages below live ones
//! resident, and serves later allocations, even large ones, from them: a burst (parsing the
//! kernel's BTF while loading, the unwind table and symbols of a program as large as a compiler)
//! would otherwise stay in an always-on agent's memory for its whole life.

/// Bytes the heap holds in live allocations, in every malloc arena and in blocks mapped apart:
/// what the agent's memory budget (`--memory-max`) is measured against. Free pages glibc keeps
/// are not counted; [`release_free_pages`] hands them back.
pub fn in_use_bytes() -> u64 {
    // SAFETY: mallinfo2(3) only reads the allocator's statistics (under its arenas' locks).
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

/// Returns the free pages of every malloc arena to the kernel.
pub fn release_free_pages() {
    // SAFETY: malloc_trim(3) only returns free heap pages to the kernel; it has no
    // preconditions and touches no live allocation.
    unsafe { libc::malloc_trim(0) };
}
