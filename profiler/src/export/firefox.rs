//! The Firefox Profiler's processed profile format (what samply writes and
//! <https://profiler.firefox.com> opens), written with `fxprof-processed-profile`, the crate
//! samply writes it with: a process per pid, a thread per sampled thread and event, its stacks
//! root first with each inlined function a frame of its own under the function it was inlined
//! into (as in the report), frames in the category of their code (user, kernel).
//!
//! Our profiles count each distinct stack, not each sample's moment: a stack is one sample at
//! the profile's start, weighed by its count, so the call tree, flame graph and function shares
//! are the report's and the timeline is flat. Off-CPU time is a thread of its own per thread
//! (`comm (off-cpu)`), weighed in milliseconds blocked (the format's `tracing-ms`); the blocks
//! are aggregated in the kernel, not kept one by one, so there are no markers to place.

use std::{collections::BTreeMap, io::Write, time::Duration};

use fxprof_processed_profile::{
    CategoryColor, CategoryPairHandle, CpuDelta, Frame as FxFrame, FrameFlags, FrameInfo,
    ProcessHandle, Profile as FxProfile, ReferenceTimestamp, SamplingInterval, Timestamp,
    WeightType,
};

use super::{
    offcpu::OFF_CPU_EVENT, samples_of, stack_root_first, ExportError, StackEntry, StackRoots,
};
use crate::profile::{EventIndex, Profile};

/// The module name kernel frames carry.
const KERNEL_MODULE: &str = "[kernel.kallsyms]";

/// Writes every event of `profile` as a Firefox Profiler profile.
pub fn write_firefox(profile: &Profile, out: &mut impl Write) -> Result<(), ExportError> {
    let first = profile.events.first().ok_or(ExportError::UnknownEvent {
        event: 0,
        events: 0,
    })?;
    let interval = match (first.frequency, first.period) {
        (Some(hz), _) if hz > 0 => SamplingInterval::from_hz(hz as f32),
        _ => SamplingInterval::from_millis(1),
    };
    let start = Duration::from_nanos(profile.meta.start_unix_ns);
    let mut fx = FxProfile::new(
        &format!("profiler: {}", profile.meta.target),
        ReferenceTimestamp::from_duration_since_unix_epoch(start),
        interval,
    );
    fx.set_os_name("Linux");
    fx.set_symbolicated(true);
    let user: CategoryPairHandle = fx.add_category("User", CategoryColor::Yellow).into();
    let kernel: CategoryPairHandle = fx.add_category("Kernel", CategoryColor::Orange).into();
    let other: CategoryPairHandle = fx.add_category("Lost", CategoryColor::Gray).into();
    let roots = StackRoots::new(profile);
    let at_start = Timestamp::from_nanos_since_reference(0);
    let mut processes: BTreeMap<u32, ProcessHandle> = BTreeMap::new();
    let mut threads = BTreeMap::new();
    let several_events = profile.events.len() > 1;
    for (event, info) in profile.events.iter().enumerate() {
        let off_cpu = info.name == OFF_CPU_EVENT;
        for sample in samples_of(profile, event as EventIndex) {
            let comm = roots.of(sample);
            let process = *processes
                .entry(sample.pid)
                .or_insert_with(|| fx.add_process(&comm, sample.pid, at_start));
            let thread = *threads
                .entry((event, sample.pid, sample.tid))
                .or_insert_with(|| {
                    // Not a process's main thread: the format names a main thread after its
                    // process, and a thread here is one event's.
                    let thread = fx.add_thread(process, sample.tid, at_start, false);
                    let name = match (off_cpu, several_events) {
                        (true, _) | (false, true) => format!("{comm} ({})", info.name),
                        (false, false) => comm.to_string(),
                    };
                    fx.set_thread_name(thread, &name);
                    if off_cpu {
                        fx.set_thread_samples_weight_type(thread, WeightType::TracingMs);
                    }
                    thread
                });
            let mut frames = Vec::new();
            for entry in stack_root_first(profile, sample) {
                let mut label = |name: &str, category| {
                    frames.push(FrameInfo {
                        frame: FxFrame::Label(fx.intern_string(name)),
                        category_pair: category,
                        flags: FrameFlags::empty(),
                    })
                };
                match entry {
                    StackEntry::Frame(_, frame) => {
                        let category = if frame.module == KERNEL_MODULE {
                            kernel
                        } else {
                            user
                        };
                        label(&frame.display_name(), category);
                        // Outermost first, under the function they were inlined into.
                        for inlined in &frame.inlined {
                            label(&inlined.function, category);
                        }
                    }
                    StackEntry::UserStackLost => label(StackEntry::USER_STACK_LOST, other),
                    StackEntry::KernelStackLost => label(StackEntry::KERNEL_STACK_LOST, other),
                }
            }
            let stack = fx.intern_stack_frames(thread, frames.into_iter());
            let weight = if off_cpu {
                // Milliseconds blocked, to the nearest.
                (sample.measure() + 500_000) / 1_000_000
            } else {
                sample.count
            };
            // The CPU time sampled stacks stand for, so that the thread's CPU use shows.
            let cpu = match off_cpu {
                true => CpuDelta::ZERO,
                false => CpuDelta::from_nanos(sample.count.saturating_mul(interval.nanos())),
            };
            fx.add_sample(
                thread,
                at_start,
                stack,
                cpu,
                i32::try_from(weight).unwrap_or(i32::MAX),
            );
        }
    }
    serde_json::to_writer(&mut *out, &fx).map_err(|error| ExportError::Io(error.into()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;

    #[test]
    fn threads_stacks_and_weights_are_the_profiles() {
        let profile = test_profile::profile();
        let mut out = Vec::new();
        write_firefox(&profile, &mut out).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(json["meta"]["version"].as_u64().unwrap() > 0);
        let categories: Vec<&str> = json["meta"]["categories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|category| category["name"].as_str().unwrap())
            .collect();
        assert!(categories.contains(&"Kernel") && categories.contains(&"User"));
        let threads = json["threads"].as_array().unwrap();
        // Two events: each thread once per event it has samples of.
        let names: Vec<&str> = threads
            .iter()
            .map(|thread| thread["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"app (cpu-clock)"), "{names:?}");
        assert!(names.contains(&"app worker (page-faults)"), "{names:?}");
        let weights: i64 = threads
            .iter()
            .filter(|thread| thread["name"].as_str().unwrap().ends_with("(cpu-clock)"))
            .map(|thread| {
                let samples = &thread["samples"];
                match samples["weight"].as_array() {
                    Some(weights) => weights.iter().map(|w| w.as_i64().unwrap()).sum(),
                    None => samples["length"].as_i64().unwrap(),
                }
            })
            .sum();
        assert_eq!(weights, 100, "every cpu-clock sample, by its count");
    }
}
