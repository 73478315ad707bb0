//! Whether an event can be opened on this machine, found by opening it, and what an open error
//! means for the user: the kernel's errno turned into the reason and the fix (a missing hardware
//! PMU, a capability or `perf_event_paranoid` value, an unsupported precise level, ...).

use std::fs;
use std::io;

use perf_event::events::Software;
use perf_event::{Builder, Counter};
use serde::Serialize;

use super::catalog::{PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW};
use super::pmu::PmuRegistry;
use super::sampling::Sampling;
use super::spec::EventSpec;
use super::EventError;

/// Whether an event works here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Availability {
    /// Opens for counting and for sampling.
    Available,
    /// Opens for counting (`profiler stat`) but not for sampling.
    CountOnly {
        reason: String,
    },
    Unavailable {
        reason: String,
    },
}

/// What an event was opened on: the kernel's permission rules differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Processes or threads (`-p`, `-- CMD`).
    Task,
    /// Every process on some CPUs (`-a`, cgroups, per-package PMUs).
    SystemWide,
}

/// How the failed open was attempted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenAs {
    pub scope: Scope,
    /// Whether the event was opened with a sample period or frequency.
    pub sampling: bool,
}

/// The machine settings that explain open errors, read once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SystemFacts {
    pub hardware_pmu: bool,
    /// The highest `p` level the core PMU supports (sysfs `caps/max_precise`).
    pub max_precise: Option<u8>,
    /// `kernel.perf_event_paranoid`.
    pub perf_event_paranoid: Option<i32>,
    /// `kernel.perf_event_max_sample_rate`, the highest frequency the kernel accepts.
    pub max_sample_rate: Option<u64>,
    /// Whether this process has CAP_PERFMON or CAP_SYS_ADMIN, which lift the paranoid limits.
    pub perf_capable: bool,
}

/// Capability bits in `/proc/self/status` `CapEff`.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;

/// Whether a `CapEff` line's mask holds CAP_PERFMON or CAP_SYS_ADMIN.
fn perf_capable(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << CAP_PERFMON | 1 << CAP_SYS_ADMIN) != 0)
}

impl SystemFacts {
    /// Reads the facts of the running system.
    pub fn read(registry: &PmuRegistry) -> SystemFacts {
        let sysctl = |name: &str| {
            fs::read_to_string(format!("/proc/sys/kernel/{name}"))
                .ok()
                .map(|text| text.trim().to_string())
        };
        SystemFacts {
            hardware_pmu: registry.has_hardware_pmu(),
            max_precise: registry
                .iter()
                .filter(|pmu| pmu.core)
                .find_map(|pmu| pmu.caps.get("max_precise")?.parse().ok()),
            perf_event_paranoid: sysctl("perf_event_paranoid").and_then(|text| text.parse().ok()),
            max_sample_rate: sysctl("perf_event_max_sample_rate")
                .and_then(|text| text.parse().ok()),
            perf_capable: fs::read_to_string("/proc/self/status")
                .is_ok_and(|status| perf_capable(&status)),
        }
    }
}

fn is_spe(spec: &EventSpec) -> bool {
    spec.pmu
        .as_deref()
        .is_some_and(|pmu| pmu.starts_with(super::spec::SPE_PMU_PREFIX))
}

/// Opens `spec` for counting, then for sampling, on this process (or, for per-package PMUs, on
/// the first CPU of their cpumask) and closes it again.
pub fn probe(spec: &EventSpec, facts: &SystemFacts) -> Availability {
    let cpu = spec.cpumask.as_ref().and_then(|cpus| cpus.first().copied());
    let scope = if cpu.is_some() {
        Scope::SystemWide
    } else {
        Scope::Task
    };
    if let Err(err) = open(spec, cpu, false) {
        let how = OpenAs {
            scope,
            sampling: false,
        };
        return Availability::Unavailable {
            reason: explain(spec, &err, how, facts),
        };
    }
    let Err(err) = open(spec, cpu, true) else {
        return Availability::Available;
    };
    let how = OpenAs {
        scope,
        sampling: true,
    };
    let reason = match err.raw_os_error() {
        // The same event just opened for counting, so the kernel refuses the sampling itself.
        Some(libc::EINVAL | libc::EOPNOTSUPP)
            if spec.attr.precise_ip == 0 && !exceeds_max_rate(spec.sampling, facts) =>
        {
            cannot_sample(spec)
        }
        _ => explain(spec, &err, how, facts),
    };
    Availability::CountOnly { reason }
}

fn cannot_sample(spec: &EventSpec) -> String {
    format!(
        "{} can count this event but not sample it (no overflow interrupt): use `profiler stat`",
        spec.pmu.as_deref().unwrap_or("this CPU's PMU")
    )
}

