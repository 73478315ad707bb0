//! The text report: per event, the chosen view as an aligned table that fits the width the
//! report is given, the terminal's, or [`FILE_WIDTH`] in a file or a pipe (names are shortened,
//! never the numbers), the details the view carries (data cache lines,
//! function statements and instructions, callers or callees, hot call paths, latency
//! percentiles), then the sample accounting with every kind of loss.

use std::{borrow::Cow, fmt::Write, io::IsTerminal, os::fd::AsRawFd};

use crate::{
    aggregate::{
        callgraph::{CallPath, Direction, Neighbours},
        dataspace::{DataLineDetails, SharingHint, Touch},
        details::{CodeSource, DetailRow, FunctionDetails},
        filter::EventScale,
        functions::event_samples,
        latency::{Distribution, LatencySummary},
        views::{RowKey, View, ViewKind, ViewRow},
    },
    profile::{module_basename, Profile},
};

mod offcpu;
mod paint;

pub use paint::finish_text;

use super::{Content, EventSection, Report};

/// The width of a classic terminal: rules never get longer than this.
pub const WIDTH: usize = 100;
/// The width of a report written to a file or a pipe: whole lines of most names, and no line of
/// thousands of characters for an editor or a pager to wrap.
pub const FILE_WIDTH: usize = 200;
/// Narrowest width laid out: on a narrower terminal, lines wrap.
const MIN_WIDTH: usize = 60;
const INDENT: &str = "  ";
/// Narrowest a shortened name gets before its column is left out.
const MIN_NAME: usize = 12;
/// Widest a name is shown, whatever the width: longer ones (a crafted symbol, a deeply nested
/// template) are cut in the middle, keeping both the start and the function's own name at the
/// end. Padding to a width over 65535 panics in `std::fmt`, and a 66,000-character symbol a
/// user's program carried made every report of its profile panic.
const MAX_NAME: usize = 2000;

/// How a text column is shortened when the names do not fit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shorten {
    /// Numbers: never shortened, right-aligned.
    Never,
    /// Names whose end tells them apart (files, paths): keep the end.
    KeepEnd,
    /// Lists (function lists): keep the start.
    KeepStart,
    /// Function names: keep the function's own name (see [`fit_function`]).
    Function,
    /// Call paths, functions joined by [`PATH_SEPARATOR`]: keep both ends (see [`fit_path`]).
    Path,
}

/// Between the functions of a call path, leaf first.
const PATH_SEPARATOR: &str = " <- ";

struct Column {
    header: Cow<'static, str>,
    shorten: Shorten,
    /// May be left out when the columns before it need the room.
    optional: bool,
}

const fn number(header: &'static str) -> Column {
    Column {
        header: Cow::Borrowed(header),
        shorten: Shorten::Never,
        optional: false,
    }
}

const fn name(header: &'static str, shorten: Shorten) -> Column {
    Column {
        header: Cow::Borrowed(header),
        shorten,
        optional: false,
    }
}

const fn optional(header: &'static str, shorten: Shorten) -> Column {
    Column {
        header: Cow::Borrowed(header),
        shorten,
        optional: true,
    }
}

