//! Choosing events from the command line: the list, several events at once, and bad specs.

mod common;

use std::process::Command;

use common::{core_pmu, has_pmu, profiler, profiler_bin, profiler_json, self_percent, workload};

#[test]
fn list_shows_software_events_available_and_hardware_events_with_the_reason() {
    let output = profiler(&["list", "--json"]);
    let listing: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let entries: Vec<&serde_json::Value> = listing["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .flat_map(|section| section["entries"].as_array().unwrap())
        .collect();
    let entry = |name: &str| {
        *entries
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not listed"))
    };
    for software in ["cpu-clock", "task-clock", "page-faults", "context-switches"] {
        let status = &entry(software)["availability"]["status"];
        assert_eq!(status, "available", "{software}");
    }
    let cycles = entry("cycles");
    let text = String::from_utf8(profiler(&["list"]).stdout).unwrap();
    assert!(text.contains("cpu-clock"));
    match core_pmu() {
        Some(pmu) => {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("this machine has a core PMU ({pmu}): cycles must be available\n")
                    .as_bytes(),
            );
            assert_eq!(cycles["availability"]["status"], "available");
        }
        None => {
            assert_ne!(cycles["availability"]["status"], "available");
            let reason = cycles["availability"]["reason"].as_str().unwrap();
            assert!(reason.contains("no hardware PMU"), "{reason}");
            // The text form says the same.
            assert!(text.contains("no hardware PMU"), "{text}");
        }
    }
}

#[test]
fn two_events_in_one_run_each_get_their_samples() {
    let toucher = workload("page_toucher");
    let (report, _) = profiler_json(&[
        "record",
        "--json",
        "-",
        "-e",
        "cpu-clock,page-faults/period=1/",
        "--",
        toucher.to_str().unwrap(),
        "30000",
    ]);
    let events = report["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["name"], "cpu-clock");
    assert_eq!(events[1]["name"], "page-faults/period=1/", "as given");
    assert!(
        events[0]["samples"].as_u64().unwrap() > 0,
        "no cpu-clock samples"
    );
    let faults = events[1]["samples"].as_u64().unwrap();
    assert!(
        faults >= 30000,
        "{faults} page-fault samples for 30000 touched pages"
    );
    assert!(self_percent(&events[1], "page_toucher::touch_pages") > 90.0);
}

fn failing(args: &[&str]) -> String {
    let output = Command::new(profiler_bin()).args(args).output().unwrap();
    assert!(!output.status.success(), "profiler {args:?} should fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bad_event_specs_get_clear_errors() {
    let unknown = failing(&["record", "-e", "cycels", "--", "true"]);
    assert!(unknown.contains("unknown event 'cycels'") && unknown.contains("Did you mean: cycles"));
    let conflict = failing(&[
        "record",
        "-e",
        "cpu-clock/period=10,freq=100/",
        "--",
        "true",
    ]);
    assert!(conflict.contains("cpu-clock"), "{conflict}");
    let modifiers = failing(&["record", "-e", "cycles:pppp", "--", "true"]);
    assert!(modifiers.contains("cycles:pppp"), "{modifiers}");
    // Where the machine has IBS, `ibs_op//` is a valid event.
    if !has_pmu("ibs_op") {
        let pmu = failing(&["record", "-e", "ibs_op//", "--", "true"]);
        assert!(pmu.contains("ibs_op"), "{pmu}");
    }
    // Where it has no Arm SPE, what SPE needs is said (live SPE itself: tests/hardware.rs).
    if !has_pmu("arm_spe_0") {
        let spe = failing(&["record", "-e", "arm_spe_0//", "--", "true"]);
        assert!(
            spe.contains("arm_spe_0: no such PMU on this machine (Arm SPE needs"),
            "{spe}"
        );
    }
    if core_pmu().is_none() {
        let no_pmu = failing(&["record", "-e", "cycles", "--", "true"]);
        assert!(no_pmu.contains("no hardware PMU"), "{no_pmu}");
    }
    let missing = failing(&["record", "--", "/nonexistent/program"]);
    assert!(
        missing.contains("cannot run '/nonexistent/program'"),
        "{missing}"
    );
    let gone = failing(&["record", "-p", "999999999"]);
    assert!(gone.contains("process 999999999 does not exist"), "{gone}");
}

#[test]
fn target_rate_calibrates_each_event_near_the_rate() {
    let cpu_split = workload("cpu_split");
    let busy = common::Running::spawn(
        Command::new(&cpu_split)
            .arg("20000")
            .stderr(std::process::Stdio::null()),
    );
    let pid = busy.id().to_string();
    let output = profiler(&[
        "record",
        "--json",
        "-",
        "-p",
        &pid,
        "-e",
        "cpu-clock,task-clock",
        "--target-rate",
        "300",
        "--duration",
        "2",
    ]);
    drop(busy);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.matches("calibration: ").count(), 2, "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for event in report["events"].as_array().unwrap() {
        let period = event["period"]
            .as_u64()
            .expect("a calibrated period is stored");
        // A busy thread's clock runs at about 1e9 ns/s: 300 samples/s is a period near 3.3e6.
        assert!((1_000_000..10_000_000).contains(&period), "{event:#}");
        let samples = event["samples"].as_u64().unwrap();
        assert!(
            (150..=900).contains(&samples),
            "{samples} samples in 2 s at 300/s: {event:#}"
        );
    }
}
