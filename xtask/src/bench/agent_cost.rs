//! What always-on, system-wide profiling costs: `profiler agent` against `perf record -a -g`
//! over the same time, at the fleet profilers' rate (99 Hz) and at 997 Hz, while a churn load
//! runs (a CPU loop and a stream of short processes, which is what makes a system-wide
//! profiler's side-band and symbolization work). Each tool's CPU time and peak RSS come from
//! wait4 on its own process tree; the load is not part of it. The steady share of a core is
//! read from /proc during the run, over whole windows past the first. Beside them, a recording
//! of the same time (`record -a --duration`, with its report), whose wall time says how long its
//! end takes on a busy machine. And what the churn costs in the kernel: each sampler's BPF run
//! time per sample with the CPU loop alone and with the short processes beside it, ours and a
//! bpftrace reference that keeps the same stacks per thread.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use serde::Serialize;

use super::{
    bpf_stats::{loaded_programs, loaded_since, BpfStatistics, Programs},
    measure,
    summary::Spread,
    tools::path_arg,
};

/// One tool at one rate.
#[derive(Clone, Debug, Serialize)]
pub struct AgentCostRow {
    pub tool: &'static str,
    pub rate_hz: u64,
    pub duration_s: u64,
    pub command: String,
    pub wall_s: f64,
    pub cpu_s: f64,
    /// CPU time as a share of one core over the run.
    pub cpu_percent_of_core: f64,
    /// The share of one core over whole windows past the first ([`steady_span`]): what running
    /// on costs, exports included,
    /// without start-up (loading programs, reading every process) or the last export.
    pub steady_percent_of_core: f64,
    pub max_rss_mib: f64,
}

/// The rate of the recording measured beside the agent: `record`'s default.
const RECORD_RATE_HZ: u64 = 997;
/// How far past its duration `record -a --duration` may end (issue 16: 30 s in 31 s).
pub const RECORD_END_BUDGET_S: f64 = 1.0;

/// The agent's budget at 99 Hz (issue 16): 0.5% of one core and 40 MB.
pub const BUDGET_CPU_PERCENT_AT_99HZ: f64 = 0.5;
pub const BUDGET_RSS_MIB_AT_99HZ: f64 = 40.0;
/// How much more a sample may cost in the kernel with the short processes beside the CPU loop
/// than with the loop alone (issue 16).
pub const BUDGET_CHURN_RISE_PERCENT: f64 = 20.0;

/// The kernel's cost per sample of one sampler at 997 Hz, without and with churn.
#[derive(Clone, Debug, Serialize)]
pub struct ChurnCostRow {
    pub tool: &'static str,
    pub command: String,
    /// BPF run time per sample with the CPU loop alone, ns, over the rounds.
    pub loop_ns_per_sample: Option<Spread>,
    /// The same with the short processes beside the loop.
    pub churn_ns_per_sample: Option<Spread>,
}

impl ChurnCostRow {
    /// How much more a sample costs under churn, in percent of its cost without (medians).
    pub fn rise_percent(&self) -> Option<f64> {
        let (alone, churn) = (
            self.loop_ns_per_sample?.median,
            self.churn_ns_per_sample?.median,
        );
        (alone > 0.0).then(|| 100.0 * (churn / alone - 1.0))
    }
}

/// What runs beside the tools.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// The CPU loop alone.
    CpuLoop,
    /// The CPU loop and a stream of short processes.
    Churn,
    /// A CPU loop on every CPU and the stream of short processes: a busy host under churn.
    SaturatedChurn,
}

/// The load running, each part a shell loop that restarts its workload until dropped.
pub struct RunningLoad {
    children: Vec<Child>,
}

impl RunningLoad {
    pub fn start(release: &Path, load: Load) -> Result<RunningLoad> {
        let spawn = |program: &str, args: &[&str]| -> Result<Child> {
            let path = release.join(program);
            Command::new("/bin/sh")
                .arg("-c")
                .arg(format!(
                    "while :; do {} {} >/dev/null 2>&1; done",
                    path_arg(&path),
                    args.join(" ")
                ))
                .stdin(Stdio::null())
                .spawn()
                .with_context(|| format!("starting the churn load ({program})"))
        };
        let loops = match load {
            Load::SaturatedChurn => std::thread::available_parallelism().map_or(1, |n| n.get()),
            Load::CpuLoop | Load::Churn => 1,
        };
        let mut children = (0..loops)
            .map(|_| spawn("cpu_split", &["4000"]))
            .collect::<Result<Vec<Child>>>()?;
        if load != Load::CpuLoop {
            children.push(spawn("short_processes", &["200"])?);
        }
        Ok(RunningLoad { children })
    }
}

