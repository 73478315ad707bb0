//! `profiler stat`'s arguments, and their resolution into [`StatOptions`].

use std::{path::PathBuf, time::Duration};

use anyhow::{anyhow, Result};

use crate::{
    launch::TargetSpec,
    stat::{counters::Split, StatOptions},
};

/// `profiler stat` arguments.
#[derive(Debug, clap::Args)]
pub struct StatArgs {
    /// Events to count: repeat or comma-separate (`profiler list` shows them). Default:
    /// task-clock (cpu-clock with -a), context-switches, cpu-migrations, page-faults, cycles,
    /// instructions, branch-instructions, branch-misses.
    #[arg(short = 'e', long = "event", value_name = "EVENTS")]
    pub events: Vec<String>,
    /// Count on every CPU (all processes); perf's `-a -- sleep TIME` is `-a --duration TIME`.
    #[arg(short = 'a', long = "all-cpus", conflicts_with = "pids")]
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
    /// Stop after this long (`30s`, `500ms`, `2m`; a bare number is seconds).
    #[arg(long, value_name = "TIME", value_parser = crate::duration::seconds)]
    pub duration: Option<Duration>,
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

    /// Resolves the arguments into what `profiler stat` runs with.
    pub fn options(self) -> Result<StatOptions> {
        Ok(StatOptions {
            target: self.target()?,
            duration: self.duration,
            split: Split {
                per_cpu: self.per_cpu,
                per_thread: self.per_thread,
            },
            events: self.events,
            json: self.json,
            output: self.output,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::events::{EventSpec, PmuRegistry};
    use crate::stat::event_specs;

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
        assert_eq!(parsed.duration, Some(Duration::from_millis(2_500)));
        let parsed = args(&["-a", "--duration", "1s"]).unwrap();
        assert_eq!(parsed.duration, Some(Duration::from_secs(1)));
        let err = args(&["-a", "--duration=-1"]).unwrap_err().to_string();
        assert!(err.contains("'-1' for '--duration <TIME>'"), "{err}");
    }

    #[test]
    fn events_default_to_the_perf_stat_set_and_accumulate() {
        let registry = PmuRegistry::default();
        let names = |specs: Vec<EventSpec>| -> Vec<String> {
            specs.into_iter().map(|spec| spec.name).collect()
        };
        let defaults = args(&["--", "ls"]).unwrap();
        let task = names(event_specs(&defaults.events, &registry, false).unwrap());
        assert_eq!(task[0], "task-clock");
        assert_eq!(task.len(), 8);
        let system = names(event_specs(&defaults.events, &registry, true).unwrap());
        assert_eq!(system[0], "cpu-clock");
        let given = args(&["-e", "insts,cycles", "-e", "page-faults", "--", "ls"]).unwrap();
        assert_eq!(
            names(event_specs(&given.events, &registry, false).unwrap()),
            ["instructions", "cycles", "page-faults"]
        );
        let err = event_specs(
            &args(&["-e", "cycels", "--", "ls"]).unwrap().events,
            &registry,
            false,
        )
        .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("unknown event 'cycels'. Did you mean: cycles"));
    }
}
