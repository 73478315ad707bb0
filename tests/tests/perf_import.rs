//! perf.data files recorded here by the real `perf record` on the bundled workloads, imported
//! into profiles and checked against what `perf report` itself says of the same file: samples
//! per function, and the cache lines page-fault addresses land on.
//!
//! Needs perf (Debian: linux-perf) and root; fails with the reason when either is missing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use profiler::import::profile_from_perf_data_file;
use profiler::profile::Profile;

fn run(program: &str, args: &[&str]) -> String {
    String::from_utf8(common::run_checked(program, args).stdout).expect("UTF-8 output")
}

/// `perf record -q -o DIR/perf.data ARGS -- WORKLOAD WORKLOAD_ARGS`; returns the file and the
/// workload's stderr (the workloads report there).
fn perf_record(
    dir: &Path,
    args: &[&str],
    workload: &str,
    workload_args: &[&str],
) -> (PathBuf, String) {
    common::require_root();
    let file = dir.join("perf.data");
    let binary = common::workload(workload);
    let mut full = vec!["record", "-q", "-o", file.to_str().expect("UTF-8 path")];
    full.extend_from_slice(args);
    full.push("--");
    full.push(binary.to_str().expect("UTF-8 path"));
    full.extend_from_slice(workload_args);
    let stderr = common::run_checked("perf", &full).stderr;
    (file, String::from_utf8_lossy(&stderr).into_owned())
}

/// perf's own self samples per symbol: `perf report --no-children --sort sym`, as
/// ("[k]" or "[.]", symbol) -> samples.
fn perf_samples_per_symbol(file: &Path) -> BTreeMap<String, u64> {
    let report = run(
        "perf",
        &[
            "report",
            "-i",
            file.to_str().expect("UTF-8 path"),
            "--stdio",
            "--no-children",
            "--sort",
            "sym",
            "-F",
            "overhead,sample,sym",
            "-g",
            "none",
        ],
    );
    let mut samples = BTreeMap::new();
    for line in report
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
    {
        let mut fields = line.split_whitespace();
        let _overhead = fields.next();
        let count: u64 = fields
            .next()
            .and_then(|count| count.parse().ok())
            .unwrap_or_else(|| panic!("no sample count in perf's line {line:?}"));
        let _level = fields.next();
        let symbol = fields.collect::<Vec<_>>().join(" ");
        *samples.entry(symbol).or_default() += count;
    }
    samples
}

/// Our self samples per function (the leaf frame of each stack) of one event.
fn our_samples_per_function(profile: &Profile, event: u32) -> BTreeMap<String, u64> {
    let mut samples = BTreeMap::new();
    for stack in profile.stacks.iter().filter(|stack| stack.event == event) {
        let leaf = &profile.frames[stack.frames[0] as usize];
        *samples.entry(leaf.display_name()).or_default() += stack.count;
    }
    samples
}

fn import(file: &Path) -> Profile {
    profile_from_perf_data_file(file)
        .unwrap_or_else(|e| panic!("importing {}: {e:#}", file.display()))
}

