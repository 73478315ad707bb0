//! Hardware sampling on machines with a hardware PMU: precise cycles, AMD IBS op sampling,
//! Intel PEBS load latency and Arm SPE, recorded with `profiler record -o` and checked in the
//! profile file.
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
/// profiler and the workload printed on stderr (workloads print there: the report owns stdout).
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
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Why this machine has no AMD IBS PMU of `kind` (`op`, `fetch`), if it has none.
fn ibs_missing(kind: &str) -> Option<String> {
    match sysfs(&format!("ibs_{kind}"), "type") {
        Some(_) => None,
        None => Some(format!(
            "no {DEVICES}/ibs_{kind}: AMD IBS needs an AMD CPU and a host kernel"
        )),
    }
}

fn function(frame: &Frame) -> &str {
    frame.function.as_deref().unwrap_or("")
}

/// page_toucher's stores (line 5 of each of `pages` pages from `region`) are among the data
/// lines `sampler` reported, each at touch_pages, and no line of the region is another.
fn assert_stores_on_line_5(profile: &Profile, region: u64, pages: u64, sampler: &str) {
    let touched: Vec<u64> = profile
        .data_lines
        .iter()
        .filter(|line| (region..region + pages * 4096).contains(&line.line))
        .map(|line| {
            let frame = &profile.frames[line.frame as usize];
            assert_eq!(function(frame), "page_toucher::touch_pages", "{frame:?}");
            line.line
        })
        .collect();
    assert!(
        !touched.is_empty(),
        "no {sampler} sample carried an address in the touched region {region:#x}: {:?}",
        profile.data_lines
    );
    for line in touched {
        assert_eq!(
            (line - region) % 4096,
            5 * 64,
            "store at {line:#x} is not on line 5 of its page"
        );
    }
}

