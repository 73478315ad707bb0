//! Each subcommand: resolve the arguments into options, run, print.

use std::{io::Write, path::Path, process::ExitCode, time::Duration};

use anyhow::Result;
use perf_event_open_sys::bindings::{
    perf_event_attr, PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_SW_CPU_CLOCK, PERF_TYPE_HARDWARE,
    PERF_TYPE_SOFTWARE,
};

use crate::{
    capture::{
        counters::{Sampling, SamplingEvent, StackCapture},
        program::MapSizes,
    },
    cli::{Command, RecordArgs},
    profile::EventInfo,
    record::{record, RecordOptions, TargetSpec},
    report::{render_report, ViewArgs},
};

pub async fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Record(args) => run_record(args).await,
    }
}

/// Default sampling rate: 999 Hz, off the 1 kHz beat of timers and periodic work.
const DEFAULT_FREQUENCY: u64 = 999;

/// cycles where the machine has a hardware PMU, cpu-clock elsewhere (said once).
fn default_event(sampling: Sampling) -> (SamplingEvent, EventInfo) {
    let has_pmu = Path::new("/sys/bus/event_source/devices/cpu").exists();
    let (name, type_, config, unit) = if has_pmu {
        (
            "cycles",
            PERF_TYPE_HARDWARE,
            PERF_COUNT_HW_CPU_CYCLES,
            "CPU-cycles",
        )
    } else {
        eprintln!("note: no hardware PMU on this machine (a virtual machine?): sampling cpu-clock instead of cycles");
        (
            "cpu-clock",
            PERF_TYPE_SOFTWARE,
            PERF_COUNT_SW_CPU_CLOCK,
            "nanoseconds",
        )
    };
    let mut attr = perf_event_attr::default();
    attr.type_ = type_;
    attr.config = u64::from(config);
    let event = SamplingEvent {
        name: name.to_string(),
        attr,
        sampling,
    };
    let (period, frequency) = match sampling {
        Sampling::Period(p) => (Some(p), None),
        Sampling::Frequency(hz) => (None, Some(hz)),
    };
    let info = EventInfo {
        name: name.to_string(),
        period,
        frequency,
        unit: unit.to_string(),
        precise: false,
    };
    (event, info)
}

async fn run_record(args: RecordArgs) -> Result<ExitCode> {
    let sampling = match (args.period, args.frequency) {
        (Some(period), _) => Sampling::Period(period),
        (None, Some(hz)) => Sampling::Frequency(hz),
        (None, None) => Sampling::Frequency(DEFAULT_FREQUENCY),
    };
    let target = if !args.command.is_empty() {
        TargetSpec::Command(args.command.clone())
    } else if !args.pids.is_empty() {
        TargetSpec::Processes(args.pids.clone())
    } else if args.all_cpus {
        TargetSpec::System
    } else {
        anyhow::bail!(
            "nothing to profile: give a command after `--`, processes with -p PID, or -a for \
             all CPUs"
        );
    };
    let options = RecordOptions {
        events: vec![default_event(sampling)],
        target,
        duration: args.duration(),
        drain_interval: Duration::from_millis(args.drain_interval.max(10)),
        sizes: MapSizes {
            stacks: args.stack_map_entries,
            ..MapSizes::default()
        },
        stacks: StackCapture {
            user: true,
            kernel: !args.no_kernel_stacks,
        },
        raw: false,
        cgroups: Vec::new(),
        uid: None,
        offsets: None,
    };
    let recording = record(options).await?;
    let view = ViewArgs {
        top: args.top,
        paths: args.paths,
        json: args.json,
        ..ViewArgs::default()
    };
    let report = render_report(&recording.profile, &view)?;
    std::io::stdout().write_all(report.as_bytes())?;
    Ok(match recording.command_status.and_then(|s| s.code()) {
        Some(code) if code != 0 => {
            eprintln!("note: the profiled command exited with status {code}");
            ExitCode::SUCCESS
        }
        _ => ExitCode::SUCCESS,
    })
}
