//! The agent against the real servers, not the stand-in: Grafana Pyroscope and the OpenTelemetry
//! Collector, at the versions `cargo xtask setup` builds from the Go module proxy into
//! target/backends (xtask/src/backends.rs). Pyroscope stores the agent's pushes and answers
//! queries for them (its Connect API, as Grafana asks it), across a restart of the server in
//! the middle of the run; the Collector takes the agent's OTLP profiles and writes them out
//! with its file exporter. Both are checked against the agent's own windows (`--output-dir`):
//! the workload's split, its labels or resource attributes, sample types and units, and the
//! off-CPU series; and both get a Kubernetes pod's container by its names.

mod common;
mod receiver;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{
    cpu_split_measured, free_port, free_ports, is_window, metric, metrics_address, profiler_bin,
    read_pprof, require_root, scrape, temp_dir, wait_until_recording, workload,
    write_containerd_task, PodContainer, Running, CPU_SPLIT_FUNCTIONS,
};
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;
use serde_json::{json, Value};

/// About 12 s of CPU.
const ROUNDS: &str = "32000";

/// target/backends/`name`, which `cargo xtask setup` builds.
fn backend(name: &str) -> PathBuf {
    let binary = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/backends")
        .join(name);
    assert!(
        binary.is_file(),
        "{} is missing: `cargo xtask setup` builds it from the Go module proxy",
        binary.display()
    );
    binary
}

/// Samples through each of cpu_split's functions, and in all, as one source tells them.
#[derive(Debug, Default)]
struct Split {
    through: BTreeMap<&'static str, i64>,
    total: i64,
}

impl Split {
    fn add(&mut self, frames: &[String], value: i64) {
        self.total += value;
        for function in CPU_SPLIT_FUNCTIONS {
            if frames.iter().any(|frame| frame.ends_with(function)) {
                *self.through.entry(function).or_default() += value;
            }
        }
    }

    fn percent(&self, function: &str) -> f64 {
        100.0 * self.through.get(function).copied().unwrap_or(0) as f64 / self.total.max(1) as f64
    }

    /// Within `points` of `other`'s shares, and within 5 points of the split the work measured
    /// itself.
    fn assert_matches(&self, other: &Split, measured: [f64; 3], points: f64, what: &str) {
        for (function, measured) in CPU_SPLIT_FUNCTIONS.into_iter().zip(measured) {
            let (ours, theirs) = (self.percent(function), other.percent(function));
            assert!(
                (ours - theirs).abs() <= points,
                "{what}: {function} {ours:.1}% against the agent's windows' {theirs:.1}%"
            );
            assert!(
                (ours - measured).abs() <= 5.0,
                "{what}: {function} {ours:.1}%, the work measured {measured:.1}%"
            );
        }
    }
}

/// The agent's own windows in `dir`: samples of process `pid`, through each function.
fn windows_split(dir: &Path, pid: u32) -> Split {
    let mut split = Split::default();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !is_window(&path) {
            continue;
        }
        let profile = read_pprof(&path);
        let text = |index: i64| profile.string_table[index as usize].clone();
        let is_samples =
            |t: &profiler::export::pprof::proto::ValueType| text(t.r#type) == "cpu_clock_sample";
        let Some(column) = profile.sample_type.iter().position(is_samples) else {
            continue;
        };
        for sample in &profile.sample {
            let of_pid = sample
                .label
                .iter()
                .any(|label| text(label.key) == "pid" && label.num == i64::from(pid));
            if !of_pid || sample.value[column] == 0 {
                continue;
            }
            let frames: Vec<String> = (sample.location_id.iter())
                .flat_map(|id| &profile.location[*id as usize - 1].line)
                .map(|line| text(profile.function[line.function_id as usize - 1].name))
                .collect();
            split.add(&frames, sample.value[column]);
        }
    }
    split
}

