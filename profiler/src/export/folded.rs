//! Folded stacks (Brendan Gregg's format, as `perf script | stackcollapse-perf.pl` writes it): one
//! line per distinct stack of one event, `comm;root;...;leaf count`, stacks merged across threads
//! that share a command name.
//!
//! Frame names follow stackcollapse-perf's annotations, which flame graph palettes colour by:
//! kernel frames end in `_[k]`, functions inlined into user code in `_[i]` (listed after the
//! function they were inlined into, outermost first). Code without symbols is named by its
//! function's start, `module+0xstart` (see `symbolize::call_frames`), else `module+0xoffset`.
//! Counts are samples, and nanoseconds blocked for `off-cpu`.

use std::collections::BTreeMap;
use std::io::Write;

use super::{event_info, samples_of, stack_root_first, ExportError, StackEntry, StackRoots};
use crate::{
    profile::{EventIndex, Frame, Profile},
    symbolize::PYTHON_MODULE,
};

const KERNEL_SUFFIX: &str = "_[k]";
const INLINED_SUFFIX: &str = "_[i]";
/// Interpreted and JIT frames (Python's), in the flame graph only: its palette paints them apart.
const INTERPRETED_SUFFIX: &str = "_[j]";

/// Which frames the folded stacks annotate.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Annotations {
    /// stackcollapse-perf's: kernel and inlined frames.
    Perf,
    /// Also Python frames, as `_[j]`, for the flame graph's colours.
    Interpreted,
}

/// The folded stacks of `event`, sorted, each `stack count` without a line terminator.
pub fn folded_stacks(profile: &Profile, event: EventIndex) -> Result<Vec<String>, ExportError> {
    annotated_folded_stacks(profile, event, Annotations::Perf)
}

/// [`folded_stacks`] with `annotations`.
pub fn annotated_folded_stacks(
    profile: &Profile,
    event: EventIndex,
    annotations: Annotations,
) -> Result<Vec<String>, ExportError> {
    event_info(profile, event)?;
    let roots = StackRoots::new(profile);

    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    let mut stack = String::new();
    for sample in samples_of(profile, event) {
        stack.clear();
        push_name(&mut stack, &roots.of(sample), "");
        for entry in stack_root_first(profile, sample) {
            match entry {
                StackEntry::Frame(_, frame) => push_frame(&mut stack, frame, annotations),
                StackEntry::UserStackLost => {
                    push_name(&mut stack, StackEntry::USER_STACK_LOST, "");
                }
                StackEntry::KernelStackLost => {
                    push_name(&mut stack, StackEntry::KERNEL_STACK_LOST, KERNEL_SUFFIX);
                }
            }
        }
        *merged.entry(stack.clone()).or_default() += sample.measure();
    }
    Ok(merged
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect())
}

/// Writes the folded stacks of `event`, one per line.
pub fn write_folded(
    profile: &Profile,
    event: EventIndex,
    out: &mut impl Write,
) -> Result<(), ExportError> {
    for line in folded_stacks(profile, event)? {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The function of one folded frame, without its annotation.
pub fn folded_function(frame: &str) -> &str {
    [KERNEL_SUFFIX, INLINED_SUFFIX, INTERPRETED_SUFFIX]
        .iter()
        .find_map(|suffix| frame.strip_suffix(suffix))
        .unwrap_or(frame)
}

/// Appends a frame: its function, then the functions inlined at its address.
fn push_frame(stack: &mut String, frame: &Frame, annotations: Annotations) {
    let (own, inlined) = if frame.kernel {
        (KERNEL_SUFFIX, KERNEL_SUFFIX)
    } else if annotations == Annotations::Interpreted && frame.module == PYTHON_MODULE {
        (INTERPRETED_SUFFIX, INLINED_SUFFIX)
    } else {
        ("", INLINED_SUFFIX)
    };
    push_name(stack, &frame.display_name(), own);
    for inline in &frame.inlined {
        push_name(stack, &inline.function, inlined);
    }
}

/// Appends one `;`-separated name. `;` inside a name (Rust's `[u8; 4]`) would split the frame, and
/// a line break would split the line, so they are replaced as stackcollapse-perf does.
fn push_name(stack: &mut String, name: &str, suffix: &str) {
    if !stack.is_empty() {
        stack.push(';');
    }
    stack.extend(name.chars().map(|c| match c {
        ';' => ':',
        '\n' | '\r' => ' ',
        c => c,
    }));
    stack.push_str(suffix);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;

    #[test]
    fn cpu_clock_stacks_are_merged_annotated_and_sorted() {
        let lines = folded_stacks(&test_profile::profile(), 0).unwrap();
        assert_eq!(
            lines,
            [
                "app worker;<[u8: 4] as app::Worker>::run;libblob.so+0x4a10 10",
                "app;[user stack lost];do_syscall_64_[k] 5",
                "app;main;run;compute;vec_sum_[i];add_lanes_[i] 60",
                "app;main;run;do_syscall_64_[k] 25",
            ]
        );
    }

    #[test]
    fn event_filter_keeps_only_that_event() {
        let lines = folded_stacks(&test_profile::profile(), 1).unwrap();
        assert_eq!(
            lines,
            [
                "app worker;<[u8: 4] as app::Worker>::run;exc_page_fault_[k] 3",
                "app;main;run;compute;vec_sum_[i];add_lanes_[i];exc_page_fault_[k] 4",
            ]
        );
    }

    #[test]
    fn unknown_thread_is_named_by_pid_and_lost_kernel_stack_is_a_leaf() {
        let mut profile = test_profile::profile();
        profile.threads.clear();
        profile.stacks = vec![crate::profile::StackSample {
            pid: 7,
            tid: 8,
            frames: vec![test_profile::MAIN],
            kernel_stack_lost: true,
            count: 2,
            ..Default::default()
        }];
        let mut out = Vec::new();
        write_folded(&profile, 0, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[pid 7];main;[kernel stack lost]_[k] 2\n"
        );
    }

    #[test]
    fn unknown_event_is_an_error_naming_the_events() {
        let err = folded_stacks(&test_profile::profile(), 2).unwrap_err();
        assert_eq!(
            err.to_string(),
            "event index 2 does not exist: the profile has 2 event(s), numbered from 0"
        );
    }
}
