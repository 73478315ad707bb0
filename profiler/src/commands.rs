//! Each subcommand: resolve the arguments into options, run, print.

use std::{io::Write, process::ExitCode, time::Duration};

use anyhow::{Context, Result};
use profiler_common::unwind::UnwindRow;

use crate::{
    capture::{
        btf::Btf,
        counters::StackCapture,
        hardware::{prepare_sampled_event, records_data_addresses},
        maps::{default_sample_map_entries, default_stack_entries, MapSizes, DEFAULT_MAP_ENTRIES},
        offcpu::OffCpuOptions,
        offsets_cache::running_kernel_offsets,
        session::SIDEBAND_INTERVAL,
        stats::HOST_CPUS,
    },
    cli::{
        Command, RecordArgs, ReportArgs, ReportOutput, SamplingArgs, Unwind,
        DEFAULT_STACK_COPY_KIB, MAX_RING_BUFFER_KIB, MAX_STACK_COPY_KIB, STACK_COPY_RING_FACTOR,
    },
    events::{
        calibrate::{calibrate, CalibrationTarget, DEFAULT_PASS},
        override_sampling, parse_event_list, run_list, EventSpec, PmuRegistry, Sampling,
    },
    export::{
        flamegraph::write_flamegraph, folded::write_folded, offcpu::with_off_cpu_event,
        pprof::write_pprof, selected_profile,
    },
    import::{is_perf_data, profile_from_perf_data_file},
    launch::{signal_name, CommandEnd, StopSignals, TargetSpec},
    output::{Checker, Output, OutputWriter},
    profile::{
        file::{read_profile, SerializedProfile},
        Profile,
    },
    record::{record, Capture, RecordOptions},
    report::{
        hardware::{hardware_json, render_hardware},
        render_report,
        text::terminal_width,
        ViewArgs,
    },
    scope::{
        cgroup::{cgroup2_mount, cgroup_subtree_ids, resolve_cgroup_dir},
        container::find_container_cgroup,
        resolve_uid,
    },
    symbolize::{
        kernel_addresses::{hide_kernel_addresses, kernel_addresses_shown},
        ReadAhead,
    },
};

