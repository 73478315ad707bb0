//! How a command is started and how it ended, for `record` and `stat` alike.
//!
//! Starting: the command is started stopped, counters are opened on its pid with
//! `enable_on_exec`, and releasing it lets it exec the real program, which switches the counters
//! on exactly at that exec. A command whose profiler never releases it (the profiler failed or
//! died first) never runs: the trampoline exits instead, and the kernel ends it if the profiler
//! dies while it runs (`PR_SET_PDEATHSIG`).
//!
//! Ending: [`Shutdown`] passes the first stop (a signal the profiler catches with
//! [`StopSignals`], or `--duration` ending) to the command, which is then given [`GRACE`] to exit
//! before it is killed; [`Ending`] says why the run stopped and how the command ended, and gives
//! the exit status a shell would report.

use std::{
    io::Write as _,
    os::{
        fd::AsRawFd,
        unix::process::{CommandExt as _, ExitStatusExt as _},
    },
    path::PathBuf,
    process::{ExitCode, ExitStatus},
    sync::{
        atomic::{AtomicI32, Ordering},
        OnceLock,
    },
    time::Duration,
};

use anyhow::{anyhow, Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// How long a command has to exit once it was asked to (a forwarded signal, or SIGTERM when
/// `--duration` ends) before it is killed.
pub const GRACE: Duration = Duration::from_secs(5);

/// A command started stopped: a shell trampoline waits on a pipe and then execs the command.
pub struct StoppedCommand {
    pub child: tokio::process::Child,
    release: std::io::PipeWriter,
}

impl StoppedCommand {
    /// The pid to open counters on; after the exec it is the command's own pid.
    pub fn pid(&self) -> Result<u32> {
        self.child
            .id()
            .ok_or_else(|| anyhow!("the command exited before it started"))
    }

    /// Lets the trampoline exec the command.
    pub fn release(&mut self) -> Result<()> {
        self.release
            .write_all(b"go\n")
            .context("starting the command")
    }

    /// Sends `signal` to the command (its pid is the command's own once released).
    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on the pid of our own child, which we have not reaped (tokio
            // reaps it only in `wait`), so the pid cannot belong to another process.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }
}

impl Drop for StoppedCommand {
    /// A profiler that fails while its command runs does not leave it behind: the command is
    /// asked to exit, then killed after [`GRACE`], and reaped.
    fn drop(&mut self) {
        let Some(pid) = self.child.id() else {
            return;
        };
        let pid = pid as i32;
        let reaped = |flags| {
            let mut status = 0;
            // SAFETY: waitpid(2) on our own child's pid; `status` is a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut status, flags) != 0 }
        };
        self.signal(libc::SIGTERM);
        let deadline = std::time::Instant::now() + GRACE;
        while std::time::Instant::now() < deadline {
            if reaped(libc::WNOHANG) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal(libc::SIGKILL);
        reaped(0);
    }
}

/// File descriptor the trampoline reads the go-ahead from.
const GATE_FD: i32 = 3;
/// Execs the command once the profiler writes the go-ahead; exits without running it when the
/// pipe closes first (the profiler failed or died before the start).
const TRAMPOLINE: &str = "read -r _ <&3 || exit 127; exec 3<&-; exec \"$@\"";

/// Finds a program the way exec does: a path as given, a bare name on PATH.
pub fn resolve_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program)).filter(|path| path.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Starts `argv` behind the trampoline; it runs nothing of its own until [`StoppedCommand::release`].
pub fn spawn_stopped(argv: &[String]) -> Result<StoppedCommand> {
    let program = argv
        .first()
        .ok_or_else(|| anyhow!("no command given after --"))?;
    if resolve_program(program).is_none() {
        return Err(anyhow!(
            "cannot run '{program}': no such file, or not on PATH"
        ));
    }
    let (gate, release) = std::io::pipe().context("creating a pipe")?;
    let gate_fd = gate.as_raw_fd();
    let mut command = std::process::Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(TRAMPOLINE)
        .arg("profiler-launch")
        .args(argv);
    // SAFETY: getpid(2) has no preconditions.
    let profiler = unsafe { libc::getpid() };
    // SAFETY: runs in the forked child before exec and only calls dup2(2), prctl(2) and
    // getppid(2), which are async-signal-safe; the duplicate has no close-on-exec flag, so the
    // shell inherits it.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(gate_fd, GATE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Killed with the profiler: a command must not run on unprofiled and orphaned.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The profiler died before the line above took effect.
            if libc::getppid() != profiler {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let child = tokio::process::Command::from(command)
        .spawn()
        .context("starting /bin/sh to launch the command")?;
    drop(gate);
    Ok(StoppedCommand { child, release })
}

/// How a launched command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommandEnd {
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
}

impl CommandEnd {
    pub fn from_status(status: ExitStatus) -> Option<CommandEnd> {
        status
            .code()
            .map(CommandEnd::Exited)
            .or_else(|| status.signal().map(CommandEnd::Signaled))
    }

    /// The profiler's exit code: the command's, as a shell reports it (128 + N when signal N
    /// killed it), else success.
    pub fn exit_code(end: Option<CommandEnd>) -> ExitCode {
        match end {
            Some(CommandEnd::Exited(code)) => ExitCode::from(code.clamp(0, 255) as u8),
            Some(CommandEnd::Signaled(signal)) => {
                ExitCode::from((128 + signal).clamp(0, 255) as u8)
            }
            None => ExitCode::SUCCESS,
        }
    }

    /// The exit code when some of the profiler's outputs could not be written: the command's
    /// when it failed (its failure comes first), else 1.
    pub fn exit_code_after_failed_outputs(end: Option<CommandEnd>) -> ExitCode {
        match end {
            Some(CommandEnd::Exited(code)) if code != 0 => CommandEnd::exit_code(end),
            Some(CommandEnd::Signaled(_)) => CommandEnd::exit_code(end),
            _ => ExitCode::FAILURE,
        }
    }

    /// `exited with status 7`, `was killed by signal 15 (SIGTERM)`.
    pub fn describe(&self) -> String {
        match self {
            CommandEnd::Exited(code) => format!("exited with status {code}"),
            CommandEnd::Signaled(signal) => {
                format!("was killed by signal {signal} ({})", signal_name(*signal))
            }
        }
    }
}

/// Why a recording or count stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The launched command exited (on its own, or after it was asked to).
    CommandExited,
    /// Every process given with `-p` exited.
    TargetsExited,
    Duration,
    /// The profiler received this signal.
    Signal(i32),
    /// The user quit the live view (`q`).
    Quit,
}

/// How the launched command was asked to exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asked {
    /// The signal it got: the one the profiler received, or SIGTERM when `--duration` ended.
    pub signal: i32,
    pub why: Stop,
    /// False when the signal came from the terminal, which sent it to the command as well.
    pub forwarded: bool,
}