fn open(spec: &EventSpec, cpu: Option<u32>, sampling: bool) -> io::Result<Counter> {
    let mut builder = Builder::new(Software::DUMMY);
    if let Some(cpu) = cpu {
        builder.any_pid().one_cpu(cpu as usize);
    }
    spec.attr.apply(builder.attrs_mut());
    if sampling {
        spec.sampling.apply(builder.attrs_mut());
    }
    builder.build()
}

/// The error to show when opening `spec` failed with `err`, for the recorder and `stat`.
pub fn open_error(
    spec: &EventSpec,
    err: &io::Error,
    how: OpenAs,
    facts: &SystemFacts,
) -> EventError {
    EventError::Unavailable {
        event: spec.text.clone(),
        reason: explain(spec, err, how, facts),
    }
}

/// What `err` from perf_event_open means for `spec`, and what to do about it.
pub fn explain(spec: &EventSpec, err: &io::Error, how: OpenAs, facts: &SystemFacts) -> String {
    let generic_hardware = spec.pmu.is_none()
        && matches!(
            spec.attr.type_,
            PERF_TYPE_HARDWARE | PERF_TYPE_HW_CACHE | PERF_TYPE_RAW
        );
    let pmu = spec.pmu.as_deref().unwrap_or("this CPU's PMU");
    if err.kind() == io::ErrorKind::Unsupported && err.raw_os_error().is_none() {
        return format!("this kernel is too old for the options the profiler sets ({err})");
    }
    let Some(errno) = err.raw_os_error() else {
        return format!("perf_event_open failed: {err}");
    };
    match errno {
        // Without a PMU no privilege helps; the kernel checks privileges first, so this
        // comes before EACCES/EPERM.
        libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV | libc::EACCES | libc::EPERM
            if generic_hardware && !facts.hardware_pmu =>
        {
            "no hardware PMU: virtual machine? (the hypervisor exposes no performance counters; \
             software events such as cpu-clock and page-faults work)"
                .to_string()
        }
        libc::EACCES | libc::EPERM => permission(spec, how.scope, facts),
        libc::EOPNOTSUPP | libc::EINVAL if spec.attr.precise_ip > 0 => {
            let supported = match facts.max_precise {
                Some(0) | None => "no precise level".to_string(),
                Some(max) => format!("up to :{}", "p".repeat(max.into())),
            };
            format!(
                "precise sampling (:{}) not supported by this PMU (it supports {supported}); \
                 use fewer p modifiers",
                "p".repeat(spec.attr.precise_ip.into())
            )
        }
        libc::EINVAL if how.sampling && exceeds_max_rate(spec.sampling, facts) => format!(
            "frequency {} exceeds kernel.perf_event_max_sample_rate ({}): ask for less, or raise \
             it with sysctl kernel.perf_event_max_sample_rate=N",
            spec.sampling,
            facts.max_sample_rate.unwrap_or_default()
        ),
        // SPE's cpumask names the CPUs that have it, not a package: it follows tasks.
        libc::EINVAL if how.scope == Scope::Task && spec.cpumask.is_some() && !is_spe(spec) => {
            format!("{pmu} counts per package, not per task: count it system-wide (-a)")
        }
        libc::EOPNOTSUPP if how.sampling => cannot_sample(spec),
        libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV => {
            format!("{pmu} does not support {} on this CPU", spec.name)
        }
        libc::EINVAL => format!(
            "the kernel rejected the event's settings: check its terms and modifiers against \
             `profiler list`{}",
            if how.sampling {
                ", or the PMU may not support sampling"
            } else {
                ""
            }
        ),
        libc::EMFILE | libc::ENFILE => {
            "too many open files: raise the limit (ulimit -n) or open fewer events".to_string()
        }
        libc::EBUSY => "the PMU is in exclusive use by someone else (another profiler, or the \
                        NMI watchdog: sysctl kernel.nmi_watchdog=0 frees its counter)"
            .to_string(),
        libc::ENOSPC => {
            "no free hardware counter: open fewer events at once or stop other profilers"
                .to_string()
        }
        libc::ESRCH => "the target process no longer exists".to_string(),
        _ => format!("perf_event_open failed: {err}"),
    }
}

fn exceeds_max_rate(sampling: Sampling, facts: &SystemFacts) -> bool {
    match (sampling, facts.max_sample_rate) {
        (Sampling::Frequency(hz), Some(max)) => hz > max,
        _ => false,
    }
}

