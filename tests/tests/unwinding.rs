//! Call stacks of code built without frame pointers, unwound from copies of the user stack:
//! perf.data files recorded by the real `perf record --call-graph dwarf` (user registers and
//! stack bytes in every sample) imported through the copy unwinder, checked frame by frame
//! against `perf script`'s own unwinding of the same samples; and live `record --unwind copy`
//! recordings, checked against perf's dwarf recordings of the same programs by function. On a C
//! workload built here with `gcc -O2 -fomit-frame-pointer` and on Debian's own xz, python3 and
//! sqlite3.
//!
//! Needs perf (Debian: linux-perf), gcc, xz-utils, python3, sqlite3, libc6-dbg (names glibc's
//! internal frames) and root; fails with the reason when one is missing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use profiler::import::profile_from_perf_data_file;
use profiler::profile::file::read_profile;
use profiler::profile::{module_basename, Profile, StackSample};

/// Functions a complete user stack ends in: the program's entry and glibc's frames that call
/// `main`, and glibc's thread start.
const ROOTS: [&str; 6] = [
    "main",
    "_start",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "start_thread",
    "clone3",
];

/// The C workload built into `dir` with `-O2 -fomit-frame-pointer -g`.
fn no_frame_pointer_workload(dir: &Path) -> PathBuf {
    common::c_workload::build_no_frame_pointers(dir, "no_frame_pointers", &["-g"])
}

/// Debian's own programs built without frame pointers, each with a command of about a second
/// that runs in `dir`: xz compressing (on one thread) a compressible but not trivial file,
/// python3 encoding and decoding JSON, sqlite3 filling and indexing a table.
fn debian_programs(dir: &Path) -> Vec<(&'static str, Vec<String>)> {
    let input = dir.join("input");
    let text: String = (0..400_000u64)
        .map(|i| format!("{} ", (i * 2_654_435_761) % 100_003))
        .collect();
    std::fs::write(&input, text).unwrap();
    let path = |path: PathBuf| path.to_str().unwrap().to_string();
    let xz = ["xz", "-T1", "-9", "-k", "-f"].map(String::from);
    let python = [
        "/usr/bin/python3",
        "-c",
        "import json\n\
         d = [{'a': i, 'b': str(i) * 5} for i in range(200000)]\n\
         for _ in range(4): json.loads(json.dumps(d))\n\
         sorted(d, key=lambda x: x['b'])",
    ]
    .map(String::from);
    let sql = "create table t(a, b); \
               with recursive c(x) as (select 1 union all select x + 1 from c where x < 300000) \
               insert into t select x, hex(randomblob(16)) from c; \
               create index i on t(b); select count(*) from t where b like '%AB%';";
    vec![
        ("xz", xz.into_iter().chain([path(input)]).collect()),
        ("python3", python.to_vec()),
        (
            "sqlite3",
            vec![
                "sqlite3".to_string(),
                path(dir.join("test.db")),
                sql.to_string(),
            ],
        ),
    ]
}

