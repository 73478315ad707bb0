//! The results as Markdown: the machine, one table per question, and the commands behind every
//! figure (paths shortened to `$RELEASE` and `$WORK`, defined at the top).

use std::fmt::Write;

use super::{
    summary::{RowSummary, Spread, ToolSummary},
    Results,
};

/// `1.07 (1.05–1.10)`: the median, then the range when there was more than one round.
fn spread(value: Option<Spread>, decimals: usize) -> String {
    match value {
        None => "–".into(),
        Some(s) if s.count == 1 => format!("{:.decimals$}", s.median),
        Some(s) => format!(
            "{:.decimals$} ({:.decimals$}–{:.decimals$})",
            s.median, s.min, s.max
        ),
    }
}

fn ratio(value: Option<Spread>) -> String {
    match value {
        None => "–".into(),
        Some(_) => format!("×{}", spread(value, 2)),
    }
}

/// Thousands separated by commas.
fn count(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn megabytes(value: Option<Spread>) -> Option<Spread> {
    value.map(|s| Spread {
        median: s.median / 1e6,
        min: s.min / 1e6,
        max: s.max / 1e6,
        count: s.count,
    })
}

struct Shorten<'a> {
    release: &'a str,
    work: &'a str,
}

impl Shorten<'_> {
    fn command(&self, command: &str) -> String {
        format!(
            "`{}`",
            command
                .replace(self.release, "$RELEASE")
                .replace(self.work, "$WORK")
        )
    }
}

fn loss_cells(summary: &ToolSummary) -> String {
    format!(
        "{} | {} | {:.2}%",
        count(summary.counts.recorded),
        count(summary.counts.lost),
        summary.loss_percent
    )
}

fn header(out: &mut String, results: &Results) {
    let m = &results.machine;
    let s = &results.settings;
    let _ = writeln!(out, "# Profiler against `perf record -g`\n");
    let _ = writeln!(
        out,
        "Measured by `cargo xtask bench{}` on {}.\n",
        if s.quick { " --quick" } else { "" },
        m.date_utc
    );
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(
        out,
        "| Machine | {}, {} CPUs, {} MiB; hardware PMU: {} |",
        m.cpu_model,
        m.cpus,
        m.memory_mib,
        if m.hardware_pmu { "yes" } else { "no" }
    );
    let _ = writeln!(out, "| Kernel | {} |", m.kernel);
    let _ = writeln!(out, "| perf | {} |", m.perf_version);
    let _ = writeln!(out, "| Profiler | {} |", m.profiler_revision);
    let _ = writeln!(
        out,
        "| Other processes | used {:.1}% of the machine's CPU time during the bench |",
        results.other_processes_cpu_percent
    );
    let _ = writeln!(
        out,
        "| kernel.perf_event_max_sample_rate | {} at the start, {} at the end \
         (perf_cpu_time_max_percent {}) |",
        m.perf_event_max_sample_rate,
        results.perf_event_max_sample_rate_at_end,
        m.perf_cpu_time_max_percent
    );
    let rates: Vec<String> = s.rates_hz.iter().map(|hz| format!("{hz} Hz")).collect();
    let _ = writeln!(
        out,
        "| Settings | each workload sized to run {} s alone; {} round(s); cpu-clock at {} per \
         CPU; page-faults every fault |",
        s.duration_s,
        s.repetitions,
        rates.join(", ")
    );
    if !results.notes.is_empty() || !results.rate_lowerings.is_empty() {
        let _ = writeln!(out, "\nNotes:\n");
        for note in &results.notes {
            let _ = writeln!(out, "- {note}");
        }
    }
    if let Some(lowest) = results.rate_lowerings.iter().map(|l| l.lowered_to).min() {
        let _ = writeln!(
            out,
            "- the kernel lowered perf_event_max_sample_rate {} time(s), to {lowest} at the \
             lowest (a sample took longer than its budget; the bench put it back each time); \
             the runs are in bench.json (`rate_lowerings`)",
            results.rate_lowerings.len()
        );
    }
    let _ = writeln!(
        out,
        "\nIn the commands, `$RELEASE` is `{}` and `$WORK` is `{}`. Every run's exact command \
         is in bench.json (`trials`).",
        results.release_dir, results.work_dir
    );
}

