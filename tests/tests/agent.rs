//! `profiler agent`: a real agent profiles the whole system while a workload runs, writes a pprof
//! file per window into `--output-dir`, and exports its last, partial window when SIGTERM stops
//! it. Each file is read by Google's pprof and decoded here: windows follow one another without
//! gap, the workload's functions are in the windows it ran in and not in those after it, and
//! every sample the kernel fired is in its window's profile or counted there as lost.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use common::{
    google_pprof, is_window, profiler_bin, read_pprof, require_root, temp_dir,
    wait_until_recording, workload, Running,
};
use profiler::export::pprof::proto;
use profiler_common::capture::LossKind;

/// One window as its file holds it.
struct WindowFile {
    path: PathBuf,
    profile: proto::Profile,
}

impl WindowFile {
    fn read(path: &Path) -> WindowFile {
        WindowFile {
            path: path.to_path_buf(),
            profile: read_pprof(path),
        }
    }

    fn start_ns(&self) -> u64 {
        self.profile.time_nanos as u64
    }

    fn end_ns(&self) -> u64 {
        self.start_ns() + self.profile.duration_nanos as u64
    }

    fn comments(&self) -> Vec<&str> {
        self.profile
            .comment
            .iter()
            .map(|index| self.profile.string_table[*index as usize].as_str())
            .collect()
    }

    /// The number after `prefix: ` among the comments, 0 when absent (non-zero counts only).
    fn counted(&self, prefix: &str) -> u64 {
        self.comments()
            .iter()
            .find_map(|comment| comment.strip_prefix(&format!("{prefix}: ")))
            .map_or(0, |count| count.parse().unwrap())
    }

    /// Samples in the profile: the first value column counts them.
    fn samples(&self) -> u64 {
        self.profile
            .sample
            .iter()
            .map(|sample| sample.value[0] as u64)
            .sum()
    }

    fn names_function(&self, name: &str) -> bool {
        self.profile
            .function
            .iter()
            .any(|function| self.profile.string_table[function.name as usize] == name)
    }
}

/// The windows written into `dir`, oldest first (their names start with their start time).
fn window_files(dir: &Path) -> Vec<WindowFile> {
    // The agent's index of what it wrote is no window.
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| is_window(path))
        .collect();
    paths.sort();
    paths.iter().map(|path| WindowFile::read(path)).collect()
}

