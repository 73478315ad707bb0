//! Python frames: `record` of CPython 3.10, 3.11, 3.12 and 3.13 (pyenv's builds, which have no
//! frame pointers and a shared libpython, and Debian's 3.11, the interpreter built into its
//! stripped program) names the script's functions, in their callers, with native code a Python
//! function called under it, in the shares of CPU time the script measures itself; off the CPU,
//! a Python function's sleeps are under it.

mod common;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

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

/// `profiler record OPTIONS -o DIR/NAME.prof -- COMMAND DIR/NAME.py ARGS` of `script`, where
/// COMMAND runs the interpreter: the profile, what the script printed as JSON, and the
/// recording's stderr.
fn record_script(
    (dir, command): (&Path, &[&str]),
    script: (&str, &str),
    options: &[&str],
    args: &[&str],
) -> (PathBuf, Value, String) {
    let (name, text) = script;
    let source = dir.join(format!("{name}.py"));
    std::fs::write(&source, text).unwrap();
    let profile = dir.join(format!("{name}.prof"));
    let mut all = vec!["record"];
    all.extend_from_slice(options);
    all.extend_from_slice(&["-o", profile.to_str().unwrap(), "--"]);
    all.extend_from_slice(command);
    all.push(source.to_str().unwrap());
    all.extend_from_slice(args);
    let output = profiler(&all);
    let printed = output
        .stdout
        .split(|&byte| byte == b'\n')
        .find(|line| line.starts_with(b"{"))
        .unwrap_or_else(|| {
            panic!(
                "{command:?}: the script printed no JSON\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let printed = serde_json::from_slice(printed).unwrap();
    (
        profile,
        printed,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `profiler record -a -F RATE --duration 3 -o DIR/system.prof`: the profile and its stderr.
fn record_system_wide(dir: &Path, rate: &str) -> (PathBuf, String) {
    let profile = dir.join("system.prof");
    let output = profiler(&[
        "record",
        "-a",
        "-F",
        rate,
        "--duration",
        "3",
        "-o",
        profile.to_str().unwrap(),
    ]);
    (
        profile,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The Python chain each leaf function is called through.
const CHAIN: [&str; 3] = ["<module>", "main", "timed"];
const LEAVES: [&str; 3] = ["alpha_hot", "beta_cold", "squeeze"];

/// The leaf of a stack (frames root first) whose Python frames are the whole chain, outermost
/// first, then a leaf, with native frames of the interpreter around and between them.
fn python_chain(frames: &[String]) -> Option<String> {
    let at = frames.iter().position(|frame| frame == "<module>")?;
    let python: Vec<&str> = frames[at..]
        .iter()
        .map(String::as_str)
        .filter(|frame| CHAIN.contains(frame) || LEAVES.contains(frame))
        .collect();
    let (leaf, chain) = python.split_last()?;
    (chain == CHAIN && LEAVES.contains(leaf)).then(|| leaf.to_string())
}

/// py-spy, from PyPI, where `cargo xtask setup` installs it.
fn py_spy() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/py-spy/bin/py-spy");
    assert!(
        path.is_file(),
        "py-spy is not at {}: run `cargo xtask setup`",
        path.display()
    );
    path
}

/// Samples per leaf of `stacks` (frames root first) that carry the whole chain.
fn by_leaf<'s>(stacks: impl Iterator<Item = (&'s [String], u64)>) -> HashMap<String, u64> {
    let mut by_leaf = HashMap::new();
    for (frames, count) in stacks {
        if let Some(leaf) = python_chain(frames) {
            *by_leaf.entry(leaf).or_default() += count;
        }
    }
    by_leaf
}

/// Each leaf's share of `by_leaf`'s samples, in percent.
fn shares(by_leaf: &HashMap<String, u64>) -> HashMap<&'static str, f64> {
    let whole: u64 = by_leaf.values().sum();
    LEAVES
        .iter()
        .map(|leaf| {
            let samples = by_leaf.get(*leaf).copied().unwrap_or(0);
            (*leaf, 100.0 * samples as f64 / whole.max(1) as f64)
        })
        .collect()
}

/// Side by side with py-spy on the same run: `record` runs `py-spy record` (its default mode,
/// which pauses the interpreter at each sample), which runs the script.
#[test]
fn every_cpython_version_names_the_scripts_functions_in_their_measured_shares() {
    for interpreter in interpreters() {
        let what = interpreter.display().to_string();
        let dir = temp_dir("split");
        let raw = dir.join("py-spy.txt");
        let (py_spy, raw_path) = (py_spy(), raw.to_str().unwrap());
        let command = [
            py_spy.to_str().unwrap(),
            "record",
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            raw_path,
            "--",
            interpreter.to_str().unwrap(),
        ];
        let (profile, printed, stderr) = record_script(
            (&dir, &command),
            ("split", SPLIT_SCRIPT),
            &["--stats", "-F", "999"],
            &["8"],
        );
        let measured: HashMap<String, f64> = serde_json::from_value(printed).unwrap();
        let measured_total: f64 = measured.values().sum();
        // The interpreter's stacks, not py-spy's.
        let stacks: Vec<_> = folded(&profile)
            .into_iter()
            .filter(|(frames, _)| frames[0].starts_with("python"))
            .collect();
        let total: u64 = stacks.iter().map(|(_, n)| n).sum();
        let ours_by_leaf = by_leaf(stacks.iter().map(|(frames, n)| (frames.as_slice(), *n)));
        let under_squeeze_native: u64 = stacks
            .iter()
            .filter(|(frames, _)| {
                let mut after = frames
                    .iter()
                    .skip_while(|frame| *frame != "squeeze")
                    .skip(1);
                python_chain(frames).is_some_and(|leaf| leaf == "squeeze")
                    && after.any(|frame| frame.contains("deflate"))
            })
            .map(|(_, n)| n)
            .sum();
        let whole: u64 = ours_by_leaf.values().sum();
        // Start-up and shutdown (no Python frame yet, or any more) are the rest.
        assert!(
            whole * 100 >= total * 95,
            "{what}: {whole} of {total} samples reach <module> through main and timed\n{stderr}"
        );
        // py-spy's stacks: `function (file:line)` frames, root first.
        let spied: Vec<(Vec<String>, u64)> = std::fs::read_to_string(&raw)
            .unwrap_or_else(|e| panic!("{what}: py-spy wrote no {raw_path}: {e}"))
            .lines()
            .filter_map(|line| {
                let (stack, count) = line.rsplit_once(' ')?;
                let frames = stack.split(';').map(|frame| {
                    frame
                        .split_once(" (")
                        .map_or(frame, |(name, _)| name)
                        .to_string()
                });
                Some((frames.collect(), count.parse().ok()?))
            })
            .collect();
        let ours = shares(&ours_by_leaf);
        let theirs = shares(&by_leaf(
            spied.iter().map(|(frames, n)| (frames.as_slice(), *n)),
        ));
        eprintln!("{what}: ours, py-spy's and the script's shares:");
        for leaf in LEAVES {
            let expected = 100.0 * measured[leaf] / measured_total;
            let (sampled, spy) = (ours[leaf], theirs[leaf]);
            eprintln!("  {leaf:>9} {sampled:5.1}% {spy:5.1}% {expected:5.1}%");
            // Some 5,000 samples: 2 points is four standard deviations of a 70% share's sampling.
            assert!(
                (sampled - expected).abs() <= 2.0,
                "{what}: {leaf} {sampled:.1}% of the samples, the script measured \
                 {expected:.1}% of its CPU time ({measured:?})"
            );
            // py-spy's 2,000 samples are noisier, and its pauses move them (10 points at times
            // at 100 Hz here): within 2 points of its share, or at least as close (and a point
            // of sampling noise) to what the script measured.
            assert!(
                (sampled - spy).abs() <= 2.0
                    || (sampled - expected).abs() <= (spy - expected).abs() + 1.0,
                "{what}: {leaf} {sampled:.1}% of our samples, {spy:.1}% of py-spy's, the script \
                 measured {expected:.1}%"
            );
        }
        // zlib's compressor, native code, under the Python function that called it.
        let squeezed = ours_by_leaf.get("squeeze").copied().unwrap_or(0);
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
            (&temp_dir("sleep"), &[interpreter.to_str().unwrap()]),
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
    let (profile, stderr) = record_system_wide(&dir, "499");
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
            (
                &temp_dir("perf_trampolines"),
                &[interpreter.to_str().unwrap(), "-X", "perf"],
            ),
            ("perf_trampolines", SPLIT_SCRIPT),
            &["--stats", "-F", "999"],
            &["4"],
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

/// A containerized interpreter: in its own pid namespace (its threads' ids, which CPython
/// records, are not the kernel's) and mount namespace (its program lives on a tmpfs only it
/// sees, read through `/proc/PID/root`), started before a system-wide recording; its shares
/// come out as it measures them.
#[test]
fn an_interpreter_in_its_own_pid_and_mount_namespace_is_named_under_record_a() {
    let dir = temp_dir("python-namespaces");
    let script = dir.join("split.py");
    std::fs::write(&script, SPLIT_SCRIPT).unwrap();
    // A tmpfs mounted over an empty directory inside the namespace only.
    let inside = dir.join("mounted-inside");
    std::fs::create_dir(&inside).unwrap();
    let inside = inside.display();
    let start = format!(
        "set -e; mount -t tmpfs tmpfs {inside}; \
         cp /usr/bin/python3.11 {script} {inside}/; \
         exec {inside}/python3.11 {inside}/split.py 5",
        script = script.display()
    );
    let python = std::process::Command::new("unshare")
        .args(["--pid", "--mount", "--fork", "--mount-proc"])
        .args(["--propagation", "private", "sh", "-c", &start])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    let (profile, stderr) = record_system_wide(&dir, "999");
    let printed = python.wait_with_output().unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let measured: HashMap<String, f64> = serde_json::from_slice(&printed.stdout).unwrap();
    let measured_total: f64 = measured.values().sum();
    assert!(
        !Path::new(&format!("{inside}/python3.11")).exists(),
        "{inside} is mounted outside the namespace"
    );
    let stacks = folded(&profile);
    let ours = by_leaf(
        stacks
            .iter()
            .filter(|(frames, _)| frames[0] == "python3.11")
            .map(|(frames, n)| (frames.as_slice(), *n)),
    );
    let whole: u64 = ours.values().sum();
    assert!(
        whole > 1000,
        "{whole} samples carry <module>;main;timed\n{stderr}"
    );
    let ours = shares(&ours);
    for leaf in LEAVES {
        let expected = 100.0 * measured[leaf] / measured_total;
        // 3 s of a 5 s run: four standard deviations of the share's sampling, 2 points at least.
        let share = expected / 100.0;
        let deviation = 100.0 * (share * (1.0 - share) / whole as f64).sqrt();
        assert!(
            (ours[leaf] - expected).abs() <= (4.0 * deviation).max(2.0),
            "{leaf}: {:.1}% of the samples, the script measured {expected:.1}%",
            ours[leaf]
        );
    }
}

/// The agent's pprof windows carry the Python frames, with their files and lines, as Google's
/// pprof reads them: the leaves' shares across the windows as the script measures them.
#[test]
fn the_agents_pprof_windows_name_python_functions_files_and_lines_for_google_pprof() {
    let dir = temp_dir("python-agent");
    let script = dir.join("split.py");
    std::fs::write(&script, SPLIT_SCRIPT).unwrap();
    let interpreter = interpreters().pop().unwrap();
    let python = std::process::Command::new(&interpreter)
        .args([script.to_str().unwrap(), "6"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let windows = dir.join("windows");
    let mut agent = common::Running::spawn(
        std::process::Command::new(common::profiler_bin())
            .args(["agent", "-p", &python.id().to_string(), "-F", "999"])
            .args(["--interval", "1", "--output-dir", windows.to_str().unwrap()])
            .stderr(std::process::Stdio::piped()),
    );
    let printed = python.wait_with_output().unwrap();
    agent.signal(libc::SIGTERM);
    let log = agent.output_at_most(std::time::Duration::from_secs(30));
    let log = String::from_utf8_lossy(&log.stderr);
    let measured: HashMap<String, f64> = serde_json::from_slice(&printed.stdout).unwrap();
    let measured_total: f64 = measured.values().sum();
    let mut stacks: Vec<(Vec<String>, u64)> = Vec::new();
    let mut lines_named = 0;
    for window in std::fs::read_dir(&windows).unwrap() {
        let path = window.unwrap().path();
        if !common::is_window(&path) {
            continue;
        }
        let read = |options: &[&str]| -> String {
            let output = std::process::Command::new(common::google_pprof())
                .args(options)
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "pprof cannot read {}: {}",
                path.display(),
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        stacks.extend(pprof_traces(&read(&["-traces", "-sample_index=0"])));
        // With -lines, frames are `function file:line`: the script's own lines.
        lines_named += read(&["-traces", "-lines", "-sample_index=0"])
            .lines()
            .filter(|line| line.contains("alpha_hot ") && line.contains("split.py:"))
            .count();
    }
    let ours = by_leaf(stacks.iter().map(|(frames, n)| (frames.as_slice(), *n)));
    let whole: u64 = ours.values().sum();
    assert!(
        whole > 2000 && lines_named > 0,
        "{whole} samples through <module>;main;timed, {lines_named} traces with alpha_hot's \
         file and line\n{log}"
    );
    let ours = shares(&ours);
    for leaf in LEAVES {
        let expected = 100.0 * measured[leaf] / measured_total;
        let share = expected / 100.0;
        let deviation = 100.0 * (share * (1.0 - share) / whole as f64).sqrt();
        assert!(
            (ours[leaf] - expected).abs() <= (4.0 * deviation).max(2.0),
            "{leaf}: {:.1}% of the windows' samples, the script measured {expected:.1}%",
            ours[leaf]
        );
    }
}

/// The traces `pprof -traces` prints: each a separator line, its labels (`pid:  1234`), then
/// the value and the innermost frame, then one frame a line outwards; as frames root first and
/// the value. Google's pprof shortens names as C++ ones, template arguments cut: `<module>` has
/// nothing left, and it shows the frame by its module, `[python]`, in double brackets.
fn pprof_traces(text: &str) -> Vec<(Vec<String>, u64)> {
    let mut traces = Vec::new();
    for block in text.split("-----------+-------------------------------------------------------") {
        let mut lines = block.lines().filter(|line| {
            let first = line.split_whitespace().next().unwrap_or(":");
            !first.ends_with(':')
        });
        let Some((value, leaf)) = lines.next().and_then(|first| {
            let (value, leaf) = first.trim().split_once(char::is_whitespace)?;
            Some((value.parse::<u64>().ok()?, leaf.trim().to_string()))
        }) else {
            continue;
        };
        let mut frames: Vec<String> = std::iter::once(leaf)
            .chain(lines.map(|line| line.trim().to_string()))
            .map(|frame| match frame.as_str() {
                "[[python]]" => "<module>".to_string(),
                _ => frame,
            })
            .collect();
        frames.reverse();
        traces.push((frames, value));
    }
    traces
}