fn workloads(out: &mut String, results: &Results, shorten: &Shorten) {
    let _ = writeln!(
        out,
        "\n## Workloads\n\nEach runs under `run_timed`, which measures the workload's own wall \
         and CPU time from inside the tool's run.\n"
    );
    let _ = writeln!(out, "| Workload | What | Command |\n|---|---|---|");
    for workload in &results.workloads {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            workload.name,
            workload.description,
            shorten.command(&super::measure::command_line(&workload.argv))
        );
    }
}

fn overhead(out: &mut String, rows: &[RowSummary]) {
    let _ = writeln!(
        out,
        "\n## 1. Overhead\n\nRatios to the bare run of the same round, median (min–max) over \
         the rounds. *Workload*: the workload's own time, measured inside the tool's run. \
         *Command*: the whole tool command, start-up, symbolization and file writing included. \
         *All CPU*: the workload's processes and the tool's own.\n"
    );
    let _ = writeln!(
        out,
        "| Workload | Event | Bare wall s | Wall ours | Wall perf | Command wall ours | \
         Command wall perf | CPU ours | CPU perf | All CPU ours | All CPU perf |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.workload,
            row.label,
            spread(row.bare_wall_s, 2),
            ratio(row.ours.workload_wall_ratio),
            ratio(row.perf.workload_wall_ratio),
            ratio(row.ours.command_wall_ratio),
            ratio(row.perf.command_wall_ratio),
            ratio(row.ours.workload_cpu_ratio),
            ratio(row.perf.workload_cpu_ratio),
            ratio(row.ours.total_cpu_ratio),
            ratio(row.perf.total_cpu_ratio),
        );
    }
    let _ = writeln!(out, "\n![overhead against the rate](overhead.svg)");
}

fn loss(out: &mut String, rows: &[RowSummary]) {
    let _ = writeln!(
        out,
        "\n## 2. Loss\n\nSums over the rounds. *Expected*: the workload's CPU time × rate \
         (cpu-clock; the time the kernel spends sampling counts too, so it differs between the \
         tools) or its page faults (page-faults every fault), from the tool's own runs. Ours: *fired* = program runs \
         counted in the kernel, *lost* = whole samples reported lost, *unaccounted* = fired − \
         kept − lost (silent loss), *stacks lost* = samples kept without their call stack. \
         Perf: *lost* = its LOST / LOST_SAMPLES records, *throttles* = its THROTTLE records \
         (the kernel stopped sampling for a while). Loss % = (lost + unaccounted) / (kept + \
         lost + unaccounted).\n"
    );
    let _ = writeln!(
        out,
        "| Workload | Event | Ours expected | Ours fired | Ours kept | Ours lost | Ours loss | \
         Ours unaccounted | Ours stacks lost | Perf expected | Perf kept | Perf lost | Perf loss \
         | Perf throttles |"
    );
    let _ = writeln!(
        out,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.workload,
            row.label,
            count(row.ours.expected_samples.round() as u64),
            row.ours.counts.fired.map_or("–".into(), count),
            loss_cells(&row.ours),
            row.ours
                .unaccounted
                .map_or("–".into(), |value| value.to_string()),
            row.ours.counts.stacks_lost.map_or("–".into(), count),
            count(row.perf.expected_samples.round() as u64),
            loss_cells(&row.perf),
            row.perf.counts.throttle_events.map_or("–".into(), count),
        );
    }
    let _ = writeln!(out, "\n![loss against the rate](loss.svg)");
}

fn system_loss(out: &mut String, results: &Results, shorten: &Shorten) {
    let Some(first) = results.system_loss.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "\n### System-wide at {} Hz on a busy host under churn\n\nEach tool profiles every CPU \
         (cpu-clock, call stacks) for {} s a round (rounds summed: {}), while a CPU loop runs on every CPU \
         and a stream of short processes beside them (issue 46's load; the goal is under 0.1% \
         lost at any rate). Loss % = (lost + unaccounted) / (kept + lost + unaccounted).\n",
        first.rate_hz, first.seconds, first.rounds
    );
    let _ = writeln!(
        out,
        "| Tool | Fired | Kept | Lost | Unaccounted | Loss % | Stacks lost | Throttles | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for row in &results.system_loss {
        let counts = &row.counts;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.3} | {} | {} | {} |",
            row.tool.name(),
            counts.fired.map_or("–".into(), count),
            count(counts.recorded),
            count(counts.lost),
            counts
                .unaccounted()
                .map_or("–".into(), |value| value.to_string()),
            counts.loss_percent(),
            counts.stacks_lost.map_or("–".into(), count),
            counts.throttle_events.map_or("–".into(), count),
            shorten.command(&row.command),
        );
    }
}