fn unix_ns(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

#[test]
fn the_agent_exports_a_window_per_interval_until_sigterm() {
    require_root();
    let dir = temp_dir("agent-windows");
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args([
                "agent",
                "--interval",
                "1",
                "--log-level",
                "debug",
                "--output-dir",
            ])
            .arg(&dir)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    // A window or two with no workload, then the workload, then windows without it again.
    std::thread::sleep(Duration::from_millis(1500));
    let workload_start = unix_ns(SystemTime::now());
    let mut cpu_split = Running::spawn(
        Command::new(workload("cpu_split"))
            .arg("8000")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    assert!(cpu_split.wait_at_most(Duration::from_secs(60)).success());
    let workload_end = unix_ns(SystemTime::now());
    std::thread::sleep(Duration::from_millis(2500));
    // SIGTERM half-way through a window (they start on a grid of the interval): signalled just
    // after a window closed, the last partial one would be too short to hold a sample.
    let grid = window_files(&dir).last().unwrap().start_ns();
    let into_window = (unix_ns(SystemTime::now()) - grid) % 1_000_000_000;
    std::thread::sleep(Duration::from_nanos(
        (1_500_000_000 - into_window) % 1_000_000_000,
    ));
    let signalled = Instant::now();
    let signal_time = unix_ns(SystemTime::now());
    agent.signal(libc::SIGTERM);
    let output = agent.output_at_most(Duration::from_secs(30));
    let exit_took = signalled.elapsed();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert!(
        exit_took < Duration::from_secs(2),
        "took {exit_took:?} to exit:\n{log}"
    );
    assert!(
        log.contains("received SIGTERM: exported the last window"),
        "{log}"
    );

    let windows = window_files(&dir);
    assert!(windows.len() >= 5, "{} windows:\n{log}", windows.len());

    for window in &windows {
        // Google's own reader takes every file.
        let read = Command::new(google_pprof())
            .args(["-raw"])
            .arg(&window.path)
            .output()
            .unwrap();
        assert!(
            read.status.success(),
            "pprof cannot read {}: {}",
            window.path.display(),
            String::from_utf8_lossy(&read.stderr)
        );
        // Every sample fired is in the window or counted there as lost.
        let fired = window.counted("samples fired: cpu-clock");
        let lost: u64 = LossKind::ALL
            .iter()
            .filter(|kind| kind.loses_sample())
            .map(|kind| window.counted(kind.describe()))
            .sum();
        assert!(
            fired > 0,
            "{}: {:?}",
            window.path.display(),
            window.comments()
        );
        assert_eq!(
            fired,
            window.samples() + lost,
            "{}: {:?}",
            window.path.display(),
            window.comments()
        );
    }
    // One window begins where the one before ended.
    for pair in windows.windows(2) {
        assert_eq!(
            pair[0].end_ns(),
            pair[1].start_ns(),
            "{}",
            pair[1].path.display()
        );
        assert!(pair[0].profile.duration_nanos < 2_000_000_000);
    }
    // The last window is the partial one SIGTERM cut short: it reaches the signal.
    let last = windows.last().unwrap();
    assert!(last.end_ns() + 100_000_000 >= signal_time, "{log}");

    // The workload is in the windows it filled, and in none after it ended.
    let during: Vec<&WindowFile> = windows
        .iter()
        .filter(|w| w.start_ns() >= workload_start && w.end_ns() <= workload_end)
        .collect();
    assert!(!during.is_empty(), "the workload ran for whole windows");
    for window in during {
        assert!(
            window.names_function("cpu_split::heavy_work"),
            "{}",
            window.path.display()
        );
    }
    let after: Vec<&WindowFile> = windows
        .iter()
        .filter(|w| w.start_ns() > workload_end + 200_000_000)
        .collect();
    assert!(!after.is_empty());
    for window in after {
        assert!(
            !window.names_function("cpu_split::heavy_work"),
            "{}",
            window.path.display()
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn old_windows_are_removed_to_stay_within_max_disk() {
    require_root();
    let dir = temp_dir("agent-max-disk");
    std::fs::write(dir.join("keep.txt"), b"not a profile").unwrap();
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args([
                "agent",
                "--interval",
                "0.3",
                "--max-disk",
                "3K",
                "--output-dir",
            ])
            .arg(&dir)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    std::thread::sleep(Duration::from_secs(4));
    let log = agent.terminate();
    let exported = log.matches("exported to --output-dir").count();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.contains(&"keep.txt".to_string()), "{names:?}");
    let profiles: Vec<&String> = names.iter().filter(|n| n.ends_with(".pb.gz")).collect();
    let bytes: u64 = profiles
        .iter()
        .map(|name| std::fs::metadata(dir.join(name)).unwrap().len())
        .sum();
    assert!(
        exported > profiles.len(),
        "{exported} exported, {profiles:?} kept:\n{log}"
    );
    // Within the budget, or only the newest when it alone is larger.
    assert!(
        bytes <= 3 * 1024 || profiles.len() == 1,
        "{bytes} bytes in {profiles:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_agent_needs_somewhere_to_export() {
    let output = Command::new(profiler_bin())
        .args(["agent", "--interval", "1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("nowhere to export the profiles: give --output-dir DIR"),
        "{stderr}"
    );
    // A missing directory is created (see tests/security.rs); one that cannot be made (a file
    // stands where a parent should be) is named as the directory given, not as a profile file
    // that never exists.
    let file = temp_dir("agent-not-a-dir").join("file");
    std::fs::write(&file, b"").unwrap();
    let below_file = file.join("profiles");
    let refused = Command::new(profiler_bin())
        .args(["agent", "--output-dir"])
        .arg(&below_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: --output-dir {}\n", below_file.display()))
            && stderr.contains("cannot create it")
            && !stderr.contains("profile-0000000000000"),
        "{stderr}"
    );
}

#[test]
fn the_agent_creates_its_output_directory() {
    require_root();
    let parent = temp_dir("agent-creates-dir");
    std::fs::remove_dir_all(&parent).ok();
    let dir = parent.join("nested/profiles");
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", "99", "--interval", "500ms", "--output-dir"])
            .arg(&dir)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_dir(&dir).map_or(0, |entries| entries.count()) == 0 {
        assert!(Instant::now() < deadline, "no window in {}", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = agent.terminate();
    use std::os::unix::fs::PermissionsExt;
    for created in [&parent.join("nested"), &dir] {
        let mode = std::fs::metadata(created).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o750, "{}: {mode:o}\n{log}", created.display());
    }
    assert!(
        window_files(&dir)
            .iter()
            .all(|window| window.path.extension().is_some_and(|e| e == "gz")),
        "{log}"
    );
    std::fs::remove_dir_all(parent).ok();
}

#[test]
fn the_agent_says_wakers_are_for_record() {
    let dir = temp_dir("agent-wakers");
    let output = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "--off-cpu", "--wakers", "--output-dir"])
            .arg(&dir)
            .stderr(Stdio::piped()),
    )
    .output_at_most(Duration::from_secs(10));
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--wakers is a view of `record`'s report"),
        "{stderr}"
    );
}

/// What the agent's windows say about a function: its file, and the lines of the locations in
/// it (0 where no line is known).
fn function_lines(profile: &proto::Profile, name: &str) -> (String, Vec<i64>) {
    let text = |index: i64| profile.string_table[index as usize].as_str();
    let Some(function) = profile.function.iter().find(|f| text(f.name) == name) else {
        return (String::new(), Vec::new());
    };
    let lines = profile
        .location
        .iter()
        .flat_map(|location| &location.line)
        .filter(|line| line.function_id == function.id)
        .map(|line| line.line)
        .collect();
    (text(function.filename).to_string(), lines)
}

/// Runs the agent with `args` while cpu_split and a memcpy-bound python3 run; their windows.
fn agent_windows_of_workloads(name: &str, args: &[&str]) -> Vec<WindowFile> {
    let dir = temp_dir(name);
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", "499", "--interval", "1", "--output-dir"])
            .arg(&dir)
            .args(args)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let mut cpu_split = Running::spawn(
        Command::new(workload("cpu_split"))
            .arg("3000")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    // glibc's memcpy, named `__memmove_*_unaligned_erms` only in libc6-dbg's debug file.
    let mut memcpy = Running::spawn(Command::new("python3").args([
        "-c",
        "b = bytes(32 << 20)\nfor _ in range(60): bytearray(b)",
    ]));
    assert!(cpu_split.wait_at_most(Duration::from_secs(60)).success());
    assert!(memcpy.wait_at_most(Duration::from_secs(60)).success());
    agent.terminate();
    window_files(&dir)
}

#[test]
fn source_lines_are_read_only_when_asked_and_symbol_tables_name_glibcs_internal_functions() {
    require_root();
    for source_lines in [false, true] {
        let args: &[&str] = if source_lines {
            &["--source-lines"]
        } else {
            &[]
        };
        let windows = agent_windows_of_workloads("agent-source-lines", args);
        let found: Vec<(String, Vec<i64>)> = windows
            .iter()
            .map(|window| function_lines(&window.profile, "cpu_split::heavy_work"))
            .filter(|(_, lines)| !lines.is_empty())
            .collect();
        let file: Vec<&String> = found.iter().map(|(file, _)| file).collect();
        let lines: Vec<i64> = found.iter().flat_map(|(_, lines)| lines.clone()).collect();
        assert!(!lines.is_empty(), "cpu_split::heavy_work was sampled");
        if source_lines {
            assert!(
                file.iter().any(|file| file.ends_with("cpu_split.rs")),
                "{file:?}"
            );
            assert!(lines.iter().all(|&line| line > 0), "{lines:?}");
        } else {
            assert!(file.iter().all(|file| file.is_empty()), "{file:?}");
            assert!(lines.iter().all(|&line| line == 0), "{lines:?}");
        }
        // Either way, the debug file's symbol table names memcpy's implementation.
        assert!(
            windows.iter().any(|window| {
                window.profile.function.iter().any(|function| {
                    let name = &window.profile.string_table[function.name as usize];
                    name.starts_with("__memmove_") || name.starts_with("__memcpy_")
                })
            }),
            "--source-lines {source_lines}: no window names glibc's memcpy"
        );
    }
}