/// `perf record -e cpu-clock -F 999 --call-graph dwarf,16384 -o DIR/perf.data -- COMMAND`.
fn perf_record_dwarf(dir: &Path, command: &[&str]) -> PathBuf {
    common::require_root();
    let file = dir.join("perf.data");
    let mut args = vec![
        "record",
        "-q",
        "-e",
        "cpu-clock",
        "-F",
        "999",
        "--call-graph",
        // 16 KiB of stack per sample, as `--unwind copy` copies by default: perf's default
        // 8 KiB cuts some of sqlite3's stacks short.
        "dwarf,16384",
        // 4 MiB buffers per CPU: 16 KiB samples fill perf's default 512 KiB and lose records.
        "-m",
        "1024",
        "-o",
        file.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(command);
    common::run_checked("perf", &args);
    file
}

fn import(file: &Path) -> Profile {
    profile_from_perf_data_file(file)
        .unwrap_or_else(|e| panic!("importing {}: {e:#}", file.display()))
}

/// The user frames' function names of a stack, leaf first.
fn user_functions(profile: &Profile, stack: &StackSample) -> Vec<String> {
    stack
        .frames
        .iter()
        .map(|&id| &profile.frames[id as usize])
        .filter(|frame| !frame.kernel)
        .map(|frame| frame.display_name())
        .collect()
}

/// Samples of `profile` and how many of them have a user stack that reaches one of [`ROOTS`].
fn samples_reaching_a_root(profile: &Profile) -> (u64, u64) {
    let total = profile.stacks.iter().map(|stack| stack.count).sum();
    let complete = profile
        .stacks
        .iter()
        .filter(|stack| {
            user_functions(profile, stack)
                .iter()
                .any(|name| ROOTS.contains(&name.as_str()))
        })
        .map(|stack| stack.count)
        .sum();
    (total, complete)
}

fn assert_most_reach_a_root(profile: &Profile, what: &str) {
    let (total, complete) = samples_reaching_a_root(profile);
    assert!(total >= 100, "{what}: only {total} samples");
    assert!(
        complete * 100 >= total * 95,
        "{what}: {complete} of {total} samples reach main, _start or a thread start; losses: \
         {:?}",
        profile.losses.counters
    );
}

/// Samples whose user stack has `chain` as a contiguous run of functions, leaf first, starting
/// at the leaf when `from_leaf`.
fn samples_with_chain(profile: &Profile, chain: &[&str]) -> u64 {
    profile
        .stacks
        .iter()
        .filter(|stack| {
            let names = user_functions(profile, stack);
            names.windows(chain.len()).any(|window| window == chain)
        })
        .map(|stack| stack.count)
        .sum()
}

/// A user frame as `perf script -F ip,dso` prints it: the module's file name and the address's
/// offset in that file; callers one byte before their return address, inside the call
/// instruction, as we look them up too.
type PrintedFrame = (String, u64);

/// The user stacks perf itself unwound from the file, one entry per distinct stack with its
/// samples.
fn perf_script_user_stacks(file: &Path) -> BTreeMap<Vec<PrintedFrame>, u64> {
    let output = common::run_checked(
        "perf",
        &[
            "script",
            "-i",
            file.to_str().unwrap(),
            "--no-inline",
            // perf's default keeps 127 frames; ours keeps up to the unwinder's limit.
            "--max-stack",
            "1024",
            "-F",
            "ip,dso",
        ],
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let mut stacks = BTreeMap::new();
    // Samples are separated by blank lines; each frame is "ADDRESS (DSO)".
    for sample in text.split("\n\n") {
        let frames: Vec<PrintedFrame> = sample
            .lines()
            .filter_map(|line| {
                let (address, dso) = line.trim().split_once(' ')?;
                let dso = dso.trim_start_matches('(').trim_end_matches(')');
                let address = u64::from_str_radix(address, 16).ok()?;
                Some((module_basename(dso).to_string(), address))
            })
            .filter(|(dso, _)| !dso.starts_with("[kernel"))
            // perf ends a walk that ran out of copied stack with an "[unknown]" frame at
            // address -1; ours ends there, counted as cut short.
            .filter(|frame| *frame != ("[unknown]".to_string(), u64::MAX))
            .collect();
        if !frames.is_empty() {
            *stacks.entry(frames).or_default() += 1;
        }
    }
    stacks
}

/// Our user stacks of the imported file, printed as `perf script` prints frames.
fn our_user_stacks(profile: &Profile) -> BTreeMap<Vec<PrintedFrame>, u64> {
    let mut stacks = BTreeMap::new();
    for stack in &profile.stacks {
        let frames: Vec<PrintedFrame> = stack
            .frames
            .iter()
            .map(|&id| &profile.frames[id as usize])
            .filter(|frame| !frame.kernel)
            .map(|frame| {
                (
                    module_basename(&frame.module).to_string(),
                    frame.module_offset,
                )
            })
            .collect();
        if !frames.is_empty() {
            *stacks.entry(frames).or_default() += stack.count;
        }
    }
    stacks
}

/// Asserts that at least 98% of perf's samples have exactly the user stack we unwound.
fn assert_matches_perf_script(file: &Path, profile: &Profile) {
    let theirs = perf_script_user_stacks(file);
    let ours = our_user_stacks(profile);
    let total: u64 = theirs.values().sum();
    let same: u64 = theirs
        .iter()
        .map(|(stack, count)| (*count).min(ours.get(stack).copied().unwrap_or(0)))
        .sum();
    let first_difference = theirs
        .iter()
        .find(|(stack, count)| ours.get(*stack).copied().unwrap_or(0) < **count);
    assert!(
        total >= 100 && same * 100 >= total * 98,
        "{same} of {total} samples have the user stack perf unwound; e.g. perf's {:?}",
        first_difference
    );
}

#[test]
fn dwarf_recording_of_code_without_frame_pointers_is_unwound_to_main_like_perf() {
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = no_frame_pointer_workload(dir.path());
    let file = perf_record_dwarf(dir.path(), &[binary.to_str().unwrap(), "1500"]);
    let profile = import(&file);

    assert_most_reach_a_root(&profile, "no_frame_pointers");
    let (total, _) = samples_reaching_a_root(&profile);
    // The comparison callback's leaf, called from glibc's qsort, back to main.
    let sorting = samples_with_chain(&profile, &["record_key", "compare_records"]);
    let sorted_from_main = profile
        .stacks
        .iter()
        .filter(|stack| {
            let names = user_functions(&profile, stack);
            let at = |name: &str| names.iter().position(|n| n == name);
            names.first().is_some_and(|leaf| leaf == "record_key")
                && at("compare_records") == Some(1)
                && at("__GI___qsort_r") < at("sort_records")
                && at("sort_records").is_some_and(|sort| at("main") == Some(sort + 1))
        })
        .map(|stack| stack.count)
        .sum::<u64>();
    assert!(
        sorting * 10 >= total * 2,
        "record_key <- compare_records in {sorting} of {total} samples"
    );
    assert_eq!(
        sorted_from_main, sorting,
        "every record_key <- compare_records stack goes on through qsort to sort_records <- main"
    );
    // The second thread, from its start routine.
    let copying = samples_with_chain(&profile, &["copy_blocks", "copier_main", "start_thread"]);
    assert!(
        copying * 10 >= total * 2,
        "copy_blocks <- copier_main <- start_thread in {copying} of {total} samples"
    );
    common::assert_few_cut_short(&profile, &[]);
    assert_matches_perf_script(&file, &profile);
}

#[test]
fn dwarf_recordings_of_debians_xz_python3_and_sqlite3_are_unwound_to_main_like_perf() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (program, command) in debian_programs(dir.path()) {
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let file = perf_record_dwarf(dir.path(), &command);
        let profile = import(&file);
        assert_most_reach_a_root(&profile, program);
        let (total, _) = samples_reaching_a_root(&profile);
        let from_main = samples_with_chain(
            &profile,
            &["__libc_start_call_main", "__libc_start_main_impl"],
        );
        assert!(
            from_main * 100 >= total * 95,
            "{program}: glibc's call of main in {from_main} of {total} samples"
        );
        assert_matches_perf_script(&file, &profile);
    }
}

/// `profiler record --unwind copy -F 999 ARGS -o DIR/live.prof -- COMMAND`, read back.
fn record_copy(dir: &Path, args: &[&str], command: &[&str]) -> Profile {
    record_live(dir, "copy", args, command)
}

/// `profiler record --unwind UNWIND -F 999 ARGS -o DIR/live.prof -- COMMAND`, read back.
fn record_live(dir: &Path, unwind: &str, args: &[&str], command: &[&str]) -> Profile {
    let file = dir.join("live.prof");
    let mut options = vec!["--unwind", unwind, "-F", "999"];
    options.extend_from_slice(args);
    common::record_to(&file, &options, command);
    read_profile(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
}

/// Per function, the share of samples whose user stack passes through it.
fn inclusive_shares(profile: &Profile, functions: &[&str]) -> Vec<f64> {
    let total: u64 = profile.stacks.iter().map(|stack| stack.count).sum();
    functions
        .iter()
        .map(|function| {
            let through: u64 = profile
                .stacks
                .iter()
                .filter(|stack| user_functions(profile, stack).iter().any(|n| n == function))
                .map(|stack| stack.count)
                .sum();
            through as f64 / total as f64
        })
        .collect()
}

#[test]
fn unwind_copy_recording_of_code_without_frame_pointers_matches_perf_dwarf_by_function() {
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = no_frame_pointer_workload(dir.path());
    let command = [binary.to_str().unwrap(), "1500"];
    let live = record_copy(dir.path(), &[], &command);

    assert_most_reach_a_root(&live, "no_frame_pointers, --unwind copy");
    common::assert_few_cut_short(&live, &[]);
    let (total, _) = samples_reaching_a_root(&live);
    let chain = [
        "record_key",
        "compare_records",
        "msort_with_tmp",
        "__GI___qsort_r",
        "sort_records",
        "main",
    ];
    let through_qsort: u64 = live
        .stacks
        .iter()
        .filter(|stack| {
            let names = user_functions(&live, stack);
            let mut rest = names.iter();
            // In order, with msort_with_tmp's recursion between.
            chain.iter().all(|want| rest.any(|name| name == want))
        })
        .map(|stack| stack.count)
        .sum();
    let leaf_in_callback = samples_with_chain(&live, &["record_key", "compare_records"]);
    assert!(
        leaf_in_callback * 10 >= total * 2,
        "{leaf_in_callback} of {total}"
    );
    assert_eq!(
        through_qsort, leaf_in_callback,
        "every record_key <- compare_records stack goes on through qsort to main"
    );
    let copying = samples_with_chain(&live, &["copy_blocks", "copier_main", "start_thread"]);
    assert!(copying * 10 >= total * 2, "{copying} of {total}");

    // perf's own dwarf unwinding of the same program: the same functions, as often.
    let perf = import(&perf_record_dwarf(dir.path(), &command));
    let functions = [
        "record_key",
        "compare_records",
        "sort_records",
        "main",
        "copy_blocks",
        "copier_main",
        "start_thread",
    ];
    let ours = inclusive_shares(&live, &functions);
    let theirs = inclusive_shares(&perf, &functions);
    for ((function, ours), theirs) in functions.iter().zip(ours).zip(theirs) {
        assert!(
            (ours - theirs).abs() < 0.1,
            "{function}: in {:.1}% of our stacks, {:.1}% of perf's",
            ours * 100.0,
            theirs * 100.0
        );
    }
}

/// Samples per distinct user call chain, as function names, leaf first, a recursion's levels
/// as one (how deep qsort's merge sort is at a sample is chance, not unwinding).
fn function_chains(profile: &Profile) -> BTreeMap<Vec<String>, u64> {
    let mut chains = BTreeMap::new();
    for stack in &profile.stacks {
        let mut names = user_functions(profile, stack);
        names.dedup();
        if !names.is_empty() {
            *chains.entry(names).or_default() += stack.count;
        }
    }
    chains
}

/// The share of `ours`'s samples whose whole function chain `theirs` also has.
fn share_in_chains_of(
    ours: &BTreeMap<Vec<String>, u64>,
    theirs: &BTreeMap<Vec<String>, u64>,
) -> f64 {
    let total: u64 = ours.values().sum();
    let shared: u64 = ours
        .iter()
        .filter(|(chain, _)| theirs.contains_key(*chain))
        .map(|(_, n)| n)
        .sum();
    shared as f64 / total.max(1) as f64
}

#[test]
fn unwind_dwarf_recording_has_the_call_chains_perf_dwarf_finds_function_by_function() {
    // Two runs of the program (ours, perf's) take different samples, but the code paths they
    // sample are the same few: at least 98% of each tool's samples have a whole user call chain,
    // function by function from the leaf to the root, that the other tool also found.
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = no_frame_pointer_workload(dir.path());
    let command = [binary.to_str().unwrap(), "2000"];
    let ours = function_chains(&record_live(dir.path(), "dwarf", &[], &command));
    let perf = function_chains(&import(&perf_record_dwarf(dir.path(), &command)));
    let total: u64 = ours.values().sum();
    assert!(total >= 500, "{total} samples");
    let (ours_in_perf, perf_in_ours) = (
        share_in_chains_of(&ours, &perf),
        share_in_chains_of(&perf, &ours),
    );
    let first_unmatched = ours
        .iter()
        .filter(|(chain, _)| !perf.contains_key(*chain))
        .max_by_key(|(_, n)| **n);
    assert!(
        ours_in_perf >= 0.98 && perf_in_ours >= 0.98,
        "{:.1}% of our samples have a chain perf found, {:.1}% of perf's one we found; our most \
         frequent chain perf lacks: {first_unmatched:?}",
        ours_in_perf * 100.0,
        perf_in_ours * 100.0
    );
}

#[test]
fn unwind_copy_recordings_of_debians_xz_python3_and_sqlite3_reach_main() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (program, command) in debian_programs(dir.path()) {
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let profile = record_copy(dir.path(), &[], &command);
        assert_most_reach_a_root(&profile, &format!("{program}, --unwind copy"));
    }
}

#[test]
fn a_sixty_frame_rust_stack_is_unwound_whole_and_stray_or_out_of_range_copy_sizes_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let deep = common::workload("deep_stack");
    let profile = record_copy(
        dir.path(),
        &["--stack-copy-kib", "8"],
        &[deep.to_str().unwrap(), "15000"],
    );
    assert_most_reach_a_root(&profile, "deep_stack, --unwind copy --stack-copy-kib 8");
    let sixty_deep =
        samples_with_chain(&profile, &["deep_stack::frame_60", "deep_stack::frame_59"]);
    let (total, _) = samples_reaching_a_root(&profile);
    assert!(sixty_deep * 100 >= total * 95, "{sixty_deep} of {total}");
    common::assert_few_cut_short(&profile, &[]);
    let output = Command::new(common::profiler_bin())
        .args(["record", "--stack-copy-kib", "8", "--", "true"])
        .output()
        .expect("the profiler runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("add --unwind copy"),
        "--stack-copy-kib without --unwind copy: {stderr}"
    );
    for size in ["0", "33"] {
        let output = Command::new(common::profiler_bin())
            .args([
                "record",
                "--unwind",
                "copy",
                "--stack-copy-kib",
                size,
                "--",
                "true",
            ])
            .output()
            .expect("the profiler runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success()
                && stderr.contains("--stack-copy-kib")
                && stderr.contains("1..=32"),
            "--stack-copy-kib {size}: {stderr}"
        );
    }
}

