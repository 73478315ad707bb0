//! `--html FILE`: one self-contained HTML file (its script, styles and data inline; it asks the
//! network for nothing, so it opens from a mailed attachment) with a flame graph and an icicle
//! view of every event, search, zoom, a differential view against another event or another
//! profile, and for each hot function its callers, callees, source lines and instructions with
//! their samples by instruction cache line, the data cache lines it touched, its latency, and for
//! off-CPU time its block durations.
//!
//! The data is one JSON document (schema `profiler.html/1`) in a `<script type=
//! "application/json">` element of the page `html/viewer.html`, which draws it. Each event's
//! stacks are a call tree, root first (the command's name, as in the folded stacks), as three
//! arrays: each node's parent, frame and own weight (samples; nanoseconds for off-CPU time);
//! frames are those of [`FrameTable`], one per function. Function details are the JSON report's
//! (`--function`), for the hottest functions only, which bounds the file.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use serde::Serialize;

use super::{
    frame_table::{FrameTable, NamedFrame},
    offcpu::{with_off_cpu_event, OFF_CPU_EVENT},
    samples_of, selected_profile, ExportError, StackRoots,
};
use crate::{
    aggregate::{
        details::{function_details, DetailRow},
        filter::{select_events, SampleFilter, Selection},
        functions::FunctionName,
        latency::{distributions, DistributionScope},
        offcpu::{offcpu_report, OffCpuDistribution, OffCpuOptions},
        startup::{startup_frames, RuntimeFrames},
    },
    profile::{EventIndex, Profile},
    report::json::{
        details as json_details, distribution as json_distribution, JsonDetails, JsonDistribution,
    },
};

/// The page the data is drawn by.
const VIEWER: &str = include_str!("html/viewer.html");
/// What the page has where the data goes.
const DATA_SLOT: &str = "<!--PROFILE-->";
const SCHEMA: &str = "profiler.html/1";
/// Functions of each event whose source lines and instructions the file carries, hottest first.
pub const DETAILED_FUNCTIONS: usize = 100;
/// Data cache lines of each event the file carries, hottest first.
const DATA_LINES: usize = 2000;

/// A profile and what of it the file shows.
pub struct HtmlInput<'a> {
    /// As recorded or imported, without the off-CPU event.
    pub profile: &'a Profile,
    /// The report's `--only-event`.
    pub event: Option<&'a str>,
    pub filter: &'a SampleFilter,
    pub runtime: RuntimeFrames,
}

#[derive(Serialize)]
struct Document<'a> {
    schema: &'static str,
    exporter: String,
    target: &'a str,
    frames: Vec<NamedFrame<'a>>,
    events: Vec<Event>,
    /// `--baseline`: the profile the differential view compares with, its events matched by
    /// name.
    baseline: Option<Baseline<'a>>,
}

#[derive(Serialize)]
struct Baseline<'a> {
    target: &'a str,
    events: Vec<Event>,
}

#[derive(Serialize)]
struct Event {
    name: String,
    /// What the weights count: `samples`, or `nanoseconds` for off-CPU time.
    unit: &'static str,
    tree: CallTree,
    /// Keyed by function name, as the tree's frames name them.
    functions: BTreeMap<String, JsonDetails>,
    data_lines: Vec<DataLine>,
    /// Latency distributions of the functions whose samples carried latencies, by function.
    latency: BTreeMap<String, JsonDistribution>,
    /// Off-CPU time: block durations of the blocks through each function, by function.
    blocks: BTreeMap<String, OffCpuDistribution>,
}

/// Root-first call tree: node `i` has parent `parent[i]` (-1: a root), frame `frame[i]` and
/// its own weight `weight[i]` (of samples whose stack ends there).
#[derive(Default, Serialize)]
struct CallTree {
    parent: Vec<i64>,
    frame: Vec<usize>,
    weight: Vec<u64>,
}

impl CallTree {
    fn add(&mut self, children: &mut HashMap<(i64, usize), usize>, stack: &[usize], weight: u64) {
        let mut node = -1i64;
        for &frame in stack {
            let next = *children.entry((node, frame)).or_insert_with(|| {
                self.parent.push(node);
                self.frame.push(frame);
                self.weight.push(0);
                self.parent.len() - 1
            });
            node = next as i64;
        }
        if node >= 0 {
            self.weight[node as usize] += weight;
        }
    }
}

