//! The three ways a workload runs (alone, under `profiler record`, under `perf record -g`), the
//! event and rate they sample at, and how each tool's output says how many samples it kept and
//! lost.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use super::measure::WorkloadTimes;

/// The two profilers compared.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Ours,
    Perf,
}

impl Tool {
    pub fn name(self) -> &'static str {
        match self {
            Tool::Ours => "ours",
            Tool::Perf => "perf",
        }
    }
}

/// What a tool profiles.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// A command it launches (already wrapped in `run_timed`).
    Command(&'a [String]),
    /// Every CPU, for this many seconds.
    System { seconds: f64 },
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    CpuClock,
    PageFaults,
}

impl Event {
    pub fn name(self) -> &'static str {
        match self {
            Event::CpuClock => "cpu-clock",
            Event::PageFaults => "page-faults",
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// Samples per second per CPU (`-F`): the kernel adjusts the period.
    FrequencyHz(u64),
    /// Every Nth event (`-c`).
    Period(u64),
}

/// The event and rate both tools sample at, spelled the same way for both.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct EventSampling {
    pub event: Event,
    pub sampling: Sampling,
}

impl EventSampling {
    pub fn args(&self) -> Vec<String> {
        let (flag, value) = match self.sampling {
            Sampling::FrequencyHz(hz) => ("-F", hz),
            Sampling::Period(period) => ("-c", period),
        };
        vec![
            "-e".into(),
            self.event.name().into(),
            flag.into(),
            value.to_string(),
        ]
    }

    pub fn label(&self) -> String {
        self.args()[1..].join(" ")
    }

    /// The rate in Hz, for plotting against; `None` for period sampling.
    pub fn frequency(&self) -> Option<u64> {
        match self.sampling {
            Sampling::FrequencyHz(hz) => Some(hz),
            Sampling::Period(_) => None,
        }
    }

    /// How many samples the kernel should fire for this workload run: CPU time x rate for
    /// cpu-clock, page faults / period for page-faults (both count the whole process tree).
    pub fn expected_samples(&self, workload: &WorkloadTimes) -> Option<f64> {
        match (self.event, self.sampling) {
            (Event::CpuClock, Sampling::FrequencyHz(hz)) => Some(workload.cpu_s * hz as f64),
            (Event::PageFaults, Sampling::Period(period)) => {
                Some(workload.page_faults as f64 / period as f64)
            }
            _ => None,
        }
    }
}

/// The built binaries the bench runs.
#[derive(Clone)]
pub struct Tools {
    /// py-spy, from PyPI: the Python section's reference.
    pub py_spy: PathBuf,
    pub profiler: PathBuf,
    pub run_timed: PathBuf,
}

impl Tools {
    /// The command line that runs `tool` on `target`, writing the profile to `profile`
    /// (perf.data for perf), with `options` added to `record`'s own.
    pub fn argv(
        &self,
        tool: Tool,
        sampling: &EventSampling,
        target: Target,
        profile: &Path,
        options: &[&str],
    ) -> Vec<String> {
        let mut argv: Vec<String> = match tool {
            Tool::Ours => vec![path_arg(&self.profiler), "record".into()],
            Tool::Perf => vec!["perf".into(), "record".into(), "-g".into()],
        };
        argv.extend(sampling.args());
        argv.extend(options.iter().map(|option| option.to_string()));
        if tool == Tool::Ours {
            // The JSON report on stdout carries the sample accounting.
            argv.extend(["--json".into(), "-".into()]);
        }
        argv.extend(["-o".into(), path_arg(profile)]);
        match (target, tool) {
            (Target::Command(command), _) => {
                argv.push("--".into());
                argv.extend(command.iter().cloned());
            }
            (Target::System { seconds }, Tool::Ours) => {
                argv.extend(["-a".into(), "--duration".into(), seconds.to_string()]);
            }
            (Target::System { seconds }, Tool::Perf) => {
                argv.extend(["-a", "--", "sleep"].map(String::from));
                argv.push(seconds.to_string());
            }
        }
        argv
    }

    /// `run_timed PROGRAM ARGS...`.
    pub fn timed(&self, program: &Path, args: &[String]) -> Vec<String> {
        let mut argv = vec![path_arg(&self.run_timed), path_arg(program)];
        argv.extend(args.iter().cloned());
        argv
    }
}

pub fn path_arg(path: &Path) -> String {
    path.display().to_string()
}