fn volume(out: &mut String, rows: &[RowSummary]) {
    let _ = writeln!(
        out,
        "\n## 3. Data volume\n\nBytes written per million samples kept: our profile file \
         (`-o`) against perf.data, median (min–max) over the rounds. Our file holds counts per \
         distinct stack (it grows with the stacks, not the samples) plus the symbolized frames, \
         so its bytes per sample fall as the rate rises; perf.data holds every sample.\n"
    );
    let _ = writeln!(
        out,
        "| Workload | Event | Ours MB / M samples | Perf MB / M samples | Perf / ours |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for row in rows {
        let ours = row.ours.bytes_per_million_samples;
        let perf = row.perf.bytes_per_million_samples;
        let times = match (ours, perf) {
            (Some(ours), Some(perf)) => format!("×{:.1}", perf.median / ours.median),
            _ => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {times} |",
            row.workload,
            row.label,
            spread(megabytes(ours), 2),
            spread(megabytes(perf), 2),
        );
    }
}

fn report_speed(out: &mut String, results: &Results, shorten: &Shorten) {
    let _ = writeln!(
        out,
        "\n## 4. Report speed\n\nTime from the profile file to a function report, on one \
         large profile recorded by each tool.\n"
    );
    let _ = writeln!(
        out,
        "| Tool | Samples | File MB | Report s | Record command | Report command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for speed in &results.report_speed {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {} | {} |",
            speed.tool.name(),
            count(speed.samples),
            speed.profile_bytes as f64 / 1e6,
            speed.report_s,
            shorten.command(&speed.record_command),
            shorten.command(&speed.report_command),
        );
    }
}

fn stack_quality(out: &mut String, results: &Results, shorten: &Shorten) {
    use super::stack_quality::{BUDGET_VERSUS_PERF_DWARF, PERF_DWARF};
    let _ = writeln!(
        out,
        "\n## 7. Call-stack quality\n\nDebian's own programs (no frame pointers) at 999 Hz. \
         *Complete*: samples whose user stack reaches `_start`, `main` or a thread start, judged \
         by our report for every tool (perf's files through our perf.data import). *Tool CPU*: \
         record's CPU beyond the bare program's, plus the tool's own report's (`perf report \
         --stdio` for perf), per sample. *Fixed*: recording `true` and reporting it, the median \
         of five runs. *Beyond fixed*: the tool CPU less the fixed cost, per sample: what a sample costs in a long \
         run. *vs perf dwarf*: against `{PERF_DWARF}` on the same program (budget: at most \
         {BUDGET_VERSUS_PERF_DWARF:.2}).\n"
    );
    let _ = writeln!(
        out,
        "| Program | Unwinder | Samples | Complete % | Mean depth | Tool CPU µs/sample | vs perf dwarf | Fixed ms | Beyond fixed µs/sample | vs perf dwarf | Record command | Report command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &results.stack_quality {
        let perf_dwarf = results
            .stack_quality
            .iter()
            .find(|other| other.program == row.program && other.unwinder == PERF_DWARF);
        let versus = |ours: f64, theirs: Option<f64>| match theirs {
            Some(theirs) if theirs > 0.0 && row.unwinder != PERF_DWARF => {
                format!("×{:.2}", ours / theirs)
            }
            _ => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1} | {:.1} | {:.0} | {} | {:.0} | {:.0} | {} | {} | {} |",
            row.program,
            row.unwinder,
            count(row.samples),
            row.complete_percent,
            row.mean_depth,
            row.tool_cpu_us_per_sample,
            versus(
                row.tool_cpu_us_per_sample,
                perf_dwarf.map(|perf| perf.tool_cpu_us_per_sample)
            ),
            row.fixed_cpu_ms,
            row.beyond_fixed_us_per_sample,
            versus(
                row.beyond_fixed_us_per_sample,
                perf_dwarf.map(|perf| perf.beyond_fixed_us_per_sample)
            ),
            shorten.command(&row.record_command),
            shorten.command(&row.report_command),
        );
    }
}