/// Samples whose data address fell in one cache line, made by one function.
#[derive(Serialize)]
struct DataLine {
    function: String,
    line: String,
    samples: u64,
    /// Mean latency of the samples that carried one.
    latency: Option<f64>,
}

/// Writes `input` (and `baseline`, for the differential view) as one HTML file.
pub fn write_html(
    input: &HtmlInput,
    baseline: Option<&Profile>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let with_off_cpu = with_off_cpu_event(input.profile);
    let selected = selected_profile(&with_off_cpu, input.event, input.filter)?;
    if selected.events.is_empty() {
        // A page with nothing to draw would only fail in the browser.
        return Err(ExportError::UnknownEvent {
            event: 0,
            events: 0,
        }
        .into());
    }
    let indexes = select_events(&with_off_cpu, input.event)?;
    let selection = Selection::new(input.profile, input.filter);
    // A baseline is another run: its processes are others, so it is compared whole.
    let baseline_with_off_cpu = baseline.map(with_off_cpu_event);
    let everything = SampleFilter::default();
    let baseline = match &baseline_with_off_cpu {
        Some(profile) => Some(selected_profile(profile, None, &everything)?),
        None => None,
    };
    let mut frames = FrameTable::default();
    let events = (0..selected.events.len())
        .map(|index| {
            let mut event = tree_of(&selected, index as EventIndex, input.runtime, &mut frames);
            let original = indexes[index];
            if (original as usize) < input.profile.events.len() {
                event.functions = hottest_functions(input.profile, original, &selection);
                event.latency = function_latency(input.profile, original, &selection);
            }
            event.data_lines = data_lines(&selected, index as EventIndex);
            if event.name == OFF_CPU_EVENT {
                event.blocks = block_durations(input.profile, &selection);
            }
            event
        })
        .collect();
    let baseline = baseline.as_ref().map(|profile| Baseline {
        target: &profile.meta.target,
        events: (0..profile.events.len())
            .map(|index| tree_of(profile, index as EventIndex, input.runtime, &mut frames))
            .collect(),
    });
    let document = Document {
        schema: SCHEMA,
        exporter: format!("profiler {}", env!("CARGO_PKG_VERSION")),
        target: &input.profile.meta.target,
        frames: frames.list,
        events,
        baseline,
    };
    // `<` only ever appears in JSON strings, where `\u003c` reads the same: no `</script>` in
    // a function's name can end the element early.
    let json = serde_json::to_string(&document)?.replace('<', "\\u003c");
    let (before, after) = VIEWER
        .split_once(DATA_SLOT)
        .expect("the viewer has a slot for the data");
    out.write_all(before.as_bytes())?;
    out.write_all(json.as_bytes())?;
    out.write_all(after.as_bytes())?;
    Ok(())
}

/// `event`'s call tree, without the runtimes' start-up frames when they are hidden.
fn tree_of<'a>(
    profile: &'a Profile,
    event: EventIndex,
    runtime: RuntimeFrames,
    frames: &mut FrameTable<'a>,
) -> Event {
    let info = &profile.events[event as usize];
    let roots = StackRoots::new(profile);
    let mut tree = CallTree::default();
    let mut children = HashMap::new();
    let mut weighed = false;
    for sample in samples_of(profile, event) {
        weighed |= sample.weight.is_some();
        let mut stack = frames.stack(profile, &roots, sample);
        if runtime == RuntimeFrames::Hide {
            let names = stack[1..].iter().map(|&at| frames.list[at].name.as_ref());
            let hidden = startup_frames(names);
            stack.drain(1 + hidden.start..1 + hidden.end);
        }
        tree.add(&mut children, &stack, sample.measure());
    }
    Event {
        name: info.name.clone(),
        unit: match (weighed, info.unit.as_str()) {
            (true, "nanoseconds") => "nanoseconds",
            _ => "samples",
        },
        tree,
        functions: BTreeMap::new(),
        data_lines: Vec::new(),
        latency: BTreeMap::new(),
        blocks: BTreeMap::new(),
    }
}

