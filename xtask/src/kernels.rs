//! `cargo xtask kernels`: the profiler on the kernels users run. Debian's cloud kernels 5.10
//! (bullseye), 6.1 (bookworm) and 6.12 (bookworm-backports) boot under QEMU (TCG: these
//! machines have no nested virtualization) with a self-contained initramfs holding busybox, the
//! profiler and the test workloads; a fixed set of profiler runs inside each prints its JSON
//! between markers on the serial console, and this checks the answers: the known CPU split of
//! cpu_split, every page fault of page_toucher at its data address, `stat` counts, and every
//! fired sample kept or counted lost.
//!
//! Kernel packages come through a private apt configuration under target/kernels, from the
//! Debian mirror this machine's apt already uses, so the machine's own apt state is untouched.

use std::{
    collections::BTreeMap,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::{run_command, setup::apt_install, target_dir};

/// A kernel of the matrix: its series and the Debian suite that ships it.
struct Kernel {
    series: &'static str,
    suite: &'static str,
}

const KERNELS: [Kernel; 3] = [
    Kernel {
        series: "5.10",
        suite: "bullseye",
    },
    Kernel {
        series: "6.1",
        suite: "bookworm",
    },
    Kernel {
        series: "6.12",
        suite: "bookworm-backports",
    },
];

/// How long one kernel may take to boot and run every command (TCG is 10-20x slower than the
/// host).
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Boots of one kernel that may end in a guest kernel panic before one runs every step.
const BOOT_ATTEMPTS: u32 = 3;

/// Pages page_toucher touches; with `-c 1` each is one page-fault sample.
const TOUCHED_PAGES: u64 = 2000;
/// Rounds of cpu_split: about 600 samples at 999 Hz under TCG.
const SPLIT_ROUNDS: u64 = 1000;
/// How far the profile's split may be from the one cpu_split measured, in percentage points.
const SPLIT_TOLERANCE: f64 = 6.0;

/// How long one step may run in the x86 guests before it is stopped as hung (a step takes 2-10 s
/// there).
const STEP_LIMIT: Duration = Duration::from_secs(90);

/// The start of every guest's /init: mounts, the kernel's release, and `step NAME OUTPUT
/// COMMAND...`, which prints `@@JSON NAME` and the one-line JSON document COMMAND wrote to OUTPUT,
/// or `@@FAILED NAME` and COMMAND's output, then the lines its workload printed as `@@SAID NAME
/// LINE`. A step still running after @STEP_SECONDS@ s prints `@@HUNG NAME`, the kernel stacks of
/// every user task (`@@TASK`) and of the blocked ones (sysrq w), and its profiler is killed: the
/// console says where it hung, and the steps after it still run.
pub const GUEST_PRELUDE: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
# RLIMIT_MEMLOCK stays at its 64 KiB default: kernels before 5.11 charge BPF maps to it, and
# the profiler must raise it itself.
cd /work
echo "@@KERNEL $(uname -r)"
watchdog() {
    sleep @STEP_SECONDS@
    echo "@@HUNG $1"
    for task in /proc/[0-9]*/task/[0-9]*; do
        # Kernel threads run no file.
        [ -e $task/exe ] || continue
        echo "@@TASK $(cat $task/comm) ${task#/proc/} $(grep '^State' $task/status)"
        cat $task/stack
    done
    echo w > /proc/sysrq-trigger
    killall -KILL profiler
}
step() {
    name=$1; out=$2; shift 2
    watchdog $name &
    dog=$!
    if "$@" >/tmp/$name.log 2>&1 && [ -s "$out" ]; then
        echo "@@JSON $name"; tr -d '\n' < "$out"; echo
    else
        echo "@@FAILED $name"; cat /tmp/$name.log
    fi
    kill $dog 2>/dev/null
    grep -h '^cpu_split:\|^region \|^wait ' /tmp/$name.log | sed "s/^/@@SAID $name /"
}
"#;

/// A guest's /init: [`GUEST_PRELUDE`] with its steps' time limit, then `steps`.
pub fn guest_init(steps: &str, step_limit: Duration) -> String {
    GUEST_PRELUDE.replace("@STEP_SECONDS@", &step_limit.as_secs().to_string()) + steps
}

/// The x86 guests' steps, run by /init after [`GUEST_PRELUDE`].
const STEPS: &str = r#"
step list /tmp/list.json sh -c './profiler list --json > /tmp/list.json'
step split /tmp/split.json ./profiler record -e cpu-clock -F 999 --json /tmp/split.json -- ./cpu_split @ROUNDS@
step faults /tmp/faults.json sh -c './profiler record -e page-faults -c 1 -o /tmp/faults.prof -- ./page_toucher @PAGES@ && ./profiler report -i /tmp/faults.prof --by dcache-line --top 0 --json > /tmp/faults.json'
step stat /tmp/stat.json ./profiler stat -e page-faults,task-clock --json -o /tmp/stat.json -- ./page_toucher @PAGES@
step offcpu /tmp/offcpu.json ./profiler record --off-cpu --wakers --top 0 --json /tmp/offcpu.json -- ./off_cpu /tmp
step unwind /tmp/unwind.json ./profiler record -e cpu-clock -F 999 --top 0 --json /tmp/unwind.json -- ./no_frame_pointers 3000
step wide /tmp/wide.json sh -c './profiler record -a -e cpu-clock -F 999 --duration 10 -o /tmp/wide.prof & p=$!; until ls -l /proc/$p/fd 2>/dev/null | grep -q perf_event; do sleep 0.2; done; sleep 1; ./no_frame_pointers 3000; wait $p && ./profiler report -i /tmp/wide.prof --only-comm no_frame_pointe --top 0 --json > /tmp/wide.json'
echo "@@DONE"
poweroff -f
"#;

pub fn run() -> Result<()> {
    apt_install(&["qemu-system-x86", "busybox-static"])?;
    crate::build_release()?;
    let cache = target_dir().join("kernels");
    let suites: Vec<&str> = KERNELS.iter().map(|kernel| kernel.suite).collect();
    let apt = PrivateApt::new(&cache, &suites, "amd64")?;
    let initrd = build_initramfs(&cache.join("initramfs"))?;
    let mut failures = Vec::new();
    for kernel in &KERNELS {
        let vmlinuz = apt
            .kernel(kernel.series, "amd64")
            .with_context(|| format!("fetching Debian's {} kernel", kernel.series))?;
        let started = Instant::now();
        let mut attempt = 1;
        let (guest, log, checks) = loop {
            let console = boot(&vmlinuz, &initrd)?;
            let log = cache.join(format!("console-{}-{attempt}.log", kernel.series));
            std::fs::write(&log, &console)?;
            let guest = Guest::parse(&console);
            let checks = guest.checks();
            // Debian's 6.12 sometimes oopses or hangs under QEMU's TCG, while booting or while
            // the steps run (seen in add_sysfs_param and kmem_cache_alloc; once a boot hung in
            // the faults step after the one before it had panicked); and the sampled split,
            // against the workload's own clock, once came 7 points off on one boot of a loaded
            // host and within 2 on the others. Either: boot again, say why with the end of the
            // console, keep the console of every attempt; a check that fails on every boot fails.
            let unfinished = !guest.done || !guest.hung.is_empty();
            let split_failed = checks
                .iter()
                .all(|check| check.passed || check.step == "split")
                && checks.iter().any(|check| !check.passed);
            if !(unfinished || split_failed) || attempt == BOOT_ATTEMPTS {
                break (guest, log, checks);
            }
            let why = match checks.iter().find(|check| !check.passed) {
                Some(check) if guest.done => format!("{}: {}", check.step, check.said),
                _ => format!(
                    "did not run every step; the console ended:\n{}",
                    console_end(&console)
                ),
            };
            eprintln!(
                "xtask: kernel {} {why}\n(console in {}): booting it again",
                kernel.series,
                log.display()
            );
            attempt += 1;
        };
        eprintln!(
            "xtask: kernel {} ({}) ran in {:.0} s; its console is in {}",
            kernel.series,
            guest.release.as_deref().unwrap_or("did not boot"),
            started.elapsed().as_secs_f64(),
            log.display()
        );
        for check in checks {
            let mark = if check.passed { "ok  " } else { "FAIL" };
            println!(
                "{mark} {:<5} {:<7} {}",
                kernel.series, check.step, check.said
            );
            if !check.passed {
                failures.push(format!("{} {}: {}", kernel.series, check.step, check.said));
            }
        }
    }
    if !failures.is_empty() {
        bail!(
            "{} check(s) failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

/// apt with its own sources, lists and cache, so fetching kernels leaves the machine's apt
/// state as it was.
pub struct PrivateApt {
    options: Vec<String>,
    debs: PathBuf,
}

impl PrivateApt {
    /// Packages of `architecture` (Debian's name: `amd64`, `arm64`) from `suites`.
    pub fn new(cache: &Path, suites: &[&str], architecture: &str) -> Result<PrivateApt> {
        let root = cache.join("apt");
        for dir in ["lists/partial", "cache/archives/partial", "debs"] {
            std::fs::create_dir_all(root.join(dir))?;
        }
        let mirror = debian_mirror()?;
        let sources: String = suites
            .iter()
            .map(|suite| {
                format!(
                    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} \
                     {suite} main\n"
                )
            })
            .collect();
        let list = root.join("sources.list");
        std::fs::write(&list, sources)?;
        let at = |dir: &str| root.join(dir).display().to_string();
        let apt = PrivateApt {
            options: vec![
                format!("Dir::Etc::sourcelist={}", list.display()),
                "Dir::Etc::sourceparts=/nonexistent".into(),
                format!("Dir::State::Lists={}", at("lists")),
                format!("Dir::Cache={}", at("cache")),
                format!("APT::Architecture={architecture}"),
                // Downloads land in our own directory, which the _apt user cannot write.
                "APT::Sandbox::User=root".into(),
            ],
            debs: root.join("debs"),
        };
        run_command(apt.command("apt-get").args(["-q", "update"]))?;
        Ok(apt)
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        for option in &self.options {
            command.arg("-o").arg(option);
        }
        command
    }

    /// The newest unsigned cloud kernel of `series` for `architecture` (`amd64`, `arm64`),
    /// downloaded and unpacked once.
    pub fn kernel(&self, series: &str, architecture: &str) -> Result<PathBuf> {
        let flavour = format!("-cloud-{architecture}-unsigned");
        let output = self
            .command("apt-cache")
            .args([
                "search",
                "--names-only",
                &format!("^linux-image-.*{flavour}$"),
            ])
            .output()
            .context("running apt-cache")?;
        let prefix = format!("linux-image-{series}.");
        let package = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| name.starts_with(&prefix))
            .max_by_key(|name| version_key(name))
            .map(str::to_string)
            .ok_or_else(|| anyhow!("no {prefix}*{flavour} package"))?;
        let unpacked = self.unpack(&package)?;
        std::fs::read_dir(unpacked.join("boot"))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .find(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("vmlinuz-"))
            })
            .ok_or_else(|| anyhow!("{package} holds no /boot/vmlinuz-*"))
    }

    /// The newest version of `package` in this configuration's suites (apt-get download would
    /// otherwise take the version this machine has installed, where it has one).
    pub fn newest_version(&self, package: &str) -> Result<String> {
        let output = self
            .command("apt-cache")
            .args(["madison", package])
            .output()
            .context("running apt-cache madison")?;
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| Some(line.split('|').nth(1)?.trim().to_string()))
            .next()
            .ok_or_else(|| anyhow!("no {package} package in the private apt sources"))
    }

    /// `package`'s files (`name` or `name=version`), downloaded and unpacked (once) into a
    /// directory of their own.
    pub fn unpack(&self, package: &str) -> Result<PathBuf> {
        let name = package.split('=').next().unwrap_or(package);
        let unpacked = self.debs.join(name);
        // Written last: an interrupted unpacking is done again.
        let done = unpacked.join(".unpacked");
        if !done.exists() {
            // Not through `run_command`, which runs in the workspace: the package lands here.
            let status = self
                .command("apt-get")
                .args(["-q", "download", package])
                .current_dir(&self.debs)
                .status()
                .context("running apt-get download")?;
            if !status.success() {
                bail!("apt-get download {package} failed with {status}");
            }
            let deb = std::fs::read_dir(&self.debs)?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .find(|path| {
                    path.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(".deb"))
                })
                .ok_or_else(|| anyhow!("apt-get download left no {package} package"))?;
            run_command(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
            std::fs::write(&done, "")?;
        }
        Ok(unpacked)
    }
}

