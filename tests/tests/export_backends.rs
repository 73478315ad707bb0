//! The agent's backends, tested against the strict receiver (tests/receiver): first the receiver
//! itself, proved right with the `pyroscope` crate's real client and refusing broken requests
//! as the real servers do; then our Pyroscope and OTLP sinks, exporting a real recording, through
//! a backend that fails and one that goes away and comes back.

mod common;
mod receiver;

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, SystemTime};

use common::{google_pprof, profiler, temp_dir, workload};
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use profiler::export::otlp::otlp_sink;
use profiler::export::pyroscope::pyroscope_sink;
use profiler::export::series::{SeriesNaming, ServiceName};
use profiler::export::sink::{Window, WindowSink};
use profiler::profile::{file::read_profile, Profile};
use prost::Message;
use pyroscope::backend::{
    Backend, BackendImpl, Report, ReportBatch, ReportData, StackFrame, StackTrace, ThreadTag,
};
use pyroscope::encode::gen::google::Profile as Pprof;
use pyroscope::encode::gen::push::{PushRequest, RawProfileSeries, RawSample};
use pyroscope::encode::gen::types::LabelPair;
use receiver::{Receiver, OTLP_PATH, PUSH_PATH};

/// A pyroscope-crate backend that reports one fixed stack, seen 7 times, per report.
struct FixedStacks;

impl Backend for FixedStacks {
    fn initialize(&mut self) -> pyroscope::Result<()> {
        Ok(())
    }
    fn shutdown(self: Box<Self>) -> pyroscope::Result<()> {
        Ok(())
    }
    fn report(&mut self) -> pyroscope::Result<ReportBatch> {
        let frame = |name: &str| StackFrame {
            name: Some(name.into()),
            ..StackFrame::default()
        };
        let stack = StackTrace {
            frames: vec![frame("leaf_work"), frame("main")],
            ..StackTrace::default()
        };
        Ok(ReportBatch {
            profile_type: "process_cpu".into(),
            data: ReportData::Reports(vec![Report::new(HashMap::from([(stack, 7)]))]),
        })
    }
    fn add_tag(&self, _: ThreadTag) -> pyroscope::Result<()> {
        Ok(())
    }
    fn remove_tag(&self, _: ThreadTag) -> pyroscope::Result<()> {
        Ok(())
    }
}

#[test]
fn the_receiver_accepts_what_the_pyroscope_crate_pushes() {
    let receiver = Receiver::start(0);
    let agent = pyroscope::pyroscope::PyroscopeAgentBuilder::new(
        receiver.url(),
        "receiver-check",
        100,
        "rust-test",
        "1.0",
        BackendImpl::new(Box::new(FixedStacks)),
    )
    .build()
    .unwrap();
    let running = agent.start().unwrap();
    let ready = running.stop().unwrap();
    ready.shutdown();
    let pushes = receiver.pushes();
    assert!(receiver.refusals().is_empty(), "{:?}", receiver.refusals());
    assert!(!pushes.is_empty(), "the crate pushed nothing");
    let series = &pushes[0][0];
    assert_eq!(series.label("service_name"), Some("receiver-check"));
    assert_eq!(series.label("__name__"), Some("process_cpu"));
    let names: Vec<&str> = series
        .profile
        .string_table
        .iter()
        .map(String::as_str)
        .collect();
    assert!(names.contains(&"leaf_work"), "{names:?}");
    // The crate turns samples into CPU time: 7 samples at 100 Hz are 70 ms.
    let total: i64 = series.profile.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 7 * 1_000_000_000 / 100);
}

