//! Command-line arguments as the user writes them (clap), and ([`options`]) their resolution
//! into the options the commands run with.

pub mod agent;
pub mod options;
pub mod perf;
pub mod stat;
pub mod top;

use std::{path::PathBuf, time::Duration};

use clap::{error::ErrorKind, Args, FromArgMatches, Parser, Subcommand, ValueEnum};

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
    /// Report on a profile file (profiler.data, or `record -o FILE`, or a perf.data).
    Report(Box<ReportArgs>),
    /// Profile continuously: a profile per interval, exported until SIGTERM.
    Agent(Box<agent::AgentArgs>),
    /// Count events exactly for the whole run (HP Caliper's exact counts, like perf stat).
    Stat(Box<stat::StatArgs>),
    /// Watch the hottest functions, processes and containers live, refreshed every second
    /// (the whole system unless scoped with -p, --cgroup, --container or --uid).
    Top(Box<top::TopArgs>),
    /// The events this machine can sample or count, with default overflow values.
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the completion script of a shell to standard output (e.g. `profiler completions
    /// bash > /etc/bash_completion.d/profiler`).
    Completions {
        /// bash, zsh or fish (elvish and powershell too).
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The profile `record` keeps and `report` reads when no file is named, as perf's perf.data
/// (the previous one is kept as `profiler.data.old`).
pub const DEFAULT_PROFILE: &str = "profiler.data";

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Profile every CPU (all processes); perf's `-a -- sleep TIME` is `-a --duration TIME`.
    #[arg(short = 'a', long = "all-cpus", conflicts_with = "pids")]
    pub all_cpus: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop after this long (`30s`, `500ms`, `2m`; a bare number is seconds).
    #[arg(long, value_name = "TIME", value_parser = crate::duration::seconds)]
    pub duration: Option<Duration>,
    /// Show the recording live as `profiler top` does (keys alike; `q` ends it), then write the
    /// profile and report as usual. For processes, cgroups, containers, users or -a: a
    /// launched command would write over the screen.
    #[arg(long, conflicts_with = "raw")]
    pub live: bool,
    /// Write the profile to this file instead of profiler.data (the previous profiler.data is
    /// kept as profiler.data.old); `profiler report -i FILE` reads it.
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
    #[arg(short = 'c', short_alias = 's', long, alias = "count", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub period: Option<u64>,
    /// Pick each event's overflow value from a short counting pass so that it samples about HZ
    /// times per second (a launched command, not yet running, is sampled at HZ instead).
    #[arg(long, value_name = "HZ", conflicts_with_all = ["period", "frequency"],
          hide_short_help = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub target_rate: Option<u64>,
    /// Profile running processes (repeat or comma-separate), their threads and children.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Only samples in this cgroup (v2 path, absolute or relative to the mount) and below.
    #[arg(short = 'G', long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Only samples of this container (docker, containerd, CRI-O, podman id or unique prefix).
    #[arg(long, value_name = "ID")]
    pub container: Option<String>,
    /// Only samples of this user (name or number).
    #[arg(long, value_name = "USER")]
    pub uid: Option<String>,
    /// The node's filesystem as the profiler sees it: the container runtimes' state and
    /// kubelet's logs there name each container's Kubernetes namespace, pod and container (`/`;
    /// give /host where a DaemonSet mounts the host there).
    #[arg(long, value_name = "DIR", default_value = "/", hide_short_help = true)]
    pub node_root: PathBuf,
    #[command(flatten)]
    pub debuginfod: DebuginfodArgs,
    /// How often the agent drains the kernel maps (`250ms`, `1s`; a bare number is
    /// milliseconds; 10ms to 24h).
    #[arg(long, value_name = "TIME", default_value = "1s", value_parser = drain_interval,
          hide_short_help = true)]
    pub drain_interval: Duration,
    /// Distinct call stacks the kernel holds until the agent takes them into its stack cache
    /// (1 KiB each); the agent empties the map before it fills. By default twice the sample
    /// maps' entries (a sample stores up to two stacks), from 2,048 to 32,768.
    #[arg(long, value_name = "N", value_parser = map_entries, hide_short_help = true)]
    pub stack_map_entries: Option<u32>,
    /// Entries of the sample maps (stacks, instructions, data cache lines) per generation, and
    /// of the `--off-cpu` map (thread, stacks, state). By default the sample maps hold twice
    /// the samples the events fire on every CPU between two drains (16,384 for events sampled
    /// by period, whose rate is unknown), from 1,024 to 16,384 entries, and within 64 MiB of
    /// per-CPU values on hosts with many CPUs; the `--off-cpu` map holds 16,384.
    #[arg(long, value_name = "N", value_parser = map_entries, hide_short_help = true)]
    pub map_entries: Option<u32>,
    /// Entries of each latency-histogram map (one histogram per process, event and instruction,
    /// and one per process, event and data cache line), and of the `--off-cpu` block-duration
    /// histograms (one per thread, stacks and state).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LATENCY_MAP_ENTRIES,
          value_parser = map_entries, hide_short_help = true)]
    pub latency_map_entries: u32,
    /// Size in KiB of each ring buffer the program streams through: the `--raw` samples and the
    /// registers of IBS samples (rounded up to a power of two pages; 4 to 1048576); the stack
    /// copies of `--unwind copy` get 8 times as much (at most 1 GiB).
    #[arg(long, value_name = "KIB", default_value_t = DEFAULT_RING_BUFFER_KIB,
          hide_short_help = true,
          value_parser = clap::value_parser!(u32).range(4..=MAX_RING_BUFFER_KIB as i64))]
    pub ring_buffer_kib: u32,
    /// Kernel BTF to read structure offsets from (default: /sys/kernel/btf/vmlinux).
    #[arg(long, value_name = "FILE", hide_short_help = true)]
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
    #[arg(long, value_name = "KIB", hide_short_help = true,
          value_parser = clap::value_parser!(u32).range(1..=MAX_STACK_COPY_KIB as i64))]
    pub stack_copy_kib: Option<u32>,
    /// Kernel memory for the unwind tables of `--unwind dwarf`, in MiB (16 bytes a row). When
    /// it is full, the tables of exited, then idle processes are evicted (counted in `--stats`);
    /// a table that still does not fit is counted and its frames use frame pointers.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_UNWIND_TABLE_MIB,
          hide_short_help = true,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub unwind_table_mib: u32,
    /// Also record off-CPU time: where the threads in scope wait (asleep, on the disk, in the
    /// run queue), with kernel and user stacks and the distribution of block durations.
    #[arg(long)]
    pub off_cpu: bool,
    /// With `--off-cpu`: blocks shorter than this are counted without stacks (`500us`, `2ms`,
    /// `1s`; a bare number is nanoseconds).
    #[arg(long, value_name = "TIME", requires = "off_cpu",
          value_parser = crate::duration::nanoseconds)]
    pub off_cpu_min: Option<Duration>,
    /// With `--off-cpu`: also keep who woke each blocked thread, with the waker's kernel stack
    /// and its user stack by frame pointers (bcc's offwaketime).
    #[arg(long, requires = "off_cpu")]
    pub wakers: bool,
}

