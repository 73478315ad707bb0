//! The `profiler stat` report as aligned text (in the layout of `perf stat`) or as JSON.
//!
//! JSON schema `profiler.stat/1`:
//! ```text
//! {
//!   "schema": "profiler.stat/1",
//!   "target": "'cmd args'" | "process 12,34" | "all CPUs",
//!   "elapsed_ns": u64,
//!   "command": {"exit_code": i32} | {"signal": i32} | "stopped" | null,
//!              (launched commands only; "stopped": still running when counting stopped)
//!   "events": [Event],                                         (in -e order)
//!   "threads": [{"pid", "tid", "name",                         (--per-thread only)
//!                "also_counts": u32, "events": [Event]}],
//!   "cpus": [{"cpu": u32, "events": [Event]}],                 (--per-cpu only)
//!   "lost_thread_records": u64
//! }
//! Event = {
//!   "event": name, "spec": as written (totals only), "unit": unit of the counts,
//!   "supported": bool, "reason": why not (when not supported),
//!   "count": u64 | null (scaled for multiplexing; null when the counter never ran),
//!   "raw_count": u64, "time_enabled_ns": u64, "time_running_ns": u64,
//!   "scaled": bool, "running_percent": f64,
//!   "value": f64 (count x the event's sysfs scale, in "unit"; events with a scale only),
//!   "metrics": [{"metric": "insn_per_cycle" | "miss_percent" | "misses_per_1k_instructions"
//!                 | "cpus_utilized" | "per_second" (per second of a counted clock's CPU time)
//!                 | "per_elapsed_second" (no clock counted), "value": f64,
//!                "accesses": event name (miss_percent only)}]
//! }
//! ```
//! Counts of an unsupported event are absent. A thread's `also_counts` is the number of other
//! threads whose counts are included in its own: the kernel gave them none of their own (they
//! still ran when counting stopped). With `--per-cpu` or `--per-thread` on a command or
//! processes, counters are opened per CPU and counts are not scaled for multiplexing (the
//! kernel's enabled times do not add up there): both times are how long the counters ran.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::metrics::{metrics_for, EventValue, Metric};
use super::{Breakdown, StatEvent, StatReport};
use crate::events::catalog::unit;
use crate::events::count::Count;
use crate::launch::CommandEnd;

/// Width of the count column, as in perf.
const COUNT_WIDTH: usize = 18;
/// Narrowest event-name column.
const NAME_WIDTH: usize = 25;

/// `1234567` as `1,234,567`.
fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut text = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            text.push(',');
        }
        text.push(digit);
    }
    text
}

/// The count to show: `None` (`<not counted>`) when the counters never ran. In a thread's or
/// CPU's row that only means the thread or CPU did not run the target: zero.
fn shown(count: &Count, row: bool) -> Option<u64> {
    (count.counted() || row).then_some(count.estimate)
}

/// The count column and the unit column for one count.
fn count_columns(event: &StatEvent, count: Option<&Count>, row: bool) -> (String, String) {
    let Some(count) = count else {
        return ("<not supported>".to_string(), String::new());
    };
    if shown(count, row).is_none() {
        return ("<not counted>".to_string(), String::new());
    }
    match event.scale {
        Some(scale) => (
            format!("{:.2}", count.estimate as f64 * scale),
            event.unit.clone(),
        ),
        None if event.unit == unit::NANOSECONDS => {
            let msec = count.estimate as f64 / 1e6;
            let whole = grouped(msec.trunc() as u64);
            (
                format!("{whole}.{:02}", (msec.fract() * 100.0).round() as u64 % 100),
                "msec".to_string(),
            )
        }
        None => (grouped(count.estimate), String::new()),
    }
}

/// A rate with a K/M/G prefix, as perf prints them; `per` names the second (`sec` of CPU time,
/// as perf, or `sec elapsed`).
fn per_second(value: f64, per: &str) -> String {
    let (scaled, prefix) = if value >= 1e9 {
        (value / 1e9, "G")
    } else if value >= 1e6 {
        (value / 1e6, "M")
    } else if value >= 1e3 {
        (value / 1e3, "K")
    } else {
        (value, "")
    };
    format!("{scaled:8.3} {prefix}/{per}")
}

