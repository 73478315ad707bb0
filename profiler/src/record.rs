//! `profiler record`: launch or find the target, open and attach the counters, drain the maps
//! until the target exits, the duration ends or the user interrupts, then drain everything
//! that is left and assemble the profile.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use profiler_common::capture::{
    CaptureConfig, Fill, KernelOffsets, LossKind, CAPTURE_DATA_SOURCES, CAPTURE_EVENT_IDS,
    CAPTURE_FILTER_CGROUP, CAPTURE_FILTER_UID, CAPTURE_KERNEL_STACKS, CAPTURE_RAW,
    CAPTURE_USER_STACKS, MAX_EVENTS,
};
use tokio::{
    signal::unix::{signal, SignalKind},
    time::interval,
};

use crate::{
    aggregate::{code::capture_code, dataspace::capture_data_objects},
    capture::{
        counters::{open_sampling_counters, StackCapture, Target},
        hardware::{self, cpu_identity, hardware_sample_type, raw_decoding, samples_latency},
        program::{CaptureProgram, MapSizes, Ring},
        raw::RawStream,
        sideband::{ProcessTable, Sideband},
        stats::CaptureStats,
    },
    drain::{ibs::IbsStream, read_accounting, Accounting, Drained, Drainer},
    events::{EventSpec, PmuRegistry, Sampling, SystemFacts},
    launch::spawn_stopped,
    launch::TargetSpec,
    profile::{from_capture::assemble, EventInfo, Profile, ProfileMeta},
};

pub struct RecordOptions {
    pub events: Vec<EventSpec>,
    pub pmus: PmuRegistry,
    pub target: TargetSpec,
    pub duration: Option<Duration>,
    pub drain_interval: Duration,
    pub sizes: MapSizes,
    pub stacks: StackCapture,
    /// Stream every sample, in timestamp order, into this file (JSON lines).
    pub raw: Option<std::path::PathBuf>,
    /// Measure the capture's own cost.
    pub stats: bool,
    /// Keep only samples in these cgroups (ids).
    pub cgroups: Vec<u64>,
    pub uid: Option<u32>,
    /// The cgroup, container or user filter as the user gave it (`cgroup /sys/fs/cgroup/x`),
    /// for the report's title.
    pub scope: Option<String>,
    pub offsets: Option<KernelOffsets>,
}

/// The outcome of a recording: the profile, the capture's accounting and cost, and what the
/// command's exit said.
pub struct Recording {
    pub profile: Profile,
    pub accounting: Accounting,
    pub command_status: Option<std::process::ExitStatus>,
    pub stats: CaptureStats,
}

