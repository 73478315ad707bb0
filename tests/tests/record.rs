//! `profiler record` on the bundled workloads: attribution, call stacks, accounting.

mod common;

use common::{
    cpu_split_measured, profiler_json, self_percent, wait_until_recording, workload, Running,
    CPU_SPLIT_FUNCTIONS,
};

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
    let measured = cpu_split_measured(&stderr);
    for ((name, measured), nominal) in CPU_SPLIT_FUNCTIONS.iter().zip(measured).zip(expected) {
        let function = format!("cpu_split::{name}");
        let sampled = self_percent(event, &function);
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

/// `record -a --json - -F 999`, once it records (a signal before it handles one would kill it).
fn start_system_wide_recording() -> Running {
    let recording = Running::spawn(
        std::process::Command::new(common::profiler_bin())
            .args(["record", "-a", "--json", "-", "-F", "999"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
    );
    wait_until_recording(recording.id());
    recording
}

#[test]
fn ctrl_c_stops_a_system_wide_run_and_drains_everything() {
    common::require_root();
    let mut profiler = start_system_wide_recording();
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

/// `bpf(cmd, attr)` with a zeroed attribute buffer as large as the kernel's `union bpf_attr`
/// gets (it checks that what it does not know is zero).
fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> i64 {
    // SAFETY: `attr` is a valid, writable buffer of the size passed; the pointers the commands
    // below put in it point to buffers that outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            attr.len() as libc::c_uint,
        )
    }
}

/// Loads a socket filter named `name` that counts to 50,000 and returns: run by the kernel's
/// test runner, it keeps the CPU in BPF code with interrupts on, where clock samples land (a
/// tracing program runs with the kernel's BPF recursion guard held, and a perf-event program
/// such as ours does not run then).
fn load_counting_program(name: &str) -> std::os::fd::OwnedFd {
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
    let instruction = |code: u8, dst: u8, off: i16, imm: i32| -> [u8; 8] {
        let mut bytes = [0u8; 8];
        bytes[0] = code;
        bytes[1] = dst;
        bytes[2..4].copy_from_slice(&off.to_ne_bytes());
        bytes[4..8].copy_from_slice(&imm.to_ne_bytes());
        bytes
    };
    let program: Vec<u8> = [
        instruction(0xb7, 0, 0, 0),       // r0 = 0
        instruction(0xb7, 1, 0, 0),       // r1 = 0
        instruction(0x07, 1, 0, 1),       // r1 += 1
        instruction(0xa5, 1, -2, 50_000), // if r1 < 50000 goto -2
        instruction(0x95, 0, 0, 0),       // exit
    ]
    .concat();
    let license = b"GPL\0";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SOCKET_FILTER.to_ne_bytes());
    attr[4..8].copy_from_slice(&((program.len() / 8) as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(program.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..48 + name.len()].copy_from_slice(name.as_bytes());
    let fd = bpf(BPF_PROG_LOAD, &mut attr);
    assert!(
        fd >= 0,
        "loading a counting socket filter: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the kernel just returned this descriptor to this process, which owns it alone.
    unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) }
}

/// Runs the program `fd` `repeat` times through the kernel's test runner.
fn test_run(fd: &std::os::fd::OwnedFd, repeat: u32) {
    use std::os::fd::AsRawFd;
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    let packet = [0u8; 64];
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
    attr[16..24].copy_from_slice(&(packet.as_ptr() as u64).to_ne_bytes());
    attr[32..36].copy_from_slice(&repeat.to_ne_bytes());
    assert_eq!(
        bpf(BPF_PROG_TEST_RUN, &mut attr),
        0,
        "test-running the counting program: {}",
        std::io::Error::last_os_error()
    );
}

/// The BPF programs /proc/kallsyms lists now (`bpf_prog_<tag>_<name>`).
fn bpf_programs_listed() -> std::collections::BTreeSet<String> {
    std::fs::read_to_string("/proc/kallsyms")
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2))
        .filter(|name| name.starts_with("bpf_prog_"))
        .map(String::from)
        .collect()
}

/// A BPF program loaded after a system-wide recording started and unloaded before it ended is
/// named from the side-band's PERF_RECORD_KSYMBOL: /proc/kallsyms, read as the recording ends,
/// no longer lists it, and its samples went to whatever function it listed below them.
#[test]
fn bpf_programs_that_come_and_go_during_a_recording_are_named() {
    common::require_root();
    let mut recording = start_system_wide_recording();
    let program = load_counting_program("come_and_go");
    // The name to expect: what kallsyms lists while the program is loaded.
    let name = bpf_programs_listed()
        .into_iter()
        .find(|listed| listed.ends_with("_come_and_go"))
        .expect("kallsyms lists the loaded program");
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_millis(1500) {
        test_run(&program, 1000);
    }
    drop(program);
    // Gone from kallsyms before the recording ends (the kernel frees a program after a grace
    // period), so that only the side-band can name its samples.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while bpf_programs_listed().contains(&name) {
        assert!(
            std::time::Instant::now() < deadline,
            "{name} still listed 30 s after it was closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    recording.signal(libc::SIGINT);
    let output = recording.output_at_most(std::time::Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let functions = report["events"][0]["functions"].as_array().unwrap();
    let samples_of = |function: &str| {
        functions
            .iter()
            .find(|f| f["function"] == function)
            .map_or(0, |f| f["self_samples"].as_u64().unwrap())
    };
    // 1.5 s of counting at 999 Hz: most of it in the program itself.
    let in_program = samples_of(&name);
    assert!(
        in_program >= 500,
        "{in_program} samples in {name}; the kernel functions: {:?}",
        functions
            .iter()
            .filter(|f| f["module"] == "[kernel.kallsyms]")
            .take(10)
            .map(|f| (&f["function"], &f["self_samples"]))
            .collect::<Vec<_>>()
    );
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
