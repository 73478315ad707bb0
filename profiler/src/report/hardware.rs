//! Hardware views of a profile, per function, instruction or data cache line: `perf mem`-style
//! data-source breakdowns (memory level, snoop, TLB, lock, locality) and AMD IBS derived
//! counters with CodeXL's ratios, as text or JSON; plus the list of skid-backtracked
//! attributions.
//!
//! Each event is its own section and percentages are of that event's samples only: IBS counts are
//! numbers of IBS samples and are never added to or divided by event-based counts. IBS events the
//! recording CPU does not report are left out of the rows and named once, with the reason.
//!
//! [`HardwareArgs`] are its command-line options, `--hardware` and `--backtrack`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use profiler_common::hw::data_src::DataSource;
use profiler_common::hw::ibs::events::{
    Availability, IbsFetchCounters, IbsFetchEvent, IbsOpCounters, IbsOpEvent,
};
use profiler_common::hw::ibs::{IbsCaps, IbsErrata};
use profiler_common::hw::spe::{SpeCounters, SpeEvent};
use serde::Serialize;

use crate::aggregate::filter::{SampleFilter, Selection};
use crate::aggregate::latency::{LatencyAccumulator, LatencySummary, LineHistograms};
use crate::aggregate::location::{code_position, innermost_location, CACHE_LINE};
use crate::hardware::{backtrack_profile, BacktrackSummary};
use crate::profile::{module_basename, EventIndex, Frame, HardwareSample, Profile};

/// The hardware report's options, for `record` and `report`.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct HardwareArgs {
    /// Attribute samples of non-precise data events (cache and TLB misses) to the memory access
    /// before the sampled instruction, walking back over the skid (x86-64 user code).
    #[arg(long)]
    pub backtrack: bool,
    /// Also show what precise samplers reported (perf mem data sources, IBS counters) by
    /// function, source line, instruction, instruction cache line or data cache line.
    #[arg(long, value_enum, value_name = "VIEW")]
    pub hardware: Option<HardwareView>,
}

impl HardwareArgs {
    /// Applies `--backtrack` to a profile about to be reported.
    pub fn prepare(&self, profile: &mut Profile) -> Option<BacktrackSummary> {
        self.backtrack.then(|| backtrack_profile(profile))
    }
}

/// Rows of one event the text rendering shows; JSON has them all.
const TEXT_ROWS: usize = 25;

/// What the rows of a hardware view are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum HardwareView {
    Function,
    /// Source lines (the innermost inlined location).
    Line,
    Instruction,
    /// 64-byte lines of code: where IBS fetch samples show instruction-cache behaviour.
    IcacheLine,
    /// 64-byte lines of data addresses; samples without a data address are left out.
    DataLine,
}

impl HardwareView {
    fn noun(self) -> &'static str {
        match self {
            HardwareView::Function => "function",
            HardwareView::Line => "source line",
            HardwareView::Instruction => "instruction",
            HardwareView::IcacheLine => "instruction cache line",
            HardwareView::DataLine => "data cache line",
        }
    }
}

