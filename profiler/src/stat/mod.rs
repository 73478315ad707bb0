//! `profiler stat`: exact counts of events over a whole run (HP Caliper's exact counts beside
//! its sampled metrics), for a launched command (counted from its exec, into its threads and
//! children), running processes or the whole system; scaled for multiplexing and marked when
//! scaled; with derived ratios ([`metrics`]) and, on request, per-thread or per-CPU breakdowns
//! ([`counters`] says how per-thread counts are obtained). The run ends when the command exits,
//! the counted processes are gone, `--duration` passes, or on Ctrl-C / SIGTERM.

pub mod assemble;
pub mod calibrate;
pub mod counters;
pub mod metrics;
pub mod render;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use self::assemble::assemble;
use self::counters::{CountScope, CounterSet, Split, ThreadId};
use crate::events::count::Count;
use crate::events::{parse_event_list, EventAttr, EventSpec, PmuRegistry, SystemFacts};
use crate::launch::{
    spawn_stopped, CommandEnd, Ending, Run, StopSignals, StoppedCommand, TargetSpec,
};
use crate::output::Checker;

/// The events counted when `-e` is not given. Hardware ones show as not supported, with the
/// reason, where the machine has no PMU.
const DEFAULT_EVENTS: &str =
    "task-clock,context-switches,cpu-migrations,page-faults,cycles,instructions,branches,branch-misses";
/// System-wide, task-clock would count the idle task too; cpu-clock says what it is.
const DEFAULT_SYSTEM_EVENTS: &str =
    "cpu-clock,context-switches,cpu-migrations,page-faults,cycles,instructions,branches,branch-misses";

/// How often per-thread ring buffers are drained and `-p` targets checked for exit.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The events to count: `events` as given (`-e`, each a list), or the defaults for the target.
pub fn event_specs(
    events: &[String],
    registry: &PmuRegistry,
    system_wide: bool,
) -> Result<Vec<EventSpec>> {
    if events.is_empty() {
        let defaults = if system_wide {
            DEFAULT_SYSTEM_EVENTS
        } else {
            DEFAULT_EVENTS
        };
        return Ok(parse_event_list(defaults, registry)?);
    }
    let mut specs = Vec::new();
    for list in events {
        specs.extend(parse_event_list(list, registry)?);
    }
    Ok(specs)
}

/// One event's result over the whole target.
#[derive(Clone, Debug, PartialEq)]
pub struct StatEvent {
    pub name: String,
    /// As the user wrote it.
    pub text: String,
    pub unit: String,
    /// Multiply counts by this to get `unit` (sysfs `.scale`, e.g. RAPL energy).
    pub scale: Option<f64>,
    pub attr: EventAttr,
    /// The count, or why the event cannot be counted here.
    pub total: Result<Count, String>,
}

/// A thread's own counts (per-thread breakdown).
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadRow {
    pub thread: ThreadId,
    pub name: String,
    /// Other threads whose counts are in this row: the kernel gave them no count of their own
    /// (they were still running when counting stopped).
    pub also_counts: u32,
    /// Per event, `None` where the event is not supported.
    pub counts: Vec<Option<Count>>,
}

/// One CPU's counts (per-CPU breakdown).
#[derive(Clone, Debug, PartialEq)]
pub struct CpuRow {
    pub cpu: u32,
    pub counts: Vec<Option<Count>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Breakdown {
    None,
    Threads(Vec<ThreadRow>),
    Cpus(Vec<CpuRow>),
}

/// Everything `profiler stat` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct StatReport {
    pub target: String,
    pub elapsed: Duration,
    pub events: Vec<StatEvent>,
    pub breakdown: Breakdown,
    pub ending: Ending,
    /// Per-thread records the kernel dropped (full ring buffer): those threads' counts stay in
    /// the row of the thread that started them.
    pub lost_thread_records: u64,
}

/// What `profiler stat` counts and where it writes (resolved from its arguments by `cli`).
pub struct StatOptions {
    /// `-e`: lists of events; empty: the defaults.
    pub events: Vec<String>,
    pub target: TargetSpec,
    /// `--duration`.
    pub duration: Option<Duration>,
    pub split: Split,
    /// Print the report as JSON.
    pub json: bool,
    /// Write the report to this file instead of standard error.
    pub output: Option<PathBuf>,
}

/// Runs `profiler stat`. Its exit code is the launched command's (128 + N when signal N killed
/// it), or success.
pub async fn run_stat(options: StatOptions) -> Result<ExitCode> {
    let mut signals = StopSignals::catch()?;
    let output = Checker::default().check_optional("-o", options.output.as_deref())?;
    let StatOptions {
        target,
        duration,
        split,
        ..
    } = options;
    let registry = PmuRegistry::live().context("reading the PMUs from /sys")?;
    let specs = event_specs(&options.events, &registry, target == TargetSpec::System)?;
    let facts = SystemFacts::read(&registry);

    let command: Option<StoppedCommand> = match &target {
        TargetSpec::Command(argv) => Some(spawn_stopped(argv)?),
        _ => None,
    };
    let scope = match (&target, &command) {
        (TargetSpec::Processes(pids), _) => CountScope::processes(pids)?,
        (_, Some(stopped)) => CountScope::Command(stopped.pid()?),
        _ => CountScope::System,
    };
    let mut counters = CounterSet::open(&specs, &scope, split, &facts)?;
    let pids = match &target {
        TargetSpec::Processes(pids) => pids.clone(),
        _ => Vec::new(),
    };
    let mut run = Run::new(command, pids);

    let start = Instant::now();
    match &mut run.command {
        // Counters with enable_on_exec start when the command execs, which this releases.
        Some(stopped) => stopped.release()?,
        None => counters.enable()?,
    }
    run.begin(duration);
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    let stop = loop {
        tokio::select! {
            _ = ticker.tick() => {
                counters.drain();
                if let Some(stop) = run.targets_exited() {
                    break stop;
                }
            }
            // A command asked to exit is counted until it does, as it is recorded.
            event = run.next(&mut signals) => {
                if let Some(stop) = run.act(event).await? {
                    break stop;
                }
            }
        }
    };
    counters.disable()?;
    let elapsed = start.elapsed();
    counters.drain();
    let readings = counters.read()?;
    let unsupported = counters.unsupported().to_vec();
    let log = counters.into_log();
    let (events, breakdown) = assemble(&specs, &unsupported, &readings, &log, split);
    let report = StatReport {
        // Counts go to the user who ran the command, as `perf stat` prints it.
        target: target.describe(true),
        elapsed,
        events,
        breakdown,
        ending: run.ending(stop),
        lost_thread_records: log.lost,
    };

    let text = if options.json {
        render::json(&report)?
    } else {
        render::text(&report)
    };
    match &output {
        // The counts are printed all the same when their file cannot be written.
        Some(output) => {
            if let Err(error) = output.write(|out| Ok(out.write_all(text.as_bytes())?)) {
                eprint!("{text}");
                eprintln!("error: {error:#}");
                return Ok(CommandEnd::exit_code_after_failed_outputs(
                    report.ending.command,
                ));
            }
        }
        None => eprint!("{text}"),
    }
    Ok(CommandEnd::exit_code(report.ending.command))
}
