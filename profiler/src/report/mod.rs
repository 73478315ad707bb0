//! Reports: what a performance engineer reads. [`render_report`] turns a profile and the view
//! options into the text or JSON report (and the latency SVG when asked); both formats render the
//! same [`Report`]. What precise samplers reported (data sources, IBS and SPE counters) has its own
//! views in [`hardware`].

pub mod args;
pub mod hardware;
pub mod json;
pub mod svg;
pub mod text;

use anyhow::Result;

use crate::{
    aggregate::{
        callgraph::{hot_paths, neighbours, CallPath, Direction, Neighbours},
        dataspace::{data_line_details, DataLineDetails},
        details::{function_details, FunctionDetails},
        filter::{select_events, Selection},
        functions::{find_function, FunctionName},
        latency::{distributions, Distribution, LineHistograms},
        offcpu::{offcpu_report, waited_in, OffCpuOptions, OffCpuReport},
        stack_quality::{stack_quality, StackQuality},
        startup::RuntimeFrames,
        views::{build_view, RowKey, View, ViewKind, ViewOptions},
    },
    profile::{EventIndex, Profile},
};

pub use args::ViewArgs;

/// What a report shows for one event.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    View {
        view: View,
        /// Data cache-line view: the details of each shown line.
        lines: Vec<DataLineDetails>,
    },
    /// `None` when no instruction sample of the event fell in the function.
    Function(Option<FunctionDetails>),
    CallGraph(Neighbours),
}

#[derive(Clone, Debug, PartialEq)]
pub struct EventSection {
    pub event: EventIndex,
    pub content: Content,
    /// With the function view (all paths) and the call graph (paths through the function).
    pub hot_paths: Vec<CallPath>,
    /// With `--histogram`: the event's latency distributions (empty when it has none).
    pub latency: Option<Vec<Distribution>>,
    /// Why the view is empty when the event cannot fill it (no data addresses).
    pub notes: Vec<String>,
    /// How whole the event's user call stacks are.
    pub stacks: StackQuality,
}

/// What `--by dcache-line` needs and an event lacks.
pub const NO_DATA_ADDRESSES: &str = "this event's samples carry no data addresses: the data \
    cache-line view needs an event that records them (page-faults, PEBS memory events such as \
    cpu/mem-loads,ldlat=30/P, or IBS op ibs_op//)";
/// What `--histogram` needs and an event lacks.
pub const NO_LATENCY: &str = "no latency for this event: latency distributions need PEBS \
    load-latency (cpu/mem-loads,ldlat=30/P) or IBS op (ibs_op//) samples";

/// Whether any sample of `event` carried a data address.
fn has_data_addresses(profile: &Profile, event: EventIndex) -> bool {
    profile
        .data_lines
        .iter()
        .any(|line| line.event == event && line.line != 0)
}

/// A report: the sections of the selected events.
#[derive(Clone, Debug)]
pub struct Report<'a> {
    pub profile: &'a Profile,
    pub args: &'a ViewArgs,
    pub sections: Vec<EventSection>,
    /// `record --off-cpu`: where the threads waited.
    pub off_cpu: Option<OffCpuReport>,
}

impl Report<'_> {
    /// The name of what the report shows, for headers and the JSON `view` field.
    pub fn view_name(&self) -> &'static str {
        if self.args.function.is_some() {
            "function-details"
        } else if self.args.callers.is_some() {
            "callers"
        } else if self.args.callees.is_some() {
            "callees"
        } else {
            self.args.by.name()
        }
    }
}

