//! `profiler record` on the bundled workloads: attribution, call stacks, accounting.

mod common;

use common::{profiler_json, self_percent, workload};

/// The split cpu_split measured with its own thread CPU clock, by function.
fn measured_split(stderr: &str) -> Vec<(String, f64)> {
    let line = stderr
        .lines()
        .find(|l| l.contains("measured CPU split:"))
        .unwrap_or_else(|| panic!("cpu_split printed no split:\n{stderr}"));
    let split = line.split("measured CPU split:").nth(1).unwrap();
    let words: Vec<&str> = split.split_whitespace().collect();
    words
        .chunks(2)
        .map(|pair| {
            (
                format!("cpu_split::{}", pair[0]),
                pair[1].trim_end_matches('%').parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn cpu_split_shares_match_the_workload() {
    let cpu_split = workload("cpu_split");
    let (report, stderr) = profiler_json(&["record", "--json", "--", cpu_split.to_str().unwrap()]);
    let event = &report["events"][0];
    let samples = event["samples"].as_u64().unwrap();
    assert!(samples > 500, "too few samples for a 1.5 s run: {samples}");
    let expected = [60.0, 30.0, 10.0];
    for ((function, measured), nominal) in measured_split(&stderr).iter().zip(expected) {
        let sampled = self_percent(event, function);
        assert!(
            (sampled - measured).abs() <= 5.0,
            "{function}: profiler says {sampled:.1}%, the workload measured {measured:.1}%"
        );
        assert!(
            (sampled - nominal).abs() <= 10.0,
            "{function}: profiler says {sampled:.1}%, designed for {nominal}%"
        );
    }
}

#[test]
fn hot_function_stacks_include_its_callers() {
    let cpu_split = workload("cpu_split");
    let (report, _) = profiler_json(&[
        "record",
        "--json",
        "--paths",
        "20",
        "--",
        cpu_split.to_str().unwrap(),
    ]);
    let paths = report["events"][0]["hot_paths"].as_array().unwrap();
    let heavy = paths
        .iter()
        .find(|p| p["functions"][0] == "cpu_split::heavy_work")
        .unwrap_or_else(|| panic!("no call path with heavy_work as leaf: {paths:#?}"));
    let functions: Vec<&str> = heavy["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let position = |name: &str| {
        functions
            .iter()
            .position(|f| *f == name)
            .unwrap_or_else(|| panic!("{name} missing from heavy_work's stack {functions:?}"))
    };
    // Leaf first: heavy_work <- run_round <- main.
    assert!(position("cpu_split::run_round") == 1, "{functions:?}");
    assert!(position("cpu_split::main") > position("cpu_split::run_round"));
}

#[test]
fn every_fired_sample_is_drained_or_reported_lost() {
    let cpu_split = workload("cpu_split");
    let (report, _) = profiler_json(&[
        "record",
        "--json",
        "--drain-interval",
        "50",
        "-F",
        "4999",
        "--",
        cpu_split.to_str().unwrap(),
        "2000",
    ]);
    let event = &report["events"][0];
    let fired = event["samples_fired"].as_u64().unwrap();
    let drained = event["samples"].as_u64().unwrap();
    let losses = &report["losses"];
    let lost = losses["samples lost: stack-count map full"]
        .as_u64()
        .unwrap()
        + losses["samples lost: unregistered perf event"]
            .as_u64()
            .unwrap();
    assert!(
        fired > 1000,
        "expected thousands of samples at 4999 Hz, got {fired}"
    );
    assert_eq!(
        fired,
        drained + lost,
        "fired {fired} != drained {drained} + lost {lost}"
    );
}
