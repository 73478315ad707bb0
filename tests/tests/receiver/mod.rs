//! A strict stand-in for the backends the agent exports to, since no Pyroscope server or OTel
//! Collector can be installed here: it takes what the real servers take and refuses, with their
//! status codes, what they refuse.
//!
//! - Pyroscope push (`POST /push.v1.PusherService/Push`, Connect unary): `Content-Type:
//!   application/proto` (415 otherwise), `Content-Encoding` gzip or none, a `push.v1.PushRequest`
//!   with at least one series; each series has `__name__` and `service_name` among well-formed,
//!   unique, non-empty labels, and samples whose `ID` is a UUID and whose `raw_profile` is a
//!   (gzipped) pprof with `string_table[0] == ""`, every string, location, function and mapping
//!   reference in range, values as many as sample types, and at least one sample.
//! - OTLP profiles (`POST /v1development/profiles`): `Content-Type: application/x-protobuf`,
//!   gzip or none, at most one `otlp-profiles-development-version` header, equal to 1; an
//!   `ExportProfilesServiceRequest` whose dictionary tables all start with the zero value and
//!   whose every index is in range, with at least one profile, each with samples and a 16-byte
//!   id that is not all zeros.
//!
//! Messages are decoded with types generated from the official protos: the `pyroscope` crate's
//! for push and pprof, `opentelemetry-proto`'s for OTLP. What it accepted is kept for the tests.

#![allow(dead_code)] // each test binary uses part of it

use std::io::Read;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message;
use pyroscope::encode::gen::google::Profile as Pprof;
use pyroscope::encode::gen::push::PushRequest;

pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
pub const OTLP_PATH: &str = "/v1development/profiles";
/// Bodies inflate to at most this: a gzip bomb is refused, not held.
const MAX_BODY: u64 = 64 << 20;

/// One accepted Pyroscope series: its labels and its decoded pprof.
#[derive(Clone, Debug)]
pub struct PushedSeries {
    pub labels: Vec<(String, String)>,
    pub profile: Pprof,
}

impl PushedSeries {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    pushes: Vec<Vec<PushedSeries>>,
    otlp: Vec<ExportProfilesServiceRequest>,
    refusals: Vec<(u16, String)>,
    /// Statuses to answer the next requests with, whatever they hold (a backend in trouble).
    forced: Vec<u16>,
    /// Going down: every request is answered 503.
    closing: bool,
}

pub struct Receiver {
    port: u16,
    state: Arc<Mutex<State>>,
    server: Option<Arc<tiny_http::Server>>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Listens on 127.0.0.1 at `port` (0: any free port).
    pub fn start(port: u16) -> Receiver {
        Receiver::start_with(port, Arc::default())
    }