/// One event's hardware samples, grouped by the view.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HardwareSection {
    pub event: String,
    /// Whether the IPs are exact; otherwise rows may name an instruction after the real one.
    pub precise: bool,
    /// What `samples` counts: "samples", "IBS op samples" or "IBS fetch samples".
    pub counted: &'static str,
    pub samples: u64,
    pub rows: Vec<HardwareRow>,
    /// IBS events the recording CPU does not report, and why.
    pub not_reported: Vec<NotReported>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NotReported {
    pub event: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HardwareRow {
    /// The function, the source line (`file:line (function)`), the instruction
    /// (`function+0xoffset (file:line)`), the code line (`module+0xoffset`), or the data line
    /// (`0xaddress (pid N)`).
    pub location: String,
    pub samples: u64,
    /// Data-line rows: the distribution of the latencies of all the line's samples (load
    /// latency, in core cycles), when they carried one.
    pub latency: Option<LatencySummary>,
    /// Present when the samples carried a data source.
    pub data_source: Option<DataSourceBreakdown>,
    pub ibs_op: Option<DerivedColumns>,
    pub ibs_fetch: Option<DerivedColumns>,
    /// Arm SPE events and latencies.
    pub spe: Option<DerivedColumns>,
}

/// Samples per label of each `perf mem` column, most frequent first.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DataSourceBreakdown {
    pub level: Vec<Share>,
    pub snoop: Vec<Share>,
    pub tlb: Vec<Share>,
    pub lock: Vec<Share>,
    pub locality: Vec<Share>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Share {
    pub label: &'static str,
    pub samples: u64,
}

/// Counts derived from IBS or SPE samples (the events the CPU reports) and the ratios over
/// them (CodeXL's for IBS).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DerivedColumns {
    pub counts: Vec<Count>,
    pub ratios: Vec<Ratio>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Count {
    pub event: &'static str,
    pub value: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ratio {
    pub name: &'static str,
    pub value: f64,
    /// Whether `value` is a fraction (shown as a percentage) rather than cycles.
    pub fraction: bool,
}

/// The attributions `--backtrack` moved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BacktrackedRow {
    pub event: String,
    pub pid: u32,
    /// The memory-referencing instruction the samples are attributed to.
    pub attributed: String,
    /// The instruction the interrupt reported.
    pub sampled: String,
    pub samples: u64,
}

/// Everything a hardware view shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HardwareReport {
    pub view: HardwareView,
    pub sections: Vec<HardwareSection>,
    pub backtracked: Vec<BacktrackedRow>,
}

/// The JSON form of [`hardware_report`].
pub fn hardware_json(profile: &Profile, by: HardwareView) -> serde_json::Value {
    serde_json::to_value(hardware_report(profile, by)).expect("the report serializes")
}

/// The text form of [`hardware_report`]; empty when the profile has no hardware samples and no
/// backtracked attributions.
pub fn render_hardware(profile: &Profile, by: HardwareView) -> String {
    let report = hardware_report(profile, by);
    let mut out = String::new();
    if report.sections.is_empty() && report.backtracked.is_empty() {
        let events: Vec<&str> = profile.events.iter().map(|e| e.name.as_str()).collect();
        writeln!(
            out,
            "\nNo hardware data for --hardware: it needs samples of a precise memory event \
             (Intel PEBS, e.g. -e cpu/mem-loads,ldlat=30/P), of AMD IBS (-e ibs_op//, \
             -e ibs_fetch//), of Arm SPE (imported from perf.data) or of an event with data \
             addresses under --backtrack; this \
             profile has {}",
            events.join(", ")
        )
        .unwrap();
    }
    for section in &report.sections {
        render_section(&mut out, section, by);
    }
    if !report.backtracked.is_empty() {
        writeln!(
            out,
            "Skid backtracking: samples of non-precise data events attributed to the memory \
             access before the sampled instruction"
        )
        .unwrap();
        for row in &report.backtracked {
            writeln!(
                out,
                "  {}: {} samples of pid {} at {} (sampled at {})",
                row.event, row.samples, row.pid, row.attributed, row.sampled
            )
            .unwrap();
        }
    }
    out
}