fn describe(metric: &Metric) -> String {
    match metric {
        Metric::InsnPerCycle(value) => format!("{value:8.2} insn per cycle"),
        Metric::MissRate { percent, accesses } => format!("{percent:7.2}% of all {accesses}"),
        Metric::MissesPerKiloInstruction(value) => {
            format!("{value:8.2} misses per 1k instructions")
        }
        Metric::CpusUtilized(value) => format!("{value:8.3} CPUs utilized"),
        Metric::PerSecond(value) => per_second(*value, "sec"),
        Metric::PerElapsedSecond(value) => per_second(*value, "sec elapsed"),
    }
}

/// The metrics inputs for one set of counts (the totals, a thread or a CPU).
fn values<'a>(
    events: &'a [StatEvent],
    counts: &[Option<&Count>],
    row: bool,
) -> Vec<EventValue<'a>> {
    events
        .iter()
        .zip(counts)
        .map(|(event, count)| EventValue {
            name: &event.name,
            attr: event.attr,
            count: count.and_then(|count| shown(count, row)),
        })
        .collect()
}

/// One block of event lines, each prefixed by `label` (empty for the totals).
fn event_lines(
    out: &mut String,
    label: &str,
    report: &StatReport,
    counts: &[Option<&Count>],
    name_width: usize,
) {
    let row = !label.is_empty();
    let values = values(&report.events, counts, row);
    for (index, (event, count)) in report.events.iter().zip(counts).enumerate() {
        let (value, unit) = count_columns(event, *count, row);
        let mut line = format!(
            "{label}{value:>COUNT_WIDTH$} {unit:<4} {:<name_width$}",
            event.name
        );
        let metrics = metrics_for(index, &values, report.elapsed);
        let metric_column = line.len();
        match metrics.first() {
            Some(metric) => {
                let _ = write!(line, " # {}", describe(metric));
            }
            None if count.is_some_and(Count::scaled) => line.push_str("   "),
            None => {}
        }
        if let Some(count) = count.filter(|count| count.scaled()) {
            let _ = write!(line, "  (scaled from {:.1}%)", count.running_percent());
        }
        out.push_str(line.trim_end());
        out.push('\n');
        for metric in metrics.iter().skip(1) {
            let _ = writeln!(out, "{:metric_column$} # {}", "", describe(metric));
        }
    }
}

fn totals(report: &StatReport) -> Vec<Option<&Count>> {
    report
        .events
        .iter()
        .map(|event| event.total.as_ref().ok())
        .collect()
}

/// The aligned text report.
pub fn text(report: &StatReport) -> String {
    let name_width = report
        .events
        .iter()
        .map(|event| event.name.len())
        .max()
        .unwrap_or(0)
        .max(NAME_WIDTH);
    let mut out = String::new();
    let split = match &report.breakdown {
        Breakdown::None => "",
        Breakdown::Threads(_) => " (per thread, then the total)",
        Breakdown::Cpus(_) => " (per CPU, then the total)",
    };
    let _ = writeln!(
        out,
        "\n Performance counter stats for {}{split}:\n",
        report.target
    );
    let mut footnotes = Vec::new();
    let rows: Vec<(String, Vec<Option<&Count>>)> = match &report.breakdown {
        Breakdown::None => Vec::new(),
        Breakdown::Threads(threads) => threads
            .iter()
            .map(|row| {
                let mut label = format!("{}-{}", row.name, row.thread.tid);
                if row.also_counts > 0 {
                    footnotes.push(format!(
                        " * {label} also counts {} other thread(s) still running when counting \
                         stopped (the kernel gives a thread its own count when it exits)",
                        row.also_counts
                    ));
                    label.push('*');
                }
                (label, row.counts.iter().map(Option::as_ref).collect())
            })
            .collect(),
        Breakdown::Cpus(cpus) => cpus
            .iter()
            .map(|row| {
                (
                    format!("CPU{}", row.cpu),
                    row.counts.iter().map(Option::as_ref).collect(),
                )
            })
            .collect(),
    };
    if !rows.is_empty() {
        let label_width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
        for (label, counts) in &rows {
            event_lines(
                &mut out,
                &format!(" {label:<label_width$}"),
                report,
                counts,
                name_width,
            );
            out.push('\n');
        }
        out.push_str(" Total:\n");
    }
    event_lines(&mut out, "", report, &totals(report), name_width);
    let _ = writeln!(
        out,
        "\n{:>COUNT_WIDTH$.9} seconds time elapsed",
        report.elapsed.as_secs_f64()
    );
    let ending = &report.ending;
    let failed = match ending.command {
        Some(CommandEnd::Exited(code)) => code != 0,
        Some(CommandEnd::Signaled(_)) => true,
        None => false,
    };
    if failed || ending.asked.is_some() {
        let _ = writeln!(out, "\n Counting ended: {}.", ending.describe());
    }

    // One line per distinct reason, naming every event it applies to.
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for event in &report.events {
        if let Err(reason) = &event.total {
            match reasons.iter_mut().find(|(known, _)| known == reason) {
                Some((_, names)) => names.push(&event.name),
                None => reasons.push((reason, vec![&event.name])),
            }
        }
    }
    if !reasons.is_empty() {
        out.push_str("\n Not supported here:\n");
        for (reason, names) in reasons {
            let _ = writeln!(out, "   {}: {reason}", names.join(", "));
        }
    }
    if !footnotes.is_empty() {
        out.push('\n');
        for footnote in footnotes {
            let _ = writeln!(out, "{footnote}");
        }
    }
    if report.lost_thread_records > 0 {
        let _ = writeln!(
            out,
            "\n {} per-thread records were lost (ring buffer full): those threads are counted in \
             the row of the thread that started them",
            report.lost_thread_records
        );
    }
    out.push('\n');
    out
}

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: &'static str,
    target: &'a str,
    elapsed_ns: u64,
    command: Option<JsonCommand>,
    /// Why counting stopped and how the command ended, as `record --json` says it.
    ending: serde_json::Value,
    events: Vec<JsonEvent<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    threads: Option<Vec<JsonThread<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpus: Option<Vec<JsonCpu<'a>>>,
    lost_thread_records: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum JsonCommand {
    ExitCode(i32),
    Signal(i32),
}