#[test]
fn a_stack_deeper_than_the_copy_is_cut_short_and_counted_and_a_larger_copy_reaches_main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = no_frame_pointer_workload(dir.path());
    // About 25 KiB of stack: more than the default 16 KiB copy, less than 32.
    let command = [binary.to_str().unwrap(), "1500", "deep"];
    let short = record_copy(dir.path(), &[], &command);
    let total: u64 = short.stacks.iter().map(|stack| stack.count).sum();
    let cut = short
        .losses
        .counters
        .get("user stacks cut short: walk reached the end of the stack copy")
        .copied()
        .unwrap_or(0);
    // A sample of the start-up, before the recursion, may be whole: none of the deep ones.
    let (_, complete) = samples_reaching_a_root(&short);
    assert!(
        total >= 100 && cut * 100 >= total * 95 && complete * 100 <= total,
        "{cut} of {total} stacks counted as cut short, {complete} complete: {:?}",
        short.losses.counters
    );
    // What was walked is kept: the leaf and the levels the copy held. (The leaf is record_key,
    // or, in 5-7% of samples, descend's own loop or the clock it reads: all walk through
    // descend's levels.)
    let partial = samples_with_chain(&short, &["descend", "descend"]);
    assert!(partial * 100 >= total * 95, "{partial} of {total}");
    let in_record_key = samples_with_chain(&short, &["record_key", "descend", "descend"]);
    assert!(
        in_record_key * 100 >= total * 80,
        "{in_record_key} of {total}"
    );

    let whole = record_copy(dir.path(), &["--stack-copy-kib", "32"], &command);
    assert_most_reach_a_root(&whole, "25 KiB deep, --stack-copy-kib 32");
    common::assert_few_cut_short(&whole, &[]);
}

