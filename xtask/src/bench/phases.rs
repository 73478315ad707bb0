//! Running the measurements: each round's bare, ours and perf runs of every workload, the
//! in-kernel cost runs, the system-wide footprint runs and the large profile whose report is
//! timed, holding the kernel's sampling limit steady between runs.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::{
    agent_cost::{Load, RunningLoad},
    machine::{self, MAX_SAMPLE_RATE},
    measure,
    summary::{Spread, ToolRun, Trial},
    tools::{self, CaptureCost, Event, EventSampling, Sampling, Target, Tool, Tools},
    workloads::SizedWorkload,
    Settings,
};

/// Rate of the system-wide footprint runs: a typical always-on profiling rate.
const FOOTPRINT_RATE_HZ: u64 = 1000;

/// The BPF program's cost per sample for one workload and event.
#[derive(Clone, Debug, Serialize)]
pub struct InKernelCost {
    pub workload: &'static str,
    pub label: String,
    pub command: String,
    pub ns_per_sample: Option<Spread>,
    pub program_runs: u64,
    pub budget_ns: f64,
}

/// Peak memory and CPU of a tool's own process during a system-wide run.
#[derive(Clone, Debug, Serialize)]
pub struct Footprint {
    pub tool: Tool,
    pub command: String,
    pub peak_rss_mib: Option<Spread>,
    pub cpu_s: Option<Spread>,
    /// CPU time as a percentage of one CPU over the run.
    pub cpu_percent: Option<Spread>,
    /// Memory locked by the BPF maps (ours), outside the RSS.
    pub map_mib: Option<Spread>,
}

/// Time from a profile file to a function report.
#[derive(Clone, Debug, Serialize)]
pub struct ReportSpeed {
    pub tool: Tool,
    pub record_command: String,
    pub report_command: String,
    pub samples: u64,
    pub profile_bytes: u64,
    pub report_s: f64,
}

/// The kernel lowered its maximum sampling rate after a run ("perf: interrupt took too long").
#[derive(Clone, Debug, Serialize)]
pub struct RateLowering {
    pub command: String,
    pub lowered_to: u64,
}

/// The bench's state while it runs.
pub struct Bench {
    tools: Tools,
    release: PathBuf,
    work: PathBuf,
    settings: Settings,
    notes: Vec<String>,
    /// kernel.perf_event_max_sample_rate for every run: the machine's own, or raised by
    /// --raise-max-sample-rate.
    max_sample_rate: u64,
    rate_lowerings: Vec<RateLowering>,
}

impl Bench {
    pub fn new(
        tools: Tools,
        release: PathBuf,
        work: PathBuf,
        settings: Settings,
        max_sample_rate: u64,
    ) -> Bench {
        Bench {
            tools,
            release,
            work,
            settings,
            notes: Vec::new(),
            max_sample_rate,
            rate_lowerings: Vec::new(),
        }
    }

    /// The notes for the reader and the runs after which the kernel lowered its maximum rate.
    pub fn finish(self) -> (Vec<String>, Vec<RateLowering>) {
        (self.notes, self.rate_lowerings)
    }

    pub fn note(&mut self, note: String) {
        if !self.notes.contains(&note) {
            eprintln!("xtask bench: note: {note}");
            self.notes.push(note);
        }
    }

