//! The latency plot (`--histogram FILE.svg`): one panel per event, function, source line and
//! data cache-line distribution, a bar per kernel latency bucket on a logarithmic latency axis, with the p50,
//! p90 and p99 marked. Plain SVG written by hand: no script, no external resources.

use std::fmt::Write;

use profiler_common::latency::bucket_range;

use crate::aggregate::latency::Distribution;

use super::Report;

const WIDTH: f64 = 860.0;
const PANEL_HEIGHT: f64 = 190.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const PLOT_HEIGHT: f64 = 120.0;

/// Escapes text for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// Maps latencies to x on a log scale over `1..=limit`.
struct LogAxis {
    limit: f64,
}

impl LogAxis {
    fn x(&self, latency: f64) -> f64 {
        let plot = WIDTH - LEFT - RIGHT;
        LEFT + plot * (latency.max(1.0).ln() / self.limit.ln())
    }
}

pub fn latency_plot(report: &Report) -> String {
    let panels: Vec<(String, &Distribution)> = report
        .sections
        .iter()
        .flat_map(|section| {
            let event = &report.profile.events[section.event as usize].name;
            section
                .latency
                .iter()
                .flatten()
                .map(move |d| (format!("{event}, {} {}", d.scope.name(), d.label), d))
        })
        .collect();
    let height = TOP + PANEL_HEIGHT * panels.len().max(1) as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="22" font-size="15">Latency distributions (cycles, log scale): {}</text>"#,
        escape(&report.profile.meta.target)
    );
    if panels.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text x="{LEFT}" y="{}">no latency histograms in this profile</text>"#,
            TOP + 20.0
        );
    }
    for (index, (title, distribution)) in panels.iter().enumerate() {
        panel(
            &mut svg,
            TOP + PANEL_HEIGHT * index as f64,
            title,
            distribution,
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn panel(svg: &mut String, top: f64, title: &str, distribution: &Distribution) {
    let summary = &distribution.summary;
    let highest = distribution
        .buckets
        .iter()
        .map(|(bucket, _)| bucket_range(usize::from(*bucket)).1 + 1)
        .max()
        .unwrap_or(2);
    // The axis ends at the next power of ten above the slowest bucket.
    let limit = 10f64.powi((highest as f64).log10().ceil().max(1.0) as i32);
    let axis = LogAxis { limit };
    let tallest = distribution
        .buckets
        .iter()
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(1) as f64;
    let base = top + 30.0 + PLOT_HEIGHT;
    let percentiles = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{}" font-size="12">{}: {} samples, avg {:.1}, p50 {}, p90 {}, p99 {}, max {}</text>"#,
        top + 18.0,
        escape(title),
        summary.samples,
        summary.mean,
        percentiles(summary.p50),
        percentiles(summary.p90),
        percentiles(summary.p99),
        summary.max
    );
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{base}" x2="{}" y2="{base}" stroke="#333"/>"##,
        WIDTH - RIGHT
    );
    let mut tick = 1.0;
    while tick <= limit {
        let x = axis.x(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{base}" x2="{x:.1}" y2="{}" stroke="#333"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            base + 4.0,
            base + 16.0,
            tick
        );
        tick *= 10.0;
    }
    for (bucket, count) in &distribution.buckets {
        let (low, high) = bucket_range(usize::from(*bucket));
        let x1 = axis.x(low as f64);
        // At least one pixel wide, so the exact buckets of small latencies stay visible.
        let width = (axis.x(high as f64 + 1.0) - x1).max(1.0);
        let height = PLOT_HEIGHT * *count as f64 / tallest;
        let _ = writeln!(
            svg,
            r##"<rect x="{x1:.2}" y="{:.2}" width="{width:.2}" height="{height:.2}" fill="#4a7ebb"><title>{low}-{high}: {count}</title></rect>"##,
            base - height
        );
    }
    for (label, value) in [
        ("p50", summary.p50),
        ("p90", summary.p90),
        ("p99", summary.p99),
    ] {
        if let Some(value) = value {
            let x = axis.x(value as f64);
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{base}" stroke="#c0392b" stroke-dasharray="3,3"/><text x="{x:.1}" y="{}" fill="#c0392b" text-anchor="middle">{label}</text>"##,
                base - PLOT_HEIGHT,
                base - PLOT_HEIGHT - 3.0
            );
        }
    }
}
