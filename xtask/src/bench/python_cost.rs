//! What naming Python frames costs, beside py-spy: a fixed amount of pure-Python work (the
//! Python tests' split over two leaves and zlib) bare, under `record` and under `py-spy record`
//! at the same rate, in its default mode (which pauses the interpreter at each sample) and
//! `--nonblocking`. The interpreter is each tool's child, and times its work itself. The
//! figures: the workload's slowdown; the CPU each tool's run took beyond the bare run's (the
//! tool's processes plus whatever it made the interpreter spend: for ours, the BPF program runs
//! in the interpreter's time); per sample, that CPU over the samples the tool kept; and ours in
//! the kernel per sample, with the share of it that reading the Python frames took (the
//! walker's own clock, `--stats`), which is what a sample would cost without them. Each tool
//! also runs the workload with no work (the interpreter starts and exits): its CPU beyond the
//! bare such run is the tool's fixed cost (start-up, the report), and what the full run added
//! beyond it, over the samples, is its cost per sample alone.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde::Serialize;

use super::{
    measure,
    summary::Spread,
    tools::{ours_capture_cost, path_arg},
};

/// The rate every tool samples at, in Hz.
pub const RATE_HZ: u64 = 250;

/// Rounds of work of a full run: about 5 s here, so that the tools' start-up, a fixed cost, is
/// spread over some 1,250 samples.
pub const FULL_LOOPS: u32 = 2500;

/// The workload: `loops` rounds of the split, each a fixed amount of work, then its own elapsed
/// time on standard error.
const WORKLOAD: &str = r#"
import random, sys, time, zlib

DATA = bytes(range(256)) * 400

def alpha_hot(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

def beta_cold(n):
    total = 0
    for i in range(n):
        total ^= i
    return total

def squeeze():
    return zlib.compress(DATA, 9)

def main(loops):
    sizes = random.Random(47)
    for _ in range(loops):
        alpha_hot(sizes.randrange(30000, 90000))
        beta_cold(sizes.randrange(12500, 37500))
        squeeze()

start = time.monotonic_ns()
main(int(sys.argv[1]))
print(f"python_work elapsed_ns {time.monotonic_ns() - start}", file=sys.stderr)
"#;

/// One way of running the workload, over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct PythonCostRow {
    pub tool: &'static str,
    pub command: String,
    /// The workload's time for its work, as it measured itself.
    pub elapsed_s: Option<Spread>,
    /// CPU time of the whole run (tool and interpreter) beyond the bare run's median.
    pub added_cpu_s: Option<Spread>,
    /// The same of a run with no work: the tool's fixed cost.
    pub fixed_cpu_s: Option<Spread>,
    /// Samples the tool kept.
    pub samples: Option<Spread>,
    /// Ours: the BPF program's run time per sample, and the part of it spent reading the
    /// Python frames.
    pub kernel_ns_per_sample: Option<Spread>,
    pub python_ns_per_sample: Option<Spread>,
}

impl PythonCostRow {
    /// The median slowdown against `bare`, in percent.
    pub fn overhead_percent(&self, bare: &PythonCostRow) -> Option<f64> {
        let (ours, bare) = (self.elapsed_s?.median, bare.elapsed_s?.median);
        (bare > 0.0).then(|| 100.0 * (ours / bare - 1.0))
    }

    /// The added CPU per sample kept, in µs (medians).
    pub fn added_us_per_sample(&self) -> Option<f64> {
        let (cpu, samples) = (self.added_cpu_s?.median, self.samples?.median);
        (samples > 0.0).then(|| 1e6 * cpu / samples)
    }

    /// The added CPU beyond the fixed cost per sample kept, in µs (medians).
    pub fn per_sample_beyond_fixed_us(&self) -> Option<f64> {
        let cpu = self.added_cpu_s?.median - self.fixed_cpu_s?.median;
        let samples = self.samples?.median;
        (samples > 0.0).then(|| 1e6 * cpu / samples)
    }
}

