//! Command-line arguments as the user writes them (clap), and ([`options`]) their resolution
//! into the options the commands run with.

pub mod agent;
pub mod options;
pub mod stat;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    report::{hardware::HardwareArgs, ViewArgs},
    session::{
        self,
        map_sizes::{
            ring_buffer_bytes, DEFAULT_LATENCY_MAP_ENTRIES, DEFAULT_RING_BUFFER_KIB,
            DEFAULT_UNWIND_TABLE_MIB, MAX_MAP_ENTRIES, MAX_RING_BUFFER_KIB, MAX_STACK_COPY_KIB,
        },
    },
};

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
    /// Profile continuously: a profile per interval, exported until SIGTERM.
    Agent(Box<agent::AgentArgs>),
    /// Count events exactly for the whole run (HP Caliper's exact counts, like perf stat).
    Stat(Box<stat::StatArgs>),
    /// The events this machine can sample or count, with default overflow values.
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Profile every CPU (all processes).
    #[arg(short = 'a', long = "all-cpus", conflicts_with_all = ["pids", "command"])]
    pub all_cpus: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub duration: Option<f64>,
    /// Write the profile to this file (read it back with `profiler report -i`).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Also stream every sample through a ring buffer into this file (JSON lines, in timestamp
    /// order; `-`: standard output).
    #[arg(long, value_name = "FILE")]
    pub raw: Option<PathBuf>,
    /// Write the report to this file instead of standard error (`-`: standard output). The
    /// command's standard input, output and error are its own either way.
    #[arg(long = "report", value_name = "FILE", conflicts_with = "json")]
    pub report_file: Option<PathBuf>,
    /// Write the report as JSON (schema profiler.report/1) to this file, or `-` for standard
    /// output.
    #[arg(long, value_name = "PATH|-", help_heading = "Report")]
    pub json: Option<PathBuf>,
    /// Report the capture's own cost: ns per sample in the kernel, map memory, drain time.
    #[arg(long)]
    pub stats: bool,
    /// Keep the command's arguments in the profile and its reports (by default only the
    /// program is named: arguments may hold passwords or tokens).
    #[arg(long)]
    pub record_args: bool,
    #[command(flatten)]
    pub report: ReportOutput,
    /// The command to launch and profile: after `--`, or after the options as perf takes it
    /// (`record ./prog -x`: what follows the program is its own).
    // No `allow_hyphen_values`: an option the profiler does not know (`-x`, a typo) is refused
    // by name with a suggestion, never run as the program; after the program's name, its
    // arguments are its own (`trailing_var_arg`).
    #[arg(
        trailing_var_arg = true,
        value_name = "COMMAND",
        conflicts_with = "pids"
    )]
    pub command: Vec<String>,
}

