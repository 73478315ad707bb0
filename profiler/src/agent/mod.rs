//! `profiler agent`: continuous profiling. One capture session runs until SIGTERM or SIGINT;
//! every `--interval` it closes a window and hands it, at address level, to the export thread,
//! which symbolizes it into a profile and passes it to every sink (`--output-dir`, ...). The
//! capture thread never waits for symbolization or export: when the export thread falls more
//! than [`QUEUED_WINDOWS`] behind, a window is dropped and counted. On SIGTERM the last,
//! partial window is exported and the agent exits.

pub mod log;
pub mod output_dir;

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError},
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, UNIX_EPOCH},
};

use anyhow::{anyhow, bail, Context, Result};
use profiler_common::{capture::LossKind, offcpu::OffCpuCount};

use self::log::{log, LogLevel};
use crate::{
    aggregate::dataspace::capture_data_objects,
    assemble::drained::assemble,
    capture::session::{CaptureSession, WindowCapture, AGENT_SIDEBAND_INTERVAL},
    cli::{seconds, SamplingArgs, Unwind},
    commands::{capture_options, target_of},
    export::upload::UploadCounts,
    export::{
        offcpu::add_off_cpu_event,
        otlp::otlp_sink,
        pyroscope::pyroscope_sink,
        series::ServiceName,
        sink::{Window, WindowSink},
    },
    launch::{signal_name, Stop, StopSignals},
    profile::{CpuIdentity, EventInfo, Profile},
    prometheus::{serve, Kind, Metrics},
    record::{profile_meta, target_description, RecordOptions},
    symbolize::{
        kernel_addresses::{hide_kernel_addresses, kernel_addresses_shown},
        FrameAddresses, FrameTable, SymbolCache,
    },
};

/// Windows waiting for the export thread at most; more are dropped, not queued without bound.
const QUEUED_WINDOWS: usize = 4;
/// Samples per second per CPU when no event or rate is given: the fleet profilers' rate.
const DEFAULT_FREQUENCY: u64 = 99;

/// `profiler agent` arguments.
#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Close a window and export it this often, in seconds.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = seconds)]
    pub interval: f64,
    /// Write one gzipped pprof file per window into this directory.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Bytes the `--output-dir` profiles may take (suffixes K, M, G); the oldest are removed.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = byte_size)]
    pub max_disk: u64,
    /// Push each window to Grafana Pyroscope at this URL (`http://host:4040`).
    #[arg(long, value_name = "URL")]
    pub pyroscope: Option<String>,
    /// With `--pyroscope`: the tenant of a multi-tenant server (its `X-Scope-OrgID`).
    #[arg(long, value_name = "ID", requires = "pyroscope")]
    pub pyroscope_tenant: Option<String>,
    /// Send each window as OpenTelemetry profiles over OTLP/HTTP to this URL
    /// (`http://collector:4318`).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
    /// How `--pyroscope` and `--otlp` name a process's service: auto (its container, else its
    /// systemd service, else its executable), executable, unit, container, or =NAME.
    #[arg(long, value_name = "RULE", default_value = "auto", value_parser = ServiceName::parse)]
    pub service_name: ServiceName,
    /// Where windows a backend cannot take now wait until it can (a subdirectory per backend).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/profiler/spool")]
    pub spool_dir: PathBuf,
    /// Bytes each backend's spool may hold (suffixes K, M, G); past it the oldest windows are
    /// dropped and counted.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = byte_size)]
    pub spool_max: u64,
    /// Serve Prometheus metrics about the agent on `http://HOST:PORT/metrics`.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// Give frames their source lines and inlined functions, read from DWARF debug information.
    /// Without it functions are named from symbol tables (a separate debug file's too), which
    /// keeps the agent's memory small: DWARF is parsed once per file and kept, tens of MB for
    /// a large program or glibc's debug file.
    #[arg(long)]
    pub source_lines: bool,
    /// The least severe messages logged to standard error.
    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// Turn the kernel's BPF run-time statistics on while the agent runs, so that the metrics
    /// carry its programs' time in the kernel (`profiler_bpf_run_seconds_total`,
    /// `profiler_bpf_runs_total`). Every BPF program on the machine then reads the clock twice
    /// per run. Without it they are exported when `kernel.bpf_stats_enabled` is 1 already.
    #[arg(long)]
    pub bpf_stats: bool,
}

