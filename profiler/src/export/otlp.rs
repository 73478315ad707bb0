//! OpenTelemetry profiles over OTLP/HTTP: `POST <URL>/v1development/profiles` with a gzipped
//! `ExportProfilesServiceRequest` protobuf (`application/x-protobuf`), the messages of
//! opentelemetry-proto's `profiles/v1development` (proto 1.10/1.11, one wire format).
//!
//! One resource per process (attributes `service.name`, `host.name`, `process.pid`,
//! `process.executable.name`, `container.id`, `container.runtime`, `k8s.pod.uid`,
//! `systemd.unit`), one profile per event. A profile's samples count samples
//! (`samples`/`count`), or nanoseconds blocked for off-CPU time (`off-cpu`/`nanoseconds`); its
//! period type is the event and its unit, with the events each sample stands for, as the report
//! estimates them, as the period. Stacks, locations, mappings and functions are
//! the ones `export::pprof` builds for the series, moved into the request's shared dictionary,
//! whose tables all start with the zero value as the protocol requires.

use std::collections::HashMap;
use std::path::Path;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::backend::BackendSink;
use super::offcpu::OFF_CPU_EVENT;
use super::pprof::{pprof_profile, proto as pprof, DATA_SAMPLE_SUFFIX, LATENCY_SUFFIX};
use super::series::{Series, SeriesNaming};
use super::upload::{Endpoint, Uploader};
use super::ExportError;

/// The profiles path below the collector's URL.
const PROFILES_PATH: &str = "v1development/profiles";

/// The sink sending to the OTLP/HTTP endpoint at `url` (`http://collector:4318`), spooling in
/// `spool_dir`.
pub fn otlp_sink(
    url: &str,
    naming: SeriesNaming,
    spool_dir: &Path,
    spool_bytes: u64,
) -> Result<BackendSink, ExportError> {
    let endpoint = Endpoint {
        url: format!("{}/{PROFILES_PATH}", url.trim_end_matches('/')),
        headers: vec![
            ("Content-Type", "application/x-protobuf".to_string()),
            ("Content-Encoding", "gzip".to_string()),
        ],
    };
    BackendSink::new(
        format!("--otlp {url}"),
        naming,
        |series| Ok(export_request(series).encode_to_vec()),
        Uploader::new(endpoint, spool_dir, spool_bytes)?,
    )
}

/// The OTLP request for a window's series.
pub fn export_request(series: &[Series]) -> ExportProfilesServiceRequest {
    let mut dictionary = Dictionary::new();
    let mut resources: Vec<otlp::ResourceProfiles> = Vec::new();
    let mut resource_of_pid: HashMap<u32, usize> = HashMap::new();
    for one in series {
        let profiles = dictionary.profiles(&pprof_profile(&one.profile));
        let index = *resource_of_pid.entry(one.labels.pid).or_insert_with(|| {
            resources.push(otlp::ResourceProfiles {
                resource: Some(resource(one)),
                scope_profiles: vec![otlp::ScopeProfiles {
                    scope: Some(InstrumentationScope {
                        name: "profiler".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..InstrumentationScope::default()
                    }),
                    ..otlp::ScopeProfiles::default()
                }],
                ..otlp::ResourceProfiles::default()
            });
            resources.len() - 1
        });
        resources[index].scope_profiles[0].profiles.extend(profiles);
    }
    ExportProfilesServiceRequest {
        resource_profiles: resources,
        dictionary: Some(dictionary.tables),
    }
}

fn string_value(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..KeyValue::default()
    }
}

fn resource(series: &Series) -> Resource {
    let labels = &series.labels;
    let origin = &labels.origin;
    let kubernetes = origin.kubernetes.as_ref();
    let mut attributes = vec![
        string_value("service.name", &labels.service_name),
        string_value("host.name", &labels.host),
        KeyValue {
            key: "process.pid".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(i64::from(labels.pid))),
            }),
            ..KeyValue::default()
        },
        string_value("process.executable.name", &labels.executable),
    ];
    let optional = [
        ("container.id", origin.container_id.as_deref()),
        ("container.runtime", origin.container_runtime),
        ("k8s.pod.uid", origin.pod_uid.as_deref()),
        (
            "k8s.namespace.name",
            kubernetes.map(|k| k.namespace.as_str()),
        ),
        ("k8s.pod.name", kubernetes.map(|k| k.pod.as_str())),
        (
            "k8s.container.name",
            kubernetes.and_then(|k| k.container.as_deref()),
        ),
        ("systemd.unit", origin.systemd_unit.as_deref()),
    ];
    attributes.extend(
        optional
            .into_iter()
            .filter_map(|(key, value)| Some(string_value(key, value?))),
    );
    Resource {
        attributes,
        ..Resource::default()
    }
}

