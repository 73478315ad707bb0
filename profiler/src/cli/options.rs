//! The one place the command line becomes options: events, target, scope filters, map sizes
//! and unwinding resolved from [`SamplingArgs`] into a session's [`CaptureOptions`], for
//! `record` and `agent` alike.

use anyhow::{bail, Context, Result};

use super::{SamplingArgs, Unwind};
use crate::{
    capture::{
        btf::Btf, counters::StackCapture, hardware::prepare_sampled_event, offcpu::OffCpuOptions,
        offsets_cache::running_kernel_offsets,
    },
    events::{override_sampling, parse_event_list, EventSpec, PmuRegistry, Sampling},
    launch::TargetSpec,
    scope::{
        cgroup::{cgroup2_mount, cgroup_subtree_ids, resolve_cgroup_dir},
        container::find_container_cgroup,
        resolve_uid,
    },
    session::{
        self,
        map_sizes::{self, MapRequest, DEFAULT_STACK_COPY_KIB, MAX_STACK_COPY_KIB},
        CaptureOptions, SIDEBAND_INTERVAL,
    },
    stat::calibrate::{calibrate, CalibrationTarget, DEFAULT_PASS},
};

/// The events to sample: as given, or cycles (cpu-clock where there is no hardware PMU), with
/// any global overflow override; and the notes to print once every option is resolved (a usage
/// error is not preceded by notes about a recording that never starts).
fn resolve_events(
    args: &SamplingArgs,
    pmus: &PmuRegistry,
) -> Result<(Vec<EventSpec>, Vec<String>)> {
    let mut notes = Vec::new();
    let text = if args.events.is_empty() {
        if pmus.has_hardware_pmu() {
            "cycles".to_string()
        } else {
            // Said only here, where it changes what is recorded.
            notes.push(
                "no hardware PMU on this machine (a virtual machine?): sampling cpu-clock \
                 instead of cycles"
                    .to_string(),
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
        notes.extend(prepare_sampled_event(spec)?);
    }
    Ok((specs, notes))
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

/// KiB of user stack each sample copies, with `--unwind copy` or `check`.
fn stack_copy_kib(args: &SamplingArgs) -> Result<Option<u32>> {
    match (args.unwind(), args.stack_copy_kib) {
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
pub fn capture_options(args: &SamplingArgs, target: TargetSpec) -> Result<CaptureOptions> {
    let pmus = PmuRegistry::live()?;
    let (mut events, notes) = resolve_events(args, &pmus)?;
    let cgroups = resolve_cgroups(args)?;
    let uid = args.uid.as_deref().map(resolve_uid).transpose()?;
    let stack_copy_kib = stack_copy_kib(args)?;
    let offsets = match &args.btf {
        Some(path) => Btf::from_file(path).and_then(|btf| btf.kernel_offsets()),
        None => running_kernel_offsets(),
    };
    for note in notes {
        eprintln!("note: {note}");
    }
    if let Some(rate) = args.target_rate {
        calibrate_events(&mut events, &target, rate)?;
    }
    // After calibration: the sizes follow the rates it chose.
    let unwind = session::Unwind::from(args.unwind());
    let sizes = map_sizes::resolve(
        &events,
        args.drain_interval,
        unwind.walks_tables(),
        &MapRequest {
            map_entries: args.map_entries,
            stack_map_entries: args.stack_map_entries,
            latency_map_entries: args.latency_map_entries,
            ring_buffer_kib: args.ring_buffer_kib,
            unwind_table_mib: args.unwind_table_mib,
        },
    )?;
    let offsets = match offsets {
        Ok(offsets) => Some(offsets),
        Err(e) => {
            eprintln!("warning: {e}");
            None
        }
    };
    Ok(CaptureOptions {
        events,
        pmus,
        target,
        duration: None,
        drain_interval: args.drain_interval,
        sideband_interval: SIDEBAND_INTERVAL,
        sizes,
        stacks: StackCapture {
            user: true,
            kernel: !args.no_kernel_stacks,
        },
        stack_copy_kib,
        unwind,
        raw: None,
        stats: false,
        cgroups,
        uid,
        offsets,
        off_cpu: args.off_cpu.then(|| OffCpuOptions {
            min_block_ns: args
                .off_cpu_min
                .map_or(0, |min| u64::try_from(min.as_nanos()).unwrap_or(u64::MAX)),
            wakers: args.wakers,
        }),
        per_instruction: true,
        memory_budget: None,
    })
}

/// The target as profiles and reports name it: the command (with its arguments only with
/// `record_args`, see [`TargetSpec::describe`]), processes or the whole system, with the
/// cgroup, container or user filter.
pub fn target_title(args: &SamplingArgs, target: &TargetSpec, record_args: bool) -> String {
    match (target, describe_scope(args)) {
        (TargetSpec::System, Some(scope)) => scope,
        (target, Some(scope)) => format!("{} ({scope})", target.describe(record_args)),
        (target, None) => target.describe(record_args),
    }
}

/// For the commands that watch the whole system unless scoped (`agent`, `top`): refuses what
/// only `record` does, and samples at `default_hz` when no event, period or rate is given.
/// Returns the target and its title.
pub fn system_wide_sampling(
    args: &mut SamplingArgs,
    command: &str,
    default_hz: u64,
) -> Result<(TargetSpec, String)> {
    if args.wakers {
        bail!(
            "--wakers is a view of `record`'s report: {command} shows off-CPU time (--off-cpu) \
             without its wakers"
        );
    }
    if args.unwind() == Unwind::Check {
        bail!(
            "--unwind check compares two unwinders over one recording: use it with `record`; \
             {command} takes --unwind dwarf, fp or copy"
        );
    }
    if args.events.is_empty() && args.period.is_none() && args.target_rate.is_none() {
        args.frequency.get_or_insert(default_hz);
    }
    let target = target_of(args, &[], true).expect("-a stands for the whole system");
    let title = target_title(args, &target, false);
    Ok((target, title))
}