/// A pprof the receiver takes: one sample of one function.
fn valid_pprof() -> Pprof {
    use pyroscope::encode::gen::google::*;
    Pprof {
        sample_type: vec![ValueType { r#type: 1, unit: 2 }],
        sample: vec![Sample {
            location_id: vec![1],
            value: vec![3],
            label: Vec::new(),
        }],
        location: vec![Location {
            id: 1,
            line: vec![Line {
                function_id: 1,
                line: 0,
            }],
            ..Location::default()
        }],
        function: vec![Function {
            id: 1,
            name: 3,
            ..Function::default()
        }],
        string_table: vec!["".into(), "samples".into(), "count".into(), "main".into()],
        ..Pprof::default()
    }
}

fn push_of(labels: &[(&str, &str)], id: &str, pprof: &Pprof) -> Vec<u8> {
    PushRequest {
        series: vec![RawProfileSeries {
            labels: labels
                .iter()
                .map(|(name, value)| LabelPair {
                    name: name.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            samples: vec![RawSample {
                raw_profile: pprof.encode_to_vec(),
                id: id.into(),
            }],
        }],
    }
    .encode_to_vec()
}

fn valid_otlp() -> ExportProfilesServiceRequest {
    let tables = otlp::ProfilesDictionary {
        mapping_table: vec![otlp::Mapping::default()],
        location_table: vec![
            otlp::Location::default(),
            otlp::Location {
                lines: vec![otlp::Line {
                    function_index: 1,
                    ..otlp::Line::default()
                }],
                ..otlp::Location::default()
            },
        ],
        function_table: vec![
            otlp::Function::default(),
            otlp::Function {
                name_strindex: 1,
                ..otlp::Function::default()
            },
        ],
        link_table: vec![otlp::Link::default()],
        attribute_table: vec![otlp::KeyValueAndUnit::default()],
        stack_table: vec![
            otlp::Stack::default(),
            otlp::Stack {
                location_indices: vec![1],
            },
        ],
        string_table: vec!["".into(), "main".into()],
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            scope_profiles: vec![otlp::ScopeProfiles {
                profiles: vec![otlp::Profile {
                    samples: vec![otlp::Sample {
                        stack_index: 1,
                        values: vec![1],
                        ..otlp::Sample::default()
                    }],
                    profile_id: vec![7; 16],
                    ..otlp::Profile::default()
                }],
                ..otlp::ScopeProfiles::default()
            }],
            ..otlp::ResourceProfiles::default()
        }],
        dictionary: Some(tables),
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// POSTs `body` and returns the status.
fn post(url: &str, headers: &[(&str, &str)], body: &[u8]) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent.post(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send(body).unwrap().status().as_u16()
}

#[test]
fn the_receiver_refuses_what_the_real_servers_refuse() {
    let receiver = Receiver::start(0);
    let push_url = format!("{}{PUSH_PATH}", receiver.url());
    let otlp_url = format!("{}{OTLP_PATH}", receiver.url());
    let proto = [("Content-Type", "application/proto")];
    let gzipped = [
        ("Content-Type", "application/proto"),
        ("Content-Encoding", "gzip"),
    ];
    let labels = [("__name__", "process_cpu"), ("service_name", "app")];
    let id = "0d7e3b8a-6a43-4c1e-9d0f-5b2a8c9e1f3d";
    let good = push_of(&labels, id, &valid_pprof());

    // What is right is taken, plain or gzipped.
    assert_eq!(post(&push_url, &proto, &good), 200);
    assert_eq!(post(&push_url, &gzipped, &gzip(&good)), 200);

    let mut bad_strings = valid_pprof();
    bad_strings.string_table[0] = "x".into();
    let mut bad_location = valid_pprof();
    bad_location.sample[0].location_id = vec![9];
    let mut bad_values = valid_pprof();
    bad_values.sample[0].value = vec![1, 2];
    let mut empty = valid_pprof();
    empty.sample.clear();
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let refused: Vec<(&str, u16, Vec<u8>, Headers)> = vec![
        (
            "JSON content type",
            415,
            good.clone(),
            &[("Content-Type", "application/json")],
        ),
        ("gzip header on a plain body", 400, good.clone(), &gzipped),
        (
            "no service_name",
            400,
            push_of(&labels[..1], id, &valid_pprof()),
            &proto,
        ),
        (
            "no __name__",
            400,
            push_of(&labels[1..], id, &valid_pprof()),
            &proto,
        ),
        (
            "ID not a UUID",
            400,
            push_of(&labels, "42", &valid_pprof()),
            &proto,
        ),
        (
            "string_table[0] not empty",
            400,
            push_of(&labels, id, &bad_strings),
            &proto,
        ),
        (
            "location out of range",
            400,
            push_of(&labels, id, &bad_location),
            &proto,
        ),
        (
            "values unlike sample types",
            400,
            push_of(&labels, id, &bad_values),
            &proto,
        ),
        ("empty profile", 400, push_of(&labels, id, &empty), &proto),
        (
            "no series",
            400,
            PushRequest::default().encode_to_vec(),
            &proto,
        ),
        ("not protobuf", 400, b"\xff\xff\xff".to_vec(), &proto),
    ];
    for (what, status, body, headers) in refused {
        assert_eq!(post(&push_url, headers, &body), status, "push: {what}");
    }
    assert_eq!(
        post(&format!("{}/ingest", receiver.url()), &proto, &good),
        404
    );

    let x_protobuf = [("Content-Type", "application/x-protobuf")];
    assert_eq!(
        post(&otlp_url, &x_protobuf, &valid_otlp().encode_to_vec()),
        200
    );
    let mut not_zero_first = valid_otlp();
    not_zero_first.dictionary.as_mut().unwrap().function_table[0].name_strindex = 1;
    let mut stack_out_of_range = valid_otlp();
    stack_out_of_range.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index =
        5;
    let mut zero_id = valid_otlp();
    zero_id.resource_profiles[0].scope_profiles[0].profiles[0].profile_id = vec![0; 16];
    let mut no_dictionary = valid_otlp();
    no_dictionary.dictionary = None;
    for (what, request) in [
        ("function_table[0] not zero", not_zero_first),
        ("stack index out of range", stack_out_of_range),
        ("all-zero profile id", zero_id),
        ("no dictionary", no_dictionary),
    ] {
        assert_eq!(
            post(&otlp_url, &x_protobuf, &request.encode_to_vec()),
            400,
            "otlp: {what}"
        );
    }
    let version_2 = [
        ("Content-Type", "application/x-protobuf"),
        ("otlp-profiles-development-version", "2"),
    ];
    assert_eq!(
        post(&otlp_url, &version_2, &valid_otlp().encode_to_vec()),
        400
    );
    assert_eq!(post(&otlp_url, &proto, &valid_otlp().encode_to_vec()), 415);
    assert_eq!(receiver.pushes().len(), 2);
    assert_eq!(receiver.otlp().len(), 1);
}

/// A real recording of cpu_split, as the window the agent would export.
fn recorded_window(sequence: u64) -> Window {
    let dir = temp_dir(&format!("export-backends-{sequence}"));
    let file = dir.join("run.prof");
    let output = profiler(&[
        "record",
        "-F",
        "499",
        "-o",
        file.to_str().unwrap(),
        "--",
        workload("cpu_split").to_str().unwrap(),
        "1500",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let profile = read_profile(&file).unwrap();
    std::fs::remove_dir_all(dir).ok();
    let start = SystemTime::UNIX_EPOCH + Duration::from_nanos(profile.meta.start_unix_ns);
    Window {
        sequence,
        start,
        end: start + Duration::from_nanos(profile.meta.duration_ns),
        profile,
    }
}

/// The samples of a pprof whose stack passes through a function whose name contains
/// `function`.
fn pprof_samples_through(profile: &Pprof, function: &str) -> i64 {
    let through = |location_id: &u64| {
        let location = profile
            .location
            .iter()
            .find(|l| l.id == *location_id)
            .unwrap();
        location.line.iter().any(|line| {
            let f = profile
                .function
                .iter()
                .find(|f| f.id == line.function_id)
                .unwrap();
            profile.string_table[f.name as usize].contains(function)
        })
    };
    profile
        .sample
        .iter()
        .filter(|sample| sample.location_id.iter().any(through))
        .map(|sample| sample.value[0])
        .sum()
}

/// The workload's samples, and those through each of its functions, in our own profile.
fn workload_samples(profile: &Profile, function: &str) -> u64 {
    profile
        .stacks
        .iter()
        .filter(|s| {
            s.frames.iter().any(|&id| {
                profile.frames[id as usize]
                    .function
                    .as_deref()
                    .is_some_and(|f| f.contains(function))
            })
        })
        .map(|s| s.count)
        .sum()
}

/// Waits (at most 10 s) until `done`: a backend's requests go from a thread of their own.
/// Series named by `rule`, on a node without Kubernetes records.
fn naming(rule: ServiceName) -> SeriesNaming {
    SeriesNaming {
        service_name: rule,
        node_root: "/nonexistent".into(),
    }
}

fn settle(done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "the upload thread did not get there in 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn recorded_windows_reach_pyroscope_whole_through_a_backend_that_fails_and_returns() {
    let window = recorded_window(0);
    let spool = tempfile::tempdir().unwrap();
    let mut receiver = Receiver::start(0);
    let mut sink = pyroscope_sink(
        &receiver.url(),
        None,
        naming(ServiceName::parse("=checkout").unwrap()),
        spool.path(),
        64 << 20,
    )
    .unwrap();

    sink.export(&window).unwrap();
    settle(|| receiver.pushes().len() == 1);
    let pushes = receiver.pushes();
    assert_eq!(pushes.len(), 1, "refused: {:?}", receiver.refusals());
    let workload_pid = window
        .profile
        .threads
        .iter()
        .find(|t| t.comm == "cpu_split")
        .expect("the workload's thread")
        .pid;
    let series = pushes[0]
        .iter()
        .find(|s| s.label("pid") == Some(workload_pid.to_string().as_str()))
        .expect("a series for the workload");
    assert_eq!(series.label("service_name"), Some("checkout"));
    assert_eq!(series.label("executable"), Some("cpu_split"));
    assert_eq!(series.label("__name__"), Some("process_cpu"));
    for function in ["heavy_work", "medium_work", "light_work", "run_round"] {
        let ours = workload_samples(&window.profile, function);
        let pushed = pprof_samples_through(&series.profile, function);
        assert!(ours > 0, "{function} sampled");
        assert_eq!(pushed as u64, ours, "{function}: pushed vs recorded");
    }
    // Google's pprof reads what was pushed.
    let file = spool.path().join("pushed.pb");
    std::fs::write(&file, series.profile.encode_to_vec()).unwrap();
    let top = std::process::Command::new(google_pprof())
        .args(["-top", "-nodecount=100"])
        .arg(&file)
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(top.contains("heavy_work"), "{top}");

    // A failing backend: the window is spooled, then sent before the next one.
    receiver.answer_next_with(&[503]);
    let failed = |sink: &dyn WindowSink| sink.delivery().unwrap().failed_requests;
    sink.export(&window).unwrap();
    settle(|| failed(&sink) == 1);
    assert_eq!(receiver.pushes().len(), 1);
    // The backend goes away for a while; the windows wait in the spool.
    receiver.stop();
    std::thread::sleep(Duration::from_millis(1100));
    sink.export(&window).unwrap();
    settle(|| failed(&sink) == 2);
    let receiver = receiver.restart();
    // Past the backoff (1 s, then 2 s), everything spooled goes, oldest first, then the new one.
    std::thread::sleep(Duration::from_millis(2100));
    sink.export(&window).unwrap();
    settle(|| receiver.pushes().len() == 4);
    assert_eq!(
        receiver.pushes().len(),
        4,
        "refused: {:?}",
        receiver.refusals()
    );
    assert_eq!(
        std::fs::read_dir(spool.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "window")
            })
            .count(),
        0,
        "the spool is empty again"
    );
}

#[test]
fn recorded_windows_reach_an_otlp_endpoint_whole() {
    let window = recorded_window(1);
    let spool = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(0);
    let mut sink = otlp_sink(
        &receiver.url(),
        naming(ServiceName::Auto),
        spool.path(),
        64 << 20,
    )
    .unwrap();
    sink.export(&window).unwrap();
    settle(|| !receiver.otlp().is_empty());
    let exports = receiver.otlp();
    assert_eq!(exports.len(), 1, "refused: {:?}", receiver.refusals());
    let export = &exports[0];
    let tables = export.dictionary.as_ref().unwrap();
    let text = |index: i32| tables.string_table[index as usize].as_str();
    let workload = export
        .resource_profiles
        .iter()
        .find(|r| {
            r.resource.as_ref().unwrap().attributes.iter().any(|a| {
                a.key == "process.executable.name"
                    && format!("{:?}", a.value).contains("\"cpu_split\"")
            })
        })
        .expect("a resource for the workload");
    let attributes: Vec<&str> = workload
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|a| a.key.as_str())
        .collect();
    for key in ["service.name", "host.name", "process.pid"] {
        assert!(attributes.contains(&key), "{attributes:?}");
    }
    let profile = &workload.scope_profiles[0].profiles[0];
    assert_eq!(
        text(profile.period_type.as_ref().unwrap().unit_strindex),
        "nanoseconds"
    );
    let heavy: i64 = profile
        .samples
        .iter()
        .filter(|sample| {
            tables.stack_table[sample.stack_index as usize]
                .location_indices
                .iter()
                .flat_map(|&l| &tables.location_table[l as usize].lines)
                .any(|line| {
                    text(tables.function_table[line.function_index as usize].name_strindex)
                        .contains("heavy_work")
                })
        })
        .map(|s| s.values[0])
        .sum();
    assert_eq!(
        heavy as u64,
        workload_samples(&window.profile, "heavy_work")
    );
}