/// The request's shared tables, each starting with its zero value, and where each pprof
/// profile's entries went.
struct Dictionary {
    tables: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    attributes: HashMap<(i32, String), i32>,
    stacks: HashMap<Vec<i32>, i32>,
}

impl Dictionary {
    fn new() -> Dictionary {
        let mut dictionary = Dictionary {
            tables: otlp::ProfilesDictionary {
                mapping_table: vec![otlp::Mapping::default()],
                location_table: vec![otlp::Location::default()],
                function_table: vec![otlp::Function::default()],
                link_table: vec![otlp::Link::default()],
                attribute_table: vec![otlp::KeyValueAndUnit::default()],
                stack_table: vec![otlp::Stack::default()],
                string_table: Vec::new(),
            },
            strings: HashMap::new(),
            attributes: HashMap::new(),
            stacks: HashMap::new(),
        };
        dictionary.string("");
        dictionary
    }

    fn string(&mut self, text: &str) -> i32 {
        if let Some(&index) = self.strings.get(text) {
            return index;
        }
        let index = self.tables.string_table.len() as i32;
        self.tables.string_table.push(text.to_string());
        self.strings.insert(text.to_string(), index);
        index
    }

    /// A string-valued sample attribute (`thread.name`), or an integer one (`thread.id`).
    fn attribute(&mut self, key: &str, value: any_value::Value) -> i32 {
        self.attribute_in(key, value, "")
    }

