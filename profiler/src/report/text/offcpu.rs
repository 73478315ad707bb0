//! The off-CPU part of the text report: blocked time by state, thread, function and stack,
//! the wall-clock view per thread, and with `--histogram` block-duration distributions.

use std::fmt::Write;

use super::{count, fit, name, number, table, wrapped, Column, Shorten, INDENT};
use crate::aggregate::offcpu::{BlockedTime, OffCpuDistribution, OffCpuReport, OffCpuRow};

/// A duration in at most 7 characters: `812ns`, `35.2us`, `100.1ms`, `12.34s`.
pub fn duration(ns: u64) -> String {
    let value = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}us", value / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.1}ms", value / 1e6)
    } else {
        format!("{:.2}s", value / 1e9)
    }
}

fn optional_duration(ns: Option<u64>) -> String {
    ns.map_or("-".to_string(), duration)
}

const TIME_COLUMNS: [Column; 6] = [
    number("blocked"),
    number("blocks"),
    number("p50"),
    number("p90"),
    number("p99"),
    number("max"),
];

fn time_cells(time: &BlockedTime) -> Vec<String> {
    vec![
        duration(time.total_ns),
        count(time.blocks),
        optional_duration(time.p50_ns),
        optional_duration(time.p90_ns),
        optional_duration(time.p99_ns),
        duration(time.max_ns),
    ]
}

fn render_rows(title: &str, key: Column, rows: &[OffCpuRow], width: usize, out: &mut String) {
    let _ = writeln!(out, "\n{title}:");
    if rows.is_empty() {
        let _ = writeln!(out, "{INDENT}no blocks");
        return;
    }
    let mut columns: Vec<Column> = TIME_COLUMNS.into_iter().collect();
    columns.push(key);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let mut cells = time_cells(&row.time);
            cells.push(row.name.clone());
            cells
        })
        .collect();
    table(out, width, &columns, &cells);
}

pub fn render_offcpu(report: &OffCpuReport, width: usize, out: &mut String) {
    let min = if report.min_block_ns > 0 {
        format!(
            "; blocks under {} counted without stacks",
            duration(report.min_block_ns)
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "\n{}",
        fit(
            &format!(
                "Off-CPU time ({}): {} blocked in {} blocks{min}",
                report.attachment,
                duration(report.time.total_ns),
                count(report.time.blocks)
            ),
            width,
            Shorten::KeepStart
        )
    );
    render_rows(
        "By state",
        name("state", Shorten::KeepEnd),
        &report.by_state,
        width,
        out,
    );
    render_rows(
        "By thread",
        name("thread", Shorten::KeepEnd),
        &report.by_thread,
        width,
        out,
    );
    render_rows(
        "By function (each block counts for every function on its stack)",
        name("function", Shorten::Function),
        &report.by_function,
        width,
        out,
    );
    let _ = writeln!(out, "\nBy stack:");
    if report.by_stack.is_empty() {
        let _ = writeln!(out, "{INDENT}no blocks");
    }
    for row in &report.by_stack {
        let time = &row.time;
        let _ = writeln!(
            out,
            "{INDENT}{} in {} blocks ({}): p50 {} p90 {} p99 {} max {}",
            duration(time.total_ns),
            count(time.blocks),
            row.state.unwrap_or("-"),
            optional_duration(time.p50_ns),
            optional_duration(time.p90_ns),
            optional_duration(time.p99_ns),
            duration(time.max_ns)
        );
        let frames = row.frames.clone().unwrap_or_default();
        if frames.is_empty() {
            let _ = writeln!(
                out,
                "{INDENT}{INDENT}[no stack: shorter than --off-cpu-min]"
            );
        } else {
            wrapped(out, width, &format!("{INDENT}{INDENT}"), &frames);
        }
    }
    render_wakers(report, width, out);
    render_wall_clock(report, width, out);
    if let Some(distributions) = &report.distributions {
        for distribution in distributions {
            render_distribution(distribution, width, out);
        }
    }
    let counters: Vec<String> = report
        .counters
        .iter()
        .map(|(what, count)| format!("{what}: {count}"))
        .collect();
    wrapped(out, width, "\nOff-CPU accounting: ", &counters);
}

/// `--wakers`: who ended the blocks, with the waker's stack.
fn render_wakers(report: &OffCpuReport, width: usize, out: &mut String) {
    if report.by_waker.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nBy waker:");
    for row in &report.by_waker {
        let line = format!(
            "{INDENT}{} in {} blocks ({}): {} in {}, woken by {}",
            duration(row.total_ns),
            count(row.blocks),
            row.state,
            row.thread,
            row.blocked_in,
            row.waker
        );
        let _ = writeln!(out, "{}", fit(&line, width, Shorten::KeepStart));
        if row.waker_frames.is_empty() {
            let _ = writeln!(out, "{INDENT}{INDENT}[waker's stack not captured]");
        } else {
            wrapped(out, width, &format!("{INDENT}{INDENT}"), &row.waker_frames);
        }
    }
}

fn render_wall_clock(report: &OffCpuReport, width: usize, out: &mut String) {
    let scaled = match &report.clock_event {
        Some(event) => format!("on-CPU = {event} samples x period, within a period a thread"),
        None => "no clock event recorded: on-CPU time unknown".to_string(),
    };
    let _ = writeln!(out, "\nWall clock by thread ({scaled}):");
    let columns = [
        number("wall"),
        number("on-CPU"),
        number("off-CPU"),
        number("sleeping"),
        number("disk"),
        number("run-queue"),
        name("thread", Shorten::KeepEnd),
    ];
    let state = |row: &crate::aggregate::offcpu::WallRow, state: &str| {
        duration(row.off_cpu_by_state.get(state).copied().unwrap_or(0))
    };
    let rows: Vec<Vec<String>> = report
        .wall_clock
        .iter()
        .map(|row| {
            vec![
                optional_duration(row.wall_ns),
                optional_duration(row.on_cpu_ns),
                duration(row.off_cpu_ns),
                state(row, "sleeping"),
                state(row, "uninterruptible"),
                state(row, "run-queue"),
                format!("{} {}/{}", row.comm, row.pid, row.tid),
            ]
        })
        .collect();
    table(out, width, &columns, &rows);
}

fn render_distribution(distribution: &OffCpuDistribution, width: usize, out: &mut String) {
    let time = &distribution.time;
    let _ = writeln!(
        out,
        "\n{}",
        fit(
            &format!(
                "Block durations through {}: {} blocks, p50 {} p90 {} p99 {} max {}",
                distribution.function,
                count(time.blocks),
                optional_duration(time.p50_ns),
                optional_duration(time.p90_ns),
                optional_duration(time.p99_ns),
                duration(time.max_ns)
            ),
            width,
            Shorten::KeepStart
        )
    );
    let most = distribution
        .buckets
        .iter()
        .map(|bucket| bucket.blocks)
        .max()
        .unwrap_or(0)
        .max(1);
    for bucket in &distribution.buckets {
        let bar = "#".repeat(((bucket.blocks * 40).div_ceil(most)) as usize);
        let _ = writeln!(
            out,
            "{INDENT}{:>8} .. {:<8} {:>7} {bar}",
            duration(bucket.from_ns),
            duration(bucket.to_ns),
            count(bucket.blocks)
        );
    }
}