    fn start_with(port: u16, state: Arc<Mutex<State>>) -> Receiver {
        let server = Arc::new(
            tiny_http::Server::http(("127.0.0.1", port)).expect("the receiver binds its port"),
        );
        let port = server.server_addr().to_ip().unwrap().port();
        let thread = {
            let server = Arc::clone(&server);
            let state = Arc::clone(&state);
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    handle(request, &state);
                }
            })
        };
        Receiver {
            port,
            state,
            server: Some(server),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops listening (the backend is down), keeping what was accepted; `restart` listens on
    /// the same port again.
    pub fn stop(&mut self) {
        // Requests already on their way are answered 503 first, as a server going down resets
        // them: dropped unanswered they would hang until the client's timeout.
        if self.server.is_some() {
            self.state.lock().unwrap().closing = true;
            std::thread::sleep(Duration::from_millis(300));
            self.state.lock().unwrap().closing = false;
        }
        if let Some(server) = self.server.take() {
            server.unblock();
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }

    pub fn restart(self) -> Receiver {
        let mut old = self;
        old.stop();
        // The port may linger a moment after the old socket closes.
        for _ in 0..50 {
            if std::net::TcpListener::bind(("127.0.0.1", old.port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Receiver::start_with(old.port, Arc::clone(&old.state))
    }

    /// The next requests get these statuses, in order, and are not looked at.
    pub fn answer_next_with(&self, statuses: &[u16]) {
        self.state
            .lock()
            .unwrap()
            .forced
            .extend_from_slice(statuses);
    }

    pub fn pushes(&self) -> Vec<Vec<PushedSeries>> {
        self.state.lock().unwrap().pushes.clone()
    }

    pub fn otlp(&self) -> Vec<ExportProfilesServiceRequest> {
        self.state.lock().unwrap().otlp.clone()
    }

    /// Requests refused, with the status and the reason.
    pub fn refusals(&self) -> Vec<(u16, String)> {
        self.state.lock().unwrap().refusals.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An answer: a status, a content type and a body.
struct Answer(u16, &'static str, Vec<u8>);

fn refuse(status: u16, why: impl Into<String>) -> Answer {
    let why = why.into();
    // Connect's error body: {"code": ..., "message": ...}.
    let code = match status {
        415 => "unsupported_media_type",
        404 => "not_found",
        _ => "invalid_argument",
    };
    let body = format!("{{\"code\":\"{code}\",\"message\":{why:?}}}");
    Answer(status, "application/json", body.into_bytes())
}

fn handle(mut request: tiny_http::Request, state: &Mutex<State>) {
    let forced = {
        let mut state = state.lock().unwrap();
        if state.closing {
            Some(503)
        } else {
            (!state.forced.is_empty()).then(|| state.forced.remove(0))
        }
    };
    let answer = match forced {
        Some(status) => refuse(status, "forced by the test"),
        None => check(&mut request, state),
    };
    if answer.0 >= 400 && forced.is_none() {
        let why = String::from_utf8_lossy(&answer.2).into_owned();
        state.lock().unwrap().refusals.push((answer.0, why));
    }
    let header = tiny_http::Header::from_bytes("Content-Type", answer.1).unwrap();
    // No kept-alive connections: when the test stops the receiver, a real server going down
    // closes its connections, and so must this one.
    let close = tiny_http::Header::from_bytes("Connection", "close").unwrap();
    let response = tiny_http::Response::from_data(answer.2)
        .with_status_code(answer.0)
        .with_header(header)
        .with_header(close);
    request.respond(response).ok();
}

/// Every value of the header `name`.
fn header(request: &tiny_http::Request, name: &'static str) -> Vec<String> {
    request
        .headers()
        .iter()
        .filter(|h| h.field.equiv(name))
        .map(|h| h.value.to_string())
        .collect()
}

/// The request body, inflated when `Content-Encoding: gzip` says so.
fn body(request: &mut tiny_http::Request) -> Result<Vec<u8>, Answer> {
    let encoding = header(request, "Content-Encoding");
    let mut raw = Vec::new();
    request
        .as_reader()
        .take(MAX_BODY)
        .read_to_end(&mut raw)
        .map_err(|e| refuse(400, format!("reading the body: {e}")))?;
    match encoding
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["identity"] => Ok(raw),
        ["gzip"] => inflate(&raw).map_err(|e| refuse(400, format!("gzip: {e}"))),
        other => Err(refuse(
            415,
            format!("unsupported Content-Encoding {other:?}"),
        )),
    }
}

fn inflate(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_BODY)
        .read_to_end(&mut out)?;
    Ok(out)
}

fn check(request: &mut tiny_http::Request, state: &Mutex<State>) -> Answer {
    if *request.method() != tiny_http::Method::Post {
        return refuse(
            405,
            format!("{} is not allowed, only POST", request.method()),
        );
    }
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let content_type = header(request, "Content-Type");
    let result = match path.as_str() {
        PUSH_PATH => {
            if content_type != ["application/proto"] {
                return refuse(
                    415,
                    format!("push wants application/proto, got {content_type:?}"),
                );
            }
            body(request)
                .and_then(|body| check_push(&body))
                .map(|series| {
                    state.lock().unwrap().pushes.push(series);
                    // An empty PushResponse.
                    Answer(200, "application/proto", Vec::new())
                })
        }
        OTLP_PATH => {
            if content_type != ["application/x-protobuf"] {
                return refuse(
                    415,
                    format!("OTLP wants application/x-protobuf, got {content_type:?}"),
                );
            }
            let version = header(request, "otlp-profiles-development-version");
            if !(version.is_empty() || version == ["1"]) {
                return refuse(
                    400,
                    format!("otlp-profiles-development-version {version:?}"),
                );
            }
            body(request)
                .and_then(|body| check_otlp(&body))
                .map(|export| {
                    state.lock().unwrap().otlp.push(export);
                    let reply = ExportProfilesServiceResponse::default().encode_to_vec();
                    Answer(200, "application/x-protobuf", reply)
                })
        }
        other => return refuse(404, format!("no such path {other}")),
    };
    result.unwrap_or_else(|answer| answer)
}

fn check_push(body: &[u8]) -> Result<Vec<PushedSeries>, Answer> {
    let request =
        PushRequest::decode(body).map_err(|e| refuse(400, format!("PushRequest: {e}")))?;
    if request.series.is_empty() {
        return Err(refuse(400, "no series"));
    }
    let mut accepted = Vec::new();
    for series in request.series {
        let mut labels: Vec<(String, String)> = Vec::new();
        for label in &series.labels {
            let well_formed = label.name.chars().enumerate().all(|(i, c)| {
                c == '_' || c.is_ascii_alphabetic() || (i > 0 && (c.is_ascii_digit() || c == '.'))
            });
            if label.name.is_empty() || !well_formed {
                return Err(refuse(400, format!("invalid label name {:?}", label.name)));
            }
            if label.value.is_empty() {
                return Err(refuse(400, format!("label {} has no value", label.name)));
            }
            if labels.iter().any(|(name, _)| *name == label.name) {
                return Err(refuse(400, format!("duplicate label {}", label.name)));
            }
            labels.push((label.name.clone(), label.value.clone()));
        }
        for required in ["__name__", "service_name"] {
            if !labels.iter().any(|(name, _)| name == required) {
                return Err(refuse(400, format!("series without the {required} label")));
            }
        }
        if series.samples.is_empty() {
            return Err(refuse(400, "series without samples"));
        }
        for sample in &series.samples {
            if uuid::Uuid::parse_str(&sample.id).is_err() {
                return Err(refuse(
                    400,
                    format!("sample ID {:?} is not a UUID", sample.id),
                ));
            }
            let raw = if sample.raw_profile.starts_with(&[0x1f, 0x8b]) {
                inflate(&sample.raw_profile)
                    .map_err(|e| refuse(400, format!("raw_profile gzip: {e}")))?
            } else {
                sample.raw_profile.clone()
            };
            let profile = Pprof::decode(&*raw).map_err(|e| refuse(400, format!("pprof: {e}")))?;
            check_pprof(&profile).map_err(|why| refuse(400, format!("pprof: {why}")))?;
            // Pyroscope's own rule (pkg/validation ValidateProfile), which Pyroscope 1.9 met
            // first: a sample type names a profile type id, whose parts are `:`-separated
            // label-like words.
            for value_type in &profile.sample_type {
                let name = &profile.string_table[value_type.r#type as usize];
                if name.contains('-') {
                    return Err(refuse(400, format!("sample type contains -: {name}")));
                }
            }
            accepted.push(PushedSeries {
                labels: labels.clone(),
                profile,
            });
        }
    }
    Ok(accepted)
}

/// pprof's own invariants (github.com/google/pprof profile.proto).
pub fn check_pprof(profile: &Pprof) -> Result<(), String> {
    let strings = profile.string_table.len() as i64;
    if profile.string_table.first().map(String::as_str) != Some("") {
        return Err("string_table[0] must be \"\"".into());
    }
    let string = |index: i64, what: &str| {
        if (0..strings).contains(&index) {
            Ok(())
        } else {
            Err(format!(
                "{what} string index {index} out of range ({strings} strings)"
            ))
        }
    };
    if profile.sample_type.is_empty() {
        return Err("no sample types".into());
    }
    if profile.sample.is_empty() {
        return Err("an empty profile (no samples)".into());
    }
    for value_type in profile.sample_type.iter().chain(&profile.period_type) {
        string(value_type.r#type, "value type")?;
        string(value_type.unit, "value unit")?;
    }
    let unique = |ids: Vec<u64>, what: &str| -> Result<Vec<u64>, String> {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != ids.len() || sorted.first() == Some(&0) {
            return Err(format!("{what} ids must be unique and non-zero"));
        }
        Ok(sorted)
    };
    let mappings = unique(profile.mapping.iter().map(|m| m.id).collect(), "mapping")?;
    let functions = unique(profile.function.iter().map(|f| f.id).collect(), "function")?;
    let locations = unique(profile.location.iter().map(|l| l.id).collect(), "location")?;
    for mapping in &profile.mapping {
        string(mapping.filename, "mapping filename")?;
        string(mapping.build_id, "mapping build id")?;
        if mapping.memory_limit < mapping.memory_start {
            return Err(format!("mapping {} ends before it starts", mapping.id));
        }
    }
    for function in &profile.function {
        string(function.name, "function name")?;
        string(function.system_name, "function system name")?;
        string(function.filename, "function filename")?;
    }
    for location in &profile.location {
        if location.mapping_id != 0 && mappings.binary_search(&location.mapping_id).is_err() {
            return Err(format!(
                "location {} names mapping {}",
                location.id, location.mapping_id
            ));
        }
        for line in &location.line {
            if functions.binary_search(&line.function_id).is_err() {
                return Err(format!(
                    "location {} names function {}",
                    location.id, line.function_id
                ));
            }
        }
    }
    for sample in &profile.sample {
        if sample.value.len() != profile.sample_type.len() {
            return Err(format!(
                "a sample has {} values for {} sample types",
                sample.value.len(),
                profile.sample_type.len()
            ));
        }
        for id in &sample.location_id {
            if locations.binary_search(id).is_err() {
                return Err(format!("a sample names location {id}"));
            }
        }
        for label in &sample.label {
            string(label.key, "label key")?;
            string(label.str, "label value")?;
            string(label.num_unit, "label unit")?;
        }
    }
    for &comment in &profile.comment {
        string(comment, "comment")?;
    }
    string(profile.default_sample_type, "default sample type")
}

fn check_otlp(body: &[u8]) -> Result<ExportProfilesServiceRequest, Answer> {
    let export = ExportProfilesServiceRequest::decode(body)
        .map_err(|e| refuse(400, format!("ExportProfilesServiceRequest: {e}")))?;
    check_otlp_request(&export).map_err(|why| refuse(400, why))?;
    Ok(export)
}

/// The OTLP profiles invariants (opentelemetry-proto profiles.proto, v1development).
pub fn check_otlp_request(export: &ExportProfilesServiceRequest) -> Result<(), String> {
    let Some(tables) = &export.dictionary else {
        return Err("no dictionary".into());
    };
    if tables.string_table.first().map(String::as_str) != Some("") {
        return Err("string_table[0] must be \"\"".into());
    }
    macro_rules! zero_first {
        ($($table:ident),*) => {$(
            match tables.$table.first() {
                Some(first) if *first == Default::default() => {}
                _ => return Err(format!("{}[0] must be the zero value", stringify!($table))),
            }
        )*};
    }
    zero_first!(
        mapping_table,
        location_table,
        function_table,
        link_table,
        stack_table
    );
    // The Collector (pdata) writes the zero attribute with an empty value message: still the
    // zero value, no key, no unit, a value of no kind.
    match tables.attribute_table.first() {
        Some(first)
            if first.key_strindex == 0
                && first.unit_strindex == 0
                && first
                    .value
                    .as_ref()
                    .is_none_or(|value| value.value.is_none()) => {}
        _ => return Err("attribute_table[0] must be the zero value".into()),
    }
    let in_range = |index: i32, len: usize, what: &str| {
        if index >= 0 && (index as usize) < len {
            Ok(())
        } else {
            Err(format!("{what} index {index} out of range ({len})"))
        }
    };
    let strings = tables.string_table.len();
    for mapping in &tables.mapping_table {
        in_range(mapping.filename_strindex, strings, "mapping filename")?;
        for &a in &mapping.attribute_indices {
            in_range(a, tables.attribute_table.len(), "mapping attribute")?;
        }
    }
    for function in &tables.function_table {
        in_range(function.name_strindex, strings, "function name")?;
        in_range(
            function.system_name_strindex,
            strings,
            "function system name",
        )?;
        in_range(function.filename_strindex, strings, "function filename")?;
    }
    for location in &tables.location_table {
        in_range(
            location.mapping_index,
            tables.mapping_table.len(),
            "location mapping",
        )?;
        for line in &location.lines {
            in_range(
                line.function_index,
                tables.function_table.len(),
                "line function",
            )?;
        }
    }
    for stack in &tables.stack_table {
        for &l in &stack.location_indices {
            in_range(l, tables.location_table.len(), "stack location")?;
        }
    }
    for attribute in &tables.attribute_table {
        in_range(attribute.key_strindex, strings, "attribute key")?;
        in_range(attribute.unit_strindex, strings, "attribute unit")?;
    }
    let mut profiles = 0;
    for resource in &export.resource_profiles {
        for scope in &resource.scope_profiles {
            for profile in &scope.profiles {
                profiles += 1;
                if profile.samples.is_empty() {
                    return Err("an empty profile (no samples)".into());
                }
                if profile.profile_id.len() != 16 || profile.profile_id.iter().all(|&b| b == 0) {
                    return Err("profile_id must be 16 bytes, not all zero".into());
                }
                for value_type in profile.sample_type.iter().chain(&profile.period_type) {
                    in_range(value_type.type_strindex, strings, "value type")?;
                    in_range(value_type.unit_strindex, strings, "value unit")?;
                }
                for sample in &profile.samples {
                    in_range(sample.stack_index, tables.stack_table.len(), "sample stack")?;
                    in_range(sample.link_index, tables.link_table.len(), "sample link")?;
                    for &a in &sample.attribute_indices {
                        in_range(a, tables.attribute_table.len(), "sample attribute")?;
                    }
                    if sample.values.len() != 1 && !sample.values.is_empty() {
                        return Err("a sample has more values than its one sample type".into());
                    }
                }
            }
        }
    }
    if profiles == 0 {
        return Err("no profiles".into());
    }
    Ok(())
}
