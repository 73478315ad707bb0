//! `record --unwind dwarf|fp` on a program built with -O2 -fomit-frame-pointer: the in-kernel
//! unwinder walks through frameless functions, glibc's qsort callback and memcpy to `_start` or
//! the thread start; the frame-pointer walk does not.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    c_workload::{build_dlopened_library, build_no_frame_pointers},
    is_window, profiler, profiler_bin, read_pprof, record_to, report_json, temp_dir,
    wait_until_recording, workload, Running,
};

/// The C workload's "mix" mode, built without frame pointers.
fn build_workload(dir: &Path) -> PathBuf {
    build_no_frame_pointers(dir, "no_frame_pointers", &[])
}

/// Folded stacks (root first) and their samples, of a recording of `binary ARGUMENTS` with
/// `options`, and the recording's stderr (its `--stats`).
fn record_with(
    options: &[&str],
    dir: &Path,
    binary: &Path,
    arguments: &[&str],
) -> (Vec<(String, u64)>, String) {
    let profile = dir.join("recording.prof");
    let mut command = vec![binary.to_str().unwrap()];
    command.extend(arguments);
    let stderr = record_to(&profile, options, &command);
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

/// [`record_with`] `--unwind UNWIND`.
fn record(
    unwind: &str,
    dir: &Path,
    binary: &Path,
    arguments: &[&str],
) -> (Vec<(String, u64)>, String) {
    record_with(&["--unwind", unwind], dir, binary, arguments)
}

fn complete(stack: &str) -> bool {
    let frames: Vec<&str> = stack.split(';').collect();
    frames
        .get(1)
        .is_some_and(|root| *root == "_start" || *root == "clone3")
}

/// The numbers of the `--stats` line "user stacks unwound: ...": walked with tables, complete,
/// by frame pointers, frames without a table, frames without a row, truncated (outside every
/// mapping, no caller, too deep), frames whose table was not loaded.
fn unwinder_counts(stderr: &str) -> Vec<u64> {
    let line = stderr
        .lines()
        .find(|line| line.contains("user stacks unwound:"))
        .unwrap_or_else(|| panic!("no unwinder line in --stats:\n{stderr}"));
    line.split(|c: char| !c.is_ascii_digit())
        .filter_map(|word| word.parse().ok())
        .collect()
}

#[test]
fn dwarf_unwinding_reaches_the_stack_roots_through_code_without_frame_pointers() {
    let dir = temp_dir("unwind-dwarf");
    let binary = build_workload(&dir);
    let (stacks, stderr) = record("dwarf", &dir, &binary, &["3000", "mix"]);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert!(total > 1000, "too few samples: {total}\n{stderr}");
    let counts = unwinder_counts(&stderr);
    let (walked, complete_walks) = (counts[0], counts[1]);
    assert!(
        complete_walks as f64 >= 0.99 * walked as f64,
        "{complete_walks} of {walked} walks complete\n{stderr}"
    );
    let reached: u64 = stacks
        .iter()
        .filter(|(stack, _)| complete(stack))
        .map(|(_, n)| n)
        .sum();
    // The few others are taken before the agent has loaded the new process's mappings
    // (frame-pointer walks, counted in --stats).
    assert!(
        reached as f64 >= 0.99 * total as f64,
        "{reached} of {total} samples reach _start or clone3\n{stderr}"
    );
    // The qsort callback's whole chain, in order, from main or the thread.
    let callback: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(stack, _)| stack.ends_with("compare_ints;leaf_mix") && complete(stack))
        .collect();
    assert!(!callback.is_empty(), "no complete qsort callback stack");
    for (stack, _) in callback {
        let chain_from_main = "_start;__libc_start_main_impl;__libc_start_call_main;main;mix;\
                               work;sort_some;__GI___qsort_r;msort_with_tmp";
        let chain_from_thread = "clone3;start_thread;thread_main;work;sort_some;__GI___qsort_r;\
                                 msort_with_tmp";
        let after_root = stack.split_once(';').unwrap().1;
        assert!(
            after_root.starts_with(chain_from_main) || after_root.starts_with(chain_from_thread),
            "qsort callback stack without its callers: {stack}"
        );
    }
    // Only the kernel's frame-pointer walks, of samples taken before the process was loaded,
    // can hold garbage: the frameless code's frame-pointer register holds data.
    let garbage: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(stack, _)| {
            stack.contains("[unknown]") && !stack.contains(";[frame pointers only];")
        })
        .collect();
    assert!(
        garbage.is_empty(),
        "garbage frames in a dwarf walk: {garbage:?}\n{stderr}"
    );
    // The samples taken before the process was loaded, walked by frame pointers, say so: in
    // their stacks and in the report's count.
    let marked: u64 = stacks
        .iter()
        .filter(|(stack, _)| stack.contains(";[frame pointers only];"))
        .map(|(_, n)| n)
        .sum();
    let report = report_json(&dir.join("recording.prof"), &[]);
    let counted = &report["events"][0]["user_stacks"]["frame_pointers_only"];
    assert_eq!(
        (marked, counted.as_u64()),
        (counts[2], Some(counts[2])),
        "frame-pointer-only stacks marked and counted, against the walker's count\n{stderr}"
    );
}