/// Groups the profile's hardware samples by `by`, per event.
pub fn hardware_report(profile: &Profile, by: HardwareView) -> HardwareReport {
    let hardware = &profile.hardware;
    let caps = IbsCaps(hardware.ibs_caps.unwrap_or(0));
    let errata = hardware
        .cpu
        .as_ref()
        .filter(|cpu| cpu.vendor == "AuthenticAMD")
        .map_or(IbsErrata::default(), |cpu| {
            IbsErrata::for_cpu(cpu.family, cpu.model)
        });
    let no_filter = SampleFilter::default();
    let everything = Selection::new(profile, &no_filter);
    let mut sections = Vec::new();
    for (index, event) in profile.events.iter().enumerate() {
        let samples: Vec<&HardwareSample> = hardware
            .samples
            .iter()
            .filter(|s| s.event as usize == index)
            .filter(|s| by != HardwareView::DataLine || s.line.is_some())
            .collect();
        if samples.is_empty() {
            continue;
        }
        // Grouped by what the row is (full paths), labelled shorter.
        let mut groups: BTreeMap<String, (String, Vec<&HardwareSample>)> = BTreeMap::new();
        for sample in &samples {
            let frame = &profile.frames[sample.frame as usize];
            let (key, label) = location(by, frame, sample);
            groups
                .entry(key)
                .or_insert_with(|| (label, Vec::new()))
                .1
                .push(sample);
        }
        // Data lines: mean and maximum from the line's samples, percentiles from its histogram.
        let mut line_latency: BTreeMap<(u32, u64), LatencyAccumulator> = BTreeMap::new();
        if by == HardwareView::DataLine {
            for sample in profile
                .data_lines
                .iter()
                .filter(|s| s.event as usize == index)
            {
                line_latency
                    .entry((sample.pid, sample.line))
                    .or_default()
                    .add_stats(&sample.stats);
            }
            let histograms = LineHistograms::new(profile, index as EventIndex, &everything);
            for ((pid, line), buckets) in histograms.iter() {
                line_latency
                    .entry((pid, line))
                    .or_default()
                    .add_buckets(buckets);
            }
        }
        let mut rows: Vec<HardwareRow> = groups
            .into_values()
            .map(|(location, samples)| {
                let mut row = row(location, &samples, caps, errata);
                // Data-line rows hold one (pid, line): the one of their first sample.
                let line = samples[0].line.map(|line| (samples[0].pid, line));
                row.latency = line
                    .and_then(|line| line_latency.get(&line))
                    .and_then(LatencyAccumulator::summary);
                row
            })
            .collect();
        rows.sort_by(|a, b| {
            b.samples
                .cmp(&a.samples)
                .then_with(|| a.location.cmp(&b.location))
        });
        let op = samples.iter().any(|s| s.ibs_op.is_some());
        let fetch = samples.iter().any(|s| s.ibs_fetch.is_some());
        let spe = samples.iter().any(|s| s.spe.is_some());
        let counted = match (op, fetch, spe) {
            (true, false, false) => "IBS op samples",
            (false, true, false) => "IBS fetch samples",
            (false, false, true) => "SPE samples",
            _ => "samples",
        };
        let mut not_reported = Vec::new();
        if op {
            not_reported.extend(
                IbsOpEvent::ALL
                    .iter()
                    .filter_map(|event| lacking(event.name(), event.availability(caps, errata))),
            );
        }
        if fetch {
            not_reported.extend(
                IbsFetchEvent::ALL
                    .iter()
                    .filter_map(|event| lacking(event.name(), event.availability(caps, errata))),
            );
        }
        sections.push(HardwareSection {
            event: event.name.clone(),
            precise: event.precise,
            counted,
            samples: samples.iter().map(|s| s.samples).sum(),
            rows,
            not_reported,
        });
    }
    let backtracked = hardware
        .backtracked
        .iter()
        .map(|moved| BacktrackedRow {
            event: profile
                .events
                .get(moved.event as usize)
                .map_or_else(|| format!("event {}", moved.event), |e| e.name.clone()),
            pid: moved.pid,
            attributed: instruction(&profile.frames[moved.attributed as usize]),
            sampled: instruction(&profile.frames[moved.sampled as usize]),
            samples: moved.samples,
        })
        .collect();
    HardwareReport {
        view: by,
        sections,
        backtracked,
    }
}

