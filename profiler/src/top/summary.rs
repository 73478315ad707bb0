//! One window of `profiler top`, reduced from its profile to what the screen can show: per
//! event, the functions' self and total counts, the processes' and containers' counts, the
//! caller -> callee edges, and the sample accounting. Windows are small this way, so the screen
//! keeps a minute of them for its trends.

use std::collections::BTreeMap;

use crate::{
    aggregate::{
        filter::SampleFilter,
        functions::{FunctionName, FunctionNumbers},
        views::{build_view, RowKey, SortKey, ViewKind, ViewOptions},
    },
    export::offcpu::OFF_CPU_EVENT,
    fast_hash::{HashMap, HashSet},
    profile::{EventIndex, Profile},
};

/// A function's samples in a window: as the leaf (self) and anywhere on the stack (total).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FunctionCounts {
    pub self_count: u64,
    pub total_count: u64,
}

/// One event of one window. Counts are samples, or nanoseconds blocked for off-CPU time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventWindow {
    pub name: String,
    /// `samples`, or the unit each stack's count is in (`nanoseconds` off-CPU).
    pub unit: String,
    /// What the window's stacks of the event add up to: the 100% of its shares.
    pub kept: u64,
    /// Samples the kernel fired (blocks, off-CPU, whose `kept` is nanoseconds).
    pub fired: u64,
    pub functions: HashMap<FunctionName, FunctionCounts>,
    /// `comm pid`.
    pub processes: HashMap<String, u64>,
    /// Container or systemd unit, `(host)` outside.
    pub containers: HashMap<String, u64>,
    /// (caller, callee): samples of the stacks where the one calls the other, once a stack.
    pub calls: HashMap<(FunctionName, FunctionName), u64>,
}

/// One window: its length, its events, and what was lost in it, by cause.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowSummary {
    pub seconds: f64,
    pub events: Vec<EventWindow>,
    pub losses: BTreeMap<String, u64>,
}

impl WindowSummary {
    /// The window's summary. Its off-CPU stacks are weighed by the time they stood for (their
    /// counts are blocks), so that the off-CPU shares are of time, as the exports have them.
    pub fn of(mut profile: Profile) -> WindowSummary {
        if let Some(off_cpu) = profile
            .events
            .iter()
            .position(|event| event.name == OFF_CPU_EVENT)
        {
            for stack in &mut profile.stacks {
                if stack.event as usize == off_cpu {
                    stack.count = stack.weight.unwrap_or(stack.count);
                }
            }
        }
        let profile = &profile;
        let seconds = profile.meta.duration_ns as f64 / 1e9;
        let events = (0..profile.events.len() as EventIndex)
            .map(|event| event_window(profile, event))
            .collect();
        WindowSummary {
            seconds,
            events,
            losses: profile
                .losses
                .counters
                .iter()
                .filter(|(_, count)| **count > 0)
                .map(|(cause, count)| (cause.clone(), *count))
                .collect(),
        }
    }

    /// What came between `earlier` and this one, both summaries of one growing capture (the
    /// snapshots of `record --live`): every count less the earlier's.
    pub fn since(&self, earlier: &WindowSummary) -> WindowSummary {
        fn less<K: Clone + Eq + std::hash::Hash, V: Copy>(
            now: &HashMap<K, V>,
            then: &HashMap<K, V>,
            minus: impl Fn(V, Option<V>) -> V,
            empty: impl Fn(&V) -> bool,
        ) -> HashMap<K, V> {
            now.iter()
                .map(|(key, value)| (key.clone(), minus(*value, then.get(key).copied())))
                .filter(|(_, value)| !empty(value))
                .collect()
        }
        let counts = |now: u64, then: Option<u64>| now.saturating_sub(then.unwrap_or(0));
        let functions = |now: FunctionCounts, then: Option<FunctionCounts>| {
            let then = then.unwrap_or_default();
            FunctionCounts {
                self_count: now.self_count.saturating_sub(then.self_count),
                total_count: now.total_count.saturating_sub(then.total_count),
            }
        };
        let none = EventWindow::default();
        WindowSummary {
            seconds: (self.seconds - earlier.seconds).max(0.0),
            events: self
                .events
                .iter()
                .enumerate()
                .map(|(index, event)| {
                    let then = earlier.events.get(index).unwrap_or(&none);
                    EventWindow {
                        name: event.name.clone(),
                        unit: event.unit.clone(),
                        kept: event.kept.saturating_sub(then.kept),
                        fired: event.fired.saturating_sub(then.fired),
                        functions: less(&event.functions, &then.functions, functions, |c| {
                            c.total_count == 0
                        }),
                        processes: less(&event.processes, &then.processes, counts, |c| *c == 0),
                        containers: less(&event.containers, &then.containers, counts, |c| *c == 0),
                        calls: less(&event.calls, &then.calls, counts, |c| *c == 0),
                    }
                })
                .collect(),
            losses: self
                .losses
                .iter()
                .map(|(cause, count)| {
                    let then = earlier.losses.get(cause).copied().unwrap_or(0);
                    (cause.clone(), count.saturating_sub(then))
                })
                .filter(|(_, count)| *count > 0)
                .collect(),
        }
    }

