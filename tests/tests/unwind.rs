//! `record --unwind dwarf|fp` on a program built with -O2 -fomit-frame-pointer: the in-kernel
//! unwinder walks through frameless functions, glibc's qsort callback and memcpy to `_start` or
//! the thread start; the frame-pointer walk does not.

mod common;

use std::path::{Path, PathBuf};

use common::{profiler, temp_dir};

/// Builds tests/workloads/no_frame_pointers.c as the unwind-table tests do.
fn build_workload(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/no_frame_pointers.c");
    let binary = dir.join("no_frame_pointers");
    let status = std::process::Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-pthread", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .expect("gcc runs (Debian: apt-get install gcc)");
    assert!(status.success(), "gcc failed on {}", source.display());
    binary
}

/// Folded stacks (root first) and their samples, of a recording of the workload for 2 s.
fn record(unwind: &str, dir: &Path, binary: &Path) -> (Vec<(String, u64)>, String) {
    let profile = dir.join(format!("{unwind}.prof"));
    let output = profiler(&[
        "record",
        "--stats",
        "--unwind",
        unwind,
        "-o",
        profile.to_str().unwrap(),
        "--",
        binary.to_str().unwrap(),
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let folded = profiler(&["report", "-i", profile.to_str().unwrap(), "--folded", "-"]);
    let stacks = String::from_utf8_lossy(&folded.stdout)
        .lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            Some((stack.to_string(), count.parse().ok()?))
        })
        .collect();
    (stacks, stderr)
}

fn complete(stack: &str) -> bool {
    let frames: Vec<&str> = stack.split(';').collect();
    frames
        .get(1)
        .is_some_and(|root| *root == "_start" || *root == "clone3")
}

/// The numbers of the `--stats` line "user stacks unwound: N with tables (M complete)".
fn walked_and_complete(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|line| line.contains("user stacks unwound:"))
        .unwrap_or_else(|| panic!("no unwinder line in --stats:\n{stderr}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|word| word.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

#[test]
fn dwarf_unwinding_reaches_the_stack_roots_through_code_without_frame_pointers() {
    let dir = temp_dir("unwind-dwarf");
    let binary = build_workload(&dir);
    let (stacks, stderr) = record("dwarf", &dir, &binary);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert!(total > 1000, "too few samples: {total}\n{stderr}");
    let (walked, complete_walks) = walked_and_complete(&stderr);
    assert!(
        complete_walks as f64 >= 0.99 * walked as f64,
        "{complete_walks} of {walked} walks complete\n{stderr}"
    );
    let reached: u64 = stacks
        .iter()
        .filter(|(stack, _)| complete(stack))
        .map(|(_, n)| n)
        .sum();
    // The rest are taken before the agent has loaded the new process's mappings (frame-pointer
    // walks, counted in --stats).
    assert!(
        reached as f64 >= 0.9 * total as f64,
        "{reached} of {total} samples reach _start or clone3\n{stderr}"
    );
    // The qsort callback's whole chain, in order, from main or the thread.
    let callback: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(stack, _)| stack.ends_with("compare_ints;leaf_mix") && complete(stack))
        .collect();
    assert!(!callback.is_empty(), "no complete qsort callback stack");
    for (stack, _) in callback {
        let chain_from_main = "_start;__libc_start_main_impl;__libc_start_call_main;main;work;\
                               sort_some;__GI___qsort_r;msort_with_tmp";
        let chain_from_thread = "clone3;start_thread;thread_main;work;sort_some;__GI___qsort_r;\
                                 msort_with_tmp";
        let after_root = stack.split_once(';').unwrap().1;
        assert!(
            after_root.starts_with(chain_from_main) || after_root.starts_with(chain_from_thread),
            "qsort callback stack without its callers: {stack}"
        );
    }
    assert!(
        stacks.iter().all(|(stack, _)| !stack.contains("[unknown]")),
        "a garbage frame in a dwarf walk"
    );
}

#[test]
fn frame_pointer_walks_stop_at_the_first_frameless_function() {
    let dir = temp_dir("unwind-fp");
    let binary = build_workload(&dir);
    let (stacks, stderr) = record("fp", &dir, &binary);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert!(total > 1000, "too few samples: {total}\n{stderr}");
    let reached: u64 = stacks
        .iter()
        .filter(|(stack, _)| complete(stack))
        .map(|(_, n)| n)
        .sum();
    assert!(
        (reached as f64) < 0.5 * total as f64,
        "{reached} of {total} samples reach _start or clone3 by frame pointers alone"
    );
    assert!(
        !stderr.contains("user stacks unwound:"),
        "--unwind fp loads no tables\n{stderr}"
    );
}