/// What [`run_agent_beside_cpu_split`] leaves.
struct AgentRun {
    /// The agent's own windows (`--output-dir`).
    windows: PathBuf,
    /// What `before_the_end` returned.
    scraped: String,
    log: String,
    /// cpu_split's.
    pid: u32,
    /// The split cpu_split measured itself.
    measured: [f64; 3],
}

/// The agent at 499 Hz with 1 s windows, off-CPU time, a spool and `--output-dir` in `dir`, and
/// `args`, while cpu_split runs: `midway` is called 3 s into the workload, `before_the_end` 5 s
/// after it (past the spool's retry backoff), before SIGTERM stops the agent.
fn run_agent_beside_cpu_split(
    dir: &Path,
    args: &[&str],
    midway: impl FnOnce(),
    before_the_end: impl FnOnce() -> String,
) -> AgentRun {
    let windows = dir.join("windows");
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", "499", "--interval", "1", "--off-cpu"])
            .args(args)
            .arg("--spool-dir")
            .arg(dir.join("spool"))
            .arg("--output-dir")
            .arg(&windows)
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    let mut cpu_split = Running::spawn(
        Command::new(workload("cpu_split"))
            .arg(ROUNDS)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    std::thread::sleep(Duration::from_secs(3));
    midway();
    let output = cpu_split.output_at_most(Duration::from_secs(120));
    assert!(output.status.success());
    let measured = cpu_split_measured(&String::from_utf8_lossy(&output.stderr));
    std::thread::sleep(Duration::from_secs(5));
    let scraped = before_the_end();
    AgentRun {
        windows,
        scraped,
        log: agent.terminate(),
        pid: cpu_split.id(),
        measured,
    }
}

/// A Pyroscope server on loopback, its data in `dir`.
struct Pyroscope {
    server: Running,
    dir: PathBuf,
    ports: [u16; 3],
}

impl Pyroscope {
    fn start(dir: &Path) -> Pyroscope {
        Pyroscope::start_on(dir, free_ports())
    }

    fn start_on(dir: &Path, ports: [u16; 3]) -> Pyroscope {
        let [http, grpc, memberlist] = ports;
        let mut command = Command::new(backend("pyroscope"));
        command
            .arg(format!("-server.http-listen-port={http}"))
            .arg(format!("-server.grpc-listen-port={grpc}"))
            .arg(format!("-memberlist.bind-port={memberlist}"))
            .arg(format!(
                "-pyroscopedb.data-path={}",
                dir.join("head").display()
            ))
            .arg(format!(
                "-storage.filesystem.dir={}",
                dir.join("blocks").display()
            ))
            .args([
                "-server.http-listen-address=127.0.0.1",
                "-server.grpc-listen-address=127.0.0.1",
                "-memberlist.bind-addr=127.0.0.1",
                "-memberlist.advertise-addr=127.0.0.1",
                "-query-frontend.instance-addr=127.0.0.1",
                "-ingester.lifecycler.addr=127.0.0.1",
                "-ingester.min-ready-duration=0s",
                "-storage.backend=filesystem",
                "-self-profiling.disable-push=true",
                "-usage-stats.enabled=false",
                "-log.level=warn",
            ]);
        // Every ring advertises loopback, not the machine's address.
        for ring in [
            "compactor.ring",
            "distributor.ring",
            "overrides-exporter.ring",
            "query-scheduler.ring",
            "store-gateway.sharding-ring",
        ] {
            command.arg(format!("-{ring}.instance-addr=127.0.0.1"));
        }
        let server = Running::spawn(
            command
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let pyroscope = Pyroscope {
            server,
            dir: dir.to_path_buf(),
            ports,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        while !pyroscope.ready() {
            assert!(Instant::now() < deadline, "Pyroscope not ready in 90 s");
            std::thread::sleep(Duration::from_millis(250));
        }
        pyroscope
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[0])
    }

    fn ready(&self) -> bool {
        ureq::get(format!("{}/ready", self.url()))
            .call()
            .is_ok_and(|response| response.status() == 200)
    }

    /// Stopped as a service manager stops it (SIGTERM: it flushes what it holds), and after
    /// `down` started again on the same data and ports.
    fn restart(mut self, down: Duration) -> Pyroscope {
        self.server.terminate_within(Duration::from_secs(60));
        std::thread::sleep(down);
        Pyroscope::start_on(&self.dir, self.ports)
    }

    /// A Connect call with a JSON body, as Grafana makes it.
    fn query(&self, method: &str, body: Value) -> Value {
        let url = format!("{}/querier.v1.QuerierService/{method}", self.url());
        let mut response = ureq::post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap()
    }

    /// The last ten minutes, as Grafana's range is given: milliseconds.
    fn range() -> (u64, u64) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        (now - 600_000, now + 60_000)
    }

    /// The profile of `profile_type` merged over every series `selector` selects.
    fn merged(&self, profile_type: &str, selector: &str) -> Value {
        let (start, end) = Pyroscope::range();
        self.query(
            "SelectMergeProfile",
            json!({"profileTypeID": profile_type, "labelSelector": selector,
                   "start": start, "end": end}),
        )
    }

    fn split(&self, profile_type: &str, selector: &str) -> Split {
        let profile = self.merged(profile_type, selector);
        let number = |value: &Value| match value {
            Value::String(text) => text.parse::<i64>().unwrap(),
            other => other.as_i64().unwrap_or(0),
        };
        let strings: Vec<String> =
            serde_json::from_value(profile["stringTable"].clone()).unwrap_or_default();
        let functions: BTreeMap<i64, String> = (profile["function"].as_array().into_iter())
            .flatten()
            .map(|f| {
                (
                    number(&f["id"]),
                    strings[number(&f["name"]) as usize].clone(),
                )
            })
            .collect();
        let locations: BTreeMap<i64, Vec<String>> = (profile["location"].as_array().into_iter())
            .flatten()
            .map(|l| {
                let names = (l["line"].as_array().into_iter())
                    .flatten()
                    .map(|line| functions[&number(&line["functionId"])].clone())
                    .collect();
                (number(&l["id"]), names)
            })
            .collect();
        let mut split = Split::default();
        for sample in profile["sample"].as_array().into_iter().flatten() {
            let frames: Vec<String> = (sample["locationId"].as_array().into_iter())
                .flatten()
                .flat_map(|id| locations[&number(id)].clone())
                .collect();
            split.add(&frames, number(&sample["value"][0]));
        }
        split
    }

    fn profile_types(&self) -> Vec<String> {
        let (start, end) = Pyroscope::range();
        let answer = self.query("ProfileTypes", json!({"start": start, "end": end}));
        (answer["profileTypes"].as_array().into_iter())
            .flatten()
            .map(|t| t["ID"].as_str().unwrap().to_string())
            .collect()
    }

    fn label_values(&self, name: &str, selector: &str) -> Vec<String> {
        let (start, end) = Pyroscope::range();
        let answer = self.query(
            "LabelValues",
            json!({"name": name, "matchers": [selector], "start": start, "end": end}),
        );
        serde_json::from_value(answer["names"].clone()).unwrap_or_default()
    }
}

#[test]
fn pyroscope_stores_and_answers_every_window_across_a_restart_of_the_server() {
    require_root();
    let dir = temp_dir("real-pyroscope");
    let pyroscope = Pyroscope::start(&dir);
    let metrics_addr = metrics_address();
    let mut pyroscope = Some(pyroscope);
    let run = run_agent_beside_cpu_split(
        &dir,
        &[
            "--service-name",
            "=real-pyroscope",
            "--metrics-addr",
            &metrics_addr,
            "--pyroscope",
            &pyroscope.as_ref().unwrap().url(),
        ],
        // Windows closed while the server is down or starting go to the spool, and from there
        // to the server once it is back.
        || {
            let restarted = pyroscope
                .take()
                .unwrap()
                .restart(Duration::from_millis(2500));
            pyroscope = Some(restarted);
        },
        // Past the retry backoff, the spool has gone.
        || scrape(&metrics_addr),
    );
    let (pyroscope, scraped, log, pid, measured) = (
        pyroscope.unwrap(),
        run.scraped,
        run.log,
        run.pid,
        run.measured,
    );
    let backend = format!("--pyroscope {}", pyroscope.url());
    let windows_that = |what: &str| {
        metric(
            &scraped,
            "profiler_backend_windows_total",
            &[&backend, &format!("\"{what}\"")],
        )
    };
    assert!(windows_that("spooled") >= 1.0, "{scraped}");
    assert_eq!(windows_that("dropped"), 0.0, "{scraped}");

    let ours = windows_split(&run.windows, pid);
    assert!(ours.total > 2000, "{ours:?}");
    let selector = format!("{{service_name=\"real-pyroscope\",pid=\"{pid}\"}}");
    // The spool's windows arrive after the backoff: wait until the server has them all.
    let deadline = Instant::now() + Duration::from_secs(60);
    let stored = loop {
        let stored = pyroscope.split("process_cpu:samples:count:cpu:nanoseconds", &selector);
        if stored.total >= ours.total || Instant::now() > deadline {
            break stored;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    assert_eq!(
        stored.total, ours.total,
        "Pyroscope holds {} of the {} samples the agent's windows have\n{log}",
        stored.total, ours.total
    );
    stored.assert_matches(&ours, measured, 2.0, "Pyroscope's samples");
    // CPU time: the same split, in nanoseconds.
    let time = pyroscope.split("process_cpu:cpu:nanoseconds:cpu:nanoseconds", &selector);
    time.assert_matches(&ours, measured, 2.0, "Pyroscope's CPU time");
    assert!(time.total > stored.total * 1_000_000, "{time:?}");

    let types = pyroscope.profile_types();
    for wanted in [
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "process_cpu:samples:count:cpu:nanoseconds",
        "off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds",
    ] {
        assert!(types.iter().any(|t| t == wanted), "{wanted} in {types:?}");
    }
    let blocked = pyroscope.split(
        "off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds",
        "{service_name=\"real-pyroscope\"}",
    );
    assert!(blocked.total > 0, "no off-CPU time stored");

    // The agent's own files (`--output-dir`), uploaded as a user would (`/ingest`, pprof):
    // Pyroscope takes them (no `-` in their sample types) and holds the same samples and split.
    for entry in std::fs::read_dir(&run.windows).unwrap() {
        let path = entry.unwrap().path();
        if !is_window(&path) {
            continue;
        }
        let url = format!(
            "{}/ingest?name=uploaded-windows&format=pprof",
            pyroscope.url()
        );
        let answer = ureq::post(&url).send(std::fs::read(&path).unwrap());
        assert!(answer.is_ok(), "{} refused: {answer:?}", path.display());
    }
    // Numeric labels (pid) are not series labels there; the command's name is.
    let uploaded = pyroscope.split(
        "process_cpu:cpu_clock_sample:count:cpu-clock:nanoseconds",
        "{service_name=\"uploaded-windows\",comm=\"cpu_split\"}",
    );
    assert_eq!(uploaded.total, ours.total, "uploaded windows: {uploaded:?}");
    uploaded.assert_matches(&ours, measured, 2.0, "the uploaded windows");

    let of_workload = format!("{{pid=\"{pid}\"}}");
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for (label, value) in [
        ("service_name", "real-pyroscope"),
        ("executable", "cpu_split"),
        ("host", hostname.trim()),
        ("pid", &pid.to_string()),
    ] {
        let values = pyroscope.label_values(label, &of_workload);
        assert_eq!(values, [value], "{label}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The OpenTelemetry Collector on loopback: OTLP/HTTP in, its file exporter out (each export
/// request as protobuf, length-prefixed).
struct Collector {
    _server: Running,
    url: String,
    output: PathBuf,
}

impl Collector {
    fn start(dir: &Path) -> Collector {
        let port = free_port();
        let output = dir.join("profiles.pb");
        let config = dir.join("collector.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: \
                 127.0.0.1:{port}\nexporters:\n  file:\n    path: {}\n    format: proto\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    \
                 profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
                output.display()
            ),
        )
        .unwrap();
        let server = Running::spawn(
            Command::new(backend("otelcol"))
                .arg("--config")
                .arg(&config)
                // OTLP profiles are still a development signal in the Collector.
                .arg("--feature-gates=service.profilesSupport")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the Collector did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        Collector {
            _server: server,
            url: format!("http://127.0.0.1:{port}"),
            output,
        }
    }

    /// What the file exporter wrote: each request, checked against OTLP's invariants.
    fn exported(&self) -> Vec<ExportProfilesServiceRequest> {
        let bytes = std::fs::read(&self.output).unwrap_or_default();
        let mut requests = Vec::new();
        let mut rest = &bytes[..];
        while rest.len() >= 4 {
            let length = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            let request = ExportProfilesServiceRequest::decode(&rest[4..4 + length]).unwrap();
            receiver::check_otlp_request(&request).unwrap();
            requests.push(request);
            rest = &rest[4 + length..];
        }
        assert!(rest.is_empty(), "a request cut short");
        requests
    }
}

/// An OTLP resource's attribute as text. The Collector writes keys and string values as
/// indices into the dictionary's strings (OTLP 1.10's `key_strindex`, `string_value_strindex`,
/// for profiles), where the agent sends them as text: either is read.
fn attribute(
    resource: &opentelemetry_proto::tonic::resource::v1::Resource,
    strings: &[String],
    key: &str,
) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Kind;
    let named = |attribute: &&opentelemetry_proto::tonic::common::v1::KeyValue| {
        attribute.key == key
            || (attribute.key.is_empty() && strings[attribute.key_strindex as usize] == key)
    };
    let value = resource.attributes.iter().find(named)?.value.as_ref()?;
    match value.value.as_ref()? {
        Kind::StringValue(text) => Some(text.clone()),
        Kind::StringValueStrindex(index) => Some(strings[*index as usize].clone()),
        Kind::IntValue(number) => Some(number.to_string()),
        other => Some(format!("{other:?}")),
    }
}

#[test]
fn the_otel_collector_takes_and_writes_out_the_agents_otlp_profiles() {
    require_root();
    let dir = temp_dir("real-collector");
    let collector = Collector::start(&dir);
    let run = run_agent_beside_cpu_split(
        &dir,
        &[
            "--service-name",
            "=real-collector",
            "--otlp",
            &collector.url,
        ],
        || {},
        String::new,
    );
    assert!(!run.log.contains("refused"), "{}", run.log);
    let (ours, pid) = (windows_split(&run.windows, run.pid), run.pid);
    let requests = collector.exported();
    assert!(requests.len() >= 5, "{} requests", requests.len());
    let mut written = Split::default();
    let mut types = std::collections::BTreeSet::new();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for request in &requests {
        let tables = request.dictionary.as_ref().unwrap();
        let text = |index: i32| tables.string_table[index as usize].clone();
        for resource_profiles in &request.resource_profiles {
            let resource = resource_profiles.resource.as_ref().unwrap();
            let profiles = resource_profiles
                .scope_profiles
                .iter()
                .flat_map(|s| &s.profiles);
            for profile in profiles {
                let sample_type = profile.sample_type.as_ref().unwrap();
                let value_type = (
                    text(sample_type.type_strindex),
                    text(sample_type.unit_strindex),
                );
                types.insert(value_type.clone());
                if attribute(resource, &tables.string_table, "process.pid") != Some(pid.to_string())
                    || value_type != ("samples".to_string(), "count".to_string())
                {
                    continue;
                }
                assert_eq!(
                    attribute(resource, &tables.string_table, "service.name").as_deref(),
                    Some("real-collector")
                );
                assert_eq!(
                    attribute(resource, &tables.string_table, "process.executable.name").as_deref(),
                    Some("cpu_split")
                );
                assert_eq!(
                    attribute(resource, &tables.string_table, "host.name").as_deref(),
                    Some(hostname.trim())
                );
                let period = profile.period_type.as_ref().unwrap();
                assert_eq!(text(period.unit_strindex), "nanoseconds");
                for sample in &profile.samples {
                    let stack = &tables.stack_table[sample.stack_index as usize];
                    let frames: Vec<String> = (stack.location_indices.iter())
                        .flat_map(|&l| &tables.location_table[l as usize].lines)
                        .map(|line| {
                            text(tables.function_table[line.function_index as usize].name_strindex)
                        })
                        .collect();
                    let count = sample.values.first().copied().unwrap_or(1);
                    written.add(&frames, count);
                }
            }
        }
    }
    assert_eq!(written.total, ours.total, "every sample, once");
    written.assert_matches(&ours, run.measured, 2.0, "the Collector's profiles");
    for wanted in [("samples", "count"), ("off-cpu", "nanoseconds")] {
        assert!(
            types.contains(&(wanted.0.to_string(), wanted.1.to_string())),
            "{wanted:?} in {types:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kubernetes_and_container_names_reach_pyroscope_and_the_collector() {
    require_root();
    let dir = temp_dir("real-kubernetes");
    let test = std::process::id();
    // A container of a pod, as containerd runs it under kubelet's systemd driver: its task's
    // annotations name it (tests/tests/agent_backends.rs has the other layouts).
    let node_root = dir.join("node");
    let (id, uid) = (
        format!("{:064x}", 0xc0de_0000 + u64::from(test)),
        format!("{test:08x}-1a2b-4c3d-8e4f-a0b1c2d3e4f5"),
    );
    write_containerd_task(&node_root, &id, &uid, ["retail", "store-5b7c", "web"]);
    let pyroscope = Pyroscope::start(&dir);
    let collector = Collector::start(&dir);
    let parent = profiler::scope::cgroup::cgroup2_mount()
        .unwrap()
        .join(format!("profiler-real-k8s-{test}"));
    let pod = PodContainer::start(
        &parent,
        &format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/\
             cri-containerd-{id}.scope",
            uid.replace('-', "_")
        ),
    );
    let mut agent = Running::spawn(
        Command::new(profiler_bin())
            .args(["agent", "-F", "499", "--interval", "1"])
            .args(["--service-name", "kubernetes", "--pyroscope"])
            .arg(pyroscope.url())
            .args(["--otlp", &collector.url])
            .arg("--node-root")
            .arg(&node_root)
            .arg("--spool-dir")
            .arg(dir.join("spool"))
            .stderr(Stdio::piped()),
    );
    wait_until_recording(agent.id());
    std::thread::sleep(Duration::from_secs(5));
    agent.terminate();
    drop(pod);

    // Pyroscope: the series of the pod's container, by Grafana's label names.
    let of_container = format!("{{container_id=\"{id}\"}}");
    for (label, value) in [
        ("service_name", "retail/web"),
        ("namespace", "retail"),
        ("pod", "store-5b7c"),
        ("container", "web"),
        ("pod_uid", uid.as_str()),
    ] {
        assert_eq!(
            pyroscope.label_values(label, &of_container),
            [value],
            "{label}"
        );
    }
    // The Collector: the resource of that container, by OTel's semantic conventions.
    let requests = collector.exported();
    let found = requests.iter().any(|request| {
        let strings = &request.dictionary.as_ref().unwrap().string_table;
        request.resource_profiles.iter().any(|resource_profiles| {
            let resource = resource_profiles.resource.as_ref().unwrap();
            let attribute = |key: &str| attribute(resource, strings, key);
            attribute("container.id").as_deref() == Some(id.as_str())
                && attribute("k8s.namespace.name").as_deref() == Some("retail")
                && attribute("k8s.pod.name").as_deref() == Some("store-5b7c")
                && attribute("k8s.container.name").as_deref() == Some("web")
                && attribute("k8s.pod.uid").as_deref() == Some(uid.as_str())
                && attribute("service.name").as_deref() == Some("retail/web")
        })
    });
    assert!(
        found,
        "no resource of the pod's container with its Kubernetes names"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
