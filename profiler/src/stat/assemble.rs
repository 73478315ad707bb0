//! From counter readings and the per-thread log to per-event totals and the per-thread or
//! per-CPU breakdown.
//!
//! A task's counter that follows it on every CPU is scaled for multiplexing as read; a task's
//! counters on each CPU (`--per-cpu`, `--per-thread`) add up unscaled
//! ([`Count::of_task_on_cpus`] says why); system-wide CPUs and separate threads are independent
//! counts that add up.
//!
//! Per-thread attribution: with `inherit_stat` the kernel keeps each thread's own count with the
//! thread, even when it swaps whole counter contexts between a thread and the threads it started
//! (its context-switch optimization). A thread that exits holding an inherited copy gets an exit
//! record; the one thread that ends up holding the counters opened by the profiler does not, and
//! neither do threads still running when counting stops. Their counts are what the counters read
//! beyond the exit records: when one thread of a family has no exit record, the rest is exactly
//! its count; when several have none, the rest is shown in one row that says how many threads it
//! covers.

use std::collections::{BTreeMap, BTreeSet};

use super::counters::{Reading, Split, ThreadId, ThreadLog};
use super::{Breakdown, CpuRow, StatEvent, ThreadRow};
use crate::events::count::Count;
use crate::events::EventSpec;

/// Per event, `Some(count)` for supported events, `None` for the others.
type Counts = Vec<Option<Count>>;

/// Sums the readings into per-event totals and the requested breakdown.
pub fn assemble(
    specs: &[EventSpec],
    unsupported: &[Option<String>],
    readings: &[Reading],
    log: &ThreadLog,
    split: Split,
) -> (Vec<StatEvent>, Breakdown) {
    let empty = || -> Counts {
        unsupported
            .iter()
            .map(|reason| reason.is_none().then(Count::default))
            .collect()
    };
    let per_task = per_task(readings);
    let events = specs
        .iter()
        .enumerate()
        .map(|(event, spec)| StatEvent {
            name: spec.name.clone(),
            text: spec.text.clone(),
            unit: spec.unit.clone(),
            scale: spec.scale,
            attr: spec.attr,
            total: match &unsupported[event] {
                Some(reason) => Err(reason.clone()),
                None => Ok(per_task
                    .iter()
                    .filter(|((of, _), _)| *of == event)
                    .map(|(_, count)| *count)
                    .sum::<Count>()
                    + readings
                        .iter()
                        .filter(|reading| {
                            reading.event == event && reading.placement.thread.is_none()
                        })
                        .map(|reading| reading.count)
                        .sum()),
            },
        })
        .collect();
    let breakdown = if split.per_thread {
        Breakdown::Threads(thread_rows(&per_task, log, &empty))
    } else if split.per_cpu {
        Breakdown::Cpus(cpu_rows(readings, &empty))
    } else {
        Breakdown::None
    };
    (events, breakdown)
}

/// Each task's count by (event, thread): its counter on any CPU as read, or its counters on
/// each CPU added up.
fn per_task(readings: &[Reading]) -> BTreeMap<(usize, ThreadId), Count> {
    let mut grouped: BTreeMap<(usize, ThreadId), Vec<&Reading>> = BTreeMap::new();
    for reading in readings {
        if let Some(thread) = reading.placement.thread {
            grouped
                .entry((reading.event, thread))
                .or_default()
                .push(reading);
        }
    }
    grouped
        .into_iter()
        .map(|(key, readings)| {
            let count = match readings.as_slice() {
                [only] if only.placement.cpu.is_none() => only.count,
                _ => Count::of_task_on_cpus(readings.iter().map(|reading| reading.count)),
            };
            (key, count)
        })
        .collect()
}

fn new_row(thread: ThreadId, log: &ThreadLog, empty: &dyn Fn() -> Counts) -> ThreadRow {
    ThreadRow {
        thread,
        name: log.name(thread.tid).unwrap_or("?").to_string(),
        also_counts: 0,
        counts: empty(),
    }
}

