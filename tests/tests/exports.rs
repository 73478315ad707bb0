//! Every view and export tells the same numbers, and stripped code is one row per function.
//!
//! One recording of each kind of event (cpu-clock and task-clock at their default frequency, a
//! frequency set with -F, a period set with -c, page faults, off-CPU blocks) is reported as
//! text and JSON and exported as folded stacks, pprof and speedscope: the samples and the
//! estimated events agree in all of them. speedscope itself, in Chromium, opens its export with
//! the report's totals per function, inlined functions included. The agent's windows carry the same estimate as a recording. Code
//! without symbols (a stripped build of a C workload; Debian's stripped liblzma under `xz`) is
//! named by the start of the function its call-frame information bounds.

mod common;

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use common::{
    profiler, profiler_bin, read_pprof, record_to, report_json, require_root, run_checked,
    temp_dir, wait_until_recording, workload, Running,
};
use profiler::export::pprof::{column_prefix, proto};
use serde_json::Value;

/// The sum of a pprof value column, by its type's name.
fn column_total(profile: &proto::Profile, name: &str) -> i64 {
    let column = profile
        .sample_type
        .iter()
        .position(|t| profile.string_table[t.r#type as usize] == name)
        .unwrap_or_else(|| panic!("no sample type {name} in the pprof export"));
    profile.sample.iter().map(|s| s.value[column]).sum()
}

/// The sum of the counts of a folded stacks file.
fn folded_total(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The total the text report states for its event (`...: 123 nanoseconds in all`).
fn text_total(text: &str) -> u64 {
    let line = text
        .lines()
        .find(|line| line.contains(" in all"))
        .unwrap_or_else(|| panic!("no estimated total in the text report:\n{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().rposition(|w| *w == "in").unwrap();
    words[at - 2].parse().unwrap_or_else(|_| panic!("{line}"))
}

/// The weights of the first profile of a speedscope file, summed, and its unit.
fn speedscope_total(path: &Path) -> (u64, String) {
    let file: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let profile = &file["profiles"][0];
    let weights = profile["weights"].as_array().unwrap();
    let total = weights.iter().map(|w| w.as_u64().unwrap()).sum();
    (total, profile["unit"].as_str().unwrap().to_string())
}

/// Folded stacks, pprof and speedscope's (total and unit) of `file`'s `event`, as `report`
/// writes them.
fn exports(file: &Path, event: &str) -> (u64, proto::Profile, (u64, String)) {
    let dir = file.parent().unwrap();
    let (folded, pprof) = (dir.join("stacks.folded"), dir.join("profile.pb.gz"));
    let speedscope = dir.join("speedscope.json");
    profiler(&[
        "report",
        "-i",
        file.to_str().unwrap(),
        "--only-event",
        event,
        "--folded",
        folded.to_str().unwrap(),
        "--pprof",
        pprof.to_str().unwrap(),
        "--speedscope",
        speedscope.to_str().unwrap(),
    ]);
    (
        folded_total(&folded),
        read_pprof(&pprof),
        speedscope_total(&speedscope),
    )
}

/// Records `command` with `options` and checks that text, JSON, folded stacks and pprof give
/// its event the same samples and the same estimated events.
fn same_numbers_everywhere(name: &str, options: &[&str], command: &[&str]) {
    let file = temp_dir(name).join("recording.prof");
    record_to(&file, options, command);
    let report = report_json(&file, &[]);
    let event = &report["events"][0];
    let event_name = event["name"].as_str().unwrap();
    let samples = event["samples"].as_u64().unwrap();
    assert!(samples > 20, "{name}: too few samples to compare: {event}");
    let estimated = event["estimate"]["events"]
        .as_u64()
        .unwrap_or_else(|| panic!("{name}: no estimate: {}", event["estimate"]));
    let text = String::from_utf8_lossy(&profiler(&["report", "-i", file.to_str().unwrap()]).stdout)
        .into_owned();
    assert_eq!(text_total(&text), estimated, "{name}: text vs JSON");
    let (folded, pprof, speedscope) = exports(&file, event_name);
    assert_eq!(
        folded, samples,
        "{name}: folded stacks vs the report's samples"
    );
    assert_eq!(
        speedscope,
        (samples, "none".to_string()),
        "{name}: speedscope's samples"
    );
    assert_eq!(
        column_total(&pprof, &format!("{}_sample", column_prefix(event_name))) as u64,
        samples,
        "{name}: pprof's samples"
    );
    assert_eq!(
        column_total(&pprof, &format!("{}_event", column_prefix(event_name))) as u64,
        estimated,
        "{name}: pprof's events vs the report's estimate"
    );
}

#[test]
fn clocks_at_a_frequency_tell_the_same_numbers_everywhere() {
    require_root();
    let cpu_split = workload("cpu_split");
    let command = [cpu_split.to_str().unwrap(), "600"];
    same_numbers_everywhere("same-cpu-clock", &["-e", "cpu-clock"], &command);
    same_numbers_everywhere("same-task-clock", &["-e", "task-clock"], &command);
    same_numbers_everywhere(
        "same-frequency",
        &["-e", "cpu-clock", "-F", "1999"],
        &command,
    );
}

#[test]
fn a_period_and_page_faults_tell_the_same_numbers_everywhere() {
    require_root();
    let cpu_split = workload("cpu_split");
    same_numbers_everywhere(
        "same-period",
        &["-e", "cpu-clock", "-c", "250000"],
        &[cpu_split.to_str().unwrap(), "600"],
    );
    let page_toucher = workload("page_toucher");
    same_numbers_everywhere(
        "same-page-faults",
        &["-e", "page-faults"],
        &[page_toucher.to_str().unwrap(), "20000"],
    );
}

#[test]
fn off_cpu_exports_count_blocks_and_weigh_them_in_nanoseconds() {
    require_root();
    let file = temp_dir("same-off-cpu").join("recording.prof");
    record_to(
        &file,
        &["--off-cpu"],
        &["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 0.05; done"],
    );
    let off_cpu = report_json(&file, &[])["off_cpu"].clone();
    let blocks = off_cpu["blocks"].as_u64().unwrap();
    let blocked_ns = off_cpu["total_ns"].as_u64().unwrap();
    assert!(blocks >= 8, "{off_cpu}");
    let (folded, pprof, speedscope) = exports(&file, "off-cpu");
    assert_eq!(folded, blocked_ns, "folded off-CPU stacks are nanoseconds");
    assert_eq!(speedscope, (blocked_ns, "nanoseconds".to_string()));
    assert_eq!(column_total(&pprof, "off_cpu_sample") as u64, blocks);
    assert_eq!(column_total(&pprof, "off_cpu_event") as u64, blocked_ns);
    let comments: Vec<&str> = pprof
        .comment
        .iter()
        .map(|&c| pprof.string_table[c as usize].as_str())
        .collect();
    assert!(
        comments.contains(&format!("samples fired: off-cpu: {blocks}").as_str()),
        "{comments:?}"
    );
}

/// The number after `prefix: ` among a pprof file's comments.
fn comment_number(profile: &proto::Profile, prefix: &str) -> Option<u64> {
    profile.comment.iter().find_map(|&index| {
        profile.string_table[index as usize]
            .strip_prefix(&format!("{prefix}: "))
            .map(|count| count.parse().unwrap())
    })
}

#[test]
fn the_agents_windows_scale_to_what_the_counters_counted_and_report_reads_them_back() {
    require_root();
    let dir = temp_dir("same-agent");
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", "499", "--interval", "1", "--output-dir"])
            .arg(&dir)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let mut cpu_split = Running::spawn(
        Command::new(workload("cpu_split"))
            .arg("2500")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    assert!(cpu_split.wait_at_most(Duration::from_secs(60)).success());
    agent.terminate();
    let mut checked = 0;
    let mut busiest = (std::path::PathBuf::new(), 0);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        // The agent's index of what it wrote lies beside the windows.
        if !common::is_window(&path) {
            continue;
        }
        let window = read_pprof(&path);
        let (Some(fired), Some(counted)) = (
            comment_number(&window, "samples fired: cpu-clock"),
            comment_number(&window, "events counted: cpu-clock"),
        ) else {
            continue;
        };
        // The last window can end before a sample fires in it: nothing to scale.
        if fired == 0 {
            continue;
        }
        let samples = column_total(&window, "cpu_clock_sample") as u64;
        let events = column_total(&window, "cpu_clock_event") as u64;
        let expected = (samples as f64 * counted as f64 / fired as f64).round() as u64;
        assert_eq!(
            events, expected,
            "{samples} samples of {fired} fired, {counted} ns"
        );
        checked += 1;
        // `report -i` reads a window back: the same samples, and the estimate its column has.
        let report = report_json(&path, &[]);
        let event = &report["events"][0];
        assert_eq!(event["name"], "cpu-clock");
        assert_eq!(
            event["samples"].as_u64().unwrap(),
            samples,
            "{}",
            path.display()
        );
        assert_eq!(event["estimate"]["events"].as_u64().unwrap(), events);
        if samples > busiest.1 {
            busiest = (path.clone(), samples);
        }
    }
    assert!(checked >= 1, "no window with counted events");
    // And the HTML report of a window draws cpu_split's functions with the report's shares.
    let (window, _) = busiest;
    let html = dir.join("window.html");
    let pid = cpu_split.id().to_string();
    let filter = ["--only-pid", pid.as_str()];
    let report = report_json(&window, &filter);
    profiler(
        &[
            &["report", "-i", window.to_str().unwrap()],
            &filter[..],
            &["--html", html.to_str().unwrap()],
        ]
        .concat(),
    );
    // The samples the filter keeps.
    let kept = report["events"][0]["view_samples"].as_u64().unwrap();
    assert!(kept > 100, "{report:#}");
    let share = share_of(&report, "cpu_split::heavy_work");
    let drawn = tree_share(&html_document(&html), 0, "cpu_split::heavy_work");
    assert!(
        (drawn - share).abs() <= 0.1,
        "{drawn:.2}% drawn, {share:.2}% reported"
    );
}

/// `nm`'s text symbols of `binary`: address -> name.
fn text_symbols(binary: &Path) -> BTreeMap<u64, String> {
    let output = run_checked("nm", &[binary.to_str().unwrap()]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (address, kind, name) = (words.next()?, words.next()?, words.next()?);
            matches!(kind, "T" | "t")
                .then(|| Some((u64::from_str_radix(address, 16).ok()?, name.to_string())))?
        })
        .collect()
}

/// The function rows of the first event whose module's file name is `module`.
fn rows_of_module<'a>(report: &'a Value, module: &str) -> Vec<&'a Value> {
    report["events"][0]["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .filter(|row| {
            row["module"]
                .as_str()
                .is_some_and(|m| Path::new(m).file_name().unwrap() == module)
        })
        .collect()
}

/// The start address of a row named `module+0xSTART`; `None` for a row with a symbol's name.
fn named_start(row: &Value, module: &str) -> Option<u64> {
    let name = row["function"].as_str().unwrap();
    let hex = name.strip_prefix(&format!("{module}+0x"))?;
    Some(u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("{name}")))
}

