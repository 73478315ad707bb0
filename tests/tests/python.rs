//! Python frames: `record` of CPython 3.10, 3.11, 3.12 and 3.13 (pyenv's builds, which have no
//! frame pointers and a shared libpython, and Debian's 3.11, the interpreter built into its
//! stripped program) names the script's functions, in their callers, with native code a Python
//! function called under it, in the shares of CPU time the script measures itself; off the CPU,
//! a Python function's sleeps are under it.

mod common;

use std::{collections::HashMap, path::PathBuf};

use common::{profiler, report_json, temp_dir};
use serde_json::Value;

/// The interpreters the tests run: every CPython 3.10-3.13 this machine kind carries.
fn interpreters() -> Vec<PathBuf> {
    let mut found = vec![PathBuf::from("/usr/bin/python3.11")];
    for minor in 10..=13 {
        let pyenv = std::fs::read_dir("/root/.pyenv/versions")
            .expect("pyenv's interpreters (/root/.pyenv/versions) on this machine kind")
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.path())
            .find(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with(&format!("3.{minor}.")))
            })
            .unwrap_or_else(|| panic!("no CPython 3.{minor} under /root/.pyenv/versions"));
        found.push(pyenv.join("bin/python3"));
    }
    for interpreter in &found {
        assert!(
            interpreter.is_file(),
            "{} is missing",
            interpreter.display()
        );
    }
    found
}

/// CPU time split over two pure-Python leaves and zlib's compressor (native code under the
/// Python function that calls it), each call timed by the thread's CPU clock; prints the split.
/// The leaves' sizes vary at random: a loop of fixed length that happens to be close to a whole
/// number of sampling periods would be sampled at the same few phases all run long (aliasing),
/// and miss a leaf's share by more than sampling noise (3.12's loop did, by 4 points in CI).
const SPLIT_SCRIPT: &str = r#"
import json, random, sys, time, zlib

spent = {"alpha_hot": 0.0, "beta_cold": 0.0, "squeeze": 0.0}
DATA = bytes(range(256)) * 400

def alpha_hot(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

def beta_cold(n):
    total = 0
    for i in range(n):
        total ^= i
    return total

def squeeze():
    return zlib.compress(DATA, 9)

def timed(name, call, *args):
    start = time.thread_time()
    call(*args)
    spent[name] += time.thread_time() - start

def main(seconds):
    end = time.time() + seconds
    while time.time() < end:
        timed("alpha_hot", alpha_hot, random.randrange(30000, 90000))
        timed("beta_cold", beta_cold, random.randrange(12500, 37500))
        timed("squeeze", squeeze)

main(float(sys.argv[1]))
print(json.dumps(spent))
"#;

/// Folded stacks of a recording: frames root first, and each stack's samples.
fn folded(profile: &std::path::Path) -> Vec<(Vec<String>, u64)> {
    let output = profiler(&["report", "-i", profile.to_str().unwrap(), "--folded", "-"]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            let frames = stack.split(';').map(String::from).collect();
            Some((frames, count.parse().ok()?))
        })
        .collect()
}

