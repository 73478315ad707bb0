//! Which samples a report looks at: the event (by name or index), processes, thread names and
//! load modules; and how many events one sample of an event stands for.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Result};

use crate::profile::{module_basename, DataLineSample, EventIndex, Frame, Profile};

/// Sample filters as the user gave them; empty fields keep everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleFilter {
    pub pids: Vec<u32>,
    /// Thread name (`comm`).
    pub comm: Option<String>,
    /// Load module: its path or its file name.
    pub module: Option<String>,
}

/// The events a report shows: the one named by `spec` (a name or an index), or all of them.
pub fn select_events(profile: &Profile, spec: Option<&str>) -> Result<Vec<EventIndex>> {
    let Some(spec) = spec else {
        return Ok((0..profile.events.len() as EventIndex).collect());
    };
    if let Some(index) = profile.events.iter().position(|e| e.name == spec) {
        return Ok(vec![index as EventIndex]);
    }
    if let Ok(index) = spec.parse::<usize>() {
        if index < profile.events.len() {
            return Ok(vec![index as EventIndex]);
        }
    }
    // The event's name without the modifiers and terms it was recorded with (`page-faults` for
    // `page-faults/period=1/`), when that names one event.
    let bare = |name: &str| name.split([':', '/']).next().unwrap_or(name).to_string();
    let same: Vec<usize> = (0..profile.events.len())
        .filter(|&i| bare(&profile.events[i].name) == spec)
        .collect();
    if let [index] = same[..] {
        return Ok(vec![index as EventIndex]);
    }
    let known: Vec<String> = profile
        .events
        .iter()
        .enumerate()
        .map(|(index, event)| format!("{index} ({})", event.name))
        .collect();
    if known.is_empty() {
        bail!("no event `{spec}`: this profile has no events");
    }
    bail!(
        "no event `{spec}` in this profile; give one of its events by name or index: {}",
        known.join(", ")
    )
}

/// A filter bound to a profile: answers per thread, process and frame.
pub struct Selection<'a> {
    filter: &'a SampleFilter,
    /// Thread names by (pid, tid).
    thread_names: HashMap<(u32, u32), &'a str>,
    /// Containers or units by (pid, tid), for threads that ran in one.
    thread_containers: HashMap<(u32, u32), &'a str>,
    /// Processes with at least one thread of the wanted name.
    pids_with_comm: HashSet<u32>,
}

impl<'a> Selection<'a> {
    pub fn new(profile: &'a Profile, filter: &'a SampleFilter) -> Self {
        let thread_names = profile
            .threads
            .iter()
            .map(|t| ((t.pid, t.tid), t.comm.as_str()))
            .collect();
        let thread_containers = profile
            .threads
            .iter()
            .filter_map(|t| Some(((t.pid, t.tid), t.container.as_deref()?)))
            .collect();
        let pids_with_comm = match &filter.comm {
            Some(comm) => profile
                .threads
                .iter()
                .filter(|t| &t.comm == comm)
                .map(|t| t.pid)
                .collect(),
            None => HashSet::new(),
        };
        Selection {
            filter,
            thread_names,
            thread_containers,
            pids_with_comm,
        }
    }

    /// The container or systemd unit a thread ran in; `(host)` for none.
    pub fn container(&self, pid: u32, tid: u32) -> &'a str {
        self.thread_containers
            .get(&(pid, tid))
            .copied()
            .unwrap_or("(host)")
    }

    pub fn thread_name(&self, pid: u32, tid: u32) -> &'a str {
        self.thread_names.get(&(pid, tid)).copied().unwrap_or("")
    }

    fn pid_wanted(&self, pid: u32) -> bool {
        self.filter.pids.is_empty() || self.filter.pids.contains(&pid)
    }

    /// Samples of one thread (call stacks).
    pub fn thread(&self, pid: u32, tid: u32) -> bool {
        self.pid_wanted(pid)
            && self
                .filter
                .comm
                .as_ref()
                .is_none_or(|comm| comm == self.thread_name(pid, tid))
    }

    /// Samples that only know their process (instructions, data lines, latency): kept when one
    /// of the process's threads has the wanted name.
    pub fn process(&self, pid: u32) -> bool {
        self.pid_wanted(pid) && (self.filter.comm.is_none() || self.pids_with_comm.contains(&pid))
    }

    /// Whether a row of this frame's module is shown.
    pub fn module(&self, frame: &Frame) -> bool {
        self.filter.module.as_ref().is_none_or(|wanted| {
            frame.module == *wanted || module_basename(&frame.module) == wanted
        })
    }
}

