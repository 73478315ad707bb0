//! A bounded fuzz pass over every cargo-fuzz target (fuzz/fuzz_targets): each runs for a few
//! seconds under libFuzzer's memory limits, its corpus kept in target/fuzz-corpus so that later
//! passes start from what earlier ones found. `cargo xtask test` runs it when `CI` is set;
//! `cargo xtask fuzz` runs it by hand, for as long as asked.

use std::process::Command;

use anyhow::Result;

use crate::{run_command, setup, target_dir, workspace_root};

/// Every target in fuzz/Cargo.toml.
const TARGETS: [&str; 3] = ["cfi_builder", "perf_data_reader", "profile_reader"];
/// What one input may allocate, and the process in all (the decoders' own bounds are far
/// below: an input that passes these is a bug).
const MALLOC_LIMIT_MB: u32 = 512;
const RSS_LIMIT_MB: u32 = 2048;

/// Fuzzes each target for `seconds`.
pub fn run(seconds: u64) -> Result<()> {
    setup::fuzzing()?;
    for target in TARGETS {
        let corpus = target_dir().join("fuzz-corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        run_command(
            Command::new("cargo")
                .current_dir(workspace_root())
                .args(["+nightly", "fuzz", "run", target])
                .arg(&corpus)
                .arg("--")
                .arg(format!("-max_total_time={seconds}"))
                .arg(format!("-malloc_limit_mb={MALLOC_LIMIT_MB}"))
                .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
                .arg("-timeout=10"),
        )?;
    }
    Ok(())
}
