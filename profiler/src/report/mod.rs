//! Reports: what a performance engineer reads. [`render_report`] turns a profile and the view
//! options into the text or JSON report (and the latency SVG when asked); both formats render the
//! same [`Report`].

pub mod args;
pub mod json;
pub mod svg;
pub mod text;

use anyhow::{Context, Result};

use crate::{
    aggregate::{
        callgraph::{hot_paths, neighbours, CallPath, Direction, Neighbours},
        dataspace::{data_line_details, DataLineDetails},
        details::{function_details, FunctionDetails},
        filter::{select_events, Selection},
        functions::{find_function, FunctionName},
        latency::{distributions, Distribution},
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
}

/// A report: the sections of the selected events.
#[derive(Clone, Debug)]
pub struct Report<'a> {
    pub profile: &'a Profile,
    pub args: &'a ViewArgs,
    pub sections: Vec<EventSection>,
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
    let details_of = named(&args.function)?;
    let graph_of = match (named(&args.callers)?, named(&args.callees)?) {
        (Some(function), _) => Some((function, Direction::Callers)),
        (None, Some(function)) => Some((function, Direction::Callees)),
        (None, None) => None,
    };
    let options = ViewOptions {
        filter: &filter,
        sort: args.sort,
        top: args.top,
    };
    let mut sections = Vec::new();
    for event in events {
        let (content, hot_paths) = if let Some(function) = &details_of {
            let details = function_details(profile, event, &selection, function);
            (Content::Function(details), Vec::new())
        } else if let Some((function, direction)) = &graph_of {
            let graph = neighbours(profile, event, &selection, function, *direction);
            let paths = hot_paths(profile, event, &selection, Some(function), args.paths);
            (Content::CallGraph(graph), paths)
        } else {
            let view = build_view(profile, args.by, event, &options);
            let lines = if args.by == ViewKind::DcacheLine {
                view.rows
                    .iter()
                    .filter_map(|row| match row.key {
                        RowKey::DcacheLine { pid, address, .. } => {
                            Some(data_line_details(profile, event, &selection, pid, address))
                        }
                        _ => None,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let paths = if args.by == ViewKind::Function {
                hot_paths(profile, event, &selection, None, args.paths)
            } else {
                Vec::new()
            };
            (Content::View { view, lines }, paths)
        };
        let latency = args
            .histogram
            .is_some()
            .then(|| distributions(profile, event, &selection, args.top));
        sections.push(EventSection {
            event,
            content,
            hot_paths,
            latency,
        });
    }
    Ok(Report {
        profile,
        args,
        sections,
    })
}

/// The report as text or JSON; with `--histogram FILE.svg`, also writes the latency plot.
pub fn render_report(profile: &Profile, args: &ViewArgs) -> Result<String> {
    let report = build_report(profile, args)?;
    if let Some(Some(path)) = &args.histogram {
        let svg = svg::latency_plot(&report);
        std::fs::write(path, svg).with_context(|| {
            format!(
                "writing the latency plot to {}: check that its directory exists and is writable",
                path.display()
            )
        })?;
    }
    if args.json {
        Ok(json::render(&report)?)
    } else {
        Ok(text::render(&report))
    }
}
