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

use common::{profiler, profiler_bin, require_root, temp_dir, workload};
use serde_json::Value;

/// The other user of the machine.
const UNTRUSTED: &str = "profiler-untrusted";

/// (uid, gid) of [`UNTRUSTED`], created without a home or a login shell if missing.
fn untrusted_user() -> (u32, u32) {
    require_root();
    let id = |flag: &str| {
        let output = Command::new("id").args([flag, UNTRUSTED]).output().unwrap();
        output.status.success().then(|| {
            String::from_utf8(output.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
    };
    if id("-u").is_none() {
        let status = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(UNTRUSTED)
            .status()
            .expect("useradd runs");
        // Another test may have created it meanwhile.
        assert!(status.success() || id("-u").is_some(), "useradd failed");
    }
    (id("-u").unwrap(), id("-g").unwrap())
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
    let status_path = format!("/proc/{pid}/status");
    loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 writes it and the status through valid
        // pointers, for our own child only.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let waited = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(waited >= 0, "wait4: {}", std::io::Error::last_os_error());
        if waited == pid {
            let read = |mut pipe: Option<Box<dyn std::io::Read>>| {
                let mut bytes = Vec::new();
                if let Some(pipe) = pipe.as_mut() {
                    pipe.read_to_end(&mut bytes).unwrap();
                }
                bytes
            };
            let stdout = read(child.stdout.take().map(|p| Box::new(p) as _));
            let stderr = read(child.stderr.take().map(|p| Box::new(p) as _));
            use std::os::unix::process::ExitStatusExt;
            return Watched {
                output: Output {
                    status: std::process::ExitStatus::from_raw(status),
                    stdout,
                    stderr,
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
            let _ = child.kill();
            let _ = child.wait();
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
}

fn report_json(profile: &Path, args: &[&str]) -> Value {
    let mut all = vec!["report", "-i", profile.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    serde_json::from_slice(&profiler(&all).stdout).expect("a JSON report")
}

#[test]
fn program_replaced_by_a_link_to_dev_zero_is_not_read() {
    replaced_module_is_not_read_by_path(Planted::LinkToDevZero);
}

#[test]
fn program_replaced_by_a_fifo_does_not_block_the_recording() {
    replaced_module_is_not_read_by_path(Planted::Fifo);
}