fn thread_rows(
    per_task: &BTreeMap<(usize, ThreadId), Count>,
    log: &ThreadLog,
    empty: &dyn Fn() -> Counts,
) -> Vec<ThreadRow> {
    // Exit records by (event, thread), one per CPU.
    let mut exits: BTreeMap<(usize, ThreadId), Vec<Count>> = BTreeMap::new();
    for exit in &log.exits {
        exits
            .entry((exit.event, exit.thread))
            .or_default()
            .push(exit.count);
    }
    let mut rows: BTreeMap<ThreadId, ThreadRow> = BTreeMap::new();
    let roots: BTreeSet<ThreadId> = per_task.keys().map(|(_, root)| *root).collect();
    for &root in &roots {
        let recorded: BTreeSet<ThreadId> = log
            .exits
            .iter()
            .filter(|exit| exit.root == root)
            .map(|exit| exit.thread)
            .collect();
        let mut rest = empty();
        for ((event, _), total) in per_task.iter().filter(|((_, of), _)| *of == root) {
            rest[*event] = Some(*total);
        }
        for &thread in &recorded {
            let row = rows
                .entry(thread)
                .or_insert_with(|| new_row(thread, log, empty));
            for (event, slot) in row.counts.iter_mut().enumerate() {
                let (Some(own), Some(remaining)) = (slot.as_mut(), rest[event].as_mut()) else {
                    continue;
                };
                if let Some(counts) = exits.get(&(event, thread)) {
                    let count = Count::of_task_on_cpus(counts.iter().copied());
                    *own += count;
                    *remaining = remaining.minus(&count);
                }
            }
        }
        let family: BTreeSet<ThreadId> = std::iter::once(root)
            .chain(
                log.started
                    .iter()
                    .filter(|thread| log.root_of(thread.tid) == Some(root))
                    .copied(),
            )
            .collect();
        let unrecorded: Vec<ThreadId> = family.difference(&recorded).copied().collect();
        let owner = match unrecorded.first() {
            Some(_) if unrecorded.contains(&root) => root,
            Some(&first) => first,
            None => root,
        };
        let row = rows
            .entry(owner)
            .or_insert_with(|| new_row(owner, log, empty));
        row.also_counts += unrecorded.len().saturating_sub(1) as u32;
        for (slot, remaining) in row.counts.iter_mut().zip(rest) {
            if let (Some(own), Some(remaining)) = (slot.as_mut(), remaining) {
                *own += remaining;
            }
        }
    }
    rows.into_values().collect()
}