    fn work_file(&self, name: &str) -> Result<PathBuf> {
        let path = self.work.join(name);
        // perf renames an existing output to .old: start from nothing.
        match std::fs::remove_file(&path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                Err(error).with_context(|| format!("removing {}", path.display()))
            }
            _ => Ok(path),
        }
    }

    /// Whether the kernel accepts this rate; rates above the maximum are skipped with a note
    /// (unless --raise-max-sample-rate raised it).
    fn rate_allowed(&mut self, sampling: &EventSampling) -> bool {
        match sampling.frequency() {
            Some(hz) if hz > self.max_sample_rate => {
                self.note(format!(
                    "{hz} Hz skipped: kernel.perf_event_max_sample_rate is {} (run with \
                     --raise-max-sample-rate to raise it for the bench)",
                    self.max_sample_rate
                ));
                false
            }
            _ => true,
        }
    }

    /// When a run made the kernel lower its maximum sampling rate, records it and puts the
    /// maximum back, so that every round runs under the same limit.
    fn hold_max_sample_rate(&mut self, command: &str) -> Result<()> {
        let now = machine::read_number(MAX_SAMPLE_RATE)?;
        if now < self.max_sample_rate {
            eprintln!(
                "xtask bench: the kernel lowered perf_event_max_sample_rate to {now} after \
                 `{command}`; putting it back to {}",
                self.max_sample_rate
            );
            self.rate_lowerings.push(RateLowering {
                command: command.to_string(),
                lowered_to: now,
            });
            std::fs::write(MAX_SAMPLE_RATE, self.max_sample_rate.to_string())
                .with_context(|| format!("writing {MAX_SAMPLE_RATE}"))?;
        }
        Ok(())
    }

    /// Runs `tool` on `target` and reads what it kept; the profile is left in
    /// [`Bench::profile_path`].
    fn profiled(
        &mut self,
        tool: Tool,
        sampling: &EventSampling,
        target: Target,
        options: &[&str],
    ) -> Result<ToolRun> {
        let profile = self.work_file(profile_name(tool))?;
        let report = match tool {
            Tool::Ours => Some(self.work_file("ours.json")?),
            Tool::Perf => None,
        };
        let argv = self.tools.argv(tool, sampling, target, &profile, options);
        let run = match measure::run(&argv, report.as_deref()) {
            Ok(run) => run,
            // perf 6.1 now and then aborts in its build-id pass at the end of a recording
            // ("assertion failed at util/build-id.c", "buffer overflow detected"): one retry.
            Err(error) if tool == Tool::Perf => {
                let reason = format!("{error:#}");
                self.note(format!(
                    "perf record failed once and was run again: {}",
                    reason.lines().last().unwrap_or_default()
                ));
                measure::run(&argv, None)?
            }
            Err(error) => return Err(error),
        };
        self.hold_max_sample_rate(&run.command)?;
        let counts = match &report {
            Some(report) => tools::ours_counts(
                &std::fs::read_to_string(report)
                    .with_context(|| format!("reading {}", report.display()))?,
            )?,
            None => tools::perf_counts(&perf_stats(&profile)?, sampling.event)?,
        };
        let profile_bytes = std::fs::metadata(&profile)
            .with_context(|| {
                format!(
                    "`{}` wrote no profile to {}",
                    run.command,
                    profile.display()
                )
            })?
            .len();
        Ok(ToolRun {
            run,
            counts,
            profile_bytes,
        })
    }

    fn profile_path(&self, tool: Tool) -> PathBuf {
        self.work.join(profile_name(tool))
    }

    pub fn trial(
        &mut self,
        workload: &SizedWorkload,
        sampling: EventSampling,
        round: u32,
    ) -> Result<Option<Trial>> {
        if !self.rate_allowed(&sampling) {
            return Ok(None);
        }
        let bare = measure::run(&workload.argv, None)?;
        if bare.workload.is_none() {
            bail!("`{}` printed no run_timed line", bare.command);
        }
        let command = Target::Command(&workload.argv);
        let ours = self.profiled(Tool::Ours, &sampling, command, &[])?;
        let perf = self.profiled(Tool::Perf, &sampling, command, &[])?;
        eprintln!(
            "xtask bench: round {}/{} {:<15} {:<20} wall {:.2}s; CPU x{:.2} ours, x{:.2} perf; \
             samples {} ours, {} perf",
            round + 1,
            self.settings.repetitions,
            workload.name,
            sampling.label(),
            bare.wall_s,
            ours.run.cpu_s / bare.cpu_s,
            perf.run.cpu_s / bare.cpu_s,
            ours.counts.recorded,
            perf.counts.recorded,
        );
        Ok(Some(Trial {
            workload: workload.name,
            sampling,
            round,
            bare,
            ours,
            perf,
        }))
    }

    /// Every workload at every rate (and page-faults at period 1 for the page-fault workload).
    pub fn samplings(&self, workload: &SizedWorkload) -> Vec<EventSampling> {
        let mut samplings: Vec<EventSampling> = self
            .settings
            .rates_hz
            .iter()
            .map(|&hz| cpu_clock(hz))
            .collect();
        if workload.faults {
            samplings.push(page_faults_each());
        }
        samplings
    }

    fn cost_samplings(&self, workload: &SizedWorkload) -> Vec<EventSampling> {
        let mut samplings = vec![cpu_clock(self.settings.cost_rate())];
        if workload.faults {
            samplings.push(page_faults_each());
        }
        samplings
    }

    /// The BPF program's run time per sample, from `record --stats` (the kernel's BPF
    /// run-time statistics, on only for these runs: they add clock reads to every run).
    pub fn in_kernel_costs(
        &mut self,
        workloads: &[SizedWorkload],
        budget_ns: f64,
    ) -> Result<Vec<InKernelCost>> {
        let mut costs: Vec<(InKernelCost, Vec<CaptureCost>)> = Vec::new();
        for round in 0..self.settings.repetitions {
            for workload in workloads {
                for sampling in self.cost_samplings(workload) {
                    if !self.rate_allowed(&sampling) {
                        continue;
                    }
                    let command = Target::Command(&workload.argv);
                    let run = self.profiled(Tool::Ours, &sampling, command, &["--stats"])?;
                    let cost = tools::ours_capture_cost(&run.run.stderr)?;
                    eprintln!(
                        "xtask bench: in-kernel round {}/{} {:<15} {:<20} {:.0} ns per sample",
                        round + 1,
                        self.settings.repetitions,
                        workload.name,
                        sampling.label(),
                        cost.ns_per_sample
                    );
                    let label = sampling.label();
                    match costs
                        .iter_mut()
                        .find(|(entry, _)| entry.workload == workload.name && entry.label == label)
                    {
                        Some((_, samples)) => samples.push(cost),
                        None => costs.push((
                            InKernelCost {
                                workload: workload.name,
                                label,
                                command: run.run.command,
                                ns_per_sample: None,
                                program_runs: 0,
                                budget_ns,
                            },
                            vec![cost],
                        )),
                    }
                }
            }
        }
        Ok(costs
            .into_iter()
            .map(|(entry, samples)| InKernelCost {
                ns_per_sample: Spread::of(samples.iter().map(|cost| cost.ns_per_sample)),
                program_runs: samples.iter().map(|cost| cost.program_runs).sum(),
                ..entry
            })
            .collect())
    }

    /// Each tool profiling the whole system for a few seconds while many_threads (`threads`)
    /// keeps the CPUs busy: its own peak RSS and CPU time.
    pub fn footprints(&mut self, threads: &SizedWorkload) -> Result<Vec<Footprint>> {
        let seconds = self.settings.system_duration_s;
        // Busy for longer than the system-wide runs last.
        let busy = threads.resized(
            &self.tools,
            &self.release,
            (threads.size as f64 * (seconds + 2.0) / self.settings.duration_s) as u64,
        );
        let sampling = cpu_clock(FOOTPRINT_RATE_HZ);
        let mut runs: Vec<(Tool, Vec<measure::Measured>, Vec<CaptureCost>)> =
            vec![(Tool::Ours, vec![], vec![]), (Tool::Perf, vec![], vec![])];
        for round in 0..self.settings.repetitions {
            for (tool, measured, costs) in &mut runs {
                let options: &[&str] = match tool {
                    Tool::Ours => &["--stats"],
                    Tool::Perf => &[],
                };
                let mut load = Command::new(&busy[0])
                    .args(&busy[1..])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .with_context(|| format!("starting {}", busy[0]))?;
                let run = self.profiled(*tool, &sampling, Target::System { seconds }, options);
                // The load is sized to outlast the run; stop it now (it is our own child).
                let _ = load.kill();
                let _ = load.wait();
                let run = run?.run;
                if *tool == Tool::Ours {
                    costs.push(tools::ours_capture_cost(&run.stderr)?);
                }
                eprintln!(
                    "xtask bench: footprint round {}/{} {}: peak RSS {:.1} MiB, CPU {:.2}s",
                    round + 1,
                    self.settings.repetitions,
                    tool.name(),
                    run.max_rss_kib as f64 / 1024.0,
                    run.cpu_s
                );
                measured.push(run);
            }
        }
        Ok(runs
            .into_iter()
            .map(|(tool, measured, costs)| Footprint {
                tool,
                command: measured
                    .first()
                    .map(|run| run.command.clone())
                    .unwrap_or_default(),
                peak_rss_mib: Spread::of(
                    measured.iter().map(|run| run.max_rss_kib as f64 / 1024.0),
                ),
                cpu_s: Spread::of(measured.iter().map(|run| run.cpu_s)),
                cpu_percent: Spread::of(measured.iter().map(|run| 100.0 * run.cpu_s / seconds)),
                map_mib: Spread::of(costs.iter().map(|cost| cost.map_mib)),
            })
            .collect())
    }

    /// Each tool system-wide at [`SYSTEM_LOSS_RATE_HZ`] (or the machine's highest rate) for
    /// the system-wide duration, once per round, while a CPU loop runs on every CPU and a
    /// stream of short processes beside them: what each fired, kept and lost, summed.
    pub fn system_loss(&mut self) -> Result<Vec<SystemLoss>> {
        let rate_hz = SYSTEM_LOSS_RATE_HZ.min(self.max_sample_rate);
        let sampling = cpu_clock(rate_hz);
        let seconds = self.settings.system_duration_s;
        let mut rows = Vec::new();
        for tool in [Tool::Ours, Tool::Perf] {
            let mut row = SystemLoss {
                tool,
                rate_hz,
                seconds,
                rounds: self.settings.repetitions,
                command: String::new(),
                counts: tools::SampleCounts::default(),
            };
            for _ in 0..self.settings.repetitions {
                let load = RunningLoad::start(&self.release, Load::SaturatedChurn)?;
                let run = self.profiled(tool, &sampling, Target::System { seconds }, &[]);
                drop(load);
                let run = run?;
                row.command = run.run.command;
                row.counts.add(&run.counts);
            }
            eprintln!(
                "xtask bench: system-wide at {rate_hz} Hz under churn, {}: {} kept, {} lost",
                tool.name(),
                row.counts.recorded,
                row.counts.lost
            );
            rows.push(row);
        }
        Ok(rows)
    }

    /// Records one large profile with each tool and times the function report from the file:
    /// many_threads at the highest rate it ran at, sized from the samples each tool kept in
    /// those trials.
    pub fn report_speeds(
        &mut self,
        threads: &SizedWorkload,
        trials: &[Trial],
    ) -> Result<Vec<ReportSpeed>> {
        let highest_rate = trials
            .iter()
            .filter(|trial| trial.workload == threads.name)
            .filter_map(|trial| trial.sampling.frequency())
            .max();
        let Some(hz) = highest_rate else {
            bail!(
                "no {} trial ran at any rate: nothing to size the large profile from",
                threads.name
            );
        };
        let samples_per_unit = trials
            .iter()
            .filter(|trial| {
                trial.workload == threads.name && trial.sampling.frequency() == Some(hz)
            })
            .flat_map(|trial| [trial.ours.counts.recorded, trial.perf.counts.recorded])
            .min()
            .unwrap_or(0)
            .max(1) as f64
            / threads.size as f64;
        // A fifth more: the sample count varies from run to run.
        let size = (self.settings.report_samples as f64 * 1.2 / samples_per_unit).ceil() as u64;
        let workload = threads.resized(&self.tools, &self.release, size);
        let sampling = cpu_clock(hz);
        let mut speeds = Vec::new();
        for tool in [Tool::Ours, Tool::Perf] {
            eprintln!(
                "xtask bench: recording about {} samples with {} for the report timing",
                self.settings.report_samples,
                tool.name()
            );
            let recorded = self.profiled(tool, &sampling, Target::Command(&workload), &[])?;
            let profile = self.profile_path(tool);
            let report_argv: Vec<String> = match tool {
                Tool::Ours => vec![
                    tools::path_arg(&self.tools.profiler),
                    "report".into(),
                    "-i".into(),
                    tools::path_arg(&profile),
                ],
                Tool::Perf => vec![
                    "perf".into(),
                    "report".into(),
                    "--stdio".into(),
                    "-i".into(),
                    tools::path_arg(&profile),
                ],
            };
            let report = measure::run(&report_argv, None)?;
            if recorded.counts.recorded < self.settings.report_samples {
                self.note(format!(
                    "the {} profile for the report timing has {} samples, fewer than the \
                     {} asked for",
                    tool.name(),
                    recorded.counts.recorded,
                    self.settings.report_samples
                ));
            }
            eprintln!(
                "xtask bench: {} report of {} samples took {:.2}s",
                tool.name(),
                recorded.counts.recorded,
                report.wall_s
            );
            speeds.push(ReportSpeed {
                tool,
                record_command: recorded.run.command,
                report_command: report.command,
                samples: recorded.counts.recorded,
                profile_bytes: recorded.profile_bytes,
                report_s: report.wall_s,
            });
        }
        Ok(speeds)
    }
}

