//! How whole the call stacks are, per unwinder, on Debian's own programs (built without frame
//! pointers): the share of samples whose user stack reaches `_start`, `main` or a thread start,
//! and the mean user depth; and what unwinding costs the whole tool per sample, and apart from
//! its fixed cost (recording `true` and reporting it). A tool's CPU is its own process tree's
//! while recording (the tree less the program's, which `run_timed` measures: the program's own
//! time varies by more than a tool's whole cost), plus its report's (`perf report` for perf),
//! plus for ours the capture program's run time in the kernel (its BPF statistics). perf's
//! in-interrupt stack copies cannot be told apart from the program's time and are left out,
//! which favours perf. Every row's stacks are judged by the same rule, our report's
//! `user_stacks` (perf's files through our perf.data import, a run not counted in perf's
//! cost).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde::Serialize;

use super::{
    measure,
    summary::Spread,
    tools::{self, path_arg, Tools},
};

/// Sampling rate of these runs.
const RATE_HZ: &str = "999";

/// The unwinder whose whole-tool CPU ours is held against, and the budget (issue 15): at most a
/// third of its CPU per sample.
pub const PERF_DWARF: &str = "perf --call-graph dwarf";
pub const BUDGET_VERSUS_PERF_DWARF: f64 = 1.0 / 3.0;

/// Where a recording's own report writes its output (the JSON report, for ours).
const REPORT_OUTPUT: &str = "stacks.report";

/// Runs of `true` whose median is a tool's fixed cost: one run's varies by half.
const FIXED_COST_RUNS: usize = 5;

/// One program under one unwinder.
#[derive(Clone, Debug, Serialize)]
pub struct StackQualityRow {
    pub program: &'static str,
    pub unwinder: &'static str,
    pub record_command: String,
    pub samples: u64,
    pub complete_percent: f64,
    pub mean_depth: f64,
    /// The tool's CPU time recording and reporting, per sample.
    pub tool_cpu_us_per_sample: f64,
    /// The tool's fixed cost: CPU time of recording `true` and reporting it (the median of
    /// [`FIXED_COST_RUNS`]).
    pub fixed_cpu_ms: f64,
    /// What each sample adds beyond the fixed cost: the tool CPU less the fixed cost, per
    /// sample (a long run's cost per sample).
    pub beyond_fixed_us_per_sample: f64,
    /// The command whose CPU is the report's share (`perf report` for perf).
    pub report_command: String,
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
        name: PERF_DWARF,
        options: &["--call-graph", "dwarf"],
        perf: true,
    },
];