/// A backend's URL: http or https, said before the agent starts rather than at the first window.
fn backend_url<'a>(option: &str, url: &'a str) -> Result<&'a str> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(url)
    } else {
        bail!("{option} {url}: give the backend's http:// or https:// URL")
    }
}

/// `--max-disk`: a number of bytes with an optional K, M or G suffix (powers of 1024).
fn byte_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("unknown unit '{unit}': give bytes, or K, M or G")),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| "give a size such as 500M or 2G".to_string())?;
    match number.checked_mul(1 << shift) {
        Some(0) => Err("give a size above 0".into()),
        Some(bytes) => Ok(bytes),
        None => Err("too large".into()),
    }
}

impl AgentArgs {
    fn interval(&self) -> Duration {
        // `cli::seconds` checked that the value fits.
        Duration::from_secs_f64(self.interval)
    }

    /// The sinks asked for; at least one.
    fn sinks(&self) -> Result<Vec<Box<dyn WindowSink>>> {
        let mut sinks: Vec<Box<dyn WindowSink>> = Vec::new();
        if let Some(dir) = &self.output_dir {
            sinks.push(Box::new(output_dir::OutputDirSink::new(
                dir,
                self.max_disk,
            )?));
        }
        if let Some(url) = &self.pyroscope {
            sinks.push(Box::new(pyroscope_sink(
                backend_url("--pyroscope", url)?,
                self.pyroscope_tenant.as_deref(),
                self.service_name.clone(),
                &self.spool_dir.join("pyroscope"),
                self.spool_max,
            )?));
        }
        if let Some(url) = &self.otlp {
            sinks.push(Box::new(otlp_sink(
                backend_url("--otlp", url)?,
                self.service_name.clone(),
                &self.spool_dir.join("otlp"),
                self.spool_max,
            )?));
        }
        if sinks.is_empty() {
            bail!(
                "nowhere to export the profiles: give --output-dir DIR, --pyroscope URL or \
                 --otlp URL"
            );
        }
        Ok(sinks)
    }
}

/// A closed window on its way to the export thread.
struct ClosedWindow {
    sequence: u64,
    capture: WindowCapture,
}

/// What the export thread needs besides the windows.
struct Exporter {
    /// The agent's target, as profiles name it.
    target: String,
    events: Vec<EventInfo>,
    cpu: Option<CpuIdentity>,
    sinks: Vec<Box<dyn WindowSink>>,
    metrics: Arc<Metrics>,
    /// `--source-lines`.
    source_lines: bool,
}

impl Exporter {
    /// Symbolizes a window into its profile.
    fn profile(&self, capture: WindowCapture, symbols: &mut SymbolCache) -> Profile {
        let meta = profile_meta(self.target.clone(), capture.start, capture.end);
        let frames = FrameTable::with_cache(
            &capture.processes,
            Some(symbols),
            FrameAddresses::FileOffsets,
        );
        let mut profile = assemble(
            meta,
            self.events.clone(),
            capture.drained,
            &capture.accounting,
            frames,
        );
        profile.hardware.cpu = self.cpu.clone();
        // What the sampled data addresses belong to, while the window's processes are at hand:
        // the exports name the variable, heap, stack or file of each data cache line.
        capture_data_objects(&mut profile, &capture.processes);
        // Off-CPU time goes to the backends as a profile type of its own: nanoseconds blocked.
        add_off_cpu_event(&mut profile);
        if !kernel_addresses_shown() {
            hide_kernel_addresses(&mut profile);
        }
        // With the window's share of the open files gone, what nobody else holds is closed.
        drop(capture.processes);
        symbols.forget_closed();
        profile
    }

