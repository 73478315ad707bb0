//! Fuzzes the profile file reader: whatever the bytes, `decode_profile` returns a profile or an
//! error, never panics, and a profile it returns refers only to frames and events it holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

use profiler::profile;

fuzz_target!(|data: &[u8]| {
    if let Ok(profile) = profile::file::decode_profile(data) {
        let frames = profile.frames.len() as u32;
        assert!(profile
            .stacks
            .iter()
            .all(|s| s.frames.iter().all(|&f| f < frames)));
    }
});
