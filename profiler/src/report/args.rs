//! The report's command-line options, shared by `record` (report at the end) and `report -i`.
//! The sample filters are named `--only-*` so that they never collide with the options that
//! choose what `record` samples (`-p/--pid`, `-e/--event`).

use std::path::PathBuf;

use clap::{Args, FromArgMatches, ValueEnum};

use crate::aggregate::{
    filter::SampleFilter,
    startup::RuntimeFrames,
    views::{SortKey, ViewKind},
};

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Report")]
pub struct ViewArgs {
    /// What each row of the report is.
    #[arg(long = "by", value_enum, value_name = "VIEW", default_value_t = ViewKind::Function)]
    pub by: ViewKind,
    /// Only this event, by name or index (default: every event, one after the other).
    #[arg(id = "only_event", long = "only-event", value_name = "NAME|INDEX")]
    pub event: Option<String>,
    /// Only samples of these processes (repeat or comma-separate).
    #[arg(
        id = "only_pids",
        long = "only-pid",
        value_name = "PID",
        value_delimiter = ','
    )]
    pub pids: Vec<u32>,
    /// Only samples of threads with this name (samples that know only their process: of
    /// processes with a thread of this name).
    #[arg(id = "only_comm", long = "only-comm", value_name = "NAME")]
    pub comm: Option<String>,
    /// Only rows of code in this load module (path or file name).
    #[arg(id = "only_module", long = "only-module", value_name = "MODULE")]
    pub module: Option<String>,
    /// Rows per view; 0 for all (default: 20 in text, all in JSON).
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Row order: samples, latency or name (perf's keys, such as `dso,sym`, are `--by`'s).
    #[arg(long, value_name = "KEY", default_value = "samples", value_parser = sort_key)]
    pub sort: SortKey,
    /// Hot call paths shown with the function view and the call graph.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub paths: usize,
    /// Statements and instructions of a function, by cache line.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["callers", "callees"])]
    pub function: Option<String>,
    /// The callers of a function, with the samples of the stacks through each.
    #[arg(long, value_name = "NAME", conflicts_with = "callees")]
    pub callers: Option<String>,
    /// The functions a function calls, with the samples of the stacks through each.
    #[arg(long, value_name = "NAME")]
    pub callees: Option<String>,
    /// Latency percentiles per event, function and line; with a file name, also plot them
    /// into that SVG file.
    #[arg(long, value_name = "FILE.svg", num_args = 0..=1)]
    pub histogram: Option<Option<PathBuf>>,
    /// Show the language runtimes' start-up frames (`_start`, `__libc_start_main`,
    /// `std::rt::lang_start` and the panic catching under it, thread start-up) in hot paths and
    /// flame graphs; hidden by default. Folded, pprof and JSON always keep them.
    #[arg(long)]
    pub show_runtime_frames: bool,
    /// Colour the text report's headings, hot percentages and losses: auto colours on a
    /// terminal when NO_COLOR is not set.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// The report as JSON (schema profiler.report/1, docs/json-report.md): set from `report
    /// --json` or `record --json PATH`, whose options differ.
    #[arg(skip)]
    pub json: bool,
    /// Columns the text report fits (the terminal's); `None`: a file's
    /// ([`crate::report::text::FILE_WIDTH`]).
    #[arg(skip)]
    pub width: Option<usize>,
}

/// `--sort`: a row order; perf's sort keys choose what a row is, which is `--by` here.
fn sort_key(text: &str) -> Result<SortKey, String> {
    if let Ok(key) = SortKey::from_str(text, true) {
        return Ok(key);
    }
    let view = |key: &str| match key.trim() {
        "comm" | "tid" => Some("thread"),
        "pid" => Some("process"),
        "dso" => Some("module"),
        "sym" | "symbol" => Some("function"),
        "srcline" => Some("line"),
        _ => None,
    };
    match text.split(',').find_map(view) {
        Some(by) => Err(format!(
            "perf's sort keys choose the rows: here give --by {by} (--sort samples, latency or \
             name orders them)"
        )),
        None => Err("give samples, latency or name".to_string()),
    }
}

/// When the text report is coloured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless the NO_COLOR environment variable is set (no-color.org).
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether a report written to `terminal` (`false` for a file or a pipe) is coloured.
    pub fn enabled(self, terminal: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                terminal && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
            }
        }
    }
}

/// Rows of a text view when `--top` is not given.
const TEXT_ROWS: usize = 20;

impl ViewArgs {
    /// Rows per view: `--top`, all for 0 and for JSON (machine output is whole), else
    /// [`TEXT_ROWS`].
    pub fn rows(&self) -> usize {
        match self.top {
            Some(0) => usize::MAX,
            Some(rows) => rows,
            None if self.json => usize::MAX,
            None => TEXT_ROWS,
        }
    }

    /// Runtime start-up frames are hidden from what people read (the text report, flame
    /// graphs), unless asked for; JSON, for tools, keeps them.
    pub fn runtime_frames(&self) -> RuntimeFrames {
        if self.show_runtime_frames {
            RuntimeFrames::Show
        } else {
            RuntimeFrames::Hide
        }
    }

    pub fn filter(&self) -> SampleFilter {
        SampleFilter {
            pids: self.pids.clone(),
            comm: self.comm.clone(),
            module: self.module.clone(),
        }
    }
}

impl Default for ViewArgs {
    /// The options of a command line that gives none.
    fn default() -> Self {
        let matches = ViewArgs::augment_args(clap::Command::new("report"))
            .try_get_matches_from(["report"])
            .expect("the defaults parse");
        ViewArgs::from_arg_matches(&matches).expect("the defaults parse")
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        view: ViewArgs,
    }

    #[test]
    fn parses_views_filters_and_the_optional_svg() {
        let view = Command::try_parse_from([
            "report",
            "--by",
            "dcache-line",
            "--only-pid",
            "4,5",
            "--sort",
            "latency",
            "--histogram",
        ])
        .unwrap()
        .view;
        assert_eq!(view.by, ViewKind::DcacheLine);
        assert_eq!(view.pids, [4, 5]);
        assert_eq!(view.sort, SortKey::Latency);
        assert_eq!(view.histogram, Some(None));
        let view = Command::try_parse_from(["report", "--histogram", "lat.svg"])
            .unwrap()
            .view;
        assert_eq!(view.histogram, Some(Some(PathBuf::from("lat.svg"))));
        assert_eq!(view.by, ViewKind::Function);
        assert_eq!((view.rows(), view.paths), (20, 5));
        // `--json` belongs to each command (record writes it to a file); the view is told.
        let rows = |args: &[&str], json: bool| {
            let mut view = Command::try_parse_from(args).unwrap().view;
            view.json = json;
            view.rows()
        };
        assert_eq!(rows(&["report", "--top", "0"], false), usize::MAX);
        assert_eq!(rows(&["report", "--top", "3"], true), 3);
        assert_eq!(rows(&["report"], true), usize::MAX);
        assert_eq!(rows(&["report"], false), 20);
        assert_eq!(ViewArgs::default().by, ViewKind::Function);
        assert!(Command::try_parse_from(["report", "--callers", "a", "--callees", "b"]).is_err());
    }
}
