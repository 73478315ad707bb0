//! Each subcommand: resolve the arguments into options, run, print.

use std::{
    io::{IsTerminal, Write},
    path::Path,
    process::ExitCode,
};

use anyhow::{Context, Result};

use crate::{
    agent::run_agent,
    cli::{
        agent::AgentArgs,
        options::{capture_options, target_of, target_title},
        top::TopArgs,
        Command, RecordArgs, ReportArgs, ReportOutput, DEFAULT_PROFILE,
    },
    events::run_list,
    export::{
        firefox::write_firefox,
        flamegraph::write_flamegraph,
        folded::write_folded,
        html::{write_html, HtmlInput},
        offcpu::with_off_cpu_event,
        pprof::write_pprof,
        selected_profile,
        speedscope::write_speedscope,
    },
    import::{input_kind, pprof::profile_from_pprof_file, profile_from_perf_data_file, InputKind},
    launch::{signal_name, CommandEnd, StopSignals, TargetSpec},
    output::{Checker, Output, OutputWriter},
    profile::{
        file::{read_profile, SerializedProfile},
        Profile,
    },
    record::{record, Live, Recording},
    report::{
        hardware::{hardware_json, render_hardware},
        render_report,
        text::{finish_text, terminal_width},
        ViewArgs,
    },
    session::{Capture, CaptureOptions, SessionEnd},
    shell_docs::completion,
    stat::run_stat,
    symbolize::{
        debuginfod::{self, Waiting},
        kernel_addresses::{hide_kernel_addresses, kernel_addresses_shown},
        ReadAhead,
    },
    top::{check_terminal, run_top},
};

