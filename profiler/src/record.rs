//! `profiler record`: launch or find the target, open and attach the counters, drain the maps
//! until the target exits, the duration ends or the user interrupts, then drain everything
//! that is left ([`record`] returns the [`Capture`]) and assemble the profile
//! ([`Recording::assemble`], slow on a big run, so the caller runs it where signals still reach).
//!
//! A launched command is never killed outright: a stop signal is forwarded to it and `--duration`
//! sends it SIGTERM; recording goes on until it exits, for at most [`GRACE`] or until a second
//! signal, after which it is killed. The recording's outcome says how the command ended.

use std::path::{Path, PathBuf};

use tokio::time::Instant;

use anyhow::Result;

use crate::{
    agent::window::WindowAssembler,
    aggregate::{code::capture_code, dataspace::capture_data_objects},
    assemble::drained::assemble,
    capture::stats::CaptureStats,
    drain::Accounting,
    launch::{Ending, Stop, StopSignals},
    profile::Profile,
    scope::kubernetes::KubernetesNames,
    session::{Capture, CaptureOptions, CaptureSession, SessionEnd},
    symbolize::{
        kernel_addresses::{hide_kernel_addresses, kernel_addresses_shown},
        FrameAddresses, FrameTable, KnownFrames, ReadAhead, SymbolCache,
    },
    top::{LiveView, Refresh, Windows},
};

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

    /// Assembles the profile of the recording of `target` and reads what offline reports need
    /// from files that may be gone by then: the processes' data mappings and variables, and,
    /// with `with_code` (a profile file, or a report of one function's instructions), the
    /// sampled functions' code, which takes reading and line-mapping every sampled function.
    /// `symbols` and `known` hold what was symbolized during the recording (see
    /// [`ReadAhead`]).
    pub fn assemble(
        capture: Capture,
        end: SessionEnd,
        target: String,
        with_code: bool,
        symbols: &SymbolCache,
        known: KnownFrames,
        node_root: &Path,
    ) -> Recording {
        let meta = capture.profile_meta(target);
        let frames = FrameTable::with_known(
            &capture.processes,
            Some(symbols),
            FrameAddresses::Runtime,
            known,
        );
        let mut profile = assemble(
            meta,
            end.events,
            capture.drained,
            &capture.accounting,
            frames,
            &mut KubernetesNames::new(node_root),
        );
        profile.hardware.cpu = end.cpu;
        // What offline reports need from files that may be gone by then: the sampled functions'
        // code and the processes' data mappings and variables.
        // One symbolizer for the frames and the code's lines: a module's parse (glibc's debug
        // file takes 30-40 ms to decompress) serves both.
        if with_code {
            capture_code(&mut profile, &capture.processes, &symbols.symbolizer());
        }
        capture_data_objects(&mut profile, &capture.processes);
        // The profile file, exports and reports alike.
        if !kernel_addresses_shown() {
            hide_kernel_addresses(&mut profile);
        }
        Recording {
            profile,
            accounting: capture.accounting,
            stats: end.stats,
            ending: end.ending,
            failures: end.failures,
        }
    }
}

/// `record --live`: the recording shown as `top` shows a session, while it is kept whole.
pub struct Live {
    /// The target as the screen names it.
    pub title: String,
    pub node_root: PathBuf,
}

/// Records until the target exits, the duration ends or the user interrupts (or quits the
/// `--live` view): one window. What it samples is symbolized meanwhile, a drain interval at a
/// time: the profile is assembled with the returned [`ReadAhead`]'s cache.
pub async fn record(
    options: CaptureOptions,
    signals: &mut StopSignals,
    live: Option<Live>,
) -> Result<(Capture, SessionEnd, ReadAhead)> {
    let mut session = CaptureSession::open(&options)?;
    let mut ahead = ReadAhead::start(true)?;
    session.start(&options.target).await?;
    let view = match live {
        Some(live) => Some(LiveView::start(
            WindowAssembler::new(&session, live.title, &live.node_root),
            Windows::Growing,
        )?),
        None => None,
    };
    let mut refresh = Refresh::default();
    let recorded = async {
        loop {
            let mut next = Instant::now() + options.drain_interval;
            if view.is_some() {
                next = next.min(refresh.next_look());
            }
            if let Some(stop) = session.run_until(Some(next), signals).await? {
                return Ok(stop);
            }
            session.read_ahead(&mut ahead);
            if let Some(view) = &view {
                if view.quit_asked() {
                    return Ok(Stop::Quit);
                }
                if refresh.due() {
                    view.show(session.snapshot()?);
                }
            }
        }
    }
    .await;
    // The terminal is given back before anything is printed, whatever ended the recording.
    let shown = view.map_or(Ok(()), LiveView::finish);
    let stop: Result<Stop> = recorded;
    let (capture, end) = session.finish(stop?)?;
    shown?;
    Ok((capture, end, ahead))
}