/// An overlayfs (a container's root file system) mounted for one test, unmounted when it
/// ends: `lower` is its read-only layer.
struct Overlay {
    dir: PathBuf,
    merged: PathBuf,
}

impl Overlay {
    fn mount(dir: &Path) -> Overlay {
        let [lower, upper, work, merged] =
            ["lower", "upper", "work", "merged"].map(|name| dir.join(name));
        for dir in [&lower, &upper, &work, &merged] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        let status = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &options])
            .arg(&merged)
            .status()
            .unwrap();
        assert!(status.success(), "mounting an overlayfs needs root");
        Overlay {
            dir: dir.to_path_buf(),
            merged,
        }
    }

    fn lower(&self) -> PathBuf {
        self.dir.join("lower")
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        Command::new("umount").arg(&self.merged).status().ok();
    }
}

#[test]
fn a_program_on_overlayfs_is_unwound_by_its_table() {
    // A container's programs run from an overlayfs, whose mappings the kernel holds by the
    // layer's file (another device than `stat` gives): a walker that finds tables by the
    // kernel's device and inode alone would find none of them, and walk by frame pointers.
    let dir = temp_dir("unwind-overlay");
    let overlay = Overlay::mount(&dir);
    let built = build_no_frame_pointers(&overlay.lower(), "overlaid", &[]);
    let binary = overlay.merged.join(built.file_name().unwrap());
    let (stacks, stderr) = record_system_wide_while(&dir, &binary, &["2000", "mix"]);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert!(total > 1000, "too few samples: {total}\n{stderr}");
    let samples = |keep: &dyn Fn(&str) -> bool| -> u64 {
        stacks
            .iter()
            .filter(|(stack, _)| keep(stack))
            .map(|(_, n)| n)
            .sum()
    };
    // The first samples of a program never seen before are walked by frame pointers until its
    // table is built; then the walker must find it (all of them, before the fix).
    let walked = samples(&|stack| !stack.contains("[frame pointers only]"));
    let whole = samples(&|stack| complete(stack));
    assert!(
        walked as f64 >= 0.8 * total as f64 && whole as f64 >= 0.99 * walked as f64,
        "{walked} of {total} samples walked with tables, {whole} reach _start or clone3\n{stderr}"
    );
    let callback = "_start;__libc_start_main_impl;__libc_start_call_main;main;mix;work;sort_some;\
                    __GI___qsort_r;msort_with_tmp";
    assert!(
        stacks
            .iter()
            .any(|(stack, _)| stack.contains(callback) && stack.ends_with("compare_ints;leaf_mix")),
        "no qsort callback stack under main\n{stderr}"
    );
}

#[test]
fn a_library_loaded_with_dlopen_mid_run_is_unwound_from_its_first_samples() {
    // The program sorts for 2 s, then loads a library built without frame pointers and runs in
    // it for 2 s: the walker meets addresses no published mapping holds and asks the agent,
    // which loads the library's table within a sample or two.
    let dir = temp_dir("unwind-dlopen");
    let binary = build_workload(&dir);
    let library = build_dlopened_library(&dir);
    let (stacks, stderr) = record(
        "dwarf",
        &dir,
        &binary,
        &["4000", "dlopen", library.to_str().unwrap()],
    );
    let in_library: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(stack, _)| stack.contains("library_leaf"))
        .collect();
    let total: u64 = in_library.iter().map(|(_, n)| n).sum();
    let whole: u64 = in_library
        .iter()
        .filter(|(stack, _)| {
            stack.contains(";_start;__libc_start_main_impl;__libc_start_call_main;main;library_work;library_leaf")
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        total > 500,
        "too few samples in the library: {total}\n{stderr}"
    );
    assert!(
        whole as f64 >= 0.99 * total as f64,
        "{whole} of {total} samples in the dlopen'ed library carry main <- library_work\n{stderr}"
    );
    // Before the library, the program's own chains are whole too.
    let (sorted, sorted_whole) = stacks
        .iter()
        .filter(|(stack, _)| stack.ends_with(";compare_records;record_key"))
        .fold((0, 0), |(all, whole), (stack, n)| {
            (
                all + n,
                whole
                    + if stack.contains(";main;sort_records;") {
                        *n
                    } else {
                        0
                    },
            )
        });
    assert!(
        sorted > 100 && sorted_whole as f64 >= 0.99 * sorted as f64,
        "{sorted_whole} of {sorted} record_key samples reach main through qsort\n{stderr}"
    );
}

