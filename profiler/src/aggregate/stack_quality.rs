//! How whole the user call stacks of an event are: how many reach the root of a program or
//! thread (`_start`, `main`, a thread start), how many end early, how many were lost, and their
//! mean depth. A profile whose stacks stop at the leaf (frame-pointer walks through code built
//! without frame pointers) says so here instead of showing a confident but wrong call graph.

use crate::{
    profile::{EventIndex, Profile},
    symbolize::{FRAME_POINTERS_ONLY_FUNCTION, TRUNCATED_FUNCTION},
};

use super::{filter::Selection, startup::is_runtime_root};

/// Whether a user stack that reaches `function` may be whole: the program's `main`, or a
/// function a runtime starts a program or a thread in (a stripped program's own `_start`
/// has no name, so the root is looked for among all the frames).
fn is_stack_root(function: &str) -> bool {
    function == "main" || is_runtime_root(function)
}

/// Kernel functions a sample passes through while its process's memory is being torn down
/// (exit) or replaced (exec). Under churn most stacks cut short are these.
const MEMORY_GOING: &[&str] = &["exit_mmap", "do_exit", "begin_new_exec", "load_elf_binary"];

/// The user stacks of one event's samples (those with user code; kernel threads have none).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackQuality {
    /// Samples with a user stack, or whose user stack was lost.
    pub user_samples: u64,
    /// Samples whose user stack reaches a root ([`is_stack_root`]), through code only, and
    /// whose walk ended there, not in a `[truncated]` marker.
    pub complete: u64,
    /// Samples whose user stack holds an address outside every mapping (a walk gone astray:
    /// garbage read as a return address), wherever it ends: cut short.
    pub outside_code: u64,
    /// Samples whose user stack is cut short while the kernel was tearing down or replacing
    /// the process's memory (in exit or exec): nothing was left to walk, whatever the unwinder.
    pub in_exit_or_exec: u64,
    /// Samples whose user stack could not be read at all.
    pub lost: u64,
    /// Samples whose user stack was walked by frame pointers alone where tables or a stack
    /// copy were asked for (complete or not).
    pub frame_pointers_only: u64,
    /// Mean number of user frames of the samples with a user stack.
    pub mean_user_depth: f64,
}

impl StackQuality {
    /// Samples whose user stack ends before a root.
    pub fn incomplete(&self) -> u64 {
        self.user_samples - self.complete - self.lost
    }

    /// Complete stacks in percent of the samples with user code.
    pub fn complete_percent(&self) -> f64 {
        if self.user_samples == 0 {
            return 0.0;
        }
        100.0 * self.complete as f64 / self.user_samples as f64
    }
}