/// `profiler record OPTIONS -o DIR/NAME.prof -- INTERPRETER FLAGS DIR/NAME.py ARGS` of
/// `script`: the profile, what the script printed as JSON, and the recording's stderr.
fn record_script(
    (interpreter, flags): (&std::path::Path, &[&str]),
    script: (&str, &str),
    options: &[&str],
    args: &[&str],
) -> (PathBuf, Value, String) {
    let (name, text) = script;
    let dir = temp_dir(name);
    let source = dir.join(format!("{name}.py"));
    std::fs::write(&source, text).unwrap();
    let profile = dir.join(format!("{name}.prof"));
    let mut all = vec!["record"];
    all.extend_from_slice(options);
    all.extend_from_slice(&["-o", profile.to_str().unwrap(), "--"]);
    all.push(interpreter.to_str().unwrap());
    all.extend_from_slice(flags);
    all.push(source.to_str().unwrap());
    all.extend_from_slice(args);
    let output = profiler(&all);
    let printed = output
        .stdout
        .split(|&byte| byte == b'\n')
        .find(|line| line.starts_with(b"{"))
        .unwrap_or_else(|| panic!("{}: the script printed no JSON", interpreter.display()));
    let printed = serde_json::from_slice(printed).unwrap();
    (
        profile,
        printed,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The Python chain each leaf function is called through.
const CHAIN: [&str; 3] = ["<module>", "main", "timed"];
const LEAVES: [&str; 3] = ["alpha_hot", "beta_cold", "squeeze"];

/// The leaf of a stack (frames root first) whose Python frames are the whole chain, outermost
/// first, then a leaf, with native frames of the interpreter around and between them; and where
/// `<module>` is.
fn python_chain(frames: &[String]) -> Option<(usize, String)> {
    let at = frames.iter().position(|frame| frame == "<module>")?;
    let python: Vec<&str> = frames[at..]
        .iter()
        .map(String::as_str)
        .filter(|frame| CHAIN.contains(frame) || LEAVES.contains(frame))
        .collect();
    let (leaf, chain) = python.split_last()?;
    (chain == CHAIN && LEAVES.contains(leaf)).then(|| (at, leaf.to_string()))
}

#[test]
fn every_cpython_version_names_the_scripts_functions_in_their_measured_shares() {
    for interpreter in interpreters() {
        let what = interpreter.display().to_string();
        let (profile, printed, stderr) = record_script(
            (&interpreter, &[]),
            ("split", SPLIT_SCRIPT),
            &["--stats", "-F", "999"],
            &["4"],
        );
        let measured: HashMap<String, f64> = serde_json::from_value(printed).unwrap();
        let measured_total: f64 = measured.values().sum();
        let stacks = folded(&profile);
        let total: u64 = stacks.iter().map(|(_, n)| n).sum();
        let mut by_leaf: HashMap<String, u64> = HashMap::new();
        let mut under_squeeze_native = 0;
        for (frames, count) in &stacks {
            if let Some((_, leaf)) = python_chain(frames) {
                *by_leaf.entry(leaf.clone()).or_default() += count;
                let after = frames
                    .iter()
                    .skip_while(|frame| *frame != "squeeze")
                    .skip(1);
                if leaf == "squeeze" && after.clone().any(|frame| frame.contains("deflate")) {
                    under_squeeze_native += count;
                }
            }
        }
        let whole: u64 = by_leaf.values().sum();
        // Start-up and shutdown (no Python frame yet, or any more) are the rest.
        assert!(
            whole * 100 >= total * 95,
            "{what}: {whole} of {total} samples reach <module> through main and timed\n{stderr}"
        );
        for leaf in LEAVES {
            let sampled = 100.0 * by_leaf.get(leaf).copied().unwrap_or(0) as f64 / whole as f64;
            let expected = 100.0 * measured[leaf] / measured_total;
            // 4,000 samples: 3 points is four standard deviations of a 60% share's sampling.
            assert!(
                (sampled - expected).abs() <= 3.0,
                "{what}: {leaf} {sampled:.1}% of the samples, the script measured \
                 {expected:.1}% of its CPU time ({measured:?})"
            );
        }
        // zlib's compressor, native code, under the Python function that called it.
        let squeezed = by_leaf.get("squeeze").copied().unwrap_or(0);
        assert!(
            under_squeeze_native * 10 >= squeezed * 9,
            "{what}: {under_squeeze_native} of {squeezed} samples in squeeze reach zlib's \
             deflate under it"
        );
        // The walker's own account.
        let python_line = stderr
            .lines()
            .find(|line| line.trim_start().starts_with("python: "))
            .unwrap_or_else(|| panic!("{what}: no python line in --stats:\n{stderr}"));
        assert!(
            python_line.contains(" stacks with their Python frames"),
            "{python_line}"
        );
    }
}

/// A thread that naps in `nap` (time.sleep) ten times 100 ms while the main thread waits for
/// it, then lives on half a second; prints how long the naps took.
const SLEEP_SCRIPT: &str = r#"
import json, threading, time

napped = []

def nap():
    start = time.monotonic()
    time.sleep(0.1)
    napped.append(time.monotonic() - start)

def napper():
    for _ in range(10):
        nap()

worker = threading.Thread(target=napper)
worker.start()
worker.join()
# Code objects are read while their process lives, at the drain after a stack is first seen
# (--drain-interval: 100 ms in the test).
time.sleep(0.5)
print(json.dumps({"napped_ns": int(sum(napped) * 1e9)}))
"#;

#[test]
fn a_python_function_that_sleeps_holds_its_off_cpu_time() {
    for interpreter in interpreters() {
        let what = interpreter.display().to_string();
        let (profile, measured, _) = record_script(
            (&interpreter, &[]),
            ("sleep", SLEEP_SCRIPT),
            &["--off-cpu", "--drain-interval", "100ms"],
            &[],
        );
        let napped = measured["napped_ns"].as_u64().unwrap();
        let report = report_json(&profile, &[]);
        let under = |name: &str| {
            report["off_cpu"]["by_function"]
                .as_array()
                .expect("off-CPU functions")
                .iter()
                .find(|row| row["name"] == name)
                .map_or(0, |row| row["total_ns"].as_u64().unwrap())
        };
        let (nap, napper) = (under("nap"), under("napper"));
        assert!(
            (nap as f64 - napped as f64).abs() <= 0.05 * napped as f64,
            "{what}: {nap} ns blocked under nap, the script napped {napped} ns: {:#}",
            report["off_cpu"]["by_function"]
        );
        assert!(
            napper >= nap,
            "{what}: nap's caller napper holds {napper} ns, less than nap's {nap}"
        );
    }
}

#[test]
fn a_system_wide_recording_names_the_python_functions_of_a_process_it_did_not_start() {
    let dir = temp_dir("python-system-wide");
    let script = dir.join("split.py");
    std::fs::write(&script, SPLIT_SCRIPT).unwrap();
    let interpreter = interpreters().pop().unwrap();
    let mut python = std::process::Command::new(&interpreter)
        .args([script.to_str().unwrap(), "6"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Started before the recording: found from its mappings as the recording reads them.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let profile = dir.join("system.prof");
    let output = profiler(&[
        "record",
        "-a",
        "-F",
        "499",
        "--duration",
        "3",
        "-o",
        profile.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    python.wait().unwrap();
    let stacks = folded(&profile);
    let named = |leaf: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| {
                frames
                    .first()
                    .is_some_and(|comm| comm.starts_with("python"))
                    && frames.windows(4).any(|w| w[..3] == CHAIN && w[3] == leaf)
            })
            .map(|(_, n)| n)
            .sum()
    };
    let (alpha, beta) = (named("alpha_hot"), named("beta_cold"));
    assert!(
        alpha > 300 && beta > 50 && alpha > beta,
        "alpha_hot {alpha} and beta_cold {beta} samples through <module>;main;timed\n{stderr}"
    );
}

/// `-X perf` (3.12 and later) runs each Python function's evaluation through a trampoline copied
/// into anonymous memory, listed in the perf map, with no unwind information: its stacks reach
/// `_start` through the trampolines, named by the perf map, and carry the Python frames too.
#[test]
fn x_perf_trampolines_are_unwound_through_to_start() {
    let with_perf_support = |path: &PathBuf| {
        let path = path.to_string_lossy();
        ["/3.12.", "/3.13."]
            .iter()
            .any(|minor| path.contains(minor))
    };
    for interpreter in interpreters().into_iter().filter(with_perf_support) {
        let what = interpreter.display().to_string();
        let (profile, _, stderr) = record_script(
            (&interpreter, &["-X", "perf"]),
            ("perf_trampolines", SPLIT_SCRIPT),
            &["--stats", "-F", "999"],
            &["2"],
        );
        let stacks = folded(&profile);
        let total: u64 = stacks.iter().map(|(_, n)| n).sum();
        let through = |frames: &[String]| {
            frames.get(1).is_some_and(|frame| frame == "_start")
                && python_chain(frames).is_some()
                && frames
                    .iter()
                    .any(|frame| frame.starts_with("py::timed:") && frame.ends_with(".py"))
        };
        let whole: u64 = stacks
            .iter()
            .filter(|(frames, _)| through(frames))
            .map(|(_, n)| n)
            .sum();
        assert!(
            total > 800 && whole * 100 >= total * 95,
            "{what} -X perf: {whole} of {total} samples reach _start through the trampolines \
             and carry <module>;main;timed and a leaf\n{stderr}"
        );
    }
}