/// `record -a` for 5 s while `binary ARGUMENTS` runs, started once the recording is: the
/// folded stacks (root first) of the processes named as `binary` (a name the kernel keeps
/// whole: at most 15 bytes), and the recording's stderr.
fn record_system_wide_while(
    dir: &Path,
    binary: &Path,
    arguments: &[&str],
) -> (Vec<(String, u64)>, String) {
    let profile = dir.join("recording.prof");
    let mut recording = Running::spawn(
        Command::new(profiler_bin())
            .args(["record", "-a", "-F", "997", "--duration", "5", "-o"])
            .arg(&profile)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    wait_until_recording(recording.id());
    let ran = Command::new(binary)
        .args(arguments)
        .status()
        .expect("the workload starts");
    assert!(ran.success(), "the workload failed: {ran}");
    let output = recording.output_at_most(Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "record -a failed:\n{stderr}");
    let folded = profiler(&["report", "-i", profile.to_str().unwrap(), "--folded", "-"]);
    let command = format!("{};", binary.file_name().unwrap().to_str().unwrap());
    let stacks = String::from_utf8_lossy(&folded.stdout)
        .lines()
        .filter(|line| line.starts_with(&command))
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            Some((stack.to_string(), count.parse().ok()?))
        })
        .collect();
    (stacks, stderr)
}

#[test]
fn a_process_started_mid_run_of_a_system_wide_recording_is_unwound_after_its_first_side_band_read()
{
    // System-wide, the walker does not wake the recorder for processes it never published: a
    // new one is published at the next side-band read (every 100 ms, then its tables are built),
    // and only the samples taken before that are walked by frame pointers, which stop at once in
    // this workload. Every later sample must be walked whole.
    let dir = temp_dir("unwind-system-wide");
    let binary = build_no_frame_pointers(&dir, "midrun", &[]);
    let (stacks, stderr) = record_system_wide_while(&dir, &binary, &["2000", "mix"]);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    assert!(
        total > 1000,
        "too few samples of the workload: {total}\n{stderr}"
    );
    let by_frame_pointers: u64 = stacks
        .iter()
        .filter(|(stack, _)| stack.contains("[frame pointers only]"))
        .map(|(_, n)| n)
        .sum();
    let walked = total - by_frame_pointers;
    let whole: u64 = stacks
        .iter()
        .filter(|(stack, _)| complete(stack))
        .map(|(_, n)| n)
        .sum();
    assert!(
        whole as f64 >= 0.99 * walked as f64,
        "{whole} of the {walked} samples walked with tables reach _start or clone3\n{stderr}"
    );
    // The workload runs for 2 s, so its samples tell the time: the frame-pointer walks may
    // cover one side-band interval and the building of the new tables, 250 ms in all.
    let before_publication = by_frame_pointers as f64 * 2000.0 / total as f64;
    assert!(
        before_publication <= 250.0,
        "{by_frame_pointers} of {total} samples, the first {before_publication:.0} ms of the \
         workload, were walked by frame pointers before the process was published\n{stderr}"
    );
}

#[test]
fn frame_pointer_walks_stop_at_the_first_frameless_function() {
    let dir = temp_dir("unwind-fp");
    let binary = build_workload(&dir);
    let (stacks, stderr) = record("fp", &dir, &binary, &["3000", "mix"]);
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
    // Frame pointers were asked for: no stack is marked as falling back to them.
    assert!(
        stderr.contains(", 0 by frame pointers only, "),
        "--unwind fp stacks counted as a fallback\n{stderr}"
    );
}

/// deep_stack's samples in its leaf, and those whose stack holds the whole chain from `_start`
/// through `deep_stack::main` and frame_01..frame_60 to the leaf.
fn sixty_frames_whole(stacks: &[(String, u64)]) -> (u64, u64) {
    let chain: Vec<String> = (1..=60)
        .map(|i| format!("deep_stack::frame_{i:02}"))
        .collect();
    let chain = chain.join(";");
    let through_leaf: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(stack, _)| stack.contains("deep_stack::leaf_work"))
        .collect();
    let total: u64 = through_leaf.iter().map(|(_, n)| n).sum();
    let whole: u64 = through_leaf
        .iter()
        .filter(|(stack, _)| {
            stack.contains(&format!("{chain};deep_stack::leaf_work"))
                && stack.contains(";deep_stack::main;")
                && stack.split(';').nth(1) == Some("_start")
        })
        .map(|(_, n)| n)
        .sum();
    (total, whole)
}

#[test]
fn rust_code_built_without_frame_pointers_is_unwound_whole_and_frame_pointers_are_not() {
    // deep_stack built here by rustc with frame pointers off (the workspace builds it with
    // them): 60 frames between main and the leaf that only unwind tables describe.
    let dir = temp_dir("unwind-rust-no-fp");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/deep_stack.rs");
    let binary = dir.join("deep_stack");
    common::run_checked(
        "rustc",
        &[
            "--edition",
            "2021",
            "-C",
            "opt-level=3",
            "-C",
            "force-frame-pointers=no",
            "-C",
            "debuginfo=1",
            "-o",
            binary.to_str().unwrap(),
            source.to_str().unwrap(),
        ],
    );
    let (stacks, stderr) = record("dwarf", &dir, &binary, &["15000"]);
    let (total, whole) = sixty_frames_whole(&stacks);
    assert!(
        total > 500,
        "too few samples in leaf_work: {total}\n{stderr}"
    );
    assert!(
        whole as f64 >= 0.99 * total as f64,
        "{whole} of {total} leaf samples carry _start, deep_stack::main and frame_01..frame_60\n{stderr}"
    );
    // The same program by frame pointers: none of it.
    let (stacks, stderr) = record("fp", &dir, &binary, &["5000"]);
    let (total, whole) = sixty_frames_whole(&stacks);
    assert!(
        total > 100 && whole == 0,
        "{whole} of {total} leaf samples whole by frame pointers: is it built without them?\n{stderr}"
    );
}

