//! `profiler record` on the bundled workloads: attribution, call stacks, accounting.

mod common;

use common::{profiler_json, self_percent, wait_until_recording, workload, Running};

/// The split cpu_split measured with its own thread CPU clock, by function.
fn measured_split(stderr: &str) -> Vec<(String, f64)> {
    let line = stderr
        .lines()
        .find(|l| l.contains("measured CPU split:"))
        .unwrap_or_else(|| panic!("cpu_split printed no split:\n{stderr}"));
    let split = line.split("measured CPU split:").nth(1).unwrap();
    let words: Vec<&str> = split.split_whitespace().collect();
    words
        .chunks(2)
        .map(|pair| {
            (
                format!("cpu_split::{}", pair[0]),
                pair[1].trim_end_matches('%').parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn cpu_split_shares_match_the_workload() {
    let cpu_split = workload("cpu_split");
    // At 4999 Hz a 1.5 s run gives thousands of samples: the shares' sampling noise stays well
    // inside the tolerance.
    let (report, stderr) = profiler_json(&[
        "record",
        "--json",
        "-",
        "-F",
        "4999",
        "--",
        cpu_split.to_str().unwrap(),
    ]);
    let event = &report["events"][0];
    let samples = event["samples"].as_u64().unwrap();
    assert!(samples > 3000, "too few samples for a 1.5 s run: {samples}");
    let expected = [60.0, 30.0, 10.0];
    for ((function, measured), nominal) in measured_split(&stderr).iter().zip(expected) {
        let sampled = self_percent(event, function);
        assert!(
            (sampled - measured).abs() <= 5.0,
            "{function}: profiler says {sampled:.1}%, the workload measured {measured:.1}%"
        );
        assert!(
            (sampled - nominal).abs() <= 10.0,
            "{function}: profiler says {sampled:.1}%, designed for {nominal}%"
        );
    }
}

#[test]
fn hot_function_stacks_include_its_callers() {
    let cpu_split = workload("cpu_split");
    let (report, _) = profiler_json(&[
        "record",
        "--json",
        "-",
        "--paths",
        "20",
        "--",
        cpu_split.to_str().unwrap(),
    ]);
    let paths = report["events"][0]["hot_paths"].as_array().unwrap();
    let heavy = paths
        .iter()
        .find(|p| {
            p["functions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == "cpu_split::heavy_work")
        })
        .unwrap_or_else(|| panic!("no call path through heavy_work: {paths:#?}"));
    let functions: Vec<&str> = heavy["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let position = |name: &str| {
        functions
            .iter()
            .position(|f| *f == name)
            .unwrap_or_else(|| panic!("{name} missing from heavy_work's stack {functions:?}"))
    };
    // Leaf first: heavy_work <- run_round's closure <- timed (both inlined) <- run_round <- main.
    let heavy = position("cpu_split::heavy_work");
    assert_eq!(
        functions[heavy + 1..heavy + 4],
        [
            "cpu_split::run_round::{{closure}}",
            "cpu_split::timed",
            "cpu_split::run_round"
        ],
        "{functions:?}"
    );
    assert!(position("cpu_split::main") > position("cpu_split::run_round"));
}

#[test]
fn every_fired_sample_is_drained_or_reported_lost() {
    let cpu_split = workload("cpu_split");
    let (report, _) = profiler_json(&[
        "record",
        "--json",
        "-",
        "--drain-interval",
        "50",
        "-F",
        "4999",
        "--",
        cpu_split.to_str().unwrap(),
        "2000",
    ]);
    let event = &report["events"][0];
    let fired = event["samples_fired"].as_u64().unwrap();
    let drained = event["samples"].as_u64().unwrap();
    let losses = &report["losses"];
    let lost = losses["samples lost: stack-count map full"]
        .as_u64()
        .unwrap()
        + losses["samples lost: unregistered perf event"]
            .as_u64()
            .unwrap();
    assert!(
        fired > 1000,
        "expected thousands of samples at 4999 Hz, got {fired}"
    );
    assert_eq!(
        fired,
        drained + lost,
        "fired {fired} != drained {drained} + lost {lost}"
    );
}

#[test]
fn ctrl_c_stops_a_system_wide_run_and_drains_everything() {
    common::require_root();
    let mut profiler = Running::spawn(
        std::process::Command::new(common::profiler_bin())
            .args(["record", "-a", "--json", "-", "-F", "999"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
    );
    // No signal before the profiler handles it and records: an early one would kill it.
    wait_until_recording(profiler.id());
    let cpu_split = workload("cpu_split");
    std::process::Command::new(&cpu_split)
        .arg("3000")
        .output()
        .unwrap();
    profiler.signal(libc::SIGINT);
    let output = profiler.output_at_most(std::time::Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let event = &report["events"][0];
    assert_eq!(
        event["samples_fired"], event["samples"],
        "every fired sample drained after SIGINT"
    );
    assert!(
        self_percent(event, "cpu_split::heavy_work") > 5.0,
        "{event:#}"
    );
    assert_eq!(report["recording"]["stop"], "signal SIGINT", "{stderr}");
}

#[test]
fn a_process_in_another_mount_namespace_is_symbolized_after_it_exits() {
    // The workload runs from a tmpfs mounted only inside its own mount namespace (as in a
    // container): once it exits, its binary's path leads nowhere on the host.
    let hidden = std::env::temp_dir().join(format!("profiler-ns-{}", std::process::id()));
    std::fs::create_dir_all(&hidden).unwrap();
    let script = format!(
        "mount -t tmpfs none {dir} && cp {bin} {dir}/cpu_split_ns && exec {dir}/cpu_split_ns 2000",
        dir = hidden.display(),
        bin = workload("cpu_split").display()
    );
    let (report, stderr) = profiler_json(&[
        "record",
        "--json",
        "-",
        "--",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        &script,
    ]);
    assert!(
        std::fs::read_dir(&hidden).unwrap().next().is_none(),
        "the host must not see the namespace's files"
    );
    std::fs::remove_dir(&hidden).ok();
    let event = &report["events"][0];
    let heavy = event["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == "cpu_split::heavy_work")
        .unwrap_or_else(|| panic!("heavy_work not symbolized: {event:#}\n{stderr}"));
    assert_eq!(heavy["module"], "cpu_split_ns");
    assert!(
        heavy["self_percent"].as_f64().unwrap() > 30.0,
        "{heavy:#}\nall functions: {:#}\n{stderr}",
        event["functions"]
    );
}

/// Under process churn most processes begin and end between two reads of the side-band, and
/// enter the process table only once a drain finds a sample of them. Those sampled are still
/// symbolized, after they exited, against the image they ran: the parent's before their exec
/// (inherited at the fork), their own after.
#[test]
fn short_lived_children_are_symbolized_after_they_exit() {
    // With frame pointers only, nothing asks the agent for a new process's tables: most
    // children are first read after they exited. With tables, a child sampled early asks
    // for its tables, and the agent reads it while it lives.
    for unwind in ["fp", "dwarf"] {
        short_lived_children_are_symbolized(unwind);
    }
}

fn short_lived_children_are_symbolized(unwind: &str) {
    let dir = common::temp_dir("short-lives");
    let file = dir.join("churn.prof");
    let churn = workload("short_processes");
    // Drains every 50 ms: a child's life is held across several before the run ends.
    let stderr = common::record_to(
        &file,
        &["-F", "20000", "--drain-interval", "50", "--unwind", unwind],
        &[churn.to_str().unwrap(), "300"],
    );
    let profile = profiler::profile::file::read_profile(&file).unwrap();
    // The parent runs throughout; each child for a millisecond or two.
    let mut per_pid = std::collections::BTreeMap::<u32, u64>::new();
    for stack in &profile.stacks {
        *per_pid.entry(stack.pid).or_default() += stack.count;
    }
    let parent = per_pid
        .iter()
        .max_by_key(|(_, count)| **count)
        .map(|(pid, _)| *pid);
    let mut children = std::collections::BTreeSet::new();
    let (mut user_leaves, mut in_a_module, mut named) = (0u64, 0u64, 0u64);
    for stack in profile.stacks.iter().filter(|s| Some(s.pid) != parent) {
        let user_leaf = stack
            .frames
            .iter()
            .map(|id| &profile.frames[*id as usize])
            .find(|frame| !frame.kernel);
        let Some(leaf) = user_leaf else { continue };
        children.insert(stack.pid);
        user_leaves += stack.count;
        if !leaf.module.is_empty() {
            in_a_module += stack.count;
        }
        if leaf.function.is_some() {
            named += stack.count;
        }
    }
    assert!(
        children.len() > 50,
        "--unwind {unwind}: user-space samples in only {} of 300 children\n{stderr}",
        children.len()
    );
    assert!(
        in_a_module * 100 >= user_leaves * 99,
        "--unwind {unwind}: {in_a_module} of the children's {user_leaves} user-space leaves are in a known \
         module\n{stderr}"
    );
    assert!(
        named * 100 >= user_leaves * 90,
        "--unwind {unwind}: {named} of the children's {user_leaves} user-space leaves are named\n{stderr}"
    );
    std::fs::remove_dir_all(dir).ok();
}
