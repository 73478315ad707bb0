//! The agent beside the OpenTelemetry eBPF profiler (the profiler Parca and Grafana Alloy ship),
//! each reporting into a real OpenTelemetry Collector, on the same load: the churn load (a CPU
//! loop and a stream of short processes) with a JVM, node, python3 and xz running. At the OTel
//! profiler's default 20 Hz, at 99 Hz and at 997 Hz, in interleaved rounds (the order of the two
//! swapped each round): each tool's CPU (wait4 on its process tree, and the steady share over
//! whole windows past the first), peak RSS (VmHWM), the memory of its BPF maps (their `memlock`, read
//! from the descriptors it holds), the samples per second the Collector received from it, and
//! whether the Python functions of the python3 load were named.
//!
//! Each tool reports into the Collector release of its own OTLP profiles wire format: the agent
//! (opentelemetry-proto 1.10) into 0.161, the eBPF profiler (pdata 1.46) into 0.140; the
//! Collector's file exporter writes what it received as JSON, read here without a schema (the
//! two releases name fields alike). Both run at their defaults otherwise: the agent's 10 s
//! windows, the profiler's 5 s reports.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

use super::{
    agent_cost::{steady_span, Load, RunningLoad, Runtimes},
    measure,
    summary::Spread,
    tools::path_arg,
};

/// The rates: the OTel profiler's default, the fleet's usual 99 Hz, and `record`'s 997 Hz.
pub const RATES_HZ: [u64; 3] = [20, 99, 997];

/// A function of the python3 load (`sum(i * i for i in range(1000))`): a profiler that names
/// Python frames names it.
const PYTHON_FUNCTION: &str = "<genexpr>";

/// One tool at one rate, over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct FleetRow {
    pub tool: &'static str,
    pub rate_hz: u64,
    pub duration_s: u64,
    /// Over the rounds that ran to their end (none: every round crashed).
    pub cpu_percent_of_core: Option<Spread>,
    pub steady_percent_of_core: Option<Spread>,
    pub max_rss_mib: Option<Spread>,
    pub bpf_map_mib: Option<Spread>,
    pub samples_per_s: Option<Spread>,
    /// Rounds whose output named the python3 load's Python function.
    pub python_named_rounds: usize,
    pub rounds: usize,
    /// How each round that did not run to its end ended (the peer's; ours failing fails the
    /// bench).
    pub crashes: Vec<String>,
    pub commands: Vec<String>,
}

/// One run's figures.
struct FleetRun {
    command: String,
    cpu_percent: f64,
    steady_percent: f64,
    max_rss_mib: f64,
    bpf_map_mib: f64,
    samples_per_s: f64,
    python_named: bool,
}

/// A tool's command line at a rate, for a run of so many seconds, reporting into a Collector.
type CommandLine = Box<dyn Fn(u64, u64, &Collector) -> Vec<String>>;

/// The two tools, how each is started, and which Collector it reports into.
struct Tool {
    name: &'static str,
    /// Whether a run of it that fails is the bench's failure (ours), or a figure (the peer's).
    ours: bool,
    collector: PathBuf,
    argv: CommandLine,
}

