//! `profiler stat` on the bundled workloads: exact counts, unsupported events, per-thread
//! attribution, errors.

mod common;

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use common::{profiler_bin, require_root, workload};
use serde_json::Value;

/// Runs `profiler stat ARGS`, returning its output whatever the exit status.
fn stat(args: &[&str]) -> Output {
    require_root();
    Command::new(profiler_bin())
        .arg("stat")
        .args(args)
        .output()
        .expect("the profiler runs")
}

/// A report file in the temporary directory, removed when dropped.
struct ReportFile(PathBuf);

impl ReportFile {
    fn new(name: &str) -> ReportFile {
        ReportFile(
            std::env::temp_dir().join(format!("profiler-stat-{name}-{}.json", std::process::id())),
        )
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temporary path")
    }

    fn json(&self) -> Value {
        let text = std::fs::read_to_string(&self.0).expect("the report was written");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
    }
}

impl Drop for ReportFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `profiler stat --json -o FILE ARGS`, asserting success, and parses the report.
fn stat_json(name: &str, args: &[&str]) -> Value {
    stat_json_and_stderr(name, args).0
}

/// `stat_json`, with what the profiler and its workload wrote on stderr.
fn stat_json_and_stderr(name: &str, args: &[&str]) -> (Value, String) {
    let report = ReportFile::new(name);
    let mut all = vec!["--json", "-o", report.path()];
    all.extend_from_slice(args);
    let output = stat(&all);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "profiler stat {all:?} failed: {stderr}"
    );
    (report.json(), stderr)
}

fn event<'a>(events: &'a Value, name: &str) -> &'a Value {
    events
        .as_array()
        .expect("an event list")
        .iter()
        .find(|event| event["event"] == name)
        .unwrap_or_else(|| panic!("no {name} in {events}"))
}

#[test]
fn page_faults_of_a_launched_command_are_all_counted() {
    let pages = 5000;
    let toucher = workload("page_toucher");
    let report = stat_json(
        "page-faults",
        &[
            "-e",
            "page-faults",
            "--",
            toucher.to_str().unwrap(),
            &pages.to_string(),
        ],
    );
    assert_eq!(report["schema"], "profiler.stat/1");
    assert_eq!(report["command"]["exit_code"], 0);
    let faults = event(&report["events"], "page-faults");
    assert_eq!(faults["supported"], true);
    assert_eq!(faults["scaled"], false, "software events never multiplex");
    let count = faults["count"].as_u64().expect("a count");
    // Every fresh page faults once; the loader and allocator add a few hundred more.
    assert!(
        (pages..pages + 2_000).contains(&count),
        "{count} page faults for {pages} fresh pages"
    );
    // No clock counted beside the faults: the rate is per elapsed second, and says so.
    assert_eq!(faults["metrics"][0]["metric"], "per_elapsed_second");
}

