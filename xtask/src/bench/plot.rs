//! SVG line charts of the figures against the sampling rate (log scale): overhead and loss, one
//! line per workload and tool (ours solid, perf dashed), written by hand, no plotting crate.

use std::fmt::Write;

use super::{
    summary::{RowSummary, ToolSummary},
    tools::Tool,
};

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// How the value axis starts and its smallest span.
#[derive(Clone, Copy)]
enum Axis {
    /// A ratio to a baseline: from 1 (or below, when a value is), at least 0.5 tall.
    Ratio,
    /// A percentage: from 0, at least 1% tall.
    Percent,
}

struct Series {
    name: String,
    color: &'static str,
    dashed: bool,
    /// (rate in Hz, value), by rate.
    points: Vec<(f64, f64)>,
}

/// Whole-tree CPU time (workload + tool) as a ratio to the bare run, against the rate.
pub fn overhead(rows: &[RowSummary]) -> String {
    chart(
        "CPU time of workload + tool, x bare (median over rounds)",
        "CPU time / bare",
        rows,
        |summary| summary.total_cpu_ratio.map(|spread| spread.median),
        Axis::Ratio,
    )
}

/// Samples lost (reported or silent) as a percentage, against the rate.
pub fn loss(rows: &[RowSummary]) -> String {
    chart(
        "Samples lost, % of samples the kernel handed over (all rounds)",
        "lost %",
        rows,
        |summary| Some(summary.loss_percent),
        Axis::Percent,
    )
}

fn chart(
    title: &str,
    y_label: &str,
    rows: &[RowSummary],
    value: impl Fn(&ToolSummary) -> Option<f64>,
    axis: Axis,
) -> String {
    let mut workloads: Vec<&str> = Vec::new();
    for row in rows {
        if row.sampling.frequency().is_some() && !workloads.contains(&row.workload) {
            workloads.push(row.workload);
        }
    }
    let mut series = Vec::new();
    for (index, workload) in workloads.iter().enumerate() {
        for tool in [Tool::Ours, Tool::Perf] {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|row| row.workload == *workload)
                .filter_map(|row| {
                    let hz = row.sampling.frequency()? as f64;
                    let summary = match tool {
                        Tool::Ours => &row.ours,
                        Tool::Perf => &row.perf,
                    };
                    Some((hz, value(summary)?))
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series {
                name: format!("{} {workload}", tool.name()),
                color: COLORS[index % COLORS.len()],
                dashed: tool == Tool::Perf,
                points,
            });
        }
    }
    render(title, y_label, &series, axis)
}

/// Round numbers for axis ticks covering 0..=max: 1, 2 or 5 times a power of ten apart.
fn nice_step(span: f64) -> f64 {
    let raw = span / 5.0;
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|factor| factor * power)
        .find(|step| *step >= raw)
        .unwrap_or(10.0 * power);
    step.max(f64::MIN_POSITIVE)
}

fn rate_label(hz: f64) -> String {
    if hz >= 1000.0 && (hz % 1000.0).abs() < 1e-9 {
        format!("{}k", hz / 1000.0)
    } else {
        format!("{hz}")
    }
}