/// The width a text report on `stream` fits: `COLUMNS` when set (as shells and `ls` read it),
/// else the terminal's; `None` when the stream is no terminal ([`FILE_WIDTH`] then).
pub fn terminal_width(stream: &(impl AsRawFd + IsTerminal)) -> Option<usize> {
    if let Some(columns) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<usize>().ok())
        .filter(|c| *c > 0)
    {
        return Some(columns);
    }
    if !stream.is_terminal() {
        return None;
    }
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a `winsize` to the pointer, which points to one.
    let status = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCGWINSZ, &mut size) };
    (status == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

fn chars(text: &str) -> usize {
    text.chars().count()
}

/// Shortens `text` to `width` characters with an ellipsis, as `shorten` says.
fn fit(text: &str, width: usize, shorten: Shorten) -> String {
    let count = chars(text);
    if count <= width || shorten == Shorten::Never {
        return text.to_string();
    }
    match shorten {
        Shorten::KeepEnd => {
            let tail: String = text.chars().skip(count - (width - 1)).collect();
            format!("…{tail}")
        }
        Shorten::Function => fit_function(text, width),
        Shorten::Path => fit_path(text, width),
        Shorten::KeepStart | Shorten::Never => {
            let head: String = text.chars().take(width - 1).collect();
            format!("{head}…")
        }
    }
}

/// `name` with the insides of its outermost `<…>` and `(…)` cut out (template and generic
/// arguments, parameter lists): `ns::Map<K, V>::find(K const&)` is `ns::Map<…>::find(…)`.
/// `None` when the brackets do not pair (`operator<`, `operator->`).
fn without_arguments(name: &str) -> Option<String> {
    let mut bare = String::new();
    let mut open = Vec::new();
    // Whether the outermost open bracket holds anything yet: `f()` stays `f()`.
    let mut holds = false;
    let mut previous = ' ';
    for c in name.chars() {
        // Rust's `fn() -> T`: the arrow closes nothing.
        let arrow = c == '>' && previous == '-';
        previous = c;
        match c {
            '<' | '(' => {
                if open.is_empty() {
                    bare.push(c);
                    holds = false;
                } else {
                    holds = true;
                }
                open.push(c);
            }
            '>' | ')' if !arrow => {
                let opened = open.pop()?;
                if !matches!((opened, c), ('<', '>') | ('(', ')')) {
                    return None;
                }
                if open.is_empty() {
                    if holds {
                        bare.push('…');
                    }
                    bare.push(c);
                } else {
                    holds = true;
                }
            }
            _ if open.is_empty() => bare.push(c),
            _ => holds = true,
        }
    }
    open.is_empty().then_some(bare)
}

/// A function name in `width` characters keeping the function's own name: arguments go first
/// ([`without_arguments`]), then the middle of the path before the last `::`
/// (`std::collections…::insert`); an own name longer than the width is cut at its end.
fn fit_function(name: &str, width: usize) -> String {
    let bare = without_arguments(name).unwrap_or_else(|| name.to_string());
    if chars(&bare) <= width {
        return bare;
    }
    let own = bare.rfind("::").map_or(bare.as_str(), |at| &bare[at..]);
    let own_chars = chars(own);
    if own_chars + 2 > width {
        return fit(own.trim_start_matches("::"), width, Shorten::KeepStart);
    }
    let head: String = bare.chars().take(width - 1 - own_chars).collect();
    format!("{head}…{own}")
}

/// A call path (leaf first) in `width` characters: its functions without arguments, then, when
/// still too long, the frames nearest the leaf and the root around `… N frames …`.
fn fit_path(path: &str, width: usize) -> String {
    let frames: Vec<String> = path
        .split(PATH_SEPARATOR)
        .map(|frame| without_arguments(frame).unwrap_or_else(|| frame.to_string()))
        .collect();
    let whole = frames.join(PATH_SEPARATOR);
    if chars(&whole) <= width {
        return whole;
    }
    let elided = |leaf: usize, root: usize| {
        let marker = format!(
            "… {} …",
            plural((frames.len() - leaf - root) as u64, "frame")
        );
        frames[..leaf]
            .iter()
            .map(String::as_str)
            .chain([marker.as_str()])
            .chain(frames[frames.len() - root..].iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(PATH_SEPARATOR)
    };
    let (mut leaf, mut root) = (1, 1);
    if frames.len() < 3 || chars(&elided(leaf, root)) > width {
        return fit(&whole, width, Shorten::KeepStart);
    }
    // Frames from the leaf's end and the root's in turn, while they fit.
    while leaf + root + 1 < frames.len() {
        if leaf <= root && chars(&elided(leaf + 1, root)) <= width {
            leaf += 1;
        } else if chars(&elided(leaf, root + 1)) <= width {
            root += 1;
        } else if chars(&elided(leaf + 1, root)) <= width {
            leaf += 1;
        } else {
            break;
        }
    }
    elided(leaf, root)
}

/// `text` cut in the middle to [`MAX_NAME`] characters with an ellipsis, when longer.
fn clip(text: &str) -> Cow<'_, str> {
    let count = chars(text);
    if count <= MAX_NAME {
        return Cow::Borrowed(text);
    }
    let head: String = text.chars().take(MAX_NAME / 2).collect();
    let tail: String = text
        .chars()
        .skip(count - (MAX_NAME - 1 - MAX_NAME / 2))
        .collect();
    Cow::Owned(format!("{head}…{tail}"))
}

/// Writes an aligned table: numbers at their natural width, names sharing what is left of
/// `width` in column order (at most [`MAX_NAME`] each), optional names left out when no room
/// remains.
fn table(out: &mut String, width: usize, columns: &[Column], rows: &[Vec<String>]) {
    let natural: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, column)| {
            rows.iter()
                .map(|row| chars(&row[i]).min(MAX_NAME))
                .chain([chars(&column.header)])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let fixed: usize = columns
        .iter()
        .zip(&natural)
        .filter(|(c, _)| c.shorten == Shorten::Never)
        .map(|(_, w)| w + 1)
        .sum();
    let mut room = width.saturating_sub(INDENT.len() + fixed);
    let mut widths = natural.clone();
    let names: Vec<usize> = (0..columns.len())
        .filter(|i| columns[*i].shorten != Shorten::Never)
        .collect();
    for (n, &i) in names.iter().enumerate() {
        // Leave each later name its minimum: optional ones too (the module column of a narrow
        // terminal) while this one keeps its own minimum, else only the required ones.
        let later = |optional: bool| -> usize {
            names[n + 1..]
                .iter()
                .filter(|j| optional || !columns[**j].optional)
                .map(|j| natural[*j].min(MIN_NAME) + 1)
                .sum()
        };
        let with_optional = room.saturating_sub(later(true) + 1);
        let available = if with_optional >= MIN_NAME.min(natural[i]) {
            with_optional
        } else {
            room.saturating_sub(later(false) + 1)
        };
        widths[i] = if columns[i].optional && available < MIN_NAME.min(natural[i]) {
            0
        } else {
            natural[i].min(available)
        };
        if widths[i] > 0 {
            room = room.saturating_sub(widths[i] + 1);
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::from(INDENT);
        for ((column, width), cell) in columns.iter().zip(&widths).zip(cells) {
            if *width == 0 {
                continue;
            }
            if text.len() > INDENT.len() {
                text.push(' ');
            }
            if column.shorten == Shorten::Never {
                let _ = write!(text, "{cell:>width$}");
            } else {
                let _ = write!(text, "{:<width$}", fit(&clip(cell), *width, column.shorten));
            }
        }
        text.trim_end().to_string()
    };
    let _ = writeln!(
        out,
        "{}",
        line(&mut columns.iter().map(|c| c.header.as_ref()))
    );
    for row in rows {
        let _ = writeln!(out, "{}", line(&mut row.iter().map(String::as_str)));
    }
}

/// A count or estimate in at most 5 characters: `999`, `12.3K`, `1.23M`, `456G`.
fn compact(value: f64) -> String {
    if value < 1000.0 {
        return if value.fract() == 0.0 || value >= 100.0 {
            format!("{value:.0}")
        } else {
            format!("{value:.1}")
        };
    }
    let mut scaled = value;
    let mut unit = 0;
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    while scaled >= 999.5 && unit < UNITS.len() - 1 {
        scaled /= 1000.0;
        unit += 1;
    }
    let digits = if scaled < 9.995 {
        2
    } else if scaled < 99.95 {
        1
    } else {
        0
    };
    format!("{scaled:.digits$}{}", UNITS[unit])
}

/// Sample counts in full up to 7 digits.
fn count(value: u64) -> String {
    if value < 10_000_000 {
        value.to_string()
    } else {
        compact(value as f64)
    }
}

fn percent(value: f64) -> String {
    format!("{value:.1}")
}

fn share(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * part as f64 / total as f64
    }
}

fn latency_cells(latency: Option<&LatencySummary>) -> [String; 5] {
    let dash = || "-".to_string();
    match latency {
        None => [dash(), dash(), dash(), dash(), dash()],
        Some(l) => {
            let p = |v: Option<u64>| v.map_or_else(dash, |v| compact(v as f64));
            [
                compact(l.mean),
                p(l.p50),
                p(l.p90),
                p(l.p99),
                compact(l.max as f64),
            ]
        }
    }
}

const LATENCY_COLUMNS: [Column; 5] = [
    number("lat avg"),
    number("p50"),
    number("p90"),
    number("p99"),
    number("max"),
];

pub fn render(report: &Report) -> String {
    let width = report.args.width.map_or(FILE_WIDTH, |w| w.max(MIN_WIDTH));
    let mut out = String::new();
    let profile = report.profile;
    let meta = &profile.meta;
    let _ = writeln!(
        out,
        "{}",
        fit(
            &format!(
                "Profile of {} on {} (kernel {}{}), {:.2} s",
                meta.target,
                meta.hostname,
                meta.kernel_release,
                if meta.architecture.is_empty() {
                    String::new()
                } else {
                    format!(", {}", meta.architecture)
                },
                meta.duration_ns as f64 / 1e9
            ),
            width,
            Shorten::KeepStart
        )
    );
    for section in &report.sections {
        render_section(report, section, width, &mut out);
    }
    if let Some(off_cpu) = &report.off_cpu {
        offcpu::render_offcpu(off_cpu, width, &mut out);
    }
    render_accounting(profile, width, &mut out);
    out
}

fn event_header(
    report: &Report,
    section: &EventSection,
    width: usize,
    samples: u64,
    what: &str,
) -> String {
    let event = &report.profile.events[section.event as usize];
    let rate = match (event.period, event.frequency) {
        (Some(period), _) => format!("every {period} {}", event.unit),
        (None, Some(hz)) => format!("{hz} Hz"),
        (None, None) => "rate unknown".to_string(),
    };
    fit(
        &format!("\nEvent {} ({rate}), {what}: {samples} samples", event.name),
        width.saturating_add(1),
        Shorten::KeepStart,
    )
}

fn render_section(report: &Report, section: &EventSection, width: usize, out: &mut String) {
    match &section.content {
        Content::View { view, lines } => {
            let what = format!("by {}", view.kind.name());
            let _ = writeln!(
                out,
                "{}",
                event_header(report, section, width, view.total_samples, &what)
            );
            let event = &report.profile.events[section.event as usize];
            // The total every export's event column adds up to.
            let total = view
                .scale
                .estimate(view.total_samples)
                .map_or(String::new(), |events| {
                    format!(": {events:.0} {} in all", event.unit)
                });
            let scale = format!("{INDENT}{}{total}", view.scale.describe());
            let _ = writeln!(out, "{}", fit(&scale, width, Shorten::KeepStart));
            render_stack_quality(&section.stacks, width, out);
            for note in &section.notes {
                wrapped(out, width, "note", std::slice::from_ref(note));
            }
            render_view(report.profile, view, width, out);
            for line in lines {
                render_data_line(line, width, out);
            }
            render_paths(
                "Hot call paths (leaf first):",
                &section.hot_paths,
                view.total_samples,
                width,
                out,
            );
        }
        Content::Function(details) => {
            let samples = details.as_ref().map_or(0, |d| d.event_samples);
            let function = report.args.function.as_deref().unwrap_or_default();
            let what = format!("function {function}");
            let _ = writeln!(
                out,
                "{}",
                event_header(report, section, width, samples, &what)
            );
            match details {
                Some(details) => render_details(details, width, out),
                None => {
                    let _ = writeln!(out, "{INDENT}no instruction samples in this function");
                }
            }
        }
        Content::CallGraph(graph) => {
            let what = match graph.direction {
                Direction::Callers => "callers",
                Direction::Callees => "callees",
            };
            let _ = writeln!(
                out,
                "{}",
                event_header(report, section, width, graph.event_samples, what)
            );
            render_stack_quality(&section.stacks, width, out);
            render_call_graph(graph, width, out);
            render_paths(
                &format!(
                    "Hot call paths through {} (leaf first):",
                    graph.function.name
                ),
                &section.hot_paths,
                graph.event_samples,
                width,
                out,
            );
        }
    }
    if let Some(distributions) = &section.latency {
        render_distributions(distributions, width, out);
    }
}

/// One line on how whole the user stacks are, under the event's header (none without user
/// stacks): complete stacks reach `_start`, `main` or a thread start.
fn render_stack_quality(
    quality: &crate::aggregate::stack_quality::StackQuality,
    width: usize,
    out: &mut String,
) {
    if quality.user_samples == 0 {
        return;
    }
    let line = format!(
        "{INDENT}user stacks: {:.1}% complete, {} cut short ({} through an address outside every \
         mapping, {} in exit or exec), {} by frame pointers only, {} lost; mean depth {:.1} frames",
        quality.complete_percent(),
        quality.incomplete(),
        quality.outside_code,
        quality.in_exit_or_exec,
        quality.frame_pointers_only,
        quality.lost,
        quality.mean_user_depth
    );
    let _ = writeln!(out, "{}", fit(&line, width, Shorten::KeepStart));
}

/// The key columns of a view and their cells for one row.
fn key_columns(kind: ViewKind) -> Vec<Column> {
    match kind {
        ViewKind::Thread => vec![number("pid/tid"), name("thread", Shorten::KeepStart)],
        ViewKind::Process => vec![number("pid"), name("process", Shorten::KeepStart)],
        ViewKind::Container => vec![name("container", Shorten::KeepStart)],
        ViewKind::Module => vec![name("module", Shorten::KeepEnd)],
        // Module file names are cut from the right: their start tells them apart.
        ViewKind::Function => vec![
            name("function", Shorten::Function),
            optional("module", Shorten::KeepStart),
        ],
        ViewKind::Line => vec![
            name("location", Shorten::KeepEnd),
            optional("function", Shorten::Function),
        ],
        ViewKind::Instruction => vec![
            name("instruction", Shorten::KeepEnd),
            optional("source", Shorten::KeepEnd),
        ],
        ViewKind::IcacheLine => vec![
            number("address"),
            name("location", Shorten::KeepEnd),
            optional("functions", Shorten::KeepStart),
        ],
        ViewKind::DcacheLine => vec![
            number("pid"),
            number("address"),
            name("object", Shorten::KeepEnd),
        ],
    }
}

fn key_cells(key: &RowKey) -> Vec<String> {
    match key {
        RowKey::Thread { pid, tid, comm } => vec![format!("{pid}/{tid}"), comm.clone()],
        RowKey::Process { pid, comm } => vec![pid.to_string(), comm.clone()],
        RowKey::Container { container } => vec![container.clone()],
        RowKey::Module { module } => vec![if module.is_empty() {
            "(no module)".to_string()
        } else {
            module.clone()
        }],
        RowKey::Function(function) => vec![function.name.clone(), function.module.clone()],
        RowKey::Line { function, .. } => vec![key.name(), function.clone()],
        RowKey::Instruction {
            location, source, ..
        } => vec![location.clone(), source.clone().unwrap_or_default()],
        RowKey::IcacheLine {
            address,
            location,
            functions,
            ..
        } => vec![
            format!("{address:#x}"),
            location.clone(),
            functions.join(", "),
        ],
        RowKey::DcacheLine {
            pid,
            address,
            object,
        } => vec![
            pid.to_string(),
            format!("{address:#x}"),
            object.describe(*address),
        ],
    }
}

/// The header of the estimated events column: the event's unit.
fn events_header(unit: &str) -> Cow<'static, str> {
    match unit {
        "nanoseconds" => Cow::Borrowed("ns"),
        "" => Cow::Borrowed("events"),
        unit => Cow::Owned(unit.to_string()),
    }
}

