//! `profiler stat`: exact counts of events over a whole run (HP Caliper's exact counts beside
//! its sampled metrics), for a launched command (counted from its exec, into its threads and
//! children), running processes or the whole system; scaled for multiplexing and marked when
//! scaled; with derived ratios ([`metrics`]) and, on request, per-thread or per-CPU breakdowns
//! ([`counters`] says how per-thread counts are obtained). The run ends when the command exits,
//! the counted processes are gone, `--duration` passes, or on Ctrl-C / SIGTERM.

pub mod assemble;
pub mod count;
pub mod counters;
pub mod metrics;
pub mod render;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};

use self::assemble::assemble;
use self::count::Count;
use self::counters::{CountScope, CounterSet, Split, ThreadId};
use crate::events::{parse_event_list, EventAttr, EventSpec, PmuRegistry, SystemFacts};
use crate::launch::{
    spawn_stopped, CommandEnd, Ending, Run, StopSignals, StoppedCommand, TargetSpec,
};
use crate::output::Checker;

/// `profiler stat` arguments.
#[derive(Debug, clap::Args)]
pub struct StatArgs {
    /// Events to count: repeat or comma-separate (`profiler list` shows them). Default:
    /// task-clock (cpu-clock with -a), context-switches, cpu-migrations, page-faults, cycles,
    /// instructions, branch-instructions, branch-misses.
    #[arg(short = 'e', long = "event", value_name = "EVENTS")]
    pub events: Vec<String>,
    /// Count on every CPU (all processes).
    #[arg(short = 'a', long = "all-cpus", conflicts_with_all = ["pids", "command"])]
    pub all_cpus: bool,
    /// Count running processes (repeat or comma-separate), their threads and children.
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        value_delimiter = ',',
        conflicts_with = "command"
    )]
    pub pids: Vec<u32>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = crate::cli::seconds)]
    pub duration: Option<f64>,
    /// Counts per thread (with the thread's name), then the totals. Not with -a.
    #[arg(long, conflicts_with_all = ["all_cpus", "per_cpu"])]
    pub per_thread: bool,
    /// Counts per CPU, then the totals.
    #[arg(long)]
    pub per_cpu: bool,
    /// Print the report as JSON (schema profiler.stat/1).
    #[arg(long)]
    pub json: bool,
    /// Write the report to this file instead of standard error.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The command to launch and count.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<String>,
}

/// The events counted when `-e` is not given. Hardware ones show as not supported, with the
/// reason, where the machine has no PMU.
const DEFAULT_EVENTS: &str =
    "task-clock,context-switches,cpu-migrations,page-faults,cycles,instructions,branches,branch-misses";
/// System-wide, task-clock would count the idle task too; cpu-clock says what it is.
const DEFAULT_SYSTEM_EVENTS: &str =
    "cpu-clock,context-switches,cpu-migrations,page-faults,cycles,instructions,branches,branch-misses";

/// How often per-thread ring buffers are drained and `-p` targets checked for exit.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

impl StatArgs {
    fn target(&self) -> Result<TargetSpec> {
        if !self.command.is_empty() {
            Ok(TargetSpec::Command(self.command.clone()))
        } else if !self.pids.is_empty() {
            Ok(TargetSpec::Processes(self.pids.clone()))
        } else if self.all_cpus {
            Ok(TargetSpec::System)
        } else {
            Err(anyhow!(
                "nothing to count: give a command after `--`, processes with -p PID, or -a for \
                 all CPUs"
            ))
        }
    }

    pub(crate) fn duration(&self) -> Option<Duration> {
        // `cli::seconds` checked that the value fits.
        self.duration.map(Duration::from_secs_f64)
    }

    fn event_specs(&self, registry: &PmuRegistry, system_wide: bool) -> Result<Vec<EventSpec>> {
        if self.events.is_empty() {
            let defaults = if system_wide {
                DEFAULT_SYSTEM_EVENTS
            } else {
                DEFAULT_EVENTS
            };
            return Ok(parse_event_list(defaults, registry)?);
        }
        let mut specs = Vec::new();
        for list in &self.events {
            specs.extend(parse_event_list(list, registry)?);
        }
        Ok(specs)
    }
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

/// Runs `profiler stat`. Its exit code is the launched command's (128 + N when signal N killed
/// it), or success.
pub async fn run_stat(args: StatArgs) -> Result<ExitCode> {
    let mut signals = StopSignals::catch()?;
    let output = Checker::default().check_optional("-o", args.output.as_deref())?;
    let target = args.target()?;
    let duration = args.duration();
    let registry = PmuRegistry::live().context("reading the PMUs from /sys")?;
    let specs = args.event_specs(&registry, target == TargetSpec::System)?;
    let facts = SystemFacts::read(&registry);
    let split = Split {
        per_cpu: args.per_cpu,
        per_thread: args.per_thread,
    };

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

    let text = if args.json {
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        stat: StatArgs,
    }

    fn args(line: &[&str]) -> Result<StatArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("stat").chain(line.iter().copied())).map(|cli| cli.stat)
    }

    #[test]
    fn the_target_is_a_command_processes_or_all_cpus() {
        let command = args(&["-e", "page-faults", "--", "ls", "-l"]).unwrap();
        assert_eq!(
            command.target().unwrap(),
            TargetSpec::Command(vec!["ls".to_string(), "-l".to_string()])
        );
        assert_eq!(
            args(&["-p", "1,2", "-p", "3"]).unwrap().target().unwrap(),
            TargetSpec::Processes(vec![1, 2, 3])
        );
        assert_eq!(args(&["-a"]).unwrap().target().unwrap(), TargetSpec::System);
        let err = args(&[]).unwrap().target().unwrap_err();
        assert!(err.to_string().starts_with("nothing to count"), "{err}");
        assert!(args(&["-a", "-p", "1"]).is_err());
        assert!(args(&["-a", "--per-thread"]).is_err());
        assert!(args(&["--per-thread", "--per-cpu", "--", "ls"]).is_err());
    }

    #[test]
    fn durations_must_be_positive_numbers() {
        let parsed = args(&["-a", "--duration", "2.5"]).unwrap();
        assert_eq!(parsed.duration(), Some(Duration::from_millis(2_500)));
        let err = args(&["-a", "--duration=-1"]).unwrap_err().to_string();
        assert!(err.contains("'-1' for '--duration <SECONDS>'"), "{err}");
    }

    #[test]
    fn events_default_to_the_perf_stat_set_and_accumulate() {
        let registry = PmuRegistry::default();
        let names = |specs: Vec<EventSpec>| -> Vec<String> {
            specs.into_iter().map(|spec| spec.name).collect()
        };
        let defaults = args(&["--", "ls"]).unwrap();
        let task = names(defaults.event_specs(&registry, false).unwrap());
        assert_eq!(task[0], "task-clock");
        assert_eq!(task.len(), 8);
        let system = names(defaults.event_specs(&registry, true).unwrap());
        assert_eq!(system[0], "cpu-clock");
        let given = args(&["-e", "insts,cycles", "-e", "page-faults", "--", "ls"]).unwrap();
        assert_eq!(
            names(given.event_specs(&registry, false).unwrap()),
            ["instructions", "cycles", "page-faults"]
        );
        let err = args(&["-e", "cycels", "--", "ls"])
            .unwrap()
            .event_specs(&registry, false)
            .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("unknown event 'cycels'. Did you mean: cycles"));
    }
}
