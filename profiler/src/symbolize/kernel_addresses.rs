//! Hiding kernel addresses from what the profiler writes when the kernel hides them from the
//! user running it (`kernel.kptr_restrict`: 0 shows them to everyone, 1 only to processes with
//! CAP_SYSLOG, 2 to no one), so that a profile, an export or a `--raw` stream never undoes
//! KASLR for a reader the kernel would not tell. Kernel functions keep their names and the
//! offsets into them; their addresses, and kernel data addresses, become 0.

use std::sync::OnceLock;

use super::is_kernel_address;
use crate::profile::Profile;

/// CAP_SYSLOG's bit in the capability sets of /proc/self/status.
const CAP_SYSLOG: u32 = 34;

/// Whether the kernel shows its addresses to this process (read once).
pub fn kernel_addresses_shown() -> bool {
    static SHOWN: OnceLock<bool> = OnceLock::new();
    *SHOWN.get_or_init(|| {
        let kptr_restrict = std::fs::read_to_string("/proc/sys/kernel/kptr_restrict")
            .ok()
            .and_then(|text| text.trim().parse().ok());
        shown_under(kptr_restrict, has_cap_syslog())
    })
}

/// `kptr_restrict`'s rule; an unreadable setting counts as the kernel's default, 0.
fn shown_under(kptr_restrict: Option<u32>, cap_syslog: bool) -> bool {
    match kptr_restrict.unwrap_or(0) {
        0 => true,
        1 => cap_syslog,
        _ => false,
    }
}

/// Whether CAP_SYSLOG is in this process's effective set (what the kernel checks).
fn has_cap_syslog() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|effective| effective & (1 << CAP_SYSLOG) != 0)
}

/// A kernel address as it may be written: itself when the kernel shows addresses, else 0.
pub fn shown_address(address: u64, shown: bool) -> u64 {
    if shown || !is_kernel_address(address) {
        address
    } else {
        0
    }
}

/// Replaces the kernel addresses in `profile`: a kernel frame keeps its function and the
/// offset into it (as its address, with the function at 0), an unsymbolized one keeps none;
/// data cache lines in kernel memory become line 0.
pub fn hide_kernel_addresses(profile: &mut Profile) {
    for frame in profile.frames.iter_mut().filter(|frame| frame.kernel) {
        let offset = frame
            .function_address
            .map_or(0, |start| frame.address.wrapping_sub(start));
        frame.address = offset;
        frame.module_offset = offset;
        frame.function_address = frame.function_address.map(|_| 0);
    }
    let hide = |line: &mut u64| *line = shown_address(*line, false);
    profile
        .data_lines
        .iter_mut()
        .for_each(|s| hide(&mut s.line));
    profile
        .line_latency
        .iter_mut()
        .for_each(|h| hide(&mut h.line));
    for sample in &mut profile.hardware.samples {
        if let Some(line) = &mut sample.line {
            hide(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{aggregate::location::instruction_location, profile::Frame};

    #[test]
    fn kptr_restrict_decides_as_the_kernel_does() {
        assert!(shown_under(Some(0), false));
        assert!(shown_under(None, false));
        assert!(shown_under(Some(1), true));
        assert!(!shown_under(Some(1), false));
        assert!(!shown_under(Some(2), true));
    }

    #[test]
    fn kernel_frames_keep_names_and_offsets_only() {
        let kernel = Frame {
            address: 0xffff_ffff_8123_4567,
            kernel: true,
            module: "[kernel.kallsyms]".into(),
            module_offset: 0xffff_ffff_8123_4567,
            function: Some("do_syscall_64".into()),
            function_address: Some(0xffff_ffff_8123_4500),
            ..Frame::default()
        };
        let unsymbolized = Frame {
            function: None,
            function_address: None,
            ..kernel.clone()
        };
        let user = Frame {
            address: 0x40_1136,
            module: "/usr/bin/demo".into(),
            module_offset: 0x1136,
            function: Some("spin".into()),
            function_address: Some(0x40_1120),
            ..Frame::default()
        };
        let mut profile = Profile {
            frames: vec![kernel, unsymbolized, user.clone()],
            data_lines: vec![
                crate::profile::DataLineSample {
                    line: 0xffff_8880_0000_0040,
                    ..Default::default()
                },
                crate::profile::DataLineSample {
                    line: 0x7ffd_0000_0040,
                    ..Default::default()
                },
            ],
            ..Profile::default()
        };
        hide_kernel_addresses(&mut profile);
        assert_eq!(
            instruction_location(&profile.frames[0]),
            "do_syscall_64+0x67"
        );
        assert_eq!(
            (profile.frames[0].address, profile.frames[0].module_offset),
            (0x67, 0x67)
        );
        assert_eq!(profile.frames[1].display_name(), "[kernel.kallsyms]+0x0");
        assert_eq!(profile.frames[2], user);
        let lines: Vec<u64> = profile.data_lines.iter().map(|s| s.line).collect();
        assert_eq!(lines, [0, 0x7ffd_0000_0040]);
    }
}
