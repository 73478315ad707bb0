//! The capture program's configuration for a session: which stacks it walks and how, what it
//! streams and filters, resolved against what this kernel supports.

use profiler_common::capture::{
    CaptureConfig, CAPTURE_DATA_SOURCES, CAPTURE_EVENT_IDS, CAPTURE_FILTER_CGROUP,
    CAPTURE_FILTER_UID, CAPTURE_INSTRUCTIONS, CAPTURE_KERNEL_STACKS, CAPTURE_QUIET_NEW_PROCESSES,
    CAPTURE_RAW, CAPTURE_STACK_COPY, CAPTURE_TABLES_BY_FILE, CAPTURE_UNWIND_DWARF,
    CAPTURE_USER_STACKS, OFFSETS_VMA_TREE, STACK_COPY_PAGE_BYTES,
};

use super::{
    capture::kernel_release,
    options::{CaptureOptions, Unwind},
};
use crate::{
    capture::hardware::{hardware_sample_type, sample::DATA_SRC},
    launch::TargetSpec,
};

/// The first kernel with the helpers the unwinder reads a task's user registers with
/// (`bpf_get_current_task_btf` 5.11, `bpf_task_pt_regs` 5.15).
const UNWINDER_KERNEL: (u32, u32) = (5, 15);

/// `major.minor` of a kernel release string (`6.1.0-50-cloud-amd64`).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// How user stacks are walked on this kernel: `--unwind dwarf` needs 5.15; before it, frame
/// pointers (and for `check`, the copies alone), with a note.
fn unwind_on_this_kernel(asked: Unwind) -> Unwind {
    let release = kernel_release();
    match (asked, kernel_version(&release)) {
        (Unwind::Dwarf | Unwind::Check, Some(version)) if version < UNWINDER_KERNEL => {
            let (name, instead, fallback) = match asked {
                Unwind::Check => (
                    "check",
                    "unwound from copies only, with nothing to compare",
                    Unwind::Copy,
                ),
                _ => ("dwarf", "walked by frame pointers", Unwind::Fp),
            };
            eprintln!(
                "note: --unwind {name} needs Linux {}.{} or later (bpf_task_pt_regs); this \
                 kernel is {release}: user stacks are {instead}",
                UNWINDER_KERNEL.0, UNWINDER_KERNEL.1
            );
            fallback
        }
        _ => asked,
    }
}

pub(crate) fn capture_config(options: &CaptureOptions) -> CaptureConfig {
    let mut config = CaptureConfig::EMPTY;
    if let Some(offsets) = options.offsets {
        config.offsets = offsets;
    }
    let mut flags = 0;
    if options.stacks.user {
        flags |= CAPTURE_USER_STACKS;
        if unwind_on_this_kernel(options.unwind).walks_tables() {
            flags |= CAPTURE_UNWIND_DWARF;
            if options.target == TargetSpec::System {
                flags |= CAPTURE_QUIET_NEW_PROCESSES;
                // System-wide, where the walker reads the kernel's own tree of mappings,
                // tables go by file only: no process waits for the agent to publish it, and
                // process churn costs the agent only what new files cost. A launched command
                // or followed processes are few, and stay published: their first sample wakes
                // the agent at once, which reads the side-band then (their Python frames from
                // their first milliseconds).
                if options
                    .offsets
                    .is_some_and(|offsets| offsets.valid & OFFSETS_VMA_TREE != 0)
                {
                    flags |= CAPTURE_TABLES_BY_FILE;
                }
            }
        }
    }
    if options.stacks.kernel {
        flags |= CAPTURE_KERNEL_STACKS;
    }
    if options.raw.is_some() {
        flags |= CAPTURE_RAW;
    }
    if options.per_instruction {
        flags |= CAPTURE_INSTRUCTIONS;
    }
    if !options.cgroups.is_empty() {
        flags |= CAPTURE_FILTER_CGROUP;
    }
    if let Some(uid) = options.uid {
        flags |= CAPTURE_FILTER_UID;
        config.uid = uid;
    }
    if options.events.len() > 1 {
        flags |= CAPTURE_EVENT_IDS;
    }
    if let Some(kib) = options.stack_copy_kib {
        flags |= CAPTURE_STACK_COPY;
        // The stack pointer's page, from below the pointer, and enough pages above it.
        let page_kib = (STACK_COPY_PAGE_BYTES / 1024) as u32;
        config.stack_copy_pages = kib.div_ceil(page_kib) + 1;
    }
    let reports_data_sources = options
        .events
        .iter()
        .any(|spec| hardware_sample_type(spec, false).0 & DATA_SRC != 0);
    if reports_data_sources {
        flags |= CAPTURE_DATA_SOURCES;
    }
    config.flags = flags;
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_release_strings() {
        assert_eq!(kernel_version("5.10.0-32-cloud-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(kernel_version("garbage"), None);
        assert!(kernel_version("5.10.0").unwrap() < UNWINDER_KERNEL);
        assert!(kernel_version("5.15.0").unwrap() >= UNWINDER_KERNEL);
    }
}