#[test]
fn samples_taken_in_the_kernel_carry_the_tasks_user_stack() {
    let dir = tempfile::tempdir().expect("temp dir");
    // dd spends its time in read(2) of /dev/zero: the samples interrupt the kernel, and the
    // user registers are those the task entered it with.
    let profile = record_copy(
        dir.path(),
        &[],
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=4M", "count=30000"],
    );
    let in_kernel: u64 = profile
        .stacks
        .iter()
        .filter(|stack| profile.frames[stack.frames[0] as usize].kernel)
        .map(|stack| stack.count)
        .sum();
    let in_kernel_from_main: u64 = profile
        .stacks
        .iter()
        .filter(|stack| {
            profile.frames[stack.frames[0] as usize].kernel
                && user_functions(&profile, stack)
                    .iter()
                    .any(|name| name == "__libc_start_call_main")
        })
        .map(|stack| stack.count)
        .sum();
    let (total, _) = samples_reaching_a_root(&profile);
    assert!(
        in_kernel * 10 >= total * 8,
        "{in_kernel} of {total} in the kernel"
    );
    assert!(
        in_kernel_from_main * 100 >= in_kernel * 95,
        "{in_kernel_from_main} of {in_kernel} kernel samples have a user stack from main"
    );
    common::assert_few_cut_short(&profile, &[]);
}

