//! From raw runs to the figures: ratios to the bare run of the same round, medians with their
//! spread over rounds, sample accounting summed over rounds, bytes per million samples.

use serde::Serialize;

use super::{
    measure::Measured,
    tools::{EventSampling, SampleCounts},
};

/// Median and range of one figure over the repetitions.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub count: usize,
}

impl Spread {
    /// `None` when there are no finite values.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let middle = values.len() / 2;
        let median = if values.len() % 2 == 1 {
            values[middle]
        } else {
            (values[middle - 1] + values[middle]) / 2.0
        };
        Some(Spread {
            median,
            min: values[0],
            max: values[values.len() - 1],
            count: values.len(),
        })
    }
}

/// One profiled run: what it cost, what the tool kept, how big its file is.
#[derive(Clone, Debug, Serialize)]
pub struct ToolRun {
    pub run: Measured,
    pub counts: SampleCounts,
    /// Size of the profile file (ours: `-o FILE`; perf: perf.data).
    pub profile_bytes: u64,
}

/// One round of one workload at one event and rate: bare, ours and perf back to back, so the
/// machine's noise of the moment hits all three alike.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    pub workload: &'static str,
    pub sampling: EventSampling,
    pub round: u32,
    pub bare: Measured,
    pub ours: ToolRun,
    pub perf: ToolRun,
}

