//! A system-wide profiler runs as root next to other users' processes: these tests play such a
//! user (a second, unprivileged account, created if missing) and check that what they plant
//! cannot make root's profiler block, grow without bound, or leak what the kernel hides.

mod common;

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use common::{
    c_workload::gcc, profiler, profiler_bin, read_pprof, report_json, system_user, temp_dir,
    workload,
};
use serde_json::Value;

/// The other user of the machine.
const UNTRUSTED: &str = "profiler-untrusted";

/// (uid, gid) of [`UNTRUSTED`].
fn untrusted_user() -> (u32, u32) {
    system_user(UNTRUSTED)
}

/// `program args` as the untrusted user, with no supplementary groups and no capabilities.
fn as_untrusted(program: impl AsRef<Path>, args: &[&str]) -> Command {
    let (uid, gid) = untrusted_user();
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--clear-groups", "--inh-caps=-all", "--"])
        .arg(program.as_ref())
        .args(args);
    command
}

fn run_untrusted(program: impl AsRef<Path>, args: &[&str]) -> Output {
    let output = as_untrusted(program, args).output().expect("setpriv runs");
    assert!(
        output.status.success(),
        "{args:?} as {UNTRUSTED} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A directory the untrusted user owns, in a directory only root writes.
fn untrusted_dir(name: &str) -> PathBuf {
    let (uid, gid) = untrusted_user();
    let root = temp_dir(name);
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    let dir = root.join("home");
    fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    dir
}

/// How a watched profiler run ended.
struct Watched {
    output: Output,
    /// Peak resident memory, from the kernel's accounting of the exited process.
    max_rss_bytes: u64,
    elapsed: Duration,
}

/// Waits for `child`, killing it (and failing) once it holds more than `max_rss_bytes` or runs
/// past `deadline`: a profiler that grows without bound must not take the machine with it.
fn watch(mut child: Child, max_rss_bytes: u64, deadline: Duration) -> Watched {
    let start = Instant::now();
    let pid = child.id() as libc::pid_t;
    // Read while it runs: a pipe left unread until the end holds 64 KiB, and a profiler that
    // writes more (a warning for each of the thousands of files another test maps) blocks in
    // write(2) and never ends.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                pipe.read_to_end(&mut bytes).unwrap();
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let status_path = format!("/proc/{pid}/status");
    loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 writes it and the status through valid
        // pointers, for our own child only.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let waited = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(waited >= 0, "wait4: {}", std::io::Error::last_os_error());
        if waited == pid {
            use std::os::unix::process::ExitStatusExt;
            return Watched {
                output: Output {
                    status: std::process::ExitStatus::from_raw(status),
                    stdout: stdout.join().unwrap(),
                    stderr: stderr.join().unwrap(),
                },
                max_rss_bytes: usage.ru_maxrss as u64 * 1024,
                elapsed: start.elapsed(),
            };
        }
        let rss_kib: u64 = fs::read_to_string(&status_path)
            .ok()
            .and_then(|text| {
                let line = text.lines().find(|l| l.starts_with("VmHWM:"))?.to_owned();
                line.split_whitespace().nth(1)?.parse().ok()
            })
            .unwrap_or(0);
        let over_memory = rss_kib * 1024 > max_rss_bytes;
        if over_memory || start.elapsed() > deadline {
            // Where each thread waits, for a run that hangs: read before the kill.
            let threads: String = fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|task| {
                    let at =
                        |file: &str| fs::read_to_string(task.path().join(file)).unwrap_or_default();
                    format!(
                        "{} {}: {}\n{}",
                        at("comm").trim(),
                        at("wchan"),
                        at("stat"),
                        at("stack")
                    )
                })
                .collect();
            eprintln!("threads of the profiler at the deadline:\n{threads}");
            let _ = child.kill();
            let _ = child.wait();
            let stderr = stderr.join().unwrap_or_default();
            eprintln!(
                "its standard error ended:\n{}",
                String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(4096)..])
            );
            panic!(
                "the profiler was killed after {:?} holding {} MiB (bound {} MiB, deadline {:?})",
                start.elapsed(),
                rss_kib >> 10,
                max_rss_bytes >> 20,
                deadline
            );
        }
        sleep(Duration::from_millis(20));
    }
}

/// A memory cgroup for a profiler under test: the kernel, not the test's polling, bounds what it
/// may hold, as the shipped unit's `MemoryMax=` does. cgroup v1's memory controller at
/// /sys/fs/cgroup/memory, else v2 at /sys/fs/cgroup/unified (or /sys/fs/cgroup). Removed when
/// dropped.
struct MemoryCap {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCap {
    fn new(name: &str, bytes: u64) -> MemoryCap {
        let leaf = format!("profiler-test-{name}-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(leaf), false)
        } else {
            let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
                .into_iter()
                .map(Path::new)
                .find(|root| {
                    fs::read_to_string(root.join("cgroup.subtree_control"))
                        .is_ok_and(|controllers| controllers.contains("memory"))
                })
                .expect("a memory cgroup controller (v1 or v2) to cap the profiler with");
            (root.join(leaf), true)
        };
        fs::create_dir_all(&dir).unwrap();
        let limit = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        fs::write(dir.join(limit), bytes.to_string()).unwrap();
        MemoryCap { dir, v2 }
    }

