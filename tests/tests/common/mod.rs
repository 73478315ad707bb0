//! Shared helpers of the integration tests: finding and running the profiler and the workloads.
//!
//! These tests use the real kernel: they load BPF programs and open perf events, so they need
//! root. They fail (never skip) when they cannot; only hardware-PMU tests skip, saying why.

#![allow(dead_code)] // each test binary uses a different subset

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use serde_json::Value;

/// The profiler binary: $PROFILER_BIN (set by `cargo xtask test`), else target/release.
pub fn profiler_bin() -> PathBuf {
    let path = std::env::var_os("PROFILER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/profiler")
        });
    assert!(
        path.is_file(),
        "profiler binary not found at {}: run the tests with `cargo xtask test`, which builds it",
        path.display()
    );
    path
}

pub fn workload(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_cpu_split"))
        .parent()
        .expect("binaries live in a directory")
        .to_path_buf();
    dir.join(name)
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "integration tests load BPF programs: run them as root (sudo -E cargo xtask test)"
    );
}

/// Runs the profiler, asserting success, and returns its output.
pub fn profiler(args: &[&str]) -> Output {
    require_root();
    let output = Command::new(profiler_bin())
        .args(args)
        .output()
        .expect("the profiler runs");
    assert!(
        output.status.success(),
        "profiler {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

/// Runs the profiler with `--json` and parses its report.
pub fn profiler_json(args: &[&str]) -> (Value, String) {
    let output = profiler(args);
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "the report is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    (report, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Self-sample percentage of a function in an event of a JSON report (0 when absent).
pub fn self_percent(event: &Value, function: &str) -> f64 {
    event["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .find(|f| f["function"] == function)
        .map_or(0.0, |f| f["self_percent"].as_f64().expect("a number"))
}