#[test]
fn samples_in_the_vdso_are_unwound_with_its_own_unwind_tables() {
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = no_frame_pointer_workload(dir.path());
    // By the stack copies in userspace, and by the walker in the kernel, which finds the vDSO
    // (a mapping of no file) and its table itself, every process's first sample included.
    for unwind in ["copy", "dwarf"] {
        let profile = record_live(
            dir.path(),
            unwind,
            &[],
            &[binary.to_str().unwrap(), "1500", "clock"],
        );
        assert_vdso_samples_reach_main(&profile, unwind);
    }
}

/// Most of `profile`'s samples are in the vDSO's clock_gettime, and they reach main through
/// the C library's.
fn assert_vdso_samples_reach_main(profile: &Profile, unwind: &str) {
    let in_vdso: u64 = profile
        .stacks
        .iter()
        .filter(|stack| {
            user_functions(profile, stack)
                .first()
                .is_some_and(|leaf| leaf == "__vdso_clock_gettime")
        })
        .map(|stack| stack.count)
        .sum();
    let in_vdso_from_main = samples_with_chain(
        profile,
        &[
            "__vdso_clock_gettime",
            "__GI___clock_gettime",
            "now",
            "main",
        ],
    ) + samples_with_chain(
        profile,
        &["__vdso_clock_gettime", "__GI___clock_gettime", "main"],
    );
    let (total, _) = samples_reaching_a_root(profile);
    assert!(
        in_vdso * 2 >= total,
        "--unwind {unwind}: {in_vdso} of {total} samples in the vDSO"
    );
    assert!(
        in_vdso_from_main * 100 >= in_vdso * 99,
        "--unwind {unwind}: {in_vdso_from_main} of {in_vdso} vDSO samples reach main through \
         clock_gettime"
    );
    assert_most_reach_a_root(profile, &format!("clock, --unwind {unwind}"));
}