#[test]
fn cpu_clock_recording_matches_perf_report_per_function() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (file, _) = perf_record(
        dir.path(),
        &["-e", "cpu-clock", "-F", "999", "-g"],
        "cpu_split",
        &["1500"],
    );
    let profile = import(&file);

    assert_eq!(profile.events.len(), 1);
    let event = &profile.events[0];
    assert_eq!(
        (event.name.as_str(), event.frequency, event.precise),
        ("cpu-clock", Some(999), false)
    );
    assert_eq!(event.unit, "nanoseconds");
    let perf = perf_samples_per_symbol(&file);
    let ours = our_samples_per_function(&profile, 0);
    assert_eq!(
        ours.values().sum::<u64>(),
        perf.values().sum::<u64>(),
        "total samples\nours {ours:?}\nperf {perf:?}"
    );
    for function in [
        "cpu_split::heavy_work",
        "cpu_split::medium_work",
        "cpu_split::light_work",
    ] {
        let theirs = perf.get(function).copied().unwrap_or(0);
        assert!(
            theirs > 10,
            "perf saw {theirs} samples in {function}: {perf:?}"
        );
        assert_eq!(
            ours.get(function).copied(),
            Some(theirs),
            "{function}\nours {ours:?}\nperf {perf:?}"
        );
    }
    // Every symbol perf names, we name with the same count (kernel, libc and the vDSO included),
    // except where the two symbolizers pick different aliases for one address.
    let mismatched: Vec<&String> = perf
        .iter()
        .filter(|(symbol, count)| !symbol.starts_with("0x") && ours.get(*symbol) != Some(count))
        .map(|(symbol, _)| symbol)
        .collect();
    // Aliases (`clock_gettime@@GLIBC_2.17` / `__GI___clock_gettime`) are rare samples: at most
    // 2% of all samples may sit under a differently named symbol.
    let mismatched_samples: u64 = mismatched.iter().map(|symbol| perf[*symbol]).sum();
    let all_samples: u64 = perf.values().sum();
    assert!(
        mismatched_samples * 50 <= all_samples,
        "{mismatched:?}\nours {ours:?}\nperf {perf:?}"
    );

    // Stacks are whole: the leaf's callers up to main, as perf -g recorded them.
    let heavy = profile
        .stacks
        .iter()
        .find(|stack| {
            profile.frames[stack.frames[0] as usize].display_name() == "cpu_split::heavy_work"
        })
        .expect("a stack in heavy_work");
    let callers: Vec<String> = heavy
        .frames
        .iter()
        .map(|&id| profile.frames[id as usize].display_name())
        .collect();
    assert_eq!(callers[1], "cpu_split::run_round", "{callers:?}");
    assert!(
        callers.iter().any(|name| name == "cpu_split::main"),
        "{callers:?}"
    );
    assert!(
        profile
            .threads
            .iter()
            .any(|thread| thread.comm == "cpu_split"),
        "{:?}",
        profile.threads
    );
    assert!(
        profile.hardware.samples.is_empty(),
        "cpu-clock has no hardware fields"
    );
    assert!(
        profile.meta.target.contains("cpu-clock"),
        "{}",
        profile.meta.target
    );
}

#[test]
fn page_fault_addresses_land_on_the_touched_cache_lines() {
    const PAGES: u64 = 300;
    const LINE: u64 = 9;
    let dir = tempfile::tempdir().expect("temp dir");
    let (file, stderr) = perf_record(
        dir.path(),
        &["-e", "page-faults", "-c", "1", "-d", "-g"],
        "page_toucher",
        &[&PAGES.to_string(), &LINE.to_string()],
    );
    let (region, _, _) = common::touched_region(&stderr);
    let profile = import(&file);

    let perf = perf_samples_per_symbol(&file);
    let ours = our_samples_per_function(&profile, 0);
    assert_eq!(ours.values().sum::<u64>(), perf.values().sum::<u64>());
    let touch = "page_toucher::touch_pages";
    assert_eq!(
        ours.get(touch),
        perf.get(touch),
        "ours {ours:?}\nperf {perf:?}"
    );
    assert!(ours[touch] >= PAGES, "{} faults in {touch}", ours[touch]);

    // Every touched page faulted once at its line LINE.
    let expected: Vec<u64> = (0..PAGES)
        .map(|page| region + page * 4096 + LINE * 64)
        .collect();
    let touched: Vec<u64> = profile
        .data_lines
        .iter()
        .filter(|line| profile.frames[line.frame as usize].function.as_deref() == Some(touch))
        .filter(|line| (region..region + PAGES * 4096).contains(&line.line))
        .map(|line| {
            assert_eq!(
                line.stats.count, 1,
                "one fault per page at {:#x}",
                line.line
            );
            line.line
        })
        .collect();
    let mut touched = touched;
    touched.sort_unstable();
    assert_eq!(touched, expected);
}