#[test]
fn hardware_events_are_counted_or_reported_not_supported_with_the_reason() {
    if let Some(pmu) = common::core_pmu() {
        // A machine with counters counts them.
        let report = stat_json("cycles", &["-e", "cycles", "--", "/bin/true"]);
        let cycles = event(&report["events"], "cycles");
        assert_eq!(cycles["supported"], true, "core PMU {pmu}: {cycles}");
        assert!(cycles["count"].as_u64().unwrap_or(0) > 0, "{cycles}");
        return;
    }
    let output = stat(&["-e", "cycles,task-clock", "--", "/bin/true"]);
    assert!(
        output.status.success(),
        "an unsupported event must not fail the run: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stderr);
    let cycles = text
        .lines()
        .find(|line| line.contains(" cycles"))
        .unwrap_or_else(|| panic!("no cycles line:\n{text}"));
    assert!(cycles.trim_start().starts_with("<not supported>"), "{text}");
    assert!(
        text.contains("cycles: no hardware PMU: virtual machine?"),
        "{text}"
    );
    let clock = text
        .lines()
        .find(|line| line.contains(" task-clock"))
        .unwrap_or_else(|| panic!("no task-clock line:\n{text}"));
    assert!(clock.contains(" msec task-clock"), "{text}");
    assert!(clock.contains("CPUs utilized"), "{text}");

    let report = stat_json("cycles", &["-e", "cycles", "--", "/bin/true"]);
    let cycles = event(&report["events"], "cycles");
    assert_eq!(cycles["supported"], false);
    assert!(cycles["reason"]
        .as_str()
        .unwrap()
        .starts_with("no hardware PMU"));
    assert!(cycles.get("count").is_none());
}

#[test]
fn unknown_events_name_the_nearest_and_fail() {
    let output = stat(&["-e", "page-fualts", "--", "/bin/true"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unknown event 'page-fualts'. Did you mean: page-faults"),
        "{stderr}"
    );
}

#[test]
fn the_commands_exit_status_is_passed_on() {
    let output = stat(&["-e", "task-clock", "--", "/bin/sh", "-c", "exit 3"]);
    assert_eq!(output.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&output.stderr).contains("exited with status 3"));
}

#[test]
fn per_thread_counts_follow_each_threads_own_work() {
    let threads = workload("threads");
    let (report, stderr) = stat_json_and_stderr(
        "per-thread",
        &[
            "--per-thread",
            "-e",
            "task-clock,context-switches",
            "--",
            threads.to_str().unwrap(),
            "4",
        ],
    );
    let rows = report["threads"].as_array().expect("per-thread rows");
    let clock_of = |name: &str| -> u64 {
        let row = rows
            .iter()
            .find(|row| row["name"] == name)
            .unwrap_or_else(|| panic!("no thread {name} in {rows:?}"));
        assert_eq!(row["also_counts"], 0, "{row}");
        event(&row["events"], "task-clock")["count"]
            .as_u64()
            .expect("a count")
    };
    // Thread spin-i does (i + 1) units of the same work, and prints the CPU time it measured
    // itself (`spin-I tid T cpu_ns N`) just before it ends. A busy host stretches some units
    // (CI once measured 46, 131, 164 and 194 ms), so each count is held to its thread's own
    // clock, and the order to the work.
    let clocks: Vec<u64> = (0..4).map(|i| clock_of(&format!("spin-{i}"))).collect();
    for (i, &clock) in clocks.iter().enumerate() {
        let prefix = format!("spin-{i} tid ");
        let own: u64 = stderr
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| {
                rest.split(" cpu_ns ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("spin-{i} printed its CPU time: {stderr}"));
        // After measuring, the thread still prints its line and exits.
        assert!(
            clock >= own && clock - own <= own / 50 + 2_000_000,
            "spin-{i}: task-clock {clock} ns, its own CPU clock {own} ns"
        );
    }
    for (i, pair) in clocks.windows(2).enumerate() {
        assert!(
            pair[0] < pair[1],
            "spin-{i} ran {} ns, spin-{} {} ns: {clocks:?}",
            pair[0],
            i + 1,
            pair[1]
        );
    }
    // The rows add up to the total.
    let total = event(&report["events"], "task-clock")["count"]
        .as_u64()
        .unwrap();
    let sum: u64 = rows
        .iter()
        .map(|row| {
            event(&row["events"], "task-clock")["count"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(sum, total);
    let main = rows
        .iter()
        .find(|row| row["name"] == "threads")
        .expect("the main thread has a row");
    assert!(
        event(&main["events"], "task-clock")["count"]
            .as_u64()
            .unwrap()
            < clocks[0],
        "the main thread only waits: {main}"
    );
}

#[test]
fn running_processes_are_counted_until_they_exit() {
    let threads = workload("threads");
    let mut child = common::Running::spawn(
        Command::new(&threads)
            .args(["2", "10"])
            .stderr(std::process::Stdio::null()),
    );
    let pid = child.id().to_string();
    let report = stat_json("pid", &["-e", "task-clock", "-p", &pid, "--duration", "30"]);
    child.wait_at_most(std::time::Duration::from_secs(30));
    let elapsed = report["elapsed_ns"].as_u64().unwrap();
    assert!(
        elapsed < 20_000_000_000,
        "stat stopped when the process exited"
    );
    let clock = event(&report["events"], "task-clock")["count"]
        .as_u64()
        .unwrap();
    assert!(
        clock > 100_000_000,
        "two threads spinning: {clock} ns of CPU"
    );
    assert!(report["command"].is_null());
}

#[test]
fn system_wide_counts_split_per_cpu() {
    let report = stat_json(
        "per-cpu",
        &["-a", "--per-cpu", "-e", "cpu-clock", "--duration", "0.3"],
    );
    let cpus = report["cpus"].as_array().expect("per-CPU rows");
    let online = std::thread::available_parallelism().unwrap().get();
    assert_eq!(cpus.len(), online);
    for cpu in cpus {
        // cpu-clock system-wide is wall time on every CPU.
        let clock = event(&cpu["events"], "cpu-clock")["count"]
            .as_u64()
            .unwrap();
        assert!(
            (250_000_000..400_000_000).contains(&clock),
            "{clock} ns in 0.3 s: {cpu}"
        );
    }
}
