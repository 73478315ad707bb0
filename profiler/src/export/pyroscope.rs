//! Grafana Pyroscope's push API: `POST <URL>/push.v1.PusherService/Push`, a Connect unary call
//! carrying a gzipped `push.v1.PushRequest` protobuf (`Content-Type: application/proto`,
//! `Content-Encoding: gzip`), as the `pyroscope` crate and Grafana Alloy send it.
//!
//! Each series is one process's samples of one event: its labels are `__name__` (the profile
//! name: `process_cpu` for CPU clocks, as Pyroscope's own eBPF profiler names them, else the
//! event), `service_name`, `host`, `pid`, `executable` and, where the cgroup path tells them,
//! `container_id`, `container_runtime`, `pod_uid` and `systemd_unit`; its one sample is the
//! series as a pprof (see `export::pprof`), named by a random UUID. The pprofs go uncompressed
//! (the server inflates a raw profile only when it is gzipped) inside the request, which is
//! gzipped whole: a compressor per series cost the agent a tenth of its CPU under process churn
//! (hundreds of series a window, each a new compressor's state to allocate and clear), and one
//! stream compresses the strings the series share. The message types are
//! written by hand after grafana/pyroscope `api/push/v1/push.proto` and `api/types/v1/types.proto`.

use std::path::Path;

use prost::Message;

use super::backend::BackendSink;
use super::pprof::{
    column_prefix, pprof_profile, proto::Profile, DATA_SAMPLE_SUFFIX, LATENCY_SUFFIX,
};
use super::series::{Series, SeriesLabels, SeriesNaming};
use super::upload::{Endpoint, Uploader};
use super::ExportError;
use crate::profile::EventInfo;

pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PushRequest {
        #[prost(message, repeated, tag = "1")]
        pub series: Vec<RawProfileSeries>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawProfileSeries {
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<LabelPair>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<RawSample>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawSample {
        /// A pprof profile, gzipped or not.
        #[prost(bytes = "vec", tag = "1")]
        pub raw_profile: Vec<u8>,
        /// A UUID naming this profile.
        #[prost(string, tag = "2")]
        pub id: String,
    }

    #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, prost::Message)]
    pub struct LabelPair {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }
}

/// The push path below the server's URL.
const PUSH_PATH: &str = "push.v1.PusherService/Push";

/// The sink pushing to the Pyroscope server at `url` (`http://host:4040`), spooling in
/// `spool_dir`. `X-Scope-OrgID` is sent when a tenant is given (multi-tenant servers).
pub fn pyroscope_sink(
    url: &str,
    tenant: Option<&str>,
    naming: SeriesNaming,
    spool_dir: &Path,
    spool_bytes: u64,
) -> Result<BackendSink, ExportError> {
    let mut headers = vec![
        ("Content-Type", "application/proto".to_string()),
        ("Content-Encoding", "gzip".to_string()),
    ];
    headers.extend(tenant.map(|tenant| ("X-Scope-OrgID", tenant.to_string())));
    let endpoint = Endpoint {
        url: format!("{}/{PUSH_PATH}", url.trim_end_matches('/')),
        headers,
    };
    BackendSink::new(
        format!("--pyroscope {url}"),
        naming,
        |series| Ok(push_request(series).encode_to_vec()),
        Uploader::new(endpoint, spool_dir, spool_bytes)?,
    )
}

/// The push request for a window's series.
pub fn push_request(series: &[Series]) -> proto::PushRequest {
    let series = series
        .iter()
        .map(|one| proto::RawProfileSeries {
            labels: labels(&one.labels, &one.profile.events[0]),
            samples: vec![proto::RawSample {
                raw_profile: with_pyroscope_value_types(
                    pprof_profile(&one.profile),
                    &one.profile.events[0],
                )
                .encode_to_vec(),
                id: uuid::Uuid::new_v4().to_string(),
            }],
        })
        .collect();
    proto::PushRequest { series }
}

/// Pyroscope's name for what a profile measures: its eBPF profiler calls CPU time `process_cpu`;
/// other events keep their name, in the label-value form Pyroscope's profile type ids allow.
pub fn profile_name(event: &EventInfo) -> String {
    match measure(event).as_str() {
        "cpu" => "process_cpu".to_string(),
        other => other.to_string(),
    }
}

/// What an event's samples weigh, as Pyroscope names it: `cpu` for CPU clocks (its eBPF
/// profiler's `process_cpu:cpu:nanoseconds:cpu:nanoseconds`), else the event's bare name with
/// `_` for anything a profile type id cannot hold.
fn measure(event: &EventInfo) -> String {
    let bare = event.name.split([':', '/']).next().unwrap_or(&event.name);
    if matches!(bare, "cpu-clock" | "task-clock") {
        return "cpu".to_string();
    }
    column_prefix(bare)
}

/// The pprof's sample and period types in Pyroscope's words: the server refuses a sample type
/// with a `-` (every perf event name has one), and names a profile type by them
/// (`process_cpu:samples:count:cpu:nanoseconds`). `<event>_sample` becomes `samples`,
/// `<event>_event` and the period the [`measure`], the data columns `data_samples` and
/// `data_<measure>`, the latency column `latency`. A series is one event's, so the event's name
/// in them said nothing the series' `__name__` does not.
fn with_pyroscope_value_types(mut pprof: Profile, event: &EventInfo) -> Profile {
    let measure = measure(event);
    let prefix = column_prefix(&event.name);
    // The period type is the event's own name; the columns' are its [`column_prefix`].
    let rename = |name: &str| match name.strip_prefix(prefix.as_str()) {
        _ if name == event.name => measure.clone(),
        Some("") | Some("_event") => measure.clone(),
        Some("_sample") => "samples".to_string(),
        Some(DATA_SAMPLE_SUFFIX) => "data_samples".to_string(),
        Some("_data_event") => format!("data_{measure}"),
        Some(LATENCY_SUFFIX) => "latency".to_string(),
        _ => name.replace('-', "_"),
    };
    let strings = &mut pprof.string_table;
    let mut renamed = |index: &mut i64| {
        let name = rename(&strings[*index as usize]);
        // Pointed elsewhere, never written over: the old string may name a function too.
        *index = match strings.iter().position(|s| *s == name) {
            Some(found) => found as i64,
            None => {
                strings.push(name);
                strings.len() as i64 - 1
            }
        };
    };
    let value_types = pprof.sample_type.iter_mut().chain(&mut pprof.period_type);
    for value_type in value_types {
        renamed(&mut value_type.r#type);
    }
    renamed(&mut pprof.default_sample_type);
    pprof
}

fn labels(labels: &SeriesLabels, event: &EventInfo) -> Vec<proto::LabelPair> {
    let origin = &labels.origin;
    let kubernetes = origin.kubernetes.as_ref();
    let mut pairs: Vec<proto::LabelPair> = [
        ("__name__", Some(profile_name(event))),
        ("service_name", Some(labels.service_name.clone())),
        ("host", Some(labels.host.clone())),
        ("pid", Some(labels.pid.to_string())),
        ("executable", Some(labels.executable.clone())),
        ("container_id", origin.container_id.clone()),
        (
            "container_runtime",
            origin.container_runtime.map(str::to_string),
        ),
        ("pod_uid", origin.pod_uid.clone()),
        // The names Grafana's Kubernetes discovery gives Pyroscope's own agents.
        ("namespace", kubernetes.map(|k| k.namespace.clone())),
        ("pod", kubernetes.map(|k| k.pod.clone())),
        ("container", kubernetes.and_then(|k| k.container.clone())),
        ("systemd_unit", origin.systemd_unit.clone()),
    ]
    .into_iter()
    .filter_map(|(name, value)| {
        Some(proto::LabelPair {
            name: name.to_string(),
            value: value.filter(|v| !v.is_empty())?,
        })
    })
    .collect();
    pairs.sort();
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::pprof::proto::Profile as Pprof;
    use crate::export::series::{no_kubernetes, ServiceName};
    use crate::export::series::{series_of, CgroupPaths};
    use crate::profile::test_profile;

    #[test]
    fn each_series_is_labelled_and_carries_its_pprof() {
        let profile = test_profile::profile();
        let series = series_of(
            &profile,
            &ServiceName::Auto,
            &CgroupPaths::default(),
            &mut no_kubernetes(),
        );
        let request = push_request(&series);
        let decoded = proto::PushRequest::decode(&*request.encode_to_vec()).unwrap();
        assert_eq!(decoded.series.len(), series.len());
        for (pushed, one) in decoded.series.iter().zip(&series) {
            let label = |name: &str| {
                pushed
                    .labels
                    .iter()
                    .find(|l| l.name == name)
                    .map(|l| l.value.as_str())
            };
            assert_eq!(
                label("__name__"),
                Some(profile_name(&one.profile.events[0]).as_str())
            );
            assert_eq!(
                label("service_name"),
                Some(one.labels.service_name.as_str())
            );
            assert_eq!(label("pid"), Some(one.labels.pid.to_string().as_str()));
            assert_eq!(label("host"), Some(profile.meta.hostname.as_str()));
            assert_eq!(label("pod_uid"), None, "no empty labels");
            let sample = &pushed.samples[0];
            assert!(uuid::Uuid::parse_str(&sample.id).is_ok());
            let pprof = Pprof::decode(&*sample.raw_profile).unwrap();
            let total: i64 = pprof.sample.iter().map(|s| s.value[0]).sum();
            let expected: u64 = one.profile.stacks.iter().map(|s| s.count).sum();
            assert_eq!(total as u64, expected);
        }
    }

    #[test]
    fn cpu_clocks_are_process_cpu_and_other_events_keep_their_name() {
        let event = |name: &str| EventInfo {
            name: name.into(),
            ..EventInfo::default()
        };
        assert_eq!(profile_name(&event("cpu-clock")), "process_cpu");
        assert_eq!(profile_name(&event("task-clock:u")), "process_cpu");
        assert_eq!(profile_name(&event("page-faults/period=1/")), "page_faults");
        assert_eq!(profile_name(&event("cache-misses")), "cache_misses");
        // The agent's off-CPU time is a profile type of its own.
        assert_eq!(profile_name(&event("off-cpu")), "off_cpu");
    }

    /// The value types of every series pushed for `profile`: (profile type, sample types).
    fn pushed_types(profile: &crate::profile::Profile) -> Vec<(String, Vec<(String, String)>)> {
        let series = series_of(
            profile,
            &ServiceName::Auto,
            &CgroupPaths::default(),
            &mut no_kubernetes(),
        );
        push_request(&series)
            .series
            .iter()
            .map(|pushed| {
                let name = &pushed.labels.iter().find(|l| l.name == "__name__").unwrap();
                let pprof = Pprof::decode(&*pushed.samples[0].raw_profile).unwrap();
                let text = |index: i64| pprof.string_table[index as usize].clone();
                let period = pprof.period_type.as_ref().unwrap();
                let types = (pprof.sample_type.iter())
                    .map(|t| (text(t.r#type), text(t.unit)))
                    .collect();
                let default = text(pprof.default_sample_type);
                assert!(pprof.sample_type.iter().any(|t| text(t.r#type) == default));
                let id = format!(
                    "{}:{}:{}",
                    name.value,
                    text(period.r#type),
                    text(period.unit)
                );
                (id, types)
            })
            .collect()
    }

    #[test]
    fn sample_types_are_in_pyroscopes_words_with_no_dash() {
        let owned = |types: &[(&str, &str)]| -> Vec<(String, String)> {
            (types.iter())
                .map(|(t, u)| (t.to_string(), u.to_string()))
                .collect()
        };
        let cpu = pushed_types(&test_profile::profile());
        assert!(cpu
            .iter()
            .any(|(id, types)| id == "process_cpu:cpu:nanoseconds"
                && *types == owned(&[("samples", "count")])));
        assert!(cpu
            .iter()
            .any(|(id, types)| id == "page_faults:page_faults:count"
                && *types == owned(&[("samples", "count"), ("page_faults", "count")])));
        let data = pushed_types(&test_profile::profile_with_data());
        assert!(data
            .iter()
            .any(|(id, types)| id == "page_faults:page_faults:count"
                && types.contains(&("data_samples".into(), "count".into()))
                && types.contains(&("data_page_faults".into(), "count".into()))));
        let mut with_off_cpu = test_profile::profile_with_off_cpu();
        crate::export::offcpu::add_off_cpu_event(&mut with_off_cpu);
        let off_cpu = pushed_types(&with_off_cpu);
        assert!(off_cpu
            .iter()
            .any(|(id, types)| id == "off_cpu:off_cpu:nanoseconds"
                && *types == owned(&[("samples", "count"), ("off_cpu", "nanoseconds")])));
        for (id, types) in cpu.iter().chain(&data).chain(&off_cpu) {
            assert!(
                !id.contains('-') && types.iter().all(|(t, _)| !t.contains('-')),
                "{id} {types:?}"
            );
        }
    }
}