fn lacking(event: &'static str, availability: Availability) -> Option<NotReported> {
    match availability {
        Availability::Reported => None,
        Availability::NotReported(reason) => Some(NotReported { event, reason }),
    }
}

/// What a sample's row is, by full path so that rows of same-named files or modules stay apart,
/// and the row's label.
fn location(by: HardwareView, frame: &Frame, sample: &HardwareSample) -> (String, String) {
    match by {
        HardwareView::Function => (
            format!("{}\0{}", frame.module, function(frame)),
            function(frame),
        ),
        HardwareView::Line => match innermost_location(frame) {
            (Some(file), Some(line), function) => (
                format!("{file}:{line}\0{function}"),
                format!("{}:{line} ({function})", module_basename(file)),
            ),
            (_, _, function) => (format!("{}\0{function}", frame.module), function),
        },
        HardwareView::Instruction => (
            format!("{}\0{:#x}", frame.module, code_position(frame).1),
            instruction(frame),
        ),
        HardwareView::IcacheLine => {
            let (module, offset) = code_position(frame);
            let line = offset & !(CACHE_LINE - 1);
            let label = if module.is_empty() {
                format!("{line:#x}")
            } else {
                format!("{}+{line:#x}", module_basename(&module))
            };
            (format!("{module}\0{line:#x}"), label)
        }
        HardwareView::DataLine => {
            let line = sample.line.expect("filtered on a line");
            let label = format!("{line:#x} (pid {})", sample.pid);
            (label.clone(), label)
        }
    }
}

/// The function of a frame; code without symbols is grouped by its module.
fn function(frame: &Frame) -> String {
    match &frame.function {
        Some(function) => function.clone(),
        None if frame.module.is_empty() => crate::profile::UNKNOWN_FUNCTION.to_string(),
        None => format!("[{}]", module_basename(&frame.module)),
    }
}

/// `function+0xoffset (file:line)`, or the module offset for code without symbols.
fn instruction(frame: &Frame) -> String {
    let mut text = crate::aggregate::location::instruction_location(frame);
    if let (Some(file), Some(line)) = (&frame.file, frame.line) {
        write!(text, " ({}:{line})", module_basename(file)).unwrap();
    }
    text
}

fn row(
    location: String,
    samples: &[&HardwareSample],
    caps: IbsCaps,
    errata: IbsErrata,
) -> HardwareRow {
    let mut sources: BTreeMap<u64, u64> = BTreeMap::new();
    let mut op: Option<IbsOpCounters> = None;
    let mut fetch: Option<IbsFetchCounters> = None;
    let mut spe: Option<SpeCounters> = None;
    for sample in samples {
        for &(raw, count) in &sample.data_sources {
            *sources.entry(raw).or_default() += count;
        }
        if let Some(counters) = &sample.ibs_op {
            op.get_or_insert_with(Default::default).merge(counters);
        }
        if let Some(counters) = &sample.ibs_fetch {
            fetch.get_or_insert_with(Default::default).merge(counters);
        }
        if let Some(counters) = &sample.spe {
            spe.get_or_insert_with(Default::default).merge(counters);
        }
    }
    HardwareRow {
        location,
        samples: samples.iter().map(|s| s.samples).sum(),
        latency: None,
        data_source: (!sources.is_empty()).then(|| breakdown(&sources)),
        ibs_op: op.map(|counters| op_columns(&counters, caps, errata)),
        ibs_fetch: fetch.map(|counters| fetch_columns(&counters, caps, errata)),
        spe: spe.map(|counters| spe_columns(&counters)),
    }
}

