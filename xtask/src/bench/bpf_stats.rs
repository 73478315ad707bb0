//! The kernel's BPF run-time statistics (`kernel.bpf_stats_enabled`): the exact time a tool's
//! programs spent in the kernel and how often they ran, read with `bpftool prog show`. Our
//! programs and the bpftrace references are read the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};

/// The statistics, on while this lives; put back as they were after.
pub struct BpfStatistics {
    was: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStatistics {
    pub fn enable() -> Result<BpfStatistics> {
        let was =
            std::fs::read_to_string(BPF_STATS).with_context(|| format!("reading {BPF_STATS}"))?;
        std::fs::write(BPF_STATS, "1").with_context(|| format!("enabling {BPF_STATS}"))?;
        Ok(BpfStatistics { was })
    }
}

impl Drop for BpfStatistics {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, self.was.trim());
    }
}

/// Which of the loaded programs a measurement reads.
#[derive(Clone, Copy, Debug)]
pub enum Programs {
    /// Programs on perf events: the samplers.
    OnPerfEvents,
    /// Every other program: `record --off-cpu` also samples the CPU, which the off-CPU
    /// references do not.
    NotOnPerfEvents,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProgramRuns {
    pub runs: u64,
    pub run_time_ns: u64,
}

/// Run counts and times of some programs, by program id.
#[derive(Clone, Debug, Default)]
pub struct ProgramTime {
    pub programs: BTreeMap<u64, ProgramRuns>,
}

impl ProgramTime {
    /// Run time of all the programs per run of the busiest: a tool's programs all run on the
    /// same event (a switch, an overflow), and tail calls count in their caller.
    pub fn ns_per_run(&self) -> Option<f64> {
        let runs = self.programs.values().map(|p| p.runs).max()?;
        let time: u64 = self.programs.values().map(|p| p.run_time_ns).sum();
        (runs > 0).then(|| time as f64 / runs as f64)
    }

    /// What the programs of `self` ran since `earlier`.
    pub fn since(&self, earlier: &ProgramTime) -> ProgramTime {
        let programs = self
            .programs
            .iter()
            .map(|(id, now)| {
                let then = earlier.programs.get(id).copied().unwrap_or(ProgramRuns {
                    runs: 0,
                    run_time_ns: 0,
                });
                let runs = ProgramRuns {
                    runs: now.runs.saturating_sub(then.runs),
                    run_time_ns: now.run_time_ns.saturating_sub(then.run_time_ns),
                };
                (*id, runs)
            })
            .collect();
        ProgramTime { programs }
    }
}

/// The loaded programs of `which` kind, from `bpftool prog show --json`.
pub fn loaded_programs(which: Programs) -> Result<ProgramTime> {
    let output = std::process::Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .context("running bpftool (cargo xtask setup installs it)")?;
    parse_programs(&String::from_utf8_lossy(&output.stdout), which)
}

fn parse_programs(json: &str, which: Programs) -> Result<ProgramTime> {
    let programs: Vec<serde_json::Value> =
        serde_json::from_str(json).context("bpftool's program list is not JSON")?;
    let programs = programs
        .iter()
        .filter(|program| {
            let on_perf_event = program["type"] == "perf_event";
            match which {
                Programs::OnPerfEvents => on_perf_event,
                Programs::NotOnPerfEvents => !on_perf_event,
            }
        })
        .filter_map(|program| {
            let runs = ProgramRuns {
                runs: program["run_cnt"].as_u64().unwrap_or(0),
                run_time_ns: program["run_time_ns"].as_u64().unwrap_or(0),
            };
            Some((program["id"].as_u64()?, runs))
        })
        .collect();
    Ok(ProgramTime { programs })
}

/// The programs of `which` kind loaded now that were not in `before`: those a tool started
/// since loaded.
pub fn loaded_since(before: &BTreeSet<u64>, which: Programs) -> Result<ProgramTime> {
    let mut loaded = loaded_programs(which)?;
    loaded.programs.retain(|id, _| !before.contains(id));
    Ok(loaded)
}

/// Runs `run`, polling the programs of `which` kind loaded meanwhile (those the run's tool
/// loaded): their last values seen while they were loaded.
pub fn with_program_time<T>(
    which: Programs,
    run: impl FnOnce() -> Result<T>,
) -> Result<(T, ProgramTime)> {
    let before: BTreeSet<u64> = loaded_programs(which)?.programs.into_keys().collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let poller = scope.spawn(|| {
            let mut seen = ProgramTime::default();
            while !done.load(Ordering::Relaxed) {
                if let Ok(loaded) = loaded_since(&before, which) {
                    seen.programs.extend(loaded.programs);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        });
        let result = run();
        done.store(true, Ordering::Relaxed);
        let seen = poller.join().expect("the poller does not panic");
        result.map(|value| (value, seen))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = r#"[{"id":7,"name":"offcpu_switch","run_time_ns":3000,"run_cnt":10},
        {"id":8,"name":"offcpu_fork","run_time_ns":500,"run_cnt":2},
        {"id":9,"name":"other"},
        {"id":10,"type":"perf_event","name":"on_overflow","run_time_ns":9900,"run_cnt":99},
        {"id":11,"type":"perf_event","name":"unwind_step","run_time_ns":0,"run_cnt":0}]"#;

    #[test]
    fn program_time_is_per_run_of_the_busiest_program() {
        let time = parse_programs(LIST, Programs::NotOnPerfEvents).unwrap();
        assert_eq!(
            time.programs[&9],
            ProgramRuns {
                runs: 0,
                run_time_ns: 0
            }
        );
        assert!(!time.programs.contains_key(&10));
        assert_eq!(time.ns_per_run(), Some(350.0));
        assert_eq!(ProgramTime::default().ns_per_run(), None);
    }

    #[test]
    fn samplers_are_the_programs_on_perf_events() {
        let time = parse_programs(LIST, Programs::OnPerfEvents).unwrap();
        assert_eq!(time.programs.keys().copied().collect::<Vec<_>>(), [10, 11]);
        assert_eq!(time.ns_per_run(), Some(100.0));
    }

    #[test]
    fn a_measurement_between_two_readings_is_their_difference() {
        let reading = |runs, run_time_ns| ProgramTime {
            programs: [(10, ProgramRuns { runs, run_time_ns })].into(),
        };
        let between = reading(300, 50_000).since(&reading(100, 10_000));
        assert_eq!(between.ns_per_run(), Some(200.0));
        // A program loaded after the first reading counts from zero.
        assert_eq!(
            reading(4, 400).since(&ProgramTime::default()).ns_per_run(),
            Some(100.0)
        );
    }
}