pub async fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Record(args) => run_record(*args).await,
        Command::Report(args) => run_report(*args),
        Command::Stat(args) => crate::stat::run_stat(*args).await,
        Command::Agent(args) => crate::agent::run_agent(*args).await,
        Command::List { json } => {
            print(&run_list(json)?)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// The events to sample: as given, or cycles (cpu-clock where there is no hardware PMU, said
/// once), with any global overflow override.
fn resolve_events(args: &SamplingArgs, pmus: &PmuRegistry) -> Result<Vec<EventSpec>> {
    let text = if args.events.is_empty() {
        if pmus.has_hardware_pmu() {
            "cycles".to_string()
        } else {
            eprintln!(
                "note: no hardware PMU on this machine (a virtual machine?): sampling cpu-clock \
                 instead of cycles"
            );
            "cpu-clock".to_string()
        }
    } else {
        args.events.join(",")
    };
    let mut specs = parse_event_list(&text, pmus)?;
    let global = match (args.period, args.frequency) {
        (Some(period), _) => Some(Sampling::Period(period)),
        (None, Some(hz)) => Some(Sampling::Frequency(hz)),
        (None, None) => None,
    };
    if let Some(sampling) = global {
        override_sampling(&mut specs, sampling)?;
    }
    // After the overrides: IBS periods must still be multiples of 16.
    for spec in &mut specs {
        for note in prepare_sampled_event(spec)? {
            eprintln!("note: {note}");
        }
    }
    Ok(specs)
}

/// `--target-rate`: overflow values from a counting pass on the same scope, printed (and kept
/// in the profile's events). A command not started yet cannot be counted: it samples at the
/// rate as a frequency.
fn calibrate_events(events: &mut [EventSpec], target: &TargetSpec, rate: u64) -> Result<()> {
    let scope = match target {
        TargetSpec::Command(_) => {
            eprintln!(
                "note: --target-rate with a launched command: sampling every event at {rate} Hz \
                 (there is nothing to count before it starts)"
            );
            override_sampling(events, Sampling::Frequency(rate))?;
            return Ok(());
        }
        TargetSpec::Processes(pids) => CalibrationTarget::Pids(pids.clone()),
        TargetSpec::System => CalibrationTarget::System,
    };
    for calibration in calibrate(events, &scope, rate, DEFAULT_PASS)? {
        eprintln!("calibration: {}", calibration.describe(rate));
    }
    Ok(())
}

/// Cgroup ids to keep: the subtree of `--cgroup` or of `--container`'s cgroup.
fn resolve_cgroups(args: &SamplingArgs) -> Result<Vec<u64>> {
    let directory = match (&args.cgroup, &args.container) {
        (None, None) => return Ok(Vec::new()),
        (Some(path), _) => resolve_cgroup_dir(path, &cgroup2_mount()?)?,
        (None, Some(id)) => find_container_cgroup(&cgroup2_mount()?, id)?,
    };
    cgroup_subtree_ids(&directory)
        .with_context(|| format!("reading the cgroup tree under {}", directory.display()))
}

/// The cgroup, container and user filters as given, for the report's title: `cgroup
/// system.slice, user alice`.
fn describe_scope(args: &SamplingArgs) -> Option<String> {
    let parts: Vec<String> = [
        args.cgroup
            .as_ref()
            .map(|path| format!("cgroup {}", path.display())),
        args.container.as_ref().map(|id| format!("container {id}")),
        args.uid.as_ref().map(|user| format!("user {user}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Processes whose executable mappings `--unwind dwarf` can hold at once; others are walked by
/// frame pointers, counted in `--stats`.
const UNWIND_PROCESSES: u32 = 1024;

/// KiB of user stack each sample copies, with `--unwind copy` or `check`.
fn stack_copy_kib(args: &SamplingArgs) -> Result<Option<u32>> {
    match (args.unwind, args.stack_copy_kib) {
        (Unwind::Copy, kib) => Ok(Some(kib.unwrap_or(DEFAULT_STACK_COPY_KIB))),
        // A check compares whole stacks: as deep a copy as there is.
        (Unwind::Check, kib) => Ok(Some(kib.unwrap_or(MAX_STACK_COPY_KIB))),
        (Unwind::Fp | Unwind::Dwarf, None) => Ok(None),
        (Unwind::Fp | Unwind::Dwarf, Some(_)) => Err(anyhow::anyhow!(
            "--stack-copy-kib sizes the stack copies of --unwind copy and check: add --unwind \
             copy, or leave --stack-copy-kib out"
        )),
    }
}

/// What to profile: a command, processes, or the whole system (optionally filtered to cgroups
/// or a user); `None` when nothing says which.
pub fn target_of(args: &SamplingArgs, command: &[String], all_cpus: bool) -> Option<TargetSpec> {
    if !command.is_empty() {
        Some(TargetSpec::Command(command.to_vec()))
    } else if !args.pids.is_empty() {
        Some(TargetSpec::Processes(args.pids.clone()))
    } else if all_cpus || args.cgroup.is_some() || args.container.is_some() || args.uid.is_some() {
        Some(TargetSpec::System)
    } else {
        None
    }
}

/// Resolves the sampling options into a capture's options (events, scope, map sizes), for
/// `record` and `agent` alike; the outputs and duration are the caller's.
pub fn capture_options(args: &SamplingArgs, target: TargetSpec) -> Result<RecordOptions> {
    let pmus = PmuRegistry::live()?;
    let mut events = resolve_events(args, &pmus)?;
    let cgroups = resolve_cgroups(args)?;
    let uid = args.uid.as_deref().map(resolve_uid).transpose()?;
    let offsets = match &args.btf {
        Some(path) => Btf::from_file(path).and_then(|btf| btf.kernel_offsets()),
        None => running_kernel_offsets(),
    };
    if let Some(rate) = args.target_rate {
        calibrate_events(&mut events, &target, rate)?;
    }
    let offsets = match offsets {
        Ok(offsets) => Some(offsets),
        Err(e) => {
            eprintln!("warning: {e}");
            None
        }
    };
    let possible_cpus = aya::util::nr_cpus()
        .map_err(|(what, e)| anyhow::anyhow!("counting possible CPUs ({what}): {e}"))?
        as u32;
    let drain_interval = Duration::from_millis(args.drain_interval);
    // Samples a second per CPU, all events together; unknown where one samples by period.
    let rate = events
        .iter()
        .try_fold(0, |sum, event| match event.sampling {
            Sampling::Frequency(hz) => Some(sum + hz),
            Sampling::Period(_) => None,
        });
    let default_entries = |online_cpus: u32, possible_cpus: u32| {
        let data = events.iter().any(records_data_addresses);
        default_sample_map_entries(rate, online_cpus, possible_cpus, drain_interval, data)
    };
    let online_cpus = aya::util::online_cpus().map_or(possible_cpus, |cpus| cpus.len() as u32);
    let sample_entries = args
        .map_entries
        .unwrap_or_else(|| default_entries(online_cpus, possible_cpus));
    let host_sample_entries = match args.map_entries {
        Some(_) => None,
        None => Some(default_entries(HOST_CPUS as u32, HOST_CPUS as u32)),
    };
    let stacks = args
        .stack_map_entries
        .unwrap_or_else(|| default_stack_entries(sample_entries));
    let host_stacks = match args.stack_map_entries {
        Some(_) => None,
        None => Some(default_stack_entries(
            host_sample_entries.unwrap_or(sample_entries),
        )),
    };
    let ring_bytes = args.ring_buffer_bytes();
    Ok(RecordOptions {
        events,
        pmus,
        target,
        duration: None,
        drain_interval,
        sideband_interval: SIDEBAND_INTERVAL,
        sizes: MapSizes {
            stacks,
            stack_counts: sample_entries,
            instructions: sample_entries,
            data_lines: sample_entries,
            latencies: args.latency_map_entries,
            off_cpu_blocks: args.map_entries.unwrap_or(DEFAULT_MAP_ENTRIES),
            off_cpu_histograms: args.latency_map_entries,
            ring_buffer_bytes: ring_bytes,
            ibs_ring_bytes: ring_bytes,
            // A stack copy takes up to 37 KiB where a raw sample takes 80 bytes.
            stack_copy_ring_bytes: ring_bytes
                .saturating_mul(STACK_COPY_RING_FACTOR)
                .min(MAX_RING_BUFFER_KIB * 1024),
            // One scratch record per CPU the program may run on.
            stack_copy_scratch: possible_cpus,
            host_sample_entries,
            host_stacks,
            unwind_rows: match args.unwind.walks_tables() {
                true => args.unwind_table_mib * (1024 * 1024 / UnwindRow::SIZE as u32),
                false => 1,
            },
            // 8 KiB each, preallocated.
            unwind_processes: match args.unwind.walks_tables() {
                true => UNWIND_PROCESSES,
                false => 1,
            },
        },
        stacks: StackCapture {
            user: true,
            kernel: !args.no_kernel_stacks,
        },
        stack_copy_kib: stack_copy_kib(args)?,
        unwind: args.unwind,
        raw: None,
        stats: false,
        cgroups,
        uid,
        scope: describe_scope(args),
        offsets,
        record_args: false,
        off_cpu: args.off_cpu.then(|| OffCpuOptions {
            min_block_ns: args.off_cpu_min.unwrap_or(0),
            wakers: args.wakers,
        }),
        per_instruction: true,
    })
}

async fn run_record(mut args: RecordArgs) -> Result<ExitCode> {
    // From the start: no stop signal kills the profiler and leaves its command running.
    let mut signals = StopSignals::catch()?;
    let outputs = RecordOutputs::check(&args)?;
    // The report goes to standard error, or to a file.
    args.report.view.width = terminal_width(&std::io::stderr());
    let Some(target) = target_of(&args.sampling, &args.command, args.all_cpus) else {
        anyhow::bail!(
            "nothing to profile: give a command after `--`, processes with -p PID, a cgroup, \
             container or user, or -a for all CPUs"
        );
    };
    let options = RecordOptions {
        duration: args.duration(),
        raw: outputs.raw.clone(),
        stats: args.stats,
        record_args: args.record_args,
        ..capture_options(&args.sampling, target)?
    };
    let (capture, symbols) = record(options, &mut signals).await?;
    // Assembling and reporting take seconds on a big run: off this thread, so that a signal
    // meanwhile still ends the profiler at once.
    let finish =
        tokio::task::spawn_blocking(move || finish_record(capture, symbols, &args, outputs));
    tokio::select! {
        finished = finish => finished.context("assembling the profile")?,
        signal = signals.recv() => {
            // Outputs already put in place are complete; the one being written is removed.
            crate::output::remove_temporaries();
            eprintln!(
                "profiler: {} while the report was computed: stopped; outputs already written \
                 are kept, the others were not written",
                signal_name(signal.number)
            );
            std::process::exit(128 + signal.number);
        }
    }
}

/// Where `record` writes: checked before the recording starts, so that a bad path costs
/// nothing.
struct RecordOutputs {
    profile: Option<Output>,
    raw: Option<Output>,
    report: ReportTargets,
}

impl RecordOutputs {
    fn check(args: &RecordArgs) -> Result<RecordOutputs> {
        let mut checker = Checker::default();
        let profile = checker.check_optional("-o", args.output.as_deref())?;
        let raw = checker.check_optional("--raw", args.raw.as_deref())?;
        let destination = match (&args.json, &args.report_file) {
            (Some(path), _) => Some(checker.check("--json", path)?),
            (None, Some(path)) => Some(checker.check("--report", path)?),
            (None, None) => None,
        };
        let report = ReportTargets::check(&mut checker, &args.report, destination)?;
        Ok(RecordOutputs {
            profile,
            raw,
            report,
        })
    }
}

/// After the recording: assemble the profile, write it, print the report, say how it ended.
/// Outputs that fail do not stop the others; they are named at the end and make the exit status
/// non-zero (the command's own status, when it failed, comes first).
fn finish_record(
    capture: Capture,
    symbols: ReadAhead,
    args: &RecordArgs,
    outputs: RecordOutputs,
) -> Result<ExitCode> {
    // The code of every sampled function is kept for the profile file and for the one view
    // that disassembles it (`--function`), not read for nothing.
    let with_code = outputs.profile.is_some() || args.report.view.function.is_some();
    let mut recording =
        symbols.finish(move |symbols, known| capture.assemble(with_code, symbols, known))?;
    let mut failures = std::mem::take(&mut recording.failures);
    // The profile file is compressed and written while the report is computed: on a machine
    // whose CPUs are busy, a second thread is a second share of them at the run's end.
    let serialized = outputs.profile.as_ref().map(|output| {
        SerializedProfile::of(&recording.profile).map_err(|e| e.in_file(output.path()).into())
    });
    std::thread::scope(|scope| {
        let written = outputs
            .profile
            .as_ref()
            .zip(serialized)
            .map(|(output, serialized)| {
                scope.spawn(move || serialized.and_then(|serialized| serialized.write(output)))
            });
        if args.stats {
            eprint!("{}", recording.stats_text());
        }
        if let Some(check) = &recording.stats.unwind_check {
            eprint!("{check}");
        }
        let mut view = args.report.view.clone();
        view.json = args.json.is_some();
        let ending = &recording.ending;
        let reported = report(
            &mut recording.profile,
            &args.report,
            &view,
            &outputs.report,
            &mut failures,
            false,
            |text, json| match json {
                Some(json) => json["recording"] = ending.json(),
                None => {
                    text.push_str(&format!("\nRecording ended: {}.\n", ending.describe()));
                }
            },
        );
        failures.extend(reported.err());
        if let (Some(output), Some(written)) = (&outputs.profile, written) {
            match written.join() {
                Ok(Ok(())) => eprintln!("profile written to {}", output.path().display()),
                Ok(Err(error)) => failures.push(error),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    for failure in &failures {
        eprintln!("error: {failure:#}");
    }
    let command = recording.ending.command;
    // The process ends here: freeing the profile's millions of small allocations one by one
    // only delayed that (a tenth of a second after a 30 s system-wide recording).
    std::mem::forget(recording.profile);
    Ok(if failures.is_empty() {
        CommandEnd::exit_code(command)
    } else {
        CommandEnd::exit_code_after_failed_outputs(command)
    })
}

fn run_report(mut args: ReportArgs) -> Result<ExitCode> {
    args.report.view.width = terminal_width(&std::io::stdout());
    let mut checker = Checker::default();
    let targets = ReportTargets::check(&mut checker, &args.report, None)?;
    // The report goes to standard output, unless an export streams there.
    let targets = ReportTargets {
        report: (!checker.stdout_taken()).then(|| Output::stdout("report")),
        ..targets
    };
    let mut profile = if is_perf_data(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?
    {
        profile_from_perf_data_file(&args.input)?
    } else {
        read_profile(&args.input)?
    };
    // A profile recorded by someone the kernel shows its addresses to, read by someone it
    // does not.
    if !kernel_addresses_shown() {
        hide_kernel_addresses(&mut profile);
    }
    let mut view = args.report.view.clone();
    view.json = args.json;
    let mut failures = Vec::new();
    let reported = report(
        &mut profile,
        &args.report,
        &view,
        &targets,
        &mut failures,
        true,
        |_, _| {},
    );
    failures.extend(reported.err());
    for failure in &failures {
        eprintln!("error: {failure:#}");
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Where a report and its exports go.
struct ReportTargets {
    /// The report itself; `None`: standard error.
    report: Option<Output>,
    folded: Option<Output>,
    flamegraph: Option<Output>,
    pprof: Option<Output>,
    latency_plot: Option<Output>,
}

impl ReportTargets {
    fn check(
        checker: &mut Checker,
        output: &ReportOutput,
        report: Option<Output>,
    ) -> Result<ReportTargets> {
        Ok(ReportTargets {
            report,
            folded: checker.check_optional("--folded", output.folded.as_deref())?,
            flamegraph: checker.check_optional("--flamegraph", output.flamegraph.as_deref())?,
            pprof: checker.check_optional("--pprof", output.pprof.as_deref())?,
            latency_plot: checker.check_optional(
                "--histogram",
                output
                    .view
                    .histogram
                    .as_ref()
                    .and_then(|plot| plot.as_deref()),
            )?,
        })
    }
}

/// Applies `--backtrack`, writes the requested exports of what the report's filters select and
/// names them, then writes the report (with the hardware view when asked, and what `annotate`
/// adds to its text or JSON). With `exports_replace_text`, an export asked without JSON or a
/// hardware view is the output: the text report is not written too. An export that fails is
/// added to `failures` and the rest is still written; the error is the report's own.
fn report(
    profile: &mut Profile,
    output: &ReportOutput,
    view: &ViewArgs,
    targets: &ReportTargets,
    failures: &mut Vec<anyhow::Error>,
    exports_replace_text: bool,
    annotate: impl FnOnce(&mut String, Option<&mut serde_json::Value>),
) -> Result<()> {
    if let Some(summary) = output.hardware.prepare(profile) {
        eprintln!(
            "backtracking: {} samples moved to the memory access before the sampled \
             instruction, {} kept where they were sampled",
            summary.moved, summary.kept
        );
    }
    let profile = &*profile;
    let exports = [&targets.folded, &targets.flamegraph, &targets.pprof];
    if exports.iter().any(|target| target.is_some()) {
        let with_off_cpu = with_off_cpu_event(profile);
        let selected = selected_profile(&with_off_cpu, view.event.as_deref(), &view.filter())?;
        let first = selected.events.first().map_or("", |e| e.name.as_str());
        let mut export =
            |target: &Option<Output>,
             what: &str,
             write: &dyn Fn(&mut OutputWriter) -> Result<()>| {
                if let Some(target) = target {
                    match target.write(|out| write(out)) {
                        Ok(()) => eprintln!("{what} written to {}", target.path().display()),
                        Err(error) => failures.push(error),
                    }
                }
            };
        export(
            &targets.folded,
            &format!("folded stacks of {first}"),
            &|out| Ok(write_folded(&selected, 0, out)?),
        );
        export(
            &targets.flamegraph,
            &format!("flame graph of {first}"),
            &|out| Ok(write_flamegraph(&selected, 0, out)?),
        );
        let names: Vec<&str> = selected.events.iter().map(|e| e.name.as_str()).collect();
        export(
            &targets.pprof,
            &format!("pprof profile of {}", names.join(", ")),
            &|out| Ok(write_pprof(&selected, out)?),
        );
        if exports_replace_text && !view.json && output.hardware.hardware.is_none() {
            return Ok(());
        }
    }
    let rendered = render_report(profile, view)?;
    if let (Some(target), Some(svg)) = (&targets.latency_plot, &rendered.latency_plot) {
        failures.extend(target.write(|out| Ok(out.write_all(svg.as_bytes())?)).err());
    }
    let mut text = rendered.text;
    if view.json {
        let mut json: serde_json::Value = serde_json::from_str(&text)?;
        if let Some(hardware) = output.hardware.hardware {
            json["hardware"] = hardware_json(profile, hardware);
        }
        annotate(&mut text, Some(&mut json));
        text = serde_json::to_string_pretty(&json)?;
        text.push('\n');
    } else {
        if let Some(hardware) = output.hardware.hardware {
            text.push_str(&render_hardware(profile, hardware));
        }
        annotate(&mut text, None);
    }
    match &targets.report {
        Some(target) => target.write(|out| Ok(out.write_all(text.as_bytes())?)),
        None => {
            eprint!("{text}");
            Ok(())
        }
    }
}
