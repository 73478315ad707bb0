//! What a capture session hands over: a window of samples at address level (each agent
//! interval, and the session's end), and at the end how the run ended and what it cost.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::{
    capture::stats::{CaptureStats, ProgramRuns},
    drain::{Accounting, Drained},
    launch::Ending,
    process::ProcessTable,
    profile::{CpuIdentity, EventInfo, ProfileMeta},
    unwind::loader::TablesLoaded,
};

/// What one window of a capture holds, at address level: symbolized off the capture thread.
pub struct Capture {
    pub start: SystemTime,
    pub end: SystemTime,
    pub drained: Drained,
    /// The processes the window's samples reference, as they were when it closed (at the
    /// session's end: the whole process table).
    pub processes: ProcessTable,
    /// The samples fired, lost and filtered over the window.
    pub accounting: Accounting,
    /// The programs' run-time statistics since they were loaded (zero while they are off).
    pub programs: Vec<ProgramRuns>,
    /// The unwind tables loaded as it closed (`--unwind dwarf`; `None` at the session's end).
    pub unwind_tables: Option<TablesLoaded>,
}

/// What the session's end adds to its last window.
pub struct SessionEnd {
    /// The events sampled, as reports describe them.
    pub events: Vec<EventInfo>,
    /// The CPU the samples were taken on (model, for hardware event names).
    pub cpu: Option<CpuIdentity>,
    pub stats: CaptureStats,
    pub ending: Ending,
    /// Outputs written during the recording that failed (the `--raw` stream).
    pub failures: Vec<anyhow::Error>,
}

impl Capture {
    /// What a profile of this window of a capture of `target` says about it.
    pub fn profile_meta(&self, target: String) -> ProfileMeta {
        ProfileMeta {
            profiler_version: env!("CARGO_PKG_VERSION").to_string(),
            hostname: hostname(),
            kernel_release: kernel_release(),
            target,
            start_unix_ns: unix_ns(self.start),
            duration_ns: self
                .end
                .duration_since(self.start)
                .unwrap_or_default()
                .as_nanos() as u64,
            architecture: std::env::consts::ARCH.to_string(),
        }
    }
}

fn unix_ns(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub(super) fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