fn agent_cost(out: &mut String, results: &Results, shorten: &Shorten) {
    use super::agent_cost::{
        steady_span, BUDGET_CPU_PERCENT_AT_99HZ, BUDGET_RSS_MIB_AT_99HZ, RECORD_END_BUDGET_S,
    };
    let (from, to) = results.agent_cost.first().map_or((0, 0), |row| {
        let (from, to) = steady_span(row.duration_s);
        (from.as_secs(), to.as_secs())
    });
    let _ = writeln!(
        out,
        "\n## 8. Always-on cost\n\n`profiler agent` (system-wide, a window every 10 s, pprof \
         files) against `perf record -a -g` over the same time, while a CPU loop and a stream \
         of short processes run. CPU time and peak RSS of each tool's own process tree; steady: \
         the share of a core from {from} s to {to} s of the run, whole windows past the first \
         (past the start-up and the first window's export, with each window in it closed and \
         exported once, not the last, partial one). Budget at 99 Hz: {BUDGET_CPU_PERCENT_AT_99HZ}% of one core and \
         {BUDGET_RSS_MIB_AT_99HZ} MB; at 997 Hz: no more CPU or memory than perf. `profiler \
         record -a` records the same seconds at 997 Hz and prints its report; its wall time \
         should be at most {RECORD_END_BUDGET_S} s past them.\n"
    );
    let _ = writeln!(
        out,
        "| Tool | Rate Hz | Seconds | Wall s | CPU s | % of a core | Steady % of a core | Peak RSS MiB | CPU vs perf | Steady vs perf | RSS vs perf | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &results.agent_cost {
        let perf = results
            .agent_cost
            .iter()
            .find(|other| other.rate_hz == row.rate_hz && other.tool.starts_with("perf"));
        let versus =
            |ours: f64, theirs: Option<f64>| match (row.tool.starts_with("profiler"), theirs) {
                (true, Some(theirs)) if theirs > 0.0 => format!("×{:.2}", ours / theirs),
                _ => "–".into(),
            };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {} | {} | {} |",
            row.tool,
            row.rate_hz,
            row.duration_s,
            row.wall_s,
            row.cpu_s,
            row.cpu_percent_of_core,
            row.steady_percent_of_core,
            row.max_rss_mib,
            versus(row.cpu_s, perf.map(|p| p.cpu_s)),
            versus(
                row.steady_percent_of_core,
                perf.map(|p| p.steady_percent_of_core)
            ),
            versus(row.max_rss_mib, perf.map(|p| p.max_rss_mib)),
            shorten.command(&row.command),
        );
    }
}