#[test]
fn a_stripped_programs_functions_are_one_row_each_at_their_start() {
    require_root();
    let dir = temp_dir("stripped-functions");
    let built = common::c_workload::build_no_frame_pointers(&dir, "with_symbols", &[]);
    let stripped = dir.join("stripped_sorter");
    std::fs::copy(&built, &stripped).unwrap();
    run_checked("strip", &[stripped.to_str().unwrap()]);
    let symbols = text_symbols(&built);
    let file = dir.join("recording.prof");
    record_to(
        &file,
        &["--unwind", "copy"],
        &[stripped.to_str().unwrap(), "1500"],
    );
    let report = report_json(&file, &["--top", "1000"]);
    let rows = rows_of_module(&report, "stripped_sorter");
    let mut named: BTreeMap<String, u64> = BTreeMap::new();
    for row in &rows {
        let start = named_start(row, "stripped_sorter")
            .unwrap_or_else(|| panic!("a stripped function named otherwise: {row}"));
        let function = symbols
            .get(&start)
            .unwrap_or_else(|| panic!("{row}: no function starts at {start:#x}: {symbols:?}"));
        assert!(
            named.insert(function.clone(), start).is_none(),
            "two rows of {function}"
        );
    }
    let self_samples = |function: &str| {
        rows.iter()
            .find(|row| {
                named_start(row, "stripped_sorter").and_then(|s| symbols.get(&s))
                    == Some(&function.to_string())
            })
            .map_or(0, |row| row["self_samples"].as_u64().unwrap())
    };
    // The sort's key function is where the main thread spends its time, the copier's loop
    // around memcpy is on every copier stack.
    assert!(self_samples("record_key") > 50, "{named:?}");
    for caller in ["compare_records", "sort_records", "main", "copier_main"] {
        assert!(named.contains_key(caller), "no row of {caller}: {named:?}");
    }
}

