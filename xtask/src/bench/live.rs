//! The live views side by side: `profiler top` and `perf top` (with call graphs, as ours always
//! has them, and without), system-wide at 1 kHz on the churn load, each drawing in a terminal of
//! its own (a tmux session, 120x40) for the same time, in interleaved rounds. Each tool's CPU
//! (its process tree, from the scheduler's run time) over the whole run and over its steady part
//! (past the first 3 s of start-up), and its peak RSS (VmHWM).

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::{
    agent_cost::{Load, RunningLoad},
    measure,
    summary::Spread,
    tools::path_arg,
};

/// The rate both run at: a thousand samples a second per CPU.
pub const RATE_HZ: u64 = 1000;
/// Start-up left out of the steady share: symbols loaded, the first screens drawn.
const START_UP: Duration = Duration::from_secs(3);

/// One tool over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct LiveRow {
    pub tool: &'static str,
    pub duration_s: u64,
    pub rounds: usize,
    pub cpu_percent_of_core: Option<Spread>,
    pub steady_percent_of_core: Option<Spread>,
    pub max_rss_mib: Option<Spread>,
    pub command: String,
}

struct LiveRun {
    cpu_percent: f64,
    steady_percent: f64,
    max_rss_mib: f64,
}

/// `profiler top`, `perf top -g` and `perf top`, `rounds` rounds of `duration_s` seconds each.
pub fn measure(
    profiler: &Path,
    release: &Path,
    duration_s: u64,
    rounds: usize,
) -> Result<Vec<LiveRow>> {
    if duration_s <= START_UP.as_secs() {
        bail!("a live-view run must be longer than its {START_UP:?} start-up");
    }
    let rate = RATE_HZ.to_string();
    let tools: [(&'static str, Vec<String>); 3] = [
        (
            "profiler top",
            vec![path_arg(profiler), "top".into(), "-F".into(), rate.clone()],
        ),
        (
            "perf top -g",
            ["perf", "top", "-F", &rate, "-g"]
                .map(str::to_string)
                .to_vec(),
        ),
        (
            "perf top",
            ["perf", "top", "-F", &rate].map(str::to_string).to_vec(),
        ),
    ];
    let _load = RunningLoad::start(release, Load::Churn)?;
    let mut runs: Vec<Vec<LiveRun>> = tools.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..tools.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for index in order {
            let (name, argv) = &tools[index];
            let run = run_in_terminal(argv, Duration::from_secs(duration_s))
                .with_context(|| format!("{name} in a terminal"))?;
            runs[index].push(run);
        }
    }
    Ok(tools
        .into_iter()
        .zip(runs)
        .map(|((tool, argv), runs)| LiveRow {
            tool,
            duration_s,
            rounds: runs.len(),
            cpu_percent_of_core: Spread::of(runs.iter().map(|run| run.cpu_percent)),
            steady_percent_of_core: Spread::of(runs.iter().map(|run| run.steady_percent)),
            max_rss_mib: Spread::of(runs.iter().map(|run| run.max_rss_mib)),
            command: measure::command_line(&argv),
        })
        .collect())
}

/// Runs `argv` as the only program of a new tmux terminal for `duration`, measuring it.
fn run_in_terminal(argv: &[String], duration: Duration) -> Result<LiveRun> {
    let socket = format!("profiler-bench-live-{}", std::process::id());
    let tmux = |args: &[&str]| -> Result<String> {
        let output = Command::new("tmux")
            .args(["-L", &socket])
            .args(args)
            .output()
            .context("running tmux (cargo xtask setup installs it)")?;
        if !output.status.success() {
            bail!(
                "tmux {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let command = format!("exec {} 2>/dev/null", measure::command_line(argv));
    tmux(&[
        "new-session",
        "-d",
        "-s",
        "live",
        "-x",
        "120",
        "-y",
        "40",
        "sh",
        "-c",
        &command,
    ])?;
    let started = Instant::now();
    let measured = (|| -> Result<LiveRun> {
        let pid: u32 = tmux(&["display-message", "-p", "-t", "live", "#{pane_pid}"])?
            .trim()
            .parse()
            .context("tmux's pane pid")?;
        std::thread::sleep(START_UP);
        let cpu_at_start_up = measure::tree_cpu_s(pid);
        std::thread::sleep(duration.saturating_sub(started.elapsed()));
        let cpu = measure::tree_cpu_s(pid);
        let elapsed = started.elapsed().as_secs_f64();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("the tool (pid {pid}) ended before its time"))?;
        let max_rss_kib: f64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
            .context("no VmHWM in its status")?;
        Ok(LiveRun {
            cpu_percent: 100.0 * cpu / elapsed,
            steady_percent: 100.0 * (cpu - cpu_at_start_up) / (elapsed - START_UP.as_secs_f64()),
            max_rss_mib: max_rss_kib / 1024.0,
        })
    })();
    // The terminal closes: each tool stops on the hang-up.
    tmux(&["kill-server"]).ok();
    std::thread::sleep(Duration::from_millis(500));
    measured
}