#[derive(Serialize)]
struct JsonEvent<'a> {
    event: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<&'a str>,
    unit: &'a str,
    supported: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(flatten)]
    count: Option<JsonCount>,
    metrics: Vec<JsonMetric>,
}

#[derive(Serialize)]
struct JsonCount {
    count: Option<u64>,
    raw_count: u64,
    time_enabled_ns: u64,
    time_running_ns: u64,
    scaled: bool,
    running_percent: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<f64>,
}

#[derive(Serialize)]
struct JsonMetric {
    metric: &'static str,
    value: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    accesses: Option<String>,
}

#[derive(Serialize)]
struct JsonThread<'a> {
    pid: u32,
    tid: u32,
    name: &'a str,
    also_counts: u32,
    events: Vec<JsonEvent<'a>>,
}

#[derive(Serialize)]
struct JsonCpu<'a> {
    cpu: u32,
    events: Vec<JsonEvent<'a>>,
}

/// The events of one set of counts; `totals` adds each event's spec and reason.
fn json_events<'a>(
    report: &'a StatReport,
    counts: &[Option<&Count>],
    totals: bool,
) -> Vec<JsonEvent<'a>> {
    let values = values(&report.events, counts, !totals);
    report
        .events
        .iter()
        .zip(counts)
        .enumerate()
        .map(|(index, (event, count))| JsonEvent {
            event: &event.name,
            spec: totals.then_some(event.text.as_str()),
            unit: &event.unit,
            supported: event.total.is_ok(),
            reason: event.total.as_ref().err().map(String::as_str),
            count: count.map(|count| JsonCount {
                count: shown(count, !totals),
                raw_count: count.raw,
                time_enabled_ns: count.enabled_ns,
                time_running_ns: count.running_ns,
                scaled: count.scaled(),
                running_percent: count.running_percent(),
                value: event.scale.map(|scale| count.estimate as f64 * scale),
            }),
            metrics: metrics_for(index, &values, report.elapsed)
                .into_iter()
                .map(|metric| JsonMetric {
                    metric: metric.key(),
                    value: metric.value(),
                    accesses: match metric {
                        Metric::MissRate { accesses, .. } => Some(accesses),
                        _ => None,
                    },
                })
                .collect(),
        })
        .collect()
}

