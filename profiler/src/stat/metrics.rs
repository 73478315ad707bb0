//! Ratios derived from counted events, shown beside the counts when their inputs were counted:
//! instructions per cycle, miss rates (misses over the matching accesses), misses per 1000
//! instructions, CPUs utilized (clock time over elapsed time) and events per second of CPU time
//! (as perf divides by task-clock), or per elapsed second, labelled so, when no clock was
//! counted.
//!
//! Inputs are matched by the kernel event they open (type and config), not by name, so aliases
//! (`insts`) and renamed events pair up; they must count the same privilege levels (`:u` misses
//! are not divided by all-level accesses).

use std::time::Duration;

use perf_event_open_sys::bindings::{
    PERF_COUNT_HW_BRANCH_INSTRUCTIONS, PERF_COUNT_HW_BRANCH_MISSES, PERF_COUNT_HW_CACHE_MISSES,
    PERF_COUNT_HW_CACHE_REFERENCES, PERF_COUNT_HW_CACHE_RESULT_ACCESS,
    PERF_COUNT_HW_CACHE_RESULT_MISS, PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS,
    PERF_COUNT_SW_ALIGNMENT_FAULTS, PERF_COUNT_SW_CONTEXT_SWITCHES, PERF_COUNT_SW_CPU_CLOCK,
    PERF_COUNT_SW_CPU_MIGRATIONS, PERF_COUNT_SW_EMULATION_FAULTS, PERF_COUNT_SW_PAGE_FAULTS,
    PERF_COUNT_SW_PAGE_FAULTS_MAJ, PERF_COUNT_SW_PAGE_FAULTS_MIN, PERF_COUNT_SW_TASK_CLOCK,
};

use crate::events::catalog::{PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_SOFTWARE};
use crate::events::EventAttr;

/// An event's identity and what it counted, as the metrics see it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EventValue<'a> {
    pub name: &'a str,
    pub attr: EventAttr,
    /// The (scaled) count; `None` when the event was not supported or never ran.
    pub count: Option<u64>,
}

/// A derived ratio.
#[derive(Clone, Debug, PartialEq)]
pub enum Metric {
    /// instructions / cycles.
    InsnPerCycle(f64),
    /// misses / accesses, in percent; `accesses` names the access event.
    MissRate { percent: f64, accesses: String },
    /// misses * 1000 / instructions (MPKI).
    MissesPerKiloInstruction(f64),
    /// clock nanoseconds / elapsed nanoseconds.
    CpusUtilized(f64),
    /// events / seconds of CPU time (a clock event counted beside them), as perf's "/sec".
    PerSecond(f64),
    /// events / elapsed seconds, when no clock was counted to divide by.
    PerElapsedSecond(f64),
}

impl Metric {
    /// The metric's name in the JSON report.
    pub fn key(&self) -> &'static str {
        match self {
            Metric::InsnPerCycle(_) => "insn_per_cycle",
            Metric::MissRate { .. } => "miss_percent",
            Metric::MissesPerKiloInstruction(_) => "misses_per_1k_instructions",
            Metric::CpusUtilized(_) => "cpus_utilized",
            Metric::PerSecond(_) => "per_second",
            Metric::PerElapsedSecond(_) => "per_elapsed_second",
        }
    }

    pub fn value(&self) -> f64 {
        match *self {
            Metric::InsnPerCycle(value)
            | Metric::MissRate { percent: value, .. }
            | Metric::MissesPerKiloInstruction(value)
            | Metric::CpusUtilized(value)
            | Metric::PerSecond(value)
            | Metric::PerElapsedSecond(value) => value,
        }
    }
}

/// What an event is to the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Cycles,
    Instructions,
    /// A miss event and the `(type, config)` of the accesses it is a share of.
    Misses {
        accesses: (u32, u64),
    },
    /// A clock in nanoseconds of CPU time.
    Clock,
    /// A software event whose rate per second is telling (faults, switches, migrations).
    Rate,
    Other,
}

/// `perf_event_attr.config` of a hardware cache event: cache, op, result in bytes 0, 1, 2.
const CACHE_RESULT_SHIFT: u32 = 16;
const CACHE_RESULT_MASK: u64 = 0xff << CACHE_RESULT_SHIFT;

