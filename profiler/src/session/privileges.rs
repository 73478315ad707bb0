//! What a session needs beyond opening counters and loading the program, checked before
//! anything starts: reading the profiled processes' mappings and files, and kernel symbols.

use anyhow::{anyhow, Result};

use super::options::CaptureOptions;
use crate::launch::TargetSpec;

/// Capability numbers (linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// Whether this process holds capability `cap` (CapEff in /proc/self/status).
fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status
                .lines()
                .find_map(|line| line.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|effective| effective & (1 << cap) != 0)
}

/// Whether /proc/kallsyms hides addresses from this process (`kernel.kptr_restrict`, or
/// `perf_event_paranoid` above 1 without CAP_SYSLOG): kernel frames cannot be named then.
fn kernel_symbols_hidden() -> bool {
    let mut first = String::new();
    let read = std::fs::File::open("/proc/kallsyms").and_then(|file| {
        std::io::BufRead::read_line(&mut std::io::BufReader::new(file), &mut first)
    });
    read.is_err()
        || first
            .split_whitespace()
            .next()
            .is_none_or(|address| address.bytes().all(|b| b == b'0'))
}

/// Checks, before anything starts, what the run needs beyond opening counters and loading the
/// program: reading the mappings and files of the processes it profiles (ptrace access), and
/// kernel symbols. A `-p` process that cannot be read is an error; the rest are notes, returned.
pub(crate) fn check_privileges(options: &CaptureOptions) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    match &options.target {
        TargetSpec::Processes(pids) => {
            for pid in pids {
                let maps = format!("/proc/{pid}/maps");
                let readable = std::fs::File::open(&maps)
                    .and_then(|mut file| std::io::Read::read(&mut file, &mut [0u8; 1]))
                    .and_then(|_| std::fs::read_link(format!("/proc/{pid}/root")));
                match readable {
                    // A process that does not exist is reported where its counters are opened.
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(anyhow!(
                            "-p {pid}: cannot read the process's mappings and files \
                             ({maps}, /proc/{pid}/root: {e}), so its code could not be named: \
                             profile it as its own user, or with CAP_SYS_PTRACE"
                        ));
                    }
                }
            }
        }
        // SAFETY: geteuid has no preconditions.
        TargetSpec::System
            if unsafe { libc::geteuid() } != 0 && !has_capability(CAP_SYS_PTRACE) =>
        {
            notes.push(
                "without CAP_SYS_PTRACE, other users' processes cannot be read: their samples \
                 are counted but their code is not named"
                    .to_string(),
            );
        }
        _ => {}
    }
    if options.stacks.kernel && kernel_symbols_hidden() {
        notes.push(
            "kernel symbols are hidden from this user (kernel.kptr_restrict, or \
             kernel.perf_event_paranoid above 1 without CAP_SYSLOG): kernel frames are not named; \
             --no-kernel-stacks leaves them out"
                .to_string(),
        );
    }
    Ok(notes)
}
