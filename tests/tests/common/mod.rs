//! Shared helpers of the integration tests: finding and running the profiler and the workloads.
//!
//! These tests use the real kernel: they load BPF programs and open perf events, so they need
//! root. They fail (never skip) when they cannot; only hardware-PMU tests skip, saying why.

#![allow(dead_code)] // each test binary uses a different subset

pub mod c_workload;

use std::{
    path::PathBuf,
    process::{Command, Output},
};

use serde_json::Value;

/// The profiler binary: $PROFILER_BIN (set by `cargo xtask test`), else target/release.
pub fn profiler_bin() -> PathBuf {
    let path = std::env::var_os("PROFILER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/profiler")
        });
    assert!(
        path.is_file(),
        "profiler binary not found at {}: run the tests with `cargo xtask test`, which builds it",
        path.display()
    );
    path
}

pub fn workload(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_cpu_split"))
        .parent()
        .expect("binaries live in a directory")
        .to_path_buf();
    dir.join(name)
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "integration tests load BPF programs: run them as root (sudo -E cargo xtask test)"
    );
}

/// Runs a program that must succeed (perf, gcc, a Debian tool) and returns its output.
pub fn run_checked(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{program}`: {e}; `cargo xtask setup` installs what the tests run \
             (perf: Debian's linux-perf)"
            )
        });
    assert!(
        output.status.success(),
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs the profiler, asserting success, and returns its output.
pub fn profiler(args: &[&str]) -> Output {
    require_root();
    let output = Command::new(profiler_bin())
        .args(args)
        .output()
        .expect("the profiler runs");
    assert!(
        output.status.success(),
        "profiler {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

/// Runs the profiler with `--json` and parses its report.
/// `profiler record --stats OPTIONS -o FILE -- COMMAND`: the recording's stderr (its report and
/// `--stats`).
pub fn record_to(file: &std::path::Path, options: &[&str], command: &[&str]) -> String {
    let mut args = vec!["record", "--stats"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["-o", file.to_str().unwrap(), "--"]);
    args.extend_from_slice(command);
    String::from_utf8_lossy(&profiler(&args).stderr).into_owned()
}

pub fn profiler_json(args: &[&str]) -> (Value, String) {
    let output = profiler(args);
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "the report is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    (report, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// `profiler report -i FILE --json ARGS...`, parsed.
pub fn report_json(file: &std::path::Path, args: &[&str]) -> Value {
    let mut all = vec!["report", "-i", file.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let output = profiler(&all);
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Self-sample percentage of a function in an event of a JSON report (0 when absent).
pub fn self_percent(event: &Value, function: &str) -> f64 {
    event["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .find(|f| f["function"] == function)
        .map_or(0.0, |f| f["self_percent"].as_f64().expect("a number"))
}

/// The core PMU behind the generic hardware events (`cycles`), when this machine has one: `cpu`
/// on x86, `cpu_core`/`cpu_atom` on hybrid Intel, `armv8_pmuv3_0` and the like on Arm (core
/// PMUs list the CPUs they cover in a `cpus` file; uncore PMUs do not).
pub fn core_pmu() -> Option<String> {
    let devices = std::path::Path::new("/sys/bus/event_source/devices");
    let mut names: Vec<String> = std::fs::read_dir(devices)
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name() == "cpu" || entry.path().join("cpus").is_file())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    names.sort();
    names.into_iter().next()
}

/// Whether the kernel has the PMU `name` (`ibs_op`, `cpu`...).
pub fn has_pmu(name: &str) -> bool {
    std::path::Path::new("/sys/bus/event_source/devices")
        .join(name)
        .join("type")
        .is_file()
}

/// A fresh directory for one test's files: numbered within the test binary, since tests that
/// share a helper (and its name) run in parallel and one's cleanup must not remove the other's
/// files.
pub fn temp_dir(name: &str) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "profiler-test-{name}-{}-{call}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// (region start, pages, line) that page_toucher printed on stderr:
/// `region 0x7f... pages N line L`.
pub fn touched_region(stderr: &str) -> (u64, u64, u64) {
    labelled_region(stderr, "region")
}

/// The second region page_toucher touched when given SECOND_PAGES (`second region ...`).
pub fn second_touched_region(stderr: &str) -> (u64, u64, u64) {
    labelled_region(stderr, "second region")
}

fn labelled_region(stderr: &str, label: &str) -> (u64, u64, u64) {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix(label)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("page_toucher printed no {label}:\n{stderr}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let start = u64::from_str_radix(words[0].trim_start_matches("0x"), 16).unwrap();
    (start, words[2].parse().unwrap(), words[4].parse().unwrap())
}

/// `profiler record -e page-faults -c 1 OPTIONS -o FILE -- page_toucher ARGS`: a sample on every
/// fault of a workload that touches known pages.
pub fn record_page_faults(file: &std::path::Path, options: &[&str], args: &[&str]) -> Output {
    let toucher = workload("page_toucher");
    let mut all = vec!["record", "-e", "page-faults", "-c", "1"];
    all.extend_from_slice(options);
    all.extend_from_slice(&[
        "-o",
        file.to_str().unwrap(),
        "--",
        toucher.to_str().unwrap(),
    ]);
    all.extend_from_slice(args);
    profiler(&all)
}

/// Every loss counter of a profile but those named in `explained`, asserted zero, so a new
/// kind cannot hide.
pub fn assert_no_losses(profile: &profiler::profile::Profile, explained: &[&str]) {
    let lost: Vec<_> = profile
        .losses
        .counters
        .iter()
        .filter(|(name, count)| **count > 0 && !explained.contains(&name.as_str()))
        .collect();
    assert!(lost.is_empty(), "losses: {lost:?}");
}

/// The losses of partial user stacks (cut short, or walked by frame pointers only) with their
/// counts; every other loss but those in `explained` is asserted zero, as in
/// [`assert_no_losses`]: the samples themselves are all kept.
pub fn assert_only_partial_stacks<'p>(
    profile: &'p profiler::profile::Profile,
    explained: &[&str],
) -> Vec<(&'p str, u64)> {
    let partial: Vec<(&str, u64)> = profile
        .losses
        .counters
        .iter()
        .filter(|(name, count)| {
            **count > 0
                && (name.starts_with("user stacks cut short")
                    || name.starts_with("user stacks by frame pointers only"))
        })
        .map(|(name, count)| (name.as_str(), *count))
        .collect();
    let mut allowed: Vec<&str> = partial.iter().map(|(name, _)| *name).collect();
    allowed.extend_from_slice(explained);
    assert_no_losses(profile, &allowed);
    partial
}

/// [`assert_only_partial_stacks`], with stacks cut short for at most 1% of the samples and
/// walked before the process's mappings were loaded for at most 5%: a sample early in the
/// dynamic loader's start-up may meet a return address no mapping holds yet (a new process's
/// first moments, issue 46), and one as the process exits may find no stack page left to copy.
/// For CPU-time recordings of a second or more; a page-fault recording of a short program is
/// mostly its start-up.
pub fn assert_few_cut_short(profile: &profiler::profile::Profile, explained: &[&str]) {
    let total: u64 = profile.stacks.iter().map(|stack| stack.count).sum();
    let start_up = assert_only_partial_stacks(profile, explained);
    // Walked before the process's mappings were published: its first moments, bounded apart.
    let not_loaded = |name: &str| name.ends_with("the process's mappings were not loaded yet");
    let (early, cut): (Vec<_>, Vec<_>) = start_up.iter().partition(|(name, _)| not_loaded(name));
    let sum = |losses: &[&(&str, u64)]| -> u64 { losses.iter().map(|(_, count)| count).sum() };
    assert!(
        sum(&cut) * 100 <= total,
        "{total} samples, cut short: {start_up:?}"
    );
    assert!(
        sum(&early) * 20 <= total,
        "{total} samples, walked early: {start_up:?}"
    );
}

/// cpu_split's functions, in the order it prints the split it measured.
pub const CPU_SPLIT_FUNCTIONS: [&str; 3] = ["heavy_work", "medium_work", "light_work"];

/// The split cpu_split measured with its own thread CPU clock (what it printed), in percent of
/// [`CPU_SPLIT_FUNCTIONS`]: the truth a profile is held to, even when a busy host skews it from
/// the 60/30/10 it was designed for.
pub fn cpu_split_measured(printed: &str) -> [f64; 3] {
    let line = printed
        .lines()
        .find(|line| line.contains("measured CPU split:"))
        .unwrap_or_else(|| panic!("cpu_split printed no split:\n{printed}"));
    CPU_SPLIT_FUNCTIONS.map(|name| {
        let after = line
            .split(&format!("{name} "))
            .nth(1)
            .unwrap_or_else(|| panic!("no {name} in {line}"));
        after.split('%').next().unwrap().parse().unwrap()
    })
}

/// A process a test started, killed and reaped when the test ends, passed or failed, so that a
/// failing test leaves no workload behind.
pub struct Running(pub std::process::Child);

impl Running {
    pub fn spawn(command: &mut Command) -> Running {
        Running(command.spawn().expect("the process starts"))
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Its exit status, or a panic (which still kills it) after `timeout`.
    pub fn wait_at_most(&mut self, timeout: std::time::Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait().expect("waiting for the process") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the process did not exit within {timeout:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Waits for its exit (at most `timeout`), with what it wrote to the pipes it was given.
    pub fn output_at_most(&mut self, timeout: std::time::Duration) -> Output {
        use std::io::Read as _;

        let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                if let Some(mut pipe) = pipe {
                    pipe.read_to_end(&mut bytes).ok();
                }
                bytes
            })
        };
        let stdout = drain(self.0.stdout.take().map(|p| Box::new(p) as _));
        let stderr = drain(self.0.stderr.take().map(|p| Box::new(p) as _));
        let status = self.wait_at_most(timeout);
        Output {
            status,
            stdout: stdout.join().unwrap(),
            stderr: stderr.join().unwrap(),
        }
    }

    /// Stops it with SIGTERM, as a service manager stops the agent: its log (stderr), once it
    /// exited successfully within 30 s.
    pub fn terminate(&mut self) -> String {
        self.terminate_within(std::time::Duration::from_secs(30))
    }

    /// [`Running::terminate`] for a process that may take up to `timeout` to stop.
    pub fn terminate_within(&mut self, timeout: std::time::Duration) -> String {
        self.signal(libc::SIGTERM);
        let output = self.output_at_most(timeout);
        let log = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{log}");
        log
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid, not reaped yet.
        unsafe { libc::kill(self.0.id() as i32, signal) };
    }
}

impl Running {
    /// Kills and reaps it (its pid stays known).
    pub fn stop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until the profiler `pid` is recording: its stop-signal handlers are installed (a signal
/// now cannot kill it) and its counters are open; then a little longer for them to be enabled.
pub fn wait_until_recording(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let handles_sigint = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                let hex = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
                u64::from_str_radix(hex.trim(), 16).ok()
            })
            .is_some_and(|caught| caught & (1 << (libc::SIGINT - 1)) != 0)
    };
    let has_perf_events = || {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .any(|link| link.to_string_lossy() == "anon_inode:[perf_event]")
        })
    };
    while !(handles_sigint() && has_perf_events()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the profiler (pid {pid}) did not start recording within 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
}

/// (uid, gid) of the system user `name`, created without a home or a login shell if missing:
/// the other, unprivileged user that tests run commands as.
pub fn system_user(name: &str) -> (u32, u32) {
    require_root();
    let id = |flag: &str| -> Option<u32> {
        let output = Command::new("id").args([flag, name]).output().unwrap();
        output.status.success().then(|| {
            String::from_utf8_lossy(&output.stdout)
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
            .arg(name)
            .status()
            .expect("useradd runs (Debian: apt-get install passwd)");
        // Another test may have created it meanwhile.
        assert!(
            status.success() || id("-u").is_some(),
            "useradd {name} failed"
        );
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// Google's pprof, built from Debian's packaged sources (cargo xtask setup installs them).
pub fn google_pprof() -> PathBuf {
    let binary = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/google-pprof");
    if !binary.exists() {
        let built = Command::new("go")
            .args(["build", "-o"])
            .arg(&binary)
            .arg("github.com/google/pprof")
            .env("GOPATH", "/usr/share/gocode")
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "-mod=mod")
            .output()
            .expect("go is installed (apt-get install golang-go golang-github-google-pprof-dev)");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    binary
}

/// Runs a viewer check of `tests/viewers` under node, with the npm packages `cargo xtask setup`
/// installs in target/viewers, and returns the JSON object it prints.
pub fn run_viewer(script: &str, args: &[&std::path::Path]) -> Value {
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let modules = tests.join("../target/viewers/node_modules");
    assert!(
        modules.join("playwright-core").exists(),
        "the viewers' npm packages are not in {}: run `cargo xtask setup`",
        modules.display()
    );
    let output = Command::new("node")
        .arg(tests.join("viewers").join(script))
        .arg(&modules)
        .args(args)
        .output()
        .expect("node runs (apt-get install nodejs)");
    assert!(
        output.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Whether `path` is one of the agent's `--output-dir` windows (the directory also holds the
/// agent's index of what it wrote).
pub fn is_window(path: &std::path::Path) -> bool {
    path.to_string_lossy().ends_with(".pb.gz")
}

/// A gzipped pprof file, decoded.
pub fn read_pprof(path: &std::path::Path) -> profiler::export::pprof::proto::Profile {
    use prost::Message as _;
    use std::io::Read as _;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut bytes)
        .unwrap_or_else(|e| panic!("{} is not gzipped: {e}", path.display()));
    profiler::export::pprof::proto::Profile::decode(bytes.as_slice())
        .unwrap_or_else(|e| panic!("{} is no pprof profile: {e}", path.display()))
}

/// A free local port's address for the agent's metrics.
pub fn metrics_address() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A loopback port nothing listens on now (a server started on it right after gets it).
pub fn free_port() -> u16 {
    let [port] = free_ports();
    port
}

/// `N` different loopback ports nothing listens on now: each is held until all are chosen, since
/// a port let go may be handed out again at once (a server then failed to bind its second).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [std::net::TcpListener; N] =
        std::array::from_fn(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    listeners.map(|listener| listener.local_addr().unwrap().port())
}

/// `name{labels} value` lines of a scrape whose name and labels contain every part of `parts`.
pub fn metric(scrape: &str, name: &str, parts: &[&str]) -> f64 {
    scrape
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .filter(|line| parts.iter().all(|part| line.contains(part)))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// The agent's metrics page at `addr`, as text.
pub fn scrape(addr: &str) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
    agent
        .get(format!("http://{addr}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap()
}

/// A busy program in a cgroup named as kubelet names a container's: made under `parent`, at
/// `path` below it, and removed (program first) when dropped.
pub struct PodContainer {
    pub program: Running,
    cgroups: Vec<std::path::PathBuf>,
}

impl PodContainer {
    pub fn start(parent: &std::path::Path, path: &str) -> PodContainer {
        let leaf = parent.join(path);
        std::fs::create_dir_all(&leaf).unwrap();
        // Every directory made, innermost first, for removal.
        let cgroups = leaf
            .ancestors()
            .take_while(|dir| dir.starts_with(parent))
            .map(std::path::Path::to_path_buf)
            .collect();
        let program = Running::spawn(
            std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(format!(
                    "echo $$ > {}/cgroup.procs && exec {} 40000",
                    leaf.display(),
                    workload("cpu_split").display()
                ))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        );
        PodContainer { program, cgroups }
    }
}

impl Drop for PodContainer {
    fn drop(&mut self) {
        self.program.stop();
        for dir in &self.cgroups {
            std::fs::remove_dir(dir).ok();
        }
    }
}

/// The task config.json containerd keeps under `node_root` for container `id` of a pod: the CRI
/// annotations that name it (`namespace`, `pod`, `container`, and the pod's `uid`).
pub fn write_containerd_task(
    node_root: &std::path::Path,
    id: &str,
    uid: &str,
    [namespace, pod, container]: [&str; 3],
) {
    write_file(
        &node_root
            .join("run/containerd/io.containerd.runtime.v2.task/k8s.io")
            .join(id)
            .join("config.json"),
        &format!(
            r#"{{"ociVersion":"1.2.0","annotations":{{
                "io.kubernetes.cri.container-type":"container",
                "io.kubernetes.cri.container-name":"{container}",
                "io.kubernetes.cri.sandbox-name":"{pod}",
                "io.kubernetes.cri.sandbox-namespace":"{namespace}",
                "io.kubernetes.cri.sandbox-uid":"{uid}"}}}}"#
        ),
    );
}

pub fn write_file(path: &std::path::Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}