/// How a run ended: why it stopped and, for a launched command, how that ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ending {
    pub stop: Stop,
    pub asked: Option<Asked>,
    pub command: Option<CommandEnd>,
    /// Why the command was killed: it did not exit within [`GRACE`], or a second stop came.
    pub killed: Option<Stop>,
}

impl Ending {
    /// What ended the run, as a clause: `the command exited with status 7`.
    pub fn describe(&self) -> String {
        let command = self.command.map(|end| end.describe());
        let asked = self.asked.map(|asked| match (asked.why, asked.forwarded) {
            (Stop::Duration, _) => format!(
                "--duration ended: the command was sent {}",
                signal_name(asked.signal)
            ),
            (_, true) => format!(
                "the profiler received {} and forwarded it to the command",
                signal_name(asked.signal)
            ),
            (_, false) => format!(
                "{} from the terminal reached the profiler and the command",
                signal_name(asked.signal)
            ),
        });
        let killed = match self.killed {
            Some(Stop::Signal(signal)) => format!(
                "; it was killed when the profiler received {} too",
                signal_name(signal)
            ),
            Some(_) => format!(
                "; it was killed after it had not exited for {} s",
                GRACE.as_secs()
            ),
            None => String::new(),
        };
        match (asked, command) {
            (Some(asked), Some(command)) => format!("{asked}, and the command {command}{killed}"),
            (None, Some(command)) => format!("the command {command}"),
            _ => match self.stop {
                Stop::TargetsExited => "every profiled process exited".into(),
                Stop::Duration => "--duration ended".into(),
                Stop::Quit => "the live view was quit".into(),
                Stop::Signal(signal) => {
                    format!("the profiler received {}", signal_name(signal))
                }
                Stop::CommandExited => "the command exited".into(),
            },
        }
    }