/// `--drain-interval`: often enough to matter, at least once a day.
fn drain_interval(text: &str) -> Result<Duration, String> {
    let interval = crate::duration::milliseconds(text)?;
    if !(Duration::from_millis(10)..=Duration::from_secs(24 * 3600)).contains(&interval) {
        return Err("give 10ms to 24h".into());
    }
    Ok(interval)
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
    /// The profile file to read: one `record` wrote, a perf.data from `perf record`, or a pprof
    /// profile (the agent's windows).
    #[arg(short = 'i', long, value_name = "FILE", default_value = DEFAULT_PROFILE)]
    pub input: PathBuf,
    /// Print the report as JSON (schema profiler.report/1, docs/json-report.md).
    #[arg(long, help_heading = "Report")]
    pub json: bool,
    /// perf's `--stdio`: the report is text already; taken so that the habit works.
    #[arg(long, hide = true)]
    pub stdio: bool,
    /// perf's `-n`: every row shows its samples; taken so that the habit works.
    #[arg(short = 'n', long = "show-nr-samples", hide = true)]
    pub show_samples: bool,
    /// perf's `-g`: the function view shows the hot call paths (`--paths N`, `--callers NAME`);
    /// taken so that the habit works.
    #[arg(short = 'g', hide = true)]
    pub call_graph: bool,
    #[command(flatten)]
    pub debuginfod: DebuginfodArgs,
    #[command(flatten)]
    pub report: ReportOutput,
}