    /// Samples lost in the window (whole samples; a lost stack is counted among the causes).
    pub fn samples_lost(&self) -> u64 {
        self.losses
            .iter()
            .filter(|(cause, _)| cause.starts_with("samples lost"))
            .map(|(_, count)| count)
            .sum()
    }
}

fn event_window(profile: &Profile, event: EventIndex) -> EventWindow {
    let info = &profile.events[event as usize];
    let filter = SampleFilter::default();
    let options = ViewOptions {
        filter: &filter,
        sort: SortKey::Samples,
        top: usize::MAX,
    };
    let view = |kind| build_view(profile, kind, event, &options);
    let functions = view(ViewKind::Function);
    let mut window = EventWindow {
        name: info.name.clone(),
        unit: if info.name == OFF_CPU_EVENT {
            "nanoseconds"
        } else {
            "samples"
        }
        .to_string(),
        kept: functions.total_samples,
        fired: profile
            .losses
            .samples_fired
            .get(event as usize)
            .copied()
            .unwrap_or_default(),
        ..EventWindow::default()
    };
    for row in functions.rows {
        if let RowKey::Function(function) = row.key {
            window.functions.insert(
                function,
                FunctionCounts {
                    self_count: row.samples,
                    total_count: row.total_samples.unwrap_or(row.samples),
                },
            );
        }
    }
    for row in view(ViewKind::Process).rows {
        window.processes.insert(row.key.name(), row.samples);
    }
    for row in view(ViewKind::Container).rows {
        window.containers.insert(row.key.name(), row.samples);
    }
    window.calls = calls(profile, event);
    window
}

/// Each stack's caller -> callee pairs of functions (inlined ones included), counted once a
/// stack however often recursion repeats them.
fn calls(profile: &Profile, event: EventIndex) -> HashMap<(FunctionName, FunctionName), u64> {
    let mut numbers = FunctionNumbers::new(profile);
    let mut counts: HashMap<(u32, u32), u64> = HashMap::default();
    let mut functions = Vec::new();
    let mut seen = HashSet::default();
    for stack in profile.stacks.iter().filter(|stack| stack.event == event) {
        functions.clear();
        for id in &stack.frames {
            functions.extend_from_slice(numbers.logical(*id));
        }
        seen.clear();
        // Leaf first: each function is called by the next one.
        for pair in functions.windows(2) {
            let call = (pair[1], pair[0]);
            if seen.insert(call) {
                *counts.entry(call).or_default() += stack.count;
            }
        }
    }
    counts
        .into_iter()
        .map(|((caller, callee), count)| {
            (
                (
                    numbers.function(caller).clone(),
                    numbers.function(callee).clone(),
                ),
                count,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;

    #[test]
    fn a_window_keeps_each_functions_self_and_total_and_its_calls() {
        let profile = test_profile::profile();
        let summary = WindowSummary::of(profile);
        assert_eq!(summary.seconds, 2.0);
        let event = &summary.events[0];
        assert_eq!(
            (event.name.as_str(), event.unit.as_str()),
            ("cpu-clock", "samples")
        );
        assert_eq!(event.kept, 100);
        let counts = |name: &str| {
            let (_, counts) = event
                .functions
                .iter()
                .find(|(function, _)| function.name == name)
                .unwrap_or_else(|| panic!("{name} in {:?}", event.functions.keys()));
            (counts.self_count, counts.total_count)
        };
        // Functions as the report's function view has them: the inlined loop is compute's.
        assert_eq!(counts("compute"), (60, 60));
        assert_eq!(counts("run"), (0, 85));
        assert_eq!(counts("do_syscall_64"), (30, 30));
        let calls = |caller: &str, callee: &str| {
            event
                .calls
                .iter()
                .filter(|((from, to), _)| from.name == caller && to.name == callee)
                .map(|(_, count)| count)
                .sum::<u64>()
        };
        assert_eq!(calls("run", "compute"), 60);
        // The calls go through the functions inlined into compute, as `--callees` has them.
        assert_eq!(calls("compute", "vec_sum"), 60);
        assert_eq!(calls("vec_sum", "add_lanes"), 60);
        assert_eq!(calls("run", "do_syscall_64"), 25);
        assert_eq!(calls("main", "run"), 85);
        assert_eq!(event.processes.values().sum::<u64>(), 100);
        assert_eq!(event.containers.get("docker-1234"), Some(&10));
        assert_eq!(summary.events[1].kept, 7);

        // A later snapshot of the same capture: the difference is what came between.
        let mut grown = test_profile::profile();
        grown.meta.duration_ns = 3_000_000_000;
        grown.stacks[0].count += 30;
        let later = WindowSummary::of(grown).since(&summary);
        assert_eq!(later.seconds, 1.0);
        let event = &later.events[0];
        assert_eq!(event.kept, 30);
        let compute = event
            .functions
            .iter()
            .find(|(function, _)| function.name == "compute")
            .map(|(_, counts)| *counts);
        assert_eq!(
            compute,
            Some(FunctionCounts {
                self_count: 30,
                total_count: 30
            })
        );
        assert!(
            !event.functions.keys().any(|f| f.name == "do_syscall_64"),
            "nothing new there"
        );
        assert_eq!(later.events[1].kept, 0);
    }
}
