//! Opening the perf counters that drive sampling: one per (event, CPU) system-wide, one per
//! (event, thread) for processes, inherited into new threads and children.

use std::{
    fs, io,
    os::fd::{AsRawFd, RawFd},
};

use anyhow::{anyhow, bail, Context, Result};
use perf_event::{events::Software, Builder, Counter};

use super::hardware::{self, hardware_sample_type, HardwareSampler};

use crate::events::{open_error, EventSpec, OpenAs, Scope, SystemFacts};
use crate::process::threads_of;

/// What to profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A command we launched (stopped before exec): followed into its threads and children, and
    /// enabled when it calls exec.
    Command(u32),
    /// Running processes: every current thread, and new threads and children.
    Processes(Vec<u32>),
    /// Every CPU, every process.
    System,
}

/// One open counter and the index of the event it samples.
pub struct EventCounter {
    pub event: u32,
    pub counter: Counter,
    /// Whether it counts nanoseconds of its own running time (cpu-clock, task-clock).
    pub clock: bool,
}

/// Which stacks the program collects; the kernel needs to know for precise events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackCapture {
    pub user: bool,
    pub kernel: bool,
}

/// Online CPU numbers, from /sys/devices/system/cpu/online ("0-3,5").
pub fn online_cpus() -> Result<Vec<usize>> {
    let text = fs::read_to_string("/sys/devices/system/cpu/online")
        .context("reading /sys/devices/system/cpu/online")?;
    parse_cpu_list(text.trim())
}

pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let number = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| anyhow!("bad CPU list '{text}'"))
        };
        match part.split_once('-') {
            Some((first, last)) => cpus.extend(number(first)?..=number(last)?),
            None => cpus.push(number(part)?),
        }
    }
    Ok(cpus)
}

/// The (pid, cpu) pairs to open one counter on, for a target.
fn placements(target: &Target) -> Result<Vec<(Option<u32>, Option<usize>)>> {
    Ok(match target {
        Target::Command(pid) => vec![(Some(*pid), None)],
        Target::Processes(pids) => {
            let mut placements = Vec::new();
            for pid in pids {
                let tids = threads_of(*pid).map_err(|_| {
                    anyhow!("process {pid} does not exist (or exited): check the PID with `ps -p {pid}`")
                })?;
                placements.extend(tids.into_iter().map(|tid| (Some(tid), None)));
            }
            placements
        }
        Target::System => online_cpus()?
            .into_iter()
            .map(|cpu| (None, Some(cpu)))
            .collect(),
    })
}

/// The (task, CPU) pairs to open a mapped event on: the kernel refuses to mmap inherited
/// per-task events on all CPUs (every child would write one buffer), so they are opened per
/// (task, CPU), as perf does; system-wide, one per CPU.
pub fn per_cpu_placements(target: &Target, cpus: &[usize]) -> Vec<(Option<u32>, usize)> {
    let tasks: Vec<Option<u32>> = match target {
        Target::Command(pid) => vec![Some(*pid)],
        Target::Processes(pids) => pids
            .iter()
            .flat_map(|pid| threads_of(*pid).unwrap_or_default())
            .map(Some)
            .collect(),
        Target::System => vec![None],
    };
    tasks
        .iter()
        .flat_map(|task| cpus.iter().map(move |cpu| (*task, *cpu)))
        .collect()
}

/// Sends `counter`'s records into the ring buffer of the event `into` (PERF_EVENT_IOC_SET_OUTPUT).
pub fn redirect_output(counter: &Counter, into: RawFd) -> io::Result<()> {
    // SAFETY: both file descriptors are open perf events the caller holds for the call's
    // duration; the ioctl only links their ring buffers.
    let result = unsafe { perf_event_open_sys::ioctls::SET_OUTPUT(counter.as_raw_fd(), into) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts a counter on `pid` (all when `None`) and `cpu` (any when `None`), following new tasks
/// and starting at exec as `target` needs.
pub fn place(builder: &mut Builder, target: &Target, pid: Option<u32>, cpu: Option<usize>) {
    match pid {
        Some(pid) => builder.observe_pid(pid as i32),
        None => builder.any_pid(),
    };
    match cpu {
        Some(cpu) => builder.one_cpu(cpu),
        None => builder.any_cpu(),
    };
    let follows_tasks = !matches!(target, Target::System);
    builder.inherit(follows_tasks);
    builder.enable_on_exec(matches!(target, Target::Command(_)));
}

/// Opens one sampling counter per event and placement, disabled.
pub fn open_sampling_counters(
    events: &[EventSpec],
    target: &Target,
    stacks: StackCapture,
    facts: &SystemFacts,
) -> Result<Vec<EventCounter>> {
    let placements = placements(target)?;
    let how = OpenAs {
        scope: match target {
            Target::System => Scope::SystemWide,
            _ => Scope::Task,
        },
        sampling: true,
    };
    let mut counters = Vec::new();
    // SPE writes an AUX trace the agent reads (`aux_trace`): no sample runs the program.
    let sampled = events
        .iter()
        .enumerate()
        .filter(|(_, event)| hardware::hardware_sampler(event) != HardwareSampler::Spe);
    for (index, event) in sampled {
        let mut opened_any = false;
        for &(pid, cpu) in &placements {
            let mut builder = Builder::new(Software::DUMMY);
            event.attr.apply(builder.attrs_mut());
            event.sampling.apply(builder.attrs_mut());
            place(&mut builder, target, pid, cpu);
            // What the PMU must record for the program to read (addresses, weights, data
            // sources, IBS registers), and callchains where the kernel requires them.
            let (sample_type, _) = hardware_sample_type(event, stacks.user || stacks.kernel);
            builder.attrs_mut().sample_type = sample_type;
            if sample_type & hardware::sample::CALLCHAIN != 0 {
                builder
                    .exclude_callchain_user(false)
                    .exclude_callchain_kernel(false);
            }
            match builder.build() {
                Ok(counter) => {
                    opened_any = true;
                    counters.push(EventCounter {
                        event: index as u32,
                        counter,
                        clock: hardware::is_clock(event),
                    });
                }
                // A thread that exits while we open counters is not an error; the others stay.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) && pid.is_some() => continue,
                Err(e) => return Err(open_error(event, &e, how, facts).into()),
            }
        }
        if !opened_any {
            bail!(
                "cannot open event '{}': every target thread exited",
                event.name
            );
        }
    }
    Ok(counters)
}
