//! `cargo xtask bench`: the profiler against `perf record -g` on the bundled workloads, side by
//! side in one run. Overhead (wall and CPU time as ratios to the bare run), sample loss, bytes
//! per million samples, report speed on a large profile, the BPF program's cost per sample and
//! the agent's footprint, written as JSON, a Markdown table and SVG plots.
//!
//! Every measurement runs bare, ours, perf back to back, round after round, so the machine's
//! noise of the moment hits all three alike; figures are medians with their range.

mod agent_cost;
mod bpf_stats;
mod fleet;
mod live;
mod machine;
mod measure;
mod off_cpu_cost;
mod phases;
mod plot;
mod python_cost;
pub use python_cost::FULL_LOOPS as PYTHON_FULL_LOOPS;
mod render;
mod stack_quality;
mod summary;
mod tools;
mod unwind_cost;
mod workloads;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use machine::{CpuTimes, Machine, SysctlOverride, MAX_SAMPLE_RATE};
use phases::{Bench, Footprint, InKernelCost, RateLowering, ReportSpeed};
use summary::{RowSummary, Trial};
use tools::Tools;
use workloads::{SizedWorkload, WORKLOADS};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Seconds each workload runs alone (its size is calibrated to this on this machine).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub duration: f64,
    /// Rounds of every measurement (bare, ours and perf back to back in each round).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub repetitions: u32,
    /// CI smoke run: one round of short runs and a small "large" profile. Checks that every
    /// run succeeded and produced numbers, nothing about speed. Overrides --duration,
    /// --repetitions, --report-samples and --system-duration.
    #[arg(long)]
    pub quick: bool,
    /// cpu-clock sampling rates to compare, in Hz per CPU.
    #[arg(long, value_name = "HZ", value_delimiter = ',', default_values_t = [1000, 10000, 50000])]
    pub rates: Vec<u64>,
    /// Raise kernel.perf_event_max_sample_rate for the bench when a rate is above it (put back
    /// afterwards). Without this, such rates are skipped with a note.
    #[arg(long)]
    pub raise_max_sample_rate: bool,
    /// Samples in the profile whose report is timed.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub report_samples: u64,
    /// Seconds of each system-wide run that measures the agent's footprint.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub system_duration: f64,
    /// Where the results go [default: bench/results, or bench-quick in the target directory
    /// with --quick].
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
}

/// The settings the bench ran with, after --quick.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    pub duration_s: f64,
    pub repetitions: u32,
    pub quick: bool,
    pub rates_hz: Vec<u64>,
    pub report_samples: u64,
    pub system_duration_s: f64,
    pub raise_max_sample_rate: bool,
}

impl Settings {
    fn from_args(args: &BenchArgs) -> Result<Settings> {
        if args.rates.is_empty() || args.rates.contains(&0) {
            bail!("--rates needs at least one rate above 0 Hz, e.g. --rates 1000,10000");
        }
        if args.duration <= 0.0 || args.system_duration <= 0.0 || args.repetitions == 0 {
            bail!("--duration, --system-duration and --repetitions must be above 0");
        }
        let mut rates_hz = args.rates.clone();
        rates_hz.sort_unstable();
        rates_hz.dedup();
        let quick = args.quick;
        Ok(Settings {
            duration_s: if quick { 0.2 } else { args.duration },
            repetitions: if quick { 1 } else { args.repetitions },
            quick,
            rates_hz,
            report_samples: if quick { 50_000 } else { args.report_samples },
            system_duration_s: if quick { 1.0 } else { args.system_duration },
            raise_max_sample_rate: args.raise_max_sample_rate,
        })
    }