/// `profiler record --unwind check -F 999 OPTIONS -o DIR/check.prof -- COMMAND`, read.
fn unwinders_compared(dir: &Path, options: &[&str], command: &[&str]) -> Comparison {
    let mut all = vec!["--unwind", "check", "-F", "999"];
    all.extend_from_slice(options);
    let stderr = common::record_to(&dir.join("check.prof"), &all, command);
    let line = stderr
        .lines()
        .find(|line| line.starts_with("Unwinders compared (--unwind check): "))
        .unwrap_or_else(|| panic!("no comparison in:\n{stderr}"));
    let number_before = |words: &str| -> u64 {
        let before = &line[..line.find(words).unwrap_or_else(|| panic!("{line}"))];
        let number = before.trim_end().rsplit([' ', '(']).next().unwrap();
        number.parse().unwrap_or_else(|_| panic!("{line}"))
    };
    let compared = number_before("samples walked in the kernel");
    let agreeing = number_before("agree frame by frame");
    let copy_too_small = number_before("differing samples' copies held too little");
    let lines = stderr
        .lines()
        .skip_while(|text| !text.starts_with("Unwinders compared"))
        .take_while(|text| text.starts_with("Unwinders") || text.starts_with("  "))
        .collect::<Vec<_>>()
        .join("\n");
    Comparison {
        compared,
        agreeing,
        copy_too_small,
        lines,
    }
}