/// `linux-image-5.10.0-32-cloud-amd64-unsigned` -> [5, 10, 0, 32]: newest ABI last.
fn version_key(package: &str) -> Vec<u64> {
    package
        .trim_start_matches("linux-image-")
        .split(|c: char| !c.is_ascii_digit())
        .take_while(|part| !part.is_empty())
        .filter_map(|part| part.parse().ok())
        .collect()
}

/// The Debian archive this machine's apt uses (not the security archive).
fn debian_mirror() -> Result<String> {
    let mut texts = vec![std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default()];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for entry in dir.flatten() {
            let path = entry.path();
            if path
                .extension()
                .is_some_and(|e| e == "sources" || e == "list")
            {
                texts.push(std::fs::read_to_string(path).unwrap_or_default());
            }
        }
    }
    texts
        .iter()
        .flat_map(|text| text.lines())
        .flat_map(|line| line.split_whitespace())
        .map(|word| word.trim_start_matches("URIs:"))
        .find(|word| {
            (word.starts_with("http://") || word.starts_with("https://"))
                && word.trim_end_matches('/').ends_with("/debian")
        })
        .map(|uri| uri.trim_end_matches('/').to_string())
        .ok_or_else(|| {
            anyhow!("no Debian mirror (a URI ending in /debian) is configured in /etc/apt")
        })
}