/// Records page_toucher (20,000 pages, line 5 of each) under the precise sampler `event`
/// (`sampler` names it in messages): a precise event, more than 50 samples, the stores among its
/// data lines. The profile and its samples.
fn record_page_stores(dir: &Path, event: &str, sampler: &str) -> (Profile, u64) {
    const PAGES: u64 = 20_000;
    let (profile, stderr) = record(dir, event, "page_toucher", &[&PAGES.to_string(), "5"]);
    let (region, _, _) = common::touched_region(&stderr);
    assert!(
        profile.events[0].precise,
        "{sampler} tags the operation itself"
    );
    let samples: u64 = profile.stacks.iter().map(|s| s.count).sum();
    assert!(samples > 50, "{samples} {sampler} samples");
    assert_stores_on_line_5(&profile, region, PAGES, sampler);
    (profile, samples)
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
    if let Some(reason) = ibs_missing("op") {
        return skipped(&reason);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // The stores of touch_pages write line 5 of each page: IBS reports their linear addresses.
    let (profile, _) = record_page_stores(dir.path(), "ibs_op/period=16000/", "IBS op");
    // Loads that missed the data cache carry their miss latency.
    assert!(
        profile
            .instructions
            .iter()
            .any(|i| i.stats.latency_count > 0),
        "no op sample carried a data-cache miss latency"
    );
}

/// Live Arm SPE: its AUX trace read per CPU, each record a sample of the launched command's
/// threads, with the data addresses of the stores page_toucher makes to line 5 of every page.
#[test]
fn spe_records_of_the_command_carry_its_store_addresses() {
    if sysfs("arm_spe_0", "type").is_none() {
        return skipped(&format!(
            "no {DEVICES}/arm_spe_0: Arm SPE needs a Neoverse-class CPU, the arm_spe_pmu \
             driver and a host kernel"
        ));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (profile, samples) = record_page_stores(dir.path(), "arm_spe_0/period=4096/", "SPE");
    assert_eq!(
        samples, profile.losses.samples_fired[0],
        "every record read is a sample"
    );
    // Attributed to the command's threads, not to pid 0.
    assert!(
        profile.threads.iter().all(|t| t.pid != 0),
        "{:?}",
        profile.threads
    );
    let spe_operations: u64 = profile
        .hardware
        .samples
        .iter()
        .filter_map(|s| s.spe.map(|c| c.samples))
        .sum();
    assert_eq!(spe_operations, samples, "SPE counters for every record");
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
    // Every latency sample with an address is in its data line's histogram too.
    let in_lines: u64 = profile
        .line_latency
        .iter()
        .flat_map(|h| h.buckets.iter().map(|(_, count)| count))
        .sum();
    let line_latencies: u64 = profile
        .data_lines
        .iter()
        .map(|line| line.stats.latency_count)
        .sum();
    assert!(line_latencies > 0, "no data line carried a load latency");
    assert_eq!(
        in_lines, line_latencies,
        "data-line histograms hold other samples"
    );
}

#[test]
fn ibs_derived_counters_are_accumulated_live() {
    if let Some(reason) = ibs_missing("op").or_else(|| ibs_missing("fetch")) {
        return skipped(&reason);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (profile, _) = record(
        dir.path(),
        "ibs_op/period=16000/,ibs_fetch/period=16000/",
        "cpu_split",
        &["1000"],
    );
    let caps = profile
        .hardware
        .ibs_caps
        .expect("IBS samples carry the capabilities word");
    assert_eq!(
        caps & 0b111,
        0b111,
        "IBS available with fetch and op sampling: {caps:#x}"
    );
    let fired = &profile.losses.samples_fired;
    let lost = |what: &str| profile.losses.counters.get(what).copied().unwrap_or(0);
    // Losses are counted per kind, not per event: the two events are checked together.
    let lost_registers = lost("IBS derived counters: register ring buffer full")
        + lost("IBS registers unreadable (decoded fields or derived counters lost)")
        + lost("sample data unreadable (address/latency lost)");
    let mut counted_both = 0;
    for (event, kind) in [(0u32, "op"), (1u32, "fetch")] {
        let counted: u64 = profile
            .hardware
            .samples
            .iter()
            .filter(|s| s.event == event)
            .map(|s| match kind {
                "op" => s.ibs_op.map_or(0, |c| c.all_samples),
                _ => s.ibs_fetch.map_or(0, |c| c.all_samples),
            })
            .sum();
        assert!(
            counted > 50,
            "{counted} IBS {kind} samples with derived counters"
        );
        assert!(
            counted <= fired[event as usize],
            "IBS {kind}: {counted} counted of {} fired",
            fired[event as usize]
        );
        counted_both += counted;
    }
    // Every fired IBS sample is counted exactly once, or reported lost.
    assert_eq!(
        counted_both + lost_registers,
        fired[0] + fired[1],
        "IBS samples counted ({counted_both}) and lost ({lost_registers}) against fired {fired:?}"
    );
    // cpu_split's heavy_work does 60% of the work: most op samples retire there.
    let heavy_ops: u64 = profile
        .hardware
        .samples
        .iter()
        .filter(|s| s.event == 0)
        .filter(|s| function(&profile.frames[s.frame as usize]) == "cpu_split::heavy_work")
        .filter_map(|s| s.ibs_op.map(|c| c.all_samples))
        .sum();
    let all_ops: u64 = profile
        .hardware
        .samples
        .iter()
        .filter_map(|s| s.ibs_op.map(|c| c.all_samples))
        .sum();
    assert!(
        heavy_ops * 100 >= all_ops * 40,
        "heavy_work holds {heavy_ops} of {all_ops} IBS op samples"
    );
    let text = String::from_utf8_lossy(
        &common::profiler(&[
            "report",
            "-i",
            dir.path().join("run.prof").to_str().expect("UTF-8 path"),
            "--hardware",
            "function",
        ])
        .stdout,
    )
    .into_owned();
    for expected in [
        "IBS all op samples",
        "IBS all fetch samples",
        "cpu_split::heavy_work",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}