/// What a tool says it kept and lost of one event's samples.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SampleCounts {
    pub recorded: u64,
    /// Whole samples the tool reports as lost (ours: `samples lost: ...` counters; perf: its
    /// LOST and LOST_SAMPLES records).
    pub lost: u64,
    /// Samples the kernel fired, counted in the kernel (ours only: perf does not count them).
    pub fired: Option<u64>,
    /// Samples whose call stack was lost while the sample was kept (ours only).
    pub stacks_lost: Option<u64>,
    /// Times the kernel throttled the event for taking too long (perf's THROTTLE records).
    pub throttle_events: Option<u64>,
}

impl SampleCounts {
    /// Adds another run's counts; a count only one of them has stays known.
    pub fn add(&mut self, other: &SampleCounts) {
        let add = |total: Option<u64>, part: Option<u64>| match (total, part) {
            (total, None) => total,
            (total, Some(part)) => Some(total.unwrap_or(0) + part),
        };
        self.recorded += other.recorded;
        self.lost += other.lost;
        self.fired = add(self.fired, other.fired);
        self.stacks_lost = add(self.stacks_lost, other.stacks_lost);
        self.throttle_events = add(self.throttle_events, other.throttle_events);
    }

    /// Samples fired but neither kept nor counted lost (ours only: perf does not count what
    /// fired); negative when more were kept than counted fired.
    pub fn unaccounted(&self) -> Option<i64> {
        self.fired
            .map(|fired| fired as i64 - self.recorded as i64 - self.lost as i64)
    }

    /// Samples lost, counted or silently, in percent of those kept and lost.
    pub fn loss_percent(&self) -> f64 {
        let missing = self.lost as f64 + self.unaccounted().unwrap_or(0).max(0) as f64;
        let reached = self.recorded as f64 + missing;
        if reached > 0.0 {
            100.0 * missing / reached
        } else {
            0.0
        }
    }
}

/// Sample accounting from `profiler record --json` (schema profiler.report/1, one event).
pub fn ours_counts(report_json: &str) -> Result<SampleCounts> {
    let report: serde_json::Value =
        serde_json::from_str(report_json).context("parsing the profiler's JSON report")?;
    let event = &report["events"][0];
    let number = |value: &serde_json::Value, what: &str| {
        value
            .as_u64()
            .ok_or_else(|| anyhow!("the profiler's JSON report has no {what}"))
    };
    let losses = report["losses"]
        .as_object()
        .ok_or_else(|| anyhow!("the profiler's JSON report has no losses"))?;
    let sum_losses = |prefix: &str| -> u64 {
        losses
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .filter_map(|(_, count)| count.as_u64())
            .sum()
    };
    Ok(SampleCounts {
        recorded: number(&event["samples"], "events[0].samples")?,
        lost: sum_losses("samples lost"),
        fired: Some(number(&event["samples_fired"], "events[0].samples_fired")?),
        stacks_lost: Some(sum_losses("user stacks lost") + sum_losses("kernel stacks lost")),
        throttle_events: None,
    })
}

/// Sample accounting from `perf report --stats`: the event's own section (`cpu-clock stats:`)
/// has its SAMPLE count and the lost samples (from LOST and LOST_SAMPLES records); the
/// aggregated section has the THROTTLE records.
pub fn perf_counts(stats: &str, event: Event) -> Result<SampleCounts> {
    let count = |line: &str, record: &str| -> Option<u64> {
        let rest = line.trim().strip_prefix(record)?.strip_prefix(" events:")?;
        rest.split_whitespace().next()?.parse().ok()
    };
    let header = format!("{} stats:", event.name());
    let section: Vec<&str> = stats
        .lines()
        .skip_while(|line| line.trim() != header)
        .skip(1)
        .take_while(|line| !line.trim_end().ends_with("stats:"))
        .collect();
    // perf prints an event's section only when it kept a sample of it; with no SAMPLE
    // record anywhere it kept none (a run of children each shorter than one period).
    let kept_none = !stats.lines().any(|line| count(line, "SAMPLE").is_some());
    let recorded = match section.iter().find_map(|line| count(line, "SAMPLE")) {
        Some(recorded) => recorded,
        None if kept_none => 0,
        None => bail!("`perf report --stats` shows no SAMPLE count under `{header}`:\n{stats}"),
    };
    Ok(SampleCounts {
        recorded,
        lost: section
            .iter()
            .find_map(|line| count(line, "LOST_SAMPLES"))
            .unwrap_or(0),
        fired: None,
        stacks_lost: None,
        throttle_events: Some(
            stats
                .lines()
                .find_map(|line| count(line, "THROTTLE"))
                .unwrap_or(0),
        ),
    })
}