fn role(attr: &EventAttr) -> Role {
    let config = attr.config;
    match attr.type_ {
        PERF_TYPE_HARDWARE => match config {
            c if c == u64::from(PERF_COUNT_HW_CPU_CYCLES) => Role::Cycles,
            c if c == u64::from(PERF_COUNT_HW_INSTRUCTIONS) => Role::Instructions,
            c if c == u64::from(PERF_COUNT_HW_CACHE_MISSES) => Role::Misses {
                accesses: (
                    PERF_TYPE_HARDWARE,
                    u64::from(PERF_COUNT_HW_CACHE_REFERENCES),
                ),
            },
            c if c == u64::from(PERF_COUNT_HW_BRANCH_MISSES) => Role::Misses {
                accesses: (
                    PERF_TYPE_HARDWARE,
                    u64::from(PERF_COUNT_HW_BRANCH_INSTRUCTIONS),
                ),
            },
            _ => Role::Other,
        },
        PERF_TYPE_HW_CACHE
            if (config & CACHE_RESULT_MASK) >> CACHE_RESULT_SHIFT
                == u64::from(PERF_COUNT_HW_CACHE_RESULT_MISS) =>
        {
            let access = u64::from(PERF_COUNT_HW_CACHE_RESULT_ACCESS) << CACHE_RESULT_SHIFT;
            Role::Misses {
                accesses: (PERF_TYPE_HW_CACHE, (config & !CACHE_RESULT_MASK) | access),
            }
        }
        PERF_TYPE_SOFTWARE => match config {
            c if c == u64::from(PERF_COUNT_SW_CPU_CLOCK)
                || c == u64::from(PERF_COUNT_SW_TASK_CLOCK) =>
            {
                Role::Clock
            }
            c if [
                PERF_COUNT_SW_PAGE_FAULTS,
                PERF_COUNT_SW_CONTEXT_SWITCHES,
                PERF_COUNT_SW_CPU_MIGRATIONS,
                PERF_COUNT_SW_PAGE_FAULTS_MIN,
                PERF_COUNT_SW_PAGE_FAULTS_MAJ,
                PERF_COUNT_SW_ALIGNMENT_FAULTS,
                PERF_COUNT_SW_EMULATION_FAULTS,
            ]
            .iter()
            .any(|&id| c == u64::from(id)) =>
            {
                Role::Rate
            }
            _ => Role::Other,
        },
        _ => Role::Other,
    }
}

fn same_levels(a: &EventAttr, b: &EventAttr) -> bool {
    (a.exclude_user, a.exclude_kernel, a.exclude_hv)
        == (b.exclude_user, b.exclude_kernel, b.exclude_hv)
}

/// The first counted event that opens `wanted` at the same privilege levels as `like`.
fn find<'a>(
    events: &'a [EventValue<'a>],
    like: &EventAttr,
    wanted: (u32, u64),
) -> Option<(&'a EventValue<'a>, u64)> {
    events.iter().find_map(|event| {
        let count = event.count?;
        ((event.attr.type_, event.attr.config) == wanted && same_levels(&event.attr, like))
            .then_some((event, count))
    })
}