/// Details of the [`DETAILED_FUNCTIONS`] functions with the most instruction samples of `event`.
fn hottest_functions(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
) -> BTreeMap<String, JsonDetails> {
    let mut samples: HashMap<FunctionName, u64> = HashMap::new();
    for sample in profile
        .instructions
        .iter()
        .filter(|s| s.event == event && selection.process(s.pid))
    {
        for function in FunctionName::logical(&profile.frames[sample.frame as usize]) {
            *samples.entry(function).or_default() += sample.stats.count;
        }
    }
    let mut hottest: Vec<(FunctionName, u64)> = samples.into_iter().collect();
    hottest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut functions = BTreeMap::new();
    for (name, _) in hottest.into_iter().take(DETAILED_FUNCTIONS) {
        if functions.contains_key(&name.name) {
            continue;
        }
        let Some(mut details) = function_details(profile, event, selection, &name) else {
            continue;
        };
        details.rows = sampled_cache_lines(details.rows);
        functions.insert(name.name, json_details(&details));
    }
    functions
}

/// `rows` without the cache lines none of whose instructions was sampled, each run of them one
/// gap: a large function's cold code would otherwise be most of the file.
fn sampled_cache_lines(rows: Vec<DetailRow>) -> Vec<DetailRow> {
    /// Rows of sampled cache lines, and whether cold lines were left out since the last one.
    #[derive(Default)]
    struct Kept {
        rows: Vec<DetailRow>,
        skipped: bool,
    }
    impl Kept {
        /// Ends the cache line of `line`: kept when one of its instructions was sampled.
        fn end_line(&mut self, line: &mut Vec<DetailRow>) {
            let is_instruction = |row: &DetailRow| matches!(row, DetailRow::Instruction(_));
            let sampled =
                |row: &DetailRow| matches!(row, DetailRow::Instruction(i) if i.samples > 0);
            if !line.iter().any(sampled) {
                self.skipped |= line.iter().any(is_instruction);
                line.clear();
                return;
            }
            if std::mem::take(&mut self.skipped) {
                self.rows.push(DetailRow::Gap);
            } else if !self.rows.is_empty() {
                self.rows.push(DetailRow::CacheLineBoundary);
            }
            self.rows.append(line);
        }
    }
    let mut kept = Kept::default();
    let mut line = Vec::new();
    for row in rows {
        match row {
            DetailRow::CacheLineBoundary => kept.end_line(&mut line),
            DetailRow::Gap => {
                kept.end_line(&mut line);
                kept.skipped = true;
            }
            row => line.push(row),
        }
    }
    kept.end_line(&mut line);
    if kept.skipped {
        kept.rows.push(DetailRow::Gap);
    }
    kept.rows
}

/// The latency distributions of `event`'s functions, as `report --histogram` has them.
fn function_latency(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
) -> BTreeMap<String, JsonDistribution> {
    distributions(profile, event, selection, DETAILED_FUNCTIONS)
        .iter()
        .filter(|d| d.scope == DistributionScope::Function)
        .map(|d| (d.label.clone(), json_distribution(d)))
        .collect()
}

/// The hottest data cache lines of `event`, by the function that touched them.
fn data_lines(profile: &Profile, event: EventIndex) -> Vec<DataLine> {
    let mut lines: HashMap<(String, u64), (u64, u64, u64)> = HashMap::new();
    for sample in profile.data_lines.iter().filter(|s| s.event == event) {
        let function = profile.frames[sample.frame as usize].display_name();
        let entry = lines.entry((function, sample.line)).or_default();
        entry.0 += sample.stats.count;
        entry.1 += sample.stats.latency_count;
        entry.2 += sample.stats.latency_sum;
    }
    let mut rows: Vec<DataLine> = lines
        .into_iter()
        .map(
            |((function, line), (samples, with_latency, latency))| DataLine {
                function,
                line: format!("{line:#x}"),
                samples,
                latency: (with_latency > 0).then(|| latency as f64 / with_latency as f64),
            },
        )
        .collect();
    rows.sort_by(|a, b| {
        (b.samples.cmp(&a.samples))
            .then_with(|| a.line.cmp(&b.line))
            .then_with(|| a.function.cmp(&b.function))
    });
    rows.truncate(DATA_LINES);
    rows
}

