//! `profiler agent`: continuous profiling. One capture session runs until SIGTERM or SIGINT;
//! every `--interval` it closes a window and hands it, at address level, to the export thread,
//! which symbolizes it into a profile and passes it to every sink (`--output-dir`, ...). The
//! capture thread never waits for symbolization or export: when the export thread falls more
//! than [`QUEUED_WINDOWS`] behind, a window is dropped and counted. On SIGTERM the last,
//! partial window is exported and the agent exits.

pub mod log;
pub mod output_dir;
pub mod window;

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError},
    sync::Arc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{anyhow, Context, Result};
use profiler_common::{capture::LossKind, offcpu::OffCpuCount};

use self::{
    log::{log, LogLevel},
    window::WindowAssembler,
};
use crate::{
    assemble::UNREADABLE_MODULE_LOSS,
    export::sink::{Window, WindowSink},
    export::upload::UploadCounts,
    launch::{signal_name, Stop, StopSignals},
    prometheus::{Kind, Metrics},
    session::{Capture, CaptureOptions, CaptureSession},
    symbolize::SymbolCache,
};

const EVICTIONS_HELP: &str = "What the agent let go of to stay within --memory-max, by part \
                              (read again when needed).";
const MEMORY_HELP: &str = "Memory the agent's parts hold, by part (its own resident memory is \
                           profiler_resident_memory_bytes).";

/// Windows waiting for the export thread at most; more are dropped, not queued without bound.
const QUEUED_WINDOWS: usize = 4;
/// A closed window on its way to the export thread.
struct ClosedWindow {
    sequence: u64,
    capture: Capture,
}

/// What the export thread needs besides the windows.
struct Exporter {
    assembler: WindowAssembler,
    sinks: Vec<Box<dyn WindowSink>>,
    metrics: Arc<Metrics>,
    /// `--source-lines`.
    source_lines: bool,
    /// `--memory-max`.
    memory_budget: u64,
}

impl Exporter {
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
            let profile = self.assembler.profile(capture, &mut symbols);
            let unreadable: u64 = profile
                .losses
                .counters
                .iter()
                .filter(|(what, _)| what.starts_with(UNREADABLE_MODULE_LOSS))
                .map(|(_, addresses)| addresses)
                .sum();
            if unreadable > 0 {
                self.metrics.add(
                    "profiler_unreadable_code_total",
                    "Code addresses left unnamed because their module file could not be opened \
                     (each window's losses name the modules).",
                    &[],
                    unreadable as f64,
                );
            }
            // Sampled events only: the off-CPU "event" counts blocks.
            let sampled = self.assembler.events.len() as u32;
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
            self.count_debug_files();
            self.keep_within_budget(&mut symbols);
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

    /// What came of the debug files asked of debuginfod servers, when any are configured.
    fn count_debug_files(&self) {
        let Some(counts) = crate::symbolize::debuginfod::counts() else {
            return;
        };
        for (result, count) in [
            ("fetched", counts.fetched),
            ("not found", counts.not_found),
            ("failed", counts.failed),
            ("refused", counts.refused),
            ("over the limit", counts.over_limit),
        ] {
            self.metrics.set(
                "profiler_debuginfod_files_total",
                Kind::Counter,
                "Debug files asked of debuginfod servers, by what came of it.",
                &[("result", result)],
                count as f64,
            );
        }
    }

    /// Over the memory budget, lets go of the symbols of the modules this window did not sample
    /// (read again at their next sample), and says what the heap holds.
    fn keep_within_budget(&self, symbols: &mut SymbolCache) {
        let metrics = &self.metrics;
        let mut held = crate::heap::in_use_bytes();
        if held > self.memory_budget {
            let forgotten = symbols.forget_unsampled();
            metrics.add(
                "profiler_memory_evictions_total",
                EVICTIONS_HELP,
                &[("part", "modules' symbols")],
                forgotten as f64,
            );
            held = crate::heap::in_use_bytes();
        }
        symbols.start_window();
        metrics.set(
            "profiler_memory_bytes",
            Kind::Gauge,
            MEMORY_HELP,
            &[("part", "heap in use (budget: --memory-max)")],
            held as f64,
        );
        metrics.set(
            "profiler_memory_budget_bytes",
            Kind::Gauge,
            "The heap the agent is to hold at most (--memory-max).",
            &[],
            self.memory_budget as f64,
        );
        metrics.set(
            "profiler_symbol_modules",
            Kind::Gauge,
            "Modules whose symbols the agent holds.",
            &[],
            symbols.modules() as f64,
        );
    }