/// What `profiler record --stats` says the capture cost.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct CaptureCost {
    /// Mean run time of the BPF program per sample, from the kernel's run-time statistics.
    pub ns_per_sample: f64,
    pub program_runs: u64,
    /// Memory the BPF maps lock in the kernel (not in the agent's RSS).
    pub map_mib: f64,
}

/// Reads `in the kernel: N ns per sample over M runs ...` and `map memory: X MiB locked`.
pub fn ours_capture_cost(stderr: &str) -> Result<CaptureCost> {
    let after = |marker: &str| -> Option<Vec<&str>> {
        let line = stderr
            .lines()
            .find_map(|line| line.trim().strip_prefix(marker))?;
        Some(line.split_whitespace().collect())
    };
    let parse = || -> Option<CaptureCost> {
        let kernel = after("in the kernel:")?;
        let maps = after("map memory:")?;
        // "1250 ns per sample over 1000 runs": the count is the word after "over".
        let over = kernel.iter().position(|word| *word == "over")?;
        Some(CaptureCost {
            ns_per_sample: kernel.first()?.parse().ok()?,
            program_runs: kernel.get(over + 1)?.parse().ok()?,
            map_mib: maps.first()?.parse().ok()?,
        })
    };
    parse().ok_or_else(|| {
        anyhow!(
            "`profiler record --stats` printed no `in the kernel: N ns per sample over M runs` \
             and `map memory: X MiB` lines; its stderr:\n{stderr}"
        )
    })
}

