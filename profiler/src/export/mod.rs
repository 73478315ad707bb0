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
pub mod firefox;
pub mod flamegraph;
pub mod folded;
mod frame_table;
pub mod html;
pub mod offcpu;
pub mod otlp;
pub mod pprof;
pub mod pyroscope;
pub mod series;
pub mod sink;
pub mod speedscope;
pub mod upload;

use std::borrow::Cow;
use std::collections::HashMap;
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

/// What the exports put at the root of a sample's stack: its thread's command name, else its
/// process id.
struct StackRoots<'a> {
    comms: HashMap<(u32, u32), &'a str>,
}

impl<'a> StackRoots<'a> {
    fn new(profile: &'a Profile) -> StackRoots<'a> {
        StackRoots {
            comms: profile
                .threads
                .iter()
                .filter(|t| !t.comm.is_empty())
                .map(|t| ((t.pid, t.tid), t.comm.as_str()))
                .collect(),
        }
    }

    fn of(&self, sample: &StackSample) -> Cow<'a, str> {
        match self.comms.get(&(sample.pid, sample.tid)) {
            Some(comm) => Cow::Borrowed(comm),
            None => Cow::Owned(format!("[pid {}]", sample.pid)),
        }
    }
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
    if !profile.losses.event_counts.is_empty() {
        losses.event_counts = per_event(&profile.losses.event_counts);
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
    use crate::profile::test_profile;

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