/// Builds the report the options ask for.
pub fn build_report<'a>(profile: &'a Profile, args: &'a ViewArgs) -> Result<Report<'a>> {
    let events = select_events(profile, args.event.as_deref())?;
    let filter = args.filter();
    let selection = Selection::new(profile, &filter);
    let named = |name: &Option<String>| -> Result<Option<FunctionName>> {
        name.as_deref()
            .map(|name| find_function(profile, &selection, name))
            .transpose()
    };
    // A function that only waited (`--histogram --function NAME` of off-CPU time) has no
    // on-CPU details to show.
    let details_of = match named(&args.function) {
        Err(_)
            if args
                .function
                .as_deref()
                .is_some_and(|name| waited_in(profile, name)) =>
        {
            None
        }
        named => named?,
    };
    let graph_of = match (named(&args.callers)?, named(&args.callees)?) {
        (Some(function), _) => Some((function, Direction::Callers)),
        (None, Some(function)) => Some((function, Direction::Callees)),
        (None, None) => None,
    };
    let runtime = if args.json {
        RuntimeFrames::Show
    } else {
        args.runtime_frames()
    };
    let options = ViewOptions {
        filter: &filter,
        sort: args.sort,
        top: args.rows(),
    };
    let mut sections = Vec::new();
    for event in events {
        let mut notes = Vec::new();
        let (content, hot_paths) = if let Some(function) = &details_of {
            let details = function_details(profile, event, &selection, function);
            (Content::Function(details), Vec::new())
        } else if let Some((function, direction)) = &graph_of {
            let graph = neighbours(profile, event, &selection, function, *direction);
            let paths = hot_paths(
                profile,
                event,
                &selection,
                Some(function),
                args.paths,
                runtime,
            );
            (Content::CallGraph(graph), paths)
        } else {
            // The view and the hot paths each pass over every stack: side by side on two
            // threads, a report of a large profile takes the time of the longer.
            let (mut view, paths) = std::thread::scope(|scope| {
                let paths = (args.by == ViewKind::Function).then(|| {
                    scope.spawn(|| hot_paths(profile, event, &selection, None, args.paths, runtime))
                });
                let view = build_view(profile, args.by, event, &options);
                let paths = paths.map_or_else(Vec::new, |paths| {
                    paths
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                });
                (view, paths)
            });
            if args.by == ViewKind::DcacheLine && !has_data_addresses(profile, event) {
                // Samples without an address would all sit at "address 0x0".
                view.rows.clear();
                view.total_rows = 0;
                notes.push(NO_DATA_ADDRESSES.to_string());
            }
            let lines = if args.by == ViewKind::DcacheLine {
                let histograms = LineHistograms::new(profile, event, &selection);
                view.rows
                    .iter()
                    .filter_map(|row| match row.key {
                        RowKey::DcacheLine { pid, address, .. } => Some(data_line_details(
                            profile,
                            event,
                            &selection,
                            &histograms,
                            pid,
                            address,
                        )),
                        _ => None,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            (Content::View { view, lines }, paths)
        };
        let latency = args
            .histogram
            .is_some()
            .then(|| distributions(profile, event, &selection, args.rows()));
        sections.push(EventSection {
            event,
            content,
            hot_paths,
            latency,
            notes,
            stacks: stack_quality(profile, event, &selection),
        });
    }
    let off_cpu = profile.off_cpu.as_ref().map(|off_cpu| {
        let options = OffCpuOptions {
            rows: args.rows(),
            histograms: args.histogram.is_some(),
            function: args.function.as_deref(),
        };
        offcpu_report(profile, off_cpu, &selection, &options)
    });
    Ok(Report {
        profile,
        args,
        sections,
        off_cpu,
    })
}

/// A rendered report, and the latency plot that `--histogram FILE.svg` asks for (the caller
/// writes it, as every output, through [`crate::output`]).
#[derive(Clone, Debug)]
pub struct Rendered {
    pub text: String,
    pub latency_plot: Option<String>,
    /// Views asked for that have nothing to show: said as notes, and not a failure (the same
    /// rule for every view, docs/command-line.md).
    pub nothing_to_show: Vec<String>,
}

/// The report as text or JSON, and with `--histogram FILE.svg` the latency plot.
pub fn render_report(profile: &Profile, args: &ViewArgs) -> Result<Rendered> {
    let report = build_report(profile, args)?;
    let mut nothing_to_show = Vec::new();
    let latency_plot = match &args.histogram {
        Some(Some(path)) => {
            let plotted = report
                .sections
                .iter()
                .any(|s| s.latency.as_ref().is_some_and(|l| !l.is_empty()));
            if plotted {
                Some(svg::latency_plot(&report))
            } else {
                nothing_to_show.push(format!(
                    "--histogram {}: nothing to plot, the file is not written: {NO_LATENCY}, and \
                     no event of this report has any",
                    path.display()
                ));
                None
            }
        }
        _ => None,
    };
    let text = if args.json {
        json::render(&report)?
    } else {
        text::render(&report)
    };
    Ok(Rendered {
        text,
        latency_plot,
        nothing_to_show,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        aggregate::{test_samples, views::SortKey},
        profile::test_profile,
    };

    fn args(by: ViewKind) -> ViewArgs {
        ViewArgs {
            by,
            ..ViewArgs::default()
        }
    }

    /// Every report the options can ask for, as text.
    fn every_text_report(profile: &Profile) -> Vec<(String, String)> {
        let mut all: Vec<ViewArgs> = [
            ViewKind::Thread,
            ViewKind::Process,
            ViewKind::Container,
            ViewKind::Module,
            ViewKind::Function,
            ViewKind::Line,
            ViewKind::Instruction,
            ViewKind::IcacheLine,
            ViewKind::DcacheLine,
        ]
        .into_iter()
        .map(args)
        .collect();
        all.push(ViewArgs {
            function: Some("compute".into()),
            ..ViewArgs::default()
        });
        all.push(ViewArgs {
            callers: Some("run".into()),
            ..ViewArgs::default()
        });
        all.push(ViewArgs {
            callees: Some("run".into()),
            histogram: Some(None),
            ..ViewArgs::default()
        });
        all.into_iter()
            .map(|a| ViewArgs {
                width: Some(text::WIDTH),
                ..a
            })
            .map(|a| (format!("{a:?}"), render_report(profile, &a).unwrap().text))
            .collect()
    }

    fn chars(line: &str) -> usize {
        line.chars().count()
    }

    #[test]
    fn every_text_report_fits_100_columns() {
        for profile in [
            test_samples::profile(),
            test_samples::profile_without_code(),
        ] {
            for (what, text) in every_text_report(&profile) {
                for line in text.lines() {
                    assert!(chars(line) <= text::WIDTH, "{what}: {line:?}");
                }
            }
        }
    }

    /// The column where `word` starts in the first line that contains it after `after`.
    fn column(text: &str, after: &str, word: &str) -> usize {
        let start = text.find(after).expect(after);
        let line = text[start..]
            .lines()
            .find(|l| l.contains(word))
            .unwrap_or_else(|| panic!("no {word} after {after}"));
        line[..line.find(word).unwrap()].chars().count()
    }

    #[test]
    fn function_view_text_is_aligned_with_hot_paths() {
        let text = render_report(&test_samples::profile(), &ViewArgs::default())
            .unwrap()
            .text;
        assert!(text.contains("Event cpu-clock (1000 Hz), by function: 100 samples"));
        assert!(text.contains("event counts not estimated, samples only"));
        assert!(text.contains("events = samples x period 10"));
        let header = column(&text, "  self ", "function");
        assert_eq!(column(&text, "  self ", "compute"), header);
        assert_eq!(column(&text, "  self ", "do_syscall_64"), header);
        // Numbers are right-aligned under their headers.
        let end = |word: &str| column(&text, "  self ", word) + word.len();
        assert_eq!(end("cum"), end(" 85"));
        assert!(
            text.contains("self    %  sum% cum    %"),
            "pprof's words: {text}"
        );
        assert!(
            text.contains("60 60.0 add_lanes <- vec_sum <- compute <- run <- main"),
            "{text}"
        );
        assert!(text.contains("Sample accounting:"));
    }

    #[test]
    fn text_width_is_the_terminal_s_or_the_file_s_and_events_have_a_unit() {
        let mut profile = test_samples::profile();
        profile.events[0].period = Some(1_000_000);
        let long = format!("{}::compute", "very_long_module_path".repeat(5));
        for frame in &mut profile.frames {
            if frame.function.as_deref() == Some("compute") {
                frame.function = Some(long.clone());
            }
        }
        let whole = render_report(&profile, &ViewArgs::default()).unwrap().text;
        assert!(
            whole.contains(&long),
            "a file's 200 columns hold it: {whole}"
        );
        let header = whole.lines().find(|l| l.contains(" function ")).unwrap();
        assert!(
            header.contains(" ns function"),
            "cpu-clock counts ns: {header}"
        );
        assert!(
            whole.contains("cum     % events lat avg"),
            "page-faults: {whole}"
        );
        for width in [80, 180] {
            let text = render_report(
                &profile,
                &ViewArgs {
                    width: Some(width),
                    ..ViewArgs::default()
                },
            )
            .unwrap()
            .text;
            assert!(text.lines().all(|l| chars(l) <= width), "{width}: {text}");
            assert_eq!(text.contains(&long), width == 180, "{width}: {text}");
        }
    }

    #[test]
    fn dcache_text_lists_touchers_and_the_sharing_hint() {
        let text = render_report(&test_samples::profile(), &args(ViewKind::DcacheLine))
            .unwrap()
            .text;
        assert!(text.contains("counter_a, counter_b (app)"), "{text}");
        assert!(
            text.contains("compute+0x90 3 (2 stores), compute+0xa4 1 (1 store)"),
            "{text}"
        );
        assert!(
            text.contains("app 100 3 (2 stores), app worker 101 1 (1 store)"),
            "{text}"
        );
        assert!(text.contains("cpu 0 3, cpu 1 1"), "{text}");
        assert!(
            text.contains("false sharing? 2 threads write this line"),
            "{text}"
        );
        assert!(
            text.contains("threads       not recorded by this capture"),
            "{text}"
        );
    }

    #[test]
    fn function_details_text_marks_lines_and_cache_lines() {
        let view = ViewArgs {
            function: Some("compute".into()),
            event: Some("cpu-clock".into()),
            ..ViewArgs::default()
        };
        let text = render_report(&test_samples::profile(), &view).unwrap().text;
        assert!(!text.contains("page-faults (every"), "one event only");
        let dashes = format!("  {}", "-".repeat(98));
        assert_eq!(text.lines().filter(|l| *l == dashes).count(), 2, "{text}");
        assert!(text.contains("*> app.rs:39"), "{text}");
        assert!(text.contains(" > vec.rs:7"), "{text}");
        let approximate = text.lines().find(|l| l.contains("+0x85")).unwrap();
        assert!(approximate.contains("~41"), "{approximate}");
        let hot = text.lines().find(|l| l.contains("+0x90")).unwrap();
        assert!(hot.trim_start().starts_with("50  50.0"), "{hot}");
        assert!(hot.ends_with("nop"), "{hot}");
        // The third line's total on its first row.
        let first = text.lines().find(|l| l.contains("+0x80")).unwrap();
        assert!(first.contains(" 60 "), "{first}");
        let text = render_report(&test_samples::profile_without_code(), &view)
            .unwrap()
            .text;
        assert!(text.contains("code not captured"), "{text}");
        let tildes = format!("  {}", "~".repeat(98));
        assert!(text.lines().any(|l| l == tildes), "{text}");
    }

    #[test]
    fn kernel_function_details_say_there_are_no_bytes() {
        let view = ViewArgs {
            function: Some("exc_page_fault".into()),
            ..ViewArgs::default()
        };
        let text = render_report(&test_samples::profile(), &view).unwrap().text;
        assert!(
            text.contains("kernel code: its bytes are not captured"),
            "{text}"
        );
        assert!(
            text.contains("no instruction samples in this function"),
            "{text}"
        );
    }

    #[test]
    fn bad_names_are_explained() {
        let profile = test_samples::profile();
        let error = |view: ViewArgs| render_report(&profile, &view).unwrap_err().to_string();
        let message = error(ViewArgs {
            event: Some("cycles".into()),
            ..ViewArgs::default()
        });
        assert!(
            message.contains("0 (cpu-clock), 1 (page-faults)"),
            "{message}"
        );
        let message = error(ViewArgs {
            callers: Some("nonexistent".into()),
            ..ViewArgs::default()
        });
        assert!(
            message.contains("no function named or containing"),
            "{message}"
        );
    }

    fn json(view: ViewArgs) -> serde_json::Value {
        let text = render_report(&test_samples::profile(), &ViewArgs { json: true, ..view })
            .unwrap()
            .text;
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn json_function_view_keeps_the_report_schema() {
        let report = json(ViewArgs::default());
        assert_eq!(report["schema"], json::SCHEMA);
        assert_eq!(report["view"], "function");
        let event = &report["events"][0];
        assert_eq!(event["name"], "cpu-clock");
        assert_eq!(event["samples"], 100);
        assert_eq!(event["estimate"]["method"], "none");
        let compute = &event["functions"][0];
        assert_eq!(compute["function"], "compute");
        assert_eq!(compute["module"], "app");
        assert_eq!(compute["self_samples"], 60);
        assert_eq!(compute["self_percent"], 60.0);
        assert_eq!(compute["total_samples"], 60);
        assert_eq!(event["hot_paths"][0]["functions"][1], "vec_sum");
        assert_eq!(event["hot_paths"][0]["functions"][3], "run");
        let faults = &report["events"][1];
        assert_eq!(faults["estimate"]["events_per_sample"], 10.0);
        assert_eq!(faults["estimate"]["events"], 70);
        assert!(event["estimate"]["events"].is_null());
        assert_eq!(faults["functions"][0]["estimated_events"], 70.0);
        assert_eq!(faults["functions"][0]["latency"]["max"], 2000);
    }

    #[test]
    fn json_rows_of_every_view() {
        let cases = [
            (ViewKind::Thread, "threads", "comm", "app"),
            (ViewKind::Module, "modules", "module", test_profile::APP),
            (ViewKind::Line, "lines", "file", "src/simd.rs"),
            (
                ViewKind::Instruction,
                "instructions",
                "location",
                "compute+0x90",
            ),
        ];
        for (kind, array, field, value) in cases {
            let report = json(args(kind));
            let row = &report["events"][0][array][0];
            assert_eq!(row[field], value, "{array}: {row}");
            assert!(row["samples"].as_u64().unwrap() > 0, "{row}");
            assert!(report["events"][0].get("hot_paths").is_none());
        }
        let report = json(args(ViewKind::IcacheLine));
        let line = &report["events"][0]["icache_lines"][0];
        assert_eq!(line["module_offset"], 0x1280);
        assert_eq!(line["functions"], serde_json::json!(["compute", "helper"]));
        let report = json(ViewArgs {
            sort: SortKey::Latency,
            ..args(ViewKind::DcacheLine)
        });
        let lines = &report["events"][1]["dcache_lines"];
        assert_eq!(lines[0]["object"]["kind"], "heap", "slowest first");
        let shared = &lines[1];
        assert_eq!(shared["object"]["kind"], "variables");
        assert_eq!(shared["object"]["variables"][1]["name"], "counter_b");
        assert_eq!(shared["details"]["stores"], 3);
        assert_eq!(shared["details"]["sharing"], "several-writers");
        assert_eq!(shared["details"]["threads"][1]["name"], "app worker 101");
        assert!(lines[0]["details"]["threads"].is_null());
    }

    #[test]
    fn json_details_call_graph_and_histograms() {
        let report = json(ViewArgs {
            function: Some("compute".into()),
            ..ViewArgs::default()
        });
        assert_eq!(report["view"], "function-details");
        let details = &report["events"][0]["function_details"];
        assert_eq!(details["code"], "disassembled");
        let rows = details["rows"].as_array().unwrap();
        assert_eq!(rows[0]["row"], "statement");
        assert!(rows
            .iter()
            .any(|r| r["row"] == "statement" && r["out_of_order"] == true && r["line"] == 39));
        assert_eq!(
            rows.iter()
                .filter(|r| r["row"] == "cache-line-boundary")
                .count(),
            2
        );
        let report = json(ViewArgs {
            callees: Some("run".into()),
            histogram: Some(None),
            ..ViewArgs::default()
        });
        let callees = &report["events"][0]["callees"];
        assert_eq!(callees["total_samples"], 85);
        assert_eq!(callees["neighbours"][0]["function"], "compute");
        assert_eq!(
            report["events"][0]["latency_distributions"],
            serde_json::json!([])
        );
        let distributions = &report["events"][1]["latency_distributions"];
        assert_eq!(distributions[0]["scope"], "event");
        assert_eq!(distributions[0]["latency"]["samples"], 7);
        let buckets = distributions[0]["buckets"].as_array().unwrap();
        let counted: u64 = buckets.iter().map(|b| b[2].as_u64().unwrap()).sum();
        assert_eq!(counted, 7);
        assert!(buckets.iter().all(|b| b[0].as_u64() <= b[1].as_u64()));
    }

    #[test]
    fn latency_svg_parses_with_a_bar_per_bucket() {
        let mut profile = test_samples::profile();
        profile.meta.target = "-- ./app <in> & \"out\"".into();
        let view = ViewArgs {
            histogram: Some(Some("latency.svg".into())),
            ..ViewArgs::default()
        };
        let rendered = render_report(&profile, &view).unwrap();
        assert!(rendered.text.contains("Latency percentiles (cycles):"));
        let svg = rendered.latency_plot.unwrap();
        let document = roxmltree::Document::parse(&svg).unwrap();
        let root = document.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        let bars = root
            .descendants()
            .filter(|n| n.has_tag_name("rect") && n.children().any(|c| c.has_tag_name("title")))
            .count();
        let report = build_report(&profile, &view).unwrap();
        let buckets: usize = report
            .sections
            .iter()
            .flat_map(|s| s.latency.iter().flatten())
            .map(|d| d.buckets.len())
            .sum();
        assert_eq!(bars, buckets);
        let titles: Vec<&str> = root
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with("page-faults, function compute: 4 samples")),
            "{titles:?}"
        );
        // XML's special characters are escaped and read back.
        assert!(
            titles.contains(&"Latency distributions (cycles, log scale): -- ./app <in> & \"out\""),
            "{titles:?}"
        );
    }
}