fn spe_columns(counters: &SpeCounters) -> DerivedColumns {
    let operations = [
        ("loads", counters.loads),
        ("stores", counters.stores),
        ("branches", counters.branches),
    ];
    let counts = operations
        .into_iter()
        .chain(
            SpeEvent::ALL
                .iter()
                .map(|&event| (event.name(), counters.event(event))),
        )
        .map(|(event, value)| Count { event, value })
        .collect();
    let ratios = [
        cycles("average total latency", counters.average_total_latency()),
        cycles("average issue latency", counters.average_issue_latency()),
        cycles(
            "average translation latency",
            counters.average_translation_latency(),
        ),
        fraction("L1D miss rate", counters.l1d_miss_rate()),
        fraction("LLC miss rate", counters.llc_miss_rate()),
        fraction("TLB walk rate", counters.tlb_walk_rate()),
        fraction("branch mispredict rate", counters.branch_mispredict_rate()),
    ]
    .into_iter()
    .flatten()
    .collect();
    DerivedColumns { counts, ratios }
}

fn breakdown(sources: &BTreeMap<u64, u64>) -> DataSourceBreakdown {
    type Label = fn(&DataSource) -> &'static str;
    let columns: [Label; 5] = [
        DataSource::level_label,
        DataSource::snoop_label,
        DataSource::tlb_label,
        DataSource::lock_label,
        DataSource::locality_label,
    ];
    let [level, snoop, tlb, lock, locality] = columns.map(|label| {
        let mut shares: BTreeMap<&'static str, u64> = BTreeMap::new();
        for (&raw, &count) in sources {
            *shares.entry(label(&DataSource::decode(raw))).or_default() += count;
        }
        let mut shares: Vec<Share> = shares
            .into_iter()
            .map(|(label, samples)| Share { label, samples })
            .collect();
        shares.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.label.cmp(b.label)));
        shares
    });
    DataSourceBreakdown {
        level,
        snoop,
        tlb,
        lock,
        locality,
    }
}

fn fraction(name: &'static str, value: Option<f64>) -> Option<Ratio> {
    value.map(|value| Ratio {
        name,
        value,
        fraction: true,
    })
}

fn cycles(name: &'static str, value: Option<f64>) -> Option<Ratio> {
    value.map(|value| Ratio {
        name,
        value,
        fraction: false,
    })
}

fn op_columns(counters: &IbsOpCounters, caps: IbsCaps, errata: IbsErrata) -> DerivedColumns {
    let counts = IbsOpEvent::ALL
        .iter()
        .filter(|event| event.availability(caps, errata) == Availability::Reported)
        .filter_map(|&event| {
            Some(Count {
                event: event.name(),
                value: counters.get(event)?,
            })
        })
        .collect();
    let ratios = [
        cycles("average tag-to-retire", counters.average_tag_to_retire()),
        cycles(
            "average completion-to-retire",
            counters.average_completion_to_retire(),
        ),
        fraction("branch mispredict rate", counters.branch_mispredict_rate()),
        fraction("taken branch rate", counters.branch_taken_rate()),
        fraction("return mispredict rate", counters.return_mispredict_rate()),
        fraction("DC miss rate", counters.dc_miss_rate()),
        cycles(
            "average DC miss latency",
            counters.average_dc_miss_latency(),
        ),
        fraction("L1 DTLB miss rate", counters.l1_dtlb_miss_rate()),
        fraction("L2 DTLB miss rate", counters.l2_dtlb_miss_rate()),
        fraction("misaligned rate", counters.misaligned_rate()),
        cycles("average local latency", counters.average_local_latency()),
        cycles("average remote latency", counters.average_remote_latency()),
    ]
    .into_iter()
    .flatten()
    .collect();
    DerivedColumns { counts, ratios }
}

