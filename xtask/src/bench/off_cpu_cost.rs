//! What watching every context switch costs: the tests' `switch_storm` workload (pipe
//! ping-pong between two threads, then a thread pool on a condition variable) bare, under
//! `record --off-cpu`, and under two bpftrace references: the one the off-CPU tests compare
//! against (`tests/reference/offcputime.bt`, kernel stacks), and the same with user stacks
//! (`offcputime-user.bt`), which is what bcc's `offcputime` and `record --off-cpu` keep. Each
//! run goes through `run_timed`, whose child the workload is under every tool, pinned to one
//! CPU (`taskset -c 0`): unpinned, where the two ping-pong threads land decides more than what
//! runs on each switch (the elapsed time swung by tens of percent), and a switch to or from the
//! idle task, which no tool records, costs little, so tools whose runs saw different mixes of
//! switches could not be compared per switch. Pinned, every switch is one of the workload's
//! threads leaving the CPU to another. The slowdown is the workload's own elapsed time for its
//! switches against the bare runs', and its CPU time; the tools' own cost is also read exactly:
//! the run time of the BPF programs each tool loaded (the kernel's BPF statistics, polled while
//! the run lasts) per sched_switch they saw. Ours runs twice: with its default DWARF user
//! stacks, and with frame-pointer user stacks (`--unwind fp`), the reference's own work.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde::Serialize;

use super::{
    bpf_stats::{with_program_time, BpfStatistics, Programs},
    measure,
    summary::Spread,
    tools::path_arg,
};

/// Round trips of the ping-pong and jobs of the pool, each about two switches.
const ROUND_TRIPS: &str = "20000";
const JOBS: &str = "20000";

/// One way of running the workload, over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct OffCpuCostRow {
    pub tool: &'static str,
    pub command: String,
    /// The workload's time for its switches, as it measured itself.
    pub elapsed_s: Option<Spread>,
    /// CPU time of the workload's process tree.
    pub workload_cpu_s: Option<Spread>,
    /// Run time of the tool's BPF programs per context switch they saw, in ns.
    pub ns_per_switch: Option<Spread>,
}

impl OffCpuCostRow {
    /// The median slowdown against `bare`, in percent.
    pub fn overhead_percent(&self, bare: &OffCpuCostRow) -> Option<f64> {
        let (ours, bare) = (self.elapsed_s?.median, bare.elapsed_s?.median);
        (bare > 0.0).then(|| 100.0 * (ours / bare - 1.0))
    }
}

