//! The agent's log: one line per message on standard error, `profiler agent: LEVEL: text`, kept
//! or dropped by `--log-level`. An always-on agent logs what an operator acts on (a window
//! exported, an export failed, samples lost); per-window details are `debug`.

use std::sync::atomic::{AtomicU8, Ordering};

/// `--log-level`: the least severe messages printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum LogLevel {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl LogLevel {
    fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warning",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Info as u8);

/// Sets the least severe level printed, for the whole process.
pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

/// Whether messages of `level` are printed.
pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// Prints `message` at `level`, when that level is on.
pub fn log(level: LogLevel, message: impl std::fmt::Display) {
    if enabled(level) {
        eprintln!("profiler agent: {}: {message}", level.name());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_print_what_is_at_least_as_severe() {
        set_level(LogLevel::Warn);
        assert!(enabled(LogLevel::Error) && enabled(LogLevel::Warn));
        assert!(!enabled(LogLevel::Info) && !enabled(LogLevel::Debug));
        set_level(LogLevel::Info);
        assert!(enabled(LogLevel::Info) && !enabled(LogLevel::Debug));
    }
}