    /// As JSON: `{"stop": ..., "command": {"exit_code": N} | {"signal": N}, ...}`.
    pub fn json(&self) -> serde_json::Value {
        let stop = match self.stop {
            Stop::CommandExited => "command exited".to_string(),
            Stop::TargetsExited => "targets exited".to_string(),
            Stop::Duration => "duration".to_string(),
            Stop::Quit => "quit".to_string(),
            Stop::Signal(signal) => format!("signal {}", signal_name(signal)),
        };
        let command = match self.command {
            Some(CommandEnd::Exited(code)) => serde_json::json!({ "exit_code": code }),
            Some(CommandEnd::Signaled(signal)) => serde_json::json!({ "signal": signal }),
            None => serde_json::Value::Null,
        };
        serde_json::json!({
            "stop": stop,
            "asked": self.asked.map(|asked| signal_name(asked.signal)),
            "forwarded": self.asked.map(|asked| asked.forwarded),
            "killed": self.killed.is_some(),
            "command": command,
            "description": self.describe(),
        })
    }
}

/// How a run with a launched command comes to its end, the same for `record` and `stat`: the
/// first stop (a signal, `--duration` ending) is passed to the command, and the run goes on
/// until the command exits, for at most [`GRACE`] or until a second stop, which kills it.
pub struct Shutdown {
    /// The duration's end, then the grace's once the command was asked to exit.
    deadline: Option<tokio::time::Instant>,
    asked: Option<Asked>,
    killed: Option<Stop>,
    status: Option<ExitStatus>,
}

impl Shutdown {
    pub fn new(duration: Option<Duration>) -> Shutdown {
        Shutdown {
            deadline: duration.map(|duration| tokio::time::Instant::now() + duration),
            asked: None,
            killed: None,
            status: None,
        }
    }

    /// The next stop: a signal, or `None` when the duration, or the grace given to the command,
    /// is over.
    pub async fn next_stop(&self, signals: &mut StopSignals) -> Option<StopSignal> {
        let deadline = async {
            match self.deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = deadline => None,
            signal = signals.recv() => Some(signal),
        }
    }

    /// The launched command exited; the run stops.
    pub fn command_exited(&mut self, status: ExitStatus) -> Stop {
        self.status = Some(status);
        Stop::CommandExited
    }

    /// Acts on a stop from [`Shutdown::next_stop`]; returns why the run stops, or `None` while
    /// the command winds down.
    pub async fn stop(
        &mut self,
        signal: Option<StopSignal>,
        command: Option<&mut StoppedCommand>,
    ) -> Result<Option<Stop>> {
        let why = signal.map_or(Stop::Duration, |signal| Stop::Signal(signal.number));
        // The terminal sent its signal to the command as well.
        let forward = !signal.is_some_and(|signal| signal.from_terminal);
        let Some(command) = command else {
            return Ok(Some(why));
        };
        if let Some(asked) = self.asked {
            // A second stop, or the grace is over: the command is killed.
            command.signal(libc::SIGKILL);
            self.status = Some(
                command
                    .child
                    .wait()
                    .await
                    .context("waiting for the command")?,
            );
            self.killed = Some(why);
            return Ok(Some(asked.why));
        }
        let signal = match why {
            Stop::Signal(signal) => signal,
            _ => libc::SIGTERM,
        };
        if forward {
            command.signal(signal);
        }
        self.asked = Some(Asked {
            signal,
            why,
            forwarded: forward,
        });
        self.deadline = Some(tokio::time::Instant::now() + GRACE);
        Ok(None)
    }

    /// How the run ended, given why it stopped.
    pub fn ending(self, stop: Stop) -> Ending {
        Ending {
            // A command that exited after it was asked to ended the run for the asking's reason.
            stop: match (stop, self.asked) {
                (Stop::CommandExited, Some(asked)) => asked.why,
                _ => stop,
            },
            asked: self.asked,
            command: self.status.and_then(CommandEnd::from_status),
            killed: self.killed,
        }
    }
}

/// What may end a run, as [`Run::next`] saw it; acted on by [`Run::act`] once the caller's
/// select is over, so that waiting on a killed command is never cut short by another branch.
pub enum RunEvent {
    CommandExited(std::io::Result<ExitStatus>),
    /// A stop signal, or `None` when the duration or the command's grace ended.
    Stop(Option<StopSignal>),
}