impl Drop for RunningLoad {
    fn drop(&mut self) {
        for child in &mut self.children {
            // The shell loop and the workload it runs: kill the loop, the workload ends soon.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Both tools at both rates, and the recording, `duration_s` each, under the churn load.
pub fn measure(
    profiler: &Path,
    release: &Path,
    work: &Path,
    duration_s: u64,
) -> Result<Vec<AgentCostRow>> {
    let _load = RunningLoad::start(release, Load::Churn)?;
    let windows = work.join("agent-windows");
    let perf_data = work.join("agent-cost.perf.data");
    let recording = work.join("record-cost.profile");
    let duration = duration_s.to_string();
    let mut rows = Vec::new();
    for rate_hz in [99u64, 997] {
        let rate = rate_hz.to_string();
        let _ = std::fs::remove_dir_all(&windows);
        std::fs::create_dir_all(&windows)
            .with_context(|| format!("creating {}", windows.display()))?;
        let agent = agent_argv(profiler, rate_hz, duration_s, &windows);
        let perf: Vec<String> = [
            "perf",
            "record",
            "-q",
            // No build-id collection at the end: with thousands of short processes Debian's
            // perf 6.1 aborts there (an assertion in util/build-id.c, then a buffer overflow).
            // It also spares perf that work, which favours perf.
            "-B",
            "-N",
            "-F",
            &rate,
            "-a",
            "-g",
            "-o",
            &path_arg(&perf_data),
            "--",
            "sleep",
            &duration,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut tools = vec![("profiler agent", agent), ("perf record -a -g", perf)];
        if rate_hz == RECORD_RATE_HZ {
            let record = [
                &path_arg(profiler),
                "record",
                "-a",
                "-F",
                &rate,
                "--duration",
                &duration,
                "-o",
                &path_arg(&recording),
            ];
            tools.push((
                "profiler record -a",
                record.iter().map(|s| s.to_string()).collect(),
            ));
        }
        for (tool, argv) in tools {
            rows.push(run(tool, rate_hz, duration_s, &argv)?);
        }
    }
    let _ = std::fs::remove_dir_all(&windows);
    let _ = std::fs::remove_file(&perf_data);
    let _ = std::fs::remove_file(&recording);
    Ok(rows)
}

/// `profiler agent` system-wide at `rate_hz` for `duration_s` seconds, writing its windows into
/// `windows`. `timeout` sends SIGTERM after the duration; --preserve-status keeps the agent's own
/// exit status, so a failed agent fails the bench.
fn agent_argv(profiler: &Path, rate_hz: u64, duration_s: u64, windows: &Path) -> Vec<String> {
    [
        "timeout",
        "--preserve-status",
        "-s",
        "TERM",
        &duration_s.to_string(),
        &path_arg(profiler),
        "agent",
        "-F",
        &rate_hz.to_string(),
        "--output-dir",
        &path_arg(windows),
        "--log-level",
        "warn",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The agent's peak RSS at its defaults (99 Hz) while big runtimes run: issue 46's load.
#[derive(Clone, Debug, Serialize)]
pub struct RuntimesMemory {
    /// The runtimes that ran (one missing from the machine is left out, and said).
    pub runtimes: Vec<&'static str>,
    pub duration_s: u64,
    pub command: String,
    pub max_rss_mib: f64,
    pub cpu_s: f64,
}

/// Issue 46's ceiling on the agent's peak RSS at its defaults with this load.
pub const BUDGET_RSS_MIB_WITH_RUNTIMES: f64 = 64.0;

/// The fleet agents' memory as they publish it, as issue 46 cites them (MB).
pub const FLEET_AGENT_BUDGETS: [(&str, f64); 2] = [
    ("OpenTelemetry eBPF profiler", 250.0),
    ("lightswitch", 500.0),
];

/// A JVM that keeps one core busy for the given milliseconds (run as a single-file source).
const SPIN_JAVA: &str = "public class Spin { public static void main(String[] a) { long s = 0; \
     long end = System.currentTimeMillis() + Long.parseLong(a[0]); \
     while (System.currentTimeMillis() < end) { for (int i = 0; i < 100000; i++) s += i * 31 ^ s; } \
     System.out.println(s); } }";

/// The runtimes, each busy for longer than the agent runs; killed when dropped.
pub struct Runtimes {
    children: Vec<Child>,
    names: Vec<&'static str>,
}

impl Runtimes {
    pub fn start(work: &Path, busy_s: u64) -> Result<(Runtimes, Vec<String>)> {
        let spin = work.join("Spin.java");
        std::fs::write(&spin, SPIN_JAVA).with_context(|| format!("writing {}", spin.display()))?;
        let ms = (busy_s * 1000).to_string();
        let node = format!(
            "const end = Date.now() + {ms}; let s = 0; \
             while (Date.now() < end) {{ for (let i = 0; i < 1e5; i++) s += Math.sqrt(i); }}"
        );
        let python = format!(
            "import time\nend = time.time() + {busy_s}\ns = 0\n\
             while time.time() < end:\n    s += sum(i * i for i in range(1000))\n"
        );
        let urandom = || std::fs::File::open("/dev/urandom").map(Stdio::from);
        let runtimes: [(&'static str, Command); 4] = [
            ("java", {
                let mut java = Command::new("java");
                java.arg(&spin).arg(&ms);
                java
            }),
            ("node", {
                let mut command = Command::new("node");
                command.args(["-e", &node]);
                command
            }),
            ("python3", {
                let mut command = Command::new("python3");
                command.args(["-c", &python]);
                command
            }),
            ("xz", {
                let mut command = Command::new("xz");
                command.args(["-9", "-T1"]).stdin(urandom()?);
                command
            }),
        ];
        let mut started = Runtimes {
            children: Vec::new(),
            names: Vec::new(),
        };
        let mut missing = Vec::new();
        for (name, mut command) in runtimes {
            match command.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
                Ok(child) => {
                    started.children.push(child);
                    started.names.push(name);
                }
                Err(error) => missing.push(format!("{name} did not start ({error}): left out")),
            }
        }
        Ok((started, missing))
    }
}

impl Drop for Runtimes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The agent at its defaults for `duration_s` seconds while a JVM, node, python3 and xz run
/// (started two seconds before it, so that it meets them running): its peak RSS from wait4.
/// Also what was left out, for the bench's notes.
pub fn measure_runtimes_memory(
    profiler: &Path,
    work: &Path,
    duration_s: u64,
) -> Result<(RuntimesMemory, Vec<String>)> {
    let (runtimes, missing) = Runtimes::start(work, duration_s + 5)?;
    std::thread::sleep(Duration::from_secs(2));
    let windows = work.join("runtimes-windows");
    let _ = std::fs::remove_dir_all(&windows);
    std::fs::create_dir_all(&windows).with_context(|| format!("creating {}", windows.display()))?;
    let argv = agent_argv(profiler, 99, duration_s, &windows);
    let measured = measure::run(&argv, None);
    let names = runtimes.names.clone();
    drop(runtimes);
    let _ = std::fs::remove_dir_all(&windows);
    let measured = measured?;
    Ok((
        RuntimesMemory {
            runtimes: names,
            duration_s,
            command: measured.command,
            max_rss_mib: measured.max_rss_kib as f64 / 1024.0,
            cpu_s: measured.cpu_s,
        },
        missing,
    ))
}

/// The agent's default window: it closes and exports one every 10 s.
const WINDOW_S: u64 = 10;
/// Past the start-up (loading programs, reading every process) and the first window's close
/// and export, which reads every sampled binary's symbols for the first time.
const STEADY_FROM_S: u64 = WINDOW_S + 2;
/// The shortest run with a steady part: one whole window past the first, and a second to spare
/// before the run's end (its last, partial export).
pub const SHORTEST_RUN_S: u64 = STEADY_FROM_S + WINDOW_S + 1;

/// The steady part of a run of `duration_s` seconds: whole windows from [`STEADY_FROM_S`], as
/// many as end a second before the run does. Each window in it is closed and exported once in
/// it, as in a run of any length; a part that ended where the run does not would hold a share
/// of the exports that depends on the run's length (a 10 s run, none).
pub fn steady_span(duration_s: u64) -> (Duration, Duration) {
    let windows = (duration_s.saturating_sub(STEADY_FROM_S + 1) / WINDOW_S).max(1);
    (
        Duration::from_secs(STEADY_FROM_S),
        Duration::from_secs(STEADY_FROM_S + windows * WINDOW_S),
    )
}

/// Where a sampler's cost per sample is read: from 40% of the run to its last second, past the
/// start-up; what the agent does between windows does not change what its programs cost.
fn sampling_span(duration_s: u64) -> (Duration, Duration) {
    (
        Duration::from_secs_f64(duration_s as f64 * 0.4),
        Duration::from_secs(duration_s.saturating_sub(1)),
    )
}

/// One tool's run of `duration_s` seconds, with its steady share of a core.
fn run(tool: &'static str, rate_hz: u64, duration_s: u64, argv: &[String]) -> Result<AgentCostRow> {
    let (steady_from, steady_to) = steady_span(duration_s);
    let (measured, cpu_at) =
        measure::run_with_checkpoints(argv, None, &[steady_from, steady_to], measure::tree_cpu_s)?;
    let steady_s = (steady_to - steady_from).as_secs_f64();
    Ok(AgentCostRow {
        tool,
        rate_hz,
        duration_s,
        command: measured.command,
        wall_s: measured.wall_s,
        cpu_s: measured.cpu_s,
        cpu_percent_of_core: 100.0 * measured.cpu_s / duration_s as f64,
        steady_percent_of_core: 100.0 * (cpu_at[1] - cpu_at[0]) / steady_s,
        max_rss_mib: measured.max_rss_kib as f64 / 1024.0,
    })
}

/// The rate of the churn-cost runs: the 997 Hz, where a sampler's own cost shows.
const CHURN_COST_RATE_HZ: u64 = 997;
/// The reference: bpftrace's plainest sampler that keeps what ours keeps, kernel and user
/// stacks per thread, in a map keyed by them (as ours keys its counts).
fn reference_sampler() -> String {
    format!("profile:hz:{CHURN_COST_RATE_HZ} {{ @[kstack, ustack, pid, tid] = count(); }}")
}

/// Each sampler's BPF run time per sample over the sampling span of `duration_s`-second runs, with
/// the CPU loop alone and with the churn load, `rounds` times, the loads and tools interleaved.
pub fn measure_churn_cost(
    profiler: &Path,
    release: &Path,
    work: &Path,
    duration_s: u64,
    rounds: u32,
) -> Result<Vec<ChurnCostRow>> {
    let _statistics = BpfStatistics::enable()?;
    let windows = work.join("churn-cost-windows");
    let bpftrace: Vec<String> = [
        "timeout",
        "--preserve-status",
        "-s",
        "INT",
        &duration_s.to_string(),
        "bpftrace",
        "-e",
        &reference_sampler(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let tools: [(&'static str, Vec<String>); 2] = [
        (
            "profiler agent",
            agent_argv(profiler, CHURN_COST_RATE_HZ, duration_s, &windows),
        ),
        ("bpftrace @[kstack, ustack, pid, tid]", bpftrace),
    ];
    // ns per sample by tool, then load (the loop alone, churn).
    let mut per_sample = vec![[Vec::new(), Vec::new()]; tools.len()];
    for round in 1..=rounds {
        for (at, load) in [Load::CpuLoop, Load::Churn].into_iter().enumerate() {
            let _load = RunningLoad::start(release, load)?;
            for (tool, (name, argv)) in tools.iter().enumerate() {
                let _ = std::fs::remove_dir_all(&windows);
                std::fs::create_dir_all(&windows)
                    .with_context(|| format!("creating {}", windows.display()))?;
                let ns = steady_ns_per_sample(argv, duration_s)?;
                eprintln!(
                    "xtask bench: round {round}/{rounds} {name} with {load:?}: {ns:.0} ns a sample"
                );
                per_sample[tool][at].push(ns);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&windows);
    Ok(tools
        .into_iter()
        .zip(per_sample)
        .map(|((tool, argv), [alone, churn])| ChurnCostRow {
            tool,
            command: measure::command_line(&argv),
            loop_ns_per_sample: Spread::of(alone),
            churn_ns_per_sample: Spread::of(churn),
        })
        .collect())
}

/// BPF run time per run of the sampling programs `argv` loads, over its sampling span.
fn steady_ns_per_sample(argv: &[String], duration_s: u64) -> Result<f64> {
    let before: BTreeSet<u64> = loaded_programs(Programs::OnPerfEvents)?
        .programs
        .into_keys()
        .collect();
    let (from, to) = sampling_span(duration_s);
    let (measured, readings) = measure::run_with_checkpoints(argv, None, &[from, to], move |_| {
        loaded_since(&before, Programs::OnPerfEvents)
    })?;
    let [first, last]: [Result<_>; 2] = readings
        .try_into()
        .map_err(|_| anyhow!("two readings were asked for"))?;
    last?.since(&first?).ns_per_run().ok_or_else(|| {
        anyhow!(
            "`{}`: no sampling program of it ran between {from:?} and {to:?}",
            measured.command
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_part_is_whole_windows_past_the_first() {
        let seconds = |(from, to): (Duration, Duration)| (from.as_secs(), to.as_secs());
        assert_eq!(seconds(steady_span(SHORTEST_RUN_S)), (12, 22));
        assert_eq!(seconds(steady_span(30)), (12, 22));
        assert_eq!(seconds(steady_span(33)), (12, 32));
        assert_eq!(seconds(sampling_span(10)), (4, 9));
    }

    #[test]
    fn the_rise_under_churn_is_between_the_medians() {
        let row = |alone: &[f64], churn: &[f64]| ChurnCostRow {
            tool: "x",
            command: String::new(),
            loop_ns_per_sample: Spread::of(alone.iter().copied()),
            churn_ns_per_sample: Spread::of(churn.iter().copied()),
        };
        let rise = row(&[5000.0, 4000.0, 9000.0], &[6000.0]).rise_percent();
        assert!((rise.unwrap() - 20.0).abs() < 1e-9);
        assert_eq!(row(&[], &[6000.0]).rise_percent(), None);
    }
}