#[test]
fn dwarf_unwinding_walks_sixty_rust_frames_across_tail_calls() {
    // A Rust binary linked with its text segment starting mid-page (file offset and address
    // differ), 60 distinct frames between main and the leaf: two runs of the walker, which
    // goes on across a tail call after 32 frames.
    let dir = temp_dir("unwind-deep");
    let (stacks, stderr) = record("dwarf", &dir, &workload("deep_stack"), &["20000"]);
    let (total, whole) = sixty_frames_whole(&stacks);
    assert!(
        total > 500,
        "too few samples in leaf_work: {total}\n{stderr}"
    );
    // Found by rows, not by the frame-pointer fallback (this binary keeps frame pointers too):
    // each mapping's load bias is right.
    let counts = unwinder_counts(&stderr);
    let (walked, without_row) = (counts[0], counts[4]);
    assert!(
        without_row <= walked / 100,
        "{without_row} frames without a row in {walked} walks\n{stderr}"
    );
    assert!(
        whole as f64 >= 0.9 * total as f64,
        "{whole} of {total} leaf samples carry _start, deep_stack::main and frame_01..frame_60\n{stderr}"
    );
}

/// Whether the deep workload's stack `leaf_first` is the leaf, 125 callers and the marker: cut
/// where the walk stops, after 126 frames.
fn cut_at_the_walks_depth<'a>(leaf_first: impl Iterator<Item = &'a str>) -> bool {
    let frames: Vec<&str> = leaf_first.collect();
    frames.len() == 127
        && frames[1..126].iter().all(|frame| *frame == "descend")
        && frames[126] == "[truncated]"
}

#[test]
fn a_stack_deeper_than_the_walk_ends_truncated_after_its_126_frames() {
    // 200 frames, 1 KiB of stack each, frameless: the walk takes 126 (four runs of the walker,
    // the last one short), then marks the stack cut short and counts why.
    let dir = temp_dir("unwind-too-deep");
    let binary = build_workload(&dir);
    let (stacks, stderr) = record("dwarf", &dir, &binary, &["2000", "deep", "200"]);
    let leaf: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(stack, _)| stack.ends_with(";record_key"))
        .collect();
    let total: u64 = leaf.iter().map(|(_, n)| n).sum();
    assert!(
        total > 500,
        "too few samples in record_key: {total}\n{stderr}"
    );
    // The process name, then the stack.
    let cut_at_the_depth: u64 = leaf
        .iter()
        .filter(|(stack, _)| {
            stack
                .split_once(';')
                .is_some_and(|(_, frames)| cut_at_the_walks_depth(frames.rsplit(';')))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        cut_at_the_depth as f64 >= 0.95 * total as f64,
        "{cut_at_the_depth} of {total} leaf samples hold 126 frames and the marker\n{stderr}"
    );
    let counts = unwinder_counts(&stderr);
    let (walked, too_deep) = (counts[0], counts[7]);
    assert!(
        too_deep as f64 >= 0.95 * walked as f64,
        "{too_deep} of {walked} walks counted too deep\n{stderr}"
    );
}

#[test]
fn the_agents_windows_end_a_deep_walk_at_the_same_126_frames() {
    // The agent's walks of a stack deeper than the walker takes end at the same 126 frames,
    // marked cut short in its pprof windows as in `record`'s profile.
    let dir = temp_dir("unwind-agent-too-deep");
    let binary = build_workload(&dir);
    let windows = dir.join("windows");
    std::fs::create_dir(&windows).unwrap();
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", "499", "--interval", "1", "--output-dir"])
            .arg(&windows)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let mut workload = Running::spawn(
        Command::new(&binary)
            .args(["3000", "deep", "200"])
            .stdout(Stdio::null()),
    );
    let ran = workload.wait_at_most(Duration::from_secs(60));
    assert!(ran.success(), "the workload failed: {ran}");
    let stderr = agent.terminate();
    // Its own process's: the system-wide agent also samples other tests' runs of the workload.
    let leaf_stacks: Vec<(Vec<String>, u64)> = window_stacks(&windows)
        .into_iter()
        .filter(|stack| stack.pid == workload.id())
        .filter(|stack| {
            stack
                .frames
                .first()
                .is_some_and(|leaf| leaf == "record_key")
        })
        .map(|stack| (stack.frames, stack.count))
        .collect();
    // Samples taken before the agent published the new process are walked by frame pointers,
    // which stop at once here; the rest are walked by tables.
    let walked: Vec<&(Vec<String>, u64)> = leaf_stacks
        .iter()
        .filter(|(frames, _)| !frames.iter().any(|frame| frame == "[frame pointers only]"))
        .collect();
    let total: u64 = walked.iter().map(|(_, n)| n).sum();
    assert!(
        total > 300,
        "too few samples in record_key walked by tables: {total}\n{stderr}"
    );
    let cut_at_the_depth: u64 = walked
        .iter()
        .filter(|(frames, _)| cut_at_the_walks_depth(frames.iter().map(String::as_str)))
        .map(|(_, n)| n)
        .sum();
    eprintln!("{cut_at_the_depth} of {total} leaf samples walked by tables cut at 126 frames");
    assert!(
        cut_at_the_depth as f64 >= 0.99 * total as f64,
        "{cut_at_the_depth} of {total} leaf samples walked by tables hold 126 frames and the \
         marker; one that does not: {:?}\n{stderr}",
        walked
            .iter()
            .find(|(frames, _)| !cut_at_the_walks_depth(frames.iter().map(String::as_str)))
    );
}

