//! Running one command and measuring it from the outside: wall time, CPU time and peak RSS of
//! its whole process tree (wait4), plus what the workload wrapper `run_timed` measured inside.

use std::{
    fs::File,
    io::Read,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// What one command cost.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    /// The command line, exactly as run.
    pub command: String,
    /// From fork to exit, the tool's start-up and teardown included.
    pub wall_s: f64,
    /// User + system time of the command and every descendant it waited for.
    pub cpu_s: f64,
    /// Peak resident set of the largest process in the tree.
    pub max_rss_kib: u64,
    /// Bytes the command wrote to stdout.
    pub stdout_bytes: u64,
    /// The workload's own figures, when it ran under `run_timed`.
    pub workload: Option<WorkloadTimes>,
    #[serde(skip)]
    pub stderr: String,
}

/// The workload's cost as `run_timed` measured it: without the tool's start-up and teardown.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct WorkloadTimes {
    pub wall_s: f64,
    /// User + system time of the workload's process tree.
    pub cpu_s: f64,
    /// Minor + major page faults of the workload's process tree.
    pub page_faults: u64,
}

/// Quotes an argument for a POSIX shell where it needs it, so printed commands can be pasted.
pub fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

pub fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| shell_quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

fn timeval_s(time: libc::timeval) -> f64 {
    time.tv_sec as f64 + time.tv_usec as f64 * 1e-6
}

/// Runs `argv` to completion with stdout into `stdout` (or discarded) and stderr captured;
/// fails, showing the end of stderr, when it does not exit with status 0.
pub fn run(argv: &[String], stdout: Option<&Path>) -> Result<Measured> {
    run_with_checkpoints(argv, stdout, &[], tree_cpu_s).map(|(measured, _)| measured)
}

/// CPU seconds of the process tree rooted at `root`, as /proc has them now: every live
/// thread's run time (schedstat, in nanoseconds: a tool using half a percent of a core runs
/// under one clock tick a second) plus what each process reaped of its exited children.
pub fn tree_cpu_s(root: u32) -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let threads_run_s = |pid: u32| -> f64 {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .filter_map(|schedstat| schedstat.split_whitespace().next()?.parse::<u64>().ok())
            .sum::<u64>() as f64
            / 1e9
    };
    processes_under(root)
        .into_iter()
        .map(|process| threads_run_s(process.pid) + process.reaped_ticks as f64 / ticks_per_second)
        .sum()
}

/// The pids of the process tree rooted at `root`, as /proc has it now.
pub fn process_tree(root: u32) -> Vec<u32> {
    processes_under(root)
        .into_iter()
        .map(|process| process.pid)
        .collect()
}

struct Process {
    pid: u32,
    /// CPU ticks of the children it reaped.
    reaped_ticks: u64,
}

/// The processes of the tree rooted at `root`.
fn processes_under(root: u32) -> Vec<Process> {
    // (pid, ppid, children's ticks)
    let mut processes: Vec<(u32, u32, u64)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may hold spaces: fields count from after its closing parenthesis.
        let Some((_, after)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        let field = |n: usize| {
            fields
                .get(n)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // After the name: state(0) ppid(1) ... cutime(13) cstime(14).
        processes.push((pid, field(1) as u32, field(13) + field(14)));
    }
    let mut tree = vec![root];
    let mut under = Vec::new();
    while let Some(pid) = tree.pop() {
        for &(process, parent, reaped_ticks) in &processes {
            if process == pid {
                under.push(Process { pid, reaped_ticks });
            }
            if parent == pid {
                tree.push(process);
            }
        }
    }
    under
}

/// [`run`], also taking a reading at each of `checkpoints` after its start: `read` is given
/// the command's pid (e.g. [`tree_cpu_s`], which reads 0 for a checkpoint the command did not
/// live to).
pub fn run_with_checkpoints<T: Send + 'static>(
    argv: &[String],
    stdout: Option<&Path>,
    checkpoints: &[std::time::Duration],
    read: impl Fn(u32) -> T + Send + 'static,
) -> Result<(Measured, Vec<T>)> {
    let command = command_line(argv);
    let out = match stdout {
        Some(path) => {
            Stdio::from(File::create(path).with_context(|| format!("creating {}", path.display()))?)
        }
        None => Stdio::null(),
    };
    let start = Instant::now();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start `{command}`"))?;
    let root = child.id();
    let checkpoints = checkpoints.to_vec();
    let reading = std::thread::spawn(move || {
        checkpoints
            .iter()
            .map(|&at| {
                std::thread::sleep(at.saturating_sub(start.elapsed()));
                read(root)
            })
            .collect::<Vec<T>>()
    });
    let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
    // Read stderr while the command runs, so a chatty command never blocks on a full pipe.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr_pipe.read_to_string(&mut text).map(|_| text)
    });
    let mut status = 0;
    // SAFETY: rusage is plain old data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes one status and one rusage through valid pointers; the child is ours
    // and std's Child is never waited on after this.
    let waited = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let wall_s = start.elapsed().as_secs_f64();
    if waited < 0 {
        bail!(
            "waiting for `{command}`: {}",
            std::io::Error::last_os_error()
        );
    }
    let stderr = reader
        .join()
        .expect("the stderr reader does not panic")
        .with_context(|| format!("reading the stderr of `{command}`"))?;
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        // A runtime's own account of a crash (Go's `fatal error:`, a `panic:`) heads a dump
        // longer than the tail.
        let crash = stderr
            .lines()
            .find(|line| line.starts_with("fatal error:") || line.starts_with("panic:"))
            .map(|line| format!("{line}\n...\n"))
            .unwrap_or_default();
        bail!(
            "`{command}` failed (wait status {status:#x}); its stderr:\n{crash}{}",
            tail.join("\n")
        );
    }
    let at_checkpoints = reading.join().expect("the CPU reader does not panic");
    let measured = Measured {
        wall_s,
        cpu_s: timeval_s(usage.ru_utime) + timeval_s(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as u64,
        stdout_bytes: stdout
            .map(|path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
            .unwrap_or(0),
        workload: parse_run_timed(&stderr),
        stderr,
        command,
    };
    Ok((measured, at_checkpoints))
}

/// The `run_timed: wall_ns=.. user_ns=.. sys_ns=.. minflt=.. majflt=.. status=..` line.
pub fn parse_run_timed(stderr: &str) -> Option<WorkloadTimes> {
    let line = stderr
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("run_timed: "))?;
    let field = |name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    Some(WorkloadTimes {
        wall_s: field("wall_ns")? as f64 * 1e-9,
        cpu_s: (field("user_ns")? + field("sys_ns")?) as f64 * 1e-9,
        page_faults: field("minflt")? + field("majflt")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_run_timed_line_among_other_output() {
        let stderr = "note: sampling cpu-clock\nrun_timed: wall_ns=1500000000 user_ns=1000000000 \
                      sys_ns=250000000 minflt=70 majflt=2 status=0\nprofile written\n";
        assert_eq!(
            parse_run_timed(stderr),
            Some(WorkloadTimes {
                wall_s: 1.5,
                cpu_s: 1.25,
                page_faults: 72
            })
        );
        assert_eq!(parse_run_timed("run_timed: wall_ns=5 status=0"), None);
    }

    #[test]
    fn quotes_only_what_the_shell_would_split_or_expand() {
        assert_eq!(
            command_line(&["perf".into(), "record".into(), "-F".into(), "1000".into()]),
            "perf record -F 1000"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