/// The capture program's whole run time in the kernel, in seconds, from `record --stats`:
/// zero when it never ran (`in the kernel: no runs counted`).
pub fn ours_kernel_time_s(stderr: &str) -> Result<f64> {
    if stderr
        .lines()
        .any(|line| line.trim() == "in the kernel: no runs counted")
    {
        return Ok(0.0);
    }
    let cost = ours_capture_cost(stderr)?;
    Ok(cost.ns_per_sample * cost.program_runs as f64 * 1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_tools_get_the_same_event_and_rate_and_a_profile_file() {
        let tools = Tools {
            profiler: "/r/profiler".into(),
            run_timed: "/r/run_timed".into(),
            py_spy: "/r/py-spy".into(),
        };
        let workload = tools.timed(Path::new("/r/deep_stack"), &["5".into()]);
        let sampling = EventSampling {
            event: Event::PageFaults,
            sampling: Sampling::Period(1),
        };
        let file = Path::new("/w/p");
        let command = Target::Command(&workload);
        assert_eq!(
            tools
                .argv(Tool::Ours, &sampling, command, file, &["--stats"])
                .join(" "),
            "/r/profiler record -e page-faults -c 1 --stats --json - -o /w/p -- /r/run_timed \
             /r/deep_stack 5"
        );
        assert_eq!(
            tools
                .argv(Tool::Perf, &sampling, command, file, &[])
                .join(" "),
            "perf record -g -e page-faults -c 1 -o /w/p -- /r/run_timed /r/deep_stack 5"
        );
        assert_eq!(sampling.label(), "page-faults -c 1");
    }

    #[test]
    fn system_wide_runs_stop_after_the_same_time() {
        let tools = Tools {
            profiler: "/r/profiler".into(),
            run_timed: "/r/run_timed".into(),
            py_spy: "/r/py-spy".into(),
        };
        let sampling = EventSampling {
            event: Event::CpuClock,
            sampling: Sampling::FrequencyHz(1000),
        };
        let system = Target::System { seconds: 2.5 };
        let file = Path::new("/w/p");
        assert_eq!(
            tools
                .argv(Tool::Ours, &sampling, system, file, &[])
                .join(" "),
            "/r/profiler record -e cpu-clock -F 1000 --json - -o /w/p -a --duration 2.5"
        );
        assert_eq!(
            tools
                .argv(Tool::Perf, &sampling, system, file, &[])
                .join(" "),
            "perf record -g -e cpu-clock -F 1000 -o /w/p -a -- sleep 2.5"
        );
    }

    #[test]
    fn expected_samples_follow_the_event() {
        let workload = WorkloadTimes {
            wall_s: 2.0,
            cpu_s: 1.5,
            page_faults: 9000,
        };
        let cpu = EventSampling {
            event: Event::CpuClock,
            sampling: Sampling::FrequencyHz(1000),
        };
        let faults = EventSampling {
            event: Event::PageFaults,
            sampling: Sampling::Period(3),
        };
        assert_eq!(cpu.expected_samples(&workload), Some(1500.0));
        assert_eq!(faults.expected_samples(&workload), Some(3000.0));
    }

    #[test]
    fn reads_our_accounting_whole_samples_and_stacks_apart() {
        let json = r#"{"events":[{"samples":980,"samples_fired":1000}],
            "losses":{"samples lost: stack-count map full":15,
                      "samples lost: unregistered perf event":0,
                      "user stacks lost: another stack has the same hash":7,
                      "kernel stacks lost: stack-frames map full":2,
                      "raw stream: ring buffer full":4}}"#;
        assert_eq!(
            ours_counts(json).unwrap(),
            SampleCounts {
                recorded: 980,
                lost: 15,
                fired: Some(1000),
                stacks_lost: Some(9),
                throttle_events: None,
            }
        );
        assert!(ours_counts(r#"{"events":[]}"#).is_err());
    }

    #[test]
    fn reads_perf_stats_from_the_event_section() {
        let stats = "\nAggregated stats:\n           TOTAL events:     127797\n\
                     \x20           LOST events:         68  ( 0.1%)\n\
                     \x20       THROTTLE events:          3  ( 0.0%)\n\
                     \x20         SAMPLE events:     119487  (94.5%)\n\
                     \x20   LOST_SAMPLES events:          1  ( 0.0%)\n\
                     cpu-clock stats:\n\
                     \x20         SAMPLE events:     119487\n\
                     \x20   LOST_SAMPLES events:       1497\n";
        assert_eq!(
            perf_counts(stats, Event::CpuClock).unwrap(),
            SampleCounts {
                recorded: 119487,
                lost: 1497,
                fired: None,
                stacks_lost: None,
                throttle_events: Some(3),
            }
        );
        assert!(perf_counts(stats, Event::PageFaults).is_err());
    }

    #[test]
    fn perf_keeping_no_sample_counts_zero() {
        let stats = "\nAggregated stats:\n           TOTAL events:       1920\n\
                     \x20           COMM events:        240  (12.5%)\n\
                     \x20          MMAP2 events:       1195  (62.2%)\n";
        let counts = perf_counts(stats, Event::CpuClock).unwrap();
        assert_eq!((counts.recorded, counts.lost), (0, 0));
    }

    #[test]
    fn reads_the_capture_cost_that_record_stats_prints() {
        let stderr =
            "note: sampling\nCapture cost:\n  in the kernel: 1250 ns per sample over 1000 \
                      runs (50.0% of the kernel's 2500 ns budget); 1000 samples fired\n  \
                      map memory: 3.0 MiB locked\n  drains: 4 taking 10.0 ms in all\n";
        assert_eq!(
            ours_capture_cost(stderr).unwrap(),
            CaptureCost {
                ns_per_sample: 1250.0,
                program_runs: 1000,
                map_mib: 3.0
            }
        );
        assert!(ours_capture_cost("  in the kernel: no runs counted\n").is_err());
        assert_eq!(ours_kernel_time_s(stderr).unwrap(), 1250.0 * 1000.0 * 1e-9);
        assert_eq!(
            ours_kernel_time_s("  in the kernel: no runs counted\n").unwrap(),
            0.0
        );
        assert!(ours_kernel_time_s("Capture cost:\n").is_err());
    }

    #[test]
    fn counts_add_up_over_runs_and_loss_counts_the_silent_part() {
        let ours = |recorded, lost, fired| SampleCounts {
            recorded,
            lost,
            fired: Some(fired),
            stacks_lost: Some(1),
            throttle_events: None,
        };
        let mut sum = ours(90, 5, 100);
        sum.add(&ours(100, 0, 100));
        assert_eq!((sum.recorded, sum.lost, sum.fired), (190, 5, Some(200)));
        assert_eq!((sum.stacks_lost, sum.throttle_events), (Some(2), None));
        // 5 fired samples neither kept nor counted lost: 10 of 200 missing.
        assert_eq!(sum.unaccounted(), Some(5));
        assert!((sum.loss_percent() - 5.0).abs() < 1e-9);
        // perf counts no fired samples: its loss is what it says it lost.
        let perf = SampleCounts {
            recorded: 99,
            lost: 1,
            ..SampleCounts::default()
        };
        assert_eq!(perf.unaccounted(), None);
        assert!((perf.loss_percent() - 1.0).abs() < 1e-9);
        assert_eq!(SampleCounts::default().loss_percent(), 0.0);
    }
}
