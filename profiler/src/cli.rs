//! Command-line arguments as the user writes them (clap). The commands resolve them into options.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::{hardware::HardwareArgs, report::ViewArgs};

#[derive(Debug, Parser)]
#[command(
    name = "profiler",
    version,
    about = "eBPF sampling profiler: call stacks, instructions and data addresses on counter overflow"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sample a command, processes, cgroups or the whole system and print a report.
    Record(Box<RecordArgs>),
    /// Report on a profile file (`record -o`).
    Report(Box<ReportArgs>),
    /// Count events exactly for the whole run (HP Caliper's exact counts, like perf stat).
    Stat(Box<crate::stat::StatArgs>),
    /// The events this machine can sample or count, with default overflow values.
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Events to sample: names, aliases, `pmu/terms/`, `rNNNN`, with `:ukpp` modifiers and
    /// `/period=N/`, `/freq=HZ/` or `name,N` overflow values (repeat or comma-separate).
    /// Default: cycles, or cpu-clock where there is no hardware PMU.
    #[arg(short = 'e', long = "event", value_name = "EVENTS")]
    pub events: Vec<String>,
    /// Samples per second per CPU for every event (the kernel adjusts the overflow period).
    #[arg(
        short = 'F',
        long = "freq",
        value_name = "HZ",
        conflicts_with = "period"
    )]
    pub frequency: Option<u64>,
    /// Sample every N events, for every event (the overflow value; Caliper's -s).
    #[arg(short = 'c', short_alias = 's', long, value_name = "N")]
    pub period: Option<u64>,
    /// Pick each event's overflow value from a short counting pass so that it samples about HZ
    /// times per second (a launched command, not yet running, is sampled at HZ instead).
    #[arg(long, value_name = "HZ", conflicts_with_all = ["period", "frequency"])]
    pub target_rate: Option<u64>,
    /// Profile every CPU (all processes).
    #[arg(short = 'a', long = "all-cpus", conflicts_with_all = ["pids", "command"])]
    pub all_cpus: bool,
    /// Profile running processes (repeat or comma-separate), their threads and children.
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        value_delimiter = ',',
        conflicts_with = "command"
    )]
    pub pids: Vec<u32>,
    /// Only samples in this cgroup (v2 path, absolute or relative to the mount) and below.
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Only samples of this container (docker, containerd, CRI-O, podman id or unique prefix).
    #[arg(long, value_name = "ID")]
    pub container: Option<String>,
    /// Only samples of this user (name or number).
    #[arg(long, value_name = "USER")]
    pub uid: Option<String>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Write the profile to this file (read it back with `profiler report -i`).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Also stream every sample, time-ordered, through a ring buffer into this file (JSON lines).
    #[arg(long, value_name = "FILE")]
    pub raw: Option<PathBuf>,
    /// Report the capture's own cost: ns per sample in the kernel, map memory, drain time.
    #[arg(long)]
    pub stats: bool,
    /// How often the agent drains the kernel maps, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub drain_interval: u64,
    /// Entries of the stack map (per generation): more entries, fewer hash collisions.
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub stack_map_entries: u32,
    /// Entries of the sample maps (stacks, instructions, data cache lines) per generation.
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub map_entries: u32,
    /// Entries of each latency-histogram map (one histogram per process, event and instruction,
    /// and one per process, event and data cache line).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub latency_map_entries: u32,
    /// Size in KiB of each ring buffer the program streams through: the `--raw` samples and the
    /// registers of IBS samples (rounded up to a power of two pages).
    #[arg(long, value_name = "KIB", default_value_t = 4096)]
    pub ring_buffer_kib: u32,
    /// Kernel BTF to read structure offsets from (default: /sys/kernel/btf/vmlinux).
    #[arg(long, value_name = "FILE")]
    pub btf: Option<PathBuf>,
    /// Do not collect kernel call stacks.
    #[arg(long)]
    pub no_kernel_stacks: bool,
    #[command(flatten)]
    pub report: ReportOutput,
    /// The command to launch and profile.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl RecordArgs {
    pub fn duration(&self) -> Option<std::time::Duration> {
        self.duration.map(std::time::Duration::from_secs_f64)
    }
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The profile file to read: one `record -o` wrote, or a perf.data from `perf record`.
    #[arg(short = 'i', long, value_name = "FILE")]
    pub input: PathBuf,
    #[command(flatten)]
    pub report: ReportOutput,
}

/// What to print and which files to export, for `record` and `report` alike.
#[derive(Debug, Args)]
pub struct ReportOutput {
    #[command(flatten)]
    pub view: ViewArgs,
    #[command(flatten)]
    pub hardware: HardwareArgs,
    /// Write folded stacks (for flamegraph.pl, speedscope) to this file: of the `--only-event`
    /// event (default: the first), of the samples the report's filters select.
    #[arg(long, value_name = "FILE")]
    pub folded: Option<PathBuf>,
    /// Write a flame graph SVG to this file: of the `--only-event` event (default: the first),
    /// of the samples the report's filters select.
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,
    /// Write a pprof profile (gzipped protobuf) to this file: every event, or the `--only-event`
    /// one, of the samples the report's filters select.
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
}

/// The command line, with `report`'s sample filters also under their plain names (`--event`,
/// `--pid`, `--comm`, `--module`): only `record` needs the `--only-` prefix, where `-e/--event`
/// and `-p/--pid` choose what to sample.
pub fn command() -> clap::Command {
    use clap::CommandFactory;

    Cli::command().mut_subcommand("report", |report| {
        report
            .mut_arg("only_event", |arg| arg.visible_alias("event"))
            .mut_arg("only_pids", |arg| arg.visible_alias("pid"))
            .mut_arg("only_comm", |arg| arg.visible_alias("comm"))
            .mut_arg("only_module", |arg| arg.visible_alias("module"))
    })
}

#[cfg(test)]
mod tests {
    use clap::FromArgMatches;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn report_filters_take_plain_names_and_record_keeps_its_own() {
        let parse = |args: &[&str]| {
            Cli::from_arg_matches(&command().try_get_matches_from(args).unwrap())
                .unwrap()
                .command
        };
        let Command::Report(report) = parse(&[
            "profiler", "report", "-i", "f", "--pid", "7", "--event", "cycles",
        ]) else {
            panic!("not a report");
        };
        assert_eq!(report.report.view.pids, vec![7]);
        assert_eq!(report.report.view.event.as_deref(), Some("cycles"));
        let Command::Record(record) = parse(&[
            "profiler",
            "record",
            "-p",
            "7",
            "--only-pid",
            "8",
            "-e",
            "cycles",
        ]) else {
            panic!("not a record");
        };
        assert_eq!(record.pids, vec![7]);
        assert_eq!(record.report.view.pids, vec![8]);
        assert_eq!(record.events, vec!["cycles"]);
    }
}
