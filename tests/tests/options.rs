//! The recording options users change, each run end to end with a value that is not its default,
//! asserting what the profile holds: the raw sample stream and its ring size, kernel stacks left
//! out, several events at high rates over a long run with deep stacks and resized maps, the
//! Oracle-style counter aliases, and the map memory `--stats` projects to a large host.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{
    assert_few_cut_short, assert_only_partial_stacks, core_pmu, profiler, profiler_bin, temp_dir,
    touched_region, workload,
};
use profiler::aggregate::functions::event_samples;
use profiler::profile::{file::read_profile, Profile};

/// `profiler record ARGS -o DIR/run.prof -- COMMAND...`, read back.
fn record(dir: &Path, args: &[&str], command: &[&str]) -> (Profile, String) {
    let file = dir.join("run.prof");
    let mut all = vec!["record"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", file.to_str().unwrap(), "--"]);
    all.extend_from_slice(command);
    let output = profiler(&all);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (read_profile(&file).unwrap(), stderr)
}

/// The `--raw` lines as JSON values.
fn raw_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

fn hex(value: &serde_json::Value) -> u64 {
    u64::from_str_radix(value.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn raw_stream_holds_every_sample_with_its_data_address() {
    let dir = temp_dir("raw-stream");
    let raw = dir.join("samples.jsonl");
    let toucher = workload("page_toucher");
    let (profile, stderr) = record(
        &dir,
        &[
            "-e",
            "page-faults/period=7/",
            "--raw",
            raw.to_str().unwrap(),
            "--ring-buffer-kib",
            "8192",
        ],
        &[toucher.to_str().unwrap(), "20000", "9"],
    );
    // Every 7th page fault of a short program: its start-up in the dynamic loader is a large
    // share, and stacks walked there may be cut short; the samples must all be kept.
    assert_only_partial_stacks(&profile, &[]);
    let lines = raw_lines(&raw);
    let fired = profile.losses.samples_fired[0];
    assert_eq!(lines.len() as u64, fired, "one raw line per fired sample");
    // Every 7th of the 20,000 region faults, each at line 9 of its page.
    let (start, pages, line) = touched_region(&stderr);
    let in_region: Vec<u64> = lines
        .iter()
        .map(|l| hex(&l["addr"]))
        .filter(|addr| (start..start + pages * 4096).contains(addr))
        .collect();
    assert!(
        (in_region.len() as i64 - 20000 / 7).abs() <= 2,
        "{} region samples, expected about {}",
        in_region.len(),
        20000 / 7
    );
    assert!(in_region
        .iter()
        .all(|addr| (addr - start) % 4096 == line * 64));
    let pid = profile.stacks[0].pid;
    assert!(lines.iter().all(|l| l["event"] == 0 && l["pid"] == pid));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_small_raw_ring_counts_every_sample_it_drops() {
    // One page of ring for a sample on every fault: whatever the ring could not hold is
    // counted, so lines written + drops = samples fired.
    let dir = temp_dir("raw-small-ring");
    let raw = dir.join("samples.jsonl");
    let toucher = workload("page_toucher");
    let (profile, _) = record(
        &dir,
        &[
            "-e",
            "page-faults",
            "-c",
            "1",
            "--raw",
            raw.to_str().unwrap(),
            "--ring-buffer-kib",
            "4",
        ],
        &[toucher.to_str().unwrap(), "50000"],
    );
    let dropped = profile.losses.counters["raw stream: ring buffer full"];
    let written = raw_lines(&raw).len() as u64;
    let fired = profile.losses.samples_fired[0];
    assert_eq!(
        written + dropped,
        fired,
        "{written} written, {dropped} dropped"
    );
    eprintln!("a 4 KiB raw ring: {written} samples written, {dropped} dropped, {fired} fired");
    assert!(
        dropped > 0,
        "a one-page ring cannot keep up with a sample per fault"
    );
    // The aggregated views lose nothing to the stream's drops.
    assert_eq!(event_samples(&profile, 0), fired);
    std::fs::remove_dir_all(dir).ok();
}

/// How many stacks of `profile` have kernel frames, and how many samples there are.
fn kernel_stack_share(profile: &Profile) -> (u64, u64) {
    let with_kernel = profile
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| profile.frames[*f as usize].kernel))
        .map(|s| s.count)
        .sum();
    (with_kernel, profile.stacks.iter().map(|s| s.count).sum())
}

#[test]
fn kernel_stacks_are_left_out_when_asked() {
    // Pipe round trips spend most of their time in the kernel.
    let dir = temp_dir("no-kernel-stacks");
    let events = workload("known_events");
    let command = [events.to_str().unwrap(), "pipe-round-trips", "30000"];
    let (with, _) = record(&dir, &["-e", "cpu-clock/freq=20000/"], &command);
    let (with_kernel, total) = kernel_stack_share(&with);
    eprintln!("{with_kernel} of {total} samples in the kernel");
    assert!(
        with_kernel * 2 > total,
        "{with_kernel} of {total} samples in the kernel"
    );
    let (without, _) = record(
        &dir,
        &["-e", "cpu-clock/freq=20000/", "--no-kernel-stacks"],
        &command,
    );
    let (kernel_frames, total) = kernel_stack_share(&without);
    // A sample taken in the kernel keeps its IP, but no kernel callers.
    let deeper_kernel = without
        .stacks
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .filter(|f| without.frames[**f as usize].kernel)
                .count()
                > 1
        })
        .count();
    assert_eq!(deeper_kernel, 0, "kernel callers with --no-kernel-stacks");
    assert!(total > 1000, "{total} samples");
    assert!(kernel_frames <= total);
    assert_few_cut_short(&without, &[]);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn four_events_at_high_rates_over_a_long_run_with_deep_stacks_and_resized_maps() {
    let dir = temp_dir("four-events");
    let deep = workload("deep_stack");
    let (profile, stderr) = record(
        &dir,
        &[
            "-e",
            "cpu-clock/freq=20000/,page-faults/period=3/,context-switches/period=2/,task-clock,1000000",
            "--stack-map-entries",
            "65536",
            "--map-entries",
            "8192",
            "--latency-map-entries",
            "16",
            "--drain-interval",
            "200",
            "--stats",
        ],
        &[deep.to_str().unwrap(), "50000"],
    );
    assert_eq!(profile.events.len(), 4);
    assert_few_cut_short(&profile, &[]);
    for (index, event) in profile.events.iter().enumerate() {
        let fired = profile.losses.samples_fired[index];
        assert_eq!(
            event_samples(&profile, index as u32),
            fired,
            "{}: every fired sample drained",
            event.name
        );
        if event.name != "context-switches" {
            assert!(fired > 0, "{} took no samples", event.name);
        }
    }
    // 20 kHz of CPU time and 1 kHz of task time (every 1,000,000 ns): 20 to 1.
    let (clock, task) = (
        profile.losses.samples_fired[0] as f64,
        profile.losses.samples_fired[3] as f64,
    );
    assert!(
        (clock / task - 20.0).abs() < 2.0,
        "cpu-clock {clock} vs task-clock {task} samples"
    );
    assert!(task > 2500.0, "a run of over 2.5 s of CPU time: {task} ms");
    // Deep stacks whole: nearly every cpu-clock sample in the leaf has all 60 frames.
    let name = |frame: &u32| profile.frames[*frame as usize].display_name();
    let (mut leaf, mut whole) = (0, 0);
    for stack in profile.stacks.iter().filter(|s| s.event == 0) {
        if stack.frames.first().map(name).as_deref() != Some("deep_stack::leaf_work") {
            continue;
        }
        leaf += stack.count;
        let names: Vec<String> = stack.frames.iter().map(name).collect();
        if (1..=60).all(|n| names.contains(&format!("deep_stack::frame_{n:02}"))) {
            whole += stack.count;
        }
    }
    assert!(leaf > 10_000, "{leaf} leaf samples");
    assert!(
        whole * 100 >= leaf * 99,
        "{whole} of {leaf} leaf stacks whole"
    );
    // A long run drains many times.
    let drains: u32 = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("drains: "))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no drain count in --stats:\n{stderr}"));
    assert!(drains >= 10, "{drains} drains");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn oracle_aliases_resolve_to_cache_miss_counters_with_prime_overflows() {
    let listing: serde_json::Value =
        serde_json::from_slice(&profiler(&["list", "--json"]).stdout).unwrap();
    let entries: BTreeMap<String, serde_json::Value> = listing["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|section| section["entries"].as_array().unwrap().clone())
        .map(|entry| (entry["name"].as_str().unwrap().to_string(), entry))
        .collect();
    for alias in ["icm", "dcrm"] {
        let entry = entries
            .get(alias)
            .unwrap_or_else(|| panic!("{alias} is not listed"));
        assert_eq!(
            entry["default_overflow"]["period"], 100003,
            "{alias}: {entry}"
        );
        assert!(entry["event"].as_str().unwrap().ends_with("-load-misses"));
    }
    let dir = temp_dir("aliases");
    let split = workload("cpu_split");
    match core_pmu() {
        Some(_) => {
            let (profile, _) = record(
                &dir,
                &["-e", "icm,dcrm/period=10007/"],
                &[split.to_str().unwrap(), "300"],
            );
            let periods: Vec<Option<u64>> = profile.events.iter().map(|e| e.period).collect();
            assert_eq!(periods, [Some(100003), Some(10007)]);
            assert!(profile.losses.samples_fired.iter().all(|n| *n > 0));
        }
        None => {
            let output = Command::new(profiler_bin())
                .args(["record", "-e", "icm,dcrm", "--"])
                .arg(&split)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success());
            assert!(
                stderr.contains("'icm'") && stderr.contains("no hardware PMU"),
                "{stderr}"
            );
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

/// `map memory: L MiB locked, P MiB of it per CPU (H MiB on a 128-CPU host with these sizes)`,
/// or `... with the default sample maps of N entries there)`, as (L, P, H, N) in MiB.
fn map_memory(stderr: &str) -> (f64, f64, f64, Option<u64>) {
    let line = stderr
        .lines()
        .find_map(|line| line.trim().strip_prefix("map memory: "))
        .unwrap_or_else(|| panic!("no map memory line: {stderr}"));
    let numbers: Vec<f64> = line
        .split([' ', '('])
        .filter_map(|word| word.parse().ok())
        .collect();
    match numbers[..] {
        [locked, per_cpu, host] if line.ends_with("on a 128-CPU host with these sizes)") => {
            (locked, per_cpu, host, None)
        }
        [locked, per_cpu, host, entries] if line.ends_with("entries there)") => {
            (locked, per_cpu, host, Some(entries as u64))
        }
        _ => panic!("unexpected map memory line: {line}"),
    }
}

/// CPUs in a sysfs CPU list (`0-3,8`).
fn cpu_count(list: &str) -> u64 {
    std::fs::read_to_string(list)
        .unwrap()
        .trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((first, last)) => last.parse::<u64>().unwrap() - first.parse::<u64>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

#[test]
fn sample_maps_are_sized_to_the_rate_and_stats_say_what_they_lock_on_a_large_host() {
    // Per generation, a stack count (8 bytes) and an instruction's statistics (32 bytes) per
    // entry and CPU; the data-line (32) and data-source (8) maps only for events that record
    // data addresses; small per-CPU scratch besides.
    let dir = temp_dir("map-memory");
    let online = cpu_count("/sys/devices/system/cpu/online");
    let possible = cpu_count("/sys/devices/system/cpu/possible");
    // By default the sample maps hold twice the samples of a drain interval on every online
    // CPU, in thousands of 1,024, from 1,024 to 16,384, and 64 MiB of per-CPU values at most
    // on the possible CPUs.
    let default_entries = |per_cpu_per_drain: Option<u64>, bytes: u64, online: u64, possible| {
        let wanted = per_cpu_per_drain.map_or(16384, |n| (2 * n * online).div_ceil(1024) * 1024);
        let affordable = (64 << 20) / (2 * bytes * possible) / 1024 * 1024;
        wanted.min(affordable).clamp(1024, 16384)
    };
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    // (args, samples per CPU and drain, bytes per entry, --map-entries)
    for (args, per_drain, bytes_per_entry, given) in [
        // cpu-clock at its default 997 Hz, drained every second.
        (&[][..], Some(997), 40, None),
        // At 20 kHz drained every 100 ms: the same, a tenth of the samples per drain each.
        (
            &["-F", "20000", "--drain-interval", "100"][..],
            Some(2000),
            40,
            None,
        ),
        // Sampled by period: the rate is unknown.
        (&["-c", "10000000"][..], None, 40, None),
        (&["--map-entries", "1024"][..], Some(997), 40, Some(1024)),
        // Page faults record the faulting address: the data maps too.
        (&["-e", "page-faults"][..], None, 80, None),
    ] {
        let mut all = vec!["--stats", "--unwind", "fp"];
        all.extend_from_slice(args);
        let (locked, per_cpu, host, host_entries) = map_memory(&record(&dir, &all, &["true"]).1);
        let entries =
            given.unwrap_or_else(|| default_entries(per_drain, bytes_per_entry, online, possible));
        let values = mib(2 * entries * bytes_per_entry);
        assert!(
            per_cpu >= values - 0.005 && per_cpu < values + 0.05,
            "{args:?}: {per_cpu} MiB per CPU, the maps' values of {entries} entries are {values}"
        );
        // On the large host: these per-CPU values on 128 CPUs, and the sample maps at the
        // entries the defaults pick there (unless given).
        let expected_host_entries = given
            .is_none()
            .then(|| default_entries(per_drain, bytes_per_entry, 128, 128));
        assert_eq!(host_entries, expected_host_entries, "{args:?}");
        let resized = host_entries.unwrap_or(entries) as f64 - entries as f64;
        // And the stack-frames map at twice the sample maps' entries, from 2,048 to 32,768:
        // 1,096 bytes an entry, on no CPU in particular.
        let frames = |entries: u64| (2 * entries).clamp(2048, 32768) as f64;
        let frames_resized = frames(host_entries.unwrap_or(entries)) - frames(entries);
        let projected = locked
            + (128 - possible) as f64 * per_cpu
            + mib(2 * bytes_per_entry * 128) * resized
            + mib(1096) * frames_resized;
        // Printed rounded: the projection within a MiB of the figures it comes from.
        assert!(
            (host - projected).abs() < 1.0 + 128.0 * 0.005,
            "{args:?}: {host} MiB on 128 CPUs, {projected} from {locked} locked and {per_cpu} \
             per CPU on {possible}, {host_entries:?} sample map entries there"
        );
    }
}
