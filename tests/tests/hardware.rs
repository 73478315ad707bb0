//! Hardware sampling on machines with a hardware PMU: precise cycles, AMD IBS op sampling and
//! Intel PEBS load latency, recorded with `profiler record -o` and checked in the profile file.
//!
//! Each test first checks the PMU it needs in sysfs; without it, it prints
//! `skipped: no hardware PMU (reason)` and returns. That is the only skip these tests allow.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use profiler::profile::file::read_profile;
use profiler::profile::{Frame, Profile};

const DEVICES: &str = "/sys/bus/event_source/devices";

/// `DEVICES/pmu/relative`, trimmed, when it exists.
fn sysfs(pmu: &str, relative: &str) -> Option<String> {
    fs::read_to_string(Path::new(DEVICES).join(pmu).join(relative))
        .ok()
        .map(|text| text.trim().to_string())
}

fn skipped(reason: &str) {
    use std::io::Write;
    // Straight to the stderr handle: the test harness captures `println!` of passing tests, and
    // a skip must be visible in every run's log.
    let _ = writeln!(std::io::stderr(), "skipped: no hardware PMU ({reason})");
}

/// Why this machine cannot take precise samples of the core PMU, if it cannot.
fn precise_sampling_missing() -> Option<String> {
    if sysfs("cpu", "type").is_none() && sysfs("cpu_core", "type").is_none() {
        return Some(format!(
            "no {DEVICES}/cpu: no core PMU, a virtual machine without counters?"
        ));
    }
    let max_precise: u8 = sysfs("cpu", "caps/max_precise")
        .or_else(|| sysfs("cpu_core", "caps/max_precise"))
        .and_then(|text| text.parse().ok())
        .unwrap_or(0);
    // AMD forwards precise cycles to IBS op sampling.
    if max_precise < 2 && sysfs("ibs_op", "type").is_none() {
        return Some(format!(
            "the core PMU supports precise level {max_precise} (caps/max_precise) and there is \
             no ibs_op PMU: cycles:pp needs PEBS or IBS"
        ));
    }
    None
}

