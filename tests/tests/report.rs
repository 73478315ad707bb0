//! `profiler report` on real recordings of the bundled workloads: every view, the exports read
//! back by independent readers, perf.data files, and corrupt inputs.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use common::{
    c_workload::build_no_frame_pointers, google_pprof, profiler, profiler_bin, record_page_faults,
    record_to, report_json, temp_dir, touched_region, workload,
};
use serde_json::Value;

/// One recording of cpu_split, shared by the tests of this file.
fn cpu_split_profile() -> &'static Path {
    static PROFILE: OnceLock<PathBuf> = OnceLock::new();
    PROFILE.get_or_init(|| {
        let file = temp_dir("cpu-split").join("cpu_split.prof");
        let cpu_split = workload("cpu_split");
        profiler(&[
            "record",
            "-F",
            "1999",
            "-o",
            file.to_str().unwrap(),
            "--",
            cpu_split.to_str().unwrap(),
            "3000",
        ]);
        file
    })
}

fn rows<'a>(report: &'a Value, name: &str) -> &'a Vec<Value> {
    report["events"][0][name]
        .as_array()
        .unwrap_or_else(|| panic!("no {name} rows: {report:#}"))
}

#[test]
fn thread_module_and_function_views() {
    let file = cpu_split_profile();
    let threads = report_json(file, &["--by", "thread"]);
    let top = &rows(&threads, "threads")[0];
    assert_eq!(top["comm"], "cpu_split");
    assert!(top["percent"].as_f64().unwrap() > 90.0, "{top:#}");

    let modules = report_json(file, &["--by", "module"]);
    let top = &rows(&modules, "modules")[0];
    assert!(
        top["module"].as_str().unwrap().ends_with("/cpu_split"),
        "{top:#}"
    );
    assert!(top["percent"].as_f64().unwrap() > 90.0, "{top:#}");

    let functions = report_json(file, &["--by", "function"]);
    let names: Vec<&str> = rows(&functions, "functions")
        .iter()
        .take(3)
        .map(|f| f["function"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cpu_split::heavy_work",
            "cpu_split::medium_work",
            "cpu_split::light_work"
        ]
    );
    // A live recording: events estimated from the counter's own exact count.
    let event = &functions["events"][0];
    assert_eq!(event["estimate"]["method"], "counted");
    let per_sample = event["estimate"]["events_per_sample"].as_f64().unwrap();
    // About the 1999 Hz period (500,250 ns): more where a timer tick came late.
    assert!(
        (500_000.0..550_000.0).contains(&per_sample),
        "{per_sample} ns per sample"
    );
}

