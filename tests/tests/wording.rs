//! What reports name and say, on real recordings: JIT functions of a real runtime, processes whose main thread took no sample, the title's scope, pprof's column words,
//! exports that follow the report's filters, and the terminal's width.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use common::{profiler, profiler_bin, report_json, temp_dir, workload};
use serde_json::Value;

/// `threads 3 2` sampled on cpu-clock and on every page fault: three named spinning threads
/// and a main thread that only waits.
fn threads_profile() -> &'static Path {
    static PROFILE: OnceLock<PathBuf> = OnceLock::new();
    PROFILE.get_or_init(|| {
        let file = temp_dir("wording-threads").join("threads.prof");
        let threads = workload("threads");
        profiler(&[
            "record",
            "-e",
            "cpu-clock",
            "-e",
            "page-faults/period=1/",
            "-o",
            file.to_str().unwrap(),
            "--",
            threads.to_str().unwrap(),
            "3",
            "2",
        ]);
        file
    })
}

fn report(file: &Path, args: &[&str]) -> Output {
    let mut all = vec!["report", "-i", file.to_str().unwrap()];
    all.extend_from_slice(args);
    profiler(&all)
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn folded_total(folded: &str) -> u64 {
    folded
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn node_jit_functions_are_named_from_its_perf_map() {
    let dir = temp_dir("node-jit");
    let script = dir.join("jit.js");
    std::fs::write(
        &script,
        "function hotJsFunction(n) { let s = 0; for (let i = 0; i < n; i++) \
         { s = (s * 31 + i) % 1000003; } return s; }\n\
         const t = Date.now(); let r = 0;\n\
         while (Date.now() - t < 1500) { r += hotJsFunction(100000); }\n\
         console.log(r > 0);\n",
    )
    .unwrap();
    let file = dir.join("node.prof");
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "this test profiles a real JIT runtime: install node (apt-get install nodejs)"
    );
    // In its own directory: node writes V8 logs (isolate-*.log) where it runs.
    let recorded = Command::new(profiler_bin())
        .current_dir(&dir)
        .args(["record", "-F", "499", "-o"])
        .arg(&file)
        .args(["--", "node", "--perf-basic-prof"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let report = report_json(&file, &["--by", "function"]);
    let functions = report["events"][0]["functions"].as_array().unwrap();
    let hot = &functions[0];
    assert!(
        hot["function"].as_str().unwrap().contains("hotJsFunction"),
        "{hot:#}"
    );
    assert!(hot["self_percent"].as_f64().unwrap() > 50.0, "{hot:#}");
    assert!(
        hot["module"].as_str().unwrap().starts_with("[perf-"),
        "{hot:#}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn exports_follow_the_report_filters_and_are_named() {
    let file = threads_profile();
    let dir = temp_dir("wording-exports");
    let folded = dir.join("spin2.folded");
    let output = report(
        file,
        &[
            "--only-comm",
            "spin-2",
            "--folded",
            folded.to_str().unwrap(),
        ],
    );
    assert!(
        text(&output).is_empty(),
        "the export is the output, no text report: {}",
        text(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "folded stacks of cpu-clock written to {}",
            folded.display()
        )),
        "{stderr}"
    );
    let stacks = std::fs::read_to_string(&folded).unwrap();
    assert!(!stacks.is_empty());
    assert!(stacks.lines().all(|l| l.starts_with("spin-2;")), "{stacks}");

    // The event as it was given, and only its samples.
    let faults = dir.join("faults.folded");
    let svg = dir.join("faults.svg");
    report(
        file,
        &[
            "--only-event",
            "page-faults/period=1/",
            "--folded",
            faults.to_str().unwrap(),
            "--flamegraph",
            svg.to_str().unwrap(),
        ],
    );
    let json = report_json(file, &["--only-event", "page-faults/period=1/"]);
    let event = &json["events"][0];
    assert_eq!(event["name"], "page-faults/period=1/", "modifiers kept");
    let samples = event["samples"].as_u64().unwrap();
    assert_eq!(
        folded_total(&std::fs::read_to_string(&faults).unwrap()),
        samples
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains(&format!("page-faults/period=1/: {samples} samples")),
        "the flame graph is of the chosen event"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn processes_are_named_after_their_main_thread_even_unsampled() {
    let dir = temp_dir("wording-process");
    let file = dir.join("spin.prof");
    let threads = workload("threads");
    // Only the spinning threads run: the main thread waits, unsampled.
    profiler(&[
        "record",
        "-e",
        "cpu-clock",
        "-o",
        file.to_str().unwrap(),
        "--",
        threads.to_str().unwrap(),
        "2",
        "1",
    ]);
    let json = report_json(&file, &["--by", "process"]);
    let rows = json["events"][0]["processes"].as_array().unwrap();
    assert_eq!(rows[0]["comm"], "threads", "{rows:#?}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn column_words_are_pprof_s_and_top_0_and_json_are_whole() {
    let file = threads_profile();
    let output = text(&report(file, &["--only-event", "cpu-clock", "--top", "0"]));
    assert!(output.contains("self    %  sum% cum"), "{output}");
    assert!(!output.contains("rows; --top N"), "{output}");
    assert!(!output.contains("no samples"), "{output}");
    let json = report_json(file, &["--by", "function"]);
    for event in json["events"].as_array().unwrap() {
        let rows = event["functions"].as_array().unwrap().len() as u64;
        assert_eq!(rows, event["total_rows"].as_u64().unwrap(), "whole");
    }
    assert!(
        json["events"][1]["total_rows"].as_u64().unwrap() > 20,
        "enough page-fault functions to tell: {json:#}"
    );
    let json = report_json(file, &["--by", "function", "--top", "3"]);
    assert_eq!(json["events"][1]["functions"].as_array().unwrap().len(), 3);
}

#[test]
fn text_fits_the_terminal_or_200_columns_in_a_pipe() {
    let file = threads_profile();
    let narrow = Command::new(profiler_bin())
        .args(["report", "--by", "line", "-i"])
        .arg(file)
        .env("COLUMNS", "72")
        .output()
        .unwrap();
    let narrow = text(&narrow);
    assert!(narrow.lines().all(|l| l.chars().count() <= 72), "{narrow}");
    // Into a pipe: wider than the terminal's 72, but bounded at 200 columns (docs/views.md);
    // a name too long for its column there is shortened, never the numbers.
    let piped = text(&report(file, &["--by", "line"]));
    let longest = piped.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(longest > 72 && longest <= 200, "{piped}");
}

#[test]
fn the_title_names_the_scope_and_quotes_the_command() {
    let dir = temp_dir("wording-title");
    let file = dir.join("user.prof");
    profiler(&[
        "record",
        "--uid",
        "0",
        "--duration",
        "0.3",
        "-o",
        file.to_str().unwrap(),
    ]);
    let title = text(&report(&file, &[]));
    assert!(title.starts_with("Profile of user 0 on "), "{title}");
    // Arguments are kept only when asked (they may hold secrets), and then shell-quoted.
    let file = dir.join("quoted.prof");
    let command = ["sh", "-c", r#"echo "it's here" > /dev/null"#];
    let record = |extra: &[&str]| {
        let mut args = vec!["record", "-o", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(&command);
        profiler(&args);
        text(&report(&file, &[]))
    };
    let title = record(&["--record-args"]);
    assert!(
        title.starts_with(r#"Profile of `sh -c 'echo "it'\''s here" > /dev/null'` on "#),
        "{title}"
    );
    let title = record(&[]);
    assert!(
        title.starts_with("Profile of `sh` (2 arguments not recorded) on "),
        "{title}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn raw_samples_are_in_timestamp_order() {
    let dir = temp_dir("wording-raw");
    let raw = dir.join("samples.jsonl");
    let threads = workload("threads");
    // Two CPUs sampling at once: their samples interleave in the ring buffer.
    profiler(&[
        "record",
        "-F",
        "2000",
        "--raw",
        raw.to_str().unwrap(),
        "-o",
        dir.join("raw.prof").to_str().unwrap(),
        "--",
        threads.to_str().unwrap(),
        "2",
        "2",
    ]);
    let times: Vec<u64> = std::fs::read_to_string(&raw)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["time_ns"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(times.len() > 100, "{} samples", times.len());
    let cpus_late = times.windows(2).filter(|w| w[1] < w[0]).count();
    assert_eq!(cpus_late, 0, "samples out of timestamp order");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn views_an_event_cannot_fill_say_what_they_need() {
    let file = threads_profile();
    let dcache = text(&report(
        file,
        &["--by", "dcache-line", "--only-event", "cpu-clock"],
    ));
    assert!(dcache.contains("carry no data addresses"), "{dcache}");
    assert!(!dcache.contains(" 0x0 "), "no rows at address 0: {dcache}");
    // One rule for every view with nothing to show: said, and exit status 0.
    let hardware = report(file, &["--hardware", "function"]);
    assert!(hardware.status.success());
    let hardware = text(&hardware);
    assert!(
        hardware.contains("No hardware data for --hardware"),
        "{hardware}"
    );
    assert!(
        hardware.contains("PEBS") && hardware.contains("IBS"),
        "{hardware}"
    );
    let histogram = text(&report(file, &["--histogram", "--only-event", "cpu-clock"]));
    assert!(
        histogram.contains("latency distributions need PEBS"),
        "{histogram}"
    );
    let dir = temp_dir("wording-histogram");
    let svg = dir.join("latency.svg");
    let plot = Command::new(profiler_bin())
        .args(["report", "-i"])
        .arg(file)
        .arg("--histogram")
        .arg(&svg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&plot.stderr);
    assert!(plot.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "note: --histogram {}: nothing to plot, the file is not written",
            svg.display()
        )),
        "{stderr}"
    );
    assert!(!svg.exists());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn stat_help_names_events_as_the_output_does() {
    let help = text(&profiler(&["stat", "--help"]));
    assert!(help.contains("branch-instructions"), "{help}");
    assert!(!help.contains(" branches,"), "{help}");
}

#[test]
fn a_truncated_perf_data_error_names_the_file_given() {
    let dir = temp_dir("wording-perfdata");
    let data = dir.join("short-run.data");
    let recorded = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-o"])
        .arg(&data)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
        ])
        .output()
        .expect("perf is installed");
    assert!(recorded.status.success());
    let whole = std::fs::read(&data).unwrap();
    let cut = dir.join("cut-short.data");
    std::fs::write(&cut, &whole[..whole.len() * 2 / 3]).unwrap();
    let output = Command::new(profiler_bin())
        .args(["report", "-i"])
        .arg(&cut)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&cut.display().to_string()) && stderr.contains("truncated"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn an_unprivileged_list_blames_the_missing_pmu_not_permissions() {
    if Path::new("/sys/bus/event_source/devices/cpu").exists() {
        println!("skipped: this machine has a hardware PMU, so cycles' reason is not its absence");
        return;
    }
    common::require_root();
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(profiler_bin())
        .args(["list", "--json"])
        .output()
        .expect("setpriv (util-linux) runs the profiler as nobody");
    assert!(output.status.success(), "{output:?}");
    let listing: Value = serde_json::from_slice(&output.stdout).unwrap();
    let cycles = listing["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["entries"].as_array().unwrap())
        .find(|e| e["name"] == "cycles")
        .expect("cycles is listed");
    let reason = cycles["availability"]["reason"].as_str().unwrap();
    assert!(reason.contains("no hardware PMU"), "{reason}");
}

#[test]
fn kernel_icache_lines_are_named_symbol_plus_offset() {
    let lines = text(&report(
        threads_profile(),
        &[
            "--by",
            "icache-line",
            "--only-event",
            "page-faults/period=1/",
            "--top",
            "0",
        ],
    ));
    let kernel: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains(" 0xffffffff"))
        .collect();
    assert!(!kernel.is_empty(), "page faults run kernel code: {lines}");
    for line in kernel {
        assert!(!line.contains("kallsyms"), "{line}");
        let location = line.split_whitespace().nth(5).unwrap();
        assert!(
            location.contains("+0x") || location.contains("-0x"),
            "{line}"
        );
    }
}

#[test]
fn vdso_code_is_named_as_perf_names_it() {
    // Reading the monotonic clock in a loop runs in the vDSO, which has no file to read.
    let dir = temp_dir("wording-vdso");
    let file = dir.join("vdso.prof");
    let events = workload("known_events");
    profiler(&[
        "record",
        "-F",
        "1999",
        "-o",
        file.to_str().unwrap(),
        "--",
        events.to_str().unwrap(),
        "clock-reads-ms",
        "500",
    ]);
    let json = report_json(&file, &["--by", "function"]);
    let functions = json["events"][0]["functions"].as_array().unwrap();
    let vdso: f64 = functions
        .iter()
        .filter(|f| f["module"].as_str().is_some_and(|m| m == "[vdso]"))
        .map(|f| {
            let name = f["function"].as_str().unwrap();
            assert!(
                name.starts_with("__vdso_"),
                "a vDSO sample without its function: {f}"
            );
            f["self_percent"].as_f64().unwrap()
        })
        .sum();
    assert!(vdso > 20.0, "{vdso}% in the vDSO: {functions:#?}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn short_help_is_a_line_per_option_and_long_help_has_the_rest() {
    for subcommand in ["record", "report", "stat", "agent"] {
        let help = |flag: &str, columns: &str| {
            let output = Command::new(profiler_bin())
                .args([subcommand, flag])
                .env("COLUMNS", columns)
                .output()
                .unwrap();
            assert!(output.status.success());
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        for flag in ["-h", "--help"] {
            for line in help(flag, "80").lines() {
                assert!(
                    line.chars().count() <= 80,
                    "{subcommand} {flag}: a line of {} columns at 80: {line}",
                    line.chars().count()
                );
            }
        }
        // On a wide terminal each option's short help is one line; only clap's lists of
        // values and defaults go on.
        let short = help("-h", "120");
        for line in short
            .lines()
            .filter(|line| line.starts_with(&" ".repeat(20)))
        {
            assert!(
                line.ends_with(']'),
                "{subcommand} -h, a second line: {line}\n{short}"
            );
        }
        let long = help("--help", "120");
        assert!(long.lines().count() > 2 * short.lines().count(), "{long}");
    }
    let record_short = text(&profiler(&["record", "-h"]));
    let record_long = text(&profiler(&["record", "--help"]));
    for expert in [
        "--btf",
        "--map-entries",
        "--ring-buffer-kib",
        "--drain-interval",
    ] {
        assert!(
            !record_short.contains(expert),
            "{expert} in -h:\n{record_short}"
        );
        assert!(record_long.contains(expert), "{expert} not in --help");
    }
    assert!(record_short.contains("-a, --all-cpus"), "{record_short}");
    assert!(
        record_short.contains("--off-cpu-min <TIME>  With `--off-cpu`: blocks shorter than"),
        "{record_short}"
    );
}

#[test]
fn errors_are_lower_case_and_notes_come_only_with_a_recording() {
    let dir = temp_dir("wording-errors");
    // A usage error, a bad file and a failed check all read as clap's do.
    for (args, says) in [
        (
            &["record", "--bogus"][..],
            "error: unexpected argument '--bogus'",
        ),
        (
            &["report", "-i", "/nonexistent/profile"],
            "error: cannot read /nonexistent/profile",
        ),
        (
            &["record", "--stack-copy-kib", "8", "--", "true"],
            "error: --stack-copy-kib sizes the stack copies",
        ),
    ] {
        let output = Command::new(profiler_bin()).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr.starts_with(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("Error:"), "{args:?}: {stderr}");
        // Nothing is recorded: no note about what would have been.
        assert!(!stderr.contains("no hardware PMU"), "{args:?}: {stderr}");
    }
    // Software events asked for: the PMU changes nothing, and is not mentioned.
    let output = Command::new(profiler_bin())
        .args(["record", "-e", "cpu-clock", "-o"])
        .arg(dir.join("sw.prof"))
        .args(["--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("no hardware PMU"), "{stderr}");
    // The default event where there is no PMU: said, once.
    if common::core_pmu().is_none() {
        let output = Command::new(profiler_bin())
            .args(["record", "-o"])
            .arg(dir.join("default.prof"))
            .args(["--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            stderr
                .matches("note: no hardware PMU on this machine")
                .count(),
            1,
            "{stderr}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}
