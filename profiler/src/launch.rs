//! Launching the command to profile or count so that nothing it does is missed: it is started
//! stopped, counters are opened on its pid with `enable_on_exec`, and releasing it lets it exec
//! the real program, which switches the counters on exactly at that exec.

use std::{
    io::Write as _,
    os::{fd::AsRawFd, unix::process::CommandExt as _},
    path::PathBuf,
};

use anyhow::{anyhow, Context, Result};

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
}

/// File descriptor the trampoline reads the go-ahead from.
const GATE_FD: i32 = 3;
const TRAMPOLINE: &str = "read -r _ <&3; exec 3<&-; exec \"$@\"";

/// Finds a program the way exec does: a path as given, a bare name on PATH.
fn resolve_program(program: &str) -> Option<PathBuf> {
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
    // SAFETY: runs in the forked child before exec and only calls dup2(2), which is
    // async-signal-safe; the duplicate has no close-on-exec flag, so the shell inherits it.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(gate_fd, GATE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
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

#[cfg(test)]
mod tests {
    use super::*;

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
            target.describe(),
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
    /// For reports: `` `cmd args` ``, `process 1,2`, `all CPUs`.
    pub fn describe(&self) -> String {
        match self {
            TargetSpec::Command(argv) => {
                let words: Vec<String> = argv.iter().map(|word| shell_quoted(word)).collect();
                format!("`{}`", words.join(" "))
            }
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
