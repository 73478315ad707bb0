//! The `--json` report: the same content as the text report, in a stable schema
//! (`profiler.report/1`, documented in docs/json-report.md).

use serde::Serialize;

use crate::{
    aggregate::functions::{event_samples, function_rows, hot_paths},
    profile::{Profile, ProfileMeta},
};

pub const SCHEMA: &str = "profiler.report/1";

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: &'static str,
    meta: &'a ProfileMeta,
    events: Vec<JsonEvent>,
    losses: &'a std::collections::BTreeMap<String, u64>,
}

#[derive(Serialize)]
struct JsonEvent {
    name: String,
    unit: String,
    period: Option<u64>,
    frequency: Option<u64>,
    samples: u64,
    samples_fired: u64,
    functions: Vec<JsonFunction>,
    hot_paths: Vec<JsonPath>,
}

#[derive(Serialize)]
struct JsonFunction {
    function: String,
    module: String,
    self_samples: u64,
    self_percent: f64,
    total_samples: u64,
    total_percent: f64,
}

#[derive(Serialize)]
struct JsonPath {
    samples: u64,
    /// Leaf first.
    functions: Vec<String>,
}

fn percent(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * part as f64 / total as f64
    }
}

pub fn render(profile: &Profile, top: usize, paths: usize) -> serde_json::Result<String> {
    let events = profile
        .events
        .iter()
        .enumerate()
        .map(|(index, event)| {
            let index = index as u32;
            let samples = event_samples(profile, index);
            JsonEvent {
                name: event.name.clone(),
                unit: event.unit.clone(),
                period: event.period,
                frequency: event.frequency,
                samples,
                samples_fired: profile
                    .losses
                    .samples_fired
                    .get(index as usize)
                    .copied()
                    .unwrap_or(0),
                functions: function_rows(profile, index)
                    .into_iter()
                    .take(top)
                    .map(|row| JsonFunction {
                        self_percent: percent(row.self_samples, samples),
                        total_percent: percent(row.total_samples, samples),
                        function: row.function.name,
                        module: row.function.module,
                        self_samples: row.self_samples,
                        total_samples: row.total_samples,
                    })
                    .collect(),
                hot_paths: hot_paths(profile, index, paths)
                    .into_iter()
                    .map(|path| JsonPath {
                        samples: path.samples,
                        functions: path.functions,
                    })
                    .collect(),
            }
        })
        .collect();
    serde_json::to_string_pretty(&JsonReport {
        schema: SCHEMA,
        meta: &profile.meta,
        events,
        losses: &profile.losses.counters,
    })
}