fn fetch_columns(counters: &IbsFetchCounters, caps: IbsCaps, errata: IbsErrata) -> DerivedColumns {
    let reported =
        |event: IbsFetchEvent| event.availability(caps, errata) == Availability::Reported;
    let counts = IbsFetchEvent::ALL
        .iter()
        .filter(|&&event| reported(event))
        .filter_map(|&event| {
            Some(Count {
                event: event.name(),
                value: counters.get(event)?,
            })
        })
        .collect();
    let ratios = [
        cycles("average fetch latency", counters.average_fetch_latency()),
        fraction("fetch abort rate", counters.fetch_abort_rate()),
        fraction("IC miss rate", counters.ic_miss_rate())
            .filter(|_| reported(IbsFetchEvent::IcMiss)),
        fraction("L1 ITLB miss rate", counters.l1_itlb_miss_rate()),
        fraction("L2 ITLB miss rate", counters.l2_itlb_miss_rate()),
        cycles(
            "average ITLB refill latency",
            counters.average_itlb_refill_latency(),
        )
        .filter(|_| reported(IbsFetchEvent::ItlbRefillLatencyTotal)),
    ]
    .into_iter()
    .flatten()
    .collect();
    DerivedColumns { counts, ratios }
}

fn render_section(out: &mut String, section: &HardwareSection, by: HardwareView) {
    let skid = if section.precise {
        "precise"
    } else {
        "approximate: the IP may skid past the instruction that caused the event"
    };
    writeln!(
        out,
        "{} ({skid}): {} {} with hardware data, by {}",
        section.event,
        section.samples,
        section.counted,
        by.noun()
    )
    .unwrap();
    if section.counted != "samples" {
        writeln!(
            out,
            "  (counts are {}; never compare them with event-based sample counts)",
            section.counted
        )
        .unwrap();
    }
    let share = |samples: u64| 100.0 * samples as f64 / section.samples.max(1) as f64;
    for row in section.rows.iter().take(TEXT_ROWS) {
        writeln!(
            out,
            "  {:>6.2}% {:>8}  {}",
            share(row.samples),
            row.samples,
            row.location
        )
        .unwrap();
        if let Some(latency) = &row.latency {
            let percentile = |value: Option<u64>| value.map_or("-".to_string(), |v| v.to_string());
            writeln!(
                out,
                "      {:<13} {} samples: mean {:.1}, p50 {}, p90 {}, p99 {}, max {} cycles",
                "load latency",
                latency.samples,
                latency.mean,
                percentile(latency.p50),
                percentile(latency.p90),
                percentile(latency.p99),
                latency.max
            )
            .unwrap();
        }
        if let Some(sources) = &row.data_source {
            for (name, shares) in [
                ("memory level", &sources.level),
                ("snoop", &sources.snoop),
                ("TLB", &sources.tlb),
                ("lock", &sources.lock),
                ("locality", &sources.locality),
            ] {
                let total: u64 = shares.iter().map(|s| s.samples).sum();
                let parts: Vec<String> = shares
                    .iter()
                    .map(|s| {
                        format!(
                            "{} {} ({:.1}%)",
                            s.label,
                            s.samples,
                            100.0 * s.samples as f64 / total.max(1) as f64
                        )
                    })
                    .collect();
                writeln!(out, "      {name:<13} {}", parts.join(", ")).unwrap();
            }
        }
        for (name, columns) in [
            ("IBS op", &row.ibs_op),
            ("IBS fetch", &row.ibs_fetch),
            ("SPE", &row.spe),
        ] {
            let Some(columns) = columns else { continue };
            let counts: Vec<String> = columns
                .counts
                .iter()
                .filter(|count| count.value != 0)
                .map(|count| format!("{} {}", count.event, count.value))
                .collect();
            writeln!(out, "      {name:<13} {}", counts.join(", ")).unwrap();
            let ratios: Vec<String> = columns
                .ratios
                .iter()
                .map(|ratio| {
                    if ratio.fraction {
                        format!("{} {:.2}%", ratio.name, 100.0 * ratio.value)
                    } else {
                        format!("{} {:.1} cycles", ratio.name, ratio.value)
                    }
                })
                .collect();
            if !ratios.is_empty() {
                writeln!(out, "      {:<13} {}", "ratios", ratios.join(", ")).unwrap();
            }
        }
    }
    if section.rows.len() > TEXT_ROWS {
        writeln!(
            out,
            "  ... {} more rows (the JSON report has them all)",
            section.rows.len() - TEXT_ROWS
        )
        .unwrap();
    }
    for missing in &section.not_reported {
        writeln!(
            out,
            "  not reported by this CPU: {}: {}",
            missing.event, missing.reason
        )
        .unwrap();
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use profiler_common::hw::ibs::events::IbsFetchCounters;

    use super::*;
    use crate::aggregate::test_samples::{self, COMPUTE_LATE};
    use crate::profile::test_profile::{COMPUTE_INLINED, STRIPPED};
    use crate::profile::FrameId;

    /// IBS fetch samples at two instructions of one cache line of app's `compute` (one inlined
    /// from src/simd.rs:88, one at src/app.rs:39) and in the stripped library.
    fn fetch_profile() -> Profile {
        let mut profile = test_samples::profile();
        let fetches = |frame: FrameId, samples: u64| HardwareSample {
            pid: 100,
            event: 0,
            frame,
            line: None,
            samples,
            data_sources: Vec::new(),
            ibs_op: None,
            ibs_fetch: Some(IbsFetchCounters {
                all_samples: samples,
                attempted: samples,
                completed: samples,
                ic_miss: 1,
                ..IbsFetchCounters::default()
            }),
            spe: None,
        };
        profile.hardware.ibs_caps = Some(0b111);
        profile.hardware.samples = vec![
            fetches(COMPUTE_INLINED, 6),
            fetches(COMPUTE_LATE, 2),
            fetches(STRIPPED, 4),
        ];
        profile
    }

    fn rows(by: HardwareView) -> Vec<(String, u64)> {
        hardware_report(&fetch_profile(), by).sections[0]
            .rows
            .iter()
            .map(|row| (row.location.clone(), row.samples))
            .collect()
    }

    #[test]
    fn source_lines_are_the_innermost_inlined_locations() {
        assert_eq!(
            rows(HardwareView::Line),
            [
                ("simd.rs:88 (add_lanes)".to_string(), 6),
                ("libblob.so+0x4a10".to_string(), 4),
                ("app.rs:39 (compute)".to_string(), 2),
            ]
        );
    }

    #[test]
    fn instruction_cache_lines_group_64_bytes_of_a_module() {
        // compute+0x90 and compute+0xa4 are app offsets 0x1290 and 0x12a4: one line at 0x1280.
        assert_eq!(
            rows(HardwareView::IcacheLine),
            [
                ("app+0x1280".to_string(), 8),
                ("libblob.so+0x4a00".to_string(), 4),
            ]
        );
        let text = render_hardware(&fetch_profile(), HardwareView::IcacheLine);
        assert!(
            text.contains("12 IBS fetch samples with hardware data, by instruction cache line"),
            "{text}"
        );
        // The 8 fetches of the line: 2 missed the instruction cache.
        assert!(text.contains("IC miss rate 25.00%"), "{text}");
    }

    #[test]
    fn options_parse_as_flags() {
        use clap::Parser;

        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            hardware: HardwareArgs,
        }
        let parsed = Command::try_parse_from(["report", "--backtrack", "--hardware", "data-line"])
            .unwrap()
            .hardware;
        assert_eq!(
            parsed,
            HardwareArgs {
                backtrack: true,
                hardware: Some(HardwareView::DataLine)
            }
        );
        let none = Command::try_parse_from(["report"]).unwrap().hardware;
        assert_eq!(none, HardwareArgs::default());
        let err = Command::try_parse_from(["report", "--hardware", "cache-line"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("function, line, instruction, icache-line, data-line"),
            "{err}"
        );
        let mut profile = Profile::default();
        assert_eq!(none.prepare(&mut profile), None);
        assert_eq!(
            parsed.prepare(&mut profile),
            Some(BacktrackSummary::default())
        );
    }
}