fn elapsed_ns(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

/// The JSON report (schema `profiler.stat/1`, see the module documentation).
pub fn json(report: &StatReport) -> serde_json::Result<String> {
    let (threads, cpus) = match &report.breakdown {
        Breakdown::None => (None, None),
        Breakdown::Threads(rows) => (
            Some(
                rows.iter()
                    .map(|row| JsonThread {
                        pid: row.thread.pid,
                        tid: row.thread.tid,
                        name: &row.name,
                        also_counts: row.also_counts,
                        events: json_events(
                            report,
                            &row.counts.iter().map(Option::as_ref).collect::<Vec<_>>(),
                            false,
                        ),
                    })
                    .collect(),
            ),
            None,
        ),
        Breakdown::Cpus(rows) => (
            None,
            Some(
                rows.iter()
                    .map(|row| JsonCpu {
                        cpu: row.cpu,
                        events: json_events(
                            report,
                            &row.counts.iter().map(Option::as_ref).collect::<Vec<_>>(),
                            false,
                        ),
                    })
                    .collect(),
            ),
        ),
    };
    let document = JsonReport {
        schema: "profiler.stat/1",
        target: &report.target,
        elapsed_ns: elapsed_ns(report.elapsed),
        command: report.ending.command.map(|end| match end {
            CommandEnd::Exited(code) => JsonCommand::ExitCode(code),
            CommandEnd::Signaled(signal) => JsonCommand::Signal(signal),
        }),
        ending: report.ending.json(),
        events: json_events(report, &totals(report), true),
        threads,
        cpus,
        lost_thread_records: report.lost_thread_records,
    };
    let mut text = serde_json::to_string_pretty(&document)?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::super::counters::ThreadId;
    use super::super::{CpuRow, ThreadRow};
    use super::*;
    use crate::events::{parse_event, PmuRegistry};
    use crate::launch::{Asked, Ending, Stop};

    fn event(text: &str, total: Result<Count, String>) -> StatEvent {
        let spec = parse_event(text, &PmuRegistry::default()).unwrap();
        StatEvent {
            name: spec.name,
            text: spec.text,
            unit: spec.unit,
            scale: spec.scale,
            attr: spec.attr,
            total,
        }
    }

    const NO_PMU: &str = "no hardware PMU: virtual machine?";

    fn report(breakdown: Breakdown) -> StatReport {
        StatReport {
            target: "'work 5000'".to_string(),
            elapsed: Duration::from_millis(2_000),
            events: vec![
                event("task-clock", Ok(Count::from_reading(1_500_000_000, 1, 1))),
                event("page-faults", Ok(Count::from_reading(5_123, 1, 1))),
                event("cycles", Ok(Count::from_reading(2_000_000, 1_000, 431))),
                event(
                    "instructions",
                    Ok(Count::from_reading(3_000_000, 1_000, 1_000)),
                ),
                event("branch-misses", Err(NO_PMU.to_string())),
                event("cpu-migrations", Ok(Count::from_reading(0, 1_000, 0))),
            ],
            breakdown,
            ending: Ending {
                stop: Stop::CommandExited,
                asked: None,
                command: Some(CommandEnd::Exited(0)),
                killed: None,
            },
            lost_thread_records: 0,
        }
    }

    #[test]
    fn numbers_group_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(12_345_678), "12,345,678");
        assert_eq!(per_second(2_561.5, "sec"), "   2.562 K/sec");
        assert_eq!(per_second(12.0, "sec"), "  12.000 /sec");
        assert_eq!(per_second(3.2e9, "sec elapsed"), "   3.200 G/sec elapsed");
    }

    #[test]
    fn text_is_aligned_with_metrics_scaling_and_reasons() {
        let text = text(&report(Breakdown::None));
        let expected = [
            "",
            " Performance counter stats for 'work 5000':",
            "",
            "          1,500.00 msec task-clock                #    0.750 CPUs utilized",
            "             5,123      page-faults               #    3.415 K/sec",
            "         4,640,371      cycles                        (scaled from 43.1%)",
            "         3,000,000      instructions              #     0.65 insn per cycle",
            "   <not supported>      branch-misses",
            "     <not counted>      cpu-migrations",
            "",
            "       2.000000000 seconds time elapsed",
            "",
            " Not supported here:",
            "   branch-misses: no hardware PMU: virtual machine?",
            "",
        ];
        assert_eq!(text.lines().collect::<Vec<_>>(), expected, "{text}");
    }

    #[test]
    fn extra_metrics_go_on_their_own_lines_under_the_first() {
        let mut report = report(Breakdown::None);
        report.events = vec![
            event("branches", Ok(Count::from_reading(10_000, 1, 1))),
            event("branch-misses", Ok(Count::from_reading(250, 1, 1))),
            event("instructions", Ok(Count::from_reading(50_000, 1, 1))),
        ];
        let text = text(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[4],
            "               250      branch-misses             #    2.50% of all branch-instructions"
        );
        assert_eq!(
            lines[5],
            "                                                  #     5.00 misses per 1k instructions"
        );
    }

    #[test]
    fn thread_rows_come_first_and_name_shared_rows() {
        let rows = vec![
            ThreadRow {
                thread: ThreadId { pid: 7, tid: 7 },
                name: "server".to_string(),
                also_counts: 2,
                counts: vec![
                    Some(Count::from_reading(1_000_000, 1, 1)),
                    Some(Count::default()),
                    None,
                    None,
                    None,
                    Some(Count::default()),
                ],
            },
            ThreadRow {
                thread: ThreadId { pid: 7, tid: 12 },
                name: "worker".to_string(),
                also_counts: 0,
                counts: vec![Some(Count::from_reading(5, 1, 1)); 6],
            },
        ];
        let text = text(&report(Breakdown::Threads(rows)));
        assert!(
            text.contains("for 'work 5000' (per thread, then the total):"),
            "{text}"
        );
        assert!(
            text.contains(" server-7*              1.00 msec task-clock "),
            "{text}"
        );
        // A thread that never ran shows zero, not "<not counted>".
        assert!(
            text.contains(" server-7*                 0      page-faults"),
            "{text}"
        );
        assert!(text.contains(" worker-12  "), "{text}");
        assert!(
            text.contains(" * server-7 also counts 2 other thread(s) still running"),
            "{text}"
        );
        let total = text.find(" Total:").expect("a total block");
        assert!(text.find("worker-12").unwrap() < total);
    }

    #[test]
    fn json_follows_the_schema() {
        let rows = vec![CpuRow {
            cpu: 1,
            counts: vec![Some(Count::from_reading(3, 1, 1)); 6],
        }];
        let mut report = report(Breakdown::Cpus(rows));
        report.ending.command = Some(CommandEnd::Signaled(9));
        let parse = |report: &StatReport| -> serde_json::Value {
            serde_json::from_str(&json(report).unwrap()).unwrap()
        };
        let json = parse(&report);
        assert_eq!(json["schema"], "profiler.stat/1");
        assert_eq!(json["elapsed_ns"], 2_000_000_000u64);
        assert_eq!(json["command"]["signal"], 9);
        assert!(json.get("threads").is_none());
        let events = json["events"].as_array().unwrap();
        assert_eq!(events[0]["event"], "task-clock");
        assert_eq!(events[0]["spec"], "task-clock");
        assert_eq!(events[0]["unit"], "nanoseconds");
        assert_eq!(events[0]["count"], 1_500_000_000u64);
        assert_eq!(events[0]["metrics"][0]["metric"], "cpus_utilized");
        assert_eq!(events[0]["metrics"][0]["value"], 0.75);
        assert_eq!(events[2]["count"], 4_640_371);
        assert_eq!(events[2]["raw_count"], 2_000_000);
        assert_eq!(events[2]["scaled"], true);
        assert_eq!(events[2]["running_percent"], 43.1);
        assert_eq!(events[3]["metrics"][0]["metric"], "insn_per_cycle");
        assert_eq!(events[4]["supported"], false);
        assert_eq!(events[4]["reason"], NO_PMU);
        assert!(events[4].get("count").is_none());
        assert!(events[5]["count"].is_null(), "never ran: null, not 0");
        let cpu = &json["cpus"][0];
        assert_eq!(cpu["cpu"], 1);
        assert_eq!(cpu["events"][1]["count"], 3);
        assert!(cpu["events"][1].get("spec").is_none());
        assert_eq!(json["lost_thread_records"], 0);

        report.ending.asked = Some(Asked {
            signal: libc::SIGINT,
            why: Stop::Signal(libc::SIGINT),
            forwarded: false,
        });
        report.ending.command = Some(CommandEnd::Exited(3));
        let ending = &parse(&report)["ending"];
        assert_eq!(ending["asked"], "SIGINT");
        assert_eq!(ending["forwarded"], false);
        assert_eq!(
            ending["description"],
            "SIGINT from the terminal reached the profiler and the command, and the command \
             exited with status 3"
        );
    }
}