/// The metrics of `events[index]`, computed from the events counted beside it.
pub fn metrics_for(index: usize, events: &[EventValue<'_>], elapsed: Duration) -> Vec<Metric> {
    let event = &events[index];
    let Some(count) = event.count else {
        return Vec::new();
    };
    let count = count as f64;
    let elapsed_ns = elapsed.as_nanos() as f64;
    let instructions = (PERF_TYPE_HARDWARE, u64::from(PERF_COUNT_HW_INSTRUCTIONS));
    let mut metrics = Vec::new();
    match role(&event.attr) {
        Role::Instructions => {
            let cycles = (PERF_TYPE_HARDWARE, u64::from(PERF_COUNT_HW_CPU_CYCLES));
            if let Some((_, cycles)) = find(events, &event.attr, cycles).filter(|f| f.1 > 0) {
                metrics.push(Metric::InsnPerCycle(count / cycles as f64));
            }
        }
        Role::Misses { accesses } => {
            if let Some((access, total)) = find(events, &event.attr, accesses).filter(|f| f.1 > 0) {
                metrics.push(Metric::MissRate {
                    percent: 100.0 * count / total as f64,
                    accesses: access.name.to_string(),
                });
            }
            if let Some((_, insts)) = find(events, &event.attr, instructions).filter(|f| f.1 > 0) {
                metrics.push(Metric::MissesPerKiloInstruction(
                    1000.0 * count / insts as f64,
                ));
            }
        }
        Role::Clock if elapsed_ns > 0.0 => metrics.push(Metric::CpusUtilized(count / elapsed_ns)),
        Role::Rate => {
            let clock = events.iter().find_map(|other| {
                let clock_ns = other.count.filter(|ns| *ns > 0)?;
                (role(&other.attr) == Role::Clock).then_some(clock_ns)
            });
            match clock {
                Some(clock_ns) => metrics.push(Metric::PerSecond(count * 1e9 / clock_ns as f64)),
                None if elapsed_ns > 0.0 => {
                    metrics.push(Metric::PerElapsedSecond(count * 1e9 / elapsed_ns));
                }
                None => {}
            }
        }
        Role::Cycles | Role::Clock | Role::Other => {}
    }
    metrics
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{parse_event, PmuRegistry};

    fn attr(text: &str) -> EventAttr {
        parse_event(text, &PmuRegistry::default()).unwrap().attr
    }

    fn value<'a>(name: &'a str, count: Option<u64>) -> EventValue<'a> {
        EventValue {
            name,
            attr: attr(name),
            count,
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn instructions_per_cycle_needs_both_counted() {
        let events = [
            value("cycles", Some(2_000)),
            value("instructions", Some(3_000)),
        ];
        assert_eq!(metrics_for(1, &events, SECOND), [Metric::InsnPerCycle(1.5)]);
        assert!(metrics_for(0, &events, SECOND).is_empty());
        let unsupported = [value("cycles", None), value("instructions", Some(3_000))];
        assert!(metrics_for(1, &unsupported, SECOND).is_empty());
        let zero_cycles = [value("cycles", Some(0)), value("instructions", Some(3))];
        assert!(metrics_for(1, &zero_cycles, SECOND).is_empty());
    }

    #[test]
    fn aliases_pair_by_the_event_they_open() {
        let events = [
            value("insts", Some(4_000)),
            value("cpu-cycles", Some(1_000)),
        ];
        assert_eq!(metrics_for(0, &events, SECOND), [Metric::InsnPerCycle(4.0)]);
    }

    #[test]
    fn miss_events_get_a_rate_and_mpki() {
        let events = [
            value("branches", Some(10_000)),
            value("branch-misses", Some(250)),
            value("instructions", Some(50_000)),
            value("L1-dcache-load-misses", Some(600)),
            value("L1-dcache-loads", Some(12_000)),
            value("cache-misses", Some(10)),
        ];
        assert_eq!(
            metrics_for(1, &events, SECOND),
            [
                Metric::MissRate {
                    percent: 2.5,
                    accesses: "branches".to_string()
                },
                Metric::MissesPerKiloInstruction(5.0),
            ]
        );
        assert_eq!(
            metrics_for(3, &events, SECOND),
            [
                Metric::MissRate {
                    percent: 5.0,
                    accesses: "L1-dcache-loads".to_string()
                },
                Metric::MissesPerKiloInstruction(12.0),
            ]
        );
        // No cache-references counted: MPKI only.
        assert_eq!(
            metrics_for(5, &events, SECOND),
            [Metric::MissesPerKiloInstruction(0.2)]
        );
    }

    #[test]
    fn ratios_need_the_same_privilege_levels() {
        let events = [
            value("branches", Some(100)),
            value("branch-misses:u", Some(5)),
        ];
        assert!(metrics_for(1, &events, SECOND).is_empty());
        let events = [
            value("branches:u", Some(100)),
            value("branch-misses:u", Some(5)),
        ];
        assert_eq!(metrics_for(1, &events, SECOND).len(), 1);
    }

    #[test]
    fn clocks_give_cpus_utilized_and_software_events_a_rate() {
        let events = [
            value("task-clock", Some(1_500_000_000)),
            value("page-faults", Some(5_000)),
            value("context-switches", Some(0)),
            value("cpu-migrations", None),
        ];
        let elapsed = Duration::from_secs(2);
        assert_eq!(
            metrics_for(0, &events, elapsed),
            [Metric::CpusUtilized(0.75)]
        );
        // Per second of task-clock, as perf: 5,000 faults in 1.5 s of CPU time.
        let per_cpu_second = 5_000.0 / 1.5;
        assert_eq!(
            metrics_for(1, &events, elapsed),
            [Metric::PerSecond(per_cpu_second)]
        );
        assert_eq!(metrics_for(2, &events, elapsed), [Metric::PerSecond(0.0)]);
        assert!(metrics_for(3, &events, elapsed).is_empty());
        assert_eq!(
            metrics_for(1, &events, Duration::ZERO),
            [Metric::PerSecond(per_cpu_second)],
            "CPU time, not elapsed time"
        );

        // Without a clock: per elapsed second, said so.
        let alone = [value("page-faults", Some(5_000))];
        assert_eq!(
            metrics_for(0, &alone, elapsed),
            [Metric::PerElapsedSecond(2_500.0)]
        );
        assert!(metrics_for(0, &alone, Duration::ZERO).is_empty());
    }

    #[test]
    fn metric_keys_and_values_for_json() {
        let rate = Metric::MissRate {
            percent: 1.25,
            accesses: "branches".to_string(),
        };
        assert_eq!((rate.key(), rate.value()), ("miss_percent", 1.25));
        assert_eq!(Metric::CpusUtilized(0.5).key(), "cpus_utilized");
    }
}