/// A view as a table. Column names are pprof's: `sum%` is the running sum of `%`, `cum` the
/// samples with the function anywhere on the stack.
fn render_view(profile: &Profile, view: &View, width: usize, out: &mut String) {
    let function = view.kind == ViewKind::Function;
    let estimates = view.scale != EventScale::Unknown;
    let latency = view.rows.iter().any(|r| r.latency.is_some());
    let mut columns = vec![
        number(if function { "self" } else { "samples" }),
        number("%"),
        number("sum%"),
    ];
    if function {
        columns.extend([number("cum"), number("%")]);
    }
    if estimates {
        let unit = profile
            .events
            .get(view.event as usize)
            .map_or("", |e| e.unit.as_str());
        columns.push(Column {
            header: events_header(unit),
            ..number("")
        });
    }
    if latency {
        columns.extend(LATENCY_COLUMNS);
    }
    columns.extend(key_columns(view.kind));
    let rows: Vec<Vec<String>> = view
        .rows
        .iter()
        .map(|row: &ViewRow| {
            let mut cells = vec![
                count(row.samples),
                percent(row.percent),
                percent(row.cumulative_percent),
            ];
            if let (Some(total), Some(total_percent)) = (row.total_samples, row.total_percent) {
                cells.extend([count(total), percent(total_percent)]);
            }
            if estimates {
                cells.push(row.estimated_events.map_or("-".into(), compact));
            }
            if latency {
                cells.extend(latency_cells(row.latency.as_ref()));
            }
            cells.extend(key_cells(&row.key));
            cells
        })
        .collect();
    let _ = writeln!(out);
    if rows.is_empty() {
        let _ = writeln!(out, "{INDENT}no samples");
        return;
    }
    table(out, width, &columns, &rows);
    if view.total_rows > view.rows.len() {
        let _ = writeln!(
            out,
            "{INDENT}({} of {} rows; --top N shows more)",
            view.rows.len(),
            view.total_rows
        );
    }
}

