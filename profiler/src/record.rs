//! `profiler record`: launch or find the target, open and attach the counters, drain the maps
//! until the target exits, the duration ends or the user interrupts, then drain everything
//! that is left ([`record`] returns the [`Capture`]) and assemble the profile
//! ([`Capture::assemble`], slow on a big run, so the caller runs it where signals still reach).
//!
//! A launched command is never killed outright: a stop signal is forwarded to it and `--duration`
//! sends it SIGTERM; recording goes on until it exits, for at most [`GRACE`] or until a second
//! signal, after which it is killed. The recording's outcome says how the command ended.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use anyhow::{anyhow, Context, Result};
use profiler_common::capture::{
    CaptureConfig, KernelOffsets, CAPTURE_DATA_SOURCES, CAPTURE_EVENT_IDS, CAPTURE_FILTER_CGROUP,
    CAPTURE_FILTER_UID, CAPTURE_INSTRUCTIONS, CAPTURE_KERNEL_STACKS, CAPTURE_QUIET_NEW_PROCESSES,
    CAPTURE_RAW, CAPTURE_STACK_COPY, CAPTURE_UNWIND_DWARF, CAPTURE_USER_STACKS,
    STACK_COPY_PAGE_BYTES,
};

use crate::{
    aggregate::{code::capture_code, dataspace::capture_data_objects},
    assemble::drained::assemble,
    capture::{
        counters::{EventCounter, StackCapture},
        hardware::{self, hardware_sample_type},
        maps::MapSizes,
        offcpu::OffCpuOptions,
        session::CaptureSession,
        stats::{CaptureStats, MapMemory},
    },
    cli::Unwind,
    drain::{Accounting, Drained},
    events::{EventSpec, PmuRegistry, Sampling},
    launch::{Ending, StopSignals, TargetSpec},
    output::Output,
    process::ProcessTable,
    profile::{EventInfo, Profile, ProfileMeta},
    stat::count::Count,
    symbolize::{
        kernel_addresses::{hide_kernel_addresses, kernel_addresses_shown},
        FrameAddresses, FrameTable, KnownFrames, ReadAhead, SymbolCache,
    },
};

pub struct RecordOptions {
    pub events: Vec<EventSpec>,
    pub pmus: PmuRegistry,
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub drain_interval: Duration,
    /// How often the side-band is read (see [`crate::capture::session::SIDEBAND_INTERVAL`]).
    pub sideband_interval: Duration,
    pub sizes: MapSizes,
    pub stacks: StackCapture,
    /// `--unwind copy`: KiB of user stack each sample copies for the agent to unwind.
    pub stack_copy_kib: Option<u32>,
    pub unwind: Unwind,
    /// Stream every sample, in timestamp order, into this output (JSON lines).
    pub raw: Option<Output>,
    /// Measure the capture's own cost.
    pub stats: bool,
    /// Keep only samples in these cgroups (ids).
    pub cgroups: Vec<u64>,
    pub uid: Option<u32>,
    /// The cgroup, container or user filter as the user gave it (`cgroup /sys/fs/cgroup/x`),
    /// for the report's title.
    pub scope: Option<String>,
    pub offsets: Option<KernelOffsets>,
    /// Keep the command's arguments in the profile (see [`TargetSpec::describe`]).
    pub record_args: bool,
    /// `--off-cpu`: also record where the threads in scope wait.
    pub off_cpu: Option<OffCpuOptions>,
    /// Count samples per instruction (see [`CAPTURE_INSTRUCTIONS`]): what reports read, not
    /// the agent's exports.
    pub per_instruction: bool,
}

/// What a recording gathered, before the profile is assembled from it.
pub struct Capture {
    pub(crate) meta: ProfileMeta,
    pub(crate) events: Vec<EventInfo>,
    pub(crate) drained: Drained,
    pub(crate) processes: ProcessTable,
    pub(crate) cpu: Option<crate::profile::CpuIdentity>,
    pub accounting: Accounting,
    pub stats: CaptureStats,
    pub ending: Ending,
    /// Outputs written during the recording that failed (the `--raw` stream).
    pub failures: Vec<anyhow::Error>,
}