fn churn_cost(out: &mut String, results: &Results, shorten: &Shorten) {
    use super::agent_cost::BUDGET_CHURN_RISE_PERCENT;
    let _ = writeln!(
        out,
        "\nIn the kernel: each sampler's BPF run time per sample at 997 Hz (the kernel's BPF \
         statistics, over the same steady part of each run), with the CPU loop alone and with \
         the short processes beside it, median (min–max) over the rounds, loads and tools \
         interleaved. Budget: at most {BUDGET_CHURN_RISE_PERCENT}% more a sample under churn. \
         The reference is the plainest bpftrace sampler that keeps what ours keeps (kernel and \
         user stacks per thread).\n"
    );
    let _ = writeln!(
        out,
        "| Sampler | Loop alone ns/sample | With churn ns/sample | Rise | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for row in &results.churn_cost {
        let rise = row.rise_percent().map_or("–".into(), |rise| {
            let verdict = if rise <= BUDGET_CHURN_RISE_PERCENT {
                "within"
            } else {
                "over"
            };
            format!("{rise:+.0}% ({verdict} the budget)")
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {rise} | {} |",
            row.tool,
            spread(row.loop_ns_per_sample, 0),
            spread(row.churn_ns_per_sample, 0),
            shorten.command(&row.command),
        );
    }
}

fn runtimes_memory(out: &mut String, results: &Results, shorten: &Shorten) {
    let row = &results.runtimes_memory;
    let _ = writeln!(
        out,
        "\n### The agent's memory with big runtimes running\n\n`profiler agent` at its defaults \
         (99 Hz, 10 s windows, --memory-max 32M) for {} s while {} run (each keeps a core busy; \
         started 2 s before the agent): its peak RSS from wait4, against issue 46's ceiling and \
         the fleet agents' published memory budgets as the issue cites them.\n",
        row.duration_s,
        row.runtimes.join(", ")
    );
    let _ = writeln!(
        out,
        "| Agent | Peak RSS MiB | Budget MB | CPU s | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    let _ = writeln!(
        out,
        "| profiler agent | {:.1} | {:.0} | {:.2} | {} |",
        row.max_rss_mib,
        super::agent_cost::BUDGET_RSS_MIB_WITH_RUNTIMES,
        row.cpu_s,
        shorten.command(&row.command),
    );
    for (agent, budget) in super::agent_cost::FLEET_AGENT_BUDGETS {
        let _ = writeln!(out, "| {agent} | not run here | {budget:.0} | – | – |");
    }
}

/// One table alone, as `cargo xtask bench-fleet` and `bench-live` write it.
fn alone<R>(
    rows: &[R],
    release: &str,
    work: &str,
    table: fn(&mut String, &[R], &Shorten),
) -> String {
    let mut out = String::new();
    table(&mut out, rows, &Shorten { release, work });
    out
}

/// The fleet table alone.
pub fn fleet_markdown(rows: &[super::fleet::FleetRow], release: &str, work: &str) -> String {
    alone(rows, release, work, fleet_rows)
}

fn fleet_rows(out: &mut String, rows: &[super::fleet::FleetRow], shorten: &Shorten) {
    let Some(first) = rows.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "\n### Beside the OpenTelemetry eBPF profiler\n\n`profiler agent` and the OpenTelemetry \
         eBPF profiler {} (what Parca and Grafana Alloy ship), system-wide on the same load: the \
         churn load with a JVM, node, python3 and xz running, each tool reporting into a real \
         OpenTelemetry Collector over OTLP, at its defaults otherwise. {} round(s) of {} s per \
         tool and rate, interleaved; median (min–max). CPU of each tool's process tree (wait4), \
         steady: whole windows past the first; peak RSS: the largest VmHWM in the tree half a \
         second before the stop; BPF maps: the `memlock` of the maps it holds; \
         samples: what the Collector received, per second of the run. Python named: rounds \
         whose profiles named a function of the python3 load (`<genexpr>`). Stack completeness is \
         not compared: the eBPF profiler sends native frames unsymbolized, by address.\n",
        crate::backends::EBPF_PROFILER_VERSION,
        first.rounds,
        first.duration_s,
    );
    let _ = writeln!(
        out,
        "| Rate Hz | Tool | % of a core | Steady % of a core | Peak RSS MiB | BPF maps MiB | Samples/s | Python named |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {}/{} |",
            row.rate_hz,
            row.tool,
            spread(row.cpu_percent_of_core, 2),
            spread(row.steady_percent_of_core, 2),
            spread(row.max_rss_mib, 1),
            spread(row.bpf_map_mib, 1),
            spread(row.samples_per_s, 0),
            row.python_named_rounds,
            row.rounds - row.crashes.len(),
        );
    }
    for row in rows.iter().filter(|row| !row.crashes.is_empty()) {
        let _ = writeln!(
            out,
            "\n{} at {} Hz: {} of {} rounds did not run to their end, left out above: {}",
            row.tool,
            row.rate_hz,
            row.crashes.len(),
            row.rounds,
            row.crashes.join("; ")
        );
    }
    for row in rows.iter().filter(|row| !row.commands.is_empty()) {
        if rows
            .iter()
            .find(|other| other.tool == row.tool && !other.commands.is_empty())
            .is_some_and(|first| std::ptr::eq(first, row))
        {
            let _ = writeln!(
                out,
                "\n{}, a run: {}",
                row.tool,
                shorten.command(&row.commands[0])
            );
        }
    }
}