#[test]
fn line_instruction_and_icache_line_views() {
    let file = cpu_split_profile();
    // Lines are the innermost inlined locations: the workload's own loop lines, and the
    // standard library's arithmetic inlined into them.
    let lines = report_json(file, &["--by", "line", "--top", "10"]);
    let lines = rows(&lines, "lines");
    assert!(lines[0]["line"].as_u64().unwrap() > 0, "{lines:#?}");
    let workload_line = |l: &&Value| {
        l["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("workloads/cpu_split.rs"))
            && l["line"].as_u64().is_some()
    };
    assert!(
        lines.iter().any(|l| workload_line(&l)),
        "no cpu_split.rs line among the hottest: {lines:#?}"
    );

    let instructions = report_json(file, &["--by", "instruction"]);
    let top = &rows(&instructions, "instructions")[0];
    let location = top["location"].as_str().unwrap();
    assert!(location.starts_with("cpu_split::heavy_work+0x"), "{top:#}");

    let icache = report_json(file, &["--by", "icache-line"]);
    let top = &rows(&icache, "icache_lines")[0];
    assert_eq!(top["address"].as_u64().unwrap() % 64, 0, "{top:#}");
    assert!(
        top["functions"]
            .to_string()
            .contains("cpu_split::heavy_work"),
        "{top:#}"
    );
}

#[test]
fn function_details_disassemble_the_hot_function_by_cache_line() {
    let file = cpu_split_profile();
    let details = report_json(file, &["--function", "cpu_split::heavy_work"]);
    let function = &details["events"][0]["function_details"];
    assert_eq!(function["code"], "disassembled", "{function:#}");
    let rows = function["rows"].as_array().unwrap();
    let instructions: Vec<&Value> = rows.iter().filter(|r| r["row"] == "instruction").collect();
    assert!(instructions.len() > 5);
    assert!(instructions.iter().all(|i| i["text"].is_string()));
    let sampled: u64 = instructions
        .iter()
        .map(|i| i["samples"].as_u64().unwrap())
        .sum();
    assert_eq!(sampled, function["samples"].as_u64().unwrap());
    assert!(rows.iter().any(|r| r["row"] == "statement"));
    // The text form groups by cache line with rows of dashes between lines.
    let text = String::from_utf8(
        profiler(&[
            "report",
            "-i",
            file.to_str().unwrap(),
            "--function",
            "cpu_split::heavy_work",
        ])
        .stdout,
    )
    .unwrap();
    assert!(text.contains("-----"), "{text}");
}

#[test]
fn function_details_have_source_lines_where_the_module_has_debug_information() {
    // A sampled function's code is kept whether or not its module has debug information; its
    // instructions are line-mapped only where the sampled addresses have lines.
    let dir = temp_dir("code-lines");
    for (name, flags, lines) in [
        ("with_lines", &["-g"][..], true),
        ("without", &[][..], false),
    ] {
        let binary = build_no_frame_pointers(&dir, name, flags);
        let file = dir.join(format!("{name}.prof"));
        record_to(
            &file,
            &["-F", "999"],
            &[binary.to_str().unwrap(), "1000", "mix"],
        );
        let details = report_json(&file, &["--function", "leaf_mix"]);
        let function = &details["events"][0]["function_details"];
        assert_eq!(function["code"], "disassembled", "{name}: {function:#}");
        let rows = function["rows"].as_array().unwrap();
        let instructions = rows.iter().filter(|r| r["row"] == "instruction").count();
        assert!(instructions > 5, "{name}: {function:#}");
        assert_eq!(
            rows.iter().any(|r| r["row"] == "statement"),
            lines,
            "{name}: {function:#}"
        );
    }
}

#[test]
fn reports_say_how_whole_the_user_stacks_are() {
    let file = cpu_split_profile();
    let report = report_json(file, &[]);
    let stacks = &report["events"][0]["user_stacks"];
    let samples = stacks["samples"].as_u64().unwrap();
    assert!(samples > 100, "{stacks:#}");
    // cpu_split is built with frame pointers: its stacks reach main.
    assert!(
        stacks["complete_percent"].as_f64().unwrap() > 95.0,
        "{stacks:#}"
    );
    assert_eq!(
        stacks["complete"].as_u64().unwrap()
            + stacks["incomplete"].as_u64().unwrap()
            + stacks["lost"].as_u64().unwrap(),
        samples
    );
    assert!(stacks["mean_depth"].as_f64().unwrap() >= 4.0, "{stacks:#}");
    let text =
        String::from_utf8(profiler(&["report", "-i", file.to_str().unwrap()]).stdout).unwrap();
    assert!(text.contains("user stacks: "), "{text}");
    // The profile keeps the architecture its addresses and code are of.
    let profile = profiler::profile::file::read_profile(file).unwrap();
    assert_eq!(profile.meta.architecture, std::env::consts::ARCH);
    assert!(
        text.contains(&format!(", {}), ", std::env::consts::ARCH)),
        "{text}"
    );
}

#[test]
fn callers_and_callees() {
    let file = cpu_split_profile();
    let neighbours = |direction: &str, function: &str| -> Vec<String> {
        let graph = report_json(file, &[&format!("--{direction}"), function]);
        graph["events"][0][direction]["neighbours"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["function"].as_str().map(str::to_string))
            .collect()
    };
    // run_round calls each function through `timed` and a closure, both inlined into it: call
    // graphs walk inlined functions as frames, as folded stacks show them.
    assert_eq!(
        neighbours("callers", "cpu_split::heavy_work"),
        ["cpu_split::run_round::{{closure}}"]
    );
    assert_eq!(
        neighbours("callers", "cpu_split::timed"),
        ["cpu_split::run_round"]
    );
    assert_eq!(
        neighbours("callees", "cpu_split::run_round"),
        ["cpu_split::timed"]
    );
    let mut callees = neighbours("callees", "cpu_split::run_round::{{closure}}");
    callees.sort();
    assert_eq!(
        callees,
        [
            "cpu_split::heavy_work",
            "cpu_split::light_work",
            "cpu_split::medium_work"
        ]
    );
}

#[test]
fn inlined_functions_are_selected_like_any_other() {
    let file = cpu_split_profile();
    // `churn` is inlined into heavy_work, medium_work and light_work.
    let callers = report_json(file, &["--callers", "churn"]);
    let graph = &callers["events"][0]["callers"];
    assert_eq!(graph["function"], "cpu_split::churn", "{graph:#}");
    let named: Vec<&str> = graph["neighbours"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["function"].as_str())
        .collect();
    assert_eq!(
        named[..3],
        [
            "cpu_split::heavy_work",
            "cpu_split::medium_work",
            "cpu_split::light_work"
        ],
        "{graph:#}"
    );
    let details = report_json(file, &["--function", "cpu_split::churn"]);
    let function = &details["events"][0]["function_details"];
    assert_eq!(function["function"], "cpu_split::churn", "{function:#}");
    assert_eq!(function["inlined_into"], "cpu_split::heavy_work");
    assert!(function["samples"].as_u64().unwrap() > 0);
}

#[test]
fn a_function_is_found_by_any_of_its_names() {
    // glibc's memcpy is one function with several names (`__memcpy_*_unaligned_erms` is
    // `__memmove_*_unaligned_erms`); its internal names are in libc6-dbg's debug file.
    let dir = temp_dir("aliases");
    let file = dir.join("memcpy.prof");
    profiler(&[
        "record",
        "-F",
        "999",
        "-o",
        file.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        "b = bytes(32 << 20)\nfor _ in range(40): bytearray(b)",
    ]);
    let profile = profiler::profile::file::read_profile(&file).unwrap();
    let aliases = profile
        .function_aliases
        .iter()
        .find(|a| {
            a.module.ends_with("libc.so.6")
                && a.names.iter().any(|n| n.starts_with("__memcpy_"))
                && a.names.iter().any(|n| n.starts_with("__memmove_"))
        })
        .unwrap_or_else(|| panic!("no memcpy aliases: {:#?}", profile.function_aliases));
    let mut found = Vec::new();
    for name in &aliases.names {
        let callers = report_json(&file, &["--callers", name]);
        let graph = &callers["events"][0]["callers"];
        found.push((
            graph["function"].as_str().unwrap().to_string(),
            graph["total_samples"].as_u64().unwrap(),
        ));
    }
    assert!(found[0].1 > 0, "{found:?}");
    assert!(found.iter().all(|f| *f == found[0]), "{found:?}");
    assert!(aliases.names.contains(&found[0].0), "{found:?}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn exports_read_back_with_independent_readers() {
    let file = cpu_split_profile();
    let dir = temp_dir("exports");
    let (svg, pb, folded) = (
        dir.join("fg.svg"),
        dir.join("p.pb.gz"),
        dir.join("stacks.folded"),
    );
    let summary = report_json(
        file,
        &[
            "--flamegraph",
            svg.to_str().unwrap(),
            "--pprof",
            pb.to_str().unwrap(),
            "--folded",
            folded.to_str().unwrap(),
        ],
    );
    let samples = summary["events"][0]["samples"].as_u64().unwrap();

    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("cpu_split::heavy_work"));

    let folded = std::fs::read_to_string(&folded).unwrap();
    let folded_total: u64 = folded
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(folded_total, samples);
    // Callers come before callees on each line, inlined frames (`_[i]`) in between. The
    // heaviest such stack: a rare sample may carry a stack the unwinder cut short.
    let count = |line: &str| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
    let heavy = folded
        .lines()
        .filter(|l| l.contains("cpu_split::heavy_work"))
        .max_by_key(|l| count(l))
        .unwrap_or_else(|| panic!("no heavy_work stack:\n{folded}"));
    assert!(
        heavy.find("cpu_split::run_round").unwrap() < heavy.find("cpu_split::heavy_work").unwrap(),
        "{heavy}"
    );

    let top = Command::new(google_pprof())
        .args(["-top", "-sample_index=0"])
        .arg(&pb)
        .output()
        .unwrap();
    assert!(
        top.status.success(),
        "{}",
        String::from_utf8_lossy(&top.stderr)
    );
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(top.contains("cpu_split::heavy_work"), "{top}");
    assert!(
        top.contains(&format!("of {samples} total")),
        "pprof's total differs from the report's {samples} samples:\n{top}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn dcache_line_view_of_page_faults() {
    let dir = temp_dir("dcache");
    let file = dir.join("faults.prof");
    let output = record_page_faults(&file, &[], &["400", "3"]);
    let (region, _, _) = touched_region(&String::from_utf8_lossy(&output.stderr));
    let report = report_json(&file, &["--by", "dcache-line", "--top", "5000"]);
    let lines: Vec<&Value> = rows(&report, "dcache_lines")
        .iter()
        .filter(|l| (region..region + 400 * 4096).contains(&l["address"].as_u64().unwrap()))
        .collect();
    assert_eq!(lines.len(), 400);
    for line in &lines {
        assert_eq!((line["address"].as_u64().unwrap() - region) % 4096, 3 * 64);
        assert_eq!(line["samples"], 1);
        let functions = line["details"]["functions"].to_string();
        assert!(functions.contains("page_toucher::touch_pages"), "{line:#}");
        assert!(line["details"]["threads"].is_array(), "{line:#}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn perf_data_files_report_like_our_own() {
    let dir = temp_dir("perfdata");
    let data = dir.join("perf.data");
    let cpu_split = workload("cpu_split");
    let recorded = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "999", "-g", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&cpu_split)
        .arg("3000")
        .output()
        .expect("perf is installed");
    assert!(recorded.status.success());
    let report = report_json(&data, &["--by", "function"]);
    let top = &rows(&report, "functions")[0];
    assert_eq!(top["function"], "cpu_split::heavy_work", "{report:#}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn corrupt_and_truncated_files_are_rejected_clearly() {
    let dir = temp_dir("corrupt");
    let garbage = dir.join("garbage.prof");
    std::fs::write(&garbage, b"this is not a profile at all").unwrap();
    let truncated = dir.join("truncated.prof");
    let whole = std::fs::read(cpu_split_profile()).unwrap();
    std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
    for (file, expected) in [(&garbage, "not a profile"), (&truncated, "truncated")] {
        let output = Command::new(profiler_bin())
            .args(["report", "-i"])
            .arg(file)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{}: {stderr}", file.display());
    }
    std::fs::remove_dir_all(dir).ok();
}

/// `profiler report -i FILE ARGS` as text, its standard output piped, with `COLUMNS` set to
/// `columns` or unset, and NO_COLOR unset.
fn text_report(file: &Path, args: &[&str], columns: Option<usize>) -> String {
    let mut command = Command::new(profiler_bin());
    command
        .args(["report", "-i", file.to_str().unwrap()])
        .args(args)
        .env_remove("COLUMNS")
        .env_remove("NO_COLOR");
    if let Some(columns) = columns {
        command.env("COLUMNS", columns.to_string());
    }
    let output = command.output().expect("the profiler runs");
    assert!(
        output.status.success(),
        "report {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("the report is UTF-8")
}

/// The paths of a text report's hot call paths (leaf first), without their counts.
fn hot_paths_of(text: &str) -> Vec<String> {
    let start = text.find("Hot call paths").expect("hot paths");
    text[start..]
        .lines()
        .skip(2)
        .take_while(|line| !line.is_empty())
        .map(|line| {
            let mut rest = line.trim_start();
            for _ in 0..2 {
                rest = rest.split_once(' ').expect("samples and %").1.trim_start();
            }
            rest.to_string()
        })
        .collect()
}

/// The root (last, outermost) frame of a leaf-first path.
fn root_of(path: &str) -> &str {
    path.rsplit(" <- ").next().unwrap()
}

const RUNTIME_FRAMES: [&str; 5] = [
    "_start",
    "__libc_start",
    "std::rt::lang_start",
    "catch_unwind",
    "start_thread",
];

fn flamegraph_titles(file: &Path, args: &[&str]) -> (String, Vec<String>) {
    let svg_file = file.with_extension(format!("{}.svg", args.len()));
    let mut all = vec![
        "report",
        "-i",
        file.to_str().unwrap(),
        "--flamegraph",
        svg_file.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    profiler(&all);
    let svg = std::fs::read_to_string(&svg_file).unwrap();
    let titles = svg
        .split("<title>")
        .skip(1)
        .filter_map(|t| t.split_once("</title>").map(|(t, _)| t.to_string()))
        .collect();
    (svg, titles)
}

fn folded_of(file: &Path) -> String {
    let output = profiler(&["report", "-i", file.to_str().unwrap(), "--folded", "-"]);
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn runtime_start_up_frames_are_hidden_from_hot_paths_and_flame_graphs_and_kept_in_exports() {
    // Rust: the paths start at the program's main, not in std::rt.
    let rust = cpu_split_profile();
    let paths = hot_paths_of(&text_report(rust, &["--paths", "3"], None));
    assert_eq!(paths.len(), 3, "{paths:?}");
    for path in &paths {
        assert_eq!(root_of(path), "cpu_split::main", "{path}");
        for runtime in RUNTIME_FRAMES {
            assert!(!path.contains(runtime), "{runtime} in {path}");
        }
    }
    let shown = hot_paths_of(&text_report(
        rust,
        &["--paths", "3", "--show-runtime-frames"],
        None,
    ));
    assert_eq!(root_of(&shown[0]), "_start", "{shown:?}");
    let (_, titles) = flamegraph_titles(rust, &[]);
    assert!(titles.iter().any(|t| t.starts_with("cpu_split::main (")));
    assert!(
        !titles
            .iter()
            .any(|t| t.starts_with("std::rt::lang_start") || t.starts_with("_start (")),
        "{titles:?}"
    );
    let (_, titles) = flamegraph_titles(rust, &["--show-runtime-frames"]);
    assert!(titles.iter().any(|t| t.starts_with("std::rt::lang_start")));
    // Exports for tools keep every frame.
    let folded = folded_of(rust);
    assert!(folded.contains("cpu_split;_start;"), "{folded:.500}");
    assert!(folded.contains("std::rt::lang_start_internal"));
    let json = report_json(rust, &["--paths", "1"]);
    let functions = json["events"][0]["hot_paths"][0]["functions"]
        .as_array()
        .unwrap();
    assert_eq!(functions.last().unwrap(), "_start", "{functions:?}");

    // C, with a second thread: paths start at main and at the thread's function.
    let dir = temp_dir("runtime-frames-c");
    let binary = build_no_frame_pointers(&dir, "sorter", &[]);
    let c = dir.join("c.prof");
    record_to(&c, &["-F", "999"], &[binary.to_str().unwrap(), "1500"]);
    let paths = hot_paths_of(&text_report(&c, &["--paths", "10"], None));
    let roots: Vec<&str> = paths.iter().map(|p| root_of(p)).collect();
    assert!(roots.contains(&"main"), "{paths:#?}");
    assert!(roots.contains(&"copier_main"), "{paths:#?}");
    for path in &paths {
        for runtime in RUNTIME_FRAMES.iter().chain(&["clone3"]) {
            assert!(!path.contains(runtime), "{runtime} in {path}");
        }
    }
    let folded = folded_of(&c);
    assert!(
        folded.contains(";start_thread;copier_main;"),
        "{folded:.800}"
    );
    assert!(
        folded.contains(";__libc_start_call_main;main;"),
        "{folded:.800}"
    );
}

/// deep_stack's recording, shared by the tests that need deep stacks.
fn deep_stack_profile() -> &'static Path {
    static PROFILE: OnceLock<PathBuf> = OnceLock::new();
    PROFILE.get_or_init(|| {
        let file = temp_dir("deep-stack").join("deep_stack.prof");
        let deep = workload("deep_stack");
        record_to(&file, &["-F", "999"], &[deep.to_str().unwrap(), "3000"]);
        file
    })
}

#[test]
fn text_lines_fit_the_terminal_and_files_are_bounded_without_trailing_spaces() {
    let file = deep_stack_profile();
    for (columns, bound) in [(Some(80), 80), (Some(120), 120), (None, 200)] {
        let text = text_report(file, &[], columns);
        for line in text.lines() {
            assert!(line.chars().count() <= bound, "{columns:?}: {line:?}");
            assert_eq!(line, line.trim_end(), "{columns:?}: trailing spaces");
        }
        // The module column stays; function names shrink instead.
        let header = text
            .lines()
            .find(|l| l.trim_start().starts_with("self "))
            .unwrap();
        assert!(header.ends_with(" module"), "{columns:?}: {header}");
        assert!(
            text.lines()
                .any(|l| l.contains("deep_stack::leaf_work") && l.ends_with(" deep_stack")),
            "{columns:?}: {text}"
        );
        // The 60-frame path keeps its leaf and its root, and says how many frames are between.
        let paths = hot_paths_of(&text);
        let path = paths
            .iter()
            .find(|p| p.starts_with("deep_stack::leaf_work <- "))
            .unwrap_or_else(|| panic!("{columns:?}: no path from leaf_work in {paths:#?}"));
        assert_eq!(root_of(path), "deep_stack::main", "{path}");
        let between: usize = path
            .split("… ")
            .nth(1)
            .and_then(|rest| rest.split(" frames").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{columns:?}: no elided frames in {path}"));
        let shown = path.split(" <- ").count() - 1;
        assert!(shown + between >= 62, "{shown} + {between}: {path}");
    }
    // `record --report FILE` writes the same bounded lines, whatever the terminal.
    let dir = temp_dir("report-file");
    let report = dir.join("report.txt");
    let deep = workload("deep_stack");
    let output = Command::new(profiler_bin())
        .args(["record", "-F", "999", "--report"])
        .arg(&report)
        .args(["--", deep.to_str().unwrap(), "1000"])
        .env("COLUMNS", "80")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.contains("Hot call paths"), "{text}");
    assert!(
        text.lines().any(|l| l.chars().count() > 80),
        "a file is not the terminal"
    );
    for line in text.lines() {
        assert!(line.chars().count() <= 200, "{line:?}");
        assert_eq!(line, line.trim_end(), "trailing spaces");
    }
}

#[test]
fn flame_graphs_of_deep_stacks_fit_one_screen_and_the_folded_export_keeps_them_whole() {
    let file = deep_stack_profile();
    let (svg, titles) = flamegraph_titles(file, &[]);
    let height: f64 = svg
        .split("<svg ")
        .nth(1)
        .and_then(|svg| svg.split("height=\"").nth(1))
        .and_then(|h| h.split('"').next())
        .and_then(|h| h.parse().ok())
        .expect("the SVG's height");
    assert!(height <= 900.0, "{height} px");
    assert!(
        titles.iter().any(|t| t.starts_with("[… frames cut …] (")),
        "{titles:?}"
    );
    // Both ends of the cut stacks are drawn: the program's main and the leaf.
    for function in [
        "deep_stack::main (",
        "deep_stack::frame_01 (",
        "deep_stack::leaf_work (",
    ] {
        assert!(
            titles.iter().any(|t| t.starts_with(function)),
            "{function}: {titles:?}"
        );
    }
    let deepest = folded_of(file)
        .lines()
        .map(|line| line.split(';').count())
        .max()
        .unwrap();
    assert!(deepest > 60, "the folded export keeps {deepest} frames");
}

#[test]
fn colour_on_request_and_never_when_piped() {
    let file = cpu_split_profile();
    let plain = text_report(file, &[], None);
    assert!(!plain.contains('\x1b'), "piped: no colour");
    let colored = text_report(file, &["--color", "always"], None);
    assert!(colored.contains("\x1b[1mEvent cpu-clock"), "{colored}");
    // cpu_split's heaviest function takes about half the samples: a hot share.
    assert!(colored.contains("\x1b[1;31m"), "{colored}");
    let stripped = colored
        .replace("\x1b[1;31m", "")
        .replace("\x1b[1m", "")
        .replace("\x1b[33m", "")
        .replace("\x1b[0m", "");
    assert_eq!(stripped, plain, "colour changes nothing else");
    assert_eq!(text_report(file, &["--color", "never"], None), plain);
    let error = Command::new(profiler_bin())
        .args([
            "report",
            "-i",
            file.to_str().unwrap(),
            "--color",
            "sometimes",
        ])
        .output()
        .unwrap();
    assert!(!error.status.success());
    assert!(
        String::from_utf8_lossy(&error.stderr).contains("auto, always, never"),
        "{error:?}"
    );
}
