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