    /// Exports windows until the capture side hangs up.
    fn run(mut self, windows: Receiver<ClosedWindow>) {
        // One symbolizer for every window: the files it parsed, the kernel's symbols and the
        // code symbolized stay cached, so a window costs what its new code costs. Made here: it
        // cannot move threads.
        let mut symbols = SymbolCache::new(self.source_lines).without_aliases();
        for ClosedWindow { sequence, capture } in windows {
            let exporting = std::time::Instant::now();
            let (start, end) = (capture.start, capture.end);
            let fired: u64 = capture.accounting.samples_fired.iter().sum();
            let lost = capture.accounting.samples_lost();
            self.count_samples(&capture);
            let profile = self.profile(capture, &mut symbols);
            // Sampled events only: the off-CPU "event" counts nanoseconds.
            let sampled = self.events.len() as u32;
            let samples: u64 = profile
                .stacks
                .iter()
                .filter(|stack| stack.event < sampled)
                .map(|stack| stack.count)
                .sum();
            let off_cpu = profile.off_cpu.as_ref().map_or(String::new(), |off_cpu| {
                let blocked: u64 = off_cpu.blocks.iter().map(|blocks| blocks.total_ns).sum();
                format!(", {:.3} s off-CPU", blocked as f64 / 1e9)
            });
            let window = Window {
                sequence,
                start,
                end,
                profile,
            };
            for sink in &mut self.sinks {
                let exported = sink.export(&window);
                let outcome = if exported.is_ok() { "ok" } else { "failed" };
                self.metrics.add(
                    "profiler_exports_total",
                    "Windows given to each backend, by outcome (failed: refused or dropped).",
                    &[("backend", sink.name()), ("outcome", outcome)],
                    1.0,
                );
                if let Some(counts) = sink.delivery() {
                    count_delivery(&self.metrics, sink.name(), &counts);
                }
                match exported {
                    Ok(()) => log(
                        LogLevel::Info,
                        format!(
                            "window {sequence}: {samples} samples ({fired} fired, {lost} lost)\
                             {off_cpu} exported to {}",
                            sink.name()
                        ),
                    ),
                    Err(error) => log(
                        LogLevel::Error,
                        format!(
                            "window {sequence}: export to {} failed: {error}",
                            sink.name()
                        ),
                    ),
                }
            }
            self.metrics.set(
                "profiler_window_export_seconds",
                Kind::Gauge,
                "Time the last window took to symbolize and export.",
                &[],
                exporting.elapsed().as_secs_f64(),
            );
            // The window, and what the capture side let go of since the last one (tables and
            // symbols of programs that exited), leave free pages behind.
            drop(window);
            crate::heap::release_free_pages();
        }
        for sink in &mut self.sinks {
            if let Err(error) = sink.finish() {
                log(
                    LogLevel::Error,
                    format!("last delivery to {} failed: {error}", sink.name()),
                );
            }
        }
    }

    /// Sample accounting of a window, added to the metrics' running totals.
    fn count_samples(&self, capture: &WindowCapture) {
        let metrics = &self.metrics;
        let accounting = &capture.accounting;
        metrics.add("profiler_windows_total", "Windows closed.", &[], 1.0);
        for (event, fired) in self.events.iter().zip(&accounting.samples_fired) {
            metrics.add(
                "profiler_samples_fired_total",
                "Samples the kernel fired, by event.",
                &[("event", &event.name)],
                *fired as f64,
            );
        }
        for kind in LossKind::ALL {
            let lost = accounting.losses[kind as usize];
            if lost > 0 {
                metrics.add(
                    "profiler_losses_total",
                    "Samples, or parts of samples, lost, by cause.",
                    &[("cause", kind.describe())],
                    lost as f64,
                );
            }
        }
        let off_cpu = &capture.drained.offcpu;
        if off_cpu.attachment.is_some() {
            for what in OffCpuCount::ALL {
                metrics.add(
                    "profiler_off_cpu_total",
                    "What the off-CPU switch programs counted (losses are in profiler_losses_total).",
                    &[("what", what.describe())],
                    off_cpu.counts[what as usize] as f64,
                );
            }
        }
        // Cumulative in the kernel: set, not added.
        for program in capture.programs.iter().filter(|program| program.runs > 0) {
            metrics.set(
                "profiler_bpf_runs_total",
                Kind::Counter,
                "Runs of the agent's BPF programs, by program (with BPF run-time statistics on: \
                 --bpf-stats).",
                &[("program", &program.name)],
                program.runs as f64,
            );
            metrics.set(
                "profiler_bpf_run_seconds_total",
                Kind::Counter,
                "Time the agent's BPF programs ran in the kernel, by program (with BPF run-time \
                 statistics on: --bpf-stats).",
                &[("program", &program.name)],
                program.run_time.as_secs_f64(),
            );
        }
        if let Some(tables) = capture.unwind_tables {
            metrics.set(
                "profiler_unwind_tables",
                Kind::Gauge,
                "Files whose unwind tables are loaded for the in-kernel unwinder.",
                &[],
                tables.files as f64,
            );
            metrics.set(
                "profiler_unwind_table_rows",
                Kind::Gauge,
                "Rows of the unwind tables loaded (16 bytes each, within --unwind-table-mib).",
                &[],
                tables.rows as f64,
            );
        }
        let kept: u64 = capture
            .drained
            .stacks
            .values()
            .map(|per_cpu| per_cpu.iter().sum::<u64>())
            .sum();
        metrics.add(
            "profiler_samples_kept_total",
            "Samples drained into windows.",
            &[],
            kept as f64,
        );
    }
}