/// Builds the guest's initramfs: busybox, the stripped profiler and workloads with the
/// libraries they load, and its /init ([`STEPS`]).
fn build_initramfs(root: &Path) -> Result<PathBuf> {
    if root.exists() {
        std::fs::remove_dir_all(root)?;
    }
    for dir in ["bin", "proc", "sys", "dev", "tmp", "work"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).context("copying busybox")?;
    let release = target_dir().join("release");
    for program in ["profiler", "cpu_split", "page_toucher", "off_cpu"] {
        let copy = root.join("work").join(program);
        if program == "profiler" {
            // Its debug information is most of its size; the workloads keep their symbols.
            run_command(
                Command::new("strip")
                    .arg("-o")
                    .arg(&copy)
                    .arg(release.join(program)),
            )?;
        } else {
            std::fs::copy(release.join(program), &copy)?;
        }
        for library in shared_libraries(&copy)? {
            let inside = root.join(library.strip_prefix("/")?);
            std::fs::create_dir_all(inside.parent().expect("a library is in a directory"))?;
            std::fs::copy(&library, &inside)
                .with_context(|| format!("copying {}", library.display()))?;
        }
    }
    // Built as the unwinding tests build it (`tests/tests/common/c_workload.rs`), and static:
    // only unwind tables describe its frames and the C library's.
    run_command(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-pthread", "-static", "-o"])
            .arg(root.join("work/no_frame_pointers"))
            .arg(crate::workspace_root().join("tests/workloads/c/no_frame_pointers.c")),
    )?;
    let init = guest_init(STEPS, STEP_LIMIT)
        .replace("@ROUNDS@", &SPLIT_ROUNDS.to_string())
        .replace("@PAGES@", &TOUCHED_PAGES.to_string());
    std::fs::write(root.join("init"), init)?;
    std::fs::set_permissions(
        root.join("init"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let archive = root.with_extension("cpio");
    run_command(
        Command::new("sh")
            .arg("-c")
            .arg("cd \"$1\" && find . | busybox cpio -o -H newc > \"$0\" 2>/dev/null")
            .arg(&archive)
            .arg(root),
    )?;
    Ok(archive)
}

/// The libraries `ldd` says a program loads, the dynamic loader included.
fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd")
        .arg(program)
        .output()
        .context("running ldd")?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
        .map(PathBuf::from)
        .collect())
}