/// The end conditions of one `record`, `stat` or `agent` run: the launched command, the `-p`
/// processes, the duration and stop signals, with the [`Shutdown`] they go through.
pub struct Run {
    pub command: Option<StoppedCommand>,
    /// `-p` processes: the run stops when none of them is left.
    pids: Vec<u32>,
    shutdown: Shutdown,
}

impl Run {
    pub fn new(command: Option<StoppedCommand>, pids: Vec<u32>) -> Run {
        Run {
            command,
            pids,
            shutdown: Shutdown::new(None),
        }
    }

    /// Starts the clock of `--duration`: call when the counters start.
    pub fn begin(&mut self, duration: Option<Duration>) {
        self.shutdown = Shutdown::new(duration);
    }

    /// The next event that may end the run. Safe to cancel (in a `select!`).
    pub async fn next(&mut self, signals: &mut StopSignals) -> RunEvent {
        let Run {
            command, shutdown, ..
        } = self;
        let command_exit = async {
            match command {
                Some(stopped) => stopped.child.wait().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = command_exit => RunEvent::CommandExited(status),
            signal = shutdown.next_stop(signals) => RunEvent::Stop(signal),
        }
    }

    /// Acts on an event of [`Run::next`]: why the run stops, or `None` while a command winds down.
    pub async fn act(&mut self, event: RunEvent) -> Result<Option<Stop>> {
        match event {
            RunEvent::CommandExited(status) => Ok(Some(
                self.shutdown
                    .command_exited(status.context("waiting for the command")?),
            )),
            RunEvent::Stop(signal) => self.shutdown.stop(signal, self.command.as_mut()).await,
        }
    }

    /// `Stop::TargetsExited` once every `-p` process is gone (checked on the caller's ticks).
    pub fn targets_exited(&self) -> Option<Stop> {
        let gone = !self.pids.is_empty() && !self.pids.iter().any(|&pid| process_running(pid));
        gone.then_some(Stop::TargetsExited)
    }

    /// How the run ended, given why it stopped.
    pub fn ending(self, stop: Stop) -> Ending {
        self.shutdown.ending(stop)
    }
}

/// `SIGTERM` for 15; `signal N` for one without a name here.
pub fn signal_name(signal: i32) -> String {
    let names = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGSYS, "SIGSYS"),
    ];
    names
        .iter()
        .find(|(number, _)| *number == signal)
        .map_or_else(|| format!("signal {signal}"), |(_, name)| name.to_string())
}

/// Whether a process still runs (exists and is not a zombie).
pub fn process_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// A stop signal as the profiler received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopSignal {
    pub number: i32,
    /// The terminal sent it (Ctrl-C, Ctrl-\\) to its whole foreground process group, so a
    /// command launched in the profiler's group has it already and must not get a second copy.
    pub from_terminal: bool,
}

const STOP_SIGNALS: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The `si_code` of each signal's latest delivery, stored before tokio's handler wakes us.
static DELIVERY_CODES: [AtomicI32; 32] = [const { AtomicI32::new(0) }; 32];

/// Registers, once per process and ahead of tokio's own handlers (the registry runs actions in
/// registration order), the actions that store where each stop signal came from.
fn record_signal_origins() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            for number in STOP_SIGNALS {
                // SAFETY: the action only stores into an atomic, which is async-signal-safe.
                unsafe {
                    signal_hook_registry::register_sigaction(number, move |info| {
                        DELIVERY_CODES[number as usize].store(info.si_code, Ordering::Relaxed)
                    })
                }
                .map_err(|e| format!("catching {}: {e}", signal_name(number)))?;
            }
            Ok(())
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The signals that stop a recording or count: SIGINT, SIGTERM, SIGHUP and SIGQUIT, caught from
/// the moment this is made, so that none of them kills the profiler and orphans its command.
pub struct StopSignals {
    streams: Vec<(i32, Signal)>,
}

impl StopSignals {
    pub fn catch() -> Result<StopSignals> {
        record_signal_origins()?;
        let streams = STOP_SIGNALS
            .into_iter()
            .map(|number| {
                signal(SignalKind::from_raw(number))
                    .map(|stream| (number, stream))
                    .with_context(|| format!("catching {}", signal_name(number)))
            })
            .collect::<Result<_>>()?;
        Ok(StopSignals { streams })
    }