fn render(title: &str, y_label: &str, series: &[Series], axis: Axis) -> String {
    let points = || series.iter().flat_map(|s| s.points.iter());
    let x_min = points().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = points().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let y_low = points().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let y_max = points().map(|p| p.1).fold(0.0, f64::max);
    let (x_min, x_max) = if x_min.is_finite() {
        (x_min.log10() - 0.1, x_max.log10() + 0.1)
    } else {
        (0.0, 1.0)
    };
    let (y_min, min_span) = match axis {
        Axis::Ratio => (y_low.min(1.0), 0.5),
        Axis::Percent => (0.0, 1.0),
    };
    let y_max = y_max.max(y_min + min_span);
    let step = nice_step(y_max - y_min);
    let y_min = (y_min / step).floor() * step;
    let y_top = (y_max / step).ceil() * step;
    let plot_width = WIDTH - LEFT - RIGHT;
    let plot_height = HEIGHT - TOP - BOTTOM;
    let x = |hz: f64| LEFT + (hz.log10() - x_min) / (x_max - x_min) * plot_width;
    let y = |v: f64| TOP + plot_height - (v - y_min) / (y_top - y_min) * plot_height;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="22" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let mut tick = y_min;
    while tick <= y_top + step / 2.0 {
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_width,
            LEFT - 6.0,
            y(tick) + 4.0,
            format_tick(tick, step),
            y = y(tick),
        );
        tick += step;
    }
    let mut rates: Vec<f64> = points().map(|p| p.0).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    for hz in rates {
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_height,
            TOP + plot_height + 18.0,
            rate_label(hz),
            x = x(hz),
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">cpu-clock sampling rate, Hz per CPU (log scale)</text>"#,
        LEFT + plot_width / 2.0,
        HEIGHT - 12.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_height / 2.0,
        escape(y_label)
    );
    for (index, line) in series.iter().enumerate() {
        let dash = if line.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let path: Vec<String> = line
            .points
            .iter()
            .map(|&(hz, v)| format!("{:.1},{:.1}", x(hz), y(v)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            path.join(" "),
            line.color
        );
        for &(hz, v) in &line.points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                x(hz),
                y(v),
                line.color
            );
        }
        let legend_y = TOP + 10.0 + 18.0 * index as f64;
        let legend_x = WIDTH - RIGHT + 15.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x}" x2="{:.1}" y1="{legend_y:.1}" y2="{legend_y:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            legend_x + 28.0,
            line.color,
            legend_x + 34.0,
            legend_y + 4.0,
            escape(&line.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn format_tick(value: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10()).ceil() as usize
    };
    format!("{value:.decimals$}")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_numbers() {
        assert_eq!(nice_step(1.0), 0.2);
        assert_eq!(nice_step(0.3), 0.1);
        assert_eq!(nice_step(37.0), 10.0);
        assert_eq!(format_tick(1.2000000001, 0.2), "1.2");
        assert_eq!(format_tick(40.0, 10.0), "40");
        assert_eq!(rate_label(50_000.0), "50k");
        assert_eq!(rate_label(999.0), "999");
    }

    #[test]
    fn one_line_per_tool_with_a_point_per_rate_and_a_legend() {
        let series = [
            Series {
                name: "ours deep_stack".into(),
                color: COLORS[0],
                dashed: false,
                points: vec![(1000.0, 1.01), (10_000.0, 1.05)],
            },
            Series {
                name: "perf <deep>".into(),
                color: COLORS[0],
                dashed: true,
                points: vec![(1000.0, 1.1), (10_000.0, 1.4)],
            },
        ];
        let svg = render("title", "ratio", &series, Axis::Ratio);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert_eq!(
            svg.matches("stroke-dasharray").count(),
            2,
            "perf's line and legend"
        );
        assert!(svg.contains(">perf &lt;deep&gt;</text>"));
        assert!(svg.contains(">10k</text>") && svg.contains(">1k</text>"));
        // Ratios from 1.01 to 1.4 fit a 1.0..1.5 axis in steps of 0.1.
        assert!(svg.contains(">1.0</text>") && svg.contains(">1.5</text>"));
        assert!(!svg.contains(">0.9</text>") && !svg.contains(">1.6</text>"));
    }

    #[test]
    fn no_loss_still_draws_a_percent_axis() {
        let series = [Series {
            name: "ours".into(),
            color: COLORS[0],
            dashed: false,
            points: vec![(1000.0, 0.0), (50_000.0, 0.0)],
        }];
        let svg = render("title", "lost %", &series, Axis::Percent);
        assert!(svg.contains(">0.0</text>") && svg.contains(">1.0</text>"));
    }
}
