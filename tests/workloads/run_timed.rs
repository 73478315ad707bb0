//! Runs a command and reports what it cost, measured from the inside of a profiler's run: the
//! command's wall time (fork to exit, without the profiler's own start-up and teardown) and the
//! CPU time and page faults of its whole process tree (wait4's rusage covers every descendant
//! that was waited for).
//!
//! Usage: run_timed COMMAND [ARGS...]
//! Prints on stderr: `run_timed: wall_ns=N user_ns=N sys_ns=N minflt=N majflt=N status=N`
//! and exits with the command's status. The command's stdout goes to stderr, so a profiler's
//! report on stdout stays clean.

use std::{process::Command, time::Instant};

fn timeval_ns(time: libc::timeval) -> u64 {
    time.tv_sec as u64 * 1_000_000_000 + time.tv_usec as u64 * 1_000
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let Some(program) = argv.next() else {
        eprintln!("usage: run_timed COMMAND [ARGS...]");
        std::process::exit(2);
    };
    let start = Instant::now();
    // The command's stdout goes to stderr: a profiler's report owns stdout.
    let child = match Command::new(&program)
        .args(argv)
        .stdout(std::io::stderr())
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            eprintln!("run_timed: cannot start {program}: {error}");
            std::process::exit(127);
        }
    };
    let mut status = 0;
    // SAFETY: rusage is plain old data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes one status and one rusage through valid pointers; the child is ours
    // and not yet waited for (std's Child is never waited on after this).
    let waited = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    if waited < 0 {
        eprintln!(
            "run_timed: wait4 failed: {}",
            std::io::Error::last_os_error()
        );
        std::process::exit(127);
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    eprintln!(
        "run_timed: wall_ns={} user_ns={} sys_ns={} minflt={} majflt={} status={code}",
        wall.as_nanos(),
        timeval_ns(usage.ru_utime),
        timeval_ns(usage.ru_stime),
        usage.ru_minflt,
        usage.ru_majflt,
    );
    std::process::exit(code);
}
