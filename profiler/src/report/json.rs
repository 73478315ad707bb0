//! The `--json` report: the same content as the text report, in a stable schema
//! (`profiler.report/1`, documented in docs/json-report.md). Fields are only added within a
//! schema version, never renamed or removed.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    aggregate::{
        callgraph::{CallPath, Direction, Neighbours},
        dataspace::{DataLineDetails, DataObject, SharingHint, Touch},
        details::{CodeSource, DetailRow, FunctionDetails},
        filter::EventScale,
        functions::event_samples,
        latency::{Distribution, LatencySummary},
        views::{RowKey, View, ViewRow},
    },
    profile::{DataSymbol, ProfileMeta},
};

use super::{Content, Report};

pub const SCHEMA: &str = "profiler.report/1";

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: &'static str,
    view: &'static str,
    filters: JsonFilters<'a>,
    meta: &'a ProfileMeta,
    events: Vec<JsonEvent>,
    losses: &'a BTreeMap<String, u64>,
    /// `record --off-cpu`: where the threads waited.
    #[serde(skip_serializing_if = "Option::is_none")]
    off_cpu: Option<&'a crate::aggregate::offcpu::OffCpuReport>,
}

#[derive(Serialize)]
struct JsonFilters<'a> {
    event: Option<&'a str>,
    pids: &'a [u32],
    comm: Option<&'a str>,
    module: Option<&'a str>,
    /// `--top` as given; null when the rows are whole.
    top: Option<usize>,
    sort: &'static str,
}

#[derive(Serialize)]
struct JsonEvent {
    index: u32,
    name: String,
    unit: String,
    period: Option<u64>,
    frequency: Option<u64>,
    /// Call-stack samples of the event, before filters.
    samples: u64,
    samples_fired: u64,
    estimate: JsonEstimate,
    #[serde(flatten)]
    content: JsonContent,
    #[serde(skip_serializing_if = "Option::is_none")]
    hot_paths: Option<Vec<JsonPath>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_distributions: Option<Vec<JsonDistribution>>,
    /// Why a view is empty when the event cannot fill it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    /// How whole the user call stacks are.
    user_stacks: JsonStackQuality,
}

#[derive(Serialize)]
struct JsonStackQuality {
    /// Samples with a user stack, or whose user stack was lost.
    samples: u64,
    /// Ending at `_start`, `main` or a thread start, through code only.
    complete: u64,
    incomplete: u64,
    /// Of `incomplete`: holding an address outside every mapping.
    outside_code: u64,
    /// Of `incomplete`: cut short while the process's memory was going (exit, exec).
    in_exit_or_exec: u64,
    /// Walked by frame pointers alone where tables or a stack copy were asked for.
    frame_pointers_only: u64,
    lost: u64,
    complete_percent: f64,
    mean_depth: f64,
}