/// Where separate debug files come from when neither a module nor this machine has them.
#[derive(Debug, Args)]
pub struct DebuginfodArgs {
    /// Ask this debuginfod server (http:// or https:// URL; repeat, or separate by spaces) for
    /// the debug files of modules without debug information, by build ID, as well as the
    /// servers of DEBUGINFOD_URLS (asked by default; perf's bare `--debuginfod`); fetched files
    /// are cached.
    #[arg(long, value_name = "URL", hide_short_help = true, num_args = 0..=1,
          default_missing_value = "")]
    pub debuginfod: Vec<String>,
    /// Ask no debuginfod server named by DEBUGINFOD_URLS (only those of --debuginfod).
    #[arg(long, hide_short_help = true)]
    pub no_debuginfod_urls: bool,
}

impl DebuginfodArgs {
    pub fn config(&self) -> anyhow::Result<crate::symbolize::debuginfod::DebuginfodConfig> {
        crate::symbolize::debuginfod::DebuginfodConfig::new(
            &self.debuginfod,
            self.no_debuginfod_urls,
        )
    }
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
    /// Write a speedscope file (its own JSON format, inlined functions kept) to this file: every
    /// event, or the `--only-event` one, of the samples the report's filters select (`-`:
    /// standard output).
    #[arg(long, value_name = "FILE")]
    pub speedscope: Option<PathBuf>,
    /// Write a Firefox Profiler file (its processed format, as samply writes it; open it at
    /// profiler.firefox.com) to this file: every event, or the `--only-event` one, of the
    /// samples the report's filters select (`-`: standard output).
    #[arg(long, value_name = "FILE")]
    pub firefox: Option<PathBuf>,
    /// Write one self-contained HTML report to this file (it needs no network: it opens from a
    /// mailed attachment): flame graph and icicle views of every event, or the `--only-event`
    /// one, with search, zoom and a differential view, and each hot function's callers, callees,
    /// source lines and instructions by cache line (`-`: standard output).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// A second recording (a profile file, a perf.data or a pprof) that the HTML report's
    /// differential view compares with, event by event of the same name; taken whole.
    #[arg(long, value_name = "FILE", requires = "html")]
    pub baseline: Option<PathBuf>,
}

/// The command line, with `report`'s sample filters also under their plain names (`--event`,
/// `--pid`, `--comm`, `--module`, perf's `--dso`): only `record` needs the `--only-` prefix,
/// where `-e/--event` and `-p/--pid` choose what to sample; perf's options that have no
/// counterpart here are declared to be refused ([`perf`]); `-h` is one short line per option.
pub fn command() -> clap::Command {
    use clap::CommandFactory;

    let command = Cli::command().mut_subcommand("report", |report| {
        report
            .mut_arg("only_event", |arg| arg.visible_alias("event"))
            .mut_arg("only_pids", |arg| arg.visible_alias("pid"))
            .mut_arg("only_comm", |arg| arg.visible_alias("comm"))
            .mut_arg("only_module", |arg| {
                arg.visible_alias("module").alias("dso")
            })
    });
    short_help(perf::declare_refused(command))
}

/// `-h` shows each option's first sentence, cut at its first clause when that is still long;
/// `--help` shows it whole.
fn short_help(command: clap::Command) -> clap::Command {
    let command = command.mut_args(|arg| {
        let Some(help) = arg.get_help().map(ToString::to_string) else {
            return arg;
        };
        let short = short_line(&help);
        if short == help || arg.get_long_help().is_some() {
            return arg;
        }
        arg.long_help(help).help(short)
    });
    let names: Vec<String> = command
        .get_subcommands()
        .map(|sub| sub.get_name().to_string())
        .collect();
    names.iter().fold(command, |command, name| {
        command.mut_subcommand(name, short_help)
    })
}

/// Longest `-h` line of an option's help, in characters: with the option's name it fits 80
/// columns.
const SHORT_HELP: usize = 56;

/// The first sentence of `help`, cut at a clause (`:`, `;`, ` (`, `,`) when it is longer than
/// [`SHORT_HELP`].
fn short_line(help: &str) -> String {
    let sentence = help.split_once(". ").map_or(help, |(first, _)| first);
    let sentence = sentence.trim_end_matches('.');
    if sentence.chars().count() <= SHORT_HELP {
        return sentence.to_string();
    }
    // "With `--off-cpu`: ..." keeps what it is with, and is cut after it.
    let kept = match sentence.split_once(": ") {
        Some((with, _)) if with.starts_with("With ") => with.len() + 2,
        _ => 0,
    };
    [": ", "; ", " (", ", "]
        .iter()
        .filter_map(|mark| sentence[kept..].find(mark))
        .filter(|&at| at >= 12)
        .min()
        .map_or_else(
            || sentence.to_string(),
            |at| sentence[..kept + at].to_string(),
        )
}

