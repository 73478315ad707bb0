//! Export of a [`Profile`] to the formats other tools read: folded stacks (FlameGraph scripts,
//! speedscope), flame graph SVG (inferno) and pprof (`go tool pprof`, Pyroscope).
//!
//! Exports show what the report shows: [`selected_profile`] keeps the event and the samples the
//! report's filters select (`--only-event`, `--only-pid`, `--only-comm`, `--only-module`).
//!
//! Every export walks call stacks the same way, root first, through [`stack_root_first`], so a
//! stack looks the same in each format. Exports index `Profile::frames` and `Profile::events`
//! directly: a profile built by the recorder or read by `profile::file` refers only to frames and
//! events it holds.

pub mod backend;
pub mod delivery;
pub mod flamegraph;
pub mod folded;
pub mod offcpu;
pub mod otlp;
pub mod pprof;
pub mod pyroscope;
pub mod series;
pub mod sink;
pub mod upload;

use std::fmt;
use std::io;

use crate::{
    aggregate::{
        filter::{select_events, selected_data_lines, SampleFilter, Selection},
        latency::LineHistograms,
    },
    profile::{
        DataLineSample, EventIndex, EventInfo, Frame, FrameId, LineLatencyHistogram, Profile,
        StackSample,
    },
};

#[derive(Debug)]
pub enum ExportError {
    /// The event index asked for is not one of the profile's events.
    UnknownEvent {
        event: EventIndex,
        events: usize,
    },
    /// The event has no stack samples, so there is nothing to draw.
    NoSamples {
        event: String,
    },
    Io(io::Error),
    /// A backend could not be given a window, or refused it.
    Upload(String),
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::UnknownEvent { event, events } => write!(
                f,
                "event index {event} does not exist: the profile has {events} event(s), \
                 numbered from 0"
            ),
            ExportError::NoSamples { event } => write!(
                f,
                "event {event} has no stack samples: nothing to export (was it recorded \
                 with call stacks, and did the workload run long enough to be sampled?)"
            ),
            ExportError::Io(e) => write!(f, "cannot write the export: {e}"),
            ExportError::Upload(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ExportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExportError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for ExportError {
    fn from(e: io::Error) -> Self {
        ExportError::Io(e)
    }
}

/// The event at `event`, or the error that names how many events there are.
fn event_info(profile: &Profile, event: EventIndex) -> Result<&EventInfo, ExportError> {
    profile
        .events
        .get(event as usize)
        .ok_or(ExportError::UnknownEvent {
            event,
            events: profile.events.len(),
        })
}

/// One entry of a call stack as the exports show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StackEntry<'a> {
    Frame(FrameId, &'a Frame),
    /// The user part of the stack could not be read; counted in the profile's losses. Shown at
    /// the root so the samples keep their weight instead of silently vanishing.
    UserStackLost,
    /// The kernel part of the stack could not be read; shown at the leaf.
    KernelStackLost,
}

impl StackEntry<'_> {
    /// Pseudo-function name of a lost part of a stack.
    const USER_STACK_LOST: &'static str = "[user stack lost]";
    const KERNEL_STACK_LOST: &'static str = "[kernel stack lost]";
}

/// The entries of a sample's stack, root (outermost user caller) first, leaf last.
fn stack_root_first<'a>(
    profile: &'a Profile,
    sample: &'a StackSample,
) -> impl Iterator<Item = StackEntry<'a>> + 'a {
    let user_lost = sample.user_stack_lost.then_some(StackEntry::UserStackLost);
    let kernel_lost = sample
        .kernel_stack_lost
        .then_some(StackEntry::KernelStackLost);
    // `StackSample::frames` is leaf first.
    let frames = sample
        .frames
        .iter()
        .rev()
        .map(|&id| StackEntry::Frame(id, &profile.frames[id as usize]));
    user_lost.into_iter().chain(frames).chain(kernel_lost)
}

