//! Many short-lived processes: forks and execs a tiny child (this program, told to exit at
//! once) again and again, so a profiler follows process creation, exec and exit at a high rate.
//!
//! Usage: short_processes [CHILDREN] (default 500)

use std::process::Command;

/// The argument that makes this program the tiny child: exit at once, like `true`.
const CHILD: &str = "--exit-now";

fn main() {
    let argument = std::env::args().nth(1);
    if argument.as_deref() == Some(CHILD) {
        return;
    }
    let children: u64 = argument.and_then(|a| a.parse().ok()).unwrap_or(500);
    let program = std::env::current_exe().expect("cannot find this program's own path");
    for _ in 0..children {
        let status = Command::new(&program)
            .arg(CHILD)
            .status()
            .expect("cannot start the child process");
        assert!(status.success(), "the child process failed: {status}");
    }
    eprintln!("short_processes: {children} children");
}