/// One tool's figures for one workload, event and rate, over every round.
#[derive(Clone, Debug, Serialize)]
pub struct ToolSummary {
    /// The workload's own wall time (run_timed), as a ratio to the bare run.
    pub workload_wall_ratio: Option<Spread>,
    /// The whole command's wall time, the tool's start-up and teardown included.
    pub command_wall_ratio: Option<Spread>,
    /// CPU time of the workload's process tree.
    pub workload_cpu_ratio: Option<Spread>,
    /// CPU time of the whole tree: the workload and the tool's own process.
    pub total_cpu_ratio: Option<Spread>,
    /// Samples the kernel should have fired (CPU time x rate, or faults / period), summed.
    pub expected_samples: f64,
    /// Sample accounting summed over rounds.
    pub counts: SampleCounts,
    /// Samples the kernel fired that were neither kept nor reported lost (ours only).
    pub unaccounted: Option<i64>,
    /// Lost (reported or not) as a percentage of the samples that reached the tool.
    pub loss_percent: f64,
    pub bytes_per_million_samples: Option<Spread>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RowSummary {
    pub workload: &'static str,
    pub sampling: EventSampling,
    pub label: String,
    pub bare_wall_s: Option<Spread>,
    pub bare_cpu_s: Option<Spread>,
    pub ours: ToolSummary,
    pub perf: ToolSummary,
}

fn summarize_tool(trials: &[&Trial], pick: impl Fn(&Trial) -> &ToolRun) -> ToolSummary {
    let ratios = |figure: &dyn Fn(&Measured) -> Option<f64>| {
        Spread::of(
            trials
                .iter()
                .filter_map(|trial| Some(figure(&pick(trial).run)? / figure(&trial.bare)?)),
        )
    };
    let mut counts = SampleCounts::default();
    let mut expected_samples = 0.0;
    for trial in trials {
        let run = pick(trial);
        counts.add(&run.counts);
        expected_samples += run
            .run
            .workload
            .and_then(|workload| trial.sampling.expected_samples(&workload))
            .unwrap_or(0.0);
    }
    let unaccounted = counts.unaccounted();
    ToolSummary {
        workload_wall_ratio: ratios(&|run| Some(run.workload?.wall_s)),
        command_wall_ratio: ratios(&|run| Some(run.wall_s)),
        workload_cpu_ratio: ratios(&|run| Some(run.workload?.cpu_s)),
        total_cpu_ratio: ratios(&|run| Some(run.cpu_s)),
        expected_samples,
        counts,
        unaccounted,
        loss_percent: counts.loss_percent(),
        bytes_per_million_samples: Spread::of(
            trials
                .iter()
                .map(|trial| pick(trial))
                .filter(|run| run.counts.recorded > 0)
                .map(|run| run.profile_bytes as f64 * 1e6 / run.counts.recorded as f64),
        ),
    }
}

/// Rows in the order the trials first ran.
pub fn summarize(trials: &[Trial]) -> Vec<RowSummary> {
    let mut keys: Vec<(&'static str, EventSampling)> = Vec::new();
    for trial in trials {
        if !keys.contains(&(trial.workload, trial.sampling)) {
            keys.push((trial.workload, trial.sampling));
        }
    }
    keys.into_iter()
        .map(|(workload, sampling)| {
            let rows: Vec<&Trial> = trials
                .iter()
                .filter(|trial| trial.workload == workload && trial.sampling == sampling)
                .collect();
            RowSummary {
                workload,
                sampling,
                label: sampling.label(),
                bare_wall_s: Spread::of(
                    rows.iter()
                        .filter_map(|trial| Some(trial.bare.workload?.wall_s)),
                ),
                bare_cpu_s: Spread::of(
                    rows.iter()
                        .filter_map(|trial| Some(trial.bare.workload?.cpu_s)),
                ),
                ours: summarize_tool(&rows, |trial| &trial.ours),
                perf: summarize_tool(&rows, |trial| &trial.perf),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{
        measure::WorkloadTimes,
        tools::{Event, Sampling},
    };

    #[test]
    fn median_and_range_ignore_what_is_not_a_number() {
        let spread = Spread::of([3.0, f64::NAN, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(
            spread,
            Spread {
                median: 2.5,
                min: 1.0,
                max: 10.0,
                count: 4
            }
        );
        assert_eq!(Spread::of([5.0, 1.0, 3.0]).unwrap().median, 3.0);
        assert_eq!(Spread::of([f64::INFINITY]), None);
    }

    fn measured(wall_s: f64, cpu_s: f64, workload_cpu_s: f64) -> Measured {
        Measured {
            command: String::new(),
            wall_s,
            cpu_s,
            max_rss_kib: 0,
            stdout_bytes: 0,
            workload: Some(WorkloadTimes {
                wall_s: wall_s - 0.1,
                cpu_s: workload_cpu_s,
                page_faults: 0,
            }),
            stderr: String::new(),
        }
    }

    fn tool_run(cpu_s: f64, counts: SampleCounts, profile_bytes: u64) -> ToolRun {
        ToolRun {
            run: measured(1.1, cpu_s, 1.0),
            counts,
            profile_bytes,
        }
    }

    #[test]
    fn ratios_pair_each_run_with_the_bare_run_of_its_round() {
        let sampling = EventSampling {
            event: Event::CpuClock,
            sampling: Sampling::FrequencyHz(1000),
        };
        let trial = |round, bare_cpu: f64, ours_cpu: f64, ours_fired| Trial {
            workload: "deep_stack",
            sampling,
            round,
            bare: measured(1.1, bare_cpu, 1.0),
            ours: tool_run(
                ours_cpu,
                SampleCounts {
                    recorded: 900,
                    lost: 50,
                    fired: Some(ours_fired),
                    stacks_lost: Some(3),
                    throttle_events: None,
                },
                90_000,
            ),
            perf: tool_run(
                2.0 * bare_cpu,
                SampleCounts {
                    recorded: 1000,
                    lost: 0,
                    fired: None,
                    stacks_lost: None,
                    throttle_events: Some(0),
                },
                72_000,
            ),
        };
        // Round 1 ran on a machine twice as slow: the ratios stay the same.
        let rows = summarize(&[trial(0, 1.0, 1.1, 1000), trial(1, 2.0, 2.2, 960)]);
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.label, "cpu-clock -F 1000");
        let ours_cpu = row.ours.total_cpu_ratio.unwrap();
        assert!((ours_cpu.min - 1.1).abs() < 1e-9 && (ours_cpu.max - 1.1).abs() < 1e-9);
        assert_eq!(row.perf.total_cpu_ratio.unwrap().median, 2.0);
        assert_eq!(row.ours.counts.recorded, 1800);
        assert_eq!(row.ours.counts.fired, Some(1960));
        assert_eq!(row.ours.counts.stacks_lost, Some(6));
        // 1960 fired = 1800 kept + 100 reported lost + 60 silently missing.
        assert_eq!(row.ours.unaccounted, Some(60));
        assert!((row.ours.loss_percent - 100.0 * 160.0 / 1960.0).abs() < 1e-9);
        assert_eq!(row.perf.loss_percent, 0.0);
        assert_eq!(row.perf.counts.throttle_events, Some(0));
        assert_eq!(row.ours.expected_samples, 2000.0);
        assert_eq!(row.ours.bytes_per_million_samples.unwrap().median, 1e8);
        assert_eq!(row.perf.bytes_per_million_samples.unwrap().median, 7.2e7);
    }
}
