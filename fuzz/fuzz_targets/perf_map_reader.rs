//! Fuzzes the JIT perf-map parser: whatever the bytes, it returns, never panics, keeps entries
//! sorted by start, and never holds more than its cap. (The bounded run that CI does is a unit
//! test of the profiler crate: `symbolize::perf_map::tests`.)
#![no_main]

use libfuzzer_sys::fuzz_target;

use profiler::symbolize::perf_map::parse_perf_map;

/// Small, so that inputs of a few kilobytes reach it.
const MAX_ENTRY_BYTES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let map = parse_perf_map(data, MAX_ENTRY_BYTES);
    assert!(map.entry_bytes <= MAX_ENTRY_BYTES);
    assert!(map.entries.windows(2).all(|w| w[0].0 <= w[1].0));
    let named: usize = map.entries.iter().map(|entry| entry.2.len()).sum();
    assert!(named <= map.entry_bytes);
});