/// What to sample and how, for `record` and `agent` alike.
#[derive(Debug, Args)]
pub struct SamplingArgs {
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
        conflicts_with = "period",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub frequency: Option<u64>,
    /// Sample every N events, for every event (the overflow value; Caliper's -s).
    #[arg(short = 'c', short_alias = 's', long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub period: Option<u64>,
    /// Pick each event's overflow value from a short counting pass so that it samples about HZ
    /// times per second (a launched command, not yet running, is sampled at HZ instead).
    #[arg(long, value_name = "HZ", conflicts_with_all = ["period", "frequency"],
          value_parser = clap::value_parser!(u64).range(1..))]
    pub target_rate: Option<u64>,
    /// Profile running processes (repeat or comma-separate), their threads and children.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
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
    /// How often the agent drains the kernel maps, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=MAX_DRAIN_INTERVAL_MS))]
    pub drain_interval: u64,
    /// Distinct call stacks the kernel holds until the agent takes them into its stack cache
    /// (1 KiB each); the agent empties the map before it fills. By default twice the sample
    /// maps' entries (a sample stores up to two stacks), from 2,048 to 32,768.
    #[arg(long, value_name = "N", value_parser = map_entries)]
    pub stack_map_entries: Option<u32>,
    /// Entries of the sample maps (stacks, instructions, data cache lines) per generation, and
    /// of the `--off-cpu` map (thread, stacks, state). By default the sample maps hold twice
    /// the samples the events fire on every CPU between two drains (16,384 for events sampled
    /// by period, whose rate is unknown), from 1,024 to 16,384 entries, and within 64 MiB of
    /// per-CPU values on hosts with many CPUs; the `--off-cpu` map holds 16,384.
    #[arg(long, value_name = "N", value_parser = map_entries)]
    pub map_entries: Option<u32>,
    /// Entries of each latency-histogram map (one histogram per process, event and instruction,
    /// and one per process, event and data cache line), and of the `--off-cpu` block-duration
    /// histograms (one per thread, stacks and state).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LATENCY_MAP_ENTRIES,
          value_parser = map_entries)]
    pub latency_map_entries: u32,
    /// Size in KiB of each ring buffer the program streams through: the `--raw` samples and the
    /// registers of IBS samples (rounded up to a power of two pages; 4 to 1048576); the stack
    /// copies of `--unwind copy` get 8 times as much (at most 1 GiB).
    #[arg(long, value_name = "KIB", default_value_t = DEFAULT_RING_BUFFER_KIB,
          value_parser = clap::value_parser!(u32).range(4..=MAX_RING_BUFFER_KIB as i64))]
    pub ring_buffer_kib: u32,
    /// Kernel BTF to read structure offsets from (default: /sys/kernel/btf/vmlinux).
    #[arg(long, value_name = "FILE")]
    pub btf: Option<PathBuf>,
    /// Do not collect kernel call stacks.
    #[arg(long)]
    pub no_kernel_stacks: bool,
    /// How user call stacks are walked: `dwarf` (the default) in the kernel from the executables'
    /// unwind tables, frame pointers where a frame has none; `fp` frame pointers only (code built
    /// without them loses its callers); `copy` sends each sample's user registers and a copy of
    /// its user stack to the agent, which unwinds them (costlier: `--stack-copy-kib` per sample,
    /// and the stack's bytes reach the agent); `check` does `dwarf` and also unwinds a copy of
    /// each walked sample's stack, and says how often the two agree frame by frame (a check of
    /// the in-kernel unwinder, costing both).
    #[arg(long, value_enum, default_value_t = Unwind::Dwarf)]
    pub unwind: Unwind,
    /// perf's `-g`: call stacks are always recorded here, user stacks walked as `--unwind` says;
    /// taken so that perf's habit works.
    #[arg(short = 'g', hide_short_help = true)]
    pub perf_call_graph: bool,
    /// perf's `--call-graph MODE`: `dwarf` (or `dwarf,SIZE`) is `--unwind dwarf`, `fp` is
    /// `--unwind fp`.
    #[arg(long = "call-graph", value_name = "MODE", value_parser = call_graph,
          conflicts_with = "unwind", hide_short_help = true)]
    pub call_graph: Option<Unwind>,
    /// With `--unwind copy` or `check`: KiB of user stack copied per sample above the stack
    /// pointer (1 to 32, default 16 for `copy`, 32 for `check`); a deeper stack is cut short and
    /// counted as such.
    #[arg(long, value_name = "KIB",
          value_parser = clap::value_parser!(u32).range(1..=MAX_STACK_COPY_KIB as i64))]
    pub stack_copy_kib: Option<u32>,
    /// Kernel memory for the unwind tables of `--unwind dwarf`, in MiB (16 bytes a row). When
    /// it is full, the tables of exited, then idle processes are evicted (counted in `--stats`);
    /// a table that still does not fit is counted and its frames use frame pointers.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_UNWIND_TABLE_MIB,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub unwind_table_mib: u32,
    /// Also record off-CPU time: where the threads in scope wait (asleep, on the disk, in the
    /// run queue), with kernel and user stacks and the distribution of block durations.
    #[arg(long)]
    pub off_cpu: bool,
    /// With `--off-cpu`: blocks shorter than this are counted without stacks (nanoseconds, or
    /// with a unit: `500us`, `2ms`, `1s`).
    #[arg(long, value_name = "TIME", requires = "off_cpu",
          value_parser = crate::capture::offcpu::parse_block_time)]
    pub off_cpu_min: Option<u64>,
    /// With `--off-cpu`: also keep who woke each blocked thread, with the waker's kernel stack
    /// and its user stack by frame pointers (bcc's offwaketime).
    #[arg(long, requires = "off_cpu")]
    pub wakers: bool,
}

/// Largest `--drain-interval`: a day.
const MAX_DRAIN_INTERVAL_MS: u64 = 24 * 3600 * 1000;
/// `--duration`: a finite, positive number of seconds that a `Duration` holds.
pub fn seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| "give a number of seconds, e.g. 2.5".to_string())?;
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err("give a positive, finite number of seconds, e.g. 2.5".into());
    }
    std::time::Duration::try_from_secs_f64(seconds)
        .map(|_| seconds)
        .map_err(|_| "too long: give at most about 5e11 seconds".into())
}