fn render_paths(title: &str, paths: &[CallPath], total: u64, width: usize, out: &mut String) {
    if paths.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n{INDENT}{}",
        fit(title, width - INDENT.len(), Shorten::KeepStart)
    );
    let rows: Vec<Vec<String>> = paths
        .iter()
        .map(|path| {
            vec![
                count(path.samples),
                percent(share(path.samples, total)),
                path.functions.join(PATH_SEPARATOR),
            ]
        })
        .collect();
    table(
        out,
        width,
        &[number("samples"), number("%"), name("path", Shorten::Path)],
        &rows,
    );
}

/// Items joined with `, ` and wrapped at `width` after a label; an item longer than a line
/// is broken between words.
fn wrapped(out: &mut String, width: usize, label: &str, items: &[String]) {
    let lead = format!("{INDENT}{INDENT}{label:<13} ");
    let room = width - chars(&lead);
    let none = ["none recorded".to_string()];
    let items = if items.is_empty() { &none[..] } else { items };
    let mut lines = vec![String::new()];
    for (i, item) in items.iter().enumerate() {
        let item = if i + 1 < items.len() {
            format!("{item},")
        } else {
            item.clone()
        };
        let pieces: Vec<String> = if chars(&item) <= room {
            vec![item]
        } else {
            item.split(' ')
                .map(|word| fit(word, room, Shorten::KeepEnd))
                .collect()
        };
        for piece in pieces {
            let current = lines.last_mut().expect("one line at least");
            if current.is_empty() {
                *current = piece;
            } else if chars(current) + 1 + chars(&piece) > room {
                lines.push(piece);
            } else {
                current.push(' ');
                current.push_str(&piece);
            }
        }
    }
    for (n, line) in lines.iter().enumerate() {
        let prefix = if n == 0 {
            lead.clone()
        } else {
            " ".repeat(chars(&lead))
        };
        let _ = writeln!(out, "{prefix}{line}");
    }
}

