//! `profiler top`: a live, full-screen view of where the samples go, refreshed every second
//! from one capture session (system-wide, or scoped as `record` is); `record --live` shows its
//! recording through the same [`LiveView`], handing it snapshots of the whole run
//! ([`Windows::Growing`]) where top hands it closed windows.
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
        mpsc::{channel, sync_channel, Receiver, SyncSender, TryRecvError, TrySendError},
        Arc,
    },
    thread::JoinHandle,
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

/// Refuses where there is no terminal to draw on, saying what to use instead: `what` draws
/// (`profiler top`, `record --live`).
pub fn check_terminal(what: &str) -> Result<()> {
    if !(std::io::stdout().is_terminal() && std::io::stdin().is_terminal()) {
        bail!(
            "{what} draws on a terminal, and its input or output is not one: for a report \
             use `profiler record -a --duration 10s` (or `record -p PID`), for continuous \
             profiles `profiler agent`"
        );
    }
    Ok(())
}

pub async fn run_top(options: TopOptions, signals: &mut StopSignals) -> Result<ExitCode> {
    let mut session = CaptureSession::open(&options.capture)?;
    let assembler = WindowAssembler::new(&session, options.target, &options.node_root);
    session.start(&options.capture.target).await?;
    let view = LiveView::start(assembler, Windows::Closed)?;
    let captured = capture_loop(&mut session, signals, &view).await;
    let stop = captured.as_ref().ok().copied().flatten();
    let ended = session.finish(stop.unwrap_or(Stop::Quit));
    // The terminal is restored before anything is printed.
    view.finish()?;
    captured?;
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
    view: &LiveView,
) -> Result<Option<Stop>> {
    let mut refresh = Refresh::default();
    loop {
        if let Some(stop) = session
            .run_until(Some(refresh.next_look()), signals)
            .await?
        {
            return Ok(Some(stop));
        }
        if view.quit_asked() {
            return Ok(None);
        }
        if refresh.due() && !view.show(session.close_window()?) {
            return Ok(None);
        }
    }
}

/// When the next window is due, and when to look whether the screen asked to quit.
pub struct Refresh {
    next: tokio::time::Instant,
}

impl Default for Refresh {
    /// The first window a [`REFRESH`] from now.
    fn default() -> Refresh {
        Refresh {
            next: tokio::time::Instant::now() + REFRESH,
        }
    }
}

impl Refresh {
    /// Where a capture loop should look up next: the next window or the next quit check.
    pub fn next_look(&self) -> tokio::time::Instant {
        (tokio::time::Instant::now() + QUIT_CHECK).min(self.next)
    }

    /// Whether a window is due now; if so, the next one is a [`REFRESH`] later.
    pub fn due(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now < self.next {
            return false;
        }
        self.next += REFRESH;
        if self.next <= now {
            self.next = now + REFRESH;
        }
        true
    }
}

/// What each capture handed to a [`LiveView`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Windows {
    /// A closed window (`top`).
    Closed,
    /// The whole recording so far (`record --live`): the screen shows what is new in it.
    Growing,
}

/// The summarizing and screen threads of a live view, fed captures by a capture loop.
pub struct LiveView {
    captures: SyncSender<Capture>,
    quit: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    summarizer: JoinHandle<()>,
    screen: JoinHandle<Result<()>>,
}

impl LiveView {
    pub fn start(mut assembler: WindowAssembler, windows: Windows) -> Result<LiveView> {
        let quit = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let target = assembler.target.clone();
        let (captures, to_summarize) = sync_channel::<Capture>(QUEUED_WINDOWS);
        let (summaries, to_show) = channel::<WindowSummary>();
        let summarizer = std::thread::Builder::new()
            .name("top-summarize".into())
            .spawn(move || {
                // Made here: the symbol cache cannot move threads.
                let mut symbols = SymbolCache::new(false).without_aliases();
                let mut so_far = WindowSummary::default();
                for capture in to_summarize {
                    let profile = assembler.profile(capture, &mut symbols);
                    symbols.start_window();
                    let mut summary = WindowSummary::of(profile);
                    if windows == Windows::Growing {
                        let new = summary.since(&so_far);
                        so_far = std::mem::replace(&mut summary, new);
                    }
                    if summaries.send(summary).is_err() {
                        break;
                    }
                }
            })
            .context("starting the summarizing thread")?;
        let screen = {
            let (quit, dropped) = (Arc::clone(&quit), Arc::clone(&dropped));
            std::thread::Builder::new()
                .name("top-screen".into())
                .spawn(move || show(to_show, &quit, &dropped, &target))
                .context("starting the screen thread")?
        };
        Ok(LiveView {
            captures,
            quit,
            dropped,
            summarizer,
            screen,
        })
    }

    /// Whether the screen asked to quit (`q`, Ctrl-C, its terminal hung up).
    pub fn quit_asked(&self) -> bool {
        self.quit.load(Ordering::Relaxed)
    }

    /// Hands a capture over without waiting (one the summarizer is not ready for is dropped
    /// and counted); false when the screen is gone.
    pub fn show(&self, capture: Capture) -> bool {
        match self.captures.try_send(capture) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Closes the view: the summarizer ends, then the screen, which restores the terminal.
    pub fn finish(self) -> Result<()> {
        drop(self.captures);
        let shown = self
            .screen
            .join()
            .map_err(|_| anyhow!("the screen thread panicked"))?;
        self.summarizer
            .join()
            .map_err(|_| anyhow!("the summarizing thread panicked"))?;
        shown
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
