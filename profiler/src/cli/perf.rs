//! perf's habits: the options perf users type that have no counterpart here are refused by name
//! with what to use instead (never run as the command, never a bare "unexpected argument"), and
//! `-a -- sleep TIME`, perf's way to give a system-wide run a length, is `-a --duration TIME`.

use std::time::Duration;

use clap::{error::ErrorKind, parser::ValueSource, Arg, ArgAction, ArgMatches};

/// What a refused option takes on the command line, so that its value is not read as the command.
#[derive(Clone, Copy)]
enum Takes {
    Nothing,
    Value,
    /// `--switch-output[=WHEN]`.
    OptionalValue,
}

/// A perf option this profiler does not take, and what to use instead.
struct Refused {
    subcommand: &'static str,
    long: &'static str,
    short: Option<char>,
    takes: Takes,
    instead: &'static str,
}

const NO_LBR: &str = "no LBR here (branch stacks need a hardware PMU's branch records): call \
    stacks are walked with --unwind dwarf (the default) or fp";
const NO_CPU_LIST: &str = "a list of CPUs is not profiled alone here: use -a (every CPU)";
const NO_TID: &str = "threads are not profiled alone here: use -p PID (the thread's process, \
    every thread) and the report's --only-comm NAME for the thread's name";

const REFUSED: &[Refused] = &[
    Refused {
        subcommand: "record",
        long: "branch-any",
        short: Some('b'),
        takes: Takes::Nothing,
        instead: NO_LBR,
    },
    Refused {
        subcommand: "record",
        long: "branch-filter",
        short: Some('j'),
        takes: Takes::Value,
        instead: NO_LBR,
    },
    Refused {
        subcommand: "record",
        long: "user-regs",
        short: None,
        takes: Takes::Value,
        instead: "registers are not sampled on their own: --unwind copy sends each sample's user \
            registers and stack to the profiler, which unwinds them",
    },
    Refused {
        subcommand: "record",
        long: "switch-output",
        short: None,
        takes: Takes::OptionalValue,
        instead: "a file per period is the agent's job: profiler agent --interval 10s \
            --output-dir DIR",
    },
    Refused {
        subcommand: "record",
        long: "mmap-pages",
        short: Some('m'),
        takes: Takes::Value,
        instead: "the ring buffers are sized with --ring-buffer-kib KIB",
    },
    Refused {
        subcommand: "record",
        long: "quiet",
        short: Some('q'),
        takes: Takes::Nothing,
        instead: "the report and notes go to standard error: write the report elsewhere with \
            --report FILE (or redirect 2>/dev/null)",
    },
    Refused {
        subcommand: "record",
        long: "cpu",
        short: Some('C'),
        takes: Takes::Value,
        instead: NO_CPU_LIST,
    },
    Refused {
        subcommand: "record",
        long: "tid",
        short: Some('t'),
        takes: Takes::Value,
        instead: NO_TID,
    },
    Refused {
        subcommand: "record",
        long: "data",
        short: Some('d'),
        takes: Takes::Nothing,
        instead: "data addresses are recorded with every event that has them (page faults; \
            PEBS, IBS and SPE's precise events): report them with --by dcache-line",
    },
    Refused {
        subcommand: "record",
        long: "weight",
        short: Some('W'),
        takes: Takes::Nothing,
        instead: "latencies are recorded with every event that has them (precise memory \
            events): report them with --histogram",
    },
    Refused {
        subcommand: "record",
        long: "timestamp",
        short: Some('T'),
        takes: Takes::Nothing,
        instead: "samples are counted in the kernel, not kept one by one: --raw FILE also \
            keeps every sample with its time",
    },
    Refused {
        subcommand: "report",
        long: "percent-limit",
        short: None,
        takes: Takes::Value,
        instead: "rows are limited by number: --top N",
    },
    Refused {
        subcommand: "stat",
        long: "repeat",
        short: Some('r'),
        takes: Takes::Value,
        instead: "one run is counted: repeat it in the shell (for i in 1 2 3; do profiler stat \
            --json -o run-$i.json -- CMD; done)",
    },
    Refused {
        subcommand: "stat",
        long: "field-separator",
        short: Some('x'),
        takes: Takes::Value,
        instead: "no CSV here: --json writes every count for other programs",
    },
    Refused {
        subcommand: "stat",
        long: "interval-print",
        short: Some('I'),
        takes: Takes::Value,
        instead: "counts are printed once, at the end: for a profile every interval, profiler \
            agent --interval TIME",
    },
    Refused {
        subcommand: "stat",
        long: "cpu",
        short: Some('C'),
        takes: Takes::Value,
        instead: NO_CPU_LIST,
    },
    Refused {
        subcommand: "stat",
        long: "tid",
        short: Some('t'),
        takes: Takes::Value,
        instead: NO_TID,
    },
];

/// The id of a refused option's argument: its own, so that it never meets a real one.
fn id(refused: &Refused) -> String {
    format!("perf_{}", refused.long)
}

/// `command` with perf's refused options declared (hidden) on their subcommands, so that clap
/// reads them, and their values, as options.
pub fn declare_refused(command: clap::Command) -> clap::Command {
    REFUSED.iter().fold(command, |command, refused| {
        command.mut_subcommand(refused.subcommand, |sub| {
            let arg = Arg::new(id(refused))
                .long(refused.long)
                .hide(true)
                .help(refused.instead);
            let arg = match refused.short {
                Some(short) => arg.short(short),
                None => arg,
            };
            sub.arg(match refused.takes {
                Takes::Nothing => arg.action(ArgAction::SetTrue),
                Takes::Value => arg.action(ArgAction::Set).num_args(1),
                Takes::OptionalValue => arg
                    .action(ArgAction::Set)
                    .num_args(0..=1)
                    .require_equals(true),
            })
        })
    })
}

/// The message for the first refused option given: `--branch-any: no LBR here ...`.
pub fn refusal(matches: &ArgMatches) -> Option<String> {
    let (name, sub) = matches.subcommand()?;
    REFUSED
        .iter()
        .filter(|refused| refused.subcommand == name)
        .find(|refused| sub.value_source(&id(refused)) == Some(ValueSource::CommandLine))
        .map(|refused| {
            let short = refused
                .short
                .map_or(String::new(), |short| format!("-{short}/"));
            format!("{short}--{}: {}", refused.long, refused.instead)
        })
}

/// perf's `-a -- sleep TIME`: every CPU for TIME, as `-a --duration TIME`. Any other command
/// with `-a` is refused: perf would profile the whole system while it runs, which is not done
/// here. Returns the command and duration to run with.
pub fn system_wide_sleep(
    all_cpus: bool,
    command: Vec<String>,
    duration: Option<Duration>,
) -> Result<(Vec<String>, Option<Duration>), (ErrorKind, String)> {
    if !all_cpus || command.is_empty() {
        return Ok((command, duration));
    }
    let sleep = match &command[..] {
        [program, time] if program == "sleep" => crate::duration::seconds(time)
            .map_err(|error| (ErrorKind::InvalidValue, format!("sleep {time}: {error}")))?,
        _ => {
            return Err((
                ErrorKind::ArgumentConflict,
                format!(
                    "-a profiles every CPU for a time, not while '{}' runs: give -a --duration \
                     TIME (or perf's -a -- sleep TIME), or the command alone",
                    command.join(" ")
                ),
            ))
        }
    };
    if duration.is_some() {
        return Err((
            ErrorKind::ArgumentConflict,
            "-a -- sleep TIME is perf's --duration TIME: give one of them".to_string(),
        ));
    }
    Ok((Vec::new(), Some(sleep)))
}