/// The address ranges of the FDEs of `module`, as readelf lists them, by start.
fn fde_ranges(module: &Path) -> BTreeMap<u64, u64> {
    let output = run_checked(
        "readelf",
        &["--debug-dump=frames", module.to_str().unwrap()],
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains(" FDE "))
        .filter_map(|line| {
            let (start, end) = line.split("pc=").nth(1)?.split_once("..")?;
            let hex = |text: &str| u64::from_str_radix(text.trim(), 16).ok();
            Some((hex(start)?, hex(end)?))
        })
        .collect()
}

#[test]
fn debians_stripped_liblzma_is_one_row_per_function() {
    require_root();
    let dir = temp_dir("stripped-liblzma");
    let input = dir.join("input.txt");
    // Text that compresses, so that xz's match finder and encoder do the work.
    let text: String = (0..400_000u64)
        .map(|i| format!("{} {}\n", i * 2_654_435_761 % 1_000_003, i % 97))
        .collect();
    std::fs::write(&input, text).unwrap();
    let liblzma = std::fs::canonicalize("/lib/x86_64-linux-gnu/liblzma.so.5")
        .expect("liblzma (Debian: apt-get install xz-utils)");
    let module = liblzma.file_name().unwrap().to_str().unwrap().to_string();
    let file = dir.join("recording.prof");
    record_to(
        &file,
        &["--unwind", "copy"],
        &["xz", "-k", "-f", "-T1", "-9", input.to_str().unwrap()],
    );
    let report = report_json(&file, &["--top", "1000"]);
    let rows = rows_of_module(&report, &module);
    let fdes = fde_ranges(&liblzma);
    let named: Vec<u64> = rows
        .iter()
        .filter_map(|row| named_start(row, &module))
        .collect();
    // Code an FDE covers is named by the FDE's start; code none covers (`.init`, sampled while
    // the library loads) by its own offset.
    for start in &named {
        let holder = fdes
            .range(..=start)
            .next_back()
            .filter(|(_, end)| start < end);
        if let Some((fde_start, _)) = holder {
            assert_eq!(
                fde_start, start,
                "{module}+{start:#x} is inside an FDE, not its start"
            );
        }
    }
    let at_fde_starts = named
        .iter()
        .filter(|start| fdes.contains_key(start))
        .count();
    assert!(at_fde_starts >= 3, "{rows:?}");
    let samples: u64 = rows
        .iter()
        .map(|r| r["self_samples"].as_u64().unwrap())
        .sum();
    assert!(samples > 100, "too few samples in {module}: {rows:?}");
}