#[derive(Serialize)]
struct JsonEstimate {
    /// `counted` (the counter's exact count over its samples), `period`, `mean-period` or
    /// `none`.
    method: &'static str,
    events_per_sample: Option<f64>,
    /// The events all of `samples` stand for, rounded: what pprof's `_event` column adds up to.
    events: Option<u64>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum JsonContent {
    View(JsonView),
    Function {
        function_details: Option<JsonDetails>,
    },
    Callers {
        callers: JsonCallGraph,
    },
    Callees {
        callees: JsonCallGraph,
    },
}

#[derive(Serialize)]
struct JsonView {
    /// Samples that pass the filters: the 100% of the rows' percentages.
    view_samples: u64,
    total_rows: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    threads: Option<Vec<JsonRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    processes: Option<Vec<JsonRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    containers: Option<Vec<JsonRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    modules: Option<Vec<JsonRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    functions: Option<Vec<JsonRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lines: Option<Vec<JsonRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<Vec<JsonRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    icache_lines: Option<Vec<JsonRow>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dcache_lines: Option<Vec<JsonRow>>,
}

#[derive(Serialize)]
struct JsonRow {
    #[serde(flatten)]
    key: JsonKey,
    #[serde(flatten)]
    samples: JsonSamples,
    cumulative_percent: f64,
    estimated_events: Option<f64>,
    latency: Option<LatencySummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<JsonDataLine>,
}

/// Function rows count self samples (leaf) and total samples (anywhere on the stack).
#[derive(Serialize)]
#[serde(untagged)]
enum JsonSamples {
    Plain {
        samples: u64,
        percent: f64,
    },
    Function {
        self_samples: u64,
        self_percent: f64,
        total_samples: u64,
        total_percent: f64,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum JsonKey {
    Thread {
        pid: u32,
        tid: u32,
        comm: String,
    },
    Process {
        pid: u32,
        comm: String,
    },
    Container {
        container: String,
    },
    Module {
        module: String,
    },
    Function {
        function: String,
        module: String,
    },
    Line {
        file: Option<String>,
        line: Option<u32>,
        function: String,
    },
    Instruction {
        address: u64,
        module: String,
        module_offset: u64,
        location: String,
        source: Option<String>,
    },
    IcacheLine {
        address: u64,
        module: String,
        module_offset: u64,
        functions: Vec<String>,
    },
    DcacheLine {
        pid: u32,
        address: u64,
        object: JsonObject,
    },
}

#[derive(Serialize)]
struct JsonObject {
    /// `variables`, `heap`, `stack`, `file`, `anonymous`, `special` or `unknown`.
    kind: &'static str,
    description: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    variables: Vec<JsonVariable>,
}

#[derive(Serialize)]
struct JsonVariable {
    name: String,
    address: u64,
    size: u64,
    module: String,
}

#[derive(Serialize)]
struct JsonDataLine {
    loads: u64,
    stores: u64,
    instructions: Vec<JsonTouch>,
    functions: Vec<JsonTouch>,
    /// `null` when the capture did not record the accessing threads.
    threads: Option<Vec<JsonTouch>>,
    cpus: Vec<JsonTouch>,
    /// `several-writers`, `several-threads-unknown-access`, or `null`.
    sharing: Option<&'static str>,
    sharing_threads: Option<usize>,
}

#[derive(Serialize)]
struct JsonTouch {
    name: String,
    samples: u64,
    stores: u64,
}

#[derive(Serialize)]
struct JsonPath {
    samples: u64,
    /// Leaf first.
    functions: Vec<String>,
}

#[derive(Serialize)]
struct JsonCallGraph {
    function: String,
    module: String,
    total_samples: u64,
    self_samples: u64,
    view_samples: u64,
    /// `function: null`: for callers, the outermost frame (no caller captured); for callees,
    /// the function itself as the leaf.
    neighbours: Vec<JsonNeighbour>,
}

#[derive(Serialize)]
struct JsonNeighbour {
    function: Option<String>,
    module: Option<String>,
    samples: u64,
}

/// A function's details as the JSON report and the HTML report carry them.
#[derive(Serialize)]
pub struct JsonDetails {
    function: String,
    /// For an inlined function, the function whose instructions are shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    inlined_into: Option<String>,
    module: String,
    /// `disassembled`, `kernel` (no code bytes), `not-captured` or `no-disassembler` (not
    /// x86-64 code).
    code: &'static str,
    samples: u64,
    view_samples: u64,
    rows: Vec<JsonDetailRow>,
}

#[derive(Serialize)]
#[serde(tag = "row", rename_all = "kebab-case")]
enum JsonDetailRow {
    Statement {
        file: Option<String>,
        line: u32,
        out_of_order: bool,
        samples: u64,
    },
    Instruction {
        offset: u64,
        address: u64,
        slot: u64,
        line: Option<u32>,
        approximate_line: bool,
        text: Option<String>,
        samples: u64,
        latency: Option<LatencySummary>,
        cache_line_samples: Option<u64>,
    },
    CacheLineBoundary,
    Gap,
}

/// A latency distribution as the JSON report and the HTML report carry it.
#[derive(Serialize)]
pub struct JsonDistribution {
    /// `event`, `function`, `line` or `dcache-line`.
    scope: &'static str,
    name: String,
    latency: LatencySummary,
    /// `[lowest, highest, count]` per non-empty kernel bucket.
    buckets: Vec<[u64; 3]>,
}

fn estimate(scale: EventScale, samples: u64) -> JsonEstimate {
    let events = scale.estimate(samples).map(|events| events.round() as u64);
    match scale {
        EventScale::Counted {
            events: counted,
            samples: fired,
        } => JsonEstimate {
            method: "counted",
            events_per_sample: Some(counted as f64 / fired as f64),
            events,
        },
        EventScale::Period(period) => JsonEstimate {
            method: "period",
            events_per_sample: Some(period as f64),
            events,
        },
        EventScale::MeanPeriod(mean) => JsonEstimate {
            method: "mean-period",
            events_per_sample: Some(mean),
            events,
        },
        EventScale::Unknown => JsonEstimate {
            method: "none",
            events_per_sample: None,
            events,
        },
    }
}

fn object(object: &DataObject, line: u64) -> JsonObject {
    let (kind, variables): (&'static str, &[DataSymbol]) = match object {
        DataObject::Variables(variables) => ("variables", variables),
        DataObject::Heap => ("heap", &[]),
        DataObject::Stack => ("stack", &[]),
        DataObject::File { .. } => ("file", &[]),
        DataObject::Anonymous => ("anonymous", &[]),
        DataObject::Special(_) => ("special", &[]),
        DataObject::Unknown => ("unknown", &[]),
    };
    JsonObject {
        kind,
        description: object.describe(line),
        variables: variables
            .iter()
            .map(|v| JsonVariable {
                name: v.name.clone(),
                address: v.address,
                size: v.size,
                module: v.module.clone(),
            })
            .collect(),
    }
}

fn key(key: &RowKey) -> JsonKey {
    match key.clone() {
        RowKey::Thread { pid, tid, comm } => JsonKey::Thread { pid, tid, comm },
        RowKey::Process { pid, comm } => JsonKey::Process { pid, comm },
        RowKey::Container { container } => JsonKey::Container { container },
        RowKey::Module { module } => JsonKey::Module { module },
        RowKey::Function(f) => JsonKey::Function {
            function: f.name,
            module: f.module,
        },
        RowKey::Line {
            file,
            line,
            function,
        } => JsonKey::Line {
            file,
            line,
            function,
        },
        RowKey::Instruction {
            address,
            module,
            module_offset,
            location,
            source,
        } => JsonKey::Instruction {
            address,
            module,
            module_offset,
            location,
            source,
        },
        RowKey::IcacheLine {
            address,
            module,
            module_offset,
            functions,
            ..
        } => JsonKey::IcacheLine {
            address,
            module,
            module_offset,
            functions,
        },
        RowKey::DcacheLine {
            pid,
            address,
            object: data,
        } => JsonKey::DcacheLine {
            pid,
            address,
            object: object(&data, address),
        },
    }
}

fn touches(list: &[Touch]) -> Vec<JsonTouch> {
    list.iter()
        .map(|t| JsonTouch {
            name: t.name.clone(),
            samples: t.samples,
            stores: t.stores,
        })
        .collect()
}

fn data_line(details: &DataLineDetails) -> JsonDataLine {
    let (sharing, sharing_threads) = match details.sharing {
        Some(SharingHint::SeveralWriters(n)) => (Some("several-writers"), Some(n)),
        Some(SharingHint::SeveralThreadsUnknownAccess(n)) => {
            (Some("several-threads-unknown-access"), Some(n))
        }
        None => (None, None),
    };
    JsonDataLine {
        loads: details.loads,
        stores: details.stores,
        instructions: touches(&details.instructions),
        functions: touches(&details.functions),
        threads: details.threads.as_deref().map(touches),
        cpus: touches(&details.cpus),
        sharing,
        sharing_threads,
    }
}

fn row(row: &ViewRow, details: Option<&DataLineDetails>) -> JsonRow {
    let samples = match (row.total_samples, row.total_percent) {
        (Some(total_samples), Some(total_percent)) => JsonSamples::Function {
            self_samples: row.samples,
            self_percent: row.percent,
            total_samples,
            total_percent,
        },
        _ => JsonSamples::Plain {
            samples: row.samples,
            percent: row.percent,
        },
    };
    JsonRow {
        key: key(&row.key),
        samples,
        cumulative_percent: row.cumulative_percent,
        estimated_events: row.estimated_events,
        latency: row.latency.clone(),
        details: details.map(data_line),
    }
}

fn view(view: &View, lines: &[DataLineDetails]) -> JsonView {
    let rows: Vec<JsonRow> = view
        .rows
        .iter()
        .map(|r| {
            let details = match r.key {
                RowKey::DcacheLine { pid, address, .. } => {
                    lines.iter().find(|l| l.pid == pid && l.line == address)
                }
                _ => None,
            };
            row(r, details)
        })
        .collect();
    let mut json = JsonView {
        view_samples: view.total_samples,
        total_rows: view.total_rows,
        threads: None,
        processes: None,
        containers: None,
        modules: None,
        functions: None,
        lines: None,
        instructions: None,
        icache_lines: None,
        dcache_lines: None,
    };
    use crate::aggregate::views::ViewKind::*;
    let slot = match view.kind {
        Thread => &mut json.threads,
        Process => &mut json.processes,
        Container => &mut json.containers,
        Module => &mut json.modules,
        Function => &mut json.functions,
        Line => &mut json.lines,
        Instruction => &mut json.instructions,
        IcacheLine => &mut json.icache_lines,
        DcacheLine => &mut json.dcache_lines,
    };
    *slot = Some(rows);
    json
}

pub fn details(details: &FunctionDetails) -> JsonDetails {
    JsonDetails {
        function: details.function.name.clone(),
        inlined_into: details.inlined_into.as_ref().map(|host| host.name.clone()),
        module: details.module.clone(),
        code: match details.source {
            CodeSource::Disassembled => "disassembled",
            CodeSource::Kernel => "kernel",
            CodeSource::NotCaptured => "not-captured",
            CodeSource::NoDisassembler => "no-disassembler",
        },
        samples: details.samples,
        view_samples: details.event_samples,
        rows: details
            .rows
            .iter()
            .map(|row| match row {
                DetailRow::Statement(s) => JsonDetailRow::Statement {
                    file: s.file.clone(),
                    line: s.line,
                    out_of_order: s.out_of_order,
                    samples: s.samples,
                },
                DetailRow::Instruction(i) => JsonDetailRow::Instruction {
                    offset: i.offset,
                    address: i.address,
                    slot: i.slot,
                    line: i.line,
                    approximate_line: i.approximate_line,
                    text: i.text.clone(),
                    samples: i.samples,
                    latency: i.latency.clone(),
                    cache_line_samples: i.cache_line_samples,
                },
                DetailRow::CacheLineBoundary => JsonDetailRow::CacheLineBoundary,
                DetailRow::Gap => JsonDetailRow::Gap,
            })
            .collect(),
    }
}

fn call_graph(graph: &Neighbours) -> JsonCallGraph {
    JsonCallGraph {
        function: graph.function.name.clone(),
        module: graph.function.module.clone(),
        total_samples: graph.total_samples,
        self_samples: graph.self_samples,
        view_samples: graph.event_samples,
        neighbours: graph
            .neighbours
            .iter()
            .map(|n| JsonNeighbour {
                function: n.function.as_ref().map(|f| f.name.clone()),
                module: n.function.as_ref().map(|f| f.module.clone()),
                samples: n.samples,
            })
            .collect(),
    }
}

fn paths(paths: &[CallPath]) -> Vec<JsonPath> {
    paths
        .iter()
        .map(|p| JsonPath {
            samples: p.samples,
            functions: p.functions.clone(),
        })
        .collect()
}

pub fn distribution(d: &Distribution) -> JsonDistribution {
    JsonDistribution {
        scope: d.scope.name(),
        name: d.label.clone(),
        latency: d.summary.clone(),
        buckets: d
            .buckets
            .iter()
            .map(|(bucket, count)| {
                let (low, high) = profiler_common::latency::bucket_range(usize::from(*bucket));
                [low, high, *count]
            })
            .collect(),
    }
}

pub fn render(report: &Report) -> serde_json::Result<String> {
    let profile = report.profile;
    let args = report.args;
    let events = report
        .sections
        .iter()
        .map(|section| {
            let index = section.event;
            let event = &profile.events[index as usize];
            let content = match &section.content {
                Content::View { view: v, lines } => JsonContent::View(view(v, lines)),
                Content::Function(d) => JsonContent::Function {
                    function_details: d.as_ref().map(details),
                },
                Content::CallGraph(graph) => match graph.direction {
                    Direction::Callers => JsonContent::Callers {
                        callers: call_graph(graph),
                    },
                    Direction::Callees => JsonContent::Callees {
                        callees: call_graph(graph),
                    },
                },
            };
            let has_paths = matches!(section.content, Content::CallGraph(_))
                || matches!(&section.content, Content::View { view, .. }
                    if view.kind == crate::aggregate::views::ViewKind::Function);
            let samples = event_samples(profile, index);
            JsonEvent {
                index,
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
                estimate: estimate(EventScale::of(profile, index), samples),
                content,
                hot_paths: has_paths.then(|| paths(&section.hot_paths)),
                latency_distributions: section
                    .latency
                    .as_ref()
                    .map(|list| list.iter().map(distribution).collect()),
                notes: section.notes.clone(),
                user_stacks: JsonStackQuality {
                    samples: section.stacks.user_samples,
                    complete: section.stacks.complete,
                    incomplete: section.stacks.incomplete(),
                    outside_code: section.stacks.outside_code,
                    in_exit_or_exec: section.stacks.in_exit_or_exec,
                    frame_pointers_only: section.stacks.frame_pointers_only,
                    lost: section.stacks.lost,
                    complete_percent: section.stacks.complete_percent(),
                    mean_depth: section.stacks.mean_user_depth,
                },
            }
        })
        .collect();
    serde_json::to_string_pretty(&JsonReport {
        schema: SCHEMA,
        view: report.view_name(),
        filters: JsonFilters {
            event: args.event.as_deref(),
            pids: &args.pids,
            comm: args.comm.as_deref(),
            module: args.module.as_deref(),
            top: args.top.filter(|&rows| rows > 0),
            sort: args.sort.name(),
        },
        meta: &profile.meta,
        events,
        losses: &profile.losses.counters,
        off_cpu: report.off_cpu.as_ref(),
    })
}
