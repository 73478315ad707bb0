//! `profiler record` as a command-line tool: the command's bytes and exit status pass through,
//! stop signals reach the command, outputs are checked first, written privately, never through
//! planted links, and a failed write loses nothing else; capabilities alone are enough.

mod common;

use std::{
    os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use common::{
    profiler_bin, require_root, system_user, temp_dir, wait_until_recording, workload, Running,
};
use profiler::profile::{file::read_profile, Profile};

/// Runs the profiler with `args`, whatever its exit status.
fn run(args: &[&str]) -> Output {
    require_root();
    Command::new(profiler_bin())
        .args(args)
        .output()
        .expect("the profiler runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// Samples whose innermost user frame is in `function`.
fn function_samples(profile: &Profile, function: &str) -> u64 {
    profile
        .stacks
        .iter()
        .filter(|stack| {
            stack
                .frames
                .iter()
                .map(|&id| &profile.frames[id as usize])
                .find(|frame| !frame.kernel)
                .is_some_and(|frame| frame.function.as_deref() == Some(function))
        })
        .map(|stack| stack.count)
        .sum()
}

#[test]
fn record_passes_the_commands_bytes_and_exit_status_through() {
    let dir = temp_dir("passthrough");
    // Every byte value, NULs and newlines included, well past a pipe's buffer.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let input = dir.join("data.bin");
    std::fs::write(&input, &data).unwrap();
    let script = format!("cat {}; exit 7", input.display());
    let output = run(&["record", "--", "sh", "-c", &script]);
    assert_eq!(output.status.code(), Some(7), "{}", text(&output.stderr));
    assert!(
        output.stdout == data,
        "the command's standard output was changed"
    );
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("Sample accounting:"),
        "the report goes to stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("Recording ended: the command exited with status 7."),
        "{stderr}"
    );

    let output = run(&["record", "--", "sh", "-c", "kill -SEGV $$"]);
    assert_eq!(output.status.code(), Some(139), "{}", text(&output.stderr));
    assert!(output.stdout.is_empty());
    assert!(
        text(&output.stderr)
            .contains("Recording ended: the command was killed by signal 11 (SIGSEGV)."),
        "{}",
        text(&output.stderr)
    );

    // Standard input reaches the command too.
    let mut child = Command::new(profiler_bin())
        .args(["record", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = {
        let data = data.clone();
        std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &data))
    };
    let output = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        output.stdout == data,
        "standard input did not pass through unchanged"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_report_goes_to_the_file_asked_and_json_to_a_path() {
    let dir = temp_dir("report-file");
    let json = dir.join("report.json");
    let report = dir.join("report.txt");
    let output = run(&[
        "record",
        "--json",
        path_str(&json),
        "--",
        "sh",
        "-c",
        "echo workload output; exit 3",
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "workload output\n");
    let parsed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(parsed["schema"], "profiler.report/1");
    assert_eq!(parsed["recording"]["command"]["exit_code"], 3);
    assert_eq!(parsed["recording"]["stop"], "command exited");

    let output = run(&[
        "record",
        "--report",
        path_str(&report),
        "--",
        "sh",
        "-c",
        "echo workload output",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "workload output\n");
    let written = std::fs::read_to_string(&report).unwrap();
    assert!(written.contains("Sample accounting:"), "{written}");
    assert!(!text(&output.stderr).contains("Sample accounting:"));
    std::fs::remove_dir_all(dir).ok();
}

/// A shell command that prints `ready`, idles until one of the stop signals, then spins a while
/// (so the recording must go on after the signal to see it) and exits 3.
const EXITS_3_ON_SIGNALS: &str =
    "trap 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exit 3' \
                                  INT TERM HUP QUIT; echo ready; while :; do sleep 0.02; done";

/// Starts `profiler record ARGS -- sh -c SCRIPT` and waits until the script printed `ready`.
fn start_ready(args: &[&str], script: &str) -> Running {
    require_root();
    let mut profiler = Running::spawn(
        Command::new(profiler_bin())
            .args(args)
            .args(["--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(profiler.0.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    profiler
}

#[test]
fn stop_signals_are_forwarded_and_the_recording_goes_on_until_the_command_exits() {
    let dir = temp_dir("forward");
    for (signal, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGQUIT, "SIGQUIT"),
    ] {
        let file = dir.join(format!("{name}.prof"));
        let mut profiler = start_ready(
            &["record", "-F", "999", "-o", path_str(&file)],
            EXITS_3_ON_SIGNALS,
        );
        profiler.signal(signal);
        let output = profiler.output_at_most(Duration::from_secs(20));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "Recording ended: the profiler received {name} and forwarded it to the command, \
                 and the command exited with status 3."
            )),
            "{name}: {stderr}"
        );
        // The command's work after the signal was recorded.
        let profile = read_profile(&file).unwrap();
        let samples: u64 = profile.stacks.iter().map(|s| s.count).sum();
        assert!(samples >= 20, "{name}: {samples} samples after the signal");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn stat_forwards_stop_signals_and_counts_until_the_command_exits() {
    let dir = temp_dir("stat-forward");
    let counts = dir.join("counts.json");
    let mut profiler = start_ready(
        &[
            "stat",
            "-e",
            "task-clock",
            "--json",
            "-o",
            path_str(&counts),
        ],
        EXITS_3_ON_SIGNALS,
    );
    std::thread::sleep(Duration::from_millis(200));
    profiler.signal(libc::SIGINT);
    let output = profiler.output_at_most(Duration::from_secs(20));
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&counts).unwrap()).unwrap();
    assert_eq!(json["command"]["exit_code"], 3);
    assert_eq!(
        json["ending"]["description"],
        "the profiler received SIGINT and forwarded it to the command, and the command exited \
         with status 3"
    );
    // The command's spin after the signal was counted: the idle loop before it takes
    // milliseconds of CPU.
    let task_clock_ms = json["events"][0]["count"].as_u64().unwrap() / 1_000_000;
    assert!(task_clock_ms >= 50, "{task_clock_ms} ms counted");
    std::fs::remove_dir_all(dir).ok();
}

/// Runs `profiler ARGS -- sh -c SCRIPT` on a new pseudo-terminal, types Ctrl-C once the output
/// shows `ready`, and returns everything the terminal showed and the exit status.
fn ctrl_c_at_a_terminal(args: &[&str], script: &str) -> (String, Option<i32>) {
    require_root();
    const DRIVER: &str = r#"
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
shown, typed = b"", False
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    shown += chunk
    if not typed and b"ready" in shown:
        os.write(fd, b"\x03")
        typed = True
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(shown)
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    let output = Command::new("python3")
        .args(["-c", DRIVER, path_str(&profiler_bin())])
        .args(args)
        .args(["--", "sh", "-c", script])
        .output()
        .expect("python3 runs");
    (text(&output.stdout), output.status.code())
}

#[test]
fn ctrl_c_at_a_terminal_reaches_the_command_once() {
    // The terminal sends SIGINT to its foreground process group: the profiler and the command.
    let counts_interrupts = "n=0; trap 'n=$((n+1))' INT; echo ready; \
         while [ $n -eq 0 ]; do sleep 0.02; done; \
         i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; echo \"interrupts: $n\"; exit 3";
    for (args, ended) in [
        (&["record", "-F", "99"][..], "Recording ended"),
        (&["stat", "-e", "task-clock"][..], "Counting ended"),
    ] {
        let (shown, status) = ctrl_c_at_a_terminal(args, counts_interrupts);
        assert_eq!(status, Some(3), "{shown}");
        assert!(shown.contains("interrupts: 1"), "{shown}");
        assert!(
            shown.contains(&format!(
                "{ended}: SIGINT from the terminal reached the profiler and the command, and \
                 the command exited with status 3."
            )),
            "{shown}"
        );
    }
}

#[test]
fn a_second_signal_or_the_grace_period_ends_a_command_that_ignores_the_first() {
    let ignores_term = "trap '' TERM; echo ready; while :; do sleep 0.02; done";
    let mut profiler = start_ready(&["record"], ignores_term);
    profiler.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        profiler.0.try_wait().unwrap().is_none(),
        "stopped before the command exited"
    );
    profiler.signal(libc::SIGTERM);
    let output = profiler.output_at_most(Duration::from_secs(3));
    assert_eq!(output.status.code(), Some(137), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("it was killed when the profiler received SIGTERM too"),
        "{}",
        text(&output.stderr)
    );

    let mut profiler = start_ready(&["record"], ignores_term);
    let started = Instant::now();
    profiler.signal(libc::SIGTERM);
    let output = profiler.output_at_most(Duration::from_secs(15));
    let waited = started.elapsed();
    assert_eq!(output.status.code(), Some(137), "{}", text(&output.stderr));
    assert!(
        (Duration::from_millis(4_500)..Duration::from_secs(10)).contains(&waited),
        "killed after {waited:?}, the grace period is 5 s"
    );
    assert!(
        text(&output.stderr).contains("it was killed after it had not exited for 5 s"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn duration_asks_the_command_to_exit_with_sigterm() {
    let started = Instant::now();
    let mut profiler = start_ready(
        &["record", "--duration", "1"],
        "trap 'exit 5' TERM; echo ready; while :; do sleep 0.02; done",
    );
    let output = profiler.output_at_most(Duration::from_secs(10));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(5), "{stderr}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(
        stderr.contains(
            "Recording ended: --duration ended: the command was sent SIGTERM, and the command \
             exited with status 5."
        ),
        "{stderr}"
    );
}

#[test]
fn system_wide_runs_end_on_duration_and_on_sigterm_with_everything_recorded() {
    let dir = temp_dir("system-wide");
    let cpu_split = workload("cpu_split");
    // Busy for the whole of both recordings.
    let _busy = Running::spawn(Command::new(&cpu_split).arg("40000").stderr(Stdio::null()));

    let file = dir.join("duration.prof");
    let started = Instant::now();
    let output = run(&["record", "-a", "--duration", "1.5", "-o", path_str(&file)]);
    let elapsed = started.elapsed();
    assert!(output.status.success(), "{}", text(&output.stderr));
    // The report of a whole system takes a while on a loaded machine, not minutes.
    assert!(elapsed < Duration::from_secs(90), "took {elapsed:?}");
    let profile = read_profile(&file).unwrap();
    let recorded = Duration::from_nanos(profile.meta.duration_ns);
    assert!(
        (Duration::from_millis(1_400)..Duration::from_millis(2_500)).contains(&recorded),
        "recorded for {recorded:?}"
    );
    assert!(
        function_samples(&profile, "cpu_split::heavy_work") > 200,
        "a busy CPU for 1.5 s at 997 Hz"
    );
    assert!(text(&output.stderr).contains("Recording ended: --duration ended."));

    let file = dir.join("sigterm.prof");
    let mut profiler = Running::spawn(
        Command::new(profiler_bin())
            .args(["record", "-a", "-o", path_str(&file)])
            .stderr(Stdio::piped()),
    );
    wait_until_recording(profiler.id());
    std::thread::sleep(Duration::from_secs(1));
    profiler.signal(libc::SIGTERM);
    let output = profiler.output_at_most(Duration::from_secs(30));
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("Recording ended: the profiler received SIGTERM."),
        "{}",
        text(&output.stderr)
    );
    let profile = read_profile(&file).unwrap();
    assert!(function_samples(&profile, "cpu_split::heavy_work") > 100);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn record_p_stops_when_every_process_has_exited() {
    let dir = temp_dir("pids-exit");
    let cpu_split = workload("cpu_split");
    // Long enough to outlast the profiler's start on a loaded machine: a pid that exits first
    // is refused.
    let mut first = Running::spawn(Command::new(&cpu_split).arg("6000").stderr(Stdio::null()));
    let mut second = Running::spawn(Command::new(&cpu_split).arg("12000").stderr(Stdio::null()));
    let pids = format!("{},{}", first.id(), second.id());
    let file = dir.join("pids.prof");
    let mut profiler = Running::spawn(
        Command::new(profiler_bin())
            .args(["record", "-p", &pids, "-o", path_str(&file)])
            .stderr(Stdio::piped()),
    );
    first.wait_at_most(Duration::from_secs(20));
    second.wait_at_most(Duration::from_secs(20));
    let output = profiler.output_at_most(Duration::from_secs(5));
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("Recording ended: every profiled process exited."),
        "{}",
        text(&output.stderr)
    );
    assert!(function_samples(&read_profile(&file).unwrap(), "cpu_split::heavy_work") > 100);
    std::fs::remove_dir_all(dir).ok();
}

/// The pid of `parent`'s child, once it runs `comm`.
fn child_running(parent: u32, comm: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        for child in children.split_whitespace() {
            let name = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
            if name.trim_end() == comm {
                return child.parse().unwrap();
            }
        }
        assert!(Instant::now() < deadline, "no child {comm} of {parent}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.starts_with(" Z"))
    })
}

#[test]
fn a_command_does_not_outlive_a_profiler_killed_outright() {
    require_root();
    let mut profiler = Running::spawn(
        Command::new(profiler_bin())
            .args(["record", "--", "sleep", "60"])
            .stderr(Stdio::null()),
    );
    let sleep = child_running(profiler.id(), "sleep");
    profiler.signal(libc::SIGKILL);
    profiler.wait_at_most(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(sleep) {
        assert!(
            Instant::now() < deadline,
            "the command {sleep} outlived its profiler"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn outputs_are_checked_before_recording() {
    for (option, path, expected) in [
        (
            "-o",
            "/nonexistent/x.prof",
            "the directory /nonexistent does not exist",
        ),
        ("--raw", "/dev/full", "is a device"),
        ("--folded", "/dev/full", "is a device"),
        ("--flamegraph", "/dev/full", "is a device"),
        ("--pprof", "/dev/full", "is a device"),
        ("--histogram", "/dev/full", "is a device"),
        ("--report", "/dev/full", "is a device"),
        ("--json", "/dev/full", "is a device"),
        ("-o", "/tmp", "is a directory"),
    ] {
        let started = Instant::now();
        let output = run(&["record", "-a", "--duration", "30", option, path]);
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{option} {path}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{option} {path} was refused only after {:?}",
            started.elapsed()
        );
        assert!(
            stderr.contains(&format!("error: {option} {path}")) && stderr.contains(expected),
            "{option} {path}: {stderr}"
        );
    }
    let output = run(&["stat", "-a", "--duration", "30", "-o", "/dev/full"]);
    assert!(text(&output.stderr).contains("error: -o /dev/full"));
    assert!(std::fs::metadata("/dev/full")
        .unwrap()
        .file_type()
        .is_char_device());
}

/// Every output option of `record`, with a file name for it under `dir`.
fn record_outputs(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    [
        ("-o", "run.prof"),
        ("--raw", "raw.jsonl"),
        ("--folded", "stacks.folded"),
        ("--flamegraph", "flame.svg"),
        ("--pprof", "profile.pb.gz"),
        ("--histogram", "latency.svg"),
        ("--json", "report.json"),
    ]
    .into_iter()
    .map(|(option, name)| (option, dir.join(name)))
    .collect()
}

fn lchown(path: &Path, uid: u32) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::lchown(c_path.as_ptr(), uid, uid) }, 0);
}

#[test]
fn links_planted_in_a_sticky_directory_are_not_followed() {
    let dir = temp_dir("planted");
    let victim = dir.join("victim");
    std::fs::write(&victim, "root's own data").unwrap();
    // World-writable and sticky like /tmp, owned by one user; the links by another.
    let sticky = dir.join("shared");
    std::fs::create_dir_all(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    lchown(&sticky, 4242);
    let mut options = record_outputs(&sticky);
    options.push(("--report", sticky.join("report.txt")));
    for (option, link) in &options {
        symlink(&victim, link).unwrap();
        lchown(link, 4343);
        let value = path_str(link);
        let args: Vec<&str> = match *option {
            "--report" => vec!["record", "-a", "--duration", "5", "--report", value],
            _ => vec!["record", "-a", "--duration", "5", option, value],
        };
        let output = run(&args);
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{option}");
        assert!(
            stderr.contains(&format!("error: {option} {value}"))
                && stderr.contains("refusing to follow the symbolic link"),
            "{option}: {stderr}"
        );
    }
    let link = sticky.join("stat.json");
    symlink(&victim, &link).unwrap();
    lchown(&link, 4343);
    let output = run(&[
        "stat",
        "-e",
        "task-clock",
        "-o",
        path_str(&link),
        "--",
        "true",
    ]);
    assert!(text(&output.stderr).contains("refusing to follow the symbolic link"));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's own data");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn every_output_is_created_private() {
    let dir = temp_dir("private");
    let mut outputs = record_outputs(&dir);
    // Page faults carry no latency, so there is no plot to write: the latency plot's mode is
    // checked with a PEBS import (profiler's convert tests, through the same writer).
    outputs.retain(|(option, _)| *option != "--histogram");
    // An older file's wider mode is not kept.
    std::fs::write(&outputs[0].1, "old").unwrap();
    std::fs::set_permissions(&outputs[0].1, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut args: Vec<String> = ["record", "-e", "page-faults", "-c", "1"]
        .map(String::from)
        .to_vec();
    for (option, path) in &outputs {
        args.extend([option.to_string(), path_str(path).to_string()]);
    }
    args.extend([
        "--".to_string(),
        path_str(&workload("page_toucher")).to_string(),
        "200".into(),
    ]);
    let report = dir.join("report.txt");
    let stat = dir.join("stat.txt");
    let script = "umask 0 && exec \"$0\" \"$@\"";
    for argv in [
        args.clone(),
        vec![
            "record".into(),
            "--report".into(),
            path_str(&report).into(),
            "--".into(),
            "true".into(),
        ],
        vec![
            "stat".into(),
            "-o".into(),
            path_str(&stat).into(),
            "--".into(),
            "true".into(),
        ],
    ] {
        // With umask 0, the mode the profiler asks for is the mode the file gets.
        let output = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(profiler_bin())
            .args(&argv)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{argv:?}: {}",
            text(&output.stderr)
        );
    }
    let mut written: Vec<PathBuf> = outputs.into_iter().map(|(_, path)| path).collect();
    written.extend([report, stat]);
    for path in written {
        let mode = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "{} is {:o}",
            path.display(),
            mode & 0o777
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    std::fs::remove_dir_all(dir).ok();
}

/// A tmpfs mounted for one test, unmounted when it ends.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// A 1 MiB tmpfs, filled up.
    fn full(name: &str) -> SmallDisk {
        let dir = temp_dir(name);
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "none", path_str(&dir)])
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs needs root");
        let disk = SmallDisk(dir);
        let filler = disk.0.join("filler");
        let error = std::fs::write(&filler, vec![0u8; 2 << 20]).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
        disk
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        Command::new("umount").arg(&self.0).status().ok();
        std::fs::remove_dir_all(&self.0).ok();
    }
}

#[test]
fn a_full_disk_keeps_the_report_names_the_files_and_fails() {
    let disk = SmallDisk::full("full-disk");
    let profile = disk.0.join("run.prof");
    let folded = disk.0.join("stacks.folded");
    let output = run(&[
        "record",
        "-o",
        path_str(&profile),
        "--folded",
        path_str(&folded),
        "--",
        path_str(&workload("cpu_split")),
        "500",
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cpu_split::heavy_work"),
        "the report is printed:\n{stderr}"
    );
    for (option, path) in [("-o", &profile), ("--folded", &folded)] {
        assert!(
            stderr.contains(&format!("error: {option} {}: cannot", path.display()))
                && stderr.contains("No space left on device (os error 28)"),
            "{option}: {stderr}"
        );
    }
    let names: Vec<_> = std::fs::read_dir(&disk.0)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    assert_eq!(names, ["filler"], "nothing half-written is left behind");
}

#[test]
fn a_failing_raw_stream_stops_the_stream_not_the_recording() {
    let dir = temp_dir("raw-full");
    let file = dir.join("run.prof");
    let output = Command::new(profiler_bin())
        .args(["record", "--raw", "-", "-o", path_str(&file), "--"])
        .arg(workload("cpu_split"))
        .arg("1000")
        .stdout(
            std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        )
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "error: --raw (standard output): cannot write; stopped streaming samples: No space \
             left on device (os error 28)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("Sample accounting:"), "{stderr}");
    assert!(function_samples(&read_profile(&file).unwrap(), "cpu_split::heavy_work") > 100);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn cap_bpf_and_cap_perfmon_alone_are_enough() {
    require_root();
    // The unprivileged user the capability test runs as.
    let (uid, gid) = system_user("profiler-test");
    let dir = temp_dir("capabilities");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let binary = dir.join("profiler");
    std::fs::copy(profiler_bin(), &binary).unwrap();
    let cpu_split = dir.join("cpu_split");
    std::fs::copy(workload("cpu_split"), &cpu_split).unwrap();
    let setcap = Command::new("setcap")
        .args(["cap_bpf,cap_perfmon+ep", path_str(&binary)])
        .status()
        .expect("setcap (Debian package libcap2-bin) is installed");
    assert!(setcap.success());
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    lchown(&out, uid);
    let file = out.join("run.prof");
    let as_user = |args: &[&str]| {
        Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={gid}"),
                "--clear-groups",
                "--",
            ])
            .arg(&binary)
            .args(args)
            .current_dir(&out)
            .output()
            .unwrap()
    };
    let output = as_user(&[
        "record",
        "--stats",
        "-o",
        path_str(&file),
        "--",
        path_str(&cpu_split),
        "2000",
    ]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Unless they are on for the whole machine already (kernel.bpf_stats_enabled, which the
    // bench turns on while it measures), the statistics need CAP_SYS_ADMIN.
    let enabled = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .is_ok_and(|value| value.trim() == "1");
    if enabled {
        assert!(stderr.contains("ns per sample over"), "{stderr}");
    } else {
        assert!(
            stderr.contains("enabling BPF run-time statistics needs CAP_SYS_ADMIN"),
            "--stats degrades with a note: {stderr}"
        );
    }
    // Kernel symbols: said before the start when /proc/kallsyms hides them from this user.
    let kallsyms = Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
        ])
        .args(["head", "-c", "16", "/proc/kallsyms"])
        .output()
        .unwrap();
    let hidden = text(&kallsyms.stdout).bytes().all(|b| b == b'0');
    assert_eq!(
        stderr.contains("note: kernel symbols are hidden from this user"),
        hidden,
        "{stderr}"
    );
    let map_memory = stderr
        .lines()
        .find_map(|line| line.trim().strip_prefix("map memory: "))
        .unwrap_or_else(|| panic!("no map memory line: {stderr}"));
    assert!(!map_memory.starts_with("0.0 MiB"), "{map_memory}");
    assert_eq!(std::fs::metadata(&file).unwrap().uid(), uid);
    let profile = read_profile(&file).unwrap();
    let all: u64 = profile.stacks.iter().map(|s| s.count).sum();
    let heavy = function_samples(&profile, "cpu_split::heavy_work");
    assert!(
        heavy * 100 > all * 30,
        "heavy_work has {heavy} of {all} samples"
    );

    // Another user's process cannot be read: said before anything starts.
    let started = Instant::now();
    let output = as_user(&["record", "-p", "1", "--duration", "30"]);
    assert!(!output.status.success());
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        text(&output.stderr).contains("-p 1: cannot read the process's mappings and files")
            && text(&output.stderr).contains("CAP_SYS_PTRACE"),
        "{}",
        text(&output.stderr)
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_signal_while_the_report_is_computed_stops_the_profiler_at_once() {
    let dir = temp_dir("late-signal");
    let file = dir.join("run.prof");
    let mut profiler = Running::spawn(
        Command::new(profiler_bin())
            .args(["record", "-a", "--duration", "1", "-o", path_str(&file)])
            .stderr(Stdio::piped()),
    );
    wait_until_recording(profiler.id());
    // The counters close when the recording ends; symbolizing a whole system follows.
    let has_perf_events = || {
        std::fs::read_dir(format!("/proc/{}/fd", profiler.id())).is_ok_and(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .any(|link| link.to_string_lossy() == "anon_inode:[perf_event]")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while has_perf_events() {
        assert!(Instant::now() < deadline, "the recording did not end");
        std::thread::sleep(Duration::from_millis(5));
    }
    let signalled = Instant::now();
    profiler.signal(libc::SIGINT);
    let output = profiler.output_at_most(Duration::from_secs(30));
    let stderr = text(&output.stderr);
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "took {:?}",
        signalled.elapsed()
    );
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("SIGINT while the report was computed"),
        "{stderr}"
    );
    assert!(!file.exists(), "no half-written profile");
    let leftovers = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(leftovers, 0, "no temporary file left behind");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn a_command_whose_profiler_fails_to_start_never_runs() {
    require_root();
    let dir = temp_dir("failed-start");
    let marker = dir.join("ran");
    // Each descriptor limit makes the profiler fail one step later, until it has enough: some
    // of those steps come after the command was started stopped (its counters, the side-band).
    let mut failed_after_launch = false;
    for limit in 20..400 {
        let script = format!(
            "ulimit -n {limit} && exec \"$0\" record -- sh -c 'touch {}'",
            marker.display()
        );
        let output = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .arg(profiler_bin())
            .output()
            .unwrap();
        if output.status.success() {
            assert!(marker.exists(), "a successful recording ran its command");
            break;
        }
        let stderr = text(&output.stderr);
        failed_after_launch |= stderr.contains("cannot open event");
        // An orphaned command would run right after its profiler exited.
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !marker.exists(),
            "the command ran although its profiler failed (ulimit -n {limit}): {stderr}"
        );
    }
    assert!(
        failed_after_launch,
        "no descriptor limit made the counters fail to open"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Samples whose innermost user frame is in `function` and whose stack reaches `root`.
fn reaching(profile: &Profile, function: &str, root: &str) -> u64 {
    profile
        .stacks
        .iter()
        .filter(|stack| {
            let mut user = stack
                .frames
                .iter()
                .map(|&id| &profile.frames[id as usize])
                .filter(|frame| !frame.kernel);
            user.next()
                .is_some_and(|frame| frame.function.as_deref() == Some(function))
                && user.any(|frame| frame.function.as_deref() == Some(root))
        })
        .map(|stack| stack.count)
        .sum()
}

#[test]
fn perfs_call_graph_options_record_the_command_with_its_callers() {
    let dir = temp_dir("perf-call-graph");
    let cpu_split = workload("cpu_split");
    for (i, options) in [
        &["-g"][..],
        &["--call-graph", "dwarf"],
        &["--call-graph", "dwarf,16384"],
        &["--call-graph", "fp"],
        &["-g", "--call-graph", "dwarf"],
    ]
    .into_iter()
    .enumerate()
    {
        let file = dir.join(format!("run-{i}.prof"));
        let mut args = vec!["record", "-o", path_str(&file)];
        args.extend_from_slice(options);
        // perf's order: the options, then the command with no `--`.
        args.extend([path_str(&cpu_split), "1500"]);
        let output = run(&args);
        assert!(
            output.status.success(),
            "{options:?}: {}",
            text(&output.stderr)
        );
        let profile = read_profile(&file).unwrap();
        let heavy = function_samples(&profile, "cpu_split::heavy_work");
        assert!(heavy > 100, "{options:?}: {heavy} samples in heavy_work");
        // Whole stacks: heavy_work's samples reach the program's main.
        let whole = reaching(&profile, "cpu_split::heavy_work", "cpu_split::main");
        assert!(
            whole * 10 >= heavy * 9,
            "{options:?}: {whole} of heavy_work's {heavy} samples reach main"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn unknown_options_and_typos_are_refused_by_name_and_never_run() {
    let dir = temp_dir("unknown-options");
    let marker = dir.join("ran");
    let script = dir.join("program.sh");
    std::fs::write(&script, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (options, named, suggested) in [
        (
            &["--flamegrpah", "fg.svg"][..],
            "--flamegrpah",
            Some("--flamegraph"),
        ),
        (&["--bogus"], "--bogus", None),
        (&["-x"], "-x", None),
        (&["--call-graph", "lbr"], "lbr", Some("--unwind dwarf")),
        (
            &["--call-graph", "fp", "--unwind", "dwarf"],
            "--call-graph",
            None,
        ),
    ] {
        let mut args = vec!["record"];
        args.extend_from_slice(options);
        args.push(path_str(&script));
        let output = run(&args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{options:?}: {stderr}");
        assert!(stderr.contains(named), "{options:?}: {stderr}");
        if let Some(suggested) = suggested {
            assert!(stderr.contains(suggested), "{options:?}: {stderr}");
        }
        assert!(!stderr.contains("cannot run"), "{options:?}: {stderr}");
        assert!(!marker.exists(), "{options:?} ran the program");
    }
    // After the program's name, what follows is the program's own.
    let output = run(&["record", path_str(&script), "-x", "--bogus"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(marker.exists(), "the program ran with its own options");
    std::fs::remove_dir_all(dir).ok();
}

/// Runs the profiler in `dir` (where `record` keeps profiler.data and `report` reads it).
fn run_in(dir: &Path, args: &[&str]) -> Output {
    require_root();
    Command::new(profiler_bin())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the profiler runs")
}

/// A script that leaves a mark when it runs: a refused option must not run it.
fn marking_program(dir: &Path) -> (PathBuf, PathBuf) {
    let marker = dir.join("ran");
    let script = dir.join("program.sh");
    std::fs::write(&script, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, marker)
}

/// Each refused perf option: usage status 2, `error: OPTION: ...` naming what to use instead,
/// and the program is not run.
fn assert_refused(subcommand: &str, cases: &[(&[&str], &str, &str)]) {
    let dir = temp_dir("perf-refused");
    let (script, marker) = marking_program(&dir);
    for (options, named, instead) in cases {
        let mut args = vec![subcommand];
        args.extend_from_slice(options);
        if subcommand != "report" {
            args.extend(["--", path_str(&script)]);
        }
        let output = run(&args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{options:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("error: {named}: ")) && stderr.contains(instead),
            "{options:?}: {stderr}"
        );
        assert!(!marker.exists(), "{options:?} ran the program");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn perfs_record_options_work_or_say_what_to_use_instead() {
    assert_refused(
        "record",
        &[
            (&["-b"], "-b/--branch-any", "--unwind dwarf"),
            (&["--branch-any"], "-b/--branch-any", "no LBR here"),
            (&["-j", "any_call"], "-j/--branch-filter", "no LBR here"),
            (&["--user-regs", "sp,ip"], "--user-regs", "--unwind copy"),
            (
                &["--switch-output"],
                "--switch-output",
                "profiler agent --interval",
            ),
            (
                &["--switch-output=signal"],
                "--switch-output",
                "--output-dir DIR",
            ),
            (&["-q"], "-q/--quiet", "--report FILE"),
            (&["-C", "0"], "-C/--cpu", "use -a"),
            (&["-t", "1"], "-t/--tid", "-p PID"),
            (&["-m", "128"], "-m/--mmap-pages", "--ring-buffer-kib"),
            (&["-d"], "-d/--data", "--by dcache-line"),
            (&["-W"], "-W/--weight", "--histogram"),
            (&["-T"], "-T/--timestamp", "--raw FILE"),
        ],
    );
    // perf's `-a -- sleep TIME` records every CPU for TIME; `--count` is `-c`.
    let dir = temp_dir("perf-sleep");
    let _busy = Running::spawn(
        Command::new(workload("cpu_split"))
            .arg("20000")
            .stderr(Stdio::null()),
    );
    let file = dir.join("sleep.prof");
    let output = run(&[
        "record",
        "-a",
        "-e",
        "cpu-clock",
        "--count",
        "1000000",
        "-o",
        path_str(&file),
        "--",
        "sleep",
        "1",
    ]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("Recording ended: --duration ended."),
        "{stderr}"
    );
    // Ended by the duration, not by a `sleep` command exiting; start-up on a loaded machine
    // counts too: not less than asked, and not many times more.
    let profile = read_profile(&file).unwrap();
    let recorded = Duration::from_nanos(profile.meta.duration_ns);
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(5)).contains(&recorded),
        "recorded for {recorded:?}"
    );
    assert_eq!(profile.events[0].period, Some(1_000_000), "--count is -c");
    assert!(function_samples(&profile, "cpu_split::heavy_work") > 100);
    // Any other command with -a: perf would profile the system while it runs; said, not run.
    let (script, marker) = marking_program(&dir);
    let output = run(&["record", "-a", "--", path_str(&script)]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("give -a --duration TIME"), "{stderr}");
    assert!(!marker.exists());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn record_keeps_profiler_data_and_report_reads_it_with_perfs_options() {
    let dir = temp_dir("default-profile");
    let cpu_split = workload("cpu_split");
    let nothing = run_in(&dir, &["report"]);
    let stderr = text(&nothing.stderr);
    assert_eq!(nothing.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: no profiler.data here to report on: record one with"),
        "{stderr}"
    );
    for run in 0..2 {
        let output = run_in(&dir, &["record", "-F", "999", path_str(&cpu_split), "800"]);
        let stderr = text(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(
            stderr.contains("profile written to profiler.data"),
            "{run}: {stderr}"
        );
    }
    // The run before is kept, as perf keeps perf.data.old.
    let old = read_profile(dir.join("profiler.data.old")).unwrap();
    assert!(function_samples(&old, "cpu_split::heavy_work") > 100);
    // perf's report options: --stdio, -n, -g are how the report is anyway; --comm and --dso
    // filter; -i is not needed.
    let output = run_in(
        &dir,
        &[
            "report",
            "--stdio",
            "-n",
            "-g",
            "--comm",
            "cpu_split",
            "--dso",
            "cpu_split",
        ],
    );
    let report = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(report.contains("cpu_split::heavy_work"), "{report}");
    assert!(
        !report.contains("libc.so"),
        "--dso keeps cpu_split's rows: {report}"
    );
    assert_refused(
        "report",
        &[(&["--percent-limit", "5"], "--percent-limit", "--top N")],
    );
    let sorted = run_in(&dir, &["report", "--sort", "dso,sym"]);
    let stderr = text(&sorted.stderr);
    assert_eq!(sorted.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("'dso,sym' for '--sort <KEY>'") && stderr.contains("give --by module"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn perfs_stat_options_work_or_say_what_to_use_instead() {
    assert_refused(
        "stat",
        &[
            (&["-r", "3"], "-r/--repeat", "repeat it in the shell"),
            (&["-x", ","], "-x/--field-separator", "--json"),
            (
                &["-I", "1000"],
                "-I/--interval-print",
                "profiler agent --interval",
            ),
            (&["-C", "0"], "-C/--cpu", "use -a"),
        ],
    );
    let started = Instant::now();
    let output = run(&[
        "stat",
        "-a",
        "-e",
        "cpu-clock",
        "--json",
        "--",
        "sleep",
        "0.5",
    ]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(started.elapsed() >= Duration::from_millis(500));
    let json: serde_json::Value = serde_json::from_str(&stderr).expect(&stderr);
    assert_eq!(json["target"], "all CPUs", "{json}");
    assert!(
        json["elapsed_ns"].as_u64().unwrap() >= 500_000_000,
        "{json}"
    );
    let event = &json["events"][0];
    assert_eq!(event["event"], "cpu-clock", "{json}");
    // Every CPU's clock for half a second: at least one whole CPU's worth.
    assert!(event["count"].as_u64().unwrap() >= 450_000_000, "{json}");
}

#[test]
fn durations_take_units_everywhere() {
    let dir = temp_dir("duration-units");
    for (duration, least, most) in [("500ms", 400, 4_000), ("1s", 900, 4_500)] {
        let file = dir.join(format!("{duration}.prof"));
        let output = run(&[
            "record",
            "-a",
            "-e",
            "cpu-clock",
            "--duration",
            duration,
            "--drain-interval",
            "250ms",
            "--off-cpu",
            "--off-cpu-min",
            "2ms",
            "-o",
            path_str(&file),
        ]);
        assert!(
            output.status.success(),
            "{duration}: {}",
            text(&output.stderr)
        );
        let recorded = Duration::from_nanos(read_profile(&file).unwrap().meta.duration_ns);
        assert!(
            (Duration::from_millis(least)..Duration::from_millis(most)).contains(&recorded),
            "--duration {duration}: recorded for {recorded:?}"
        );
    }
    let started = Instant::now();
    let output = run(&["stat", "-a", "-e", "cpu-clock", "--duration", "300ms"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(started.elapsed() >= Duration::from_millis(300));
    for (option, value, says) in [
        (
            "--duration",
            "1x",
            "unknown unit 'x': give a number with ns, us, ms, s, m or h",
        ),
        ("--duration", "0s", "give a time above 0"),
        ("--drain-interval", "1ms", "give 10ms to 24h"),
        ("--off-cpu-min", "fast", "unknown unit 'fast'"),
    ] {
        let output = run(&["record", "-a", "--off-cpu", option, value]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{option} {value}: {stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: invalid value '{value}' for '{option} <TIME>'"
            )) && stderr.contains(says),
            "{option} {value}: {stderr}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn completions_are_printed_for_each_shell() {
    let bash = run(&["completions", "bash"]);
    assert!(bash.status.success());
    let script = text(&bash.stdout);
    assert!(
        script.contains("--call-graph") && script.contains("--only-event"),
        "{script}"
    );
    let dir = temp_dir("completions");
    let file = dir.join("profiler.bash");
    std::fs::write(&file, &bash.stdout).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(text(&run(&["completions", "zsh"]).stdout).starts_with("#compdef profiler"));
    assert!(text(&run(&["completions", "fish"]).stdout).contains("complete -c profiler"));
    let unknown = run(&["completions", "tcsh"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        text(&unknown.stderr).contains("[possible values: bash, elvish, fish, powershell, zsh]")
    );
    std::fs::remove_dir_all(dir).ok();
}