/// The call stacks the report's filters select, for the exports: only the chosen event (`event`
/// by name or index; every event when `None`), renumbered from 0, and only stacks of the selected
/// threads that pass through the selected module. Frames keep their ids.
pub fn selected_profile(
    profile: &Profile,
    event: Option<&str>,
    filter: &SampleFilter,
) -> anyhow::Result<Profile> {
    let events = select_events(profile, event)?;
    let selection = Selection::new(profile, filter);
    let per_event = |values: &[u64]| -> Vec<u64> {
        events
            .iter()
            .map(|&e| values.get(e as usize).copied().unwrap_or(0))
            .collect()
    };
    let mut losses = profile.losses.clone();
    losses.samples_fired = per_event(&profile.losses.samples_fired);
    if !profile.losses.period_sums.is_empty() {
        losses.period_sums = per_event(&profile.losses.period_sums);
    }
    let stacks = profile
        .stacks
        .iter()
        .filter(|s| selection.thread(s.pid, s.tid))
        .filter(|s| {
            filter.module.is_none()
                || s.frames
                    .iter()
                    .any(|&id| selection.module(&profile.frames[id as usize]))
        })
        .filter_map(|s| {
            let index = events.iter().position(|&e| e == s.event)?;
            Some(StackSample {
                event: index as EventIndex,
                ..s.clone()
            })
        })
        .collect();
    // Data addresses as the report's data views select them, with the latency histograms of
    // the lines whose samples the filters keep whole.
    let mut data_lines = Vec::new();
    let mut line_latency = Vec::new();
    for (index, &event) in events.iter().enumerate() {
        let index = index as EventIndex;
        data_lines.extend(selected_data_lines(profile, event, &selection).map(|d| {
            DataLineSample {
                event: index,
                ..d.clone()
            }
        }));
        let histograms = LineHistograms::new(profile, event, &selection);
        line_latency.extend(
            histograms
                .iter()
                .map(|((pid, line), buckets)| LineLatencyHistogram {
                    pid,
                    event: index,
                    line,
                    buckets: buckets.to_vec(),
                }),
        );
    }
    Ok(Profile {
        meta: profile.meta.clone(),
        events: events
            .iter()
            .map(|&e| profile.events[e as usize].clone())
            .collect(),
        threads: profile.threads.clone(),
        frames: profile.frames.clone(),
        stacks,
        losses,
        data_lines,
        line_latency,
        memory_maps: profile.memory_maps.clone(),
        data_symbols: profile.data_symbols.clone(),
        ..Profile::default()
    })
}