/// The samples of the agent's pprof windows in `windows`: each one's process name (its `comm`
/// label), function names leaf first (as pprof lists a sample's locations), and count.
/// One stack of an agent's window: its process, the process's name, its frames' functions
/// (innermost first) and its samples.
struct WindowStack {
    pid: u32,
    comm: String,
    frames: Vec<String>,
    count: u64,
}

fn window_stacks(windows: &Path) -> Vec<WindowStack> {
    let mut stacks = Vec::new();
    for entry in std::fs::read_dir(windows).unwrap() {
        let path = entry.unwrap().path();
        if !is_window(&path) {
            continue;
        }
        let profile = read_pprof(&path);
        let text = |index: i64| profile.string_table[index as usize].as_str();
        let function_of_location: HashMap<u64, &str> = profile
            .location
            .iter()
            .map(|location| {
                let function = location.line.first().map_or(0, |line| line.function_id);
                let name = profile
                    .function
                    .iter()
                    .find(|f| f.id == function)
                    .map_or("", |f| text(f.name));
                (location.id, name)
            })
            .collect();
        for sample in &profile.sample {
            let label = |key: &str| sample.label.iter().find(|label| text(label.key) == key);
            stacks.push(WindowStack {
                pid: label("pid").map_or(0, |label| label.num as u32),
                comm: label("comm")
                    .map_or("", |label| text(label.str))
                    .to_string(),
                frames: sample
                    .location_id
                    .iter()
                    .map(|id| function_of_location[id].to_string())
                    .collect(),
                count: sample.value[0] as u64,
            });
        }
    }
    stacks
}

/// Samples in all, and those whose root is `_start` or a thread's start (`clone3`), or whose
/// root satisfies `also_root` (a stripped binary's entry point, named module+offset).
fn reaching_roots(stacks: &[(String, u64)], also_root: impl Fn(&str) -> bool) -> (u64, u64) {
    let total = stacks.iter().map(|(_, n)| n).sum();
    let reached = stacks
        .iter()
        .filter(|(stack, _)| complete(stack) || stack.split(';').nth(1).is_some_and(&also_root))
        .map(|(_, n)| n)
        .sum();
    (total, reached)
}

#[test]
fn debian_xz_stacks_reach_its_entry_point() {
    let dir = temp_dir("unwind-xz");
    // 4 MB of base64 text: about 2 s of `xz -6` on one thread.
    let mut data = Vec::with_capacity(4 << 20);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while data.len() < 4 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.push(
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[x as usize % 64],
        );
    }
    let input = dir.join("input.txt");
    std::fs::write(&input, &data).unwrap();
    let (stacks, stderr) = record(
        "dwarf",
        &dir,
        Path::new("/usr/bin/xz"),
        &["-6", "-T1", "-k", "-f", input.to_str().unwrap()],
    );
    // Debian's xz is stripped: its _start is named by offset.
    let (total, reached) = reaching_roots(&stacks, |root| root.starts_with("xz+0x"));
    assert!(total > 500, "too few samples: {total}\n{stderr}");
    assert!(
        reached as f64 >= 0.95 * total as f64,
        "{reached} of {total} xz samples reach its entry point\n{stderr}"
    );
    let counts = unwinder_counts(&stderr);
    assert!(
        counts[1] as f64 >= 0.95 * total as f64,
        "{} of {total} walks reached the outermost frame\n{stderr}",
        counts[1]
    );
    let through_lzma: u64 = stacks
        .iter()
        .filter(|(stack, _)| stack.contains(";lzma_code;"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        through_lzma as f64 >= 0.5 * total as f64,
        "only {through_lzma} of {total} samples through liblzma's lzma_code"
    );
}

#[test]
fn debian_python_stacks_reach_main() {
    let dir = temp_dir("unwind-python");
    let script = dir.join("work.py");
    // 2 s of CPU time, however busy the machine is.
    std::fs::write(
        &script,
        "import time, json\n\
         end = time.process_time() + 2\n\
         data = [{'k': i, 'v': str(i) * 3} for i in range(2000)]\n\
         while time.process_time() < end:\n    \
             sorted(json.loads(json.dumps(data)), key=lambda d: d['v'])\n",
    )
    .unwrap();
    let (stacks, stderr) = record(
        "dwarf",
        &dir,
        Path::new("/usr/bin/python3.11"),
        &[script.to_str().unwrap()],
    );
    let (total, reached) = reaching_roots(&stacks, |_| false);
    assert!(total > 1000, "too few samples: {total}\n{stderr}");
    assert!(
        reached as f64 >= 0.95 * total as f64,
        "{reached} of {total} python3 samples reach _start\n{stderr}"
    );
    // The script's stacks: its Python frames stand where the evaluator's were.
    let interpreted: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(stack, _)| stack.contains(";<module>;") && complete(stack))
        .collect();
    assert!(!interpreted.is_empty(), "no complete interpreter stack");
    for (stack, _) in interpreted {
        // Debian's python3.11 calls Py_BytesMain from main as a tail call: main is not on the
        // stack.
        assert!(
            stack.contains(";__libc_start_call_main;Py_BytesMain;"),
            "interpreter stack without Py_BytesMain under libc's start: {stack}"
        );
    }
}