/// What one run gave.
struct Ran {
    elapsed_s: f64,
    cpu_s: f64,
    /// The CPU time of the run with no work.
    empty_cpu_s: f64,
    samples: Option<f64>,
    kernel_ns: Option<f64>,
    python_ns: Option<f64>,
}

/// The workload bare, under `record` and under py-spy (both modes), interleaved `rounds`
/// times; `loops` rounds of work each (about 2 ms a round here).
pub fn measure(
    profiler: &Path,
    py_spy: &Path,
    work: &Path,
    (rounds, loops): (u32, u32),
) -> Result<Vec<PythonCostRow>> {
    let script = work.join("python_work.py");
    std::fs::write(&script, WORKLOAD).context("writing the Python workload")?;
    let workload = |loops: u32| -> Vec<String> {
        [
            "/usr/bin/python3".into(),
            path_arg(&script),
            loops.to_string(),
        ]
        .to_vec()
    };
    let profile = path_arg(&work.join("python-cost.prof"));
    let raw = work.join("python-cost.py-spy.txt");
    let rate = RATE_HZ.to_string();
    let record = |loops: u32| -> Vec<String> {
        [path_arg(profiler), "record".into(), "--stats".into()]
            .into_iter()
            .chain(["-F".into(), rate.clone(), "-o".into(), profile.clone()])
            .chain(["--".into()])
            .chain(workload(loops))
            .collect()
    };
    let spy = |extra: &[&str], loops: u32| -> Vec<String> {
        [path_arg(py_spy), "record".into()]
            .into_iter()
            .chain(extra.iter().map(|arg| arg.to_string()))
            .chain([
                "--rate".into(),
                rate.clone(),
                "--format".into(),
                "raw".into(),
            ])
            .chain(["--output".into(), path_arg(&raw), "--".into()])
            .chain(workload(loops))
            .collect()
    };
    // Each tool's command with the work, and with none.
    let tools: [(&'static str, [Vec<String>; 2]); 4] = [
        ("bare", [workload(loops), workload(0)]),
        ("profiler record", [record(loops), record(0)]),
        ("py-spy record", [spy(&[], loops), spy(&[], 0)]),
        (
            "py-spy record --nonblocking",
            [spy(&["--nonblocking"], loops), spy(&["--nonblocking"], 0)],
        ),
    ];
    let mut ran: Vec<Vec<Ran>> = tools.iter().map(|_| Vec::new()).collect();
    let mut commands = vec![String::new(); tools.len()];
    for round in 1..=rounds {
        for (i, (tool, [argv, empty])) in tools.iter().enumerate() {
            let _ = std::fs::remove_file(&raw);
            let empty_cpu_s = measure::run(empty, None)?.cpu_s;
            let _ = std::fs::remove_file(&raw);
            let run = measure::run(argv, None)?;
            let elapsed_s = elapsed_s(&run.stderr)
                .with_context(|| format!("{tool}: the workload's elapsed time"))?;
            let (samples, kernel_ns, python_ns) = match i {
                0 => (None, None, None),
                1 => {
                    let cost = ours_capture_cost(&run.stderr)?;
                    let python = python_ns_per_stack(&run.stderr)?;
                    (
                        Some(cost.program_runs as f64),
                        Some(cost.ns_per_sample),
                        Some(python),
                    )
                }
                _ => (Some(py_spy_samples(&raw)?), None, None),
            };
            eprintln!(
                "xtask bench: round {round}/{rounds} python_work under {tool:<28} {elapsed_s:.3}s"
            );
            ran[i].push(Ran {
                elapsed_s,
                cpu_s: run.cpu_s,
                empty_cpu_s,
                samples,
                kernel_ns,
                python_ns,
            });
            commands[i] = run.command;
        }
    }
    let _ = std::fs::remove_file(work.join("python-cost.prof"));
    let _ = std::fs::remove_file(&raw);
    let bare_cpu =
        Spread::of(ran[0].iter().map(|run| run.cpu_s)).map_or(0.0, |spread| spread.median);
    let bare_empty_cpu =
        Spread::of(ran[0].iter().map(|run| run.empty_cpu_s)).map_or(0.0, |spread| spread.median);
    Ok(tools
        .iter()
        .zip(ran.iter().zip(commands))
        .map(|((tool, _), (runs, command))| PythonCostRow {
            tool,
            command,
            elapsed_s: Spread::of(runs.iter().map(|run| run.elapsed_s)),
            added_cpu_s: Spread::of(runs.iter().map(|run| run.cpu_s - bare_cpu)),
            fixed_cpu_s: Spread::of(runs.iter().map(|run| run.empty_cpu_s - bare_empty_cpu)),
            samples: Spread::of(runs.iter().filter_map(|run| run.samples)),
            kernel_ns_per_sample: Spread::of(runs.iter().filter_map(|run| run.kernel_ns)),
            python_ns_per_sample: Spread::of(runs.iter().filter_map(|run| run.python_ns)),
        })
        .collect())
}

/// The workload's `python_work elapsed_ns N` line.
fn elapsed_s(stderr: &str) -> Result<f64> {
    let ns: f64 = stderr
        .lines()
        .find_map(|line| line.strip_prefix("python_work elapsed_ns "))
        .and_then(|ns| ns.trim().parse().ok())
        .ok_or_else(|| anyhow!("no `python_work elapsed_ns N` line in its output"))?;
    Ok(ns / 1e9)
}

/// `python: ... N ns a stack reading them` from `record --stats`.
fn python_ns_per_stack(stderr: &str) -> Result<f64> {
    stderr
        .lines()
        .find_map(|line| {
            let after = line.trim().strip_prefix("python: ")?;
            let (before, _) = after.split_once(" ns a stack reading them")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .ok_or_else(|| {
            anyhow!("`record --stats` printed no `python: ... N ns a stack reading them` line")
        })
}

/// Samples in py-spy's raw output file.
fn py_spy_samples(raw: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(raw)
        .with_context(|| format!("reading py-spy's output {}", raw.display()))?;
    Ok(folded_samples(&text))
}

/// Samples in folded stacks, each line ending in its count.
fn folded_samples(text: &str) -> f64 {
    text.lines()
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum::<u64>() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_are_read_from_the_workload_our_stats_and_py_spy() {
        let stderr = "x\npython_work elapsed_ns 2500000000\nrun_timed: y";
        assert_eq!(elapsed_s(stderr).unwrap(), 2.5);
        assert!(elapsed_s("nothing").is_err());
        let stats =
            "  python: 202 stacks with their Python frames (1 cut short of the outermost), \
                     2077 ns a stack reading them; 0 of threads";
        assert_eq!(python_ns_per_stack(stats).unwrap(), 2077.0);
        assert!(python_ns_per_stack("python: none").is_err());
        let raw = "<module> (a.py:1);f (a.py:2) 40
<module> (a.py:1) 2
";
        assert_eq!(folded_samples(raw), 42.0);
    }

    #[test]
    fn the_cost_per_sample_is_the_added_cpu_over_the_samples() {
        let row = PythonCostRow {
            tool: "x",
            command: String::new(),
            elapsed_s: Spread::of([2.0]),
            added_cpu_s: Spread::of([0.5]),
            fixed_cpu_s: Spread::of([0.1]),
            samples: Spread::of([1000.0]),
            kernel_ns_per_sample: None,
            python_ns_per_sample: None,
        };
        assert_eq!(row.added_us_per_sample(), Some(500.0));
        assert_eq!(
            row.per_sample_beyond_fixed_us().map(f64::round),
            Some(400.0)
        );
        let bare = PythonCostRow {
            elapsed_s: Spread::of([1.6]),
            ..row.clone()
        };
        assert_eq!(row.overhead_percent(&bare).map(f64::round), Some(25.0));
    }
}