/// Block durations of the functions that waited longest.
fn block_durations(
    profile: &Profile,
    selection: &Selection,
) -> BTreeMap<String, OffCpuDistribution> {
    let Some(off_cpu) = &profile.off_cpu else {
        return BTreeMap::new();
    };
    let options = OffCpuOptions {
        rows: DETAILED_FUNCTIONS,
        histograms: true,
        function: None,
    };
    (offcpu_report(profile, off_cpu, selection, &options).distributions)
        .unwrap_or_default()
        .into_iter()
        .map(|distribution| (distribution.function.clone(), distribution))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregate::test_samples, profile::test_profile};

    /// The document inside the page written for `profile`.
    fn document(profile: &Profile, baseline: Option<&Profile>) -> (String, serde_json::Value) {
        let filter = SampleFilter::default();
        let input = HtmlInput {
            profile,
            event: None,
            filter: &filter,
            runtime: RuntimeFrames::Show,
        };
        let mut out = Vec::new();
        write_html(&input, baseline, &mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        let start = page.find("application/json\">").unwrap() + "application/json\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        let json = serde_json::from_str(&page[start..end]).unwrap();
        (page, json)
    }

    /// Each root-to-leaf path of an event's tree with its own weight, as `a;b;c weight`.
    fn paths(document: &serde_json::Value, event: &serde_json::Value) -> Vec<String> {
        let tree = &event["tree"];
        let name = |node: usize| -> String {
            let frame = tree["frame"][node].as_u64().unwrap() as usize;
            document["frames"][frame]["name"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let mut out = Vec::new();
        for (node, weight) in tree["weight"].as_array().unwrap().iter().enumerate() {
            let weight = weight.as_u64().unwrap();
            if weight == 0 {
                continue;
            }
            let mut names = vec![name(node)];
            let mut at = tree["parent"][node].as_i64().unwrap();
            while at >= 0 {
                names.push(name(at as usize));
                at = tree["parent"][at as usize].as_i64().unwrap();
            }
            names.reverse();
            out.push(format!("{} {weight}", names.join(";")));
        }
        out.sort();
        out
    }

    #[test]
    fn each_event_is_a_call_tree_of_the_folded_stacks() {
        let (page, document) = document(&test_profile::profile(), None);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert_eq!(document["schema"], SCHEMA);
        let events = document["events"].as_array().unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["unit"], "samples");
        // The folded stacks' content (see `folded`), each path once.
        assert_eq!(
            paths(&document, &events[0]),
            [
                "app worker;<[u8; 4] as app::Worker>::run;libblob.so+0x4a10 10",
                "app;[user stack lost];do_syscall_64 5",
                "app;main;run;compute;vec_sum;add_lanes 60",
                "app;main;run;do_syscall_64 25",
            ]
        );
        // One node per path prefix: `app` roots three stacks, `app;main;run` two.
        let nodes = events[0]["tree"]["parent"].as_array().unwrap().len();
        assert_eq!(nodes, 3 + 1 + 2 + 5 + 1);
    }

    #[test]
    fn hot_functions_carry_their_instructions_cache_lines_latency_and_data_lines() {
        let (_, document) = document(&test_samples::profile(), None);
        let cpu = &document["events"][0];
        // compute+0x90 50, +0xa4 10, +0x4 5 (see `test_samples`).
        let compute = &cpu["functions"]["compute"];
        assert_eq!(compute["samples"], 65, "{compute}");
        assert_eq!(compute["view_samples"], 100);
        assert_eq!(compute["code"], "disassembled");
        let rows = compute["rows"].as_array().unwrap();
        let instructions: Vec<&serde_json::Value> = rows
            .iter()
            .filter(|row| row["row"] == "instruction")
            .collect();
        let sampled: u64 = instructions
            .iter()
            .map(|row| row["samples"].as_u64().unwrap())
            .sum();
        assert_eq!(sampled, 65);
        let hot = instructions
            .iter()
            .find(|row| row["samples"] == 50)
            .unwrap();
        assert_eq!(hot["text"], "nop", "{hot}");
        // Its first and third cache lines were sampled, the second is a gap.
        let kinds: Vec<&str> = (rows.iter())
            .map(|row| row["row"].as_str().unwrap())
            .filter(|kind| *kind != "statement" && *kind != "instruction")
            .collect();
        assert_eq!(kinds, ["gap"], "{rows:?}");
        assert!(rows
            .iter()
            .any(|row| row["row"] == "statement" && row["line"] == 39));
        // Inlined functions have details of their own, in the code they were inlined into.
        assert_eq!(cpu["functions"]["add_lanes"]["inlined_into"], "compute");
        let faults = &document["events"][1];
        let latency = &faults["functions"]["compute"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["row"] == "instruction" && row["samples"] == 4)
            .unwrap()["latency"];
        assert_eq!(latency["max"], 150, "{latency}");
        assert_eq!(latency["mean"], 100.0);
        // compute's latencies in page-faults: 50, 100, 100, 150 cycles (see `test_samples`).
        let distribution = &faults["latency"]["compute"];
        assert_eq!(distribution["latency"]["samples"], 4, "{distribution}");
        let counted: u64 = (distribution["buckets"].as_array().unwrap().iter())
            .map(|bucket| bucket[2].as_u64().unwrap())
            .sum();
        assert_eq!(counted, 4);
        let lines = faults["data_lines"].as_array().unwrap();
        assert!(!lines.is_empty());
        let shared = format!("{:#x}", test_samples::SHARED_LINE);
        assert!(
            lines.iter().any(|line| line["line"] == shared.as_str()),
            "{lines:?}"
        );
    }

    #[test]
    fn only_sampled_cache_lines_are_kept_each_run_of_cold_ones_a_gap() {
        use crate::aggregate::details::{InstructionRow, StatementRow};
        let instruction = |offset: u64, samples: u64| {
            DetailRow::Instruction(InstructionRow {
                offset,
                address: offset,
                slot: offset % 64,
                line: None,
                approximate_line: false,
                text: None,
                samples,
                latency: None,
                cache_line_samples: None,
            })
        };
        let statement = DetailRow::Statement(StatementRow {
            file: None,
            line: 7,
            out_of_order: false,
            samples: 5,
        });
        let rows = vec![
            instruction(0, 0),
            DetailRow::CacheLineBoundary,
            statement.clone(),
            instruction(64, 5),
            DetailRow::CacheLineBoundary,
            instruction(128, 2),
            DetailRow::CacheLineBoundary,
            instruction(192, 0),
            DetailRow::CacheLineBoundary,
            instruction(256, 0),
        ];
        assert_eq!(
            sampled_cache_lines(rows),
            vec![
                DetailRow::Gap,
                statement,
                instruction(64, 5),
                DetailRow::CacheLineBoundary,
                instruction(128, 2),
                DetailRow::Gap,
            ]
        );
    }

    #[test]
    fn off_cpu_time_is_an_event_in_nanoseconds_with_block_durations() {
        let profile = test_profile::profile_with_off_cpu();
        let (_, document) = document(&profile, None);
        let events = document["events"].as_array().unwrap();
        let off_cpu = events.last().unwrap();
        assert_eq!(off_cpu["name"], OFF_CPU_EVENT);
        assert_eq!(off_cpu["unit"], "nanoseconds");
        let blocked: u64 = (profile.off_cpu.as_ref().unwrap().blocks.iter())
            .map(|b| b.total_ns)
            .sum();
        let weights: u64 = (off_cpu["tree"]["weight"].as_array().unwrap().iter())
            .map(|w| w.as_u64().unwrap())
            .sum();
        assert_eq!(weights, blocked);
        // Every function of the first stack waited 5 blocks, 250 ms, at least.
        let blocks = off_cpu["blocks"].as_object().unwrap();
        for &frame in &profile.stacks[0].frames {
            let name = profile.frames[frame as usize].display_name();
            let distribution = &blocks[&name];
            assert!(
                distribution["blocks"].as_u64().unwrap() >= 5,
                "{name}: {distribution}"
            );
            assert!(distribution["total_ns"].as_u64().unwrap() >= 250_000_000);
        }
    }

    #[test]
    fn a_profile_without_events_is_refused_before_a_page_is_written() {
        let filter = SampleFilter::default();
        let input = HtmlInput {
            profile: &Profile::default(),
            event: None,
            filter: &filter,
            runtime: RuntimeFrames::Hide,
        };
        let mut out = Vec::new();
        let error = write_html(&input, None, &mut out).unwrap_err();
        assert!(error.to_string().contains("0 event(s)"), "{error}");
        assert!(out.is_empty());
    }

    #[test]
    fn a_baseline_is_carried_whole_and_a_hostile_name_cannot_end_the_script() {
        let mut profile = test_profile::profile();
        let hostile = "</script><script>alert(1)</script>";
        profile.frames[0].function = Some(hostile.to_string());
        let baseline = test_profile::profile();
        let (page, document) = document(&profile, Some(&baseline));
        assert!(!page.contains(hostile));
        let names: Vec<&str> = (document["frames"].as_array().unwrap().iter())
            .map(|frame| frame["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&hostile), "{names:?}");
        let baseline = &document["baseline"];
        assert_eq!(baseline["events"].as_array().unwrap().len(), 2);
        assert_eq!(
            paths(&document, &baseline["events"][0]).len(),
            paths(&document, &document["events"][0]).len()
        );
    }
}