/// How a sample converts to an estimated event count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EventScale {
    /// The sampling counters' own count of `events` over the `samples` they fired: each sample
    /// stands for the exact mean, which also holds the remainders a period leaves in every
    /// process (a short-lived child counts up to a period that never fires) and the ticks a
    /// saturated clock timer skips.
    Counted { events: u64, samples: u64 },
    /// Sampled every `period` events.
    Period(u64),
    /// Frequency sampling: the kernel varied the period; the mean of the fired samples' periods.
    MeanPeriod(f64),
    /// Frequency sampling without recorded periods: no estimate, samples only.
    Unknown,
}

impl EventScale {
    pub fn of(profile: &Profile, event: EventIndex) -> EventScale {
        let index = event as usize;
        let losses = &profile.losses;
        if let (Some(&events), Some(&samples)) = (
            losses.event_counts.get(index),
            losses.samples_fired.get(index),
        ) {
            if events > 0 && samples > 0 {
                return EventScale::Counted { events, samples };
            }
        }
        EventScale::per_thread(profile, event)
    }

    /// The scale for one thread's samples: its period where it is fixed. The counted mean is
    /// right for a whole event but not for one thread: it spreads over every sample the time
    /// of threads that never ran a whole period, so a busy thread's estimate would hold its
    /// idle neighbours' remainders; with the period, a thread is off by less than one period.
    pub fn per_thread(profile: &Profile, event: EventIndex) -> EventScale {
        let index = event as usize;
        let losses = &profile.losses;
        if let Some(period) = profile.events.get(index).and_then(|e| e.period) {
            return EventScale::Period(period);
        }
        match (
            losses.period_sums.get(index),
            losses.samples_fired.get(index),
        ) {
            (Some(&sum), Some(&fired)) if sum > 0 && fired > 0 => {
                EventScale::MeanPeriod(sum as f64 / fired as f64)
            }
            _ => EventScale::Unknown,
        }
    }

    /// Events that `samples` samples stand for.
    pub fn estimate(self, samples: u64) -> Option<f64> {
        match self {
            EventScale::Counted {
                events,
                samples: fired,
            } => Some(samples as f64 * events as f64 / fired as f64),
            EventScale::Period(period) => Some(samples as f64 * period as f64),
            EventScale::MeanPeriod(mean) => Some(samples as f64 * mean),
            EventScale::Unknown => None,
        }
    }

    /// What the estimate is, for the report's header.
    pub fn describe(self) -> String {
        match self {
            EventScale::Counted { events, samples } => format!(
                "events = samples x {:.1} (counted: {events} in {samples} samples)",
                events as f64 / samples as f64
            ),
            EventScale::Period(period) => format!("events = samples x period {period}"),
            EventScale::MeanPeriod(mean) => {
                format!("events = samples x mean period {mean:.0} (frequency sampling)")
            }
            EventScale::Unknown => "frequency sampling without recorded periods: event counts \
                                    not estimated, samples only"
                .to_string(),
        }
    }
}

/// Whole events for samples counted a group at a time (pprof's samples, a window's series),
/// rounded so that the groups add up to the estimate of all their samples, the report's: each
/// group gets the rounded estimate of the samples so far, less what the groups before it got.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WholeEvents {
    scale: EventScale,
    samples: u64,
    events: u64,
}