pub fn stack_quality(profile: &Profile, event: EventIndex, selection: &Selection) -> StackQuality {
    let mut quality = StackQuality::default();
    let mut frames_sum = 0;
    for stack in profile
        .stacks
        .iter()
        .filter(|s| s.event == event && selection.thread(s.pid, s.tid))
    {
        let frames = stack.frames.iter().map(|id| &profile.frames[*id as usize]);
        let memory_going = frames.clone().any(|frame| {
            frame.kernel
                && frame
                    .function
                    .as_deref()
                    .is_some_and(|function| MEMORY_GOING.contains(&function))
        });
        let mut user: Vec<_> = frames.filter(|frame| !frame.kernel).collect();
        // The marker is no frame of the program.
        let marked = user.len();
        user.retain(|frame| frame.function.as_deref() != Some(FRAME_POINTERS_ONLY_FUNCTION));
        if user.len() < marked {
            quality.frame_pointers_only += stack.count;
        }
        if stack.user_stack_lost {
            quality.user_samples += stack.count;
            quality.lost += stack.count;
            continue;
        }
        if user.is_empty() {
            continue;
        }
        quality.user_samples += stack.count;
        frames_sum += user.len() as u64 * stack.count;
        // Whole only when the walk reached a root and ended, not went past it into a marker or
        // stepped through garbage read as a return address (a thread's first block once walked
        // from `clone3` into one address outside every mapping, 126 times).
        let outside_code = user
            .iter()
            .any(|frame| frame.module.is_empty() && frame.function.is_none());
        let cut_short = user
            .last()
            .is_some_and(|outermost| outermost.function.as_deref() == Some(TRUNCATED_FUNCTION));
        let rooted = !cut_short
            && user
                .iter()
                .any(|frame| frame.function.as_deref().is_some_and(is_stack_root));
        if outside_code {
            quality.outside_code += stack.count;
        } else if rooted {
            quality.complete += stack.count;
            continue;
        }
        if memory_going {
            quality.in_exit_or_exec += stack.count;
        }
    }
    let with_frames = quality.user_samples - quality.lost;
    if with_frames > 0 {
        quality.mean_user_depth = frames_sum as f64 / with_frames as f64;
    }
    quality
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        aggregate::filter::SampleFilter,
        profile::test_profile,
        profile::{Frame, FrameId, StackSample},
    };

    #[test]
    fn stacks_reaching_main_are_complete_and_lost_ones_counted_apart() {
        let profile = test_profile::profile();
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let quality = stack_quality(&profile, 0, &selection);
        // 85 samples reach main; 10 end in the stripped library's caller; 5 lost their stack.
        assert_eq!(quality.user_samples, 100);
        assert_eq!(quality.complete, 85);
        assert_eq!(quality.lost, 5);
        assert_eq!(quality.incomplete(), 10);
        // (45 x 3 + 15 x 3 + 25 x 2 + 10 x 2) user frames over 95 samples.
        assert!((quality.mean_user_depth - 250.0 / 95.0).abs() < 1e-9);
    }

    #[test]
    fn stacks_walked_by_frame_pointers_only_are_counted_and_their_marker_is_no_frame() {
        let mut profile = test_profile::profile();
        let marker = profile.frames.len() as FrameId;
        profile.frames.push(Frame {
            function: Some(FRAME_POINTERS_ONLY_FUNCTION.into()),
            ..Frame::default()
        });
        // 20 samples of main <- run, walked by frame pointers: complete, 2 frames deep.
        profile.stacks.push(StackSample {
            pid: 100,
            tid: 100,
            event: 0,
            frames: vec![test_profile::RUN, test_profile::MAIN, marker],
            count: 20,
            ..StackSample::default()
        });
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let quality = stack_quality(&profile, 0, &selection);
        assert_eq!(quality.user_samples, 120);
        assert_eq!(quality.frame_pointers_only, 20);
        assert_eq!(quality.complete, 105);
        assert!((quality.mean_user_depth - 290.0 / 115.0).abs() < 1e-9);
    }

    #[test]
    fn a_walk_past_a_root_or_through_an_address_outside_every_mapping_is_cut_short() {
        let mut profile = test_profile::profile();
        let frame = |function: &str| Frame {
            module: "/usr/lib/libc.so.6".into(),
            function: Some(function.into()),
            ..Frame::default()
        };
        let next = profile.frames.len() as FrameId;
        profile.frames.push(frame("clone3"));
        profile.frames.push(frame("[truncated]"));
        // An address no mapping holds: no module, no function.
        profile.frames.push(Frame::default());
        let (clone3, truncated, unknown) = (next, next + 1, next + 2);
        // A thread's first block walked into garbage: clone3, then the same unknown address.
        profile
            .stacks
            .push(stack(vec![clone3, unknown, unknown, unknown], 7));
        // Past main, then cut short: main is no end of the walk.
        profile.stacks.push(stack(
            vec![test_profile::RUN, test_profile::MAIN, truncated],
            3,
        ));
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let quality = stack_quality(&profile, 0, &selection);
        assert_eq!(quality.user_samples, 110);
        assert_eq!(quality.complete, 85);
        assert_eq!(quality.outside_code, 7);
        assert_eq!(quality.incomplete(), 20);
        assert_eq!(quality.in_exit_or_exec, 0);
    }

    /// Samples of the test profile's main thread on `frames` (leaf first).
    fn stack(frames: Vec<FrameId>, count: u64) -> StackSample {
        StackSample {
            pid: 100,
            tid: 100,
            event: 0,
            frames,
            count,
            ..StackSample::default()
        }
    }

    #[test]
    fn stacks_cut_short_in_exit_or_exec_are_counted_apart_and_the_loaders_start_is_a_root() {
        let mut profile = test_profile::profile();
        let frame = |function: &str, kernel: bool| Frame {
            module: "/usr/lib/libc.so.6".into(),
            function: Some(function.into()),
            kernel,
            ..Frame::default()
        };
        let next = profile.frames.len() as FrameId;
        for (function, kernel) in [
            ("_exit", false),
            ("[truncated]", false),
            ("exit_mmap", true),
            ("call_init", false),
            ("_dl_init", false),
            ("_dl_start_user", false),
        ] {
            profile.frames.push(frame(function, kernel));
        }
        let [exit, truncated, exit_mmap, call_init, dl_init, dl_start_user] =
            std::array::from_fn(|i| next + i as FrameId);
        // In exit_group, the memory going: the walk stops after the leaf.
        profile
            .stacks
            .push(stack(vec![exit_mmap, exit, truncated], 6));
        // The same leaf cut short with no such kernel frame: cut short for no known cause.
        profile.stacks.push(stack(vec![exit, truncated], 2));
        // A library's constructor run by the dynamic loader before the program starts.
        profile
            .stacks
            .push(stack(vec![call_init, dl_init, dl_start_user], 4));
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let quality = stack_quality(&profile, 0, &selection);
        assert_eq!(quality.user_samples, 112);
        assert_eq!(quality.complete, 89);
        assert_eq!(quality.in_exit_or_exec, 6);
        assert_eq!(quality.incomplete(), 18);
    }
}