/// The stack samples of one event.
fn samples_of(profile: &Profile, event: EventIndex) -> impl Iterator<Item = &StackSample> {
    profile
        .stacks
        .iter()
        .filter(move |s| s.event == event && s.count > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(profile: &Profile) -> Vec<(EventIndex, u32, u64)> {
        profile
            .stacks
            .iter()
            .map(|s| (s.event, s.tid, s.count))
            .collect()
    }

    #[test]
    fn selection_keeps_the_chosen_event_threads_and_module() {
        let profile = test_profile::profile();
        let all = selected_profile(&profile, None, &SampleFilter::default()).unwrap();
        assert_eq!(all.stacks, profile.stacks);
        let faults =
            selected_profile(&profile, Some("page-faults"), &SampleFilter::default()).unwrap();
        assert_eq!(faults.events.len(), 1);
        assert_eq!(faults.events[0].name, "page-faults");
        assert_eq!(counts(&faults), [(0, 100, 4), (0, 101, 3)]);
        let worker = SampleFilter {
            comm: Some("app worker".into()),
            ..SampleFilter::default()
        };
        let selected = selected_profile(&profile, None, &worker).unwrap();
        assert_eq!(counts(&selected), [(0, 101, 10), (1, 101, 3)]);
        let libblob = SampleFilter {
            module: Some("libblob.so".into()),
            ..SampleFilter::default()
        };
        let selected = selected_profile(&profile, Some("0"), &libblob).unwrap();
        assert_eq!(counts(&selected), [(0, 101, 10)]);
        let other = SampleFilter {
            pids: vec![7],
            ..SampleFilter::default()
        };
        assert!(selected_profile(&profile, None, &other)
            .unwrap()
            .stacks
            .is_empty());
        assert!(selected_profile(&profile, Some("cycles"), &worker).is_err());
    }

    #[test]
    fn selection_keeps_the_data_lines_and_latencies_it_selects_whole() {
        let profile = test_profile::profile_with_data();
        let faults =
            selected_profile(&profile, Some("page-faults"), &SampleFilter::default()).unwrap();
        let lines: Vec<(EventIndex, u64)> = faults
            .data_lines
            .iter()
            .map(|d| (d.event, d.line))
            .collect();
        assert_eq!(
            lines,
            [(0, test_profile::HEAP_LINE), (0, test_profile::GLOBAL_LINE)]
        );
        assert_eq!(faults.line_latency.len(), 1);
        assert_eq!(faults.line_latency[0].event, 0);
        assert_eq!(faults.data_symbols, profile.data_symbols);
        // Only the stripped library's line is left: the heap line's histogram goes with it.
        let libblob = SampleFilter {
            module: Some("libblob.so".into()),
            ..SampleFilter::default()
        };
        let selected = selected_profile(&profile, Some("page-faults"), &libblob).unwrap();
        let lines: Vec<u64> = selected.data_lines.iter().map(|d| d.line).collect();
        assert_eq!(lines, [test_profile::GLOBAL_LINE]);
        assert!(selected.line_latency.is_empty());
        let cpu = selected_profile(&profile, Some("cpu-clock"), &SampleFilter::default()).unwrap();
        assert!(cpu.data_lines.is_empty());
    }
}

#[cfg(test)]
pub(crate) mod test_profile {
    //! The hand-built profile every export test reads: two events, kernel and user frames,
    //! inlined frames, a stripped frame, a lost user stack.

    use crate::profile::*;

    pub const MAIN: FrameId = 0;
    pub const RUN: FrameId = 1;
    /// `compute` with `vec_sum` and `add_lanes` inlined at the sampled address.
    pub const COMPUTE_INLINED: FrameId = 2;
    pub const STRIPPED: FrameId = 3;
    pub const SYSCALL: FrameId = 4;
    pub const PAGE_FAULT: FrameId = 5;
    pub const WORKER: FrameId = 6;

    pub const APP: &str = "/opt/app/bin/app";
    pub const LIBBLOB: &str = "/usr/lib/libblob.so";
    pub const KERNEL: &str = "[kernel.kallsyms]";
    /// Where `app` was loaded: address - module_offset.
    pub const APP_BASE: u64 = 0x5555_5555_4000;
    pub const LIBBLOB_BASE: u64 = 0x7f00_0000_0000;

    fn user(function: &str, module_offset: u64, line: u32) -> Frame {
        Frame {
            address: APP_BASE + module_offset,
            kernel: false,
            module: APP.into(),
            module_offset,
            build_id: Some("a1b2c3d4".into()),
            function: Some(function.into()),
            function_address: Some(APP_BASE + (module_offset & !0xff)),
            file: Some("src/app.rs".into()),
            line: Some(line),
            inlined: Vec::new(),
        }
    }

    fn kernel(function: &str, address: u64) -> Frame {
        Frame {
            address,
            kernel: true,
            module: KERNEL.into(),
            module_offset: address - 0xffff_ffff_8100_0000,
            build_id: None,
            function: Some(function.into()),
            function_address: Some(address & !0xff),
            file: None,
            line: None,
            inlined: Vec::new(),
        }
    }

    pub fn profile() -> Profile {
        let mut compute_inlined = user("compute", 0x1290, 42);
        compute_inlined.inlined = vec![
            InlinedFrame {
                function: "vec_sum".into(),
                file: Some("src/vec.rs".into()),
                line: Some(7),
            },
            InlinedFrame {
                function: "add_lanes".into(),
                file: Some("src/simd.rs".into()),
                line: Some(88),
            },
        ];
        let frames = vec![
            user("main", 0x1010, 10),
            user("run", 0x1220, 40),
            compute_inlined,
            Frame {
                address: LIBBLOB_BASE + 0x4a10,
                module: LIBBLOB.into(),
                module_offset: 0x4a10,
                build_id: Some("ffee0011".into()),
                ..Frame::default()
            },
            kernel("do_syscall_64", 0xffff_ffff_8100_1234),
            kernel("exc_page_fault", 0xffff_ffff_8100_5678),
            // `[u8; 4]` carries the `;` that folded stacks use as a separator.
            user("<[u8; 4] as app::Worker>::run", 0x1400, 77),
        ];
        let stack = |tid: u32, event: EventIndex, frames: Vec<FrameId>, count: u64| StackSample {
            pid: 100,
            tid,
            event,
            frames,
            count,
            ..StackSample::default()
        };
        Profile {
            meta: ProfileMeta {
                profiler_version: "0.1.0".into(),
                hostname: "testhost".into(),
                kernel_release: "6.18.0".into(),
                target: "-- ./app".into(),
                start_unix_ns: 1_700_000_000_000_000_000,
                duration_ns: 2_000_000_000,
                architecture: String::new(),
            },
            events: vec![
                EventInfo {
                    name: "cpu-clock".into(),
                    period: None,
                    frequency: Some(1000),
                    unit: "nanoseconds".into(),
                    precise: false,
                },
                EventInfo {
                    name: "page-faults".into(),
                    period: Some(10),
                    frequency: None,
                    unit: "events".into(),
                    precise: false,
                },
            ],
            threads: vec![
                ThreadInfo {
                    pid: 100,
                    tid: 100,
                    comm: "app".into(),
                    container: None,
                },
                ThreadInfo {
                    pid: 100,
                    tid: 101,
                    comm: "app worker".into(),
                    container: Some("docker-1234".into()),
                },
                ThreadInfo {
                    pid: 100,
                    tid: 102,
                    comm: "app".into(),
                    container: None,
                },
            ],
            frames,
            stacks: vec![
                // cpu-clock: 60 in the inlined loop (from two threads named `app`, which folded
                // stacks merge), 25 in the syscall, 10 in stripped code, 5 with the user stack
                // lost.
                stack(100, 0, vec![COMPUTE_INLINED, RUN, MAIN], 45),
                stack(102, 0, vec![COMPUTE_INLINED, RUN, MAIN], 15),
                stack(100, 0, vec![SYSCALL, RUN, MAIN], 25),
                stack(101, 0, vec![STRIPPED, WORKER], 10),
                StackSample {
                    user_stack_lost: true,
                    ..stack(100, 0, vec![SYSCALL], 5)
                },
                // page-faults: 7 samples, in user and kernel code.
                stack(100, 1, vec![PAGE_FAULT, COMPUTE_INLINED, RUN, MAIN], 4),
                stack(101, 1, vec![PAGE_FAULT, WORKER], 3),
            ],
            ..Profile::default()
        }
    }

    /// The heap line the page-fault samples touched, and the global variable's.
    pub const HEAP_LINE: u64 = 0x5555_5600_0040;
    pub const GLOBAL_LINE: u64 = APP_BASE + 0x8000;

    /// [`profile`] with data addresses on its page-fault samples: 4 by `compute` on a heap
    /// line (loads, with latencies and the line's histogram), 3 by the worker's stripped code
    /// on the line of a global variable (stores, no latency).
    pub fn profile_with_data() -> Profile {
        let mut profile = profile();
        let stats = |count, latency_sum, latency_max| Stats {
            count,
            latency_count: if latency_sum > 0 { count } else { 0 },
            latency_sum,
            latency_max,
        };
        profile.data_lines = vec![
            DataLineSample {
                pid: 100,
                event: 1,
                line: HEAP_LINE,
                frame: COMPUTE_INLINED,
                stats: stats(4, 400, 250),
                per_cpu: Vec::new(),
                tid: Some(100),
                access: DataAccess::Load,
            },
            DataLineSample {
                pid: 100,
                event: 1,
                line: GLOBAL_LINE,
                frame: STRIPPED,
                stats: stats(3, 0, 0),
                per_cpu: Vec::new(),
                tid: Some(101),
                access: DataAccess::Store,
            },
        ];
        // 3 samples at 5 cycles (a bucket of one value), one far above.
        let bucket = |value: u64| profiler_common::latency::bucket_index(value) as u16;
        profile.line_latency = vec![LineLatencyHistogram {
            pid: 100,
            event: 1,
            line: HEAP_LINE,
            buckets: vec![(bucket(5), 3), (bucket(250), 1)],
        }];
        profile.memory_maps = vec![ProcessMemoryMap {
            pid: 100,
            mappings: vec![
                MemoryMapping {
                    start: APP_BASE,
                    end: APP_BASE + 0x10000,
                    file_offset: 0,
                    path: APP.into(),
                },
                MemoryMapping {
                    start: 0x5555_5600_0000,
                    end: 0x5555_5610_0000,
                    file_offset: 0,
                    path: "[heap]".into(),
                },
            ],
        }];
        profile.data_symbols = vec![DataSymbol {
            pid: 100,
            address: GLOBAL_LINE,
            size: 16,
            name: "request_count".into(),
            module: APP.into(),
        }];
        profile
    }
}