/// `1 store`, `2 stores`.
fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("{count} {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

fn touches(list: &[Touch], stores_known: bool) -> Vec<String> {
    list.iter()
        .map(|t| {
            if stores_known && t.stores > 0 {
                format!("{} {} ({})", t.name, t.samples, plural(t.stores, "store"))
            } else {
                format!("{} {}", t.name, t.samples)
            }
        })
        .collect()
}

fn render_data_line(line: &DataLineDetails, width: usize, out: &mut String) {
    let _ = writeln!(
        out,
        "\n{INDENT}{}",
        fit(
            &format!(
                "Line {:#x} of pid {}: {}",
                line.line,
                line.pid,
                line.object.describe(line.line)
            ),
            width - INDENT.len(),
            Shorten::KeepStart
        )
    );
    let access_known = line.loads + line.stores > 0;
    let mut summary = vec![plural(line.samples, "sample")];
    if access_known {
        summary.push(plural(line.loads, "load"));
        summary.push(plural(line.stores, "store"));
    }
    if let Some(l) = &line.latency {
        summary.push(format!("latency avg {} max {}", compact(l.mean), l.max));
    }
    wrapped(out, width, "accesses", &summary);
    wrapped(
        out,
        width,
        "instructions",
        &touches(&line.instructions, access_known),
    );
    wrapped(
        out,
        width,
        "functions",
        &touches(&line.functions, access_known),
    );
    match &line.threads {
        Some(threads) => wrapped(out, width, "threads", &touches(threads, access_known)),
        None => wrapped(
            out,
            width,
            "threads",
            &["not recorded by this capture".to_string()],
        ),
    }
    wrapped(out, width, "cpus", &touches(&line.cpus, false));
    match line.sharing {
        Some(SharingHint::SeveralWriters(n)) => wrapped(
            out,
            width,
            "sharing",
            &[format!(
                "false sharing? {n} threads write this line (if they write different \
                 variables, separate them by a cache line)"
            )],
        ),
        Some(SharingHint::SeveralThreadsUnknownAccess(n)) => wrapped(
            out,
            width,
            "sharing",
            &[format!(
                "{n} threads touch this line (loads and stores not told apart: no data source)"
            )],
        ),
        None => {}
    }
}

fn render_details(details: &FunctionDetails, width: usize, out: &mut String) {
    let _ = writeln!(
        out,
        "{INDENT}{}: {} of {} instruction samples ({:.1}%)",
        fit(
            &format!("{} ({})", details.function.name, details.function.module),
            60,
            Shorten::KeepEnd
        ),
        details.samples,
        details.event_samples,
        share(details.samples, details.event_samples)
    );
    let source = match details.source {
        CodeSource::Disassembled => {
            "instructions disassembled from the code captured at record time"
        }
        CodeSource::Kernel => {
            "kernel code: its bytes are not captured; sampled instructions only, no disassembly"
        }
        CodeSource::NotCaptured => {
            "code not captured (module unreadable at record time): sampled instructions only"
        }
        CodeSource::NoDisassembler => {
            "no disassembler for this profile's architecture (x86-64 only): sampled \
             instructions only"
        }
    };
    let _ = writeln!(out, "{INDENT}{source}");
    if let Some(host) = &details.inlined_into {
        let _ = writeln!(
            out,
            "{INDENT}{} is inlined into {}: its instructions, with the samples taken in the \
             inlined code",
            details.function.name, host.name
        );
    }
    let _ = writeln!(
        out,
        "{INDENT}Line: ~ inherited from the instruction before; *> statement out of source order;"
    );
    let _ = writeln!(
        out,
        "{INDENT}cache ln: samples of the 64-byte cache line, on its first row; Slot: byte in the \
         line;\n{INDENT}Offset: from the function's start\n"
    );
    let _ = writeln!(
        out,
        "{INDENT}{:>7} {:>5} {:>8} {:>7} {:>6} {:>4} {:>7}  >Statement / instruction",
        "samples", "%", "cache ln", "lat avg", "Line", "Slot", "Offset"
    );
    let rule = width.min(WIDTH) - INDENT.len();
    // Columns before the statement/instruction text.
    const LEAD: usize = 2 + 7 + 1 + 5 + 1 + 8 + 1 + 7 + 1 + 6 + 1 + 4 + 1 + 7 + 2;
    let samples = |n: u64| if n == 0 { String::new() } else { count(n) };
    let share_of = |n: u64| {
        if n == 0 {
            String::new()
        } else {
            percent(share(n, details.event_samples))
        }
    };
    for row in &details.rows {
        let text = match row {
            DetailRow::Statement(statement) => {
                let marker = if statement.out_of_order { "*>" } else { " >" };
                let location = match &statement.file {
                    Some(file) => format!("{}:{}", module_basename(file), statement.line),
                    None => format!("line {}", statement.line),
                };
                format!(
                    "{INDENT}{:>7} {:>5} {:>8} {:>7} {:>6} {:>4} {:>7}{marker} {}",
                    samples(statement.samples),
                    share_of(statement.samples),
                    "",
                    "",
                    statement.line,
                    "",
                    "",
                    fit(&location, width - LEAD, Shorten::KeepEnd)
                )
            }
            DetailRow::Instruction(instruction) => {
                let line = match instruction.line {
                    Some(line) if instruction.approximate_line => format!("~{line}"),
                    Some(line) => line.to_string(),
                    None => String::new(),
                };
                let text = instruction
                    .text
                    .clone()
                    .unwrap_or_else(|| format!("{:#x}", instruction.address));
                format!(
                    "{INDENT}{:>7} {:>5} {:>8} {:>7} {:>6} {:>4} {:>7}    {}",
                    samples(instruction.samples),
                    share_of(instruction.samples),
                    instruction
                        .cache_line_samples
                        .map_or(String::new(), samples),
                    instruction
                        .latency
                        .as_ref()
                        .map_or(String::new(), |l| compact(l.mean)),
                    line,
                    instruction.slot,
                    format!("+{:#x}", instruction.offset),
                    fit(&text, width - LEAD - 2, Shorten::KeepStart)
                )
            }
            DetailRow::CacheLineBoundary => format!("{INDENT}{}", "-".repeat(rule)),
            DetailRow::Gap => format!("{INDENT}{}", "~".repeat(rule)),
        };
        let _ = writeln!(out, "{}", text.trim_end());
    }
}

fn render_call_graph(graph: &Neighbours, width: usize, out: &mut String) {
    let _ = writeln!(
        out,
        "{INDENT}{}: on the stack in {} samples ({:.1}%), leaf in {}\n",
        fit(
            &format!("{} ({})", graph.function.name, graph.function.module),
            60,
            Shorten::KeepEnd
        ),
        graph.total_samples,
        share(graph.total_samples, graph.event_samples),
        graph.self_samples
    );
    let (header, none) = match graph.direction {
        Direction::Callers => ("caller", "(no caller captured: outermost frame)"),
        Direction::Callees => ("callee", "(self: the function is the leaf)"),
    };
    let rows: Vec<Vec<String>> = graph
        .neighbours
        .iter()
        .map(|n| {
            let (function, module) = match &n.function {
                Some(f) => (f.name.clone(), f.module.clone()),
                None => (none.to_string(), String::new()),
            };
            vec![
                count(n.samples),
                percent(share(n.samples, graph.total_samples)),
                function,
                module,
            ]
        })
        .collect();
    if rows.is_empty() {
        let _ = writeln!(out, "{INDENT}not on any sampled stack of this event");
        return;
    }
    table(
        out,
        width,
        &[
            number("samples"),
            number("%"),
            name(header, Shorten::Function),
            optional("module", Shorten::KeepStart),
        ],
        &rows,
    );
}

fn render_distributions(distributions: &[Distribution], width: usize, out: &mut String) {
    let _ = writeln!(out, "\n{INDENT}Latency percentiles (cycles):");
    if distributions.is_empty() {
        wrapped(out, width, "note", &[super::NO_LATENCY.to_string()]);
        return;
    }
    let rows: Vec<Vec<String>> = distributions
        .iter()
        .map(|d| {
            let [mean, p50, p90, p99, max] = latency_cells(Some(&d.summary));
            vec![
                d.scope.name().to_string(),
                d.label.clone(),
                count(d.summary.samples),
                mean,
                p50,
                p90,
                p99,
                max,
            ]
        })
        .collect();
    table(
        out,
        width,
        &[
            name("scope", Shorten::KeepStart),
            name("name", Shorten::KeepEnd),
            number("samples"),
            number("avg"),
            number("p50"),
            number("p90"),
            number("p99"),
            number("max"),
        ],
        &rows,
    );
}

fn render_accounting(profile: &Profile, width: usize, out: &mut String) {
    let losses = &profile.losses;
    let _ = writeln!(out, "\nSample accounting:");
    for (index, event) in profile.events.iter().enumerate() {
        let fired = losses.samples_fired.get(index).copied().unwrap_or(0);
        let drained = event_samples(profile, index as u32);
        let _ = writeln!(
            out,
            "{INDENT}{}",
            fit(
                &format!(
                    "{}: {fired} fired in the kernel, {drained} drained",
                    event.name
                ),
                width - INDENT.len(),
                Shorten::KeepStart
            )
        );
    }
    let nonzero: Vec<_> = losses.counters.iter().filter(|(_, n)| **n > 0).collect();
    if nonzero.is_empty() {
        let _ = writeln!(out, "{INDENT}no losses");
    }
    // A loss's name says why: wrapped under itself, never cut.
    let room = width.saturating_sub(INDENT.len() + 12).max(20);
    for (what, count) in nonzero {
        for (i, line) in word_lines(what, room).iter().enumerate() {
            match i {
                0 => writeln!(out, "{INDENT}{count:>10}  {line}"),
                _ => writeln!(out, "{INDENT}{:12}{line}", ""),
            }
            .expect("writing to a String");
        }
    }
}

/// `text` in lines of at most `room` characters, broken between words (a word longer than a
/// line stands alone).
fn word_lines(text: &str, room: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(line) if chars(line) + 1 + chars(word) <= room => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        aggregate::{functions::FunctionName, test_samples},
        profile::file::{decode_profile, encode_profile},
        report::{render_report, ViewArgs},
    };

    #[test]
    fn loss_names_wrap_between_words_and_are_never_cut() {
        let name = "user stacks by frame pointers only: the process's mappings were not loaded yet";
        let lines = word_lines(name, 40);
        assert!(lines.iter().all(|line| chars(line) <= 40), "{lines:?}");
        assert_eq!(lines.join(" "), name);
        assert_eq!(word_lines("short", 40), ["short"]);
    }

    #[test]
    fn a_symbol_longer_than_formatting_can_pad_is_cut_in_the_middle_and_kept_whole_in_the_profile()
    {
        let mut profile = test_samples::profile();
        let long = format!("{}::compute", "x".repeat(66_000));
        for frame in &mut profile.frames {
            if frame.function.as_deref() == Some("compute") {
                frame.function = Some(long.clone());
            }
        }
        // The profile file keeps the whole name.
        let profile = decode_profile(&encode_profile(&profile).unwrap()).unwrap();
        assert!(profile
            .frames
            .iter()
            .any(|f| f.function.as_deref() == Some(long.as_str())));
        for by in [
            ViewKind::Function,
            ViewKind::Line,
            ViewKind::Instruction,
            ViewKind::Module,
        ] {
            for width in [None, Some(WIDTH), Some(100_000)] {
                let args = ViewArgs {
                    by,
                    width,
                    ..ViewArgs::default()
                };
                let text = render_report(&profile, &args).unwrap().text;
                if by == ViewKind::Function {
                    let row = text
                        .lines()
                        .find(|line| line.contains("::compute") && line.contains('…'))
                        .unwrap_or_else(|| panic!("{args:?}: no shortened row"));
                    assert!(chars(row) <= MAX_NAME + 100, "{args:?}: {}", chars(row));
                    if width == Some(100_000) {
                        assert!(row.contains("xxx…xxx"), "cut in the middle: {row:.200}");
                    } else {
                        assert!(chars(row) <= width.unwrap_or(FILE_WIDTH), "{row}");
                        assert!(row.contains("x…::compute"), "own name kept: {row}");
                    }
                }
                let json = render_report(&profile, &ViewArgs { json: true, ..args })
                    .unwrap()
                    .text;
                if by == ViewKind::Function {
                    assert!(json.contains(&long), "JSON keeps the whole name");
                }
            }
        }
    }

    #[test]
    fn function_names_keep_their_own_name_arguments_and_templates_go_first() {
        let cpp =
            "ns::detail::Table<std::pair<int, long>, Hash>::find_slot(unsigned long, int) const";
        assert_eq!(
            fit_function(cpp, 50),
            "ns::detail::Table<…>::find_slot(…) const",
            "arguments go first"
        );
        assert_eq!(fit_function(cpp, 30), "ns::detai…::find_slot(…) const");
        assert_eq!(fit_function(cpp, 12), "find_slot(……");
        let rust = "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop";
        assert_eq!(fit_function(rust, 20), "<…>::drop");
        // Brackets that do not pair are no arguments.
        assert_eq!(
            fit_function("std::operator<<(std::ostream&)", 30),
            "std::operator<<(std::ostream&)"
        );
        assert_eq!(
            without_arguments("run(fn() -> u32)"),
            Some("run(…)".to_string())
        );
        assert_eq!(without_arguments("f()"), Some("f()".to_string()));
    }

    #[test]
    fn long_paths_keep_the_leaf_and_the_root_and_count_the_frames_between() {
        let frames: Vec<String> = (0..30).map(|n| format!("frame_{n:02}")).collect();
        let path = frames.join(PATH_SEPARATOR);
        let cut = fit_path(&path, 80);
        assert!(chars(&cut) <= 80, "{cut}");
        assert!(cut.starts_with("frame_00 <- frame_01 <- "), "{cut}");
        assert!(cut.ends_with(" <- frame_28 <- frame_29"), "{cut}");
        let shown = cut.matches("frame_").count();
        assert!(cut.contains(&format!("… {} frames …", 30 - shown)), "{cut}");
        assert_eq!(fit_path(&path, 1000), path);
        assert_eq!(
            fit_path("f(int) <- main(int, char**)", 25),
            "f(…) <- main(…)",
            "arguments go first"
        );
    }

    #[test]
    fn the_module_column_stays_at_80_columns_and_names_shrink() {
        let mut profile = test_samples::profile();
        let long = format!(
            "{}::compute(int, long)",
            "a_rather_long_namespace".repeat(3)
        );
        for frame in &mut profile.frames {
            if frame.function.as_deref() == Some("compute") {
                frame.function = Some(long.clone());
            }
        }
        let args = ViewArgs {
            width: Some(80),
            ..ViewArgs::default()
        };
        let text = render_report(&profile, &args).unwrap().text;
        assert!(text.lines().all(|l| chars(l) <= 80), "{text}");
        let header = text
            .lines()
            .find(|l| l.trim_start().starts_with("self "))
            .unwrap();
        assert!(header.ends_with(" module"), "{header}");
        let module = FunctionName::of(
            profile
                .frames
                .iter()
                .find(|f| f.function.as_deref() == Some(long.as_str()))
                .unwrap(),
        )
        .module;
        let row = text.lines().find(|l| l.contains("::compute(…)")).unwrap();
        assert!(row.ends_with(&format!(" {module}")), "{module}: {row}");
    }
}