#[test]
fn speedscope_opens_its_export_with_the_reports_totals_and_the_inlined_functions() {
    require_root();
    let dir = temp_dir("speedscope");
    let (file, export) = (
        dir.join("cpu_split.prof"),
        dir.join("cpu_split.speedscope.json"),
    );
    let cpu_split = workload("cpu_split");
    record_to(
        &file,
        &["-F", "997"],
        &[cpu_split.to_str().unwrap(), "2500"],
    );
    let report = report_json(&file, &["--speedscope", export.to_str().unwrap()]);
    let shown = common::run_viewer(
        "speedscope.cjs",
        &[&export, &dir.join("speedscope-sandwich.png")],
    );
    for problem in ["schemaErrors", "consoleErrors", "requests"] {
        assert_eq!(shown[problem], serde_json::json!([]), "{problem}");
    }
    let rows: BTreeMap<&str, (u64, &str)> = shown["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let name = row["name"].as_str().unwrap();
            let total = row["total"].as_u64().unwrap();
            (name, (total, row["file"].as_str().unwrap()))
        })
        .collect();
    // Every function the report lists has, in speedscope's sandwich view, the samples the
    // report counts under it.
    let functions = report["events"][0]["functions"].as_array().unwrap();
    assert!(functions.len() >= 3, "{functions:?}");
    for function in functions {
        let name = function["function"].as_str().unwrap();
        let total = function["total_samples"].as_u64().unwrap();
        let (shown_total, _) = rows
            .get(name)
            .unwrap_or_else(|| panic!("speedscope shows no {name}: {rows:?}"));
        assert_eq!(*shown_total, total, "{name}");
    }
    // churn is inlined into the three workers: a frame of its own, named by its source file,
    // under each (speedscope's pprof import drops such frames).
    let workers: u64 = ["heavy_work", "medium_work", "light_work"]
        .iter()
        .map(|worker| rows[format!("cpu_split::{worker}").as_str()].0)
        .sum();
    let (churn, source) = rows["cpu_split::churn"];
    assert!(churn * 100 >= workers * 95, "churn {churn} of {workers}");
    assert!(source.ends_with("cpu_split.rs"), "{source}");
}