/// The outcome of a recording: the profile, the capture's accounting and cost, how it ended.
pub struct Recording {
    pub profile: Profile,
    pub accounting: Accounting,
    pub stats: CaptureStats,
    pub ending: Ending,
    pub failures: Vec<anyhow::Error>,
}

impl Recording {
    /// The `--stats` lines.
    pub fn stats_text(&self) -> String {
        self.stats
            .render(self.accounting.samples_fired.iter().sum())
    }
}

impl Capture {
    /// Assembles the profile and reads what offline reports need from files that may be gone
    /// by then: the processes' data mappings and variables, and, with `with_code` (a profile
    /// file, or a report of one function's instructions), the sampled functions' code, which
    /// takes reading and line-mapping every sampled function.
    /// `symbols` and `known` hold what was symbolized during the recording (see
    /// [`ReadAhead`]).
    pub fn assemble(self, with_code: bool, symbols: &SymbolCache, known: KnownFrames) -> Recording {
        let frames = FrameTable::with_known(
            &self.processes,
            Some(symbols),
            FrameAddresses::Runtime,
            known,
        );
        let mut profile = assemble(
            self.meta,
            self.events,
            self.drained,
            &self.accounting,
            frames,
        );
        profile.hardware.cpu = self.cpu;
        // What offline reports need from files that may be gone by then: the sampled functions'
        // code and the processes' data mappings and variables.
        // One symbolizer for the frames and the code's lines: a module's parse (glibc's debug
        // file takes 30-40 ms to decompress) serves both.
        if with_code {
            capture_code(&mut profile, &self.processes, &symbols.symbolizer());
        }
        capture_data_objects(&mut profile, &self.processes);
        // The profile file, exports and reports alike.
        if !kernel_addresses_shown() {
            hide_kernel_addresses(&mut profile);
        }
        Recording {
            profile,
            accounting: self.accounting,
            stats: self.stats,
            ending: self.ending,
            failures: self.failures,
        }
    }
}

/// What the sampling counters counted, per event: each counter's reading (inherited children
/// included) scaled for multiplexing, summed over its placements.
///
/// A clock counts the nanoseconds it runs, so its count is at most its running time. The
/// kernel's task-clock overshoots that when its timer is saturated (every 10 us: 1.1 to 6
/// times its running time here, exact from 20 us up), which would inflate every estimate.
pub(crate) fn event_counts(counters: &mut [EventCounter], events: usize) -> Result<Vec<u64>> {
    let mut totals = vec![0u64; events];
    for counter in counters {
        let reading = counter
            .counter
            .read_count_and_time()
            .context("reading a sampling counter's count")?;
        let raw = if counter.clock {
            reading.count.min(reading.time_running)
        } else {
            reading.count
        };
        let count = Count::from_reading(raw, reading.time_enabled, reading.time_running);
        totals[counter.event as usize] += count.estimate;
    }
    Ok(totals)
}

/// What reports say about an event.
pub fn event_info(spec: &EventSpec) -> EventInfo {
    let (period, frequency) = match spec.sampling {
        Sampling::Period(period) => (Some(period), None),
        Sampling::Frequency(hz) => (None, Some(hz)),
    };
    EventInfo {
        name: spec.report_name(),
        period,
        frequency,
        unit: spec.unit.clone(),
        precise: hardware::exact_ip(spec),
    }
}

/// The first kernel with the helpers the unwinder reads a task's user registers with
/// (`bpf_get_current_task_btf` 5.11, `bpf_task_pt_regs` 5.15).
const UNWINDER_KERNEL: (u32, u32) = (5, 15);

/// `major.minor` of a kernel release string (`6.1.0-50-cloud-amd64`).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// How user stacks are walked on this kernel: `--unwind dwarf` needs 5.15; before it, frame
/// pointers (and for `check`, the copies alone), with a note.
fn unwind_on_this_kernel(asked: Unwind) -> Unwind {
    let release = kernel_release();
    match (asked, kernel_version(&release)) {
        (Unwind::Dwarf | Unwind::Check, Some(version)) if version < UNWINDER_KERNEL => {
            let (name, instead, fallback) = match asked {
                Unwind::Check => (
                    "check",
                    "unwound from copies only, with nothing to compare",
                    Unwind::Copy,
                ),
                _ => ("dwarf", "walked by frame pointers", Unwind::Fp),
            };
            eprintln!(
                "note: --unwind {name} needs Linux {}.{} or later (bpf_task_pt_regs); this \
                 kernel is {release}: user stacks are {instead}",
                UNWINDER_KERNEL.0, UNWINDER_KERNEL.1
            );
            fallback
        }
        _ => asked,
    }
}