/// Both tools at every rate of `rates_hz`, `rounds` rounds of `duration_s` seconds each.
pub fn measure(
    profiler: &Path,
    release: &Path,
    work: &Path,
    duration_s: u64,
    rounds: usize,
) -> Result<Vec<FleetRow>> {
    let (ebpf_profiler, peer_collector) = crate::backends::build_ebpf_profiler()?;
    crate::backends::build()?;
    let collector = crate::target_dir().join("backends/otelcol");
    let keep_memlock = build_keep_memlock(work)?;
    let profiler = path_arg(profiler);
    let tools = [
        Tool {
            name: "profiler agent",
            ours: true,
            collector,
            argv: Box::new(move |rate_hz, duration_s, collector: &Collector| {
                let mut argv = timeout(duration_s);
                argv.extend(
                    [&profiler, "agent", "-F", &rate_hz.to_string(), "--otlp"].map(str::to_string),
                );
                argv.push(format!("http://{}", collector.http));
                argv.extend(["--log-level", "warn"].map(str::to_string));
                argv
            }),
        },
        Tool {
            name: "OpenTelemetry eBPF profiler",
            ours: false,
            collector: peer_collector,
            argv: Box::new(move |rate_hz, duration_s, collector: &Collector| {
                let mut argv = timeout(duration_s);
                argv.push(path_arg(&keep_memlock));
                argv.extend(
                    [
                        &path_arg(&ebpf_profiler),
                        "-collection-agent",
                        &collector.grpc,
                        "-disable-tls",
                        "-samples-per-second",
                        &rate_hz.to_string(),
                    ]
                    .map(str::to_string),
                );
                argv
            }),
        },
    ];
    let _load = RunningLoad::start(release, Load::Churn)?;
    let runs_s = (RATES_HZ.len() * rounds * tools.len()) as u64 * (duration_s + 5);
    let (_runtimes, _) = Runtimes::start(work, runs_s + 10)?;
    // The runtimes start before the first run, as a host's services do.
    std::thread::sleep(Duration::from_secs(2));
    let mut rows = Vec::new();
    for rate_hz in RATES_HZ {
        let mut runs: Vec<Vec<Result<FleetRun, String>>> =
            tools.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..tools.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for index in order {
                let tool = &tools[index];
                let run = run(tool, rate_hz, duration_s, work)
                    .with_context(|| format!("{} at {rate_hz} Hz", tool.name));
                runs[index].push(match run {
                    Ok(run) => Ok(run),
                    Err(error) if !tool.ours => Err(crash_summary(&error)),
                    Err(error) => return Err(error),
                });
            }
        }
        for (tool, runs) in tools.iter().zip(runs) {
            rows.push(summarize(tool.name, rate_hz, duration_s, &runs));
        }
    }
    Ok(rows)
}

fn timeout(duration_s: u64) -> Vec<String> {
    [
        "timeout",
        "--preserve-status",
        "-s",
        "TERM",
        &duration_s.to_string(),
    ]
    .map(str::to_string)
    .to_vec()
}

/// What a crashed run's error says: its command's end, and the Go runtime's fatal error or
/// panic where its stderr has one.
fn crash_summary(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    let status = text
        .split(" failed (")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or("failed");
    let cause = text
        .lines()
        .find(|line| line.starts_with("fatal error") || line.starts_with("panic:"))
        .or_else(|| {
            text.lines()
                .find(|line| line.contains(".(*") || line.contains("maps.fatal"))
        })
        .unwrap_or("");
    format!("{status} {}", cause.trim()).trim().to_string()
}

fn summarize(
    tool: &'static str,
    rate_hz: u64,
    duration_s: u64,
    runs: &[Result<FleetRun, String>],
) -> FleetRow {
    let ran: Vec<&FleetRun> = runs.iter().filter_map(|run| run.as_ref().ok()).collect();
    let spread = |figure: fn(&FleetRun) -> f64| Spread::of(ran.iter().map(|run| figure(run)));
    FleetRow {
        tool,
        rate_hz,
        duration_s,
        cpu_percent_of_core: spread(|run| run.cpu_percent),
        steady_percent_of_core: spread(|run| run.steady_percent),
        max_rss_mib: spread(|run| run.max_rss_mib),
        bpf_map_mib: spread(|run| run.bpf_map_mib),
        samples_per_s: spread(|run| run.samples_per_s),
        python_named_rounds: ran.iter().filter(|run| run.python_named).count(),
        rounds: runs.len(),
        crashes: runs
            .iter()
            .filter_map(|run| run.as_ref().err().cloned())
            .collect(),
        commands: ran.iter().map(|run| run.command.clone()).collect(),
    }
}