#[test]
fn go_goroutine_stacks_reach_the_runtimes_top_frame_and_count_complete() {
    let dir = temp_dir("unwind-go");
    let binary = dir.join("spin");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/go/spin.go");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(&source)
        .env("GO111MODULE", "off")
        .output()
        .expect("go is installed (cargo xtask setup installs golang-go)");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let profile = dir.join("spin.prof");
    let stderr = record_to(
        &profile,
        &["-F", "999"],
        &[binary.to_str().unwrap(), "1500"],
    );
    let report = report_json(&profile, &[]);
    let event = &report["events"][0];
    let stacks = &event["user_stacks"];
    assert!(
        stacks["samples"].as_u64().unwrap() > 1000,
        "{stacks:#}\n{stderr}"
    );
    // Every goroutine's stack ends in runtime.goexit: reaching it is whole, as perf's and Go's
    // own tracebacks have it.
    assert!(
        stacks["complete_percent"].as_f64().unwrap() > 95.0,
        "{stacks:#}\n{stderr}"
    );
    let hot = common::self_percent(event, "main.spinHot");
    let cold = common::self_percent(event, "main.spinCold");
    assert!(
        (hot - 66.7).abs() < 5.0 && (cold - 33.3).abs() < 5.0,
        "{hot} / {cold}"
    );
    let folded = profiler(&["report", "-i", profile.to_str().unwrap(), "--folded", "-"]);
    let folded = String::from_utf8_lossy(&folded.stdout);
    assert!(
        folded.lines().any(|line| line
            .starts_with("spin;runtime.goexit;main.main.gowrap1;main.main.func1;main.spinHot ")),
        "{folded}"
    );
}

#[test]
fn samples_taken_in_the_kernel_unwind_the_user_stack_from_the_task_registers() {
    // dd spends its time in read and write system calls: most samples interrupt the kernel,
    // whose registers say nothing of the user stack; the walk starts from the registers the
    // task saved on entering the kernel.
    let dir = temp_dir("unwind-syscalls");
    let (stacks, stderr) = record(
        "dwarf",
        &dir,
        Path::new("/usr/bin/dd"),
        &["if=/dev/zero", "of=/dev/null", "bs=512", "count=2000000"],
    );
    let in_kernel: Vec<&(String, u64)> = stacks
        .iter()
        .filter(|(stack, _)| stack.contains("entry_SYSCALL_64"))
        .collect();
    let total: u64 = in_kernel.iter().map(|(_, n)| n).sum();
    let whole: u64 = in_kernel
        .iter()
        .filter(|(stack, _)| {
            stack.contains(";__libc_start_main_impl;__libc_start_call_main;")
                && (stack.contains(";__GI___libc_read;entry_SYSCALL_64")
                    || stack.contains(";__GI___libc_write;entry_SYSCALL_64"))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        total > 200,
        "too few samples in system calls: {total}\n{stderr}"
    );
    assert!(
        whole as f64 >= 0.95 * total as f64,
        "{whole} of {total} system-call samples carry the user stack down from libc's start\n{stderr}"
    );
}

#[test]
fn a_table_that_does_not_fit_is_counted_and_its_stacks_end_truncated() {
    // 1 MiB holds python3.11's rows but not libc's as well: libc's frames fall back to frame
    // pointers, which Debian's build does not keep, and the stacks end in [truncated] instead
    // of a garbage caller.
    let dir = temp_dir("unwind-full");
    let script = dir.join("work.py");
    std::fs::write(
        &script,
        "import time\nend = time.time() + 1\nwhile time.time() < end:\n    sum(range(10000))\n",
    )
    .unwrap();
    let (stacks, stderr) = record_with(
        &["--unwind-table-mib", "1"],
        &dir,
        Path::new("/usr/bin/python3.11"),
        &[script.to_str().unwrap()],
    );
    assert!(
        stderr.contains("(the unwind-table memory is full (--unwind-table-mib))"),
        "no mapping counted as not fitting:\n{stderr}"
    );
    // And by name: the largest table (the interpreter's) is placed first, and the libraries
    // that no longer fit beside it are named.
    let refused = stderr
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("no room in the arena, mappings by file: ")
        })
        .unwrap_or_else(|| panic!("no file named as refused room:\n{stderr}"));
    assert!(
        refused.contains("/libc.so.6 (1)") && !refused.contains("python3.11"),
        "files refused room: {refused}"
    );
    let counts = unwinder_counts(&stderr);
    let (walked, without_table) = (counts[0], counts[3]);
    assert!(
        without_table >= walked / 2,
        "{without_table} frames without a table in {walked} walks\n{stderr}"
    );
    let samples = |what: &str| -> u64 {
        stacks
            .iter()
            .filter(|(stack, _)| stack.contains(what))
            .map(|(_, n)| n)
            .sum()
    };
    assert!(
        samples("[truncated]") > 0,
        "no stack ends truncated:\n{stacks:?}"
    );
    // Only the kernel's frame-pointer walks, of samples taken before the process was published,
    // can hold garbage.
    assert!(
        samples("[unknown]") <= counts[2],
        "garbage callers in walks with tables:\n{stacks:?}\n{stderr}"
    );
}

