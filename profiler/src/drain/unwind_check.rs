//! `record --unwind check`: the in-kernel table walk and the copy unwinder on the same samples,
//! compared frame by frame. The walk counts each sample; its stack copy, unwound here with
//! framehop, waits until the walk's stack (named by its hash) has been drained into the stack
//! cache, and is then compared with it.

use std::fmt::Write;

use profiler_common::unwind_maps::is_marker_frame;

use super::stacks::StackCache;
use crate::{
    process::ProcessTable,
    unwind::copy::{StackEnd, UnwoundStack},
};

/// Differences kept to show, with their frames.
const EXAMPLES: usize = 3;

/// How the two unwinders' stacks of one sample compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// The same frames.
    Same,
    /// The same frames as far as the in-kernel walk went, which stopped first.
    KernelShorter,
    /// The same frames as far as the copy's walk went, which stopped first.
    CopyShorter,
    /// Frame `depth` (0: the sampled instruction) differs.
    Diverged { depth: usize },
}

/// Compares the frames the kernel's walk stored (with the marker that ends a stack cut short)
/// with the copy unwinder's.
pub fn compare(kernel: &[u64], copy: &[u64]) -> Agreement {
    let kernel = match kernel.split_last() {
        Some((&last, rest)) if is_marker_frame(last) => rest,
        _ => kernel,
    };
    match kernel.iter().zip(copy).position(|(k, c)| k != c) {
        Some(depth) => Agreement::Diverged { depth },
        None if kernel.len() < copy.len() => Agreement::KernelShorter,
        None if kernel.len() > copy.len() => Agreement::CopyShorter,
        None => Agreement::Same,
    }
}

/// A copy unwound, waiting for the kernel's stack of the same sample.
struct Pending {
    pid: u32,
    walked_in_kernel: u64,
    copy: UnwoundStack,
}

/// A difference kept to show, its frames as module and offset.
struct Example {
    pid: u32,
    agreement: Agreement,
    kernel: Vec<String>,
    copy: Vec<String>,
    copy_end: StackEnd,
}

/// A frame of process `pid` as `module+offset`, or its address where no code mapping holds it.
fn describe(processes: &ProcessTable, pid: u32, frame: u64) -> String {
    if is_marker_frame(frame) {
        return "[marker]".to_string();
    }
    match processes.code_mapping_for(pid, frame) {
        Some(mapping) => format!(
            "{}+{:#x}",
            crate::profile::module_basename(&mapping.path),
            frame - mapping.start + mapping.file_offset
        ),
        None => format!("{frame:#x}"),
    }
}

/// The comparison of a run's samples.
#[derive(Default)]
pub struct UnwinderComparison {
    pending: Vec<Pending>,
    compared: u64,
    same: u64,
    kernel_shorter: u64,
    copy_shorter: u64,
    diverged: u64,
    /// Differences at the sampled instruction (depth 0), which would mean the two read
    /// different registers.
    diverged_at_leaf: u64,
    /// Copies whose walk ended because the copy held too little of the stack.
    copy_too_small: u64,
    examples: Vec<Example>,
}

impl UnwinderComparison {
    /// Queues the copy of a sample whose table walk stored the user stack `walked_in_kernel`.
    pub fn add(&mut self, pid: u32, walked_in_kernel: u64, copy: UnwoundStack) {
        self.pending.push(Pending {
            pid,
            walked_in_kernel,
            copy,
        });
    }

    /// Compares the queued copies whose kernel stacks `cache` holds; the rest wait for a later
    /// drain. `processes` names the modules of the differences kept to show.
    pub fn compare_drained(&mut self, cache: &StackCache, processes: &ProcessTable) {
        let pending = std::mem::take(&mut self.pending);
        for check in pending {
            let kernel = cache.frames(check.walked_in_kernel);
            if kernel.is_empty() {
                self.pending.push(check);
                continue;
            }
            // The Python frames the walker read after the native ones: the copy has none.
            let kernel: Vec<u64> = kernel
                .iter()
                .copied()
                .filter(|frame| profiler_common::python::decode_frame(*frame).is_none())
                .collect();
            let kernel = kernel.as_slice();
            let agreement = compare(kernel, &check.copy.frames);
            self.count(agreement, check.copy.end);
            if agreement != Agreement::Same && self.examples.len() < EXAMPLES {
                let described = |frames: &[u64]| {
                    frames
                        .iter()
                        .map(|frame| describe(processes, check.pid, *frame))
                        .collect()
                };
                self.examples.push(Example {
                    pid: check.pid,
                    agreement,
                    kernel: described(kernel),
                    copy: described(&check.copy.frames),
                    copy_end: check.copy.end,
                });
            }
        }
    }

