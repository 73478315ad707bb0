//! Fuzzes the perf.data reader: whatever the bytes, `parse` returns the recording or an error,
//! never panics. (The bounded structure-aware runs that CI does are unit tests of the profiler
//! crate: `perf_data::tests`.)
#![no_main]

use libfuzzer_sys::fuzz_target;

use profiler::perf_data;

fuzz_target!(|data: &[u8]| {
    let _ = perf_data::parse(data);
});