/// Every program under every unwinder.
pub fn measure(tools: &Tools, work: &Path) -> Result<Vec<StackQualityRow>> {
    let input = work.join("stack-quality.input");
    std::fs::write(&input, compressible_bytes(6 << 20))
        .with_context(|| format!("writing {}", input.display()))?;
    let programs: [(&'static str, Vec<String>); 2] = [
        (
            "xz -9",
            vec![
                "/usr/bin/xz".into(),
                "-9".into(),
                // Into stack-quality.input.xz, overwritten run after run: run_timed sends a
                // program's stdout to its stderr, which the bench reads as text.
                "-k".into(),
                "-f".into(),
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
    let fixed_cpu_s: Vec<f64> = UNWINDERS
        .iter()
        .map(|unwinder| unwinder.fixed_cpu_s(tools, work))
        .collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for (program, argv) in &programs {
        for (unwinder, &fixed_cpu_s) in UNWINDERS.iter().zip(&fixed_cpu_s) {
            let run = unwinder.record_and_report(tools, work, Path::new(&argv[0]), &argv[1..])?;
            // Ours' own report is the JSON report; perf's files go through our import.
            let report_json = if unwinder.perf {
                let report_json = work.join("stacks.json");
                measure::run(
                    &our_report(&tools.profiler, &unwinder.profile(work)),
                    Some(&report_json),
                )?;
                report_json
            } else {
                work.join(REPORT_OUTPUT)
            };
            let (samples, complete_percent, mean_depth) = user_stacks(&report_json, program)?;
            let tool_cpu_s = run.tool_cpu_s;
            let per_sample = |cpu_s: f64| 1e6 * cpu_s / samples.max(1) as f64;
            let row = StackQualityRow {
                program,
                unwinder: unwinder.name,
                record_command: run.record.command,
                samples,
                complete_percent,
                mean_depth,
                tool_cpu_us_per_sample: per_sample(tool_cpu_s),
                fixed_cpu_ms: 1e3 * fixed_cpu_s,
                beyond_fixed_us_per_sample: per_sample((tool_cpu_s - fixed_cpu_s).max(0.0)),
                report_command: run.report.command,
            };
            eprintln!(
                "xtask bench: stacks {:<8} {:<24} {:>6} samples, {:5.1}% complete, depth {:.1}, \
                 {:.0} us of tool CPU per sample ({:.0} ms fixed, {:.0} us a sample beyond it)",
                row.program,
                row.unwinder,
                row.samples,
                row.complete_percent,
                row.mean_depth,
                row.tool_cpu_us_per_sample,
                row.fixed_cpu_ms,
                row.beyond_fixed_us_per_sample,
            );
            rows.push(row);
        }
    }
    let _ = std::fs::remove_file(&input);
    let _ = std::fs::remove_file(work.join("stack-quality.input.xz"));
    Ok(rows)
}

/// One recording and the tool's own report of it.
struct Recorded {
    record: measure::Measured,
    report: measure::Measured,
    /// The tool's CPU time: recording (without the program's) and reporting.
    tool_cpu_s: f64,
}

impl Unwinder {
    /// The profile this unwinder's runs write (perf's in perf.data format).
    fn profile(&self, work: &Path) -> PathBuf {
        work.join(if self.perf {
            "stacks.perf.data"
        } else {
            "stacks.prof"
        })
    }

    /// CPU time of recording `true` and reporting it: the median of [`FIXED_COST_RUNS`].
    fn fixed_cpu_s(&self, tools: &Tools, work: &Path) -> Result<f64> {
        let runs = (0..FIXED_COST_RUNS)
            .map(|_| {
                self.record_and_report(tools, work, Path::new("/bin/true"), &[])
                    .map(|recorded| recorded.tool_cpu_s)
            })
            .collect::<Result<Vec<f64>>>()?;
        Ok(Spread::of(runs).map_or(0.0, |spread| spread.median))
    }

    /// Records `program` under `run_timed` into [`Unwinder::profile`] and reports it with the
    /// tool's own report: `perf report` (its default call-graph output, which unwinds the
    /// copied stacks) for perf, `report --json` for ours.
    fn record_and_report(
        &self,
        tools: &Tools,
        work: &Path,
        program: &Path,
        args: &[String],
    ) -> Result<Recorded> {
        let profile = self.profile(work);
        let _ = std::fs::remove_file(&profile);
        let mut record: Vec<String> = if self.perf {
            vec!["perf".into(), "record".into(), "-q".into()]
        } else {
            // The capture program's run time in the kernel.
            vec![path_arg(&tools.profiler), "record".into(), "--stats".into()]
        };
        record.extend(["-F".into(), RATE_HZ.into(), "-o".into(), path_arg(&profile)]);
        record.extend(self.options.iter().map(|option| option.to_string()));
        record.push("--".into());
        record.extend(tools.timed(program, args));
        let record = measure::run(&record, None)?;
        let program_cpu_s = record
            .workload
            .ok_or_else(|| anyhow!("run_timed printed no times under `{}`", record.command))?
            .cpu_s;
        let in_kernel_s = if self.perf {
            0.0
        } else {
            tools::ours_kernel_time_s(&record.stderr)?
        };
        let report: Vec<String> = if self.perf {
            ["perf", "report", "--stdio", "-i"]
                .map(String::from)
                .into_iter()
                .chain([path_arg(&profile)])
                .collect()
        } else {
            our_report(&tools.profiler, &profile)
        };
        let report = measure::run(&report, Some(&work.join(REPORT_OUTPUT)))?;
        let tool_cpu_s = (record.cpu_s - program_cpu_s).max(0.0) + in_kernel_s + report.cpu_s;
        Ok(Recorded {
            record,
            report,
            tool_cpu_s,
        })
    }
}

/// `profiler report -i PROFILE --json`: the JSON report on stdout.
fn our_report(profiler: &Path, profile: &Path) -> Vec<String> {
    vec![
        path_arg(profiler),
        "report".into(),
        "-i".into(),
        path_arg(profile),
        "--json".into(),
    ]
}

/// Samples, complete % and mean user depth in the JSON report `report_json` of our report,
/// whoever recorded the profile.
fn user_stacks(report_json: &Path, program: &str) -> Result<(u64, f64, f64)> {
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(report_json)
            .with_context(|| format!("reading {}", report_json.display()))?,
    )?;
    let stacks = &report["events"][0]["user_stacks"];
    let number = |key: &str| {
        stacks[key]
            .as_f64()
            .ok_or_else(|| anyhow!("no user_stacks.{key} in the report of {program}"))
    };
    Ok((
        number("samples")? as u64,
        number("complete_percent")?,
        number("mean_depth")?,
    ))
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