    fn count(&mut self, agreement: Agreement, copy_end: StackEnd) {
        self.compared += 1;
        match agreement {
            Agreement::Same => self.same += 1,
            Agreement::KernelShorter => self.kernel_shorter += 1,
            Agreement::CopyShorter => self.copy_shorter += 1,
            Agreement::Diverged { depth } => {
                self.diverged += 1;
                if depth == 0 {
                    self.diverged_at_leaf += 1;
                }
            }
        }
        if agreement != Agreement::Same && copy_end == StackEnd::CopyTooSmall {
            self.copy_too_small += 1;
        }
    }

    /// The comparison's lines, for the end of the recording.
    pub fn render(&self) -> String {
        let percent = |n: u64| 100.0 * n as f64 / self.compared.max(1) as f64;
        let mut out = format!(
            "Unwinders compared (--unwind check): {} samples walked in the kernel with tables and \
             unwound from a copy of their stack; {} agree frame by frame ({:.2}%); {} diverge \
             ({} at the sampled instruction), {} shorter in the kernel, {} shorter from the copy \
             ({} differing samples' copies held too little of the stack); {} not compared (the \
             kernel's stack was not drained)\n",
            self.compared,
            self.same,
            percent(self.same),
            self.diverged,
            self.diverged_at_leaf,
            self.kernel_shorter,
            self.copy_shorter,
            self.copy_too_small,
            self.pending.len(),
        );
        for example in &self.examples {
            let _ = writeln!(
                out,
                "  pid {} ({:?}):\n    kernel: {}\n    copy:   {} ({:?})",
                example.pid,
                example.agreement,
                example.kernel.join(" "),
                example.copy.join(" "),
                example.copy_end
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::unwind_maps::{FRAME_POINTERS_ONLY_FRAME, TRUNCATED_FRAME};

    #[test]
    fn the_same_frames_agree_whatever_marker_ends_the_kernels_stack() {
        assert_eq!(
            compare(&[0x1000, 0x2000], &[0x1000, 0x2000]),
            Agreement::Same
        );
        assert_eq!(
            compare(&[0x1000, 0x2000, TRUNCATED_FRAME], &[0x1000, 0x2000]),
            Agreement::Same
        );
        assert_eq!(
            compare(&[0x1000, FRAME_POINTERS_ONLY_FRAME], &[0x1000]),
            Agreement::Same
        );
    }

    #[test]
    fn differences_say_where_and_which_side_stopped() {
        assert_eq!(
            compare(&[0x1000, 0x2000], &[0x1000, 0x2000, 0x3000]),
            Agreement::KernelShorter
        );
        assert_eq!(
            compare(&[0x1000, 0x2000, 0x3000], &[0x1000, 0x2100, 0x3000]),
            Agreement::Diverged { depth: 1 }
        );
        assert_eq!(
            compare(&[0x1004], &[0x1000]),
            Agreement::Diverged { depth: 0 }
        );
    }

    #[test]
    fn counts_each_outcome_and_keeps_a_few_differences() {
        let mut comparison = UnwinderComparison::default();
        let copy = |frames: &[u64], end| UnwoundStack {
            frames: frames.to_vec(),
            end,
        };
        comparison.count(Agreement::Same, StackEnd::Root);
        comparison.count(Agreement::Diverged { depth: 0 }, StackEnd::Root);
        comparison.count(Agreement::CopyShorter, StackEnd::CopyTooSmall);
        comparison.add(7, 0x1234, copy(&[0x1000], StackEnd::Root));
        let text = comparison.render();
        assert!(text.contains("3 samples walked"), "{text}");
        assert!(text.contains("1 agree frame by frame (33.33%)"), "{text}");
        assert!(
            text.contains("1 diverge (1 at the sampled instruction)"),
            "{text}"
        );
        assert!(
            text.contains("1 shorter from the copy (1 differing"),
            "{text}"
        );
        assert!(text.contains("1 not compared"), "{text}");
    }
}