/// Parses a command line as `main` does: clap's own checks, then perf's refused options and
/// `-a -- sleep TIME`, each refused as clap refuses (`error: ...`, usage, exit status 2).
pub fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut command = command();
    let matches = command.try_get_matches_from_mut(args)?;
    let name = matches.subcommand_name().unwrap_or_default().to_string();
    let mut refuse = |kind: ErrorKind, message: String| match command.find_subcommand_mut(&name) {
        Some(sub) => sub.error(kind, message),
        None => command.error(kind, message),
    };
    if let Some(message) = perf::refusal(&matches) {
        return Err(refuse(ErrorKind::ArgumentConflict, message));
    }
    let mut cli = Cli::from_arg_matches(&matches)?;
    let (all_cpus, command_line, duration) = match &mut cli.command {
        Command::Record(record) => (record.all_cpus, &mut record.command, &mut record.duration),
        Command::Stat(stat) => (stat.all_cpus, &mut stat.command, &mut stat.duration),
        _ => return Ok(cli),
    };
    let (resolved, sleep) =
        perf::system_wide_sleep(all_cpus, std::mem::take(command_line), *duration)
            .map_err(|(kind, message)| refuse(kind, message))?;
    *command_line = resolved;
    *duration = sleep;
    Ok(cli)
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
        let Ok(cli) = try_parse_from(line) else {
            return;
        };
        match cli.command {
            Command::Record(record) => {
                let _ = record.sampling.ring_buffer_bytes();
                let _ = record.report.view.rows();
            }
            Command::Report(report) => {
                let _ = report.report.view.rows();
            }
            Command::Stat(_) => {}
            Command::Agent(agent) => {
                let _ = agent.sampling.ring_buffer_bytes();
            }
            Command::Top(top) => {
                let _ = top.sampling.ring_buffer_bytes();
            }
            Command::List { .. } | Command::Completions { .. } => {}
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
                message.contains(&format!("'{value}' for '--duration <TIME>'"))
                    && message.contains("1s"),
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
    fn perfs_spellings_map_to_ours() {
        let parse = |args: &[&str]| try_parse_from(args).unwrap().command;
        let Command::Record(record) = parse(&[
            "profiler",
            "record",
            "-a",
            "-G",
            "system.slice",
            "--count",
            "5000",
            "--",
            "sleep",
            "2m",
        ]) else {
            panic!("not a record");
        };
        assert_eq!(record.sampling.cgroup, Some(PathBuf::from("system.slice")));
        assert_eq!(record.sampling.period, Some(5000));
        assert!(record.command.is_empty());
        assert_eq!(record.duration, Some(Duration::from_secs(120)));
        let Command::Stat(stat) = parse(&["profiler", "stat", "-a", "sleep", "0.5"]) else {
            panic!("not a stat");
        };
        assert!(stat.command.is_empty());
        assert_eq!(stat.duration, Some(Duration::from_millis(500)));
        let Command::Report(report) = parse(&[
            "profiler",
            "report",
            "--stdio",
            "-n",
            "-g",
            "--dso",
            "libc.so.6",
        ]) else {
            panic!("not a report");
        };
        assert_eq!(report.input, PathBuf::from(DEFAULT_PROFILE));
        assert_eq!(report.report.view.module.as_deref(), Some("libc.so.6"));
        let refused = |args: &[&str]| try_parse_from(args).unwrap_err();
        let error = refused(&["profiler", "record", "-a", "--", "sleep", "1x"]);
        assert_eq!(error.kind(), ErrorKind::InvalidValue);
        assert!(
            error.to_string().contains("sleep 1x: unknown unit 'x'"),
            "{error}"
        );
        let error = refused(&["profiler", "record", "-b", "--", "ls"]);
        assert_eq!(error.kind(), ErrorKind::ArgumentConflict);
        assert!(
            error
                .to_string()
                .starts_with("error: -b/--branch-any: no LBR"),
            "{error}"
        );
    }

    #[test]
    fn short_help_is_the_first_clause_that_says_enough() {
        assert_eq!(short_line("Stop after this long."), "Stop after this long");
        assert_eq!(
            short_line(
                "Only samples in this cgroup (v2 path, absolute or relative to the mount) and \
                 below."
            ),
            "Only samples in this cgroup"
        );
        assert_eq!(
            short_line(
                "With `--off-cpu`: blocks shorter than this are counted without stacks (`500us`)."
            ),
            "With `--off-cpu`: blocks shorter than this are counted without stacks"
        );
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
