//! The default text report: per event, the top functions by self and total samples, the hottest
//! call paths, and the sample accounting with every kind of loss.

use std::fmt::Write;

use crate::{
    aggregate::functions::{event_samples, function_rows, hot_paths},
    profile::Profile,
};

pub struct TextOptions {
    pub top: usize,
    pub paths: usize,
}

impl Default for TextOptions {
    fn default() -> Self {
        TextOptions { top: 20, paths: 5 }
    }
}

fn percent(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * part as f64 / total as f64
    }
}

/// Shortens a name to `width` characters, keeping its end where the distinguishing part is.
fn fit(name: &str, width: usize) -> String {
    let count = name.chars().count();
    if count <= width {
        name.to_string()
    } else {
        let tail: String = name.chars().skip(count - (width - 1)).collect();
        format!("…{tail}")
    }
}

/// Shortens a call path to `width` characters, keeping its start: the leaf.
fn fit_path(path: &str, width: usize) -> String {
    if path.chars().count() <= width {
        path.to_string()
    } else {
        let head: String = path.chars().take(width - 1).collect();
        format!("{head}…")
    }
}

pub fn render(profile: &Profile, options: &TextOptions) -> String {
    let mut out = String::new();
    let meta = &profile.meta;
    let _ = writeln!(
        out,
        "Profile of {} on {} (kernel {}), {:.2} s",
        meta.target,
        meta.hostname,
        meta.kernel_release,
        meta.duration_ns as f64 / 1e9
    );
    for (index, event) in profile.events.iter().enumerate() {
        let index = index as u32;
        let total = event_samples(profile, index);
        let rate = match (event.period, event.frequency) {
            (Some(period), _) => format!("every {period} {}", event.unit),
            (None, Some(hz)) => format!("{hz} Hz"),
            (None, None) => String::new(),
        };
        let _ = writeln!(out, "\nEvent {} ({rate}): {total} samples", event.name);
        let _ = writeln!(
            out,
            "\n  {:>8} {:>6} {:>8} {:>6}  {:<48} module",
            "self", "self%", "total", "total%", "function"
        );
        for row in function_rows(profile, index).iter().take(options.top) {
            let _ = writeln!(
                out,
                "  {:>8} {:>5.1}% {:>8} {:>5.1}%  {:<48} {}",
                row.self_samples,
                percent(row.self_samples, total),
                row.total_samples,
                percent(row.total_samples, total),
                fit(&row.function.name, 48),
                fit(&row.function.module, 20)
            );
        }
        let paths = hot_paths(profile, index, options.paths);
        if !paths.is_empty() {
            let _ = writeln!(out, "\n  Hot call paths (leaf first):");
        }
        for path in paths {
            let _ = writeln!(
                out,
                "  {:>8} {:>5.1}%  {}",
                path.samples,
                percent(path.samples, total),
                fit_path(&path.functions.join(" <- "), 84)
            );
        }
    }
    render_accounting(profile, &mut out);
    out
}

fn render_accounting(profile: &Profile, out: &mut String) {
    let losses = &profile.losses;
    let _ = writeln!(out, "\nSample accounting:");
    for (index, event) in profile.events.iter().enumerate() {
        let fired = losses.samples_fired.get(index).copied().unwrap_or(0);
        let drained = event_samples(profile, index as u32);
        let _ = writeln!(
            out,
            "  {}: {fired} fired in the kernel, {drained} drained",
            event.name
        );
    }
    let nonzero: Vec<_> = losses.counters.iter().filter(|(_, n)| **n > 0).collect();
    if nonzero.is_empty() {
        let _ = writeln!(out, "  no losses");
    }
    for (what, count) in nonzero {
        let _ = writeln!(out, "  {count:>10}  {what}");
    }
}