    /// The rate of the in-kernel cost runs: the second lowest (10 kHz by default), where
    /// samples are frequent but the kernel does not throttle.
    fn cost_rate(&self) -> u64 {
        self.rates_hz[1.min(self.rates_hz.len() - 1)]
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Results {
    pub schema: &'static str,
    pub machine: Machine,
    pub settings: Settings,
    /// The directory holding the built binaries, as it appears in the commands.
    pub release_dir: String,
    /// The directory holding the profile files while the bench runs.
    pub work_dir: String,
    pub notes: Vec<String>,
    /// Runs after which the kernel lowered perf_event_max_sample_rate (put back each time).
    pub rate_lowerings: Vec<RateLowering>,
    pub workloads: Vec<SizedWorkload>,
    pub rows: Vec<RowSummary>,
    pub in_kernel: Vec<InKernelCost>,
    pub footprint: Vec<Footprint>,
    /// Each tool system-wide at 20 kHz on a busy host under churn.
    pub system_loss: Vec<phases::SystemLoss>,
    pub report_speed: Vec<ReportSpeed>,
    pub stack_quality: Vec<stack_quality::StackQualityRow>,
    pub agent_cost: Vec<agent_cost::AgentCostRow>,
    /// Each sampler's cost per sample in the kernel with the CPU loop alone and with churn.
    pub churn_cost: Vec<agent_cost::ChurnCostRow>,
    /// The agent at its defaults with a JVM, node, python3 and xz running.
    pub runtimes_memory: agent_cost::RuntimesMemory,
    /// The agent beside the OpenTelemetry eBPF profiler, each into a real Collector.
    pub fleet: Vec<fleet::FleetRow>,
    /// `profiler top` beside `perf top`, system-wide at 1 kHz.
    pub live: Vec<live::LiveRow>,
    /// In-kernel cost of unwinding by tables, per sample at 10 and 30 user frames.
    pub unwind_cost: unwind_cost::UnwindCost,
    /// A context-switch storm bare, under `record --off-cpu` and under bpftrace.
    pub off_cpu_cost: Vec<off_cpu_cost::OffCpuCostRow>,
    /// Pure-Python work bare, under `record` and under py-spy at the same rate.
    pub python_cost: Vec<python_cost::PythonCostRow>,
    /// Share of the machine's CPU time that other processes used while the bench ran.
    pub other_processes_cpu_percent: f64,
    pub perf_event_max_sample_rate_at_end: u64,
    /// Every run, with its exact command.
    pub trials: Vec<Trial>,
}

pub const SCHEMA: &str = "profiler.bench/1";

/// Above this share of CPU time taken by other processes, the results carry a noise note.
const NOISY_PERCENT: f64 = 5.0;

/// Installs what the bench needs, builds the profiler and the workloads.
fn prepare() -> Result<Tools> {
    if !crate::setup::is_root() {
        bail!(
            "the bench loads BPF programs and opens perf events for other processes: run it as \
             root (sudo -E cargo xtask bench)"
        );
    }
    crate::setup::all(crate::setup::Purpose::Build)?;
    crate::setup::apt_install(&["linux-perf"])?;
    let py_spy = crate::setup::py_spy()?;
    crate::build_release()?;
    let release = crate::target_dir().join("release");
    Ok(Tools {
        profiler: release.join("profiler"),
        run_timed: release.join("run_timed"),
        py_spy,
    })
}

/// Fails when a figure the tables need is missing: a run that produced no samples, a section
/// that measured nothing.
fn check(results: &Results) -> Result<()> {
    let mut problems = Vec::new();
    for workload in &results.workloads {
        if !results.rows.iter().any(|row| row.workload == workload.name) {
            problems.push(format!("{}: no trial ran", workload.name));
        }
    }
    for row in &results.rows {
        for (tool, summary) in [("ours", &row.ours), ("perf", &row.perf)] {
            // perf keeping nothing is its result (shown as 0 in the tables); ours must keep.
            if summary.counts.recorded == 0 && tool == "ours" {
                problems.push(format!(
                    "{} {}: {tool} kept no samples",
                    row.workload, row.label
                ));
            }
            if tool == "ours" && (summary.counts.lost > 0 || summary.unaccounted != Some(0)) {
                // The README's claim: every fired sample is kept, at every workload and rate.
                problems.push(format!(
                    "{} {}: ours lost {} samples and {:?} went unaccounted",
                    row.workload, row.label, summary.counts.lost, summary.unaccounted
                ));
            }
            let bytes_measured =
                summary.bytes_per_million_samples.is_some() || summary.counts.recorded == 0;
            if summary.total_cpu_ratio.is_none() || !bytes_measured {
                problems.push(format!(
                    "{} {}: {tool} has no ratios",
                    row.workload, row.label
                ));
            }
        }
    }
    if results
        .in_kernel
        .iter()
        .all(|cost| cost.ns_per_sample.is_none())
    {
        problems.push("no in-kernel cost was measured".into());
    }
    for row in &results.system_loss {
        if row.counts.recorded == 0 {
            problems.push(format!(
                "system-wide at {} Hz: {} kept no samples",
                row.rate_hz,
                row.tool.name()
            ));
        }
    }
    for row in results
        .fleet
        .iter()
        .filter(|row| row.tool == "profiler agent")
    {
        if row
            .samples_per_s
            .is_none_or(|samples| samples.median <= 0.0)
        {
            problems.push(format!(
                "beside the OpenTelemetry eBPF profiler at {} Hz: the Collector received no \
                 sample from the agent",
                row.rate_hz
            ));
        }
    }
    if !results
        .live
        .iter()
        .any(|row| row.tool == "profiler top" && row.cpu_percent_of_core.is_some())
    {
        problems.push("profiler top's CPU beside perf top's was not measured".into());
    }
    if results.fleet.is_empty() {
        problems.push("the comparison with the OpenTelemetry eBPF profiler did not run".into());
    }
    if results.runtimes_memory.max_rss_mib <= 0.0 {
        problems.push("the agent's memory with the runtimes was not measured".into());
    }
    if results.unwind_cost.ns_per_frame.is_none() {
        problems.push("the in-kernel cost of unwinding was not measured".into());
    }
    for row in results.python_cost.iter().filter(|row| row.tool != "bare") {
        if row.samples.is_none_or(|samples| samples.median <= 0.0) {
            problems.push(format!("Python cost: {} kept no sample", row.tool));
        }
    }
    if !results
        .python_cost
        .iter()
        .any(|row| row.python_ns_per_sample.is_some())
    {
        problems.push("Python cost: our walker's cost per Python stack was not read".into());
    }
    if results
        .footprint
        .iter()
        .any(|entry| entry.peak_rss_mib.is_none())
    {
        problems.push("a footprint run measured nothing".into());
    }
    for row in &results.stack_quality {
        if row.samples == 0 {
            problems.push(format!(
                "stack quality of {} under {}: no sample",
                row.program, row.unwinder
            ));
        }
    }
    for row in &results.churn_cost {
        if row.loop_ns_per_sample.is_none() || row.churn_ns_per_sample.is_none() {
            problems.push(format!(
                "the kernel's cost per sample of {} with and without churn was not measured",
                row.tool
            ));
        }
    }
    if results.report_speed.len() != 2 {
        problems.push("the report speed was not measured for both tools".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        bail!(
            "the bench produced incomplete results:\n  {}",
            problems.join("\n  ")
        )
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    let settings = Settings::from_args(&args)?;
    let tools = prepare()?;
    let workspace = crate::workspace_root();
    let output = args.output.clone().unwrap_or_else(|| {
        if settings.quick {
            crate::target_dir().join("bench-quick")
        } else {
            workspace.join("bench/results")
        }
    });
    let release = crate::target_dir().join("release");
    let work = crate::target_dir().join("bench-work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let machine = Machine::read(&workspace)?;
    eprintln!(
        "xtask bench: {} CPUs, kernel {}, perf_event_max_sample_rate {}",
        machine.cpus, machine.kernel, machine.perf_event_max_sample_rate
    );
    let cpu_at_start = CpuTimes::now()?;
    // The kernel lowers the maximum rate itself when samples take too long: the bench puts it
    // back between runs, and to the machine's own value at the end.
    let highest = *settings.rates_hz.last().expect("at least one rate");
    let original = machine.perf_event_max_sample_rate;
    let (_max_rate, max_sample_rate) = if settings.raise_max_sample_rate && highest > original {
        (SysctlOverride::set(MAX_SAMPLE_RATE, highest)?, highest)
    } else {
        (SysctlOverride::remember(MAX_SAMPLE_RATE)?, original)
    };
    let workloads: Vec<SizedWorkload> = WORKLOADS
        .iter()
        .map(|workload| workload.calibrate(&tools, &release, settings.duration_s))
        .collect::<Result<_>>()?;
    let bench_tools = tools.clone();
    let bench_profiler = &bench_tools.profiler;
    let mut bench = Bench::new(
        tools,
        release.clone(),
        work.clone(),
        settings.clone(),
        max_sample_rate,
    );
    if !machine.hardware_pmu {
        bench.note(
            "no hardware PMU (a virtual machine): software events only, cpu-clock stands in \
             for cycles"
                .into(),
        );
    }

    let mut trials = Vec::new();
    for round in 0..settings.repetitions {
        for workload in &workloads {
            for sampling in bench.samplings(workload) {
                trials.extend(bench.trial(workload, sampling, round)?);
            }
        }
    }
    let in_kernel = bench.in_kernel_costs(&workloads, machine.sample_budget_ns())?;
    let threads = workloads
        .iter()
        .find(|workload| workload.name == "many_threads")
        .expect("many_threads is a bundled workload");
    let footprint = bench.footprints(threads)?;
    let system_loss = bench.system_loss()?;
    let report_speed = bench.report_speeds(threads, &trials)?;
    let stack_quality = stack_quality::measure(&bench_tools, &work)?;
    // The 30 s runs; the quick bench (CI) keeps the shortest with a steady window.
    let agent_seconds = if settings.quick {
        agent_cost::SHORTEST_RUN_S
    } else {
        30
    };
    let agent_cost = agent_cost::measure(bench_profiler, &release, &work, agent_seconds)?;
    let (runtimes_memory, left_out) =
        agent_cost::measure_runtimes_memory(bench_profiler, &work, agent_seconds)?;
    for note in left_out {
        bench.note(note);
    }
    let fleet_rounds = if settings.quick { 1 } else { 3 };
    let fleet = fleet::measure(bench_profiler, &release, &work, agent_seconds, fleet_rounds)?;
    let (live_seconds, live_rounds) = if settings.quick { (6, 1) } else { (20, 3) };
    let live = live::measure(bench_profiler, &release, live_seconds, live_rounds)?;
    let (churn_seconds, churn_rounds) = if settings.quick { (10, 1) } else { (20, 3) };
    let churn_cost = agent_cost::measure_churn_cost(
        bench_profiler,
        &release,
        &work,
        churn_seconds,
        churn_rounds,
    )?;
    let unwind_cost = unwind_cost::measure(bench_profiler, &work, settings.repetitions)?;
    let off_cpu_cost =
        off_cpu_cost::measure(bench_profiler, &release, &work, settings.repetitions.max(3))?;
    let python_work = if settings.quick {
        (1, 100)
    } else {
        (settings.repetitions.max(3), python_cost::FULL_LOOPS)
    };
    let python_cost =
        python_cost::measure(bench_profiler, &bench_tools.py_spy, &work, python_work)?;
    let other_processes_cpu_percent = CpuTimes::now()?.others_percent_since(&cpu_at_start);
    if other_processes_cpu_percent > NOISY_PERCENT {
        bench.note(format!(
            "other processes used {other_processes_cpu_percent:.0}% of the machine's CPU time \
             during the bench: absolute times are noisy, the interleaved ratios less so"
        ));
    }
    let (notes, rate_lowerings) = bench.finish();

    let results = Results {
        schema: SCHEMA,
        rows: summary::summarize(&trials),
        release_dir: tools::path_arg(&release),
        work_dir: tools::path_arg(&work),
        notes,
        rate_lowerings,
        workloads,
        in_kernel,
        footprint,
        system_loss,
        report_speed,
        stack_quality,
        agent_cost,
        churn_cost,
        runtimes_memory,
        fleet,
        live,
        unwind_cost,
        off_cpu_cost,
        python_cost,
        other_processes_cpu_percent,
        perf_event_max_sample_rate_at_end: machine::read_number(MAX_SAMPLE_RATE)?,
        trials,
        machine,
        settings,
    };
    write_results(&results, &output)?;
    // The profiles are large (the report-speed ones hold a million samples): keep only results.
    std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    check(&results)
}

/// `cargo xtask bench-fleet`: the agent beside the OpenTelemetry eBPF profiler alone (the
/// full bench runs it too), into `output`'s fleet.json and fleet.md.
pub fn run_fleet(rounds: usize, seconds: u64, output: &Path) -> Result<()> {
    if seconds < agent_cost::SHORTEST_RUN_S {
        bail!(
            "--seconds {seconds}: a run needs at least {} s to have a steady window past the \
             first",
            agent_cost::SHORTEST_RUN_S
        );
    }
    let tools = prepare()?;
    let release = crate::target_dir().join("release");
    let work = crate::target_dir().join("bench-work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let machine = Machine::read(&crate::workspace_root())?;
    let rows = fleet::measure(&tools.profiler, &release, &work, seconds, rounds)?;
    write_section(
        output,
        "fleet",
        "The agent beside the OpenTelemetry eBPF profiler",
        &format!("bench-fleet --rounds {rounds} --seconds {seconds}"),
        &machine,
        &rows,
        &render::fleet_markdown(&rows, &tools::path_arg(&release), &tools::path_arg(&work)),
    )?;
    std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))
}

fn write_results(results: &Results, output: &Path) -> Result<()> {
    std::fs::create_dir_all(output).with_context(|| format!("creating {}", output.display()))?;
    let write = |name: &str, text: &str| -> Result<()> {
        let path = output.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    write(
        "bench.json",
        &serde_json::to_string_pretty(results).context("serializing the results")?,
    )?;
    let markdown = render::markdown(results);
    write("bench.md", &markdown)?;
    write("overhead.svg", &plot::overhead(&results.rows))?;
    write("loss.svg", &plot::loss(&results.rows))?;
    println!("{markdown}");
    eprintln!(
        "xtask bench: results in {} (bench.json, bench.md, overhead.svg, loss.svg)",
        output.display()
    );
    Ok(())
}

/// `cargo xtask bench-python`: the Python cost section alone (the full bench runs it too), into
/// `output`'s python.json and python.md.
pub fn run_python(rounds: u32, loops: u32, output: &Path) -> Result<()> {
    let tools = prepare()?;
    let release = crate::target_dir().join("release");
    let work = crate::target_dir().join("bench-work");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let machine = Machine::read(&crate::workspace_root())?;
    let rows = python_cost::measure(&tools.profiler, &tools.py_spy, &work, (rounds, loops))?;
    write_section(
        output,
        "python",
        "Naming Python frames beside py-spy",
        &format!("bench-python --rounds {rounds} --loops {loops}"),
        &machine,
        &rows,
        &render::python_markdown(&rows, &tools::path_arg(&release), &tools::path_arg(&work)),
    )
}

/// `cargo xtask bench-live`: `profiler top` beside `perf top` alone (the full bench runs it too),
/// into `output`'s live.json and live.md.
pub fn run_live(rounds: usize, seconds: u64, output: &Path) -> Result<()> {
    let tools = prepare()?;
    let release = crate::target_dir().join("release");
    let machine = Machine::read(&crate::workspace_root())?;
    let rows = live::measure(&tools.profiler, &release, seconds, rounds)?;
    write_section(
        output,
        "live",
        "profiler top beside perf top",
        &format!("bench-live --rounds {rounds} --seconds {seconds}"),
        &machine,
        &rows,
        &render::live_markdown(
            &rows,
            &tools::path_arg(&release),
            &tools::path_arg(&crate::target_dir().join("bench-work")),
        ),
    )
}

/// Writes one section run alone: `NAME.json` (its rows) and `NAME.md` (headed by the machine and
/// the command), and prints the markdown.
fn write_section(
    output: &Path,
    name: &str,
    title: &str,
    command: &str,
    machine: &Machine,
    rows: &impl Serialize,
    table: &str,
) -> Result<()> {
    std::fs::create_dir_all(output).with_context(|| format!("creating {}", output.display()))?;
    let markdown = format!(
        "# {title}\n\n`cargo xtask {command}` at {} on {}: {} CPUs ({}), {} MiB, kernel {}.\n{table}",
        machine.profiler_revision,
        machine.date_utc,
        machine.cpus,
        machine.cpu_model,
        machine.memory_mib,
        machine.kernel,
    );
    std::fs::write(
        output.join(format!("{name}.json")),
        serde_json::to_string_pretty(rows)?,
    )?;
    std::fs::write(output.join(format!("{name}.md")), &markdown)?;
    println!("{markdown}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn settings(args: &[&str]) -> Result<Settings> {
        let command =
            Command::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))?;
        Settings::from_args(&command.bench)
    }

    #[test]
    fn quick_is_one_short_round_with_a_small_large_profile() {
        let full = settings(&[]).unwrap();
        assert_eq!((full.repetitions, full.duration_s), (3, 1.0));
        assert_eq!(full.rates_hz, [1000, 10_000, 50_000]);
        assert_eq!(full.cost_rate(), 10_000);
        let quick = settings(&["--quick", "--repetitions", "9"]).unwrap();
        assert_eq!((quick.repetitions, quick.duration_s), (1, 0.2));
        assert_eq!(quick.report_samples, 50_000);
    }

    #[test]
    fn rates_are_sorted_and_must_be_positive() {
        let sorted = settings(&["--rates", "5000,100,5000"]).unwrap();
        assert_eq!(sorted.rates_hz, [100, 5000]);
        assert_eq!(sorted.cost_rate(), 5000);
        assert_eq!(settings(&["--rates", "777"]).unwrap().cost_rate(), 777);
        let error = settings(&["--rates", "0,1000"]).unwrap_err().to_string();
        assert!(error.contains("--rates"), "{error}");
    }
}