/// A Firefox Profiler session: its command-line client (the Firefox Profiler's own profile
/// import and call tree, bundled; `cargo xtask setup` installs it) with a session directory of
/// the test's, whose daemon is stopped when the test ends, passed or failed.
struct FirefoxProfiler {
    sessions: std::path::PathBuf,
}

impl FirefoxProfiler {
    /// Exports `profile` with `--firefox` beside it and loads the export: the session, and the
    /// export's path.
    fn open(profile: &Path) -> (FirefoxProfiler, std::path::PathBuf) {
        let export = profile.with_extension("firefox.json");
        let output = profiler(&[
            "report",
            "-i",
            profile.to_str().unwrap(),
            "--firefox",
            export.to_str().unwrap(),
        ]);
        assert!(output.status.success(), "{output:?}");
        let session = FirefoxProfiler {
            sessions: profile.with_extension("sessions"),
        };
        std::fs::create_dir_all(&session.sessions).unwrap();
        session.run(&["load", export.to_str().unwrap()]);
        (session, export)
    }

    fn command(&self, args: &[&str]) -> Command {
        let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "../target/viewers/node_modules/@firefox-devtools/profiler-cli/dist/profiler-cli.js",
        );
        assert!(
            cli.exists(),
            "{} is missing: run `cargo xtask setup`",
            cli.display()
        );
        let mut command = Command::new("node");
        command
            .arg(&cli)
            .args(args)
            .env("PROFILER_CLI_SESSION_DIR", &self.sessions)
            // Our frames are named already: nothing to ask a symbol server.
            .env("PROFILER_CLI_NO_SYMBOLICATE", "1");
        command
    }

    /// What a command prints, as JSON.
    fn json(&self, args: &[&str]) -> Value {
        let text = self.run(args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    fn run(&self, args: &[&str]) -> String {
        let output = self.command(args).output().expect("node runs");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "profiler-cli {args:?}: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        text
    }
}

impl Drop for FirefoxProfiler {
    fn drop(&mut self) {
        // The daemon would outlive the test, holding a node process with its unwind tables.
        self.command(&["stop", "--all"]).output().ok();
    }
}

#[test]
fn the_firefox_profiler_opens_the_firefox_export_with_the_reports_shares() {
    require_root();
    let dir = temp_dir("firefox-export");
    let file = dir.join("cpu_split.prof");
    record_to(
        &file,
        &["-F", "999"],
        &[workload("cpu_split").to_str().unwrap(), "4000"],
    );
    let report = report_json(&file, &[]);
    let total_percent = |function: &str| {
        report["events"][0]["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["function"] == function)
            .and_then(|f| f["total_percent"].as_f64())
            .unwrap_or_else(|| panic!("{function} in the report"))
    };
    let (session, _) = FirefoxProfiler::open(&file);
    let listed = session.json(&["thread", "functions", "--json"]);
    let functions = listed["functions"].as_array().unwrap();
    let firefox_total = |function: &str| {
        functions
            .iter()
            .find(|f| f["name"] == function)
            .and_then(|f| f["totalPercentage"].as_f64())
            .unwrap_or_else(|| panic!("{function} in the Firefox Profiler's list: {listed:#}"))
    };
    for function in [
        "cpu_split::heavy_work",
        "cpu_split::medium_work",
        "cpu_split::light_work",
        "cpu_split::run_round",
    ] {
        let (ours, theirs) = (total_percent(function), firefox_total(function));
        assert!(
            (ours - theirs).abs() < 0.1,
            "{function}: {ours}% in the report, {theirs}% in the Firefox Profiler"
        );
    }
    // Inlined functions are frames of their own, as in the report's callees.
    assert!(
        functions.iter().any(|f| f["name"] == "cpu_split::churn"),
        "{listed:#}"
    );
    // Stopped while its session directory is there to say which daemon is its own.
    drop(session);
    std::fs::remove_dir_all(dir).ok();
}

/// Records, with off-CPU time, python3 sleeping 40 times 20 ms (CPython's `time_sleep`).
fn record_sleeper(file: &Path) {
    record_to(
        file,
        &["--off-cpu"],
        &[
            "python3",
            "-c",
            "import time\nfor _ in range(40):\n    time.sleep(0.02)\n",
        ],
    );
}

#[test]
fn the_firefox_profiler_opens_off_cpu_time_as_milliseconds_blocked() {
    require_root();
    let dir = temp_dir("firefox-off-cpu");
    let file = dir.join("sleeper.prof");
    record_sleeper(&file);
    let report = report_json(&file, &[]);
    let python = report["off_cpu"]["by_thread"]
        .as_array()
        .unwrap()
        .iter()
        .find(|thread| thread["name"].as_str().unwrap().starts_with("python3 "))
        .unwrap_or_else(|| panic!("no python3 thread off CPU: {:#}", report["off_cpu"]))
        .clone();
    let blocked_ms = python["total_ns"].as_f64().unwrap() / 1e6;
    assert!(blocked_ms > 800.0, "{python:#}");
    let (session, export) = FirefoxProfiler::open(&file);
    // The Firefox Profiler's thread handles are positions in the file's thread list.
    let written: Value = serde_json::from_slice(&std::fs::read(&export).unwrap()).unwrap();
    let position = written["threads"]
        .as_array()
        .unwrap()
        .iter()
        .position(|thread| {
            // The format makes thread ids unique: the same thread's second event is `tid.1`.
            let pid = thread["pid"]
                .as_str()
                .and_then(|pid| pid.parse::<u64>().ok());
            thread["name"] == "python3 (off-cpu)" && pid == python["pid"].as_u64()
        })
        .unwrap_or_else(|| panic!("no python3 (off-cpu) thread in the export"));
    let handle = format!("t-{position}");
    let listed = session.json(&["thread", "functions", "--thread", &handle, "--json"]);
    assert_eq!(listed["weightType"], "tracing-ms", "{listed:#}");
    let blocked_there = listed["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["totalSamples"].as_f64())
        .fold(0.0, f64::max);
    // Each stack's time is rounded to the millisecond.
    assert!(
        (blocked_there - blocked_ms).abs() <= blocked_ms * 0.01 + 1.0,
        "{blocked_ms} ms blocked in the report, {blocked_there} ms in the Firefox Profiler"
    );
    // Stopped while its session directory is there to say which daemon is its own.
    drop(session);
    std::fs::remove_dir_all(dir).ok();
}

/// The share (percent) of the first event's samples in stacks through `function`, as `report
/// --json` tells it.
fn share_of(report: &Value, function: &str) -> f64 {
    let event = &report["events"][0];
    let row = (event["functions"].as_array().unwrap().iter())
        .find(|f| f["function"] == function)
        .unwrap_or_else(|| panic!("no {function} in the report: {event:#}"));
    100.0 * row["total_samples"].as_f64().unwrap() / event["view_samples"].as_f64().unwrap()
}

/// `viewers/html_report.cjs` on an HTML report: what Chromium shows of `event` (`""`: the
/// first), searched for `search`, with `function` clicked; screenshots in `dir`.
fn open_html_report(report: &Path, event: &str, search: &str, function: &str) -> Value {
    let dir = report.parent().unwrap();
    let shown = common::run_viewer(
        "html_report.cjs",
        &[
            report,
            Path::new(event),
            Path::new(search),
            Path::new(function),
            dir,
        ],
    );
    // It opens from a file with nothing else: no request leaves it, nothing fails in it.
    for problem in ["consoleErrors", "requests"] {
        assert_eq!(shown[problem], serde_json::json!([]), "{problem}");
    }
    shown
}

#[test]
fn the_html_report_opens_offline_and_shows_shares_lines_and_differences_as_the_report_does() {
    require_root();
    let dir = temp_dir("html-report");
    let (file, baseline, html) = (
        dir.join("cpu_split.prof"),
        dir.join("baseline.prof"),
        dir.join("cpu_split.html"),
    );
    let cpu_split = workload("cpu_split");
    for recording in [&file, &baseline] {
        record_to(
            recording,
            &["-F", "1999"],
            &[cpu_split.to_str().unwrap(), "2500"],
        );
    }
    let report = report_json(
        &file,
        &[
            "--html",
            html.to_str().unwrap(),
            "--baseline",
            baseline.to_str().unwrap(),
        ],
    );
    let heavy_share = share_of(&report, "cpu_split::heavy_work");

    let shown = open_html_report(&html, "", "heavy_w", "cpu_split::heavy_work");
    // A search's share is the report's share of the functions it matches.
    let matched = 100.0 * shown["search"]["matched"].as_f64().unwrap();
    assert!(
        (matched - heavy_share).abs() <= 0.1,
        "search for heavy_w matches {matched:.2}%, the report says heavy_work is {heavy_share:.2}%"
    );
    let highlighted = shown["search"]["frames"].as_array().unwrap();
    assert!(!highlighted.is_empty());
    assert!(
        highlighted.iter().all(|f| f == "cpu_split::heavy_work"),
        "{highlighted:?}"
    );

    // A click on it: callers, callees, source lines and instructions with their samples.
    let function = &shown["function"];
    assert_eq!(function["name"], "cpu_split::heavy_work", "{function:#}");
    let names = |rows: &Value| -> Vec<String> {
        (rows.as_array().unwrap().iter())
            .map(|row| row[2].as_str().unwrap().to_string())
            .collect()
    };
    // Called through the closure that times it.
    assert!(
        names(&function["callers"])
            .iter()
            .any(|caller| caller.starts_with("cpu_split::run_round")),
        "{function:#}"
    );
    assert!(
        names(&function["callees"]).contains(&"cpu_split::churn".to_string()),
        "{function:#}"
    );
    let statements = function["statements"].as_array().unwrap();
    assert!(
        statements
            .iter()
            .any(|row| row[2].as_str().unwrap().contains("cpu_split.rs:")),
        "{statements:?}"
    );
    let sampled: u64 = (function["instructions"].as_array().unwrap().iter())
        .filter_map(|row| row[0].as_str().unwrap().parse::<u64>().ok())
        .sum();
    // Exactly the instruction samples `report --function` shows (its stack total also holds
    // samples taken in the kernel under it).
    let details = report_json(&file, &["--function", "cpu_split::heavy_work"]);
    let in_details = &details["events"][0]["function_details"]["samples"];
    assert_eq!(
        sampled,
        in_details.as_u64().unwrap(),
        "instruction samples shown: {}",
        function["note"]
    );
    // Each cache line shown was sampled, and its total is on its first row.
    let by_line: Vec<u64> = (function["instructions"].as_array().unwrap().iter())
        .filter_map(|row| row[4].as_str().unwrap().strip_suffix(" in line"))
        .map(|samples| samples.parse().unwrap())
        .collect();
    assert!(!by_line.is_empty() && by_line.iter().all(|&samples| samples > 0));
    assert_eq!(by_line.iter().sum::<u64>(), sampled, "{function:#}");
    assert!(
        function["zoomedTo"]
            .as_str()
            .unwrap()
            .contains("zoomed to cpu_split::heavy_work"),
        "{function:#}"
    );

    // Compared with another run of the same work: the same frames, found there, and the
    // difference of heavy_work's widest frame the difference of the two reports' shares (the
    // work's own split varies from run to run on a busy host).
    assert_eq!(shown["compare"], "baseline:0");
    let compared: Vec<&Value> = (shown["diff"].as_array().unwrap().iter())
        .filter(|f| f["name"] == "cpu_split::heavy_work")
        .collect();
    assert!(!compared.is_empty());
    for frame in &compared {
        assert!(
            !frame["title"].as_str().unwrap().contains("not there"),
            "{frame}"
        );
    }
    let widest = (compared.iter())
        .max_by(|a, b| {
            a["width"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["width"].as_f64().unwrap())
        })
        .unwrap();
    let baseline_share = share_of(&report_json(&baseline, &[]), "cpu_split::heavy_work");
    let expected = share_of(&report, "cpu_split::heavy_work") - baseline_share;
    let diff = widest["diff"].as_f64().unwrap();
    assert!(
        (diff - expected).abs() <= 1.0,
        "heavy_work {diff:+.2} points against the baseline; the reports differ by {expected:+.2}"
    );
    assert_eq!(shown["flame"]["rootInView"], true);
}

#[test]
fn the_html_report_shows_off_cpu_block_durations_of_a_function() {
    require_root();
    let dir = temp_dir("html-off-cpu");
    let (file, html) = (dir.join("sleeper.prof"), dir.join("sleeper.html"));
    record_sleeper(&file);
    profiler(&[
        "report",
        "-i",
        file.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    // CPython's time.sleep.
    let shown = open_html_report(&html, "off-cpu", "sleep", "time_sleep");
    let function = &shown["function"];
    assert_eq!(function["name"], "time_sleep", "{shown:#}");
    // 40 sleeps of 20 ms: the most blocks in the bucket that holds them.
    let buckets = function["blocks"].as_array().unwrap();
    let blocks: u64 = buckets
        .iter()
        .map(|row| row[1].as_str().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(blocks >= 40, "{buckets:?}");
    let fullest = buckets
        .iter()
        .max_by_key(|row| row[1].as_str().unwrap().parse::<u64>().unwrap())
        .unwrap();
    let range = fullest[0].as_str().unwrap();
    let (from, to) = range.split_once(" – ").unwrap();
    let ms = |text: &str| -> f64 {
        let (value, unit) = text.split_once(' ').unwrap();
        let value: f64 = value.parse().unwrap();
        match unit {
            "s" => value * 1e3,
            "ms" => value,
            _ => value / 1e3,
        }
    };
    // A 20 ms sleep blocks a little longer than asked.
    assert!(ms(from) <= 23.0 && ms(to) >= 19.5, "{range}");
}

/// The document an HTML report draws (schema profiler.html/1).
fn html_document(report: &Path) -> Value {
    let page = std::fs::read_to_string(report).unwrap();
    let start = page.find("application/json\">").expect("the data element") + 18;
    let end = start + page[start..].find("</script>").unwrap();
    serde_json::from_str(&page[start..end]).unwrap()
}

/// The share of `event`'s weight (percent) in stacks through `function`, from its call tree.
fn tree_share(document: &Value, event: usize, function: &str) -> f64 {
    let tree = &document["events"][event]["tree"];
    let column = |name: &str| -> Vec<i64> {
        (tree[name].as_array().unwrap().iter())
            .map(|v| v.as_i64().unwrap())
            .collect()
    };
    let (parent, frame, weight) = (column("parent"), column("frame"), column("weight"));
    let named = |node: usize| document["frames"][frame[node] as usize]["name"] == function;
    let (mut through, mut all) = (0, 0);
    for (node, weight) in weight.iter().enumerate() {
        all += weight;
        let mut at = node as i64;
        while at >= 0 && !named(at as usize) {
            at = parent[at as usize];
        }
        if at >= 0 {
            through += weight;
        }
    }
    100.0 * through as f64 / all.max(1) as f64
}

#[test]
fn record_writes_the_html_report_and_a_perf_data_import_has_one_with_the_reports_shares() {
    require_root();
    let dir = temp_dir("html-sources");
    let cpu_split = workload("cpu_split");
    let (recorded, live, perf_data, imported) = (
        dir.join("cpu_split.prof"),
        dir.join("recorded.html"),
        dir.join("perf.data"),
        dir.join("imported.html"),
    );
    record_to(
        &recorded,
        &["-F", "1999", "--html", live.to_str().unwrap()],
        &[cpu_split.to_str().unwrap(), "2500"],
    );
    run_checked(
        "perf",
        &[
            "record",
            "-q",
            "-o",
            perf_data.to_str().unwrap(),
            "-e",
            "cpu-clock",
            "-F",
            "999",
            "-g",
            "--",
            cpu_split.to_str().unwrap(),
            "2500",
        ],
    );
    profiler(&[
        "report",
        "-i",
        perf_data.to_str().unwrap(),
        "--html",
        imported.to_str().unwrap(),
    ]);
    for (source, html) in [(&recorded, &live), (&perf_data, &imported)] {
        let report = report_json(source, &[]);
        let document = html_document(html);
        assert_eq!(document["schema"], "profiler.html/1");
        for function in ["cpu_split::heavy_work", "cpu_split::medium_work"] {
            let share = share_of(&report, function);
            let drawn = tree_share(&document, 0, function);
            assert!(
                (drawn - share).abs() <= 0.1,
                "{}: {function} {drawn:.2}% in the HTML report, {share:.2}% in the report",
                source.display()
            );
        }
    }
}