impl Recording {
    /// The `--stats` lines.
    pub fn stats_text(&self) -> String {
        self.stats
            .render(self.accounting.samples_fired.iter().sum())
    }
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

fn capture_config(options: &RecordOptions) -> CaptureConfig {
    let mut config = CaptureConfig::EMPTY;
    if let Some(offsets) = options.offsets {
        config.offsets = offsets;
    }
    let mut flags = 0;
    if options.stacks.user {
        flags |= CAPTURE_USER_STACKS;
    }
    if options.stacks.kernel {
        flags |= CAPTURE_KERNEL_STACKS;
    }
    if options.raw.is_some() {
        flags |= CAPTURE_RAW;
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

/// How often the side-band records (new mappings, exec, exit) are read.
const SIDEBAND_INTERVAL: Duration = Duration::from_millis(50);

/// Why the recording stopped.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    CommandExited,
    Duration,
    Interrupted,
}

pub async fn record(options: RecordOptions) -> Result<Recording> {
    if options.events.is_empty() || options.events.len() > MAX_EVENTS {
        return Err(anyhow!("record takes 1 to {MAX_EVENTS} events"));
    }
    if options.events.len() > 1 && options.offsets.is_none() {
        return Err(anyhow!(
            "sampling several events at once needs kernel BTF (/sys/kernel/btf/vmlinux) to tell \
             their samples apart: sample one event per run on this kernel"
        ));
    }
    let config = capture_config(&options);
    let facts = SystemFacts::read(&options.pmus);
    // While held, the kernel counts the program's runs and run time.
    let _stats_enabled = if options.stats {
        Some(
            aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .context("enabling BPF run-time statistics (BPF_ENABLE_STATS) for --stats")?,
        )
    } else {
        None
    };
    let cpu = cpu_identity();
    let raw_decoding = raw_decoding(&options.events, cpu.as_ref());
    let ibs_events = raw_decoding.ibs_events() != 0;
    let sizes = options.sizes.fitted(
        samples_latency(&options.events),
        options.raw.is_some(),
        ibs_events,
    );
    let mut program = CaptureProgram::load(&config, &raw_decoding, &sizes)?;
    program.filter_cgroups(&options.cgroups)?;
    let mut raw = match &options.raw {
        Some(path) => Some(RawStream::create(
            path,
            program.take_ring(Ring::RawSamples)?,
        )?),
        None => None,
    };
    let mut ibs = match ibs_events {
        true => Some(IbsStream::new(
            program.take_ring(Ring::IbsSamples)?,
            raw_decoding,
        )?),
        false => None,
    };

    let mut command = match &options.target {
        TargetSpec::Command(argv) => Some(spawn_stopped(argv)?),
        _ => None,
    };
    let target = match (&options.target, &command) {
        (TargetSpec::Command(_), Some(stopped)) => Target::Command(stopped.pid()?),
        (TargetSpec::Processes(pids), _) => Target::Processes(pids.clone()),
        _ => Target::System,
    };

    let mut processes = ProcessTable::default();
    let mut sideband = Sideband::open(&target, &options.pmus, &facts)?;
    match &target {
        Target::Processes(pids) => pids.iter().for_each(|pid| processes.scan_process(*pid)),
        Target::System => processes.scan_all(),
        Target::Command(_) => {}
    }
    let mut counters = open_sampling_counters(&options.events, &target, options.stacks, &facts)?;
    for counter in &mut counters {
        program.attach(&mut counter.counter)?;
        if config.flags & CAPTURE_EVENT_IDS != 0 {
            program.register_event(counter.counter.id(), counter.event)?;
        }
    }
    let start = SystemTime::now();
    if let Some(stopped) = &mut command {
        // Counters with enable_on_exec start when the command execs, which this releases.
        stopped.release()?;
    } else {
        sideband.enable()?;
        for counter in &mut counters {
            counter.counter.enable()?;
        }
    }

    let mut drained = Drained::default();
    let mut drainer = Drainer::default();
    let mut drain_time = Duration::ZERO;
    let mut drains = 0u32;
    let mut ticker = interval(options.drain_interval);
    ticker.tick().await;
    let mut sideband_ticker = interval(SIDEBAND_INTERVAL);
    sideband_ticker.tick().await;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let deadline = options.duration.map(|d| tokio::time::Instant::now() + d);
    let mut command_status = None;
    let stop = loop {
        let sleep_until_deadline = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        let raw_ready = async {
            match &raw {
                Some(stream) => stream.readable().await,
                None => std::future::pending().await,
            }
        };
        let ibs_ready = async {
            match &ibs {
                Some(stream) => stream.readable().await,
                None => std::future::pending().await,
            }
        };
        let command_exit = async {
            match &mut command {
                Some(stopped) => stopped.child.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // Mappings are read often so their files are opened while short-lived processes live.
            _ = sideband_ticker.tick() => {
                sideband.read_into(&mut processes);
                // The program wakes us only when the IBS ring is half full.
                if let Some(stream) = &mut ibs {
                    stream.read_into(&mut drained.ibs)?;
                }
                // Half full: drain now rather than lose samples to a full map at the next tick.
                let stacks_half_full =
                    drainer.fill(&program, Fill::StackCounts)? * 2 > u64::from(sizes.stack_counts);
                let histograms_half_full =
                    drainer.fill(&program, Fill::Histograms)? * 2 > u64::from(sizes.latencies);
                if stacks_half_full || histograms_half_full {
                    let started = Instant::now();
                    drainer.drain(&mut program, &mut drained)?;
                    drain_time += started.elapsed();
                    drains += 1;
                }
            }
            _ = ticker.tick() => {
                let started = Instant::now();
                sideband.read_into(&mut processes);
                drainer.drain(&mut program, &mut drained)?;
                drain_time += started.elapsed();
                drains += 1;
            }
            ready = raw_ready => {
                ready.context("waiting on the raw sample ring buffer")?;
                if let Some(stream) = &mut raw {
                    stream.write_ready()?;
                }
            }
            ready = ibs_ready => {
                ready.context("waiting on the IBS ring buffer")?;
                if let Some(stream) = &mut ibs {
                    stream.read_into(&mut drained.ibs)?;
                }
            }
            status = command_exit => {
                command_status = Some(status.context("waiting for the command")?);
                break Stop::CommandExited;
            }
            _ = sleep_until_deadline => break Stop::Duration,
            _ = interrupt.recv() => break Stop::Interrupted,
            _ = terminate.recv() => break Stop::Interrupted,
        }
    };
    for counter in &mut counters {
        counter.counter.disable()?;
    }
    sideband.disable()?;
    let duration = start.elapsed().unwrap_or_default();
    let started = Instant::now();
    sideband.read_into(&mut processes);
    drainer.drain_all(&mut program, &mut drained)?;
    drain_time += started.elapsed();
    drains += 2;
    if let Some(stream) = &mut raw {
        stream.finish()?;
    }
    let mut accounting = read_accounting(&program, options.events.len())?;
    if let Some(stream) = &mut ibs {
        stream.finish(&mut drained.ibs)?;
        accounting.losses[LossKind::IbsRegistersUnreadable as usize] += stream.unreadable();
    }
    let (program_runs, program_run_time) = program.run_statistics()?;
    let stats = CaptureStats {
        program_runs,
        program_run_time,
        map_bytes: program.map_memory()?,
        drain_time,
        drains,
        raw_samples_written: raw.as_ref().map_or(0, RawStream::written),
    };

    if stop != Stop::CommandExited {
        if let Some(stopped) = &mut command {
            // The user stopped profiling: the launched command does not outlive the profiler.
            let _ = stopped.child.start_kill();
            command_status = stopped.child.wait().await.ok();
        }
    }

    let meta = ProfileMeta {
        profiler_version: env!("CARGO_PKG_VERSION").to_string(),
        hostname: hostname(),
        kernel_release: kernel_release(),
        target: match (&options.target, &options.scope) {
            (TargetSpec::System, Some(scope)) => scope.clone(),
            (target, Some(scope)) => format!("{} ({scope})", target.describe()),
            (target, None) => target.describe(),
        },
        start_unix_ns: unix_ns(start),
        duration_ns: duration.as_nanos() as u64,
    };
    let events = options.events.iter().map(event_info).collect();
    let mut profile = assemble(meta, events, drained, &processes, &accounting);
    profile.hardware.cpu = cpu;
    // What offline reports need from files that may be gone by then: the sampled functions'
    // code and the processes' data mappings and variables.
    capture_code(&mut profile);
    capture_data_objects(&mut profile, &processes);
    Ok(Recording {
        profile,
        accounting,
        command_status,
        stats,
    })
}
