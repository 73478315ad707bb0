//! Files recorded here by the real `perf record`, checked against what perf itself reads from
//! them (`perf report -D` record counts, `perf script` fields, `uname`). Needs perf and root
//! (or a permissive perf_event_paranoid); fails with the reason when perf is missing.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use super::*;

fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{program}`: {e}; these tests need perf (Debian: apt-get install \
                 linux-perf)"
            )
        });
    assert!(
        output.status.success(),
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(program: &str, args: &[&str]) -> String {
    String::from_utf8(run(program, args).stdout).expect("UTF-8 output")
}

/// Runs `perf record ARGS -o DIR/perf.data -- COMMAND`; returns the file's path.
fn record(dir: &Path, args: &[&str], command: &[&str]) -> String {
    let file = dir
        .join("perf.data")
        .to_str()
        .expect("UTF-8 path")
        .to_string();
    let mut full = vec!["record", "-q", "-o", &file];
    full.extend_from_slice(args);
    full.push("--");
    full.extend_from_slice(command);
    run("perf", &full);
    file
}

fn record_and_parse(dir: &Path, args: &[&str], command: &[&str]) -> (String, PerfData) {
    let file = record(dir, args, command);
    let parsed = read_perf_data(&file).unwrap_or_else(|e| panic!("{e}"));
    (file, parsed)
}

/// perf's own record counts from `perf report -D`'s "Aggregated stats": per record type name,
/// and SAMPLE records per event name.
struct PerfStats {
    records: BTreeMap<String, u64>,
    samples_per_event: BTreeMap<String, u64>,
}

fn perf_stats(file: &str) -> PerfStats {
    let dump = stdout("perf", &["report", "-D", "-i", file]);
    let stats = dump
        .split("Aggregated stats:")
        .nth(1)
        .expect("perf report -D prints aggregated stats");
    let mut records = BTreeMap::new();
    let mut samples_per_event = BTreeMap::new();
    let mut event = None;
    for line in stats.lines() {
        if let Some(name) = line.strip_suffix(" stats:") {
            event = Some(name.trim().to_string());
        } else if let Some((name, rest)) = line.split_once(" events:") {
            let count: u64 = rest.split_whitespace().next().unwrap().parse().unwrap();
            match &event {
                None => records.insert(name.trim().to_string(), count),
                Some(event) if name.trim() == "SAMPLE" => {
                    samples_per_event.insert(event.clone(), count)
                }
                Some(_) => None,
            };
        }
    }
    PerfStats {
        records,
        samples_per_event,
    }
}

/// Our count of the records perf names in its stats.
fn our_record_count(parsed: &PerfData, perf_name: &str) -> u64 {
    let skipped = |record_type: u32| parsed.skipped_records.get(&record_type).copied();
    let count = |n: usize| Some(n as u64);
    let mmaps = |mmap2: bool| {
        parsed
            .mmaps
            .iter()
            .filter(|m| m.prot.is_some() == mmap2)
            .count()
    };
    match perf_name {
        "TOTAL" => None,
        "SAMPLE" => Some(parsed.samples.len() as u64 + parsed.samples_with_unknown_id),
        "MMAP" => count(mmaps(false)),
        "MMAP2" => count(mmaps(true)),
        "COMM" => count(parsed.comms.len()),
        "FORK" => count(parsed.forks.len()),
        "EXIT" => count(parsed.exits.len()),
        "KSYMBOL" => skipped(17),
        "BPF_EVENT" => skipped(18),
        "FINISHED_ROUND" => skipped(68),
        "ID_INDEX" => skipped(69),
        "THREAD_MAP" => skipped(73),
        "CPU_MAP" => skipped(74),
        "EVENT_UPDATE" => skipped(78),
        "TIME_CONV" => skipped(79),
        "FINISHED_INIT" => skipped(82),
        other => panic!("perf counted {other} records, which this test does not map"),
    }
    .unwrap_or(0)
}

fn assert_record_counts_match_perf(file: &str, parsed: &PerfData) {
    let stats = perf_stats(file);
    for (name, &count) in &stats.records {
        if name != "TOTAL" {
            assert_eq!(our_record_count(parsed, name), count, "{name} records");
        }
    }
    let ours: BTreeMap<String, u64> = parsed
        .attrs
        .iter()
        .enumerate()
        .map(|(index, attr)| {
            let name = attr.name.clone().expect("EVENT_DESC names every event");
            let samples = parsed
                .samples
                .iter()
                .filter(|s| s.attr_index == index)
                .count();
            (name, samples as u64)
        })
        .filter(|(_, samples)| *samples > 0)
        .collect();
    assert_eq!(ours, stats.samples_per_event);
}

fn assert_host_matches_uname(parsed: &PerfData) {
    let uname = |flag| stdout("uname", &[flag]).trim().to_string();
    assert_eq!(parsed.features.hostname, Some(uname("-n")));
    assert_eq!(parsed.features.os_release, Some(uname("-r")));
    assert_eq!(parsed.features.arch, Some(uname("-m")));
}

#[test]
fn cpu_clock_with_callchains_matches_perf() {
    let dir = tempfile::tempdir().unwrap();
    let (file, parsed) = record_and_parse(
        dir.path(),
        &["-e", "cpu-clock", "-F", "999", "-g"],
        &[
            "dd",
            "if=/dev/zero",
            "of=/dev/null",
            "bs=1",
            "count=2000000",
        ],
    );

    assert_record_counts_match_perf(&file, &parsed);
    assert_host_matches_uname(&parsed);
    assert!(
        parsed.samples.len() > 100,
        "{} samples",
        parsed.samples.len()
    );
    let attr = &parsed.attrs[0];
    assert_eq!(attr.name.as_deref(), Some("cpu-clock"));
    assert_eq!(attr.sampling, Sampling::Frequency(999));
    assert!(attr.samples(PERF_SAMPLE_CALLCHAIN));
    // dd with 1-byte blocks lives in read/write syscalls: stacks cross into the kernel.
    let with_chain = parsed
        .samples
        .iter()
        .filter(|s| !s.callchain_kernel.is_empty() || !s.callchain_user.is_empty())
        .count();
    assert_eq!(with_chain, parsed.samples.len());
    let both = parsed
        .samples
        .iter()
        .filter(|s| !s.callchain_kernel.is_empty() && !s.callchain_user.is_empty())
        .count();
    assert!(
        both * 2 > parsed.samples.len(),
        "{both} of {} samples",
        parsed.samples.len()
    );
    for s in parsed
        .samples
        .iter()
        .filter(|s| s.cpumode == CpuMode::Kernel)
    {
        assert_eq!(s.callchain_kernel.first(), s.ip.as_ref());
    }
    assert!(parsed.comms.iter().any(|c| c.comm == "dd" && c.exec));
    assert!(parsed.mmaps.iter().any(|m| m.filename.ends_with("/dd")));
    assert!(parsed.features.cmdline.iter().any(|arg| arg == "cpu-clock"));
}

#[test]
fn page_faults_with_data_addresses_match_perf_script() {
    let dir = tempfile::tempdir().unwrap();
    let (file, parsed) = record_and_parse(
        dir.path(),
        &["-e", "page-faults", "-c", "1", "-d"],
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=4M", "count=4"],
    );

    assert_record_counts_match_perf(&file, &parsed);
    assert_eq!(parsed.attrs[0].name.as_deref(), Some("page-faults"));
    assert_eq!(parsed.attrs[0].sampling, Sampling::Period(1));
    // A 4 MiB buffer faults in at least a thousand 4 KiB pages.
    assert!(
        parsed.samples.len() >= 1000,
        "{} samples",
        parsed.samples.len()
    );
    let mut ours: Vec<u64> = parsed
        .samples
        .iter()
        .map(|s| s.addr.expect("-d records a data address"))
        .collect();
    let mut perfs: Vec<u64> = stdout("perf", &["script", "-i", &file, "-F", "addr"])
        .lines()
        .map(|line| u64::from_str_radix(line.trim(), 16).expect("hex address"))
        .collect();
    ours.sort_unstable();
    perfs.sort_unstable();
    assert_eq!(ours, perfs);
    assert!(
        parsed.mmaps.iter().any(|m| m.data),
        "-d records data mappings"
    );
}

#[test]
fn two_events_are_attributed_like_perf_does() {
    let dir = tempfile::tempdir().unwrap();
    let (file, parsed) = record_and_parse(
        dir.path(),
        &["-e", "cpu-clock,page-faults"],
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=1M", "count=64"],
    );

    assert_record_counts_match_perf(&file, &parsed);
    let names: Vec<_> = parsed.attrs.iter().map(|a| a.name.as_deref()).collect();
    assert_eq!(names, [Some("cpu-clock"), Some("page-faults")]);
    assert_eq!(parsed.samples_with_unknown_id, 0);
    for event in 0..2 {
        assert!(
            parsed.samples.iter().any(|s| s.attr_index == event),
            "event {event}"
        );
    }
}

#[test]
fn compressed_recordings_are_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let file = record(
        dir.path(),
        &["-z", "-e", "cpu-clock"],
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=100000"],
    );
    let err = read_perf_data(file).unwrap_err().to_string();
    assert!(err.contains("`perf record -z`"), "{err}");
    assert!(err.contains("record again without -z"), "{err}");
}

#[test]
fn frequency_sampled_imports_estimate_events_from_the_recorded_periods_as_perf_does() {
    use crate::aggregate::filter::EventScale;

    let dir = tempfile::tempdir().unwrap();
    let file = record(
        dir.path(),
        &["-e", "cpu-clock", "-F", "999"],
        &[
            "dd",
            "if=/dev/zero",
            "of=/dev/null",
            "bs=1",
            "count=1000000",
        ],
    );
    // perf's own estimate: the sum of the periods its samples recorded.
    let header = stdout("perf", &["report", "-i", &file, "--stdio", "--header-only"]);
    let report = stdout("perf", &["report", "-i", &file, "--stdio"]);
    let perf_count: f64 = report
        .lines()
        .find_map(|line| line.strip_prefix("# Event count (approx.): "))
        .unwrap_or_else(|| panic!("perf report printed no event count:\n{header}\n{report}"))
        .trim()
        .parse()
        .unwrap();

    let profile = crate::import::profile_from_perf_data_file(Path::new(&file)).unwrap();
    let samples = profile.losses.samples_fired[0];
    let scale = EventScale::of(&profile, 0);
    assert!(
        matches!(scale, EventScale::MeanPeriod(_)),
        "{scale:?}: {}",
        scale.describe()
    );
    let ours = scale.estimate(samples).unwrap();
    assert!(
        (ours - perf_count).abs() <= perf_count * 1e-9,
        "ours {ours}, perf {perf_count}"
    );
}