    /// `program args` in the cgroup from its first instruction (a shell joins it, then execs),
    /// with `limits` (`prlimit` options, such as `--nofile=1024:4096`) set before it starts.
    fn command(&self, limits: &[&str], program: impl AsRef<Path>, args: &[&str]) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec prlimit \"$@\"",
                self.dir.display()
            ))
            .arg("sh")
            .args(limits)
            .arg("--")
            .arg(program.as_ref())
            .args(args);
        command
    }

    /// Times the kernel killed a process of the cgroup for memory.
    fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill ")
        } else {
            ("memory.oom_control", "oom_kill ")
        };
        fs::read_to_string(self.dir.join(file))
            .unwrap()
            .lines()
            .find_map(|line| line.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Peak memory charged to the cgroup.
    fn peak_bytes(&self) -> u64 {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCap {
    fn drop(&mut self) {
        // Its processes have exited; the kernel may take a moment to let the group go.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            sleep(Duration::from_millis(100));
        }
    }
}

/// Peak memory of `record -a` here is about 150 MiB; reading a planted device or sparse file
/// whole would pass this at once.
const RECORD_MEMORY_BOUND: u64 = 512 << 20;

/// What the untrusted user puts where their program was, once it has exited.
#[derive(Clone, Copy, Debug)]
enum Planted {
    LinkToDevZero,
    Fifo,
}

/// Root records the whole system while the untrusted user runs a program of theirs, lets it
/// exit, and replaces it with `planted`. The recording ends on time, within its memory bound,
/// and has the program's code, read through the descriptor opened while it lived.
fn replaced_module_is_not_read_by_path(planted: Planted) {
    let home = untrusted_dir(&format!("replaced-{planted:?}"));
    let program = home.join("cpu_split");
    run_untrusted(
        "cp",
        &[
            workload("cpu_split").to_str().unwrap(),
            program.to_str().unwrap(),
        ],
    );
    let profile = home.parent().unwrap().join("system.prof");
    let recording = Command::new(profiler_bin())
        .args(["record", "-a", "--duration", "5", "-o"])
        .arg(&profile)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let the recording start, then run the program to its end (about half a second).
    sleep(Duration::from_millis(1500));
    run_untrusted(&program, &["1500"]);
    let program = program.to_str().unwrap();
    match planted {
        Planted::LinkToDevZero => run_untrusted(
            "sh",
            &["-c", &format!("rm {program} && ln -s /dev/zero {program}")],
        ),
        Planted::Fifo => run_untrusted("sh", &["-c", &format!("rm {program} && mkfifo {program}")]),
    };
    let watched = watch(recording, RECORD_MEMORY_BOUND, Duration::from_secs(90));
    assert!(
        watched.output.status.success(),
        "record failed: {}",
        String::from_utf8_lossy(&watched.output.stderr)
    );
    assert!(watched.max_rss_bytes < RECORD_MEMORY_BOUND);
    eprintln!(
        "record -a with a {planted:?} planted: {:?}, {} MiB",
        watched.elapsed,
        watched.max_rss_bytes >> 20
    );

    // The program's hottest function was symbolized and disassembled from the file it ran.
    let details = report_json(
        &profile,
        &[
            "--only-module",
            program,
            "--function",
            "cpu_split::heavy_work",
        ],
    );
    let function = &details["events"][0]["function_details"];
    assert_eq!(function["code"], "disassembled", "{function:#}");
    assert!(function["samples"].as_u64().unwrap() > 0, "{function:#}");
    fs::remove_dir_all(home.parent().unwrap()).ok();
}

#[test]
fn program_replaced_by_a_link_to_dev_zero_is_not_read() {
    replaced_module_is_not_read_by_path(Planted::LinkToDevZero);
}

#[test]
fn program_replaced_by_a_fifo_does_not_block_the_recording() {
    replaced_module_is_not_read_by_path(Planted::Fifo);
}

/// Runs the profiler as root with `args` in a memory cgroup of `max_bytes` and under [`watch`],
/// expecting it to fail, never killed for memory; its stderr. The cgroup, not the exited
/// process's `ru_maxrss`, bounds it: a child spawned with vfork inherits the test process's peak there, and the tests running
/// beside this one may have taken more than a small bound.
fn failing_root_run(args: &[&str], max_bytes: u64, deadline: Duration) -> String {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let cap = MemoryCap::new(&format!("failing-{run}"), max_bytes);
    let child = cap
        .command(&[], profiler_bin(), args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The cgroup holds it to the bound; the watch only ends a run past its deadline.
    let watched = watch(child, u64::MAX, deadline);
    assert!(!watched.output.status.success(), "{args:?} succeeded");
    // Never killed for memory: the profiler refused what it could not hold. (The peak may reach
    // the bound where the kernel charges a refused map's allocation to the cgroup.)
    assert_eq!(
        cap.oom_kills(),
        0,
        "the kernel OOM-killed the profiler: {args:?}"
    );
    eprintln!(
        "peak {} MiB of {} MiB",
        cap.peak_bytes() >> 20,
        max_bytes >> 20
    );
    String::from_utf8(watched.output.stderr).unwrap()
}

/// A profile file whose payload is 128 KiB of zstd RLE blocks that inflate to 4 GiB of zeros,
/// its header announcing as much, with a valid checksum.
fn profile_announcing_four_gigabytes() -> Vec<u8> {
    const BLOCK: u64 = 128 << 10;
    let decoded: u64 = 4 << 30;
    let mut payload = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 7 << 3];
    let blocks = decoded / BLOCK;
    for block in 0..blocks {
        let header = u32::from(block + 1 == blocks) | (1 << 1) | ((BLOCK as u32) << 3);
        payload.extend_from_slice(&header.to_le_bytes()[..3]);
        payload.push(0);
    }
    let mut file = b"EBPFPROF".to_vec();
    file.extend_from_slice(&2u32.to_le_bytes());
    file.extend_from_slice(&[0; 4]);
    file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    file.extend_from_slice(&decoded.to_le_bytes());
    file.extend_from_slice(&payload);
    let crc = crc32fast::hash(&file[16..]);
    file[12..16].copy_from_slice(&crc.to_le_bytes());
    file
}

/// Files the untrusted user hands root to report on: a crafted profile, a FIFO, a link to
/// /dev/zero. Each is refused at once, in little memory, saying why.
#[test]
fn hostile_inputs_to_report_fail_fast_in_little_memory() {
    let home = untrusted_dir("hostile-inputs");
    let crafted = home.join("crafted.prof");
    let fifo = home.join("fifo.prof");
    let zero = home.join("zero.prof");
    let staged = home.parent().unwrap().join("staged");
    fs::write(&staged, profile_announcing_four_gigabytes()).unwrap();
    fs::set_permissions(&staged, fs::Permissions::from_mode(0o644)).unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_string();
    run_untrusted(
        "sh",
        &[
            "-c",
            &format!(
                "cp {} {} && mkfifo {} && ln -s /dev/zero {}",
                path(&staged),
                path(&crafted),
                path(&fifo),
                path(&zero)
            ),
        ],
    );
    for (input, expected) in [
        (
            &crafted,
            "corrupt: its header says the 131078-byte payload decompresses to 4294967296 bytes, \
             more than 64 times its size",
        ),
        (&fifo, "a FIFO, not a regular file"),
        (&zero, "a device, not a regular file"),
    ] {
        let stderr = failing_root_run(
            &["report", "-i", input.to_str().unwrap()],
            64 << 20,
            Duration::from_secs(10),
        );
        assert!(
            stderr.contains(input.to_str().unwrap()) && stderr.contains(expected),
            "{stderr}"
        );
    }
    fs::remove_dir_all(home.parent().unwrap()).ok();
}

/// As the untrusted user, with neither root nor CAP_BPF: the error says which privilege is
/// missing (not a map name, which varies from run to run) and how to get it.
#[test]
fn unprivileged_record_names_the_missing_privilege() {
    let home = untrusted_dir("unprivileged");
    let output = as_untrusted(
        profiler_bin(),
        &[
            "record",
            "-o",
            home.join("p.prof").to_str().unwrap(),
            "--",
            "/bin/true",
        ],
    )
    .output()
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    for expected in [
        "the kernel refused to create the capture program's BPF maps: permission denied (EPERM)",
        "needs root, or CAP_BPF and CAP_PERFMON",
        "sudo setcap cap_bpf,cap_perfmon+ep",
    ] {
        assert!(stderr.contains(expected), "{stderr}");
    }
    assert!(!stderr.contains("failed to create map"), "{stderr}");
    fs::remove_dir_all(home.parent().unwrap()).ok();
}

/// A map larger than the kernel can allocate is named, with the errno and the option that
/// sizes it.
#[test]
fn a_map_the_kernel_cannot_allocate_is_named_with_its_option() {
    let stderr = failing_root_run(
        &[
            "record",
            "--stack-map-entries",
            "100000000",
            "--",
            "/bin/true",
        ],
        256 << 20,
        Duration::from_secs(30),
    );
    assert!(
        stderr.contains("the kernel could not allocate BPF map `STACK_FRAMES`")
            && stderr.contains("(ENOMEM): lower --stack-map-entries"),
        "{stderr}"
    );
}

/// A command's arguments (here a password) stay out of the profile unless asked for.
#[test]
fn command_arguments_stay_out_of_the_profile_unless_asked() {
    let dir = temp_dir("arguments");
    let profile = dir.join("args.prof");
    let record = |extra: &[&str]| {
        let mut args = vec!["record", "-o", profile.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/bin/sh", "-c", "true", "sh", "--password=hunter2"]);
        profiler(&args);
        let report = report_json(&profile, &[]);
        let text = String::from_utf8(profiler(&["report", "-i", profile.to_str().unwrap()]).stdout)
            .unwrap();
        (report, text)
    };
    let (report, text) = record(&[]);
    assert_eq!(
        report["meta"]["target"], "`/bin/sh` (4 arguments not recorded)",
        "{:#}",
        report["meta"]
    );
    assert!(!text.contains("hunter2"), "{text}");
    let (report, _) = record(&["--record-args"]);
    assert_eq!(
        report["meta"]["target"],
        "`/bin/sh -c true sh --password=hunter2`"
    );
    fs::remove_dir_all(dir).ok();
}

/// Sets `kernel.kptr_restrict` while it lives, then puts the old value back.
struct KptrRestrict(String);

impl KptrRestrict {
    const PATH: &'static str = "/proc/sys/kernel/kptr_restrict";

    fn set(value: &str) -> KptrRestrict {
        let old = fs::read_to_string(Self::PATH).unwrap();
        fs::write(Self::PATH, value).unwrap();
        KptrRestrict(old)
    }
}

impl Drop for KptrRestrict {
    fn drop(&mut self) {
        let _ = fs::write(Self::PATH, self.0.trim());
    }
}

/// Numbers in kernel space (x86-64) anywhere in a JSON document.
fn kernel_addresses_in(value: &Value) -> usize {
    match value {
        Value::Number(n) => usize::from(n.as_u64().is_some_and(|n| n >= 0xffff_8000_0000_0000)),
        Value::String(s) => s
            .split(|c: char| !c.is_ascii_hexdigit() && c != 'x')
            .filter_map(|word| u64::from_str_radix(word.strip_prefix("0x")?, 16).ok())
            .filter(|&n| n >= 0xffff_8000_0000_0000)
            .count(),
        Value::Array(items) => items.iter().map(kernel_addresses_in).sum(),
        Value::Object(fields) => fields.values().map(kernel_addresses_in).sum(),
        _ => 0,
    }
}

/// With kptr_restrict = 1 the kernel shows its addresses only to CAP_SYSLOG: root's recording
/// has them (root has it), the untrusted user's report of that same profile does not, and a
/// recording by root without CAP_SYSLOG writes none, in its profile or its `--raw` stream.
#[test]
fn kernel_addresses_are_hidden_from_whom_the_kernel_hides_them() {
    let _restrict = KptrRestrict::set("1");
    let dir = untrusted_dir("kptr").parent().unwrap().to_path_buf();
    let toucher = workload("page_toucher");
    let record = |wrapper: &[&str], name: &str| {
        let profile = dir.join(format!("{name}.prof"));
        let raw = dir.join(format!("{name}.jsonl"));
        let mut command = Command::new(wrapper.first().copied().unwrap_or("env"));
        command
            .args(wrapper.iter().skip(1))
            .arg(profiler_bin())
            .args([
                "record",
                "-e",
                "page-faults",
                "-c",
                "1",
                "-o",
                profile.to_str().unwrap(),
                "--raw",
                raw.to_str().unwrap(),
                "--",
                toucher.to_str().unwrap(),
            ]);
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        fs::set_permissions(&profile, fs::Permissions::from_mode(0o644)).unwrap();
        let raw_lines: Vec<Value> = fs::read_to_string(&raw)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (profile, raw_lines)
    };
    let instruction_report = |profile: &Path, untrusted: bool| -> Value {
        let args = [
            "report",
            "-i",
            profile.to_str().unwrap(),
            "--json",
            "--by",
            "instruction",
        ];
        let output = if untrusted {
            run_untrusted(profiler_bin(), &args)
        } else {
            profiler(&args)
        };
        serde_json::from_slice(&output.stdout).unwrap()
    };

    // Root, with CAP_SYSLOG: page faults are taken in the kernel, at kernel addresses.
    let (shown, raw) = record(&[], "root");
    let report = instruction_report(&shown, false);
    assert!(
        kernel_addresses_in(&report) > 0,
        "no kernel frames: {report:#}"
    );
    assert!(raw.iter().map(kernel_addresses_in).sum::<usize>() > 0);
    // The untrusted user reading root's profile.
    let hidden = instruction_report(&shown, true);
    assert_eq!(kernel_addresses_in(&hidden), 0, "{hidden:#}");
    assert!(
        hidden.to_string().contains("[kernel.kallsyms]"),
        "kernel rows remain, by name: {hidden:#}"
    );
    // Root without CAP_SYSLOG.
    let (without, raw) = record(
        &[
            "setpriv",
            "--inh-caps=-syslog",
            "--bounding-set=-syslog",
            "--",
        ],
        "no-syslog",
    );
    assert_eq!(kernel_addresses_in(&instruction_report(&without, false)), 0);
    assert_eq!(raw.iter().map(kernel_addresses_in).sum::<usize>(), 0);
    assert!(
        raw.iter().any(|line| line["ip"] == "0x0"),
        "kernel samples are kept"
    );
    fs::remove_dir_all(dir).ok();
}

// Issue 45: what another user controls cannot crash, hang, exhaust or mislead root's profiler.
// Each attack is made as the untrusted user; root's profiler runs in a memory cgroup
// ([`MemoryCap`]) and against a deadline, and must survive, end on time, keep its profiles, stay
// under its cap and say what it could not read.

/// The shipped unit's `MemoryMax=`.
const AGENT_MEMORY_CAP: u64 = 512 << 20;

/// The agent, capped, writing windows of `interval` seconds into `output_dir`, with `limits`
/// (prlimit options) and `extra` options; its stderr is piped (its log).
fn capped_agent(
    cap: &MemoryCap,
    limits: &[&str],
    output_dir: &Path,
    interval: &str,
    extra: &[&str],
) -> common::Running {
    let mut args = vec![
        "agent",
        "--interval",
        interval,
        "--output-dir",
        output_dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    common::Running::spawn(
        cap.command(limits, profiler_bin(), &args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
}

/// Checks what every capped run must show: no OOM kill, the peak under the cap.
fn assert_within_cap(cap: &MemoryCap, bytes: u64) {
    assert_eq!(cap.oom_kills(), 0, "the kernel OOM-killed the profiler");
    let peak = cap.peak_bytes();
    assert!(peak < bytes, "peak {} MiB", peak >> 20);
    eprintln!("peak {} MiB of {} MiB", peak >> 20, bytes >> 20);
}

/// The windows in `dir` that name a function containing `function`.
fn windows_naming(dir: &Path, function: &str) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| common::is_window(path))
        .filter(|path| {
            common::read_pprof(path)
                .string_table
                .iter()
                .any(|name| name.contains(function))
        })
        .count()
}

/// The untrusted user's process holding `count` distinct files of theirs mapped executable, until
/// its standard input closes.
fn map_files_as_untrusted(home: &Path, count: usize) -> Child {
    let script = format!(
        "import mmap, os, sys\n\
         maps = []\n\
         for i in range({count}):\n\
         \x20   path = os.path.join('{}', 'module%05d' % i)\n\
         \x20   with open(path, 'wb') as f:\n\
         \x20       f.write(bytes(4096))\n\
         \x20   fd = os.open(path, os.O_RDONLY)\n\
         \x20   maps.append(mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, \
                 prot=mmap.PROT_READ | mmap.PROT_EXEC))\n\
         \x20   os.close(fd)\n\
         print('mapped', flush=True)\n\
         sys.stdin.read()\n",
        home.display()
    );
    let mut mapper = as_untrusted("/usr/bin/python3", &["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(mapper.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "mapped", "the mapper failed");
    mapper
}

/// Item 8: one user maps 1,100, then 4,200 distinct files while the agent runs under a unit's
/// low soft descriptor limit (1,024; hard 4,096). The agent raises its limit, exports every
/// window, keeps its descriptors within the budget (and counts them), and a root program that
/// starts afterwards is named.
#[test]
fn one_user_mapping_thousands_of_files_exhausts_no_descriptor_and_hides_no_root_program() {
    for count in [1100, 4200] {
        let home = untrusted_dir(&format!("descriptors-{count}"));
        let mut mapper = map_files_as_untrusted(&home, count);
        let windows = home.parent().unwrap().join("windows");
        let cap = MemoryCap::new(&format!("descriptors-{count}"), AGENT_MEMORY_CAP);
        let addr = common::metrics_address();
        let started = Instant::now();
        let mut agent = capped_agent(
            &cap,
            &["--nofile=1024:4096"],
            &windows,
            "1",
            &["--metrics-addr", &addr],
        );
        common::wait_until_recording(agent.id());
        let limits = fs::read_to_string(format!("/proc/{}/limits", agent.id())).unwrap();
        let soft: u64 = limits
            .lines()
            .find_map(|line| line.strip_prefix("Max open files"))
            .and_then(|values| values.split_whitespace().next()?.parse().ok())
            .unwrap();
        assert_eq!(
            soft, 4096,
            "the agent did not raise its soft limit:\n{limits}"
        );

        // Root's program, started once the user's files are in the table.
        let victim = Command::new(workload("cpu_split"))
            .arg("1500")
            .output()
            .unwrap();
        assert!(victim.status.success());
        let scraped = common::scrape(&addr);
        let open_files = common::metric(&scraped, "profiler_open_files", &[]);
        sleep(Duration::from_millis(1500));
        let log = agent.terminate();
        drop(mapper.stdin.take());
        mapper.wait().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{:?}",
            started.elapsed()
        );
        assert_within_cap(&cap, AGENT_MEMORY_CAP);

        eprintln!("{count} files mapped: the agent held {open_files} descriptors");
        assert!(open_files > 0.0 && open_files < 4096.0, "{open_files}");
        if count < 4096 - 768 {
            // Within the budget every mapped file stays open.
            assert!(open_files > count as f64, "{open_files}");
        }
        // Every window the agent closed was exported; none failed for want of a descriptor.
        let windows_closed = log
            .lines()
            .filter(|line| {
                line.split("window ").nth(1).is_some_and(|rest| {
                    rest.split(':')
                        .next()
                        .is_some_and(|n| n.parse::<u64>().is_ok())
                })
            })
            .count();
        let exported = log.matches("exported to --output-dir").count();
        assert!(exported >= 2 && exported == windows_closed, "{log}");
        assert!(
            !log.contains("export to") && !log.contains("Too many open files"),
            "{log}"
        );
        // A few of the user's files are named, not a line each: thousands of lines filled the
        // stderr pipe of an agent whose reader waited for its exit, and it never exited.
        let named = log
            .lines()
            .filter(|line| line.contains(": no unwind table ("))
            .count();
        eprintln!("{named} of the files named in warnings");
        assert!(
            named as u64 <= profiler::input::MAX_FILES_NAMED,
            "{named} files named:\n{log}"
        );
        assert!(
            windows_naming(&windows, "cpu_split::heavy_work") > 0,
            "root's program is unnamed:\n{log}"
        );
        fs::remove_dir_all(home.parent().unwrap()).ok();
    }
}

/// Item 9: `--output-dir` is checked like the spool. A directory every user may write is
/// refused at once; a directory the agent creates keeps only its own profiles within
/// `--max-disk`: a sparse 10 GB file with a profile's name that the agent did not write is
/// neither removed nor counted, and when the user swaps the directory for a link to a root-only
/// directory, the agent neither writes there nor removes the root file with a profile's name in
/// it, and a new run refuses the link.
#[test]
fn the_output_directory_is_checked_and_pruning_removes_only_what_the_agent_wrote() {
    let cap = MemoryCap::new("output-dir", AGENT_MEMORY_CAP);
    let shared = temp_dir("output-dir-shared");
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let refused = |dir: &Path| -> String {
        let child = cap
            .command(
                &[],
                profiler_bin(),
                &["agent", "--output-dir", dir.to_str().unwrap()],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let watched = watch(child, AGENT_MEMORY_CAP, Duration::from_secs(20));
        assert!(!watched.output.status.success());
        String::from_utf8(watched.output.stderr).unwrap()
    };
    let stderr = refused(&shared);
    assert!(
        stderr.contains(&format!("--output-dir {}", shared.display()))
            && stderr.contains("other users may write in it (mode 1777)")
            && stderr.contains("chmod go-w"),
        "{stderr}"
    );

    let home = untrusted_dir("output-dir");
    let out = home.join("profiles");
    let moved = home.join("moved");
    let root_only = home.parent().unwrap().join("root-only");
    fs::create_dir(&root_only).unwrap();
    fs::set_permissions(&root_only, fs::Permissions::from_mode(0o700)).unwrap();
    let roots_file = root_only.join("profile-0000000000002-000000.pb.gz");
    fs::write(&roots_file, b"root's own file").unwrap();

    let mut agent = capped_agent(&cap, &[], &out, "0.3", &["--max-disk", "3K"]);
    common::wait_until_recording(agent.id());
    // Created by the agent, 0750.
    let mode = fs::metadata(&out).unwrap().permissions().mode();
    assert_eq!(mode & 0o7027, 0, "{mode:o}");
    // A file the agent did not write (left by another user before the directory was theirs no
    // more), named as the oldest profile, 10 GB by its size.
    let planted = out.join("profile-0000000000001-000000.pb.gz");
    fs::File::create(&planted)
        .unwrap()
        .set_len(10 << 30)
        .unwrap();
    let (uid, gid) = untrusted_user();
    std::os::unix::fs::chown(&planted, Some(uid), Some(gid)).unwrap();
    sleep(Duration::from_secs(2));
    // The user owns the directory's parent: they move it away and put a link in its place.
    run_untrusted(
        "sh",
        &[
            "-c",
            &format!(
                "mv {} {} && ln -s {} {}",
                out.display(),
                moved.display(),
                root_only.display(),
                out.display()
            ),
        ],
    );
    let swapped = std::time::SystemTime::now();
    sleep(Duration::from_secs(2));
    let log = agent.terminate();
    assert_within_cap(&cap, AGENT_MEMORY_CAP);

    assert_eq!(
        fs::metadata(moved.join(planted.file_name().unwrap()))
            .unwrap()
            .len(),
        10 << 30
    );
    assert_eq!(fs::read(&roots_file).unwrap(), b"root's own file");
    assert_eq!(
        fs::read_dir(&root_only).unwrap().count(),
        1,
        "the agent wrote through the link"
    );
    let mut kept: Vec<(String, u64, std::time::SystemTime)> = fs::read_dir(&moved)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| {
            common::is_window(&entry.path())
                && entry.path() != moved.join(planted.file_name().unwrap())
        })
        .map(|entry| {
            let metadata = entry.metadata().unwrap();
            (
                entry.file_name().into_string().unwrap(),
                metadata.len(),
                metadata.modified().unwrap(),
            )
        })
        .collect();
    kept.sort();
    let exported = log.matches("exported to --output-dir").count();
    assert!(!log.contains("export to"), "{log}");
    // Rotated within --max-disk (or the newest alone), into the directory it opened.
    let bytes: u64 = kept.iter().map(|(_, bytes, _)| bytes).sum();
    assert!(
        exported > kept.len() && !kept.is_empty(),
        "{exported} exported, {kept:?} kept"
    );
    assert!(bytes <= 3 * 1024 || kept.len() == 1, "{kept:?}");
    assert!(
        kept.last().unwrap().2 > swapped,
        "no window written after the swap: {kept:?}"
    );

    // A new run is given the link: refused.
    let stderr = refused(&out);
    assert!(stderr.contains("it is a symbolic link"), "{stderr}");
    fs::remove_dir_all(home.parent().unwrap()).ok();
    fs::remove_dir_all(shared).ok();
}

/// Root's capped `record -a --unwind dwarf` for `seconds` into `profile`, during which the
/// untrusted user runs `program MILLISECONDS mix` (the no_frame_pointers workload's mix of
/// frameless calls); its stderr.
fn record_all_while_untrusted_runs(
    name: &'static str,
    profile: &Path,
    seconds: u32,
    program: &Path,
    milliseconds: &str,
) -> String {
    let recording = std::thread::spawn({
        let profile = profile.to_str().unwrap().to_string();
        let seconds = seconds.to_string();
        move || {
            capped_record(
                name,
                &[
                    "record",
                    "-a",
                    "--unwind",
                    "dwarf",
                    "--duration",
                    &seconds,
                    "-o",
                    &profile,
                ],
                Duration::from_secs(90),
            )
        }
    });
    sleep(Duration::from_millis(1500));
    run_untrusted(program, &[milliseconds, "mix"]);
    recording.join().unwrap()
}

/// Root's `record` of `args`, capped at [`RECORD_MEMORY_BOUND`] and given `deadline`: it must
/// succeed; its stderr.
fn capped_record(name: &str, args: &[&str], deadline: Duration) -> String {
    let cap = MemoryCap::new(name, RECORD_MEMORY_BOUND);
    let child = cap
        .command(&[], profiler_bin(), args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let watched = watch(child, RECORD_MEMORY_BOUND, deadline);
    let stderr = String::from_utf8(watched.output.stderr).unwrap();
    assert!(
        watched.output.status.success(),
        "{args:?} failed ({}, {} OOM kills, peak {} MiB): {stderr}",
        watched.output.status,
        cap.oom_kills(),
        cap.peak_bytes() >> 20
    );
    assert_within_cap(&cap, RECORD_MEMORY_BOUND);
    eprintln!("{name}: {:?}", watched.elapsed);
    stderr
}

/// tests/workloads/c/no_frame_pointers.c built by root into `dir/name` with `flags`, handed to
/// the untrusted user.
fn untrusted_c_program(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let program = common::c_workload::build_no_frame_pointers(dir, name, flags);
    let (uid, gid) = untrusted_user();
    std::os::unix::fs::chown(&program, Some(uid), Some(gid)).unwrap();
    program
}

/// Item 2: the untrusted user's program carries a crafted 60 MB `.debug_frame` of one-byte
/// rows (over 1 GiB of rows once evaluated). Root's system-wide recording with table
/// unwinding refuses that table within its memory cap, ends on time, and keeps its profile,
/// the program's code named by its symbols all the same.
#[test]
fn a_crafted_debug_frame_is_refused_within_the_memory_cap() {
    let home = untrusted_dir("debug-frame");
    let program = untrusted_c_program(&home, "crafted", &[]);
    let section = home.parent().unwrap().join("debug_frame.bin");
    let rows = 60 << 20;
    let mut cie = Vec::new();
    cie.extend_from_slice(&u32::MAX.to_le_bytes()); // CIE id
    cie.extend_from_slice(&[1, 0, 1, 0x78, 16]); // version 1, "", code 1, data -8, rip
    cie.extend_from_slice(&[0x0c, 7, 8, 0x90, 1]); // CFA rsp+8, rip at CFA-8
    while (cie.len() + 4) % 8 != 0 {
        cie.push(0);
    }
    let mut fde = Vec::new();
    fde.extend_from_slice(&0u32.to_le_bytes()); // its CIE, at offset 0
    fde.extend_from_slice(&0x1000u64.to_le_bytes());
    fde.extend_from_slice(&(rows as u64 + 16).to_le_bytes());
    fde.resize(fde.len() + rows, 0x41); // DW_CFA_advance_loc 1: a row each
    let mut bytes = Vec::new();
    for entry in [cie, fde] {
        bytes.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&entry);
    }
    fs::write(&section, bytes).unwrap();
    let status = Command::new("objcopy")
        .arg(format!("--add-section=.debug_frame={}", section.display()))
        .arg(&program)
        .status()
        .unwrap();
    assert!(status.success());

    let profile = home.parent().unwrap().join("system.prof");
    let stderr = record_all_while_untrusted_runs("debug-frame", &profile, 5, &program, "2000");
    eprintln!("{stderr}");
    // Refused by name, not only counted.
    assert!(
        stderr.lines().any(|line| line.starts_with("warning: ")
            && line.contains(program.to_str().unwrap())
            && line.contains("no unwind table")),
        "{stderr}"
    );
    let details = report_json(
        &profile,
        &[
            "--only-module",
            program.to_str().unwrap(),
            "--function",
            "leaf_mix",
        ],
    );
    let function = &details["events"][0]["function_details"];
    assert!(function["samples"].as_u64().unwrap() > 0, "{function:#}");
    fs::remove_dir_all(home.parent().unwrap()).ok();
}

/// Item 3: the untrusted user sends the agent's metrics port a request line without end, and
/// trickles another a byte a second. Both are cut off, scrapes are answered at once meanwhile,
/// and the agent stays within its cap and exports its windows.
#[test]
fn endless_and_trickling_metrics_requests_starve_neither_memory_nor_scrapes() {
    let windows = temp_dir("metrics-attack");
    let cap = MemoryCap::new("metrics", AGENT_MEMORY_CAP);
    let addr = common::metrics_address();
    let mut agent = capped_agent(
        &cap,
        &[],
        &windows.join("windows"),
        "1",
        &["--metrics-addr", &addr],
    );
    common::wait_until_recording(agent.id());
    let (host, port) = addr.rsplit_once(':').unwrap();
    let tcp = format!("/dev/tcp/{host}/{port}");
    // 1 GiB without a newline; cut off long before.
    let flood = as_untrusted(
        "bash",
        &[
            "-c",
            &format!("exec 3<>{tcp}; head -c 1073741824 /dev/zero | tr '\\0' A >&3"),
        ],
    )
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let trickle = as_untrusted(
        "bash",
        &[
            "-c",
            &format!(
                "exec 3<>{tcp}; for c in G E T ' ' / m e t r i c s; do printf %s \"$c\" >&3 || \
                 exit 0; sleep 1; done"
            ),
        ],
    )
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let started = Instant::now();
    for _ in 0..4 {
        let asked = Instant::now();
        let scraped = common::scrape(&addr);
        assert!(scraped.contains("profiler_open_files"), "{scraped}");
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
        sleep(Duration::from_millis(700));
    }
    let mut flood = common::Running(flood);
    let status = flood.wait_at_most(Duration::from_secs(30));
    assert!(
        !status.success(),
        "the endless request line was taken whole"
    );
    let mut trickle = common::Running(trickle);
    trickle.wait_at_most(Duration::from_secs(30));
    let log = agent.terminate();
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_within_cap(&cap, AGENT_MEMORY_CAP);
    assert!(
        log.matches("exported to --output-dir").count() >= 2,
        "{log}"
    );
    fs::remove_dir_all(windows).ok();
}

/// Item 6: the untrusted user's program has a function named by 66,000 characters. Root's
/// recording of it writes its report and profile, `report -i` reads the profile back, the
/// name cut in the middle for display and kept whole in the JSON.
#[test]
fn a_function_named_by_66000_characters_leaves_the_report_and_profile_readable() {
    let home = untrusted_dir("long-name");
    let long = format!("long_start_{}_long_end", "x".repeat(66_000));
    let source = home.join("long.c");
    fs::write(
        &source,
        format!(
            "#include <time.h>\n\
             __attribute__((noinline)) unsigned long spin(unsigned long n) __asm__(\"{long}\");\n\
             unsigned long spin(unsigned long n) {{ volatile unsigned long x = 0; \
             for (unsigned long i = 0; i < n; i++) x += i; return x; }}\n\
             int main(void) {{ time_t end = time(0) + 3; while (time(0) < end) spin(1000000); \
             return 0; }}\n"
        ),
    )
    .unwrap();
    let program = home.join("long");
    let built = Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&program)
        .arg(&source)
        .status()
        .unwrap();
    assert!(built.success());
    let profile = home.parent().unwrap().join("long.prof");
    let mapped = as_untrusted(&program, &[]).spawn().unwrap();
    let mut mapped = common::Running(mapped);
    sleep(Duration::from_millis(300));
    let stderr = capped_record(
        "long-name",
        &[
            "record",
            "-p",
            &mapped.id().to_string(),
            "--duration",
            "2",
            "-o",
            profile.to_str().unwrap(),
            "--report",
            home.parent().unwrap().join("report.txt").to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    mapped.wait_at_most(Duration::from_secs(10));
    let report = fs::read_to_string(home.parent().unwrap().join("report.txt")).unwrap();
    assert!(report.contains("long_start_x"), "{stderr}\n{report}");
    assert!(
        report.lines().all(|line| line.len() < 4000),
        "a line was not cut"
    );
    let again = common::profiler(&["report", "-i", profile.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("long_start_x"));
    let json = report_json(&profile, &[]);
    assert!(
        json.to_string().contains(&long),
        "the profile lost the whole name"
    );
    fs::remove_dir_all(home.parent().unwrap()).ok();
}

/// Item 7: the untrusted user builds another program carrying the build ID of root's program
/// and runs it while root records the system with table unwinding; root's program, recorded
/// next, still unwinds to its roots (the cached table is the content's, not the build ID's).
#[test]
fn a_program_carrying_a_root_programs_build_id_poisons_no_unwind_table() {
    let home = untrusted_dir("build-id");
    let root_dir = home.parent().unwrap().to_path_buf();
    // A build ID no earlier run cached: this run's own.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let build_id = format!(
        "{:016x}{:016x}{:08x}",
        now.as_nanos() as u64,
        u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        now.subsec_nanos()
    );
    let flag = format!("-Wl,--build-id=0x{build_id}");
    let victim = common::c_workload::build_no_frame_pointers(&root_dir, "victim", &[&flag]);
    // Other code, other call-frame information, the same build ID.
    let impostor = untrusted_c_program(&home, "impostor", &["-O0", &flag]);

    let system = root_dir.join("system.prof");
    record_all_while_untrusted_runs("build-id-system", &system, 4, &impostor, "1500");

    let victim_profile = root_dir.join("victim.prof");
    let stderr = capped_record(
        "build-id-victim",
        &[
            "record",
            "--unwind",
            "dwarf",
            "--stats",
            "-o",
            victim_profile.to_str().unwrap(),
            "--",
            victim.to_str().unwrap(),
            "2000",
            "mix",
        ],
        Duration::from_secs(60),
    );
    let line = stderr
        .lines()
        .find(|line| line.contains("user stacks unwound:"))
        .unwrap_or_else(|| panic!("no unwinder line:\n{stderr}"));
    let counts: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|word| word.parse().ok())
        .collect();
    let (walked, complete) = (counts[0], counts[1]);
    assert!(
        walked > 100 && complete as f64 >= 0.95 * walked as f64,
        "{complete} of {walked} walks complete\n{stderr}"
    );
    fs::remove_dir_all(root_dir).ok();
}

/// The loss counter `name` of a JSON report, 0 when absent.
fn loss(report: &Value, name: &str) -> u64 {
    report["losses"][name].as_u64().unwrap_or(0)
}

/// Whether a JSON report names `function` anywhere.
fn names(report: &Value, function: &str) -> bool {
    report.to_string().contains(function)
}

/// The untrusted user's program and its shared library (tests/workloads/c/victim.c), built in
/// their directory and owned by them. With `fifo_link`, the library has a debug link to
/// `libvictim.debug` beside it, which the user has made a FIFO: opened as blazesym opens it
/// (blocking), it never returns.
fn build_victim(home: &Path, fifo_link: bool) -> (PathBuf, PathBuf) {
    let library = gcc(
        "victim.c",
        &home.join("libvictim.so"),
        &["-shared", "-fPIC", "-g", "-DVICTIM_LIBRARY"],
    );
    let link = home.join("libvictim.debug");
    if fifo_link {
        fs::copy(&library, &link).unwrap();
        let status = Command::new("objcopy")
            .arg(format!("--add-gnu-debuglink={}", link.display()))
            .arg(&library)
            .status()
            .unwrap();
        assert!(status.success(), "objcopy adds the debug link");
        fs::remove_file(&link).unwrap();
    }
    let home_arg = home.to_str().unwrap();
    let program = gcc(
        "victim.c",
        &home.join("victim"),
        &[
            "-g",
            "-Wl,--no-as-needed",
            &format!("-L{home_arg}"),
            "-lvictim",
            &format!("-Wl,-rpath,{home_arg}"),
        ],
    );
    let (uid, gid) = untrusted_user();
    for file in [&library, &program] {
        std::os::unix::fs::chown(file, Some(uid), Some(gid)).unwrap();
    }
    if fifo_link {
        run_untrusted("mkfifo", &[link.to_str().unwrap()]);
    }
    (program, library)
}

/// How root profiles the untrusted user's program.
#[derive(Clone, Copy, Debug)]
enum Target {
    System,
    Process,
    /// `agent --source-lines`, one-second windows.
    Agent,
}

/// Root profiles (as `target` says) the untrusted user's program, with `truncating` while they
/// truncate and restore its library every few milliseconds, once the program has left the
/// library's code; the profiler's run under [`watch`] (failing past `deadline`), and the
/// profile's JSON report (the agent's windows' strings for [`Target::Agent`], as a JSON array).
fn profile_victim(
    home: &Path,
    target: Target,
    truncating: bool,
    deadline: Duration,
    attempt: usize,
) -> (Watched, Value) {
    let (program, library) = (home.join("victim"), home.join("libvictim.so"));
    let done = home.join(format!("done-{attempt}"));
    let out = home.parent().unwrap().join(format!("out-{attempt}"));
    fs::create_dir_all(&out).unwrap();
    let profile = out.join("victim.prof");
    let spawn = |args: Vec<String>| {
        Command::new(profiler_bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let record = |which: &str| -> Vec<String> {
        ["record", which]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let mut profiler = match target {
        Target::System => {
            let mut args = record("-a");
            args.extend(["--duration", "5", "-o"].map(String::from));
            args.push(profile.to_str().unwrap().into());
            Some(spawn(args))
        }
        Target::Agent => Some(spawn(
            [
                "agent",
                "--source-lines",
                "-F",
                "499",
                "--interval",
                "1",
                "--output-dir",
                out.to_str().unwrap(),
            ]
            .map(String::from)
            .to_vec(),
        )),
        Target::Process => None,
    };
    sleep(Duration::from_millis(1000));
    let mut victim = as_untrusted(&program, &["2", "6", done.to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let profiler = profiler.take().unwrap_or_else(|| {
        let mut args = record("-p");
        args.push(victim.id().to_string());
        args.extend(["--duration", "5", "-o"].map(String::from));
        args.push(profile.to_str().unwrap().into());
        spawn(args)
    });
    let library = library.to_str().unwrap();
    let backup = format!("{library}.whole");
    if truncating {
        run_untrusted("cp", &[library, &backup]);
    }
    let stop = home.join(format!("stop-{attempt}"));
    let mut attacker = as_untrusted(
        "sh",
        &[
            "-c",
            &format!(
                "n=0; while [ ! -e {done} ] && [ $n -lt 2000 ]; do sleep 0.01; n=$((n+1)); done; \
                 while [ ! -e {stop} ] && [ $n -lt 8000 ] && {truncating}; do \
                 truncate -s 0 {library}; sleep 0.005; cat {backup} > {library}; sleep 0.005; \
                 n=$((n+1)); done; {truncating} && cat {backup} > {library}; true",
                done = done.display(),
                stop = stop.display()
            ),
        ],
    )
    .spawn()
    .unwrap();
    if let Target::Agent = target {
        let pid = profiler.id() as libc::pid_t;
        std::thread::spawn(move || {
            sleep(Duration::from_secs(7));
            // SAFETY: a signal to the agent, our child, still unwaited.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        });
    }
    let watched = watch(profiler, RECORD_MEMORY_BOUND, deadline);
    run_untrusted("touch", &[stop.to_str().unwrap()]);
    assert!(attacker.wait().unwrap().success());
    let _ = victim.wait();
    let report = match target {
        Target::Agent => Value::Array(
            fs::read_dir(&out)
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .filter(|path| common::is_window(path))
                .flat_map(|path| read_pprof(&path).string_table)
                .map(Value::String)
                .collect(),
        ),
        _ => report_json(&profile, &[]),
    };
    (watched, report)
}

/// Issue 45, item 1. The untrusted user truncates their library again and again while root's
/// `record -a`, `record -p` and `agent --source-lines` symbolize it: mapped, the truncated file
/// killed the profiler with SIGBUS. Each survives, ends on time within its memory bound, keeps
/// its profile and names the program's own function; the library's is named from the copy made
/// before the truncation, or else the report says why it could not be. A library over the
/// copy's cap is refused and counted.
#[test]
fn a_library_truncated_while_profiled_is_never_mapped() {
    let home = untrusted_dir("truncated-library");
    let (_, library) = build_victim(&home, false);
    let refused = "modules not symbolized: another user's file changed while it was copied";
    let attempts = [
        Target::System,
        Target::Process,
        Target::Agent,
        Target::System,
        Target::Process,
    ];
    for (attempt, target) in attempts.into_iter().enumerate() {
        let (watched, report) =
            profile_victim(&home, target, true, Duration::from_secs(90), attempt);
        assert!(
            watched.output.status.success(),
            "{target:?} failed ({:?}): {}",
            watched.output.status,
            String::from_utf8_lossy(&watched.output.stderr)
        );
        assert!(watched.max_rss_bytes < RECORD_MEMORY_BOUND);
        eprintln!(
            "{target:?} while the library was truncated: {:?}, {} MiB",
            watched.elapsed,
            watched.max_rss_bytes >> 20
        );
        let stderr = String::from_utf8_lossy(&watched.output.stderr);
        assert!(
            names(&report, "victim_program_spin"),
            "{target:?}: the program's function is not named\n{stderr}\n{report:#}"
        );
        if let Target::Agent = target {
            continue;
        }
        assert!(
            names(&report, "victim_library_spin") || loss(&report, refused) == 1,
            "{target:?}: the library's function is neither named nor counted once as \
             refused\n{stderr}\n{report:#}"
        );
    }

    // Over the copy's cap (sparse: it costs its owner nothing): refused, counted and named.
    run_untrusted("truncate", &["-s", "300M", library.to_str().unwrap()]);
    let (watched, report) = profile_victim(
        &home,
        Target::System,
        false,
        Duration::from_secs(90),
        attempts.len(),
    );
    assert!(watched.output.status.success());
    assert!(watched.max_rss_bytes < RECORD_MEMORY_BOUND);
    assert!(names(&report, "victim_program_spin"), "{report:#}");
    assert!(!names(&report, "victim_library_spin"), "{report:#}");
    assert_eq!(
        loss(
            &report,
            "modules not symbolized: another user's file over 256 MiB"
        ),
        1,
        "{report:#}"
    );
    let stderr = String::from_utf8_lossy(&watched.output.stderr);
    assert!(
        stderr.contains(&format!(
            "warning: {}: not symbolized: another user's file over 256 MiB",
            library.display()
        )),
        "{stderr}"
    );
    fs::remove_dir_all(home.parent().unwrap()).ok();
}

/// Issue 45, item 4. The untrusted user's library has a debug link to a FIFO beside it: the
/// symbolizer followed it with a blocking open, and `record -a` never ended. Root's recordings
/// end on time, name the library's function from its own symbols, and count the debug link not
/// followed.
#[test]
fn a_fifo_at_a_debug_link_does_not_block_the_recording() {
    let home = untrusted_dir("debug-link-fifo");
    build_victim(&home, true);
    for (attempt, target) in [Target::System, Target::Process].into_iter().enumerate() {
        let (watched, report) =
            profile_victim(&home, target, false, Duration::from_secs(30), attempt);
        assert!(
            watched.output.status.success(),
            "{target:?}: {}",
            String::from_utf8_lossy(&watched.output.stderr)
        );
        assert!(watched.max_rss_bytes < RECORD_MEMORY_BOUND);
        assert!(
            names(&report, "victim_library_spin"),
            "{target:?}: {report:#}"
        );
        assert!(
            names(&report, "victim_program_spin"),
            "{target:?}: {report:#}"
        );
        assert_eq!(
            loss(
                &report,
                "debug links of other users' modules not followed (their own symbols read)"
            ),
            1,
            "{target:?}: {report:#}"
        );
    }
    fs::remove_dir_all(home.parent().unwrap()).ok();
}

/// Issue 45, item 5. Two JIT processes of the untrusted user: the first writes a 256 MiB perf
/// map of the smallest lines after its one real entry, the second's map is a hard link to it.
/// Read whole, such a map took gigabytes and OOM-killed `record -a`. The recording stays
/// within its memory bound, names both processes' JIT code from the entry kept, and counts the
/// map cut at its cap once.
#[test]
fn a_huge_hard_linked_perf_map_is_read_only_to_its_cap() {
    let home = untrusted_dir("perf-map");
    let jit = gcc("jit.c", &home.join("jit"), &[]);
    let profile = home.parent().unwrap().join("jit.prof");
    let recording = Command::new(profiler_bin())
        .args(["record", "-a", "--duration", "8", "-o"])
        .arg(&profile)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    sleep(Duration::from_millis(1000));
    let mut first = as_untrusted(&jit, &["4", "256"]).spawn().unwrap();
    let mut second = as_untrusted(&jit, &["4", "0"]).spawn().unwrap();
    let maps = [&first, &second].map(|jit| format!("/tmp/perf-{}.map", jit.id()));
    // Once the first map is written (the second's, of one line, long before).
    let whole = 256 << 20;
    while fs::metadata(&maps[0]).map_or(0, |m| m.len()) < whole
        && first.try_wait().unwrap().is_none()
    {
        sleep(Duration::from_millis(20));
    }
    run_untrusted("ln", &["-f", &maps[0], &maps[1]]);
    let watched = watch(recording, RECORD_MEMORY_BOUND, Duration::from_secs(90));
    assert!(first.wait().unwrap().success());
    assert!(second.wait().unwrap().success());
    for map in &maps {
        fs::remove_file(map).ok();
    }
    assert!(
        watched.output.status.success(),
        "{}",
        String::from_utf8_lossy(&watched.output.stderr)
    );
    assert!(watched.max_rss_bytes < RECORD_MEMORY_BOUND);
    eprintln!(
        "record -a with a 256 MiB perf map: {:?}, {} MiB",
        watched.elapsed,
        watched.max_rss_bytes >> 20
    );
    let report = report_json(&profile, &[]);
    for jit in [&first, &second] {
        assert!(
            names(&report, &format!("[perf-{}.map]", jit.id())),
            "the JIT code of {} is named: {report:#}",
            jit.id()
        );
    }
    assert!(names(&report, "jit_spin"), "{report:#}");
    assert_eq!(
        loss(
            &report,
            "perf maps cut at their cap (16 MiB of entries each, 64 MiB in all)"
        ),
        1,
        "{report:#}"
    );
    fs::remove_dir_all(home.parent().unwrap()).ok();
}