fn cpu_rows(readings: &[Reading], empty: &dyn Fn() -> Counts) -> Vec<CpuRow> {
    let mut rows: BTreeMap<u32, CpuRow> = BTreeMap::new();
    for reading in readings {
        let Some(cpu) = reading.placement.cpu else {
            continue;
        };
        let row = rows.entry(cpu).or_insert_with(|| CpuRow {
            cpu,
            counts: empty(),
        });
        let count = match reading.placement.thread {
            Some(_) => Count::of_task_on_cpus([reading.count]),
            None => reading.count,
        };
        if let Some(total) = &mut row.counts[reading.event] {
            *total += count;
        }
    }
    rows.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::super::counters::{Placement, ThreadExit};
    use super::*;
    use crate::events::{parse_event_list, PmuRegistry};

    const MAIN: ThreadId = ThreadId { pid: 100, tid: 100 };
    const WORKER_A: ThreadId = ThreadId { pid: 100, tid: 101 };
    const WORKER_B: ThreadId = ThreadId { pid: 100, tid: 102 };

    fn specs() -> Vec<EventSpec> {
        parse_event_list("task-clock,cycles", &PmuRegistry::default()).unwrap()
    }

    fn unsupported() -> Vec<Option<String>> {
        vec![None, Some("no hardware PMU".to_string())]
    }

    fn reading(thread: Option<ThreadId>, cpu: Option<u32>, count: Count) -> Reading {
        Reading {
            event: 0,
            placement: Placement { thread, cpu },
            count,
        }
    }

    fn exit(thread: ThreadId, count: Count) -> ThreadExit {
        ThreadExit {
            event: 0,
            root: MAIN,
            thread,
            count,
        }
    }

    fn log(exits: Vec<ThreadExit>, started: &[ThreadId]) -> ThreadLog {
        let mut log = ThreadLog {
            roots: vec![MAIN],
            exits,
            started: started.iter().copied().collect(),
            ..ThreadLog::default()
        };
        for thread in started {
            log.parents.insert(thread.tid, MAIN.tid);
        }
        log.names.insert(MAIN.tid, "server".to_string());
        log.names.insert(WORKER_A.tid, "worker-a".to_string());
        log
    }

    /// The main thread's counters on two CPUs: the task family ran 1000 ns in all.
    fn family_readings() -> Vec<Reading> {
        vec![
            reading(Some(MAIN), Some(0), Count::from_reading(700, 1_000, 700)),
            reading(Some(MAIN), Some(1), Count::from_reading(300, 1_000, 300)),
        ]
    }

    #[test]
    fn totals_merge_a_tasks_cpus_and_keep_unsupported_reasons() {
        let (events, breakdown) = assemble(
            &specs(),
            &unsupported(),
            &family_readings(),
            &ThreadLog::default(),
            Split::default(),
        );
        assert_eq!(
            events[0].total,
            Ok(Count::from_reading(1_000, 1_000, 1_000))
        );
        assert_eq!(events[1].total, Err("no hardware PMU".to_string()));
        assert_eq!(breakdown, Breakdown::None);
    }

    #[test]
    fn system_wide_cpus_add_up_each_scaled_on_its_own() {
        let readings = [
            reading(None, Some(0), Count::from_reading(100, 1_000, 1_000)),
            reading(None, Some(1), Count::from_reading(100, 1_000, 500)),
        ];
        let split = Split {
            per_cpu: true,
            per_thread: false,
        };
        let (events, breakdown) = assemble(
            &specs(),
            &unsupported(),
            &readings,
            &ThreadLog::default(),
            split,
        );
        assert_eq!(events[0].total.as_ref().unwrap().estimate, 300);
        let Breakdown::Cpus(rows) = breakdown else {
            panic!("per-CPU rows expected");
        };
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].counts[0].unwrap().estimate, 200);
        assert!(rows[1].counts[0].unwrap().scaled());
        assert_eq!(rows[1].counts[1], None, "unsupported events have no count");
    }

    #[test]
    fn a_tasks_per_cpu_rows_are_what_ran_there() {
        let split = Split {
            per_cpu: true,
            per_thread: false,
        };
        let (_, breakdown) = assemble(
            &specs(),
            &unsupported(),
            &family_readings(),
            &ThreadLog::default(),
            split,
        );
        let Breakdown::Cpus(rows) = breakdown else {
            panic!("per-CPU rows expected");
        };
        let cpu0 = rows[0].counts[0].unwrap();
        assert_eq!(
            (cpu0.estimate, cpu0.enabled_ns, cpu0.scaled()),
            (700, 700, false)
        );
    }

    fn per_thread() -> Split {
        Split {
            per_cpu: false,
            per_thread: true,
        }
    }

    #[test]
    fn exited_threads_get_their_own_counts_and_the_rest_is_the_thread_without_one() {
        // Worker A exited with 200 + 100 on two CPUs; the main thread holds the opened
        // counters and has no exit record: it gets the rest.
        // The kernel's per-CPU enabled times of a thread are not comparable after context
        // swaps: only counts and running times are used.
        let exits = vec![
            exit(WORKER_A, Count::from_reading(200, 250, 200)),
            exit(WORKER_A, Count::from_reading(100, 900, 100)),
        ];
        let (_, breakdown) = assemble(
            &specs(),
            &unsupported(),
            &family_readings(),
            &log(exits, &[WORKER_A]),
            per_thread(),
        );
        let Breakdown::Threads(rows) = breakdown else {
            panic!("per-thread rows expected");
        };
        let summary: Vec<_> = rows
            .iter()
            .map(|row| {
                (
                    row.name.as_str(),
                    row.counts[0].unwrap().estimate,
                    row.also_counts,
                )
            })
            .collect();
        assert_eq!(summary, [("server", 700, 0), ("worker-a", 300, 0)]);
    }

    #[test]
    fn after_a_context_swap_the_rest_belongs_to_the_thread_without_an_exit_record() {
        // The kernel swapped contexts: the main thread exited with an inherited copy (it has an
        // exit record) and worker B ended up holding the opened counters (no record).
        let exits = vec![
            exit(MAIN, Count::from_reading(400, 400, 400)),
            exit(WORKER_A, Count::from_reading(250, 250, 250)),
        ];
        let (_, breakdown) = assemble(
            &specs(),
            &unsupported(),
            &family_readings(),
            &log(exits, &[WORKER_A, WORKER_B]),
            per_thread(),
        );
        let Breakdown::Threads(rows) = breakdown else {
            panic!("per-thread rows expected");
        };
        let summary: Vec<_> = rows
            .iter()
            .map(|row| (row.thread.tid, row.counts[0].unwrap().estimate))
            .collect();
        assert_eq!(summary, [(100, 400), (101, 250), (102, 350)]);
        assert_eq!(
            rows[2].name, "server",
            "named after the thread that started it"
        );
    }

    #[test]
    fn threads_still_running_share_the_rest_and_the_row_says_how_many() {
        let exits = vec![exit(WORKER_A, Count::from_reading(250, 250, 250))];
        let started = [WORKER_A, WORKER_B, ThreadId { pid: 100, tid: 103 }];
        let (_, breakdown) = assemble(
            &specs(),
            &unsupported(),
            &family_readings(),
            &log(exits, &started),
            per_thread(),
        );
        let Breakdown::Threads(rows) = breakdown else {
            panic!("per-thread rows expected");
        };
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].thread, MAIN);
        assert_eq!(rows[0].also_counts, 2);
        assert_eq!(rows[0].counts[0].unwrap().estimate, 750);
        assert_eq!(rows[0].counts[1], None);
    }
}
