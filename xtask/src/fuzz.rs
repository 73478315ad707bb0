//! A bounded fuzz pass over every cargo-fuzz target (fuzz/fuzz_targets): each runs for a few
//! seconds under libFuzzer's memory limits, its corpus kept in target/fuzz-corpus so that later
//! passes start from what earlier ones found. `cargo xtask test` runs it when `CI` is set;
//! `cargo xtask fuzz` runs it by hand, for as long as asked.

use std::process::Command;

use anyhow::Result;

use crate::{run_command, setup, target_dir, workspace_root};

/// What one input may allocate, and the process in all (the decoders' own bounds are far
/// below: an input that passes these is a bug).
const MALLOC_LIMIT_MB: u32 = 512;
const RSS_LIMIT_MB: u32 = 2048;

/// Fuzzes each target for `seconds`.
pub fn run(seconds: u64) -> Result<()> {
    setup::fuzzing()?;
    for target in targets()? {
        let corpus = target_dir().join("fuzz-corpus").join(&target);
        std::fs::create_dir_all(&corpus)?;
        run_command(
            Command::new("cargo")
                .current_dir(workspace_root())
                .args(["+nightly", "fuzz", "run", &target])
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

/// Every target: each file in fuzz/fuzz_targets is one (cargo-fuzz's layout), so a new target
/// is fuzzed without being listed here.
fn targets() -> Result<Vec<String>> {
    let mut targets = Vec::new();
    for entry in std::fs::read_dir(workspace_root().join("fuzz/fuzz_targets"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|extension| extension == "rs") {
            if let Some(stem) = path.file_stem().and_then(|stem| stem.to_str()) {
                targets.push(stem.to_string());
            }
        }
    }
    targets.sort();
    anyhow::ensure!(!targets.is_empty(), "no fuzz targets in fuzz/fuzz_targets");
    Ok(targets)
}