/// The live-view table alone.
pub fn live_markdown(rows: &[super::live::LiveRow], release: &str, work: &str) -> String {
    alone(rows, release, work, live_rows)
}

fn live_rows(out: &mut String, rows: &[super::live::LiveRow], shorten: &Shorten) {
    let Some(first) = rows.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "\n### Live views: profiler top beside perf top\n\nSystem-wide at {} Hz on the churn \
         load, each tool alone in a 120x40 tmux terminal, drawing as a user would watch it. {} \
         round(s) of {} s per tool, interleaved; median (min–max). CPU of each tool's process \
         tree (the scheduler's run time) over the whole run and steady (past its first 3 s); \
         peak RSS: VmHWM at the end. `profiler top` always walks call stacks (in the kernel) and \
         symbolizes every window; `perf top -g` copies call chains into its ring buffer.\n",
        super::live::RATE_HZ,
        first.rounds,
        first.duration_s,
    );
    let _ = writeln!(
        out,
        "| Tool | % of a core | Steady % of a core | Peak RSS MiB | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            row.tool,
            spread(row.cpu_percent_of_core, 2),
            spread(row.steady_percent_of_core, 2),
            spread(row.max_rss_mib, 1),
            shorten.command(&row.command),
        );
    }
}

fn unwind_cost(out: &mut String, results: &Results, shorten: &Shorten) {
    let cost = &results.unwind_cost;
    let _ = writeln!(
        out,
        "\n## 9. In-kernel cost of unwinding\n\nRun time of our BPF program per sample (BPF \
         run-time statistics, `record --stats`) on the tests' C workload built with `-O2 \
         -fomit-frame-pointer`, recursing to a fixed depth, median (min–max) over the rounds. \
         `--unwind fp` walks two frames there. Per unwound frame: the slope of `--unwind dwarf` \
         between the fastest run at each depth over the rounds (at least five, both depths in \
         each): this host's slow spells only add to a run's cost.\n"
    );
    let _ = writeln!(
        out,
        "| User frames | --unwind dwarf ns/sample | --unwind fp ns/sample | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    for row in &cost.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            row.user_frames,
            spread(row.dwarf_ns_per_sample, 0),
            spread(row.fp_ns_per_sample, 0),
            shorten.command(&row.dwarf_command),
        );
    }
    let per_frame = match cost.ns_per_frame {
        Some(ns) if ns <= 0.0 => format!(
            "{ns:.0} ns per unwound frame: the runs spread by more than the deeper stacks cost, \
             so this run measured no cost per frame"
        ),
        Some(ns) => format!(
            "{ns:.0} ns per unwound frame, {} the budget of {:.0} ns",
            if ns <= cost.budget_ns_per_frame {
                "within"
            } else {
                "over"
            },
            cost.budget_ns_per_frame
        ),
        None => "not measured".into(),
    };
    let _ = writeln!(out, "\n{per_frame}.");
}

