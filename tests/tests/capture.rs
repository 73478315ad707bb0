//! In-kernel capture on the real kernel: data addresses, conservation of samples, cgroup scope,
//! reported losses, content-addressed stacks kept whole and read once.

mod common;

use std::{
    collections::BTreeSet,
    process::Command,
    sync::{RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use common::{
    assert_few_cut_short, assert_no_losses, assert_only_partial_stacks, profiler, profiler_bin,
    record_page_faults, second_touched_region, temp_dir, touched_region, wait_until_recording,
    workload, Running,
};
use profiler::profile::{file::read_profile, Profile, StackSample};
use profiler_common::capture::LossKind;

const PAGE: u64 = 4096;

/// The CPUs, shared by the tests of this file that run in parallel; the two that measure
/// whether drains keep up take them alone: on two CPUs, another test's workload keeps the
/// recorder from draining for longer than their maps take to fill (about 10 ms).
static CPUS: RwLock<()> = RwLock::new(());

fn cpus_shared() -> RwLockReadGuard<'static, ()> {
    CPUS.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn cpus_alone() -> RwLockWriteGuard<'static, ()> {
    CPUS.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Offsets inside the region of the data lines the profile attributes page faults to.
fn sampled_line_offsets(profile: &Profile, region: (u64, u64, u64)) -> Vec<(u64, u64)> {
    let (start, pages, _) = region;
    let end = start + pages * PAGE;
    let mut lines: Vec<(u64, u64)> = profile
        .data_lines
        .iter()
        .filter(|d| (start..end).contains(&d.line))
        .map(|d| (d.line - start, d.stats.count))
        .collect();
    lines.sort_unstable();
    lines
}

#[test]
fn page_faults_land_on_exactly_the_touched_cache_lines() {
    let _cpus = cpus_shared();
    let dir = temp_dir("faults");
    let file = dir.join("faults.prof");
    let output = record_page_faults(&file, &[], &["3000", "7"]);
    let toucher = workload("page_toucher");
    let region = touched_region(&String::from_utf8_lossy(&output.stderr));
    assert_eq!((region.1, region.2), (3000, 7));
    let profile = read_profile(&file).unwrap();
    let lines = sampled_line_offsets(&profile, region);
    // One fault per page, each on line 7 of its page: nothing else, nothing missing.
    let expected: Vec<(u64, u64)> = (0..3000).map(|page| (page * PAGE + 7 * 64, 1)).collect();
    assert_eq!(lines.len(), expected.len());
    assert_eq!(lines, expected);
    // The instruction that faulted is touch_pages.
    let touch = profile
        .data_lines
        .iter()
        .filter(|d| (region.0..region.0 + 3000 * PAGE).contains(&d.line))
        .map(|d| profile.frames[d.frame as usize].display_name())
        .collect::<BTreeSet<_>>();
    assert_eq!(
        touch,
        BTreeSet::from(["page_toucher::touch_pages".to_string()])
    );

    // perf, on the same workload, sees the same offsets.
    let perf_data = dir.join("perf.data");
    let perf = Command::new("perf")
        .args(["record", "-q", "-e", "page-faults", "-c", "1", "-d", "-o"])
        .arg(&perf_data)
        .arg("--")
        .arg(&toucher)
        .args(["3000", "7"])
        .output()
        .expect("perf is installed (cargo xtask setup installs linux-perf)");
    assert!(
        perf.status.success(),
        "{}",
        String::from_utf8_lossy(&perf.stderr)
    );
    let perf_region = touched_region(&String::from_utf8_lossy(&perf.stderr));
    let script = Command::new("perf")
        .args(["script", "-F", "addr", "-i"])
        .arg(&perf_data)
        .output()
        .unwrap();
    let mut perf_offsets: Vec<u64> = String::from_utf8_lossy(&script.stdout)
        .lines()
        .filter_map(|l| u64::from_str_radix(l.trim(), 16).ok())
        .filter(|a| (perf_region.0..perf_region.0 + 3000 * PAGE).contains(a))
        .map(|a| (a & !63) - perf_region.0)
        .collect();
    perf_offsets.sort_unstable();
    let ours: Vec<u64> = lines.iter().map(|(offset, _)| *offset).collect();
    assert_eq!(
        ours, perf_offsets,
        "perf record -d disagrees on the faulting lines"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// (program runs the kernel counted, samples fired) from `--stats` on stderr.
fn kernel_runs(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("ns per sample over"))
        .unwrap_or_else(|| panic!("no --stats output:\n{stderr}"));
    line.split("over ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn assert_conserved(args: &[&str], minimum: u64) {
    let dir = temp_dir("conservation");
    let file = dir.join("c.prof");
    let mut all = vec![
        "record",
        "--stats",
        "--drain-interval",
        "20",
        "-o",
        file.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let output = profiler(&all);
    let profile = read_profile(&file).unwrap();
    let fired: u64 = profile.losses.samples_fired.iter().sum();
    let drained: u64 = profile.stacks.iter().map(|s| s.count).sum();
    let lost = profile.losses.counters["samples lost: stack-count map full"]
        + profile.losses.counters["samples lost: unregistered perf event"];
    assert!(
        fired >= minimum,
        "only {fired} samples fired, expected at least {minimum}"
    );
    assert_eq!(
        fired,
        drained + lost,
        "fired {fired} != drained {drained} + lost {lost}"
    );
    // The kernel's own count of program runs: every run is a fired sample.
    let runs = kernel_runs(&String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        runs, fired,
        "the kernel ran the program {runs} times, {fired} counted"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn conservation_at_10_khz_cpu_clock() {
    let _cpus = cpus_shared();
    let cpu_split = workload("cpu_split");
    assert_conserved(
        &[
            "-e",
            "cpu-clock",
            "-F",
            "10000",
            "--",
            cpu_split.to_str().unwrap(),
        ],
        5000,
    );
}

#[test]
fn conservation_at_period_1_page_faults() {
    let _cpus = cpus_shared();
    let toucher = workload("page_toucher");
    assert_conserved(
        &[
            "-e",
            "page-faults",
            "-c",
            "1",
            "--",
            toucher.to_str().unwrap(),
            "50000",
        ],
        50000,
    );
}

/// The numbers on the `record --stats` line that starts with `label`.
fn stats_numbers(stderr: &str, label: &str) -> Vec<u64> {
    let line = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` line in --stats:\n{stderr}"));
    line.split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect()
}

#[test]
fn tens_of_thousands_of_distinct_stacks_at_50_khz_lose_under_a_thousandth() {
    const STACK_MAP_ENTRIES: u64 = 4096;
    let _cpus = cpus_alone();
    // Every child of short_processes maps its code at other addresses (ASLR), so nearly every
    // sample is a new stack: far more than the 4,096 the stack-frames map holds here (an
    // eighth of the default), which must be taken into the agent's cache over and over while
    // samples keep coming. Stack-map bucket collisions lost 27% of these stacks before stacks
    // were content-addressed. The map fills in about 40 ms here, so an agent kept off both
    // CPUs that long by the children loses stacks; the bound is a thousandth, each
    // loss counted by cause and its sample kept. (With 1,024 entries, filled in 10 ms, CI's
    // scheduling lost 6, 992 and 505 of about 200,000 in three runs of many.)
    let dir = temp_dir("distinct-stacks");
    let file = dir.join("stacks.prof");
    let children = workload("short_processes");
    let output = profiler(&[
        "record",
        "-F",
        "50000",
        "--stack-map-entries",
        &STACK_MAP_ENTRIES.to_string(),
        "--stats",
        "-o",
        file.to_str().unwrap(),
        "--",
        children.to_str().unwrap(),
        "300",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let profile = read_profile(&file).unwrap();
    let map_full = [
        LossKind::UserStackFramesFull.describe(),
        LossKind::KernelStackFramesFull.describe(),
    ];
    // Every child's first moments are walked before its mappings are published: cut short,
    // counted (issue 46); what this test bounds is the stack maps' losses.
    let cut_short = [
        LossKind::UnwindOutsideCode.describe(),
        LossKind::UnwindBroken.describe(),
        LossKind::UnwindTooDeep.describe(),
        LossKind::UnwindProcessNotLoaded.describe(),
    ];
    let explained: Vec<&str> = map_full.iter().chain(&cut_short).copied().collect();
    assert_no_losses(&profile, &explained);
    let fired: u64 = profile.losses.samples_fired.iter().sum();
    let drained: u64 = profile.stacks.iter().map(|s| s.count).sum();
    assert_eq!(fired, drained, "fired == kept");
    let counted: u64 = map_full
        .iter()
        .filter_map(|kind| profile.losses.counters.get(*kind))
        .sum();
    let stack_lost = |lost: fn(&StackSample) -> bool| -> u64 {
        profile
            .stacks
            .iter()
            .filter(|s| lost(s))
            .map(|s| s.count)
            .sum()
    };
    let lost = stack_lost(|s| s.user_stack_lost) + stack_lost(|s| s.kernel_stack_lost);
    assert_eq!(lost, counted, "every stack lost is counted by cause");
    assert!(lost * 1000 < fired, "{lost} of {fired} stacks lost");
    let distinct = stats_numbers(&stderr, "stacks: ")[0];
    assert!(
        distinct > 4 * STACK_MAP_ENTRIES,
        "only {distinct} distinct stacks:\n{stderr}"
    );
    // The stacks are those of the children: samples of well over a hundred of them carry user
    // frames.
    let children_pids: BTreeSet<u32> = profile
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| !profile.frames[*f as usize].kernel))
        .map(|s| s.pid)
        .collect();
    assert!(
        children_pids.len() > 100,
        "{} processes",
        children_pids.len()
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_stack_seen_again_is_not_read_again() {
    let _cpus = cpus_shared();
    // deep_stack repeats a few stacks for a second; 100 drains each see them again. The drain
    // reads a stack only when its hash is new to the agent's cache.
    let dir = temp_dir("stacks-once");
    let file = dir.join("deep.prof");
    let deep = workload("deep_stack");
    let output = profiler(&[
        "record",
        "-F",
        "10000",
        "--drain-interval",
        "10",
        "--stats",
        "-o",
        file.to_str().unwrap(),
        "--",
        deep.to_str().unwrap(),
        "10000",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let profile = read_profile(&file).unwrap();
    assert_few_cut_short(&profile, &[]);
    let drains = stats_numbers(&stderr, "drains: ")[0];
    assert!(drains > 20, "{drains} drains\n{stderr}");
    let [distinct, read] = stats_numbers(&stderr, "stacks: ")[..] else {
        panic!("no stack counts in --stats:\n{stderr}");
    };
    let in_profile: BTreeSet<&Vec<u32>> = profile.stacks.iter().map(|s| &s.frames).collect();
    assert!(distinct >= 2 && in_profile.len() >= 2, "{stderr}");
    assert!(
        read <= distinct + distinct / 2,
        "{read} stacks read for {distinct} distinct over {drains} drains"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_tiny_stack_map_reports_its_losses() {
    let _cpus = cpus_shared();
    let dir = temp_dir("tiny");
    let file = dir.join("tiny.prof");
    profiler(&[
        "record",
        "-F",
        "4999",
        "--stack-map-entries",
        "2",
        "-o",
        file.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        "for i in $(seq 300); do ls -R /usr/share/doc > /dev/null; done",
    ]);
    let profile = read_profile(&file).unwrap();
    let stack_losses: u64 = profile
        .losses
        .counters
        .iter()
        .filter(|(what, _)| what.contains("stacks lost"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        stack_losses > 0,
        "no stack losses reported: {:?}",
        profile.losses.counters
    );
    let marked = profile
        .stacks
        .iter()
        .filter(|s| s.user_stack_lost || s.kernel_stack_lost)
        .count();
    assert!(marked > 0, "no sample is marked as having lost its stack");
    // Samples whose stacks were lost are still counted.
    let fired: u64 = profile.losses.samples_fired.iter().sum();
    let drained: u64 = profile.stacks.iter().map(|s| s.count).sum();
    assert_eq!(fired, drained);
    std::fs::remove_dir_all(dir).ok();
}

/// User + system CPU time of a process, in clock ticks (/proc/PID/stat fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The cgroup v2 mount (hybrid layouts mount it at /sys/fs/cgroup/unified).
fn cgroup2_mount() -> std::path::PathBuf {
    profiler::scope::cgroup::cgroup2_mount().expect("cgroup v2 is mounted")
}

#[test]
fn a_cgroup_scoped_run_sees_only_that_cgroup() {
    let _cpus = cpus_shared();
    // Named like a docker scope, so the run also shows container attribution.
    let container_id = format!("{:0>64x}", 0xc0ffee_u64 + u64::from(std::process::id()));
    let parent = cgroup2_mount().join(format!("profiler-test-{}", std::process::id()));
    let cgroup = parent.join(format!("docker-{container_id}.scope"));
    std::fs::create_dir_all(&cgroup).unwrap();
    let cpu_split = workload("cpu_split");
    // One cpu_split inside the cgroup, one outside, both running during the recording.
    let mut inside = Running::spawn(
        Command::new("/bin/sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {} 12000",
                cgroup.display(),
                cpu_split.display()
            ))
            .stderr(std::process::Stdio::null()),
    );
    let mut outside = Running::spawn(
        Command::new(&cpu_split)
            .arg("12000")
            .stderr(std::process::Stdio::null()),
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let outside_cpu_before = cpu_ticks(outside.id());
    let dir = temp_dir("cgroup");
    let file = dir.join("cg.prof");
    profiler(&[
        "record",
        "--cgroup",
        cgroup.to_str().unwrap(),
        "--duration",
        "1.5",
        "-o",
        file.to_str().unwrap(),
    ]);
    let profile = read_profile(&file).unwrap();
    let outside_ran = cpu_ticks(outside.id()) - outside_cpu_before;
    inside.stop();
    outside.stop();
    std::fs::remove_dir(&cgroup).ok();
    std::fs::remove_dir(&parent).ok();
    let pids: BTreeSet<u32> = profile.stacks.iter().map(|s| s.pid).collect();
    assert_eq!(
        pids,
        BTreeSet::from([inside.id()]),
        "samples from outside the cgroup (outside pid {})",
        outside.id()
    );
    let samples: u64 = profile.stacks.iter().map(|s| s.count).sum();
    // The machine may be busy: what matters is that the cgroup's process was seen and the
    // outside one, which ran meanwhile, was not.
    assert!(
        samples > 20,
        "too few samples from the cgroup's busy process: {samples}"
    );
    assert!(
        outside_ran > 0,
        "the outside process did not run during the recording"
    );
    let containers: BTreeSet<Option<String>> = profile
        .threads
        .iter()
        .map(|t| t.container.clone())
        .collect();
    let container = format!("docker:{}", &container_id[..12]);
    assert_eq!(containers, BTreeSet::from([Some(container.clone())]));
    // The container and process views break the samples down the same way.
    let by = |view: &str| -> serde_json::Value {
        let output = profiler(&[
            "report",
            "-i",
            file.to_str().unwrap(),
            "--json",
            "--by",
            view,
        ]);
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let containers = by("container");
    let rows = containers["events"][0]["containers"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["container"], container.as_str());
    assert_eq!(rows[0]["samples"], samples);
    let processes = by("process");
    let rows = processes["events"][0]["processes"].as_array().unwrap();
    assert_eq!(rows[0]["pid"], inside.id());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn without_btf_it_captures_ips_and_stacks_and_says_what_is_missing() {
    let _cpus = cpus_shared();
    let dir = temp_dir("nobtf");
    let file = dir.join("nobtf.prof");
    let output = record_page_faults(&file, &["--btf", "/nonexistent/vmlinux"], &["500"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("kernel BTF not found at /nonexistent/vmlinux")
            && stderr.contains("IPs and stacks only"),
        "{stderr}"
    );
    let profile = read_profile(&file).unwrap();
    let touch: u64 = profile
        .stacks
        .iter()
        .filter(|s| {
            s.frames.first().is_some_and(|leaf| {
                profile.frames[*leaf as usize].display_name() == "page_toucher::touch_pages"
            })
        })
        .map(|s| s.count)
        .sum();
    assert_eq!(touch, 500, "one sample per touched page, with its stack");
    assert!(
        profile.data_lines.is_empty(),
        "no data addresses without BTF offsets"
    );

    // Several events need the event ids that only BTF offsets give: a clear refusal.
    let refused = Command::new(common::profiler_bin())
        .args([
            "record",
            "--btf",
            "/nonexistent/vmlinux",
            "-e",
            "cpu-clock,page-faults",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr)
        .contains("several events at once needs kernel BTF"));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn several_pids_are_profiled_together() {
    let _cpus = cpus_shared();
    let cpu_split = workload("cpu_split");
    let mut first = Running::spawn(
        Command::new(&cpu_split)
            .arg("12000")
            .stderr(std::process::Stdio::null()),
    );
    let mut second = Running::spawn(
        Command::new(&cpu_split)
            .arg("12000")
            .stderr(std::process::Stdio::null()),
    );
    let pids = format!("{},{}", first.id(), second.id());
    let dir = temp_dir("pids");
    let file = dir.join("pids.prof");
    profiler(&[
        "record",
        "-p",
        &pids,
        "--duration",
        "1",
        "-o",
        file.to_str().unwrap(),
    ]);
    first.stop();
    second.stop();
    let profile = read_profile(&file).unwrap();
    let seen: BTreeSet<u32> = profile.stacks.iter().map(|s| s.pid).collect();
    assert_eq!(seen, BTreeSet::from([first.id(), second.id()]));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_filling_map_is_drained_early_instead_of_losing_samples() {
    let _cpus = cpus_alone();
    // Small maps and a drain interval longer than the run: only drains triggered by the maps
    // filling up can keep every sample of many short-lived processes.
    let dir = temp_dir("early");
    let file = dir.join("early.prof");
    let churn = workload("short_processes");
    let output = profiler(&[
        "record",
        "--stats",
        "-F",
        "10000",
        "--map-entries",
        "2048",
        "--drain-interval",
        "10000",
        "-o",
        file.to_str().unwrap(),
        "--",
        churn.to_str().unwrap(),
        "600",
    ]);
    let profile = read_profile(&file).unwrap();
    let fired: u64 = profile.losses.samples_fired.iter().sum();
    let drained: u64 = profile.stacks.iter().map(|s| s.count).sum();
    assert_eq!(
        profile.losses.counters["samples lost: stack-count map full"],
        0
    );
    assert_eq!(fired, drained);
    assert!(
        profile.stacks.len() > 2048,
        "the run must create more stack keys ({}) than the map holds",
        profile.stacks.len()
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let drains = stats_numbers(&stderr, "drains: ")[0];
    assert!(drains > 2, "only the final drains ran: {drains}\n{stderr}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn every_data_line_of_a_large_run_is_kept_whatever_the_map_size() {
    let _cpus = cpus_shared();
    // 100,000 distinct data lines in one function, then 1,000 in another: more new keys than
    // the data-line map holds, faster than timer drains come. With maps of the default size and
    // half of it, every line must reach the view. The larger a map, the longer a stall of the
    // draining thread it outlasts: with a quarter of the default, a stall of a few milliseconds
    // on a shared host lets this loop of page faults fill it (CI once lost 264 of 100,000
    // lines), so there every line must reach the view or be counted lost.
    for map_entries in ["16384", "8192", "4096"] {
        let lossless = map_entries != "4096";
        let dir = temp_dir("large-dataspace");
        let file = dir.join("lines.prof");
        let output = record_page_faults(
            &file,
            &["--map-entries", map_entries, "--drain-interval", "10000"],
            &["100000", "5", "1000"],
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        let profile = read_profile(&file).unwrap();
        let view_full = "data cache-line view: map full";
        let explained = if lossless { vec![] } else { vec![view_full] };
        // Data lines are this test's subject: stacks cut short keep their samples (one run in
        // several cuts ~1% of these page-fault stacks short, issue 46's to make whole).
        assert_only_partial_stacks(&profile, &explained);
        let counted_lost = profile.losses.counters.get(view_full).copied().unwrap_or(0);
        let mut missing = 0;
        for region in [touched_region(&stderr), second_touched_region(&stderr)] {
            let (_, pages, line) = region;
            let expected: Vec<(u64, u64)> = (0..pages)
                .map(|page| (page * PAGE + line * 64, 1))
                .collect();
            let sampled = sampled_line_offsets(&profile, region);
            if lossless {
                assert_eq!(
                    sampled.len(),
                    expected.len(),
                    "--map-entries {map_entries}: data lines of the {pages}-page region"
                );
                assert_eq!(sampled, expected, "--map-entries {map_entries}");
            } else {
                assert!(
                    sampled.iter().all(|&(offset, count)| count == 1
                        && offset % PAGE == line * 64
                        && offset / PAGE < pages),
                    "--map-entries {map_entries}: a line that was not touched"
                );
                missing += expected.len() - sampled.len();
            }
        }
        assert!(
            missing as u64 <= counted_lost,
            "--map-entries {map_entries}: {missing} lines missing, {counted_lost} counted lost"
        );
        let fired: u64 = profile.losses.samples_fired.iter().sum();
        let drained: u64 = profile.stacks.iter().map(|s| s.count).sum();
        assert_eq!(fired, drained, "--map-entries {map_entries}");
        std::fs::remove_dir_all(dir).ok();
    }
}

#[test]
fn perf_recording_beside_a_system_wide_capture_gets_intact_mapping_records() {
    // The kernel reports a new mapping to every session with one shared record header: when
    // one session asks for build IDs in those records, the others' records carried its mark
    // over their device and inode numbers, and perf 6.1 overflowed its stack on them.
    let _cpus = cpus_shared();
    let dir = temp_dir("beside_perf");
    let mut capture = Running::spawn(
        Command::new(profiler_bin())
            .args(["record", "-a", "--duration", "60", "-o"])
            .arg(dir.join("system.prof"))
            .stderr(std::process::Stdio::null()),
    );
    wait_until_recording(capture.id());
    let perf_data = dir.join("perf.data");
    let recorded = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-o"])
        .arg(&perf_data)
        .arg("--")
        .arg(workload("cpu_split"))
        .arg("200")
        .output()
        .expect("perf runs (Debian: linux-perf)");
    capture.signal(libc::SIGINT);
    assert!(capture
        .wait_at_most(std::time::Duration::from_secs(60))
        .success());
    assert!(
        recorded.status.success(),
        "perf record beside the profiler: {}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let script = Command::new("perf")
        .args(["script", "--show-mmap-events", "-i"])
        .arg(&perf_data)
        .output()
        .unwrap();
    assert!(script.status.success());
    let script = String::from_utf8_lossy(&script.stdout);
    // `... @ 0x2000 fe:01 1234 0]: r-xp /path/cpu_split`: the file's device and inode, as
    // perf asked, not a build ID (`<hex>`).
    let code = script
        .lines()
        .find(|line| {
            line.contains("PERF_RECORD_MMAP2")
                && line.contains("r-xp")
                && line.ends_with("cpu_split")
        })
        .unwrap_or_else(|| panic!("no mapping of cpu_split's code in\n{script}"));
    let before_protection = code.rsplit_once("]:").unwrap().0;
    let fields: Vec<&str> = before_protection.split_whitespace().rev().take(3).collect();
    let [_, inode, device] = fields[..] else {
        panic!("{code}");
    };
    assert!(
        device.split(':').count() == 2 && inode.parse::<u64>().is_ok_and(|inode| inode > 0),
        "{code}"
    );
}