/// How `record` walks user call stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Unwind {
    /// In the kernel, from the executables' call-frame information (`.eh_frame`,
    /// `.debug_frame`) that the agent compiles into tables; frame pointers where a frame has no
    /// table or row.
    Dwarf,
    /// The kernel's frame-pointer walk only.
    Fp,
    /// A copy of the user stack, unwound in the agent.
    Copy,
    /// `Dwarf`, and the same samples' stacks copied and unwound in the agent, to compare the
    /// two unwinders frame by frame; the table walk's stacks are the ones counted.
    Check,
}

impl From<Unwind> for session::Unwind {
    fn from(unwind: Unwind) -> session::Unwind {
        match unwind {
            Unwind::Dwarf => session::Unwind::Dwarf,
            Unwind::Fp => session::Unwind::Fp,
            Unwind::Copy => session::Unwind::Copy,
            Unwind::Check => session::Unwind::Check,
        }
    }
}

/// Entries of a BPF map: at least 1 (the kernel refuses an empty map) and at most
/// [`MAX_MAP_ENTRIES`].
/// perf's `--call-graph` modes, as the unwinder that does their job here.
fn call_graph(mode: &str) -> Result<Unwind, String> {
    let (method, size) = mode.split_once(',').unwrap_or((mode, ""));
    match method {
        "dwarf" if size.is_empty() || size.parse::<u32>().is_ok() => Ok(Unwind::Dwarf),
        "dwarf" => Err(format!(
            "'{size}' is not a stack size: perf writes `dwarf,SIZE`; here the kernel walks the \
             stack with unwind tables and needs no copy (for copies: --unwind copy \
             --stack-copy-kib KIB)"
        )),
        "fp" if size.is_empty() => Ok(Unwind::Fp),
        "lbr" => Err(
            "LBR call stacks are not recorded here: use --unwind dwarf (the default), which \
             walks whole stacks without frame pointers"
                .to_string(),
        ),
        _ => Err(format!(
            "unknown call-graph mode '{mode}': perf's `dwarf` and `fp` are taken (--unwind \
             dwarf|fp|copy|check says the same)"
        )),
    }
}

fn map_entries(text: &str) -> Result<u32, String> {
    let entries: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("give a whole number of entries from 1 to {MAX_MAP_ENTRIES}"))?;
    if entries == 0 {
        return Err("a map needs at least 1 entry (the kernel refuses empty maps)".into());
    }
    if entries > MAX_MAP_ENTRIES {
        return Err(format!(
            "at most {MAX_MAP_ENTRIES} entries (larger maps need more memory than the kernel \
             lends BPF maps)"
        ));
    }
    Ok(entries)
}

impl RecordArgs {
    pub fn duration(&self) -> Option<std::time::Duration> {
        // `seconds` checked that the value fits.
        self.duration.map(std::time::Duration::from_secs_f64)
    }
}

impl SamplingArgs {
    /// How user stacks are walked: `--unwind`, or perf's `--call-graph` for it.
    pub fn unwind(&self) -> Unwind {
        self.call_graph.unwrap_or(self.unwind)
    }

    /// Bytes of each ring buffer: `--ring-buffer-kib` rounded up to a power of two (at most
    /// [`MAX_RING_BUFFER_KIB`], so it fits).
    pub fn ring_buffer_bytes(&self) -> u32 {
        ring_buffer_bytes(self.ring_buffer_kib)
    }
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The profile file to read: one `record -o` wrote, or a perf.data from `perf record`.
    #[arg(short = 'i', long, value_name = "FILE")]
    pub input: PathBuf,
    /// Print the report as JSON (schema profiler.report/1, docs/json-report.md).
    #[arg(long, help_heading = "Report")]
    pub json: bool,
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
    /// event (default: the first), of the samples the report's filters select (`-`: standard
    /// output).
    #[arg(long, value_name = "FILE")]
    pub folded: Option<PathBuf>,
    /// Write a flame graph SVG to this file: of the `--only-event` event (default: the first),
    /// of the samples the report's filters select (`-`: standard output).
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,
    /// Write a pprof profile (gzipped protobuf) to this file: every event, or the `--only-event`
    /// one, of the samples the report's filters select (`-`: standard output).
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