fn profile_name(tool: Tool) -> &'static str {
    match tool {
        Tool::Ours => "ours.profile",
        Tool::Perf => "perf.data",
    }
}

/// The rate of the system-wide loss runs: issue 46's 20 kHz, where a map sized for less fills.
pub const SYSTEM_LOSS_RATE_HZ: u64 = 20_000;

/// One tool's system-wide runs on a busy host under churn ([`Bench::system_loss`]).
#[derive(Clone, Debug, Serialize)]
pub struct SystemLoss {
    pub tool: Tool,
    pub rate_hz: u64,
    pub seconds: f64,
    pub rounds: u32,
    pub command: String,
    /// Summed over the rounds.
    pub counts: tools::SampleCounts,
}

fn cpu_clock(hz: u64) -> EventSampling {
    EventSampling {
        event: Event::CpuClock,
        sampling: Sampling::FrequencyHz(hz),
    }
}

fn page_faults_each() -> EventSampling {
    EventSampling {
        event: Event::PageFaults,
        sampling: Sampling::Period(1),
    }
}

/// `perf report --stats` of a perf.data file: its record counts.
fn perf_stats(data: &Path) -> Result<String> {
    let output = Command::new("perf")
        .args(["report", "--stats", "-i"])
        .arg(data)
        .output()
        .context("running perf report --stats")?;
    if !output.status.success() {
        bail!(
            "perf report --stats -i {} failed: {}",
            data.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
