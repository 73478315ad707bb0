//! Each subcommand: resolve the arguments into options, run, print.

use std::{fs::File, io::Write, path::Path, process::ExitCode, time::Duration};

use anyhow::{Context, Result};

use crate::{
    capture::{
        btf::Btf, counters::StackCapture, hardware::prepare_hardware_event, program::MapSizes,
    },
    cli::{Command, RecordArgs, ReportArgs, ReportOutput},
    events::{
        calibrate::{calibrate, CalibrationTarget, DEFAULT_PASS},
        override_sampling, parse_event_list, run_list, EventSpec, PmuRegistry, Sampling,
    },
    export::{
        flamegraph::write_flamegraph, folded::write_folded, pprof::write_pprof, selected_profile,
    },
    hardware::render::{hardware_json, render_hardware},
    import::{is_perf_data, profile_from_perf_data_file},
    launch::TargetSpec,
    profile::{
        file::{read_profile, write_profile},
        Profile,
    },
    record::{record, RecordOptions},
    report::{render_report, text::terminal_width},
    scope::{
        cgroup::{cgroup2_mount, cgroup_subtree_ids, resolve_cgroup_dir},
        container::find_container_cgroup,
        resolve_uid,
    },
};

pub async fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Record(args) => run_record(*args).await,
        Command::Report(args) => run_report(*args),
        Command::Stat(args) => crate::stat::run_stat(*args).await,
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
fn resolve_events(args: &RecordArgs, pmus: &PmuRegistry) -> Result<Vec<EventSpec>> {
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
        for note in prepare_hardware_event(spec)? {
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
fn resolve_cgroups(args: &RecordArgs) -> Result<Vec<u64>> {
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
fn describe_scope(args: &RecordArgs) -> Option<String> {
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

async fn run_record(mut args: RecordArgs) -> Result<ExitCode> {
    args.report.view.width = terminal_width(&std::io::stdout());
    let pmus = PmuRegistry::live()?;
    let mut events = resolve_events(&args, &pmus)?;
    let cgroups = resolve_cgroups(&args)?;
    let uid = args.uid.as_deref().map(resolve_uid).transpose()?;
    let target = if !args.command.is_empty() {
        TargetSpec::Command(args.command.clone())
    } else if !args.pids.is_empty() {
        TargetSpec::Processes(args.pids.clone())
    } else if args.all_cpus || !cgroups.is_empty() || uid.is_some() {
        TargetSpec::System
    } else {
        anyhow::bail!(
            "nothing to profile: give a command after `--`, processes with -p PID, a cgroup, \
             container or user, or -a for all CPUs"
        );
    };
    let btf = match &args.btf {
        Some(path) => Btf::from_file(path),
        None => Btf::from_sys_fs(),
    };
    if let Some(rate) = args.target_rate {
        calibrate_events(&mut events, &target, rate)?;
    }
    let offsets = match btf.and_then(|btf| btf.kernel_offsets()) {
        Ok(offsets) => Some(offsets),
        Err(e) => {
            eprintln!("warning: {e}");
            None
        }
    };
    let entries = args.map_entries;
    let ring_bytes = args.ring_buffer_bytes();
    let options = RecordOptions {
        events,
        pmus,
        target,
        duration: args.duration(),
        drain_interval: Duration::from_millis(args.drain_interval),
        sizes: MapSizes {
            stacks: args.stack_map_entries,
            stack_counts: entries,
            instructions: entries,
            data_lines: entries,
            latencies: args.latency_map_entries,
            ring_buffer_bytes: ring_bytes,
            ibs_ring_bytes: ring_bytes,
        },
        stacks: StackCapture {
            user: true,
            kernel: !args.no_kernel_stacks,
        },
        raw: args.raw.clone(),
        stats: args.stats,
        cgroups,
        uid,
        scope: describe_scope(&args),
        offsets,
    };
    let recording = record(options).await?;
    if let Some(path) = &args.output {
        write_profile(path, &recording.profile)
            .with_context(|| format!("writing the profile to {}", path.display()))?;
        eprintln!("profile written to {}", path.display());
    }
    if args.stats {
        eprint!("{}", recording.stats_text());
    }
    let mut profile = recording.profile;
    report(&mut profile, &args.report)?;
    if let Some(code) = recording
        .command_status
        .and_then(|status| status.code())
        .filter(|code| *code != 0)
    {
        eprintln!("note: the profiled command exited with status {code}");
    }
    Ok(ExitCode::SUCCESS)
}

fn run_report(mut args: ReportArgs) -> Result<ExitCode> {
    args.report.view.width = terminal_width(&std::io::stdout());
    let mut profile = if is_perf_data(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?
    {
        profile_from_perf_data_file(&args.input)?
    } else {
        read_profile(&args.input)?
    };
    report(&mut profile, &args.report)?;
    Ok(ExitCode::SUCCESS)
}

fn create(path: &Path) -> Result<File> {
    File::create(path).with_context(|| format!("cannot create {}", path.display()))
}

/// Applies `--backtrack`, writes the requested exports of what the report's filters select and
/// names them, then prints the report (with the hardware view when asked). With an export and
/// no JSON or hardware view asked, the written files are the output: the text report is not
/// printed too.
fn report(profile: &mut Profile, output: &ReportOutput) -> Result<()> {
    if let Some(summary) = output.hardware.prepare(profile) {
        eprintln!(
            "backtracking: {} samples moved to the memory access before the sampled \
             instruction, {} kept where they were sampled",
            summary.moved, summary.kept
        );
    }
    let profile = &*profile;
    let exports = [&output.folded, &output.flamegraph, &output.pprof];
    if exports.iter().any(|path| path.is_some()) {
        let view = &output.view;
        let selected = selected_profile(profile, view.event.as_deref(), &view.filter())?;
        let first = selected.events.first().map_or("", |e| e.name.as_str());
        if let Some(path) = &output.folded {
            write_folded(&selected, 0, &mut create(path)?)?;
            eprintln!("folded stacks of {first} written to {}", path.display());
        }
        if let Some(path) = &output.flamegraph {
            write_flamegraph(&selected, 0, create(path)?)?;
            eprintln!("flame graph of {first} written to {}", path.display());
        }
        if let Some(path) = &output.pprof {
            write_pprof(&selected, create(path)?)?;
            let names: Vec<&str> = selected.events.iter().map(|e| e.name.as_str()).collect();
            eprintln!(
                "pprof profile of {} written to {}",
                names.join(", "),
                path.display()
            );
        }
        if !view.json && output.hardware.hardware.is_none() {
            return Ok(());
        }
    }
    let mut text = render_report(profile, &output.view)?;
    if let Some(view) = output.hardware.hardware {
        if output.view.json {
            let mut json: serde_json::Value = serde_json::from_str(&text)?;
            json["hardware"] = hardware_json(profile, view);
            text = serde_json::to_string_pretty(&json)?;
        } else {
            text.push_str(&render_hardware(profile, view));
        }
    }
    print(&text)
}