/// What `--unwind check` printed: samples compared, those that agreed, the differences whose
/// copy held too little of the stack, and the comparison's lines.
struct Comparison {
    compared: u64,
    agreeing: u64,
    copy_too_small: u64,
    lines: String,
}

#[test]
fn the_in_kernel_and_the_copy_unwinder_agree_frame_by_frame_on_the_same_samples() {
    // `--unwind check`: the table walk in the kernel counts each sample, and the same sample's
    // stack copy, unwound in the agent by framehop, is compared with it frame by frame. The C
    // workload built without frame pointers: leaf functions, calls through qsort and memcpy;
    // two threads interrupted by a signal handler (a signal frame on the stack); a library
    // loaded with dlopen mid-run (its first samples may come before its table is loaded); and
    // the vDSO (the kernel's walker uses the vDSO's own table). Then Rust 60 frames deep, and
    // Debian's own programs, where a process's first samples may come before the agent has
    // published its libraries.
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = no_frame_pointer_workload(dir.path());
    let binary = binary.to_str().unwrap();
    let library = common::c_workload::build_dlopened_library(dir.path());
    let deep = common::workload("deep_stack");
    let mut runs: Vec<(String, Vec<String>, f64)> = [
        vec![binary, "1500"],
        vec![binary, "1500", "mix"],
        vec![binary, "2000", "dlopen", library.to_str().unwrap()],
        vec![binary, "1500", "clock"],
        vec![deep.to_str().unwrap(), "15000"],
    ]
    .into_iter()
    .map(|command| {
        let words: Vec<String> = command.iter().map(|word| word.to_string()).collect();
        (command[1..].join(" "), words, 0.99)
    })
    .collect();
    for (program, command) in debian_programs(dir.path()) {
        runs.push((program.to_string(), command, 0.97));
    }
    // The agent exports windows and prints no end-of-run summary: it refuses the check.
    let output = Command::new(common::profiler_bin())
        .args(["agent", "--unwind", "check", "--output-dir"])
        .arg(dir.path().join("windows"))
        .output()
        .expect("the profiler runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("use it with `record`"),
        "agent --unwind check: {stderr}"
    );
    for (what, command, least) in runs {
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let Comparison {
            compared,
            agreeing,
            lines,
            ..
        } = unwinders_compared(dir.path(), &[], &command);
        eprintln!("{what}: {}", lines.lines().next().unwrap_or_default());
        assert!(compared >= 200, "{what}: {lines}");
        assert!(
            agreeing as f64 >= least * compared as f64,
            "{what}: fewer than {:.0}% agree:\n{lines}",
            least * 100.0
        );
    }
    // A copy smaller than the stack (8 KiB of the workload's 25 KiB deep recursion): the copy's
    // walks stop short, and the comparison says why, while the kernel's walks are whole.
    let small = unwinders_compared(
        dir.path(),
        &["--stack-copy-kib", "8"],
        &[binary, "1500", "deep"],
    );
    assert!(
        small.compared >= 200 && small.copy_too_small * 10 >= small.compared * 9,
        "{}",
        small.lines
    );
}