/// One run of `tool` into a Collector of its own.
fn run(tool: &Tool, rate_hz: u64, duration_s: u64, work: &Path) -> Result<FleetRun> {
    let output = work.join(format!("fleet-{rate_hz}.json"));
    let _ = std::fs::remove_file(&output);
    let collector = Collector::start(&tool.collector, work, &output)?;
    let argv = (tool.argv)(rate_hz, duration_s, &collector);
    let (steady_from, steady_to) = steady_span(duration_s);
    // The last reading just before the tool is stopped: its peak memory so far.
    let last = Duration::from_millis(duration_s * 1000 - 500);
    let (measured, readings) =
        measure::run_with_checkpoints(&argv, None, &[steady_from, steady_to, last], |root| {
            (
                measure::tree_cpu_s(root),
                tree_bpf_map_bytes(root),
                tree_peak_rss_kib(root),
            )
        })?;
    // What the tool sent on its way out reaches the file before the Collector stops.
    std::thread::sleep(Duration::from_secs(2));
    drop(collector);
    let delivered = Delivered::read(&output)?;
    let steady_s = (steady_to - steady_from).as_secs_f64();
    Ok(FleetRun {
        command: measured.command,
        cpu_percent: 100.0 * measured.cpu_s / duration_s as f64,
        steady_percent: 100.0 * (readings[1].0 - readings[0].0) / steady_s,
        max_rss_mib: readings.iter().map(|reading| reading.2).max().unwrap_or(0) as f64 / 1024.0,
        bpf_map_mib: readings[1].1 as f64 / (1 << 20) as f64,
        samples_per_s: delivered.samples as f64 / duration_s as f64,
        python_named: delivered.strings.contains(PYTHON_FUNCTION),
    })
}

/// A Collector on loopback taking OTLP over gRPC and HTTP, writing what it takes as JSON lines.
struct Collector {
    child: Child,
    grpc: String,
    http: String,
}