fn off_cpu_cost(out: &mut String, results: &Results, shorten: &Shorten) {
    let _ = writeln!(
        out,
        "\n## 10. Off-CPU cost\n\nThe tests' `switch_storm` (pipe ping-pong between two threads, \
         then four workers on a condition variable; each run under `run_timed`, pinned to CPU 0 \
         so that every switch is between two of its threads) bare, under `record --off-cpu` \
         (DWARF user stacks, the default, and frame-pointer ones) and under two bpftrace \
         references, which keep per-thread maps in the kernel as we do: the off-CPU tests' \
         (kernel stacks) and the same with user stacks (frame pointers), what bcc's offcputime \
         and we keep. The workload's own time for its switches and its CPU time, median \
         (min–max) over the rounds, and the slowdown against the bare runs; and exact, from the \
         kernel's BPF statistics, each tool's BPF run time per context switch. Ours against the \
         user-stack reference. Target: ours no more than the reference's.\n"
    );
    let _ = writeln!(
        out,
        "| Run | Workload s | Workload CPU s | Slowdown | BPF ns per switch | Ours vs \
         reference | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    let rows = &results.off_cpu_cost;
    let bare = rows.iter().find(|row| row.tool == "bare");
    let reference = rows
        .iter()
        .find(|row| row.tool.ends_with("offcputime-user.bt"));
    let overhead = |row: &super::off_cpu_cost::OffCpuCostRow| {
        bare.filter(|bare| bare.tool != row.tool)
            .and_then(|bare| row.overhead_percent(bare))
    };
    for row in rows {
        let slowdown = overhead(row).map_or("–".into(), |percent| format!("{percent:+.1}%"));
        let per_switch =
            |row: &super::off_cpu_cost::OffCpuCostRow| row.ns_per_switch.map(|ns| ns.median);
        let versus = match (
            row.tool.starts_with("profiler"),
            per_switch(row),
            reference.and_then(per_switch),
        ) {
            (true, Some(ours), Some(theirs)) if theirs > 0.0 => format!("×{:.2}", ours / theirs),
            _ => "–".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {slowdown} | {} | {versus} | {} |",
            row.tool,
            spread(row.elapsed_s, 3),
            spread(row.workload_cpu_s, 3),
            spread(row.ns_per_switch, 0),
            shorten.command(&row.command),
        );
    }
}

pub fn python_markdown(
    rows: &[super::python_cost::PythonCostRow],
    release: &str,
    work: &str,
) -> String {
    alone(rows, release, work, python_cost)
}

fn python_cost(out: &mut String, rows: &[super::python_cost::PythonCostRow], shorten: &Shorten) {
    let _ = writeln!(
        out,
        "\n## 11. Python cost\n\nA fixed amount of pure-Python work (Debian's python3: two \
         pure-Python leaves and zlib, as the Python tests split it, timed by itself) bare, under \
         `record` and under py-spy 0.4.3, each its child, all at {} Hz: py-spy in its default mode, which pauses the \
         interpreter at each sample, and `--nonblocking`. The workload's own time and the \
         slowdown against the bare runs; the CPU the whole run took beyond the bare run's median \
         (the tool's processes and what it made the interpreter spend: our BPF program runs in \
         the interpreter's time), and that over the samples the tool kept; ours in the kernel \
         per sample, and the part of it reading the Python frames (the walker's own clock): \
         without them a sample costs the difference. Each tool also ran the workload with no \
         work (the interpreter starts and exits): its CPU beyond the bare such run is the tool's \
         fixed cost (start-up, the report), and the full run's added CPU beyond it, over the \
         samples, its cost per sample alone. Median (min–max) over the rounds. Target: ours \
         below py-spy's CPU per sample.\n",
        super::python_cost::RATE_HZ
    );
    let _ = writeln!(
        out,
        "| Run | Workload s | Slowdown | Added CPU s | Samples | Added µs per sample | Fixed \
         CPU s | µs per sample beyond it | Kernel ns per sample | Of it, Python frames | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let bare = rows.iter().find(|row| row.tool == "bare");
    for row in rows {
        let slowdown = bare
            .filter(|bare| bare.tool != row.tool)
            .and_then(|bare| row.overhead_percent(bare))
            .map_or("–".into(), |percent| format!("{percent:+.1}%"));
        let microseconds = |us: Option<f64>| {
            us.filter(|_| row.tool != "bare")
                .map_or("–".into(), |us| format!("{us:.0}"))
        };
        let per_sample = microseconds(row.added_us_per_sample());
        let beyond_fixed = microseconds(row.per_sample_beyond_fixed_us());
        let (added, fixed) = if row.tool == "bare" {
            ("–".into(), "–".into())
        } else {
            (spread(row.added_cpu_s, 3), spread(row.fixed_cpu_s, 3))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {slowdown} | {added} | {} | {per_sample} | {fixed} | {beyond_fixed} | {} \
             | {} | {} |",
            row.tool,
            spread(row.elapsed_s, 3),
            spread(row.samples, 0),
            spread(row.kernel_ns_per_sample, 0),
            spread(row.python_ns_per_sample, 0),
            shorten.command(&row.command),
        );
    }
}

fn in_kernel(out: &mut String, results: &Results, shorten: &Shorten) {
    let _ = writeln!(
        out,
        "\n## 5. In-kernel cost\n\nRun time of our BPF program per sample, from the kernel's \
         BPF run-time statistics (`record --stats`), median (min–max) over the rounds, against \
         the kernel's budget per sample (perf_cpu_time_max_percent of the interval at \
         perf_event_max_sample_rate).\n"
    );
    let _ = writeln!(
        out,
        "| Workload | Event | ns per sample | Program runs | Budget ns | Of the budget | \
         Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for cost in &results.in_kernel {
        let share = cost.ns_per_sample.map_or("–".into(), |s| {
            format!("{:.0}%", 100.0 * s.median / cost.budget_ns)
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {share} | {} |",
            cost.workload,
            cost.label,
            spread(cost.ns_per_sample, 0),
            count(cost.program_runs),
            cost.budget_ns,
            shorten.command(&cost.command),
        );
    }
}

fn footprint(out: &mut String, results: &Results, shorten: &Shorten) {
    let _ = writeln!(
        out,
        "\n## 6. Agent footprint\n\nThe tool's own process (and its children) during a \
         system-wide run of {} s while many_threads keeps every CPU busy, median (min–max) \
         over the rounds. Our BPF maps' locked kernel memory is not in the RSS: it has its \
         own column.\n",
        results.settings.system_duration_s
    );
    let _ = writeln!(
        out,
        "| Tool | Peak RSS MiB | CPU s | % of one CPU | BPF maps MiB | Command |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for entry in &results.footprint {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            entry.tool.name(),
            spread(entry.peak_rss_mib, 1),
            spread(entry.cpu_s, 2),
            spread(entry.cpu_percent, 1),
            spread(entry.map_mib, 1),
            shorten.command(&entry.command),
        );
    }
}

fn commands(out: &mut String, results: &Results, shorten: &Shorten) {
    let _ = writeln!(
        out,
        "\n## Commands\n\nEach row of tables 1–3 is one round after another of three runs back \
         to back, e.g. for the first row:\n"
    );
    if let Some(trial) = results.trials.first() {
        let _ = writeln!(out, "- bare: {}", shorten.command(&trial.bare.command));
        let _ = writeln!(
            out,
            "- ours: {} (its JSON report on stdout gives the sample accounting)",
            shorten.command(&trial.ours.run.command)
        );
        let _ = writeln!(
            out,
            "- perf: {}, then `perf report --stats -i $WORK/perf.data` for its sample, lost and \
             throttle counts",
            shorten.command(&trial.perf.run.command)
        );
    }
    let _ = writeln!(
        out,
        "\nWall and CPU time of each whole command come from wait4 (the command's process tree); \
         the workload's own from the `run_timed` line it prints."
    );
}

pub fn markdown(results: &Results) -> String {
    let shorten = Shorten {
        release: &results.release_dir,
        work: &results.work_dir,
    };
    let mut out = String::new();
    header(&mut out, results);
    workloads(&mut out, results, &shorten);
    overhead(&mut out, &results.rows);
    loss(&mut out, &results.rows);
    system_loss(&mut out, results, &shorten);
    volume(&mut out, &results.rows);
    report_speed(&mut out, results, &shorten);
    in_kernel(&mut out, results, &shorten);
    footprint(&mut out, results, &shorten);
    stack_quality(&mut out, results, &shorten);
    agent_cost(&mut out, results, &shorten);
    churn_cost(&mut out, results, &shorten);
    runtimes_memory(&mut out, results, &shorten);
    fleet_rows(&mut out, &results.fleet, &shorten);
    live_rows(&mut out, &results.live, &shorten);
    unwind_cost(&mut out, results, &shorten);
    off_cpu_cost(&mut out, results, &shorten);
    python_cost(&mut out, &results.python_cost, &shorten);
    commands(&mut out, results, &shorten);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_234_567), "1,234,567");
        let two = Spread::of([1.0, 1.1]);
        assert_eq!(ratio(two), "×1.05 (1.00–1.10)");
        assert_eq!(ratio(Spread::of([1.234])), "×1.23");
        assert_eq!(ratio(None), "–");
    }

    #[test]
    fn commands_use_the_short_names_defined_at_the_top() {
        let shorten = Shorten {
            release: "/t/release",
            work: "/t/work",
        };
        assert_eq!(
            shorten.command("/t/release/profiler record -o /t/work/p -- /t/release/run_timed"),
            "`$RELEASE/profiler record -o $WORK/p -- $RELEASE/run_timed`"
        );
    }
}