/// The workload bare, under `record --off-cpu` and under bpftrace, interleaved `rounds` times.
pub fn measure(
    profiler: &Path,
    release: &Path,
    work: &Path,
    rounds: u32,
) -> Result<Vec<OffCpuCostRow>> {
    mount_tracefs()?;
    let run_timed = path_arg(&release.join("run_timed"));
    let workload = [
        run_timed.clone(),
        "taskset".into(),
        "-c".into(),
        "0".into(),
        path_arg(&release.join("switch_storm")),
        ROUND_TRIPS.to_string(),
        JOBS.to_string(),
    ];
    let references = crate::workspace_root().join("tests/reference");
    let profile = path_arg(&work.join("off-cpu-cost.prof"));
    let printed = path_arg(&work.join("off-cpu-cost.bpftrace.txt"));
    let bpftrace = |program: &str| -> Vec<String> {
        [
            "bpftrace".into(),
            "-o".into(),
            printed.clone(),
            "-c".into(),
            measure::command_line(&workload),
            path_arg(&references.join(program)),
        ]
        .to_vec()
    };
    let record = |options: &[&str]| -> Vec<String> {
        [path_arg(profiler), "record".into(), "--off-cpu".into()]
            .into_iter()
            .chain(options.iter().map(|option| option.to_string()))
            .chain(["-o".into(), profile.clone(), "--".into()])
            .chain(workload.iter().cloned())
            .collect()
    };
    let tools: [(&'static str, Vec<String>); 5] = [
        ("bare", workload.to_vec()),
        ("profiler record --off-cpu", record(&[])),
        (
            "profiler record --off-cpu --unwind fp",
            record(&["--unwind", "fp"]),
        ),
        ("bpftrace offcputime.bt", bpftrace("offcputime.bt")),
        (
            "bpftrace offcputime-user.bt",
            bpftrace("offcputime-user.bt"),
        ),
    ];
    let _statistics = BpfStatistics::enable()?;
    let mut elapsed: Vec<Vec<f64>> = vec![Vec::new(); tools.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); tools.len()];
    let mut per_switch: Vec<Vec<f64>> = vec![Vec::new(); tools.len()];
    let mut commands = vec![String::new(); tools.len()];
    for round in 1..=rounds {
        for (i, (tool, argv)) in tools.iter().enumerate() {
            let (run, programs) =
                with_program_time(Programs::NotOnPerfEvents, || measure::run(argv, None))?;
            if let Some(ns) = programs.ns_per_run() {
                per_switch[i].push(ns);
            }
            let seconds = elapsed_s(&run.stderr)
                .with_context(|| format!("{tool}: the workload's elapsed time"))?;
            eprintln!(
                "xtask bench: round {round}/{rounds} switch_storm under {tool:<26} {seconds:.3}s"
            );
            elapsed[i].push(seconds);
            if let Some(workload) = run.workload {
                cpu[i].push(workload.cpu_s);
            }
            commands[i] = run.command;
        }
    }
    let _ = std::fs::remove_file(work.join("off-cpu-cost.prof"));
    let _ = std::fs::remove_file(work.join("off-cpu-cost.bpftrace.txt"));
    Ok(tools
        .iter()
        .zip(elapsed.into_iter().zip(cpu).zip(per_switch).zip(commands))
        .map(
            |((tool, _), (((elapsed, cpu), per_switch), command))| OffCpuCostRow {
                tool,
                command,
                elapsed_s: Spread::of(elapsed),
                workload_cpu_s: Spread::of(cpu),
                ns_per_switch: Spread::of(per_switch),
            },
        )
        .collect())
}

/// The workload's `switch_storm ... elapsed_ns N` line (its standard output, which `run_timed`
/// sends to standard error).
fn elapsed_s(stderr: &str) -> Result<f64> {
    let line = stderr
        .lines()
        .find(|line| line.starts_with("switch_storm "))
        .ok_or_else(|| anyhow!("no `switch_storm` line in its output"))?;
    let ns: f64 = line
        .rsplit_once("elapsed_ns ")
        .and_then(|(_, ns)| ns.trim().parse().ok())
        .ok_or_else(|| anyhow!("no elapsed time in {line:?}"))?;
    Ok(ns / 1e9)
}

/// Mounts tracefs where bpftrace reads the tracepoints' formats, unless it is there: a fresh
/// machine boots without it, and the references need `sched:sched_switch`.
fn mount_tracefs() -> Result<()> {
    if Path::new("/sys/kernel/tracing/events").exists() {
        return Ok(());
    }
    crate::run_command(std::process::Command::new("mount").args([
        "-t",
        "tracefs",
        "tracefs",
        "/sys/kernel/tracing",
    ]))
    .context("mounting tracefs at /sys/kernel/tracing for the bpftrace references")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_reports_its_elapsed_time() {
        let stderr = "noise\nswitch_storm round_trips 2 jobs 3 elapsed_ns 1500000000\nrun_timed: x";
        assert_eq!(elapsed_s(stderr).unwrap(), 1.5);
        assert!(elapsed_s("nothing").is_err());
    }

    #[test]
    fn the_overhead_is_the_slowdown_of_the_medians() {
        let row = |seconds: &[f64]| OffCpuCostRow {
            tool: "x",
            command: String::new(),
            elapsed_s: Spread::of(seconds.iter().copied()),
            workload_cpu_s: None,
            ns_per_switch: None,
        };
        let bare = row(&[1.0, 2.0, 1.0]);
        assert_eq!(row(&[1.5]).overhead_percent(&bare), Some(50.0));
        assert_eq!(row(&[]).overhead_percent(&bare), None);
    }
}