impl WholeEvents {
    /// `None` when the scale estimates nothing.
    pub fn new(scale: EventScale) -> Option<WholeEvents> {
        scale.estimate(0)?;
        Some(WholeEvents {
            scale,
            samples: 0,
            events: 0,
        })
    }

    /// The events of the next group's `samples`.
    pub fn next(&mut self, samples: u64) -> u64 {
        self.samples += samples;
        let through = self.scale.estimate(self.samples).unwrap_or(0.0).round() as u64;
        let these = through.saturating_sub(self.events);
        self.events += these;
        these
    }
}

/// Data-line samples of one event that the filters keep.
pub fn selected_data_lines<'a>(
    profile: &'a Profile,
    event: EventIndex,
    selection: &'a Selection,
) -> impl Iterator<Item = &'a DataLineSample> {
    profile.data_lines.iter().filter(move |s| {
        s.event == event
            && selection.process(s.pid)
            && selection.module(&profile.frames[s.frame as usize])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;

    #[test]
    fn events_are_chosen_by_name_or_index() {
        let profile = test_profile::profile();
        assert_eq!(select_events(&profile, None).unwrap(), [0, 1]);
        assert_eq!(select_events(&profile, Some("page-faults")).unwrap(), [1]);
        assert_eq!(select_events(&profile, Some("0")).unwrap(), [0]);
        let error = select_events(&profile, Some("cycles"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("no event `cycles`") && error.contains("1 (page-faults)"),
            "{error}"
        );
        assert!(select_events(&profile, Some("2")).is_err());
        let mut profile = profile;
        profile.events[1].name = "page-faults/period=1/".into();
        assert_eq!(
            select_events(&profile, Some("page-faults/period=1/")).unwrap(),
            [1]
        );
        assert_eq!(select_events(&profile, Some("page-faults")).unwrap(), [1]);
    }

    #[test]
    fn comm_filters_threads_and_their_processes() {
        let profile = test_profile::profile();
        let filter = SampleFilter {
            comm: Some("app worker".into()),
            ..SampleFilter::default()
        };
        let selection = Selection::new(&profile, &filter);
        assert!(selection.thread(100, 101));
        assert!(!selection.thread(100, 100));
        assert!(selection.process(100));
        assert!(!selection.process(7));
        let filter = SampleFilter {
            pids: vec![7],
            ..SampleFilter::default()
        };
        assert!(!Selection::new(&profile, &filter).thread(100, 101));
    }

    #[test]
    fn whole_events_of_groups_add_up_to_the_estimate_of_all() {
        let scale = EventScale::Counted {
            events: 6_995_756_053,
            samples: 6989,
        };
        let mut whole = WholeEvents::new(scale).unwrap();
        let groups = [1, 1, 1, 3000, 7, 1, 3978];
        let total: u64 = groups.iter().map(|&samples| whole.next(samples)).sum();
        assert_eq!(total, 6_995_756_053);
        let mut period = WholeEvents::new(EventScale::Period(10)).unwrap();
        assert_eq!([3, 4].map(|samples| period.next(samples)), [30, 40]);
        assert_eq!(WholeEvents::new(EventScale::Unknown), None);
    }

    #[test]
    fn scale_uses_the_period_or_the_mean_period() {
        let mut profile = test_profile::profile();
        assert_eq!(EventScale::of(&profile, 1), EventScale::Period(10));
        assert_eq!(EventScale::of(&profile, 1).estimate(7), Some(70.0));
        assert_eq!(EventScale::of(&profile, 0), EventScale::Unknown);
        assert_eq!(EventScale::of(&profile, 0).estimate(7), None);
        profile.losses.samples_fired = vec![100, 7];
        profile.losses.period_sums = vec![100_000_000, 70];
        assert_eq!(
            EventScale::of(&profile, 0),
            EventScale::MeanPeriod(1_000_000.0)
        );
    }
}
