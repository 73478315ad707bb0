//! What a session costs the kernel (`record --stats`, the agent's metrics): the programs' run
//! time, and the memory its maps lock.

use std::path::Path;

use crate::capture::stats::MapMemory;

/// Enables the kernel's BPF run-time statistics (`record --stats`, `agent --bpf-stats`) while
/// held, when they are not on already; without the privilege (CAP_SYS_ADMIN) says so and goes
/// on without them.
pub(crate) fn enable_run_statistics() -> Option<std::os::fd::OwnedFd> {
    let already_on = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .is_ok_and(|value| value.trim() == "1");
    if already_on {
        return None;
    }
    match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(e) => {
            eprintln!(
                "note: the programs' cost in the kernel is not measured: enabling BPF run-time \
                 statistics needs CAP_SYS_ADMIN or kernel.bpf_stats_enabled=1 ({})",
                e.io_error
            );
            None
        }
    }
}

/// Kernel memory locked by the BPF maps this process holds (fdinfo memlock), read from its own
/// descriptors: looking maps up by id would need CAP_SYS_ADMIN.
pub(crate) fn held_map_memory() -> MapMemory {
    // The kernel sizes per-CPU values for the possible CPUs.
    let cpus = aya::util::nr_cpus().map_or(1, |cpus| cpus as u64);
    let mut memory = MapMemory {
        cpus,
        ..MapMemory::default()
    };
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return memory;
    };
    for entry in entries.flatten() {
        let is_map = std::fs::read_link(entry.path())
            .is_ok_and(|link| link.as_os_str() == "anon_inode:bpf-map");
        if !is_map {
            continue;
        }
        let fdinfo = Path::new("/proc/self/fdinfo").join(entry.file_name());
        if let Ok(text) = std::fs::read_to_string(fdinfo) {
            memory += MapMemory::of_fdinfo(&text, cpus).unwrap_or_default();
        }
    }
    memory
}