/// Boots the kernel with the initramfs and returns everything the serial console printed.
fn boot(vmlinuz: &Path, initrd: &Path) -> Result<String> {
    let mut qemu = Command::new("qemu-system-x86_64");
    // Without CMPXCHG16B: QEMU 7.2's TCG emulation of it (SLUB's lockless per-CPU freelist)
    // double-faulted 6.12 in kmem_cache_alloc in about one boot in seven, while booting or mid-run;
    // without it SLUB takes its locked path, and 20 boots of 20 ran every step.
    qemu.args(["-accel", "tcg", "-cpu", "qemu64,-cx16"]).args([
        "-append",
        // An oops or a soft lockup panics, and the panic powers the guest off: a broken boot
        // ends at once, not at the timeout.
        "console=ttyS0 panic=-1 oops=panic softlockup_panic=1 quiet transparent_hugepage=never",
    ]);
    console_of(qemu, vmlinuz, initrd, BOOT_TIMEOUT)
}

/// The console's last lines, each cut short: what a guest that did not finish printed last.
fn console_end(console: &str) -> String {
    const LINES: usize = 25;
    const WIDTH: usize = 200;
    let lines: Vec<&str> = console.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(LINES)..]
        .iter()
        .map(|line| match line.char_indices().nth(WIDTH) {
            Some((cut, _)) => format!("  {}...", &line[..cut]),
            None => format!("  {line}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `qemu` (a qemu-system-* with its machine's options) on the kernel and initramfs, with one
/// CPU and 2 GiB, until the guest powers off or `timeout` passes; returns everything the serial
/// console printed.
pub fn console_of(
    mut qemu: Command,
    vmlinuz: &Path,
    initrd: &Path,
    timeout: Duration,
) -> Result<String> {
    let program = qemu.get_program().to_string_lossy().into_owned();
    let mut qemu = qemu
        .args([
            "-m",
            "2G",
            "-smp",
            "1",
            "-nographic",
            "-no-reboot",
            "-kernel",
        ])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let mut stdout = qemu.stdout.take().expect("stdout is piped");
    let reader = std::thread::spawn(move || {
        let mut console = Vec::new();
        let _ = stdout.read_to_end(&mut console);
        console
    });
    let started = Instant::now();
    while qemu.try_wait()?.is_none() {
        if started.elapsed() > timeout {
            qemu.kill()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    qemu.wait()?;
    let console = reader
        .join()
        .map_err(|_| anyhow!("reading the console failed"))?;
    Ok(String::from_utf8_lossy(&console).replace('\r', ""))
}

/// What the guest printed.
#[derive(Default)]
pub struct Guest {
    pub release: Option<String>,
    /// Step -> its JSON document, or the output of its failed command.
    pub steps: BTreeMap<String, std::result::Result<Value, String>>,
    /// Step -> the lines its workload printed (`cpu_split: ...`, `region ...`).
    pub said: BTreeMap<String, Vec<String>>,
    /// Step stopped as hung -> the state and kernel stack of every user task when it was.
    pub hung: BTreeMap<String, String>,
    pub done: bool,
}

/// One answer checked.
pub struct Check {
    pub step: &'static str,
    pub passed: bool,
    pub said: String,
}

impl Guest {
    pub fn parse(console: &str) -> Guest {
        let mut guest = Guest::default();
        let mut lines = console.lines();
        while let Some(line) = lines.next() {
            // The firmware's terminal escapes may precede a marker on its line.
            let line = line.find("@@").map_or(line, |at| &line[at..]);
            if let Some(release) = line.strip_prefix("@@KERNEL ") {
                guest.release = Some(release.trim().to_string());
            } else if let Some(step) = line.strip_prefix("@@JSON ") {
                let document = lines.next().unwrap_or_default();
                let parsed = serde_json::from_str(document)
                    .map_err(|e| format!("not JSON ({e}): {document}"));
                guest.steps.insert(step.trim().to_string(), parsed);
            } else if let Some(step) = line.strip_prefix("@@FAILED ") {
                let output: Vec<&str> =
                    lines.clone().take_while(|l| !l.starts_with("@@")).collect();
                guest
                    .steps
                    .insert(step.trim().to_string(), Err(output.join("\n")));
            } else if let Some(rest) = line.strip_prefix("@@SAID ") {
                if let Some((step, said)) = rest.split_once(' ') {
                    guest
                        .said
                        .entry(step.to_string())
                        .or_default()
                        .push(said.to_string());
                }
            } else if let Some(step) = line.strip_prefix("@@HUNG ") {
                // `@@TASK COMM PID/task/TID State: S (sleeping)` lines, each followed by the task's stack.
                let mut tasks = Vec::new();
                while let Some(task) = lines.clone().next().and_then(|l| l.strip_prefix("@@TASK "))
                {
                    lines.next();
                    tasks.push(task);
                    while let Some(frame) = lines.clone().next().filter(|l| !l.starts_with("@@")) {
                        lines.next();
                        tasks.push(frame);
                    }
                }
                guest.hung.insert(step.trim().to_string(), tasks.join("\n"));
            } else if line.starts_with("@@DONE") {
                guest.done = true;
            }
        }
        guest
    }

    /// Whether the guest booted and ran every step.
    pub fn boot_check(&self) -> Check {
        Check {
            step: "boot",
            passed: self.release.is_some() && self.done,
            said: match (&self.release, self.done) {
                (Some(release), true) => format!("booted {release} and ran every step"),
                (Some(release), false) => format!("booted {release} but did not finish"),
                (None, _) => "did not boot".into(),
            },
        }
    }

    /// `step` judged by `check` on its JSON document, or why it has none.
    pub fn step_check(
        &self,
        step: &'static str,
        check: impl FnOnce(&Value) -> Result<String>,
    ) -> Check {
        let result = match (self.steps.get(step), self.hung.get(step)) {
            (Some(Err(output)), Some(tasks)) => Err(anyhow!(
                "hung: stopped at its time limit; its output:\n{output}\n\
                 the state and kernel stack of each user task then:\n{tasks}"
            )),
            (Some(Ok(document)), _) => check(document),
            (Some(Err(output)), None) => Err(anyhow!("the command failed:\n{output}")),
            (None, _) => Err(anyhow!("never ran")),
        };
        Check {
            step,
            passed: result.is_ok(),
            said: result.unwrap_or_else(|e| format!("{e:#}")),
        }
    }

    fn checks(&self) -> Vec<Check> {
        let mut checks = vec![self.boot_check()];
        for (step, check) in [
            (
                "list",
                check_list as fn(&Value, &[String]) -> Result<String>,
            ),
            ("split", check_split),
            ("faults", check_faults),
            ("stat", check_stat),
            ("offcpu", check_off_cpu),
            ("unwind", check_unwind),
            // The same program started under a system-wide recording: on 6.1 on, found by
            // file (no process published), and its first samples wait for no side-band read.
            ("wide", check_unwind),
        ] {
            let said = self.said.get(step).map(Vec::as_slice).unwrap_or_default();
            checks.push(self.step_check(step, |document| check(document, said)));
        }
        checks
    }
}

fn check_list(list: &Value, _: &[String]) -> Result<String> {
    let available = list["sections"]
        .as_array()
        .ok_or_else(|| anyhow!("no sections in the list"))?
        .iter()
        .flat_map(|section| section["entries"].as_array().into_iter().flatten())
        .filter(|event| event["availability"]["status"] == "available")
        .filter_map(|event| event["name"].as_str())
        .collect::<Vec<_>>();
    for needed in ["cpu-clock", "task-clock", "page-faults"] {
        if !available.contains(&needed) {
            bail!("{needed} is not listed as available: {available:?}");
        }
    }
    Ok(format!("{} events available", available.len()))
}

/// Every fired sample is kept or counted lost, and none is lost. A user stack walked by frame
/// pointers or cut short keeps its sample: how whole the stacks are is each check's own
/// question (a guest under TCG walks its first tenth of a second by frame pointers).
pub fn check_accounting(event: &Value, report: &Value) -> Result<()> {
    let fired = event["samples_fired"].as_u64().unwrap_or_default();
    let kept = event["samples"].as_u64().unwrap_or_default();
    let lost: Vec<String> = report["losses"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(kind, _)| {
            !kind.starts_with("user stacks by frame pointers only")
                && !kind.starts_with("user stacks cut short")
        })
        .filter_map(|(kind, count)| {
            let count = count.as_u64().filter(|count| *count != 0)?;
            Some(format!("{kind}: {count}"))
        })
        .collect();
    if fired != kept || !lost.is_empty() {
        bail!(
            "{fired} samples fired, {kept} kept; lost: {}",
            lost.join(", ")
        );
    }
    Ok(())
}

/// The samples of one event of `record --json` whose stacks hold `function`.
pub fn stacks_through(event: &Value, function: &str) -> u64 {
    event["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|row| row["function"] == function)
        .filter_map(|row| row["total_samples"].as_u64())
        .sum()
}

fn check_split(report: &Value, said: &[String]) -> Result<String> {
    let event = &report["events"][0];
    check_accounting(event, report)?;
    // `cpu_split: N rounds, ..., measured CPU split: heavy_work 59.8% medium_work ...`
    let measured = said
        .iter()
        .find_map(|line| line.split_once("measured CPU split: "))
        .map(|(_, split)| split.to_string())
        .ok_or_else(|| anyhow!("cpu_split printed no split"))?;
    let samples_in =
        |function: &str| stacks_through(event, &format!("cpu_split::{function}")) as f64;
    let all: f64 = ["heavy_work", "medium_work", "light_work"]
        .into_iter()
        .map(samples_in)
        .sum();
    let mut words = measured.split_whitespace();
    let mut worst: f64 = 0.0;
    while let (Some(function), Some(share)) = (words.next(), words.next()) {
        let measured: f64 = share.trim_end_matches('%').parse()?;
        let profiled = 100.0 * samples_in(function) / all.max(1.0);
        worst = worst.max((profiled - measured).abs());
    }
    if worst > SPLIT_TOLERANCE {
        bail!("the profile's split is {worst:.1} points from cpu_split's own ({measured})");
    }
    Ok(format!(
        "{} samples, split within {worst:.1} points of the measured {measured}",
        event["samples"]
    ))
}

/// `region 0x7f... pages N line L`, as page_toucher prints it.
fn touched_region(said: &[String]) -> Result<(u64, u64, u64)> {
    let line = said
        .iter()
        .find_map(|line| line.strip_prefix("region "))
        .ok_or_else(|| anyhow!("page_toucher printed no region"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |at: usize| -> Result<u64> {
        let word = words
            .get(at)
            .ok_or_else(|| anyhow!("short region line: {line}"))?;
        Ok(match word.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16)?,
            None => word.parse()?,
        })
    };
    Ok((number(0)?, number(2)?, number(4)?))
}

fn check_faults(report: &Value, said: &[String]) -> Result<String> {
    let event = &report["events"][0];
    let (start, pages, line) = touched_region(said)?;
    let end = start + pages * 4096;
    let mut in_region = 0;
    for row in event["dcache_lines"].as_array().into_iter().flatten() {
        let address = row["address"].as_u64().unwrap_or_default();
        if (start..end).contains(&address) {
            if address % 4096 != line * 64 {
                bail!("a fault at {address:#x} is not at line {line} of its page");
            }
            in_region += row["samples"].as_u64().unwrap_or_default();
        }
    }
    if in_region != pages {
        bail!("{in_region} page-fault samples in the touched region of {pages} pages");
    }
    Ok(format!(
        "all {pages} touched pages sampled at their data address"
    ))
}

fn check_stat(report: &Value, said: &[String]) -> Result<String> {
    let (_, pages, _) = touched_region(said)?;
    let count = |name: &str| {
        report["events"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|event| event["event"] == name)
            .and_then(|event| event["count"].as_u64())
    };
    let faults = count("page-faults").ok_or_else(|| anyhow!("no page-faults count: {report}"))?;
    let task_clock = count("task-clock").ok_or_else(|| anyhow!("no task-clock count: {report}"))?;
    // The touched pages, plus what loading the program faults (a few hundred at most).
    if !(pages..pages + 1000).contains(&faults) || task_clock == 0 {
        bail!("page-faults {faults} for {pages} touched pages, task-clock {task_clock} ns");
    }
    Ok(format!("page-faults {faults} for {pages} touched pages"))
}

/// The share of samples whose stacks must reach `main` or a thread's start, as the unwinding
/// tests ask on the host.
const COMPLETE_STACKS: f64 = 0.95;

/// The first kernel whose in-kernel unwinder walks unwind tables (`bpf_task_pt_regs`); before
/// it `--unwind dwarf` walks frame pointers.
const UNWIND_TABLES_SINCE: (u32, u32) = (5, 15);

/// The major and minor version of a kernel release (`5.10.0-32-cloud-amd64`).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut numbers = release.split(|c: char| !c.is_ascii_digit());
    Some((numbers.next()?.parse().ok()?, numbers.next()?.parse().ok()?))
}

/// `record` of no_frame_pointers (`-O2 -fomit-frame-pointer`, static: its C library keeps no
/// frame pointers either): the stacks the in-kernel unwinder walked reach `main` or
/// `start_thread` through the sort's callbacks and memcpy. The samples taken before the
/// process's tables were loaded, walked by frame pointers (here, under TCG, the first tenth of a
/// second or so), are counted apart: how soon tables load is tested on the host. Where the
/// kernel predates the unwinder, every stack is walked by frame pointers, and the share is
/// reported, not asserted.
fn check_unwind(report: &Value, _: &[String]) -> Result<String> {
    let event = &report["events"][0];
    check_accounting(event, report)?;
    // Those of the report's view: one process's, where the step's report keeps one.
    let samples = event["view_samples"]
        .as_u64()
        .or_else(|| event["samples"].as_u64())
        .unwrap_or(0);
    let complete = stacks_through(event, "main") + stacks_through(event, "start_thread");
    let by_frame_pointers = stacks_through(event, "[frame pointers only]");
    let release = report["meta"]["kernel_release"]
        .as_str()
        .unwrap_or_default();
    let version =
        kernel_version(release).ok_or_else(|| anyhow!("no kernel release in the report"))?;
    if version < UNWIND_TABLES_SINCE {
        return Ok(format!(
            "{complete} of {samples} samples reach main or start_thread, walked by frame \
             pointers (unwind tables need 5.15)"
        ));
    }
    let walked = samples.saturating_sub(by_frame_pointers);
    let said = format!(
        "{complete} of {walked} stacks walked by unwind tables reach main or start_thread \
         ({by_frame_pointers} more, taken before the tables loaded, by frame pointers)"
    );
    if walked < 100 || (complete as f64) < COMPLETE_STACKS * walked as f64 {
        bail!("{said}; at least 95% must");
    }
    Ok(said)
}

/// How far blocked time under a function may be from what the workload measured.
const OFF_CPU_TOLERANCE: f64 = 0.05;

/// `record --off-cpu --wakers` of off_cpu: the blocked time under the sleeper's and the pipe
/// reader's functions is what they measured (`wait KIND tid T count N total_ns NS ...`), and
/// the pipe reader's waits were ended by the pipe writer.
pub fn check_off_cpu(report: &Value, said: &[String]) -> Result<String> {
    check_accounting(&report["events"][0], report)?;
    let off_cpu = &report["off_cpu"];
    let measured = |kind: &str| -> Result<u64> {
        said.iter()
            .filter_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                (words.get(1) == Some(&kind)).then(|| words.get(7)?.parse::<u64>().ok())?
            })
            .next()
            .ok_or_else(|| anyhow!("off_cpu printed no {kind} waits"))
    };
    let blocked_under = |function: &str| -> u64 {
        off_cpu["by_function"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|row| row["name"] == format!("off_cpu::{function}").as_str())
            .filter_map(|row| row["total_ns"].as_u64())
            .sum()
    };
    let mut said_back = Vec::new();
    for (function, kind) in [("offcpu_sleeper", "sleep"), ("offcpu_pipe_reader", "pipe")] {
        let (blocked, waited) = (blocked_under(function), measured(kind)?);
        if (blocked as f64 - waited as f64).abs() > OFF_CPU_TOLERANCE * waited as f64 {
            bail!("{blocked} ns blocked under {function}, the workload measured {waited} ns");
        }
        said_back.push(format!("{function} {:.3} s", blocked as f64 / 1e9));
    }
    let woken_by_writer = off_cpu["by_waker"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|row| {
            row["thread"]
                .as_str()
                .is_some_and(|t| t.starts_with("pipe-reader "))
                && row["waker"]
                    .as_str()
                    .is_some_and(|w| w.starts_with("pipe-writer "))
        });
    if !woken_by_writer {
        bail!(
            "no pipe-reader wait woken by pipe-writer: {}",
            off_cpu["by_waker"]
        );
    }
    Ok(format!(
        "{} as measured ({}), reader woken by the writer",
        said_back.join(", "),
        off_cpu["attachment"].as_str().unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_releases() {
        assert_eq!(kernel_version("5.10.0-32-cloud-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("6.12.95+deb12-cloud-amd64"), Some((6, 12)));
        assert_eq!(kernel_version("6.1"), Some((6, 1)));
        assert_eq!(kernel_version("unknown"), None);
        assert!(kernel_version("5.10.0").unwrap() < UNWIND_TABLES_SINCE);
        assert!(kernel_version("6.1.0").unwrap() >= UNWIND_TABLES_SINCE);
    }

    #[test]
    fn newest_kernel_package_sorts_last() {
        let mut packages = [
            "linux-image-5.10.0-32-cloud-amd64-unsigned",
            "linux-image-5.10.0-9-cloud-amd64-unsigned",
            "linux-image-6.12.95+deb12-cloud-amd64-unsigned",
        ];
        packages.sort_by_key(|p| version_key(p));
        assert_eq!(packages[1], "linux-image-5.10.0-32-cloud-amd64-unsigned");
        assert_eq!(version_key(packages[2]), [6, 12, 95]);
    }

    #[test]
    fn a_hung_step_fails_with_the_stacks_of_its_tasks() {
        let console = "@@KERNEL 6.12.95\n@@JSON list\n{}\n@@HUNG faults\n\
                       @@TASK profiler 80/task/81 State:\tS (sleeping)\n[<0>] ep_poll+0x1\n\
                       @@TASK page_toucher 90/task/90 State:\tD (disk sleep)\n\
                       [<0>] folio_wait_bit+0x3\nsysrq: Show Blocked State\n\
                       @@FAILED faults\nrecording page-faults\n@@DONE\n";
        let guest = Guest::parse(console);
        assert_eq!(guest.hung.len(), 1);
        assert!(guest.hung["faults"]
            .contains("page_toucher 90/task/90 State:\tD (disk sleep)\n[<0>] folio_wait_bit+0x3"));
        let checks = guest.checks();
        let faults = checks.iter().find(|c| c.step == "faults").unwrap();
        assert!(!faults.passed);
        for said in [
            "hung",
            "recording page-faults",
            "ep_poll+0x1",
            "Show Blocked State",
        ] {
            assert!(faults.said.contains(said), "{said}: {}", faults.said);
        }
        let stat = checks.iter().find(|c| c.step == "stat").unwrap();
        assert_eq!(stat.said, "never ran");
    }

    #[test]
    fn the_end_of_a_console_is_its_last_lines_cut_short() {
        let console = format!(
            "{}\n\n{}\nKernel panic - not syncing: Fatal exception\n",
            "a\n".repeat(40),
            "x".repeat(500)
        );
        let end = console_end(&console);
        assert_eq!(end.lines().count(), 25);
        assert!(end.ends_with("  Kernel panic - not syncing: Fatal exception"));
        assert!(end.contains(&format!("  {}...", "x".repeat(200))));
    }

    #[test]
    fn the_console_is_read_past_terminal_escapes() {
        let console = "SeaBIOS\n\x1b[2J@@KERNEL 6.1.0-50-cloud-amd64\n@@JSON stat\n\
                       {\"events\": []}\n@@SAID stat region 0x7f00 pages 3 line 5\n\
                       @@FAILED split\nerror: no\n@@DONE\n";
        let guest = Guest::parse(console);
        assert_eq!(guest.release.as_deref(), Some("6.1.0-50-cloud-amd64"));
        assert!(guest.done);
        assert!(guest.steps["stat"].is_ok());
        assert_eq!(guest.steps["split"].as_ref().unwrap_err(), "error: no");
        assert_eq!(touched_region(&guest.said["stat"]).unwrap(), (0x7f00, 3, 5));
        let checks = guest.checks();
        assert!(checks[0].passed);
        let split = checks.iter().find(|c| c.step == "split").unwrap();
        assert!(
            !split.passed && split.said.contains("error: no"),
            "{}",
            split.said
        );
    }
}