pub(crate) fn capture_config(options: &RecordOptions) -> CaptureConfig {
    let mut config = CaptureConfig::EMPTY;
    if let Some(offsets) = options.offsets {
        config.offsets = offsets;
    }
    let mut flags = 0;
    if options.stacks.user {
        flags |= CAPTURE_USER_STACKS;
        if unwind_on_this_kernel(options.unwind).walks_tables() {
            flags |= CAPTURE_UNWIND_DWARF;
            if options.target == TargetSpec::System {
                flags |= CAPTURE_QUIET_NEW_PROCESSES;
            }
        }
    }
    if options.stacks.kernel {
        flags |= CAPTURE_KERNEL_STACKS;
    }
    if options.raw.is_some() {
        flags |= CAPTURE_RAW;
    }
    if options.per_instruction {
        flags |= CAPTURE_INSTRUCTIONS;
    }
    if !options.cgroups.is_empty() {
        flags |= CAPTURE_FILTER_CGROUP;
    }
    if let Some(uid) = options.uid {
        flags |= CAPTURE_FILTER_UID;
        config.uid = uid;
    }
    if options.events.len() > 1 {
        flags |= CAPTURE_EVENT_IDS;
    }
    if let Some(kib) = options.stack_copy_kib {
        flags |= CAPTURE_STACK_COPY;
        // The stack pointer's page, from below the pointer, and enough pages above it.
        let page_kib = (STACK_COPY_PAGE_BYTES / 1024) as u32;
        config.stack_copy_pages = kib.div_ceil(page_kib) + 1;
    }
    let reports_data_sources = options
        .events
        .iter()
        .any(|spec| hardware_sample_type(spec, false).0 & hardware::sample::DATA_SRC != 0);
    if reports_data_sources {
        flags |= CAPTURE_DATA_SOURCES;
    }
    config.flags = flags;
    config
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

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Enables the kernel's BPF run-time statistics (`record --stats`, `agent --bpf-stats`) while
/// held, when they are not on already; without the privilege (CAP_SYS_ADMIN) says so and goes
/// on without them.
pub(crate) fn enable_run_statistics() -> Option<std::os::fd::OwnedFd> {
    let already_on = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .is_ok_and(|value| value.trim() == "1");
    if already_on {
        return None;
    }
    match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(e) => {
            eprintln!(
                "note: the programs' cost in the kernel is not measured: enabling BPF run-time \
                 statistics needs CAP_SYS_ADMIN or kernel.bpf_stats_enabled=1 ({})",
                e.io_error
            );
            None
        }
    }
}

/// Kernel memory locked by the BPF maps this process holds (fdinfo memlock), read from its own
/// descriptors: looking maps up by id would need CAP_SYS_ADMIN.
pub(crate) fn held_map_memory() -> MapMemory {
    // The kernel sizes per-CPU values for the possible CPUs.
    let cpus = aya::util::nr_cpus().map_or(1, |cpus| cpus as u64);
    let mut memory = MapMemory {
        cpus,
        ..MapMemory::default()
    };
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return memory;
    };
    for entry in entries.flatten() {
        let is_map = std::fs::read_link(entry.path())
            .is_ok_and(|link| link.as_os_str() == "anon_inode:bpf-map");
        if !is_map {
            continue;
        }
        let fdinfo = Path::new("/proc/self/fdinfo").join(entry.file_name());
        if let Ok(text) = std::fs::read_to_string(fdinfo) {
            memory += MapMemory::of_fdinfo(&text, cpus).unwrap_or_default();
        }
    }
    memory
}

/// Capability numbers (linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// Whether this process holds capability `cap` (CapEff in /proc/self/status).
fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status
                .lines()
                .find_map(|line| line.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|effective| effective & (1 << cap) != 0)
}