    /// The next stop signal received.
    pub async fn recv(&mut self) -> StopSignal {
        std::future::poll_fn(|context| {
            for (number, stream) in &mut self.streams {
                if stream.poll_recv(context).is_ready() {
                    let code = DELIVERY_CODES[*number as usize].load(Ordering::Relaxed);
                    return std::task::Poll::Ready(StopSignal {
                        number: *number,
                        // Only the terminal makes the kernel itself send these two.
                        from_terminal: code == libc::SI_KERNEL
                            && matches!(*number, libc::SIGINT | libc::SIGQUIT),
                    });
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_arguments_are_described_only_when_asked() {
        let command =
            |argv: &[&str]| TargetSpec::Command(argv.iter().map(|a| a.to_string()).collect());
        let login = command(&["./client", "--password", "hunter2"]);
        assert_eq!(
            login.describe(false),
            "`./client` (2 arguments not recorded)"
        );
        assert_eq!(login.describe(true), "`./client --password hunter2`");
        assert_eq!(
            command(&["./client", "hunter2"]).describe(false),
            "`./client` (1 argument not recorded)"
        );
        assert_eq!(command(&["./server"]).describe(false), "`./server`");
    }

    #[test]
    fn commands_are_described_shell_quoted() {
        let target = TargetSpec::Command(vec![
            "sh".into(),
            "-c".into(),
            "echo it's $HOME".into(),
            "".into(),
            "a/b-c.txt".into(),
        ]);
        assert_eq!(
            target.describe(true),
            r#"`sh -c 'echo it'\''s $HOME' '' a/b-c.txt`"#
        );
    }

    #[test]
    fn programs_are_found_by_path_or_on_path() {
        assert_eq!(resolve_program("/bin/sh"), Some(PathBuf::from("/bin/sh")));
        assert!(resolve_program("sh").is_some_and(|path| path.ends_with("sh")));
        assert_eq!(resolve_program("/no/such/program"), None);
        assert_eq!(resolve_program("no-such-program-here"), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_command_runs_only_once_released() {
        let mut stopped = spawn_stopped(&["true".to_string()]).unwrap();
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(200), stopped.child.wait()).await;
        assert!(waited.is_err(), "the command ran before its release");
        stopped.release().unwrap();
        let status = stopped.child.wait().await.unwrap();
        assert!(status.success());
        let Err(err) = spawn_stopped(&["no-such-program-here".to_string()]) else {
            panic!("a missing program must not start");
        };
        assert_eq!(
            err.to_string(),
            "cannot run 'no-such-program-here': no such file, or not on PATH"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_command_never_released_never_runs() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let script = format!("touch {}", marker.display());
        let mut stopped = spawn_stopped(&["sh".to_string(), "-c".to_string(), script]).unwrap();
        // The profiler failed before the start: its end of the pipe closes unwritten.
        let (_, unused) = std::io::pipe().unwrap();
        drop(std::mem::replace(&mut stopped.release, unused));
        let status = stopped.child.wait().await.unwrap();
        assert_eq!(status.code(), Some(127));
        assert!(!marker.exists(), "the command ran without its profiler");
    }

    fn received(number: i32, from_terminal: bool) -> Option<StopSignal> {
        Some(StopSignal {
            number,
            from_terminal,
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_stop_signal_is_forwarded_and_the_command_waited_for() {
        let mut stopped = spawn_stopped(&["sleep".to_string(), "30".to_string()]).unwrap();
        stopped.release().unwrap();
        let mut shutdown = Shutdown::new(None);
        let stop = shutdown.stop(received(libc::SIGINT, false), Some(&mut stopped));
        assert_eq!(
            stop.await.unwrap(),
            None,
            "the run goes on until the command exits"
        );
        let stop = shutdown.command_exited(stopped.child.wait().await.unwrap());
        let ending = shutdown.ending(stop);
        assert_eq!(ending.stop, Stop::Signal(libc::SIGINT));
        assert_eq!(ending.command, Some(CommandEnd::Signaled(libc::SIGINT)));
        assert_eq!(ending.killed, None);
        assert_eq!(
            ending.describe(),
            "the profiler received SIGINT and forwarded it to the command, and the command was \
             killed by signal 2 (SIGINT)"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_terminals_signal_is_not_sent_twice_and_a_second_stop_kills() {
        let mut stopped = spawn_stopped(&["sleep".to_string(), "30".to_string()]).unwrap();
        stopped.release().unwrap();
        let mut shutdown = Shutdown::new(None);
        let stop = shutdown.stop(received(libc::SIGINT, true), Some(&mut stopped));
        assert_eq!(stop.await.unwrap(), None);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            stopped.child.try_wait().unwrap().is_none(),
            "the terminal's signal was sent to the command again"
        );
        let stop = shutdown.stop(received(libc::SIGTERM, false), Some(&mut stopped));
        assert_eq!(stop.await.unwrap(), Some(Stop::Signal(libc::SIGINT)));
        let ending = shutdown.ending(Stop::Signal(libc::SIGINT));
        assert_eq!(ending.command, Some(CommandEnd::Signaled(libc::SIGKILL)));
        assert_eq!(ending.killed, Some(Stop::Signal(libc::SIGTERM)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_command_ignoring_the_duration_is_killed_after_the_grace() {
        let mut stubborn = spawn_stopped(&[
            "sh".to_string(),
            "-c".to_string(),
            "trap '' TERM; sleep 30".to_string(),
        ])
        .unwrap();
        stubborn.release().unwrap();
        let mut signals = StopSignals::catch().unwrap();
        let mut shutdown = Shutdown::new(Some(Duration::from_millis(200)));
        assert_eq!(shutdown.next_stop(&mut signals).await, None);
        assert_eq!(
            shutdown.stop(None, Some(&mut stubborn)).await.unwrap(),
            None
        );
        let started = std::time::Instant::now();
        assert_eq!(shutdown.next_stop(&mut signals).await, None);
        assert!(started.elapsed() >= GRACE, "killed before its grace period");
        let stop = shutdown.stop(None, Some(&mut stubborn)).await.unwrap();
        assert_eq!(stop, Some(Stop::Duration));
        let ending = shutdown.ending(Stop::Duration);
        assert_eq!(ending.command, Some(CommandEnd::Signaled(libc::SIGKILL)));
        assert_eq!(ending.killed, Some(Stop::Duration));
        assert!(ending.describe().starts_with(
            "--duration ended: the command was sent SIGTERM, and the command was killed by signal 9"
        ));
    }

    #[test]
    fn the_exit_code_is_the_commands() {
        assert_eq!(
            CommandEnd::exit_code(Some(CommandEnd::Exited(3))),
            ExitCode::from(3)
        );
        assert_eq!(
            CommandEnd::exit_code(Some(CommandEnd::Signaled(11))),
            ExitCode::from(139)
        );
        assert_eq!(CommandEnd::exit_code(None), ExitCode::SUCCESS);
        let after_failure = CommandEnd::exit_code_after_failed_outputs;
        assert_eq!(
            after_failure(Some(CommandEnd::Exited(0))),
            ExitCode::FAILURE
        );
        assert_eq!(
            after_failure(Some(CommandEnd::Exited(7))),
            ExitCode::from(7)
        );
        assert_eq!(after_failure(None), ExitCode::FAILURE);
        assert_eq!(
            CommandEnd::Signaled(15).describe(),
            "was killed by signal 15 (SIGTERM)"
        );
    }

    #[test]
    fn zombies_and_missing_processes_are_not_running() {
        assert!(process_running(std::process::id()));
        assert!(!process_running(u32::MAX - 1));
    }
}

/// What to profile or count, as the user said it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// Launch this command and follow it.
    Command(Vec<String>),
    Processes(Vec<u32>),
    System,
}

/// A word as a POSIX shell reads it back: as is when it is only safe characters, else in
/// single quotes (a quote inside written `'\''`).
pub fn shell_quoted(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

impl TargetSpec {
    /// For reports: `` `cmd args` ``, `process 1,2`, `all CPUs`. A command's arguments can hold
    /// secrets (a password, a token): unless `arguments`, only the program is named, with how
    /// many arguments were left out.
    pub fn describe(&self, arguments: bool) -> String {
        match self {
            TargetSpec::Command(argv) if arguments || argv.len() < 2 => {
                let words: Vec<String> = argv.iter().map(|word| shell_quoted(word)).collect();
                format!("`{}`", words.join(" "))
            }
            TargetSpec::Command(argv) => format!(
                "`{}` ({} argument{} not recorded)",
                shell_quoted(&argv[0]),
                argv.len() - 1,
                if argv.len() == 2 { "" } else { "s" }
            ),
            TargetSpec::Processes(pids) => format!(
                "process {}",
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            TargetSpec::System => "all CPUs".to_string(),
        }
    }
}