/// A backend's running delivery totals, as metrics.
fn count_delivery(metrics: &Metrics, backend: &str, counts: &UploadCounts) {
    for (outcome, windows) in [
        ("delivered", counts.delivered),
        ("spooled", counts.spooled),
        ("dropped", counts.dropped),
        ("refused", counts.refused),
    ] {
        metrics.set(
            "profiler_backend_windows_total",
            Kind::Counter,
            "Windows per backend: delivered, spooled while it was unreachable, dropped from a \
             full spool, refused by it.",
            &[("backend", backend), ("outcome", outcome)],
            windows as f64,
        );
    }
    metrics.set(
        "profiler_backend_failed_requests_total",
        Kind::Counter,
        "Requests to a backend that failed (unreachable, 429, 5xx) and are retried.",
        &[("backend", backend)],
        counts.failed_requests as f64,
    );
}

/// Hands closed windows to the export thread without waiting for it.
struct Windows {
    sender: Option<SyncSender<ClosedWindow>>,
    exporter: Option<JoinHandle<()>>,
    next: u64,
    dropped: u64,
    metrics: Arc<Metrics>,
}

impl Windows {
    fn start(exporter: Exporter) -> Result<Windows> {
        let metrics = Arc::clone(&exporter.metrics);
        let (sender, receiver) = sync_channel(QUEUED_WINDOWS);
        let exporter = std::thread::Builder::new()
            .name("export".into())
            .spawn(move || exporter.run(receiver))
            .context("starting the export thread")?;
        Ok(Windows {
            sender: Some(sender),
            exporter: Some(exporter),
            next: 0,
            dropped: 0,
            metrics,
        })
    }

    /// Hands over the last window, waiting for room: capture is over, so waiting costs nothing
    /// and dropping it would lose the partial window the agent promises to export.
    fn send_last(&mut self, capture: WindowCapture) -> Result<()> {
        let sequence = self.next;
        self.next += 1;
        self.sender
            .as_ref()
            .expect("windows are sent before the end")
            .send(ClosedWindow { sequence, capture })
            .map_err(|_| anyhow!("the export thread ended"))
    }

    fn send(&mut self, capture: WindowCapture) -> Result<()> {
        let sequence = self.next;
        self.next += 1;
        let fired = capture.accounting.samples_fired.iter().sum::<u64>();
        let sender = self
            .sender
            .as_ref()
            .expect("windows are sent before the end");
        match sender.try_send(ClosedWindow { sequence, capture }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.dropped += 1;
                self.metrics.add(
                    "profiler_windows_dropped_total",
                    "Windows dropped because the export thread was too far behind.",
                    &[],
                    1.0,
                );
                log(
                    LogLevel::Error,
                    format!(
                        "window {sequence} dropped ({fired} samples fired): the export thread \
                         is {QUEUED_WINDOWS} windows behind ({} dropped so far)",
                        self.dropped
                    ),
                );
                Ok(())
            }
            Err(TrySendError::Disconnected(_)) => Err(anyhow!("the export thread ended")),
        }
    }

    /// Waits for the queued windows to be exported.
    fn finish(mut self) -> Result<()> {
        drop(self.sender.take());
        match self.exporter.take().map(JoinHandle::join) {
            Some(Err(_)) => Err(anyhow!("the export thread panicked")),
            _ => Ok(()),
        }
    }
}

/// The start of the next window boundary after `now`, on the interval's grid from `start`.
fn next_boundary(
    start: tokio::time::Instant,
    interval: Duration,
    now: tokio::time::Instant,
) -> tokio::time::Instant {
    let elapsed = now.duration_since(start);
    let windows = (elapsed.as_nanos() / interval.as_nanos()) as u32 + 1;
    start + interval * windows
}