#[test]
fn a_full_table_memory_evicts_idle_and_exited_processes_tables_for_the_busy_ones() {
    // 2 MiB holds python3.11's tables or sqlite3's, not both. python3.11 starts, says so, and
    // then waits on a FIFO, idle, while sqlite3 runs: python's tables make room for sqlite3's
    // (once python has been idle for half a second, however slowly it started on a busy
    // machine). Once sqlite3 has exited, python3.11 wakes and runs: its tables come back in
    // place of sqlite3's. sqlite3 runs about 2 s: the samples it takes before the first
    // side-band read publishes it (77 ms of them once in CI) are walked by frame pointers.
    let dir = temp_dir("unwind-evict");
    let fifo = dir.join("wake");
    let ready = dir.join("ready");
    let script = dir.join("evict.sh");
    std::fs::write(
        &script,
        format!(
            "mkfifo {fifo} {ready}\n\
             python3.11 -c \"\n\
             import time\n\
             open('{ready}', 'w').write('up')\n\
             open('{fifo}').read()\n\
             end = time.time() + 1\n\
             while time.time() < end: sum(range(10000))\n\
             \" &\n\
             read up < {ready}\n\
             sleep 0.5\n\
             sqlite3 :memory: \"create table t(a, b); with recursive c(x) as (select 1 union \
             all select x + 1 from c where x < 1200000) insert into t select x, \
             hex(randomblob(16)) from c; create index i on t(b);\"\n\
             echo go > {fifo}\n\
             wait\n",
            fifo = fifo.display(),
            ready = ready.display()
        ),
    )
    .unwrap();
    let (stacks, stderr) = record_with(
        &["--unwind-table-mib", "2"],
        &dir,
        Path::new("/bin/sh"),
        &[script.to_str().unwrap()],
    );
    let tables = stderr
        .lines()
        .find(|line| line.contains("unwind tables:"))
        .unwrap_or_else(|| panic!("no unwind-table line in --stats:\n{stderr}"));
    let evicted: Vec<u64> = tables
        .split_once("evicted")
        .unwrap()
        .1
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|word| word.parse().ok())
        .collect();
    // evicted N (U no longer mapped, I of idle processes), moved M
    assert!(
        evicted[1] > 0 && evicted[2] > 0 && evicted[0] == evicted[1] + evicted[2],
        "no evictions of both kinds counted:\n{stderr}"
    );
    // python3.11 may meet its evicted tables in a sample or two (counted), or have them back
    // before it first runs: the agent retries as soon as sqlite3's exit frees the room. Either
    // way, its samples after waking reach main below only through tables loaded again.
    // Per process: samples, and those reaching glibc's call of main.
    let from_main = |process: &str, within: &str| -> (u64, u64) {
        let theirs: Vec<&(String, u64)> = stacks
            .iter()
            .filter(|(stack, _)| {
                stack.starts_with(&format!("{process};")) && stack.contains(within)
            })
            .collect();
        let total = theirs.iter().map(|(_, n)| n).sum();
        let whole = theirs
            .iter()
            .filter(|(stack, _)| stack.contains(";__libc_start_call_main;"))
            .map(|(_, n)| n)
            .sum();
        (total, whole)
    };
    let (total, whole) = from_main("sqlite3", ";");
    assert!(total > 200, "too few sqlite3 samples: {total}\n{stderr}");
    assert!(
        whole as f64 >= 0.97 * total as f64,
        "{whole} of {total} sqlite3 samples reach main\n{stderr}"
    );
    // The script's samples: its Python frames stand where the evaluator's were.
    let (total, whole) = from_main("python3.11", ";<module>;");
    assert!(total > 200, "too few python3.11 samples: {total}\n{stderr}");
    assert!(
        whole as f64 >= 0.95 * total as f64,
        "{whole} of {total} python3.11 interpreter samples reach main\n{stderr}"
    );
}

/// The no-frame-pointer workload's "deep" mode as a stream of short processes: each runs 30 ms
/// of `main -> descend x5 -> record_key`, one after another for `seconds`.
fn run_short_processes(binary: &Path, seconds: u64) -> u64 {
    let started = std::time::Instant::now();
    let mut processes = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        let ran = Command::new(binary)
            .args(["30", "deep", "10"])
            .stdout(Stdio::null())
            .status()
            .expect("the workload starts");
        assert!(ran.success(), "the workload failed: {ran}");
        processes += 1;
    }
    processes
}