/// Whether /proc/kallsyms hides addresses from this process (`kernel.kptr_restrict`, or
/// `perf_event_paranoid` above 1 without CAP_SYSLOG): kernel frames cannot be named then.
fn kernel_symbols_hidden() -> bool {
    let mut first = String::new();
    let read = std::fs::File::open("/proc/kallsyms").and_then(|file| {
        std::io::BufRead::read_line(&mut std::io::BufReader::new(file), &mut first)
    });
    read.is_err()
        || first
            .split_whitespace()
            .next()
            .is_none_or(|address| address.bytes().all(|b| b == b'0'))
}

/// Checks, before anything starts, what the run needs beyond opening counters and loading the
/// program: reading the mappings and files of the processes it profiles (ptrace access), and
/// kernel symbols. A `-p` process that cannot be read is an error; the rest are notes, returned.
pub(crate) fn check_privileges(options: &RecordOptions) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    match &options.target {
        TargetSpec::Processes(pids) => {
            for pid in pids {
                let maps = format!("/proc/{pid}/maps");
                let readable = std::fs::File::open(&maps)
                    .and_then(|mut file| std::io::Read::read(&mut file, &mut [0u8; 1]))
                    .and_then(|_| std::fs::read_link(format!("/proc/{pid}/root")));
                match readable {
                    // A process that does not exist is reported where its counters are opened.
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(anyhow!(
                            "-p {pid}: cannot read the process's mappings and files \
                             ({maps}, /proc/{pid}/root: {e}), so its code could not be named: \
                             profile it as its own user, or with CAP_SYS_PTRACE"
                        ));
                    }
                }
            }
        }
        // SAFETY: geteuid has no preconditions.
        TargetSpec::System
            if unsafe { libc::geteuid() } != 0 && !has_capability(CAP_SYS_PTRACE) =>
        {
            notes.push(
                "without CAP_SYS_PTRACE, other users' processes cannot be read: their samples \
                 are counted but their code is not named"
                    .to_string(),
            );
        }
        _ => {}
    }
    if options.stacks.kernel && kernel_symbols_hidden() {
        notes.push(
            "kernel symbols are hidden from this user (kernel.kptr_restrict, or \
             kernel.perf_event_paranoid above 1 without CAP_SYSLOG): kernel frames are not named; \
             --no-kernel-stacks leaves them out"
                .to_string(),
        );
    }
    Ok(notes)
}

/// Records until the target exits, the duration ends or the user interrupts: one window.
/// What it samples is symbolized meanwhile, a drain interval at a time: the profile is
/// assembled with the returned [`ReadAhead`]'s cache.
pub async fn record(
    options: RecordOptions,
    signals: &mut StopSignals,
) -> Result<(Capture, ReadAhead)> {
    let mut session = CaptureSession::open(&options)?;
    let mut ahead = ReadAhead::start(true)?;
    session.start(&options.target).await?;
    let stop = loop {
        let next = Instant::now() + options.drain_interval;
        if let Some(stop) = session.run_until(Some(next), signals).await? {
            break stop;
        }
        session.read_ahead(&mut ahead);
    };
    Ok((session.finish(stop, &options)?, ahead))
}

/// The recording's target as reports name it: the command, processes or the whole system,
/// with the cgroup, container or user filter.
pub fn target_description(options: &RecordOptions) -> String {
    match (&options.target, &options.scope) {
        (TargetSpec::System, Some(scope)) => scope.clone(),
        (target, Some(scope)) => format!("{} ({scope})", target.describe(options.record_args)),
        (target, None) => target.describe(options.record_args),
    }
}

/// What a profile says about a recording of `target` that ran from `start` to `end`.
pub fn profile_meta(target: String, start: SystemTime, end: SystemTime) -> ProfileMeta {
    ProfileMeta {
        profiler_version: env!("CARGO_PKG_VERSION").to_string(),
        hostname: hostname(),
        kernel_release: kernel_release(),
        target,
        start_unix_ns: unix_ns(start),
        duration_ns: end.duration_since(start).unwrap_or_default().as_nanos() as u64,
        architecture: std::env::consts::ARCH.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_release_strings() {
        assert_eq!(kernel_version("5.10.0-32-cloud-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("5.10.0").unwrap() < UNWINDER_KERNEL);
        assert!(kernel_version("5.15.0").unwrap() >= UNWINDER_KERNEL);
    }
}