    /// Sample accounting of a window, added to the metrics' running totals.
    fn count_samples(&self, capture: &Capture) {
        let metrics = &self.metrics;
        let accounting = &capture.accounting;
        metrics.add("profiler_windows_total", "Windows closed.", &[], 1.0);
        for (event, fired) in self.assembler.events.iter().zip(&accounting.samples_fired) {
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
            metrics.set(
                "profiler_memory_evictions_total",
                Kind::Counter,
                EVICTIONS_HELP,
                &[("part", "unwind tables' compiled rows")],
                tables.tables_shed as f64,
            );
            let row_bytes = profiler_common::unwind::UnwindRow::SIZE as f64;
            for (part, rows) in [
                ("unwind rows in the kernel's arena", tables.rows),
                ("compiled unwind rows held by the agent", tables.rows_held),
            ] {
                metrics.set(
                    "profiler_memory_bytes",
                    Kind::Gauge,
                    MEMORY_HELP,
                    &[("part", part)],
                    rows as f64 * row_bytes,
                );
            }
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
    fn send_last(&mut self, capture: Capture) -> Result<()> {
        let sequence = self.next;
        self.next += 1;
        self.sender
            .as_ref()
            .expect("windows are sent before the end")
            .send(ClosedWindow { sequence, capture })
            .map_err(|_| anyhow!("the export thread ended"))
    }

    fn send(&mut self, capture: Capture) -> Result<()> {
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

/// What the agent runs with (resolved from its arguments by `cli`).
pub struct AgentOptions {
    pub capture: CaptureOptions,
    /// The agent's target, as profiles name it.
    pub target: String,
    /// Close a window and export it this often.
    pub interval: Duration,
    /// Where the windows go; at least one.
    pub sinks: Vec<Box<dyn WindowSink>>,
    /// The agent's metrics (served when `--metrics-addr` is given).
    pub metrics: Arc<Metrics>,
    /// `--source-lines`.
    pub source_lines: bool,
    /// `--memory-max`: the heap the agent is to hold at most.
    pub memory_budget: u64,
    /// `--node-root`: where the node's records name Kubernetes pods.
    pub node_root: PathBuf,
}

/// Runs the agent until a stop signal, then exports the last, partial window.
pub async fn run_agent(options: AgentOptions, signals: &mut StopSignals) -> Result<ExitCode> {
    let AgentOptions {
        capture: options,
        target,
        interval,
        sinks,
        metrics,
        source_lines,
        memory_budget,
        node_root,
    } = options;
    let mut session = CaptureSession::open(&options)?;
    let mut windows = Windows::start(Exporter {
        assembler: WindowAssembler::new(&session, target.clone(), &node_root),
        sinks,
        metrics,
        source_lines,
        memory_budget,
    })?;
    session.start(&options.target).await?;
    log(
        LogLevel::Info,
        format!(
            "profiling {} ({}), a window every {:.1} s",
            target,
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
        if let Some(stop) = session.run_until(Some(until), signals).await? {
            break stop;
        }
        windows.send(session.close_window()?)?;
    };
    let (mut last, _) = session.finish(stop)?;
    // The last window's processes are those its samples reference, as in every window.
    last.processes = last
        .processes
        .snapshot(&last.drained.referenced_processes());
    windows.send_last(last)?;
    windows.finish()?;
    let how = match stop {
        Stop::Signal(signal) => format!("received {}", signal_name(signal)),
        Stop::TargetsExited => "every profiled process exited".to_string(),
        Stop::Duration | Stop::CommandExited | Stop::Quit => "stopped".to_string(),
    };
    log(
        LogLevel::Info,
        format!("{how}: exported the last window, exiting"),
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_end_on_the_intervals_grid() {
        let start = tokio::time::Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(next_boundary(start, second, start), start + second);
        let late = start + Duration::from_millis(2300);
        assert_eq!(next_boundary(start, second, late), start + 3 * second);
    }
}