    /// Options of every subcommand, and values that break careless number handling.
    fn words() -> Vec<String> {
        let mut words: Vec<String> = Vec::new();
        for sub in command().get_subcommands() {
            words.push(sub.get_name().to_string());
            for arg in sub.get_arguments() {
                words.extend(arg.get_long().map(|l| format!("--{l}")));
                words.extend(arg.get_short().map(|s| format!("-{s}")));
            }
        }
        for value in [
            "0",
            "-1",
            "1",
            "inf",
            "-inf",
            "nan",
            "NaN",
            "1e300",
            "1e-300",
            "4294967295",
            "4294967296",
            "18446744073709551615",
            "18446744073709551616",
            "",
            " ",
            "0x10",
            "2.5",
            "--",
            "cycles",
            "page-faults/period=0/",
            "cpu-clock,",
        ] {
            words.push(value.to_string());
        }
        words
    }

    /// Parses a command line and computes every value the commands derive from numbers, as
    /// they do before touching the kernel.
    fn resolve(line: &[String]) {
        let Ok(matches) = command().try_get_matches_from(line) else {
            return;
        };
        let Ok(cli) = Cli::from_arg_matches(&matches) else {
            return;
        };
        match cli.command {
            Command::Record(record) => {
                let _ = record.duration();
                let _ = record.sampling.ring_buffer_bytes();
                let _ = record.report.view.rows();
            }
            Command::Report(report) => {
                let _ = report.report.view.rows();
            }
            Command::Stat(stat) => {
                let _ = stat.duration();
            }
            Command::Agent(agent) => {
                let _ = agent.sampling.ring_buffer_bytes();
            }
            Command::List { .. } => {}
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn no_command_line_panics(
            picks in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), ".{0,12}"), 0..8
            ),
            literal in proptest::prelude::any::<bool>(),
        ) {
            let words = words();
            let mut line = vec!["profiler".to_string()];
            for (pick, text) in picks {
                line.push(if literal { text } else { pick.get(&words).clone() });
            }
            resolve(&line);
        }
    }

    #[test]
    fn numbers_out_of_range_are_refused_naming_the_option() {
        let error = |line: &[&str]| {
            command()
                .try_get_matches_from(line)
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        for value in ["inf", "nan", "1e300", "-1", "0"] {
            let option = format!("--duration={value}");
            let message = error(&["profiler", "record", "-a", &option]);
            assert!(
                message.contains(&format!("'{value}' for '--duration <SECONDS>'"))
                    && message.contains("seconds"),
                "{message}"
            );
        }
        let message = error(&["profiler", "record", "-a", "--ring-buffer-kib", "4194304"]);
        assert!(message.contains("--ring-buffer-kib"), "{message}");
        let message = error(&["profiler", "record", "-a", "--map-entries", "0"]);
        assert!(
            message.contains("--map-entries") && message.contains("at least 1 entry"),
            "{message}"
        );
        let message = error(&["profiler", "record", "-a", "-F", "0"]);
        assert!(message.contains("--freq <HZ>"), "{message}");
        let message = error(&["profiler", "record", "-a", "-c", "0"]);
        assert!(message.contains("--period <N>"), "{message}");
        let parse = |line: &[&str]| {
            let matches = command().try_get_matches_from(line).unwrap();
            match Cli::from_arg_matches(&matches).unwrap().command {
                Command::Record(record) => record,
                _ => unreachable!("a record line"),
            }
        };
        let largest = parse(&["profiler", "record", "-a", "--ring-buffer-kib", "1048576"]);
        assert_eq!(largest.sampling.ring_buffer_bytes(), 1 << 30);
        let odd = parse(&["profiler", "record", "-a", "--ring-buffer-kib", "5"]);
        assert_eq!(odd.sampling.ring_buffer_bytes(), 8192);
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
        assert_eq!(record.sampling.pids, vec![7]);
        assert_eq!(record.report.view.pids, vec![8]);
        assert_eq!(record.sampling.events, vec!["cycles"]);
        let Command::Record(record) =
            parse(&["profiler", "record", "-F", "99", "./prog", "-x", "--", "y"])
        else {
            panic!("not a record");
        };
        assert_eq!(
            record.command,
            ["./prog", "-x", "--", "y"],
            "as perf takes it"
        );
        assert_eq!(record.sampling.frequency, Some(99));
        let Command::Record(record) = parse(&["profiler", "record", "--", "./prog", "-x"]) else {
            panic!("not a record");
        };
        assert_eq!(record.command, ["./prog", "-x"]);
    }
}
