//! Command-line arguments as the user writes them (clap). Resolving them into options is done by
//! the commands.

use clap::{Args, Parser, Subcommand};

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
    /// Sample a command, processes or the whole system and print a report.
    Record(RecordArgs),
    /// Count events exactly over a command, processes or the whole system.
    Stat(crate::stat::StatArgs),
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Samples per second per CPU (the kernel adjusts the overflow period).
    #[arg(
        short = 'F',
        long = "freq",
        value_name = "HZ",
        conflicts_with = "period"
    )]
    pub frequency: Option<u64>,
    /// Sample every N events (the overflow value).
    #[arg(short = 'c', long, value_name = "N")]
    pub period: Option<u64>,
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
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// How often the agent drains the kernel maps, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub drain_interval: u64,
    /// Entries of the stack map (per generation): more entries, fewer hash collisions.
    #[arg(long, value_name = "N", default_value_t = 16384)]
    pub stack_map_entries: u32,
    /// Do not collect kernel call stacks.
    #[arg(long)]
    pub no_kernel_stacks: bool,
    /// Functions in the report.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
    /// Hot call paths in the report.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub paths: usize,
    /// Print the report as JSON (schema profiler.report/1).
    #[arg(long)]
    pub json: bool,
    /// The command to launch and profile.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl RecordArgs {
    pub fn duration(&self) -> Option<std::time::Duration> {
        self.duration.map(std::time::Duration::from_secs_f64)
    }
}