    /// An attribute whose value is in `unit` (none when empty).
    fn attribute_in(&mut self, key: &str, value: any_value::Value, unit: &str) -> i32 {
        let key_index = self.string(key);
        let unit_index = self.string(unit);
        let identity = (key_index, format!("{value:?} {unit_index}"));
        if let Some(&index) = self.attributes.get(&identity) {
            return index;
        }
        let index = self.tables.attribute_table.len() as i32;
        self.tables.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex: key_index,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: unit_index,
        });
        self.attributes.insert(identity, index);
        index
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&index) = self.stacks.get(&locations) {
            return index;
        }
        let index = self.tables.stack_table.len() as i32;
        self.tables.stack_table.push(otlp::Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, index);
        index
    }

    /// Moves a one-event pprof profile into the dictionary, as OTLP profiles: one of its call
    /// stacks and, when the event carried data addresses, one of its data samples and one of
    /// their latencies (an OTLP profile has one sample type).
    fn profiles(&mut self, pprof: &pprof::Profile) -> Vec<otlp::Profile> {
        let text = |index: i64| pprof.string_table[index as usize].as_str();
        let mut mappings = HashMap::new();
        for mapping in &pprof.mapping {
            let filename = self.string(text(mapping.filename));
            let mut attribute_indices = Vec::new();
            if mapping.build_id != 0 {
                let build_id = any_value::Value::StringValue(text(mapping.build_id).into());
                attribute_indices.push(self.attribute("process.executable.build_id.gnu", build_id));
            }
            mappings.insert(mapping.id, self.tables.mapping_table.len() as i32);
            self.tables.mapping_table.push(otlp::Mapping {
                memory_start: mapping.memory_start,
                memory_limit: mapping.memory_limit,
                file_offset: mapping.file_offset,
                filename_strindex: filename,
                attribute_indices,
            });
        }
        let mut functions = HashMap::new();
        for function in &pprof.function {
            let entry = otlp::Function {
                name_strindex: self.string(text(function.name)),
                system_name_strindex: self.string(text(function.system_name)),
                filename_strindex: self.string(text(function.filename)),
                start_line: function.start_line,
            };
            functions.insert(function.id, self.tables.function_table.len() as i32);
            self.tables.function_table.push(entry);
        }
        let mut locations = HashMap::new();
        for location in &pprof.location {
            let entry = otlp::Location {
                mapping_index: mappings.get(&location.mapping_id).copied().unwrap_or(0),
                address: location.address,
                lines: location
                    .line
                    .iter()
                    .map(|line| otlp::Line {
                        function_index: functions[&line.function_id],
                        line: line.line,
                        column: 0,
                    })
                    .collect(),
                attribute_indices: Vec::new(),
            };
            locations.insert(location.id, self.tables.location_table.len() as i32);
            self.tables.location_table.push(entry);
        }
        let period_type = pprof.period_type.as_ref().map(|period| otlp::ValueType {
            type_strindex: self.string(text(period.r#type)),
            unit_strindex: self.string(text(period.unit)),
        });
        // Off-CPU samples are blocks, each with its nanoseconds blocked in the `_event` column
        // after them (`export::offcpu`): the time is what the profile measures.
        let off_cpu = pprof
            .period_type
            .as_ref()
            .is_some_and(|period| text(period.r#type) == OFF_CPU_EVENT);
        // The stack samples' `_sample` column is the first; the data columns follow it.
        let stacks = match off_cpu {
            true => (1, (OFF_CPU_EVENT, "nanoseconds")),
            false => (0, ("samples", "count")),
        };
        let mut measures = vec![stacks];
        for (column, value_type) in pprof.sample_type.iter().enumerate() {
            let name = text(value_type.r#type);
            if name.ends_with(DATA_SAMPLE_SUFFIX) {
                measures.push((column, ("data_samples", "count")));
            } else if name.ends_with(LATENCY_SUFFIX) {
                measures.push((column, ("latency", text(value_type.unit))));
            }
        }
        measures
            .into_iter()
            .map(|(column, (value_type, value_unit))| otlp::Profile {
                sample_type: Some(otlp::ValueType {
                    type_strindex: self.string(value_type),
                    unit_strindex: self.string(value_unit),
                }),
                samples: (pprof.sample.iter())
                    .filter(|sample| sample.value[column] != 0)
                    .map(|sample| self.sample(pprof, sample, column, &locations))
                    .collect(),
                time_unix_nano: pprof.time_nanos as u64,
                duration_nano: pprof.duration_nanos as u64,
                period_type,
                period: pprof.period,
                profile_id: uuid::Uuid::new_v4().as_bytes().to_vec(),
                ..otlp::Profile::default()
            })
            .collect()
    }

    /// One pprof sample's value in `column`, with its stack and labels, as an OTLP sample.
    fn sample(
        &mut self,
        pprof: &pprof::Profile,
        sample: &pprof::Sample,
        column: usize,
        locations: &HashMap<u64, i32>,
    ) -> otlp::Sample {
        let text = |index: i64| pprof.string_table[index as usize].as_str();
        // pprof and OTLP both list a stack leaf first.
        let stack = self.stack(sample.location_id.iter().map(|id| locations[id]).collect());
        let attribute_indices = sample
            .label
            .iter()
            .filter_map(|label| {
                let attribute = match (text(label.key), text(label.num_unit)) {
                    ("tid", _) => {
                        self.attribute("thread.id", any_value::Value::IntValue(label.num))
                    }
                    ("thread_comm", _) => self.attribute(
                        "thread.name",
                        any_value::Value::StringValue(text(label.str).into()),
                    ),
                    ("access", _) => self.attribute(
                        "profiler.data.access",
                        any_value::Value::StringValue(text(label.str).into()),
                    ),
                    // Latencies: `profiler.latency_max`, `profiler.line_latency_p99`, in cycles.
                    (key, unit) if !unit.is_empty() => self.attribute_in(
                        &format!("profiler.{key}"),
                        any_value::Value::IntValue(label.num),
                        unit,
                    ),
                    _ => return None,
                };
                Some(attribute)
            })
            .collect();
        otlp::Sample {
            stack_index: stack,
            attribute_indices,
            link_index: 0,
            values: vec![sample.value[column]],
            timestamps_unix_nano: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::series::{no_kubernetes, ServiceName};
    use crate::export::series::{series_of, CgroupPaths};
    use crate::profile::test_profile;

    #[test]
    fn tables_start_with_the_zero_value_and_every_index_is_in_range() {
        let profile = test_profile::profile();
        let series = series_of(
            &profile,
            &ServiceName::Auto,
            &CgroupPaths::default(),
            &mut no_kubernetes(),
        );
        let request = export_request(&series);
        let request = ExportProfilesServiceRequest::decode(&*request.encode_to_vec()).unwrap();
        let tables = request.dictionary.as_ref().unwrap();
        assert_eq!(tables.string_table[0], "");
        assert_eq!(tables.mapping_table[0], otlp::Mapping::default());
        assert_eq!(tables.location_table[0], otlp::Location::default());
        assert_eq!(tables.function_table[0], otlp::Function::default());
        assert_eq!(tables.stack_table[0], otlp::Stack::default());
        let strings = tables.string_table.len() as i32;
        for location in &tables.location_table[1..] {
            assert!(location.mapping_index < tables.mapping_table.len() as i32);
            for line in &location.lines {
                let function = &tables.function_table[line.function_index as usize];
                assert!(function.name_strindex > 0 && function.name_strindex < strings);
            }
        }
        let resources = &request.resource_profiles;
        assert_eq!(resources.len(), 1, "one process in the test profile");
        let profiles = &resources[0].scope_profiles[0].profiles;
        assert_eq!(
            profiles.len(),
            profile.events.len(),
            "one profile per event"
        );
        for (otlp_profile, one) in profiles.iter().zip(&series) {
            let total: i64 = otlp_profile.samples.iter().map(|s| s.values[0]).sum();
            let expected: u64 = one.profile.stacks.iter().map(|s| s.count).sum();
            assert_eq!(total as u64, expected);
            assert_eq!(otlp_profile.profile_id.len(), 16);
            // The leaf of every stack names a function.
            for sample in &otlp_profile.samples {
                let stack = &tables.stack_table[sample.stack_index as usize];
                let leaf = &tables.location_table[stack.location_indices[0] as usize];
                assert!(!leaf.lines.is_empty() || leaf.address != 0);
            }
        }
        let names: Vec<&str> = tables
            .function_table
            .iter()
            .map(|f| tables.string_table[f.name_strindex as usize].as_str())
            .collect();
        for expected in ["main", "run", "compute", "vec_sum"] {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
    }

    #[test]
    fn data_addresses_and_latencies_are_profiles_of_their_own() {
        let profile = test_profile::profile_with_data();
        let series = series_of(
            &profile,
            &ServiceName::Auto,
            &CgroupPaths::default(),
            &mut no_kubernetes(),
        );
        let request = export_request(&series);
        let tables = request.dictionary.as_ref().unwrap();
        let text = |index: i32| tables.string_table[index as usize].as_str();
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        let summary: Vec<(&str, &str, &str, i64)> = profiles
            .iter()
            .map(|p| {
                let sample_type = p.sample_type.as_ref().unwrap();
                (
                    text(p.period_type.as_ref().unwrap().type_strindex),
                    text(sample_type.type_strindex),
                    text(sample_type.unit_strindex),
                    p.samples.iter().map(|s| s.values[0]).sum(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("cpu-clock", "samples", "count", 100),
                ("page-faults", "samples", "count", 7),
                ("page-faults", "data_samples", "count", 7),
                ("page-faults", "latency", "cycles", 400),
            ]
        );
        // The latency samples carry the line's percentiles, in cycles.
        let latency = &profiles[3];
        let attributes: Vec<(&str, &str)> = latency.samples[0]
            .attribute_indices
            .iter()
            .map(|&i| {
                let attribute = &tables.attribute_table[i as usize];
                (text(attribute.key_strindex), text(attribute.unit_strindex))
            })
            .collect();
        for key in ["profiler.latency_max", "profiler.line_latency_p99"] {
            assert!(attributes.contains(&(key, "cycles")), "{attributes:?}");
        }
        assert!(attributes.contains(&("profiler.data.access", "")));
    }

    #[test]
    fn off_cpu_time_is_a_profile_of_nanoseconds() {
        let mut profile = test_profile::profile();
        profile.off_cpu = Some(crate::profile::offcpu::OffCpuProfile {
            blocks: vec![crate::profile::offcpu::OffCpuBlocks {
                pid: profile.stacks[0].pid,
                tid: profile.stacks[0].tid,
                frames: profile.stacks[0].frames.clone(),
                total_ns: 250_000_000,
                count: 5,
                ..Default::default()
            }],
            ..Default::default()
        });
        crate::export::offcpu::add_off_cpu_event(&mut profile);
        let series = series_of(
            &profile,
            &ServiceName::Auto,
            &CgroupPaths::default(),
            &mut no_kubernetes(),
        );
        let request = export_request(&series);
        let tables = request.dictionary.as_ref().unwrap();
        let text = |index: i32| tables.string_table[index as usize].as_str();
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        let off_cpu = profiles
            .iter()
            .find(|p| {
                p.period_type
                    .as_ref()
                    .is_some_and(|t| text(t.type_strindex) == "off-cpu")
            })
            .expect("an off-CPU profile");
        let sample_type = off_cpu.sample_type.as_ref().unwrap();
        assert_eq!(
            (
                text(sample_type.type_strindex),
                text(sample_type.unit_strindex)
            ),
            ("off-cpu", "nanoseconds")
        );
        let blocked: i64 = off_cpu.samples.iter().map(|s| s.values[0]).sum();
        assert_eq!(blocked, 250_000_000);
        // The sampled events' profiles still count samples.
        let sampled = profiles
            .iter()
            .find(|p| !std::ptr::eq(*p, off_cpu))
            .unwrap();
        assert_eq!(
            text(sampled.sample_type.as_ref().unwrap().unit_strindex),
            "count"
        );
    }
}