pub async fn run_agent(mut args: AgentArgs) -> Result<ExitCode> {
    let mut signals = StopSignals::catch()?;
    log::set_level(args.log_level);
    if args.sampling.wakers {
        bail!(
            "--wakers is a view of `record`'s report: the agent exports off-CPU time \
             (--off-cpu) without its wakers"
        );
    }
    if args.sampling.unwind == Unwind::Check {
        bail!(
            "--unwind check compares two unwinders over one recording: use it with `record`; \
             the agent takes --unwind dwarf, fp or copy"
        );
    }
    let sinks = args.sinks()?;
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = &args.metrics_addr {
        let bound = serve(addr, Arc::clone(&metrics))?;
        log(LogLevel::Info, format!("metrics on http://{bound}/metrics"));
    }
    let sampling = &mut args.sampling;
    if sampling.events.is_empty() && sampling.period.is_none() && sampling.target_rate.is_none() {
        sampling.frequency.get_or_insert(DEFAULT_FREQUENCY);
    }
    let target = target_of(&args.sampling, &[], true).expect("-a stands for the whole system");
    let options = RecordOptions {
        stats: args.bpf_stats,
        sideband_interval: AGENT_SIDEBAND_INTERVAL,
        // Its exports carry stacks and data lines, not instructions.
        per_instruction: false,
        ..capture_options(&args.sampling, target)?
    };
    let interval = args.interval();
    let mut session = CaptureSession::open(&options)?;
    let mut windows = Windows::start(Exporter {
        events: session.events().to_vec(),
        cpu: session.cpu(),
        sinks,
        metrics,
        target: target_description(&options),
        source_lines: args.source_lines,
    })?;
    session.start(&options.target).await?;
    log(
        LogLevel::Info,
        format!(
            "profiling {} ({}), a window every {:.1} s",
            target_description(&options),
            session
                .events()
                .iter()
                .map(|event| event.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            interval.as_secs_f64()
        ),
    );
    let started = tokio::time::Instant::now();
    let stop = loop {
        let until = next_boundary(started, interval, tokio::time::Instant::now());
        if let Some(stop) = session.run_until(Some(until), &mut signals).await? {
            break stop;
        }
        windows.send(session.close_window()?)?;
    };
    let last = session.finish(stop, &options)?;
    windows.send_last(WindowCapture::from(last))?;
    windows.finish()?;
    let how = match stop {
        Stop::Signal(signal) => format!("received {}", signal_name(signal)),
        Stop::TargetsExited => "every profiled process exited".to_string(),
        Stop::Duration | Stop::CommandExited => "stopped".to_string(),
    };
    log(
        LogLevel::Info,
        format!("{how}: exported the last window, exiting"),
    );
    Ok(ExitCode::SUCCESS)
}

/// The window a finished capture holds (the agent's last, partial one).
impl From<crate::record::Capture> for WindowCapture {
    fn from(capture: crate::record::Capture) -> WindowCapture {
        let start = UNIX_EPOCH + Duration::from_nanos(capture.meta.start_unix_ns);
        let referenced = capture.drained.referenced_processes();
        WindowCapture {
            start,
            end: start + Duration::from_nanos(capture.meta.duration_ns),
            processes: capture.processes.snapshot(&referenced),
            drained: capture.drained,
            accounting: capture.accounting,
            programs: capture.stats.programs,
            // The agent is stopping: the gauges keep the last full window's.
            unwind_tables: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_nonsense() {
        assert_eq!(byte_size("4096"), Ok(4096));
        assert_eq!(byte_size("500M"), Ok(500 << 20));
        assert_eq!(byte_size("2g"), Ok(2 << 30));
        assert_eq!(byte_size("1KiB"), Ok(1024));
        assert!(byte_size("0").is_err());
        assert!(byte_size("12X").unwrap_err().contains("unknown unit"));
        assert!(byte_size("M").is_err());
        assert!(byte_size("99999999999G").unwrap_err().contains("too large"));
    }

    #[test]
    fn windows_end_on_the_intervals_grid() {
        let start = tokio::time::Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(next_boundary(start, second, start), start + second);
        let late = start + Duration::from_millis(2300);
        assert_eq!(next_boundary(start, second, late), start + 3 * second);
    }
}
