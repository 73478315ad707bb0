//! How whole the call stacks are, per unwinder, on Debian's own programs (built without frame
//! pointers): the share of samples whose user stack reaches `_start`, `main` or a thread start,
//! and the mean user depth; and what unwinding costs the whole tool: CPU time of recording
//! beyond the bare program, plus the report, per sample. perf's profiles are read by our
//! perf.data import, so every row is judged by the same rule (`report --json`, `user_stacks`).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde::Serialize;

use super::{measure, tools::path_arg};

/// Sampling rate of these runs.
const RATE_HZ: &str = "999";

/// One program under one unwinder.
#[derive(Clone, Debug, Serialize)]
pub struct StackQualityRow {
    pub program: &'static str,
    pub unwinder: &'static str,
    pub record_command: String,
    pub samples: u64,
    pub complete_percent: f64,
    pub mean_depth: f64,
    /// CPU time of record (beyond the bare program's) and report, per sample.
    pub tool_cpu_us_per_sample: f64,
}

/// A way to record call stacks: our profiler with some options, or perf.
struct Unwinder {
    name: &'static str,
    /// `record` arguments after the tool's own (`profiler record` or `perf record`).
    options: &'static [&'static str],
    perf: bool,
}

const UNWINDERS: [Unwinder; 5] = [
    Unwinder {
        name: "ours --unwind fp",
        options: &["--unwind", "fp"],
        perf: false,
    },
    Unwinder {
        name: "ours --unwind dwarf",
        options: &["--unwind", "dwarf"],
        perf: false,
    },
    Unwinder {
        name: "ours --unwind copy",
        options: &["--unwind", "copy"],
        perf: false,
    },
    Unwinder {
        name: "perf -g",
        options: &["-g"],
        perf: true,
    },
    Unwinder {
        name: "perf --call-graph dwarf",
        options: &["--call-graph", "dwarf"],
        perf: true,
    },
];

/// Every program under every unwinder.
pub fn measure(profiler: &Path, work: &Path) -> Result<Vec<StackQualityRow>> {
    let input = work.join("stack-quality.input");
    std::fs::write(&input, compressible_bytes(6 << 20))
        .with_context(|| format!("writing {}", input.display()))?;
    let programs: [(&'static str, Vec<String>); 2] = [
        (
            "xz -9",
            vec![
                "/usr/bin/xz".into(),
                "-9".into(),
                "-c".into(),
                "-T1".into(),
                path_arg(&input),
            ],
        ),
        (
            "python3",
            vec![
                "/usr/bin/python3".into(),
                "-c".into(),
                "import json; [json.loads(json.dumps(list(range(100000)))) for _ in range(150)]"
                    .into(),
            ],
        ),
    ];
    let mut rows = Vec::new();
    for (program, argv) in &programs {
        let bare = measure::run(argv, None)?;
        for unwinder in &UNWINDERS {
            let profile = work.join(if unwinder.perf {
                "stacks.perf.data"
            } else {
                "stacks.prof"
            });
            let _ = std::fs::remove_file(&profile);
            let mut record: Vec<String> = if unwinder.perf {
                vec!["perf".into(), "record".into(), "-q".into()]
            } else {
                vec![path_arg(profiler), "record".into()]
            };
            record.extend(["-F".into(), RATE_HZ.into(), "-o".into(), path_arg(&profile)]);
            record.extend(unwinder.options.iter().map(|option| option.to_string()));
            record.push("--".into());
            record.extend(argv.iter().cloned());
            let recorded = measure::run(&record, None)?;
            let report_json = work.join("stacks.json");
            let reported = measure::run(
                &[
                    path_arg(profiler),
                    "report".into(),
                    "-i".into(),
                    path_arg(&profile),
                    "--json".into(),
                ],
                Some(&report_json),
            )?;
            let report: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(&report_json)
                    .with_context(|| format!("reading {}", report_json.display()))?,
            )?;
            let stacks = &report["events"][0]["user_stacks"];
            let number = |key: &str| {
                stacks[key]
                    .as_f64()
                    .ok_or_else(|| anyhow!("no user_stacks.{key} in the report of {program}"))
            };
            let samples = number("samples")? as u64;
            let tool_cpu_s = (recorded.cpu_s - bare.cpu_s).max(0.0) + reported.cpu_s;
            let row = StackQualityRow {
                program,
                unwinder: unwinder.name,
                record_command: recorded.command,
                samples,
                complete_percent: number("complete_percent")?,
                mean_depth: number("mean_depth")?,
                tool_cpu_us_per_sample: 1e6 * tool_cpu_s / samples.max(1) as f64,
            };
            eprintln!(
                "xtask bench: stacks {:<8} {:<24} {:>6} samples, {:5.1}% complete, depth {:.1}, \
                 {:.0} us of tool CPU per sample",
                row.program,
                row.unwinder,
                row.samples,
                row.complete_percent,
                row.mean_depth,
                row.tool_cpu_us_per_sample
            );
            rows.push(row);
        }
    }
    let _ = std::fs::remove_file(PathBuf::from(&input));
    Ok(rows)
}

/// Text-like bytes that xz compresses at a steady pace: words from a small vocabulary.
fn compressible_bytes(len: usize) -> Vec<u8> {
    const WORDS: [&[u8]; 8] = [
        b"sample ",
        b"stack ",
        b"frame ",
        b"counter ",
        b"overflow ",
        b"kernel ",
        b"cache ",
        b"line\n",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut bytes = Vec::with_capacity(len + 16);
    while bytes.len() < len {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        bytes.extend_from_slice(WORDS[(state >> 61) as usize]);
    }
    bytes.truncate(len);
    bytes
}