/// Records `workload args` with `events` into a profile file and reads it back, with what the
/// profiler and the workload printed.
fn record(dir: &Path, events: &str, workload: &str, args: &[&str]) -> (Profile, String) {
    let file: PathBuf = dir.join("run.prof");
    let binary = common::workload(workload);
    let mut full = vec![
        "record",
        "-e",
        events,
        "-o",
        file.to_str().expect("UTF-8 path"),
        "--",
        binary.to_str().expect("UTF-8 path"),
    ];
    full.extend_from_slice(args);
    let output = common::profiler(&full);
    let profile = read_profile(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
    (
        profile,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

fn function(frame: &Frame) -> &str {
    frame.function.as_deref().unwrap_or("")
}

#[test]
fn precise_cycles_land_in_the_hot_function() {
    if let Some(reason) = precise_sampling_missing() {
        return skipped(&reason);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (profile, _) = record(dir.path(), "cycles:pp", "cpu_split", &["1500"]);

    let event = &profile.events[0];
    assert!(event.precise, "cycles:pp is recorded as precise: {event:?}");
    let samples: u64 = profile.stacks.iter().map(|s| s.count).sum();
    assert!(samples > 100, "{samples} samples");
    let in_heavy: u64 = profile
        .instructions
        .iter()
        .filter(|i| function(&profile.frames[i.frame as usize]) == "cpu_split::heavy_work")
        .map(|i| i.stats.count)
        .sum();
    assert!(
        in_heavy * 100 >= samples * 40,
        "heavy_work does 60% of the work but holds {in_heavy} of {samples} precise samples"
    );
    // Precise IPs are instruction starts inside the function.
    for instruction in &profile.instructions {
        let frame = &profile.frames[instruction.frame as usize];
        if function(frame) == "cpu_split::heavy_work" {
            let start = frame
                .function_address
                .expect("a symbolized function has a start");
            assert!(frame.address >= start, "{frame:?}");
        }
    }
}

#[test]
fn ibs_op_samples_carry_data_addresses_of_the_touched_pages() {
    let Some(ibs_type) = sysfs("ibs_op", "type") else {
        return skipped(&format!(
            "no {DEVICES}/ibs_op: AMD IBS needs an AMD CPU and a host kernel"
        ));
    };
    assert!(ibs_type.parse::<u32>().is_ok(), "ibs_op type {ibs_type:?}");
    let dir = tempfile::tempdir().expect("temp dir");
    const PAGES: u64 = 20_000;
    let (profile, stdout) = record(
        dir.path(),
        "ibs_op/period=16000/",
        "page_toucher",
        &[&PAGES.to_string(), "5"],
    );
    // page_toucher prints "region 0x... pages N line L".
    let region = stdout
        .lines()
        .find_map(|line| line.strip_prefix("region 0x"))
        .and_then(|rest| u64::from_str_radix(rest.split_whitespace().next()?, 16).ok())
        .unwrap_or_else(|| panic!("page_toucher printed no region: {stdout}"));

    assert!(profile.events[0].precise, "IBS tags the instruction itself");
    let samples: u64 = profile.stacks.iter().map(|s| s.count).sum();
    assert!(samples > 50, "{samples} IBS op samples");
    // The stores of touch_pages write line 5 of each page: IBS reports their linear addresses.
    let touched: Vec<u64> = profile
        .data_lines
        .iter()
        .filter(|line| (region..region + PAGES * 4096).contains(&line.line))
        .map(|line| {
            let frame = &profile.frames[line.frame as usize];
            assert_eq!(function(frame), "page_toucher::touch_pages", "{frame:?}");
            line.line
        })
        .collect();
    assert!(
        !touched.is_empty(),
        "no IBS op sample carried an address in the touched region {region:#x}: {:?}",
        profile.data_lines
    );
    for line in touched {
        assert_eq!(
            (line - region) % 4096,
            5 * 64,
            "store at {line:#x} is not on line 5 of its page"
        );
    }
    // Loads that missed the data cache carry their miss latency.
    assert!(
        profile
            .instructions
            .iter()
            .any(|i| i.stats.latency_count > 0),
        "no op sample carried a data-cache miss latency"
    );
}

#[test]
fn pebs_load_latency_samples_carry_addresses_and_latencies() {
    let core = ["cpu", "cpu_core"]
        .into_iter()
        .find(|pmu| sysfs(pmu, "events/mem-loads").is_some());
    let Some(core) = core else {
        return skipped(&format!(
            "no {DEVICES}/cpu/events/mem-loads: PEBS load latency needs an Intel CPU and a host \
             kernel"
        ));
    };
    let max_precise: u8 = sysfs(core, "caps/max_precise")
        .and_then(|text| text.parse().ok())
        .unwrap_or(0);
    if max_precise == 0 {
        return skipped(&format!(
            "{core}/caps/max_precise is 0: the PMU has no PEBS"
        ));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // black_box spills cpu_split's chain value to the stack and reloads it: L1 hits of a few
    // cycles, above a latency threshold of 3.
    let event = format!("{core}/mem-loads,ldlat=3/pp");
    let (profile, _) = record(dir.path(), &event, "cpu_split", &["500"]);

    assert!(profile.events[0].precise);
    let with_latency: Vec<_> = profile
        .instructions
        .iter()
        .filter(|i| i.stats.latency_count > 0)
        .collect();
    assert!(
        !with_latency.is_empty(),
        "no PEBS sample carried a load latency"
    );
    for instruction in &with_latency {
        assert!(
            instruction.stats.latency_sum >= 3 * instruction.stats.latency_count,
            "latencies below the ldlat=3 threshold: {instruction:?}"
        );
    }
    assert!(
        !profile.data_lines.is_empty(),
        "no PEBS sample carried a data address"
    );
    assert!(
        profile.data_lines.iter().all(|line| line.line % 64 == 0),
        "data lines are 64-byte aligned"
    );
    assert!(!profile.latency.is_empty(), "no load-latency histogram");
}