/// The permission message: which capability or paranoid level the open needs.
fn permission(spec: &EventSpec, scope: Scope, facts: &SystemFacts) -> String {
    // Kernel rules: paranoid > 0 refuses system-wide events, > 1 refuses kernel profiling,
    // and Debian's > 2 refuses everything, to unprivileged users.
    let needed = match scope {
        Scope::SystemWide => 0,
        Scope::Task if !spec.attr.exclude_kernel => 1,
        Scope::Task => 2,
    };
    match facts.perf_event_paranoid {
        _ if facts.perf_capable => "permission refused although the profiler has CAP_PERFMON \
                                    or CAP_SYS_ADMIN: a security module (SELinux, AppArmor, \
                                    lockdown) or a seccomp filter (containers) blocks this event"
            .to_string(),
        Some(now) if now <= needed => format!(
            "no permission although kernel.perf_event_paranoid is {now}: a security module \
             (SELinux, AppArmor, lockdown) or a seccomp filter (containers) blocks \
             perf_event_open; grant CAP_PERFMON or allow it in that policy"
        ),
        now => {
            let now = now.map_or("unknown".to_string(), |now| now.to_string());
            let user_only = if scope == Scope::Task && !spec.attr.exclude_kernel {
                "; or add :u to sample user space only (needs <= 2)"
            } else {
                ""
            };
            format!(
                "no permission: needs CAP_PERFMON (or CAP_SYS_ADMIN) or \
                 kernel.perf_event_paranoid <= {needed} (now {now}){user_only}"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::pmu::tests::fixture_registry;
    use super::super::spec::parse_event;
    use super::*;

    const TASK_COUNT: OpenAs = OpenAs {
        scope: Scope::Task,
        sampling: false,
    };
    const TASK_SAMPLE: OpenAs = OpenAs {
        scope: Scope::Task,
        sampling: true,
    };

    fn spec(text: &str) -> EventSpec {
        let registry = fixture_registry();
        parse_event(text, &registry).unwrap()
    }

    fn errno(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    fn facts(paranoid: i32) -> SystemFacts {
        SystemFacts {
            hardware_pmu: true,
            max_precise: Some(2),
            perf_event_paranoid: Some(paranoid),
            max_sample_rate: Some(100_000),
            perf_capable: false,
        }
    }

    #[test]
    fn capabilities_are_read_from_the_effective_set() {
        let status =
            |mask: &str| format!("Name:\tprofiler\nCapPrm:\t000001ffffffffff\nCapEff:\t{mask}\n");
        assert!(perf_capable(&status("000001fffeffffff")));
        assert!(
            perf_capable(&status("0000004000000000")),
            "CAP_PERFMON alone"
        );
        assert!(
            perf_capable(&status("0000000000200000")),
            "CAP_SYS_ADMIN alone"
        );
        assert!(!perf_capable(&status("0000000000000000")));
        assert!(!perf_capable("Name:\tprofiler\n"));
    }

    #[test]
    fn hardware_events_without_a_pmu_blame_the_virtual_machine() {
        let vm = SystemFacts {
            hardware_pmu: false,
            ..facts(2)
        };
        // Non-root, the kernel refuses before it looks for the PMU: EACCES/EPERM.
        for code in [
            libc::ENOENT,
            libc::EOPNOTSUPP,
            libc::ENODEV,
            libc::EACCES,
            libc::EPERM,
        ] {
            let reason = explain(&spec("cycles"), &errno(code), TASK_COUNT, &vm);
            assert!(
                reason.starts_with("no hardware PMU: virtual machine?"),
                "{reason}"
            );
        }
        assert!(
            explain(&spec("r1c2"), &errno(libc::ENOENT), TASK_COUNT, &vm)
                .starts_with("no hardware PMU")
        );
        // With a PMU, the PMU lacks the event.
        let reason = explain(
            &spec("stalled-cycles-frontend"),
            &errno(libc::ENOENT),
            TASK_COUNT,
            &facts(2),
        );
        assert_eq!(
            reason,
            "this CPU's PMU does not support stalled-cycles-frontend on this CPU"
        );
    }

    #[test]
    fn permission_errors_name_the_capability_and_paranoid_level() {
        let reason = explain(&spec("cycles"), &errno(libc::EACCES), TASK_COUNT, &facts(2));
        assert_eq!(
            reason,
            "no permission: needs CAP_PERFMON (or CAP_SYS_ADMIN) or kernel.perf_event_paranoid \
             <= 1 (now 2); or add :u to sample user space only (needs <= 2)"
        );
        let reason = explain(
            &spec("cycles:u"),
            &errno(libc::EPERM),
            TASK_COUNT,
            &facts(3),
        );
        assert!(
            reason.contains("perf_event_paranoid <= 2 (now 3)"),
            "{reason}"
        );
        let system_wide = OpenAs {
            scope: Scope::SystemWide,
            sampling: true,
        };
        let reason = explain(
            &spec("cycles:u"),
            &errno(libc::EACCES),
            system_wide,
            &facts(1),
        );
        assert!(
            reason.contains("<= 0 (now 1)") && !reason.contains(":u"),
            "{reason}"
        );
        let reason = explain(
            &spec("cycles"),
            &errno(libc::EACCES),
            TASK_COUNT,
            &facts(-1),
        );
        assert!(reason.contains("security module"), "{reason}");
        let capable = SystemFacts {
            perf_capable: true,
            ..facts(3)
        };
        let reason = explain(&spec("cycles"), &errno(libc::EACCES), TASK_COUNT, &capable);
        assert!(
            reason.starts_with("permission refused although the profiler has CAP_PERFMON"),
            "{reason}"
        );
    }

    #[test]
    fn precise_levels_beyond_the_pmu_are_explained() {
        let reason = explain(
            &spec("cycles:ppp"),
            &errno(libc::EOPNOTSUPP),
            TASK_SAMPLE,
            &facts(0),
        );
        assert_eq!(
            reason,
            "precise sampling (:ppp) not supported by this PMU (it supports up to :pp); use \
             fewer p modifiers"
        );
        let none = SystemFacts {
            max_precise: None,
            ..facts(0)
        };
        let reason = explain(
            &spec("cpu-clock:p"),
            &errno(libc::EINVAL),
            TASK_SAMPLE,
            &none,
        );
        assert!(
            reason.contains("(:p) not supported") && reason.contains("no precise level"),
            "{reason}"
        );
    }

    #[test]
    fn other_errnos_say_what_to_do() {
        let f = facts(0);
        let reason = explain(
            &spec("cpu-clock/freq=200000/"),
            &errno(libc::EINVAL),
            TASK_SAMPLE,
            &f,
        );
        assert_eq!(
            reason,
            "frequency 200000 Hz exceeds kernel.perf_event_max_sample_rate (100000): ask for \
             less, or raise it with sysctl kernel.perf_event_max_sample_rate=N"
        );
        let reason = explain(
            &spec("power/energy-pkg/"),
            &errno(libc::EINVAL),
            TASK_COUNT,
            &f,
        );
        assert_eq!(
            reason,
            "power counts per package, not per task: count it system-wide (-a)"
        );
        let reason = explain(
            &spec("power/energy-pkg/"),
            &errno(libc::EOPNOTSUPP),
            TASK_SAMPLE,
            &f,
        );
        assert!(
            reason.starts_with("power can count this event but not sample it"),
            "{reason}"
        );
        let reason = explain(&spec("cycles"), &errno(libc::EMFILE), TASK_COUNT, &f);
        assert!(reason.contains("ulimit -n"), "{reason}");
        let reason = explain(&spec("cycles"), &errno(libc::EBUSY), TASK_COUNT, &f);
        assert!(reason.contains("nmi_watchdog"), "{reason}");
        let reason = explain(&spec("cycles"), &errno(libc::ESRCH), TASK_COUNT, &f);
        assert_eq!(reason, "the target process no longer exists");
        let err = open_error(&spec("icm"), &errno(libc::ENOSPC), TASK_COUNT, &f);
        assert_eq!(
            err.to_string(),
            "cannot open event 'icm': no free hardware counter: open fewer events at once or \
             stop other profilers"
        );
    }

    #[test]
    fn this_machine_opens_software_events_and_explains_hardware_ones() {
        let registry = PmuRegistry::live().expect("/sys is readable");
        let facts = SystemFacts::read(&registry);
        for name in [
            "cpu-clock",
            "task-clock",
            "page-faults",
            "context-switches",
            "major-faults",
        ] {
            let spec = parse_event(name, &registry).unwrap();
            assert_eq!(probe(&spec, &facts), Availability::Available, "{name}");
        }
        // The msr PMU counts (TSC, APERF, ...) but refuses sample periods.
        if registry
            .get("msr")
            .is_some_and(|msr| msr.events.contains_key("tsc"))
        {
            let tsc = parse_event("msr/tsc/", &registry).unwrap();
            assert_eq!(
                probe(&tsc, &facts),
                Availability::CountOnly {
                    reason: "msr can count this event but not sample it (no overflow \
                             interrupt): use `profiler stat`"
                        .to_string()
                }
            );
        }
        let cycles = parse_event("cycles", &registry).unwrap();
        let availability = probe(&cycles, &facts);
        if Path::new("/sys/bus/event_source/devices/cpu").exists() {
            assert!(
                !matches!(&availability, Availability::Unavailable { reason } if reason.starts_with("no hardware PMU")),
                "{availability:?}"
            );
        } else {
            let Availability::Unavailable { reason } = availability else {
                panic!("cycles opened without a hardware PMU: {availability:?}");
            };
            assert!(
                reason.starts_with("no hardware PMU: virtual machine?"),
                "{reason}"
            );
        }
    }
}
