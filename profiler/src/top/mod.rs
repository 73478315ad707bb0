//! `profiler top`: a live, full-screen view of where the samples go, refreshed every second
//! from one capture session (system-wide, or scoped as `record` is).
//!
//! Three threads, none waiting on another: the capture loop closes a window every second and
//! hands it over (a window the next thread is not ready for is dropped and counted, never
//! queued without bound); the summarizer symbolizes it, as the agent does its windows, and
//! reduces it to what the screen shows; the screen thread owns the terminal, draws, and reads
//! keys. `q` (or Ctrl-C, which the terminal's raw mode delivers as a key) sets a flag the
//! capture loop checks five times a second; a stop signal ends the capture loop, whose channel
//! closing ends the other two. The terminal is restored on every way out, panics included.

pub mod screen;
pub mod state;
pub mod summary;

use std::{
    io::IsTerminal,
    path::PathBuf,
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{channel, sync_channel, Receiver, TryRecvError, TrySendError},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use ratatui::crossterm::event::{self, Event, KeyEventKind};

use self::{
    screen::{draw, Heading},
    state::{Action, TopState},
    summary::WindowSummary,
};
use crate::{
    agent::window::WindowAssembler,
    launch::{signal_name, Stop, StopSignals},
    session::{Capture, CaptureOptions, CaptureSession},
    symbolize::SymbolCache,
};

/// How often the screen gets a new window.
const REFRESH: Duration = Duration::from_secs(1);
/// How often the capture loop looks whether the screen asked to quit.
const QUIT_CHECK: Duration = Duration::from_millis(200);
/// Windows waiting for the summarizer at most.
const QUEUED_WINDOWS: usize = 2;

/// What `profiler top` runs with (resolved from its arguments by `cli`).
pub struct TopOptions {
    pub capture: CaptureOptions,
    /// The target as the header names it.
    pub target: String,
    pub node_root: PathBuf,
}

/// Refuses where there is no terminal to draw on, saying what to use instead.
pub fn check_terminal() -> Result<()> {
    if !(std::io::stdout().is_terminal() && std::io::stdin().is_terminal()) {
        bail!(
            "profiler top draws on a terminal, and its input or output is not one: for a report \
             use `profiler record -a --duration 10s` (or `record -p PID`), for continuous \
             profiles `profiler agent`"
        );
    }
    Ok(())
}

pub async fn run_top(options: TopOptions, signals: &mut StopSignals) -> Result<ExitCode> {
    let mut session = CaptureSession::open(&options.capture)?;
    let mut assembler = WindowAssembler::new(&session, options.target.clone(), &options.node_root);
    session.start(&options.capture.target).await?;

    let quit = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicU64::new(0));
    let (captures, to_summarize) = sync_channel::<Capture>(QUEUED_WINDOWS);
    let (summaries, to_show) = channel::<WindowSummary>();
    let summarizer = std::thread::Builder::new()
        .name("top-summarize".into())
        .spawn(move || {
            // Made here: the symbol cache cannot move threads.
            let mut symbols = SymbolCache::new(false).without_aliases();
            for capture in to_summarize {
                let profile = assembler.profile(capture, &mut symbols);
                symbols.start_window();
                if summaries.send(WindowSummary::of(profile)).is_err() {
                    break;
                }
            }
        })
        .context("starting the summarizing thread")?;
    let screen = {
        let (quit, dropped, target) = (Arc::clone(&quit), Arc::clone(&dropped), options.target);
        std::thread::Builder::new()
            .name("top-screen".into())
            .spawn(move || show(to_show, &quit, &dropped, &target))
            .context("starting the screen thread")?
    };

    let captured = capture_loop(&mut session, signals, &quit, &dropped, captures).await;
    let stop = captured.as_ref().ok().copied().flatten();
    let ended = session.finish(stop.unwrap_or(Stop::Duration));
    // The capture side is closed: the summarizer ends, then the screen, restoring the terminal
    // before anything is printed.
    let shown = screen
        .join()
        .map_err(|_| anyhow!("the screen thread panicked"))?;
    summarizer
        .join()
        .map_err(|_| anyhow!("the summarizing thread panicked"))?;
    captured?;
    shown?;
    ended?;
    match stop {
        Some(Stop::Signal(signal)) => {
            eprintln!("profiler top: {} received: stopped", signal_name(signal))
        }
        Some(Stop::TargetsExited) => eprintln!("profiler top: every profiled process exited"),
        _ => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// Closes a window every [`REFRESH`] until a stop (`Some`) or the screen's quit (`None`).
async fn capture_loop(
    session: &mut CaptureSession,
    signals: &mut StopSignals,
    quit: &AtomicBool,
    dropped: &AtomicU64,
    captures: std::sync::mpsc::SyncSender<Capture>,
) -> Result<Option<Stop>> {
    let mut window_end = tokio::time::Instant::now() + REFRESH;
    loop {
        let check = (tokio::time::Instant::now() + QUIT_CHECK).min(window_end);
        if let Some(stop) = session.run_until(Some(check), signals).await? {
            return Ok(Some(stop));
        }
        if quit.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let now = tokio::time::Instant::now();
        if now >= window_end {
            match captures.try_send(session.close_window()?) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
                Err(TrySendError::Disconnected(_)) => return Ok(None),
            }
            window_end += REFRESH;
            if window_end <= now {
                window_end = now + REFRESH;
            }
        }
    }
}

/// The screen thread: draws each new window and each key's change until `q` or until the
/// windows end; the terminal is given back as it was either way.
fn show(
    windows: Receiver<WindowSummary>,
    quit: &AtomicBool,
    dropped: &AtomicU64,
    target: &str,
) -> Result<()> {
    let mut terminal = ratatui::try_init().context("setting up the terminal")?;
    let shown = show_on(&mut terminal, windows, quit, dropped, target);
    // A terminal that hung up has nothing left to restore.
    let restored = ratatui::try_restore();
    if shown.is_err() {
        quit.store(true, Ordering::Relaxed);
    }
    match shown? {
        Shown::HungUp => {
            // Dropping it would show the cursor on the terminal that is gone, and complain.
            std::mem::forget(terminal);
            Ok(())
        }
        Shown::Ended => restored.context("restoring the terminal"),
    }
}

fn show_on(
    terminal: &mut ratatui::DefaultTerminal,
    windows: Receiver<WindowSummary>,
    quit: &AtomicBool,
    dropped: &AtomicU64,
    target: &str,
) -> Result<Shown> {
    let started = Instant::now();
    let mut state = TopState::default();
    let mut waiting = true;
    let mut dirty = true;
    loop {
        loop {
            match windows.try_recv() {
                Ok(window) => {
                    state.push(window);
                    waiting = false;
                    dirty = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Ok(Shown::Ended),
            }
        }
        if dirty {
            state.dropped_windows = dropped.load(Ordering::Relaxed);
            let heading = Heading {
                target,
                elapsed_s: started.elapsed().as_secs(),
                waiting,
            };
            terminal
                .draw(|frame| draw(frame, &state, &heading))
                .context("drawing on the terminal")?;
            dirty = false;
        }
        if hung_up_waiting(Duration::from_millis(100))? {
            quit.store(true, Ordering::Relaxed);
            return Ok(Shown::HungUp);
        }
        // Every event read, including those crossterm read ahead in a burst of keys.
        while event::poll(Duration::ZERO).context("reading the terminal")? {
            match event::read().context("reading the terminal")? {
                Event::Key(key) if key.kind == KeyEventKind::Press => {
                    if state.key(key) == Action::Quit {
                        quit.store(true, Ordering::Relaxed);
                        return Ok(Shown::Ended);
                    }
                    dirty = true;
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
        }
    }
}

/// How the screen ended.
enum Shown {
    /// `q`, or the windows ended: the terminal is given back.
    Ended,
    HungUp,
}

/// Waits up to `timeout` for input on the terminal (standard input); whether it hung up
/// (its window closed, its ssh connection dropped). crossterm's own wait spins on a terminal
/// that hung up, so the screen thread asks first.
fn hung_up_waiting(timeout: Duration) -> Result<bool> {
    let mut terminal = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one pollfd that lives across the call.
    let ready = unsafe { libc::poll(&mut terminal, 1, timeout.as_millis() as libc::c_int) };
    if ready < 0 {
        let error = std::io::Error::last_os_error();
        if error.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(error).context("waiting for the terminal");
    }
    Ok(terminal.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0)
}