/// Of the samples in the short workload's own code (leaf `main`, `descend` or `record_key`;
/// stacks root first, user frames only), those whose stack reaches `_start` through the right
/// callers: C start-up, `main`, then only `descend` down to the leaf.
fn short_process_samples_whole(stacks: &[(Vec<String>, u64)]) -> (u64, u64) {
    let program = ["main", "descend", "record_key"];
    let mut total = 0;
    let mut whole = 0;
    for (frames, count) in stacks {
        if !frames
            .last()
            .is_some_and(|leaf| program.contains(&leaf.as_str()))
        {
            continue;
        }
        total += count;
        let Some(main) = frames.iter().position(|frame| frame == "main") else {
            continue;
        };
        let start_up = &frames[..main];
        let (called, leaf) = (&frames[main + 1..], frames.len() - 1);
        let right_callers = start_up.first().is_some_and(|root| root == "_start")
            && start_up[1..].iter().all(|f| f.starts_with("__libc_start"))
            && called.iter().enumerate().all(|(i, frame)| {
                frame == "descend" || (frame == "record_key" && main + 1 + i == leaf)
            });
        if right_callers {
            whole += count;
        }
    }
    (total, whole)
}

/// Asserts that `processes` short processes left at least `least` samples of their own code in
/// `stacks` (seen in `place`), 95% of them whole ([`short_process_samples_whole`]); the samples.
fn assert_short_processes_whole(
    stacks: &[(Vec<String>, u64)],
    least: u64,
    processes: u64,
    place: &str,
    stderr: &str,
) -> u64 {
    let (total, whole) = short_process_samples_whole(stacks);
    eprintln!("{whole} of {total} samples of {processes} short processes whole in {place}");
    assert!(
        total >= least,
        "too few samples of the {processes} short processes in {place}: {total}\n{stderr}"
    );
    assert!(
        whole as f64 >= 0.95 * total as f64,
        "{whole} of {total} samples of {processes} short processes reach _start through main \
         and descend in {place}\n{stderr}"
    );
    total
}

#[test]
fn short_processes_without_frame_pointers_are_unwound_whole_from_their_first_sample() {
    // A process lives 30 ms, far less than the side-band's 100 ms: system-wide, the agent never
    // publishes most of them. The walker finds their mappings in the kernel's own record of the
    // process (Linux 6.1 on) and their file's table by the file, so their stacks are whole from
    // the first sample.
    let dir = temp_dir("unwind-short-processes");
    let binary = build_no_frame_pointers(&dir, "shortnofp", &[]);
    let profile = dir.join("recording.prof");
    let mut recording = Running::spawn(
        Command::new(profiler_bin())
            .args([
                "record",
                "-a",
                "-F",
                "997",
                "--duration",
                "6",
                "--stats",
                "-o",
            ])
            .arg(&profile)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    wait_until_recording(recording.id());
    let processes = run_short_processes(&binary, 4);
    let output = recording.output_at_most(Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "record -a failed:\n{stderr}");
    let folded = profiler(&["report", "-i", profile.to_str().unwrap(), "--folded", "-"]);
    let stacks: Vec<(Vec<String>, u64)> = String::from_utf8_lossy(&folded.stdout)
        .lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            let frames: Vec<String> = stack
                .strip_prefix("shortnofp;")?
                .split(';')
                .filter(|frame| !frame.ends_with("_[k]"))
                .map(String::from)
                .collect();
            Some((frames, count.parse().ok()?))
        })
        .collect();
    let total = assert_short_processes_whole(&stacks, 1000, processes, "the recording", &stderr);
    let before_loaded = stderr
        .lines()
        .find_map(|line| {
            // Tables by file (kernels with a maple tree), or processes published.
            let line = line.trim();
            line.strip_prefix("unwound by tables found by file (process not published): ")
                .or_else(|| line.strip_prefix("unwound before the process was loaded: "))
        })
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no count of walks before the process was loaded:\n{stderr}"));
    assert!(
        before_loaded * 4 >= total,
        "only {before_loaded} walks before the agent loaded the process: most of {total} \
         samples of 30 ms processes are taken before the side-band says they exist\n{stderr}"
    );
}

#[test]
fn the_agents_windows_hold_short_processes_whole_stacks() {
    let dir = temp_dir("unwind-agent-short-processes");
    let binary = build_no_frame_pointers(&dir, "agentshortnofp", &[]);
    let windows = dir.join("windows");
    std::fs::create_dir(&windows).unwrap();
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", "499", "--interval", "1", "--output-dir"])
            .arg(&windows)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let processes = run_short_processes(&binary, 4);
    let stderr = agent.terminate();
    // Root first, as the folded stacks are.
    let stacks: Vec<(Vec<String>, u64)> = window_stacks(&windows)
        .into_iter()
        .filter(|stack| stack.comm == "agentshortnofp")
        .map(|stack| (stack.frames.into_iter().rev().collect(), stack.count))
        .collect();
    assert_short_processes_whole(&stacks, 500, processes, "the agent's windows", &stderr);
}