#[test]
fn a_signal_handlers_samples_are_unwound_through_the_signal_frame_to_main() {
    // The workload's handler runs on a SIGPROF timer on top of whatever it interrupted: a
    // stack through it reaches main or the thread start only through the signal frame the
    // kernel pushed. The copy unwinder (framehop cannot read the frame's call-frame
    // information) recognises the C library's signal-return trampoline; the kernel's walker
    // uses the rows compiled from that information.
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = no_frame_pointer_workload(dir.path());
    for unwind in ["copy", "dwarf"] {
        let profile = record_live(
            dir.path(),
            unwind,
            &[],
            &[binary.to_str().unwrap(), "3000", "mix"],
        );
        let in_handler: Vec<&StackSample> = profile
            .stacks
            .iter()
            .filter(|stack| {
                user_functions(&profile, stack)
                    .iter()
                    .any(|f| f == "on_alarm")
            })
            .collect();
        let total: u64 = in_handler.iter().map(|stack| stack.count).sum();
        let (through, short): (Vec<&StackSample>, Vec<&StackSample>) =
            in_handler.iter().partition(|stack| {
                let names = user_functions(&profile, stack);
                let handler = names.iter().position(|f| f == "on_alarm").unwrap();
                names[handler..].iter().any(|f| f == "work")
                    && names.iter().any(|name| ROOTS.contains(&name.as_str()))
            });
        let through: u64 = through.iter().map(|stack| stack.count).sum();
        eprintln!("--unwind {unwind}: {through} of {total} samples in the handler");
        for stack in short {
            eprintln!(
                "  {} x {}",
                stack.count,
                user_functions(&profile, stack).join(" <- ")
            );
        }
        assert!(
            total >= 10,
            "--unwind {unwind}: {total} samples in the handler"
        );
        // A rare sample lands where the interrupted code has no row (stats count those): one,
        // or 3% of many.
        assert!(
            total - through <= (total * 3 / 100).max(1),
            "--unwind {unwind}: {through} of {total} samples in the handler reach work and a root"
        );
    }
}

#[test]
fn walks_the_kernel_cut_short_are_losses_in_every_report() {
    // 200 frames: every walk stops at the walker's 126 and is cut short. `--stats` counts the
    // walker's ends; the sample accounting (text, JSON, the profile) must count the same walks,
    // never say "no losses" beside them.
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = no_frame_pointer_workload(dir.path());
    let file = dir.path().join("deep.prof");
    let output = Command::new(common::profiler_bin())
        .args(["record", "--unwind", "dwarf", "--stats", "-F", "999", "-o"])
        .arg(&file)
        .args(["--", binary.to_str().unwrap(), "1500", "deep", "200"])
        .output()
        .expect("the profiler runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // `--stats` names each walker loss as the accounting does: "walker: N NAME".
    let walker = |name: &str| -> u64 {
        stderr
            .lines()
            .find_map(|line| line.trim().strip_prefix("walker: ")?.strip_suffix(name))
            .unwrap_or_else(|| panic!("no walker count of {name:?} in --stats:\n{stderr}"))
            .trim()
            .parse()
            .unwrap()
    };
    let names = [
        "user stacks cut short: return address outside executable mappings",
        "user stacks cut short: unwind rules led nowhere",
        "user stacks cut short: deeper than the unwinder walks",
        "user stacks by frame pointers only: the process's mappings were not loaded yet",
    ];
    let counts: Vec<u64> = names.iter().map(|name| walker(name)).collect();
    let too_deep = counts[2];
    assert!(too_deep >= 500, "{too_deep} walks too deep:\n{stderr}");
    assert!(!stderr.contains("no losses"), "{stderr}");
    let profile = read_profile(&file).expect("the profile reads");
    let loss = |name: &str| profile.losses.counters.get(name).copied().unwrap_or(0);
    let losses: Vec<u64> = names.iter().map(|name| loss(name)).collect();
    assert_eq!(losses, counts, "{stderr}");
}