pub async fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Record(args) => run_record(*args).await,
        Command::Report(args) => run_report(*args),
        Command::Stat(args) => run_stat(args.options()?).await,
        Command::Agent(args) => agent(*args).await,
        Command::Top(args) => top(*args).await,
        Command::List { json } => {
            print(&run_list(json)?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            completion(shell, &mut script);
            print(&String::from_utf8_lossy(&script))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `profiler agent`: signals are caught before the arguments are resolved, as for `record`
/// (resolving may run a calibration pass).
async fn agent(args: AgentArgs) -> Result<ExitCode> {
    let mut signals = StopSignals::catch()?;
    let debuginfod = args.sampling.debuginfod.config()?;
    let options = args.resolve()?;
    debuginfod::configure(debuginfod, Waiting::Background);
    run_agent(options, &mut signals).await
}

/// `profiler top`: as the agent, signals are caught before the arguments are resolved.
async fn top(args: TopArgs) -> Result<ExitCode> {
    let mut signals = StopSignals::catch()?;
    debuginfod::configure(args.sampling.debuginfod.config()?, Waiting::Background);
    let options = args.resolve()?;
    run_top(options, &mut signals).await
}

fn print(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

async fn run_record(mut args: RecordArgs) -> Result<ExitCode> {
    // From the start: no stop signal kills the profiler and leaves its command running.
    let mut signals = StopSignals::catch()?;
    let Some(target) = target_of(&args.sampling, &args.command, args.all_cpus) else {
        anyhow::bail!(
            "nothing to profile: give a command after `--`, processes with -p PID, a cgroup, \
             container or user, or -a for all CPUs"
        );
    };
    let outputs = RecordOutputs::check(&args)?;
    debuginfod::configure(args.sampling.debuginfod.config()?, Waiting::Wait);
    args.report.view.width = outputs.report.report_width();
    let title = target_title(&args.sampling, &target, args.record_args);
    let live = args.live.then(|| Live {
        title: title.clone(),
        node_root: args.sampling.node_root.clone(),
    });
    if live.is_some() {
        if matches!(target, TargetSpec::Command(_)) {
            anyhow::bail!(
                "--live draws on the terminal the command would write to: start the command \
                 elsewhere and give `record --live -p PID`, or record it without --live"
            );
        }
        check_terminal("record --live")?;
    }
    let options = CaptureOptions {
        duration: args.duration,
        raw: outputs.raw.clone(),
        stats: args.stats,
        ..capture_options(&args.sampling, target)?
    };
    let (capture, end, symbols) = record(options, &mut signals, live).await?;
    // Assembling and reporting take seconds on a big run: off this thread, so that a signal
    // meanwhile still ends the profiler at once.
    let finish = tokio::task::spawn_blocking(move || {
        finish_record(capture, end, title, symbols, &args, outputs)
    });
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
    /// The profile goes to [`DEFAULT_PROFILE`], whose previous version is kept as `.old`.
    default_profile: bool,
    raw: Option<Output>,
    report: ReportTargets,
}

impl RecordOutputs {
    fn check(args: &RecordArgs) -> Result<RecordOutputs> {
        let mut checker = Checker::default();
        let default_profile = args.output.is_none();
        let profile = match &args.output {
            Some(path) => Some(checker.check("-o", path)?),
            // Where the default cannot be written (a directory of someone else's), the run is
            // still worth its report: said, not fatal.
            None => match checker.check("-o", Path::new(DEFAULT_PROFILE)) {
                Ok(output) => Some(output),
                Err(error) => {
                    eprintln!(
                        "note: the profile is not kept ({error:#}): give -o FILE to keep it \
                         elsewhere"
                    );
                    None
                }
            },
        };
        let raw = checker.check_optional("--raw", args.raw.as_deref())?;
        let destination = match (&args.json, &args.report_file) {
            (Some(path), _) => Some(checker.check("--json", path)?),
            (None, Some(path)) => Some(checker.check("--report", path)?),
            (None, None) => None,
        };
        let report = ReportTargets::check(&mut checker, &args.report, destination)?;
        Ok(RecordOutputs {
            profile,
            default_profile,
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
    end: SessionEnd,
    title: String,
    symbols: ReadAhead,
    args: &RecordArgs,
    outputs: RecordOutputs,
) -> Result<ExitCode> {
    // The code of every sampled function is kept for the profile file and for the one view
    // that disassembles it (`--function`), not read for nothing.
    let with_code = outputs.profile.is_some() || args.report.view.function.is_some();
    let node_root = args.sampling.node_root.clone();
    let mut recording = symbols.finish(move |symbols, known| {
        Recording::assemble(capture, end, title, with_code, symbols, known, &node_root)
    })?;
    let mut failures = std::mem::take(&mut recording.failures);
    // The profile file is compressed and written while the report is computed: on a machine
    // whose CPUs are busy, a second thread is a second share of them at the run's end.
    let serialized = outputs.profile.as_ref().map(|output| {
        SerializedProfile::of(&recording.profile)
            .map_err(|e| anyhow::Error::from(e.in_file(output.path())))
    });
    std::thread::scope(|scope| {
        let written = outputs
            .profile
            .as_ref()
            .zip(serialized)
            .map(|(output, serialized)| {
                let keep_old = outputs.default_profile;
                scope.spawn(move || {
                    let serialized = serialized?;
                    if keep_old {
                        keep_previous(output.path())?;
                    }
                    serialized.write(output)
                })
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

/// perf's habit: the profile a run replaces is kept as `FILE.old` (replacing the one before).
fn keep_previous(path: &Path) -> Result<()> {
    let mut old = path.as_os_str().to_owned();
    old.push(".old");
    match std::fs::rename(path, &old) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(error).with_context(|| {
                format!(
                    "cannot keep the previous {} as {}",
                    path.display(),
                    Path::new(&old).display()
                )
            })
        }
        _ => Ok(()),
    }
}

/// A recording `report -i` reads: one `record` wrote, a perf.data, or a pprof profile (the
/// agent's windows).
fn read_recording(path: &Path) -> Result<Profile> {
    let kind = input_kind(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut profile = match kind {
        InputKind::PerfData => profile_from_perf_data_file(path)?,
        InputKind::Pprof => profile_from_pprof_file(path)?,
        InputKind::Profile => read_profile(path)?,
    };
    // A profile recorded by someone the kernel shows its addresses to, read by someone it
    // does not.
    if !kernel_addresses_shown() {
        hide_kernel_addresses(&mut profile);
    }
    Ok(profile)
}

fn run_report(mut args: ReportArgs) -> Result<ExitCode> {
    let mut checker = Checker::default();
    let targets = ReportTargets::check(&mut checker, &args.report, None)?;
    debuginfod::configure(args.debuginfod.config()?, Waiting::Wait);
    // The report goes to standard output, unless an export streams there.
    let targets = ReportTargets {
        report: (!checker.stdout_taken()).then(|| Output::stdout("report")),
        ..targets
    };
    if args.input == Path::new(DEFAULT_PROFILE) && !args.input.exists() {
        anyhow::bail!(
            "no {DEFAULT_PROFILE} here to report on: record one with `profiler record -- \
             COMMAND` (it writes {DEFAULT_PROFILE}), or give -i FILE (a perf.data too)"
        );
    }
    args.report.view.width = targets.report_width();
    let mut profile = read_recording(&args.input)?;
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
    speedscope: Option<Output>,
    firefox: Option<Output>,
    html: Option<Output>,
    /// `--baseline`, read before anything is recorded.
    baseline: Option<Profile>,
    latency_plot: Option<Output>,
}

impl ReportTargets {
    /// Whether the text report goes to a terminal: standard error (`None`) or standard output
    /// that is one; a file is none.
    fn report_on_terminal(&self) -> bool {
        match &self.report {
            None => std::io::stderr().is_terminal(),
            Some(output) => output.is_stdout() && std::io::stdout().is_terminal(),
        }
    }

    /// The width the text report fits (see [`terminal_width`]): a file's is the file width.
    fn report_width(&self) -> Option<usize> {
        match &self.report {
            None => terminal_width(&std::io::stderr()),
            Some(output) if output.is_stdout() => terminal_width(&std::io::stdout()),
            Some(_) => None,
        }
    }

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
            speedscope: checker.check_optional("--speedscope", output.speedscope.as_deref())?,
            firefox: checker.check_optional("--firefox", output.firefox.as_deref())?,
            html: checker.check_optional("--html", output.html.as_deref())?,
            baseline: match &output.baseline {
                Some(path) => Some(
                    read_recording(path)
                        .with_context(|| format!("--baseline {}", path.display()))?,
                ),
                None => None,
            },
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
    let exports = [
        &targets.folded,
        &targets.flamegraph,
        &targets.pprof,
        &targets.speedscope,
        &targets.firefox,
        &targets.html,
    ];
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
            &|out| Ok(write_flamegraph(&selected, 0, view.runtime_frames(), out)?),
        );
        let names: Vec<&str> = selected.events.iter().map(|e| e.name.as_str()).collect();
        export(
            &targets.pprof,
            &format!("pprof profile of {}", names.join(", ")),
            &|out| Ok(write_pprof(&selected, out)?),
        );
        export(
            &targets.speedscope,
            &format!("speedscope profile of {}", names.join(", ")),
            &|out| Ok(write_speedscope(&selected, out)?),
        );
        export(
            &targets.firefox,
            &format!("Firefox Profiler profile of {}", names.join(", ")),
            &|out| Ok(write_firefox(&selected, out)?),
        );
        let filter = view.filter();
        let html = HtmlInput {
            profile,
            event: view.event.as_deref(),
            filter: &filter,
            runtime: view.runtime_frames(),
        };
        export(
            &targets.html,
            &format!("HTML report of {}", names.join(", ")),
            &|out| write_html(&html, targets.baseline.as_ref(), out),
        );
        if exports_replace_text && !view.json && output.hardware.hardware.is_none() {
            return Ok(());
        }
    }
    let rendered = render_report(profile, view)?;
    for nothing in &rendered.nothing_to_show {
        eprintln!("note: {nothing}");
    }
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
        text = finish_text(&text, view.color.enabled(targets.report_on_terminal()));
    }
    match &targets.report {
        Some(target) => target.write(|out| Ok(out.write_all(text.as_bytes())?)),
        None => {
            eprint!("{text}");
            Ok(())
        }
    }
}