impl Collector {
    fn start(binary: &Path, work: &Path, output: &Path) -> Result<Collector> {
        // Both held until both are chosen: a port let go at once may be handed out again for
        // the second (the Collector then failed to bind its HTTP receiver).
        let listeners = [
            std::net::TcpListener::bind("127.0.0.1:0")?,
            std::net::TcpListener::bind("127.0.0.1:0")?,
        ];
        let [grpc, http] = [&listeners[0], &listeners[1]]
            .map(|listener| listener.local_addr().map(|address| address.to_string()));
        let (grpc, http) = (grpc?, http?);
        drop(listeners);
        let config = work.join("fleet-collector.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: {grpc}\n      \
                 http:\n        endpoint: {http}\nexporters:\n  file:\n    path: {}\n    \
                 format: json\nservice:\n  telemetry:\n    metrics:\n      level: none\n  \
                 pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
                output.display()
            ),
        )?;
        let child = Command::new(binary)
            .arg("--config")
            .arg(&config)
            .arg("--feature-gates=service.profilesSupport")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let collector = Collector { child, grpc, http };
        for _ in 0..300 {
            if std::net::TcpStream::connect(&collector.grpc).is_ok()
                && std::net::TcpStream::connect(&collector.http).is_ok()
            {
                return Ok(collector);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the Collector {} did not listen in 30 s", binary.display())
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        // SIGTERM: it flushes its file exporter and exits.
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..100 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the Collector wrote: samples (a sample's timestamps where it lists one per event, else
/// its values, else one), and every string of the dictionaries.
struct Delivered {
    samples: u64,
    strings: BTreeSet<String>,
}

impl Delivered {
    /// A request (a line) at a time.
    fn read(output: &Path) -> Result<Delivered> {
        use std::io::BufRead;

        let mut delivered = Delivered {
            samples: 0,
            strings: BTreeSet::new(),
        };
        let Ok(file) = std::fs::File::open(output) else {
            return Ok(delivered);
        };
        for line in std::io::BufReader::new(file).lines() {
            let line = line.with_context(|| format!("reading {}", output.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            let request: Value = serde_json::from_str(&line)
                .with_context(|| format!("a line of {} is not JSON", output.display()))?;
            delivered.walk(&request);
        }
        Ok(delivered)
    }

    fn walk(&mut self, value: &Value) {
        match value {
            Value::Object(fields) => {
                for (key, field) in fields {
                    match (key.as_str(), field) {
                        ("samples" | "sample", Value::Array(samples)) => {
                            self.samples += samples.iter().map(sample_count).sum::<u64>();
                        }
                        ("stringTable", Value::Array(strings)) => self.strings.extend(
                            strings
                                .iter()
                                .filter_map(|s| s.as_str().map(str::to_string)),
                        ),
                        _ => self.walk(field),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| self.walk(item)),
            _ => {}
        }
    }
}

/// Events one OTLP sample stands for.
fn sample_count(sample: &Value) -> u64 {
    let number = |value: &Value| match value {
        Value::String(text) => text.parse::<u64>().unwrap_or(0),
        other => other.as_u64().unwrap_or(0),
    };
    let list = |name: &str| sample.get(name).and_then(Value::as_array);
    if let Some(timestamps) = list("timestampsUnixNano").filter(|t| !t.is_empty()) {
        return timestamps.len() as u64;
    }
    match list("values").or_else(|| list("value")) {
        Some(values) if !values.is_empty() => values.iter().map(number).sum(),
        _ => 1,
    }
}

/// The largest peak RSS (VmHWM) of the processes in the tree under `root`. Not wait4's: a
/// process's maximum RSS there starts from its parent's at the fork and exec that made it, and
/// this bench reads large Collector outputs between runs.
fn tree_peak_rss_kib(root: u32) -> u64 {
    measure::process_tree(root)
        .into_iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

/// The `memlock` of every BPF map the process tree under `root` holds a descriptor of, each
/// map once.
fn tree_bpf_map_bytes(root: u32) -> u64 {
    let mut maps = std::collections::BTreeMap::new();
    for pid in measure::process_tree(root) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let is_map = std::fs::read_link(fd.path())
                .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf-map");
            if !is_map {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let field = |name: &str| {
                info.lines()
                    .find_map(|line| line.strip_prefix(name))
                    .and_then(|value| value.trim().parse::<u64>().ok())
            };
            if let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) {
                maps.insert(id, memlock);
            }
        }
    }
    maps.values().sum()
}

/// bench/keep_memlock.c, built into the work directory: the eBPF profiler raises its
/// RLIMIT_MEMLOCK before loading, and fails where the hard limit is low and CAP_SYS_RESOURCE is
/// not held (these machines: 8 MiB); since 5.11 the kernel charges BPF maps to the memory cgroup
/// and reads no memlock limit, so answering "done" changes nothing it does.
fn build_keep_memlock(work: &Path) -> Result<PathBuf> {
    let source = crate::workspace_root().join("bench/keep_memlock.c");
    let binary = work.join("keep_memlock");
    crate::run_command(
        Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&binary)
            .arg(&source),
    )?;
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_counts_its_timestamps_else_its_values_else_one() {
        let count = |text: &str| sample_count(&serde_json::from_str(text).unwrap());
        assert_eq!(
            count(r#"{"timestampsUnixNano": ["1", "2", "3"], "values": ["9"]}"#),
            3
        );
        assert_eq!(count(r#"{"values": ["4"]}"#), 4);
        assert_eq!(count(r#"{"value": [2, 5]}"#), 7);
        assert_eq!(count(r#"{"stackIndex": 3}"#), 1);
    }

    #[test]
    fn delivered_samples_and_strings_are_found_at_any_depth() {
        let mut delivered = Delivered {
            samples: 0,
            strings: BTreeSet::new(),
        };
        let request = serde_json::json!({
            "resourceProfiles": [{"scopeProfiles": [{"profiles": [
                {"samples": [{"values": ["2"]}, {"timestampsUnixNano": ["1"]}]},
                {"samples": [{}]}
            ]}]}],
            "dictionary": {"stringTable": ["", "<genexpr>"]}
        });
        delivered.walk(&request);
        assert_eq!(delivered.samples, 4);
        assert!(delivered.strings.contains(PYTHON_FUNCTION));
    }

    #[test]
    fn a_crash_is_told_by_its_status_and_the_runtimes_own_words() {
        let error = anyhow::anyhow!(
            "`timeout 30 ebpf-profiler` failed (wait status 0x200); its stderr:\n\
             fatal error: concurrent map read and map write\n...\ngoroutine 59 [running]:"
        );
        assert_eq!(
            crash_summary(&error),
            "wait status 0x200 fatal error: concurrent map read and map write"
        );
    }
}
