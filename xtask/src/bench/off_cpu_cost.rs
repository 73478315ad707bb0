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

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{anyhow, Context, Result};
use serde::Serialize;

use super::{measure, summary::Spread, tools::path_arg};

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
            let (run, programs) = with_program_time(|| measure::run(argv, None))?;
            if let Some(ns) = programs.ns_per_switch() {
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

/// The kernel's BPF run-time statistics, on while this lives (`kernel.bpf_stats_enabled`).
struct BpfStatistics {
    was: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStatistics {
    fn enable() -> Result<BpfStatistics> {
        let was =
            std::fs::read_to_string(BPF_STATS).with_context(|| format!("reading {BPF_STATS}"))?;
        std::fs::write(BPF_STATS, "1").with_context(|| format!("enabling {BPF_STATS}"))?;
        Ok(BpfStatistics { was })
    }
}

impl Drop for BpfStatistics {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, self.was.trim());
    }
}

/// Run counts and times of the BPF programs a run loaded, by program id: the last values seen
/// while they were loaded.
#[derive(Debug, Default)]
struct ProgramTime {
    programs: BTreeMap<u64, ProgramRuns>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct ProgramRuns {
    runs: u64,
    run_time_ns: u64,
}

impl ProgramTime {
    /// Run time of all the programs per run of the busiest, the one on every context switch
    /// (a tool's switch programs all run per switch; tail calls count in their caller).
    fn ns_per_switch(&self) -> Option<f64> {
        let switches = self.programs.values().map(|p| p.runs).max()?;
        let time: u64 = self.programs.values().map(|p| p.run_time_ns).sum();
        (switches > 0).then(|| time as f64 / switches as f64)
    }
}

/// The loaded BPF programs' runs, from `bpftool prog show --json`.
fn loaded_programs() -> Result<BTreeMap<u64, ProgramRuns>> {
    let output = std::process::Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .context("running bpftool (cargo xtask setup installs it)")?;
    parse_programs(&String::from_utf8_lossy(&output.stdout))
}

/// The programs of the list but those on perf events: `record --off-cpu` also samples the
/// CPU, which the references do not.
fn parse_programs(json: &str) -> Result<BTreeMap<u64, ProgramRuns>> {
    let programs: Vec<serde_json::Value> =
        serde_json::from_str(json).context("bpftool's program list is not JSON")?;
    Ok(programs
        .iter()
        .filter(|program| program["type"] != "perf_event")
        .filter_map(|program| {
            let runs = ProgramRuns {
                runs: program["run_cnt"].as_u64().unwrap_or(0),
                run_time_ns: program["run_time_ns"].as_u64().unwrap_or(0),
            };
            Some((program["id"].as_u64()?, runs))
        })
        .collect())
}

/// Runs `run`, polling the programs loaded meanwhile: those the run's tool loaded.
fn with_program_time<T>(run: impl FnOnce() -> Result<T>) -> Result<(T, ProgramTime)> {
    let before: BTreeSet<u64> = loaded_programs()?.into_keys().collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let poller = scope.spawn(|| {
            let mut seen = ProgramTime::default();
            while !done.load(Ordering::Relaxed) {
                for (id, runs) in loaded_programs().unwrap_or_default() {
                    if !before.contains(&id) {
                        seen.programs.insert(id, runs);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        });
        let result = run();
        done.store(true, Ordering::Relaxed);
        let seen = poller.join().expect("the poller does not panic");
        result.map(|value| (value, seen))
    })
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
    fn program_time_is_per_run_of_the_switch_program() {
        let programs = parse_programs(
            r#"[{"id":7,"name":"offcpu_switch","run_time_ns":3000,"run_cnt":10},
                {"id":8,"name":"offcpu_fork","run_time_ns":500,"run_cnt":2},
                {"id":9,"name":"other"},
                {"id":10,"type":"perf_event","name":"on_overflow","run_cnt":99}]"#,
        )
        .unwrap();
        assert_eq!(
            programs[&9],
            ProgramRuns {
                runs: 0,
                run_time_ns: 0
            }
        );
        let time = ProgramTime { programs };
        assert_eq!(time.ns_per_switch(), Some(350.0));
        assert_eq!(ProgramTime::default().ns_per_switch(), None);
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
