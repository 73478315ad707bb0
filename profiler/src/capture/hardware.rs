//! Opening hardware sampling events so the kernel delivers what precise samplers measure: the
//! `sample_type` of each kind of sampler ([`hardware_sample_type`]), the adjustments an event
//! needs before it is opened ([`prepare_sampled_event`]: IBS periods in sixteens, PEBS memory
//! events made precise, clock periods raised to the kernel timer's floor), and what the capture
//! program needs to decode IBS registers itself ([`raw_decoding`], [`cpu_identity`]).
//!
//! The event terms themselves (`ibs_op/cnt_ctl=1,l3missonly=1/`, `cpu/mem-loads,ldlat=50/`) are
//! resolved against the PMU's sysfs type and format files by `events::spec`.

use std::fs;

use perf_event_open_sys::bindings;
use profiler_common::capture::RawDecoding;
use profiler_common::hw::ibs::IbsErrata;

use crate::events::{
    catalog::PERF_TYPE_SOFTWARE, spec::SPE_PMU_PREFIX, EventError, EventSpec, Sampling,
};
use crate::profile::CpuIdentity;

/// `perf_event_attr.sample_type` bits.
pub mod sample {
    use super::bindings;

    pub const IP: u64 = bindings::PERF_SAMPLE_IP as u64;
    pub const TID: u64 = bindings::PERF_SAMPLE_TID as u64;
    pub const ADDR: u64 = bindings::PERF_SAMPLE_ADDR as u64;
    pub const CALLCHAIN: u64 = bindings::PERF_SAMPLE_CALLCHAIN as u64;
    pub const PERIOD: u64 = bindings::PERF_SAMPLE_PERIOD as u64;
    pub const RAW: u64 = bindings::PERF_SAMPLE_RAW as u64;
    pub const DATA_SRC: u64 = bindings::PERF_SAMPLE_DATA_SRC as u64;
    pub const PHYS_ADDR: u64 = bindings::PERF_SAMPLE_PHYS_ADDR as u64;
    pub const WEIGHT_STRUCT: u64 = bindings::PERF_SAMPLE_WEIGHT_STRUCT as u64;
}

/// What every sample carries: where it was taken, by whom, and the data address of events that
/// have one (page faults); the kernel zeroes the address of those that do not.
///
/// PERIOD is not among them: for software events in period mode, `perf_swevent_event()` turns
/// *every* event into a sample when PERF_SAMPLE_PERIOD is requested (each carrying the period
/// 1), so `page-faults,1000` would sample every fault. Without the bit the kernel counts down
/// the period, and the program still reads the period from `perf_sample_data` (the kernel fills
/// it from `hw.last_period` either way).
const BASE_SAMPLE_TYPE: u64 = sample::IP | sample::TID | sample::ADDR;
/// What a precise sampler can measure of a memory access.
const MEMORY_SAMPLE_TYPE: u64 =
    sample::ADDR | sample::WEIGHT_STRUCT | sample::DATA_SRC | sample::PHYS_ADDR;

/// IBS counts in sixteens: the low 4 bits of its period are dropped by the hardware.
const IBS_PERIOD_UNIT: u64 = 16;
/// IBS_FETCH_CTL's max count is 16 bits of sixteens.
const IBS_FETCH_MAX_PERIOD: u64 = 0xffff * IBS_PERIOD_UNIT;
/// The precise level given to PEBS memory events opened without one: zero skid requested.
const PEBS_MEMORY_PRECISE_IP: u8 = 2;

/// How an event's samples are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HardwareSampler {
    /// AMD IBS op sampling (`ibs_op//`): registers in PERF_SAMPLE_RAW.
    IbsOp,
    /// AMD IBS fetch sampling (`ibs_fetch//`).
    IbsFetch,
    /// Arm SPE (`arm_spe_0//`): records in the AUX area, read by the agent, not the program.
    Spe,
    /// Intel PEBS load latency (`cpu/mem-loads/`) or stores (`cpu/mem-stores/`).
    PebsMemory,
    /// Any other event with a precise level (`cycles:pp`).
    Precise,
    /// A counter overflow interrupt: the IP may skid past the instruction that caused it.
    Skid,
}

/// The sampler behind `spec`.
pub fn hardware_sampler(spec: &EventSpec) -> HardwareSampler {
    match spec.pmu.as_deref() {
        Some("ibs_op") => return HardwareSampler::IbsOp,
        Some("ibs_fetch") => return HardwareSampler::IbsFetch,
        Some(pmu) if pmu.starts_with(SPE_PMU_PREFIX) => return HardwareSampler::Spe,
        _ => {}
    }
    let core_pmu = matches!(spec.pmu.as_deref(), Some("cpu" | "cpu_core" | "cpu_atom"));
    if core_pmu && (names_event(spec, "mem-loads") || names_event(spec, "mem-stores")) {
        HardwareSampler::PebsMemory
    } else if spec.precise() {
        HardwareSampler::Precise
    } else {
        HardwareSampler::Skid
    }
}

/// The software events whose samples never carry a data address: clocks, switches and
/// migrations. The faults carry the faulting address, and an event this list does not know may.
const SOFTWARE_WITHOUT_ADDRESSES: [u32; 7] = [
    bindings::PERF_COUNT_SW_CPU_CLOCK,
    bindings::PERF_COUNT_SW_TASK_CLOCK,
    bindings::PERF_COUNT_SW_CONTEXT_SWITCHES,
    bindings::PERF_COUNT_SW_CPU_MIGRATIONS,
    bindings::PERF_COUNT_SW_DUMMY,
    bindings::PERF_COUNT_SW_BPF_OUTPUT,
    bindings::PERF_COUNT_SW_CGROUP_SWITCHES,
];

/// Whether `spec`'s samples can carry a data address: precise memory samples and IBS ops, the
/// software faults, and breakpoints (the watched address).
pub fn records_data_addresses(spec: &EventSpec) -> bool {
    match hardware_sampler(spec) {
        HardwareSampler::IbsOp
        | HardwareSampler::Spe
        | HardwareSampler::PebsMemory
        | HardwareSampler::Precise => true,
        HardwareSampler::IbsFetch => false,
        HardwareSampler::Skid => match spec.attr.type_ {
            PERF_TYPE_SOFTWARE => !SOFTWARE_WITHOUT_ADDRESSES
                .iter()
                .any(|&config| u64::from(config) == spec.attr.config),
            bindings::PERF_TYPE_BREAKPOINT => true,
            _ => false,
        },
    }
}

/// Whether `spec` (`pmu/term,term=value/`) names the PMU event `event` among its terms.
fn names_event(spec: &EventSpec, event: &str) -> bool {
    let Some((_, rest)) = spec.name.split_once('/') else {
        return false;
    };
    rest.trim_end_matches('/')
        .split(',')
        .any(|term| term.trim().eq_ignore_ascii_case(event))
}

/// Adjusts `spec` to what its sampler accepts (the PMU, or the kernel's clock timer); returns a
/// notice for each change, for the user, so the periods reports multiply by are the ones the
/// kernel used. Refuses periods the sampler cannot count.
pub fn prepare_sampled_event(spec: &mut EventSpec) -> Result<Vec<String>, EventError> {
    let mut notes = Vec::new();
    if let Some(note) = clock_timer_floor(spec) {
        notes.push(note);
    }
    match hardware_sampler(spec) {
        HardwareSampler::IbsOp | HardwareSampler::IbsFetch => {
            if let Sampling::Period(period) = spec.sampling {
                let rounded = (period.max(1).div_ceil(IBS_PERIOD_UNIT)) * IBS_PERIOD_UNIT;
                if spec.pmu.as_deref() == Some("ibs_fetch") && rounded > IBS_FETCH_MAX_PERIOD {
                    return Err(EventError::InvalidValue {
                        event: spec.text.clone(),
                        term: "period".to_string(),
                        value: period.to_string(),
                        reason: format!(
                            "IBS fetch sampling counts at most {IBS_FETCH_MAX_PERIOD} fetches \
                             (0xffff sixteens) between samples: give a smaller period"
                        ),
                    });
                }
                if rounded != period {
                    notes.push(format!(
                        "{}: IBS counts in sixteens, so the period {period} becomes {rounded}",
                        spec.name
                    ));
                    spec.sampling = Sampling::Period(rounded);
                }
            }
        }
        HardwareSampler::Spe => {
            let period = spe_period(spec)?;
            let pmu = spec.pmu.as_deref().unwrap_or_default();
            let floor = fs::read_to_string(format!(
                "/sys/bus/event_source/devices/{pmu}/caps/min_interval"
            ));
            if let Some(floor) = floor.ok().and_then(|text| text.trim().parse::<u64>().ok()) {
                if period < floor {
                    notes.push(format!(
                        "{}: {pmu} samples at most every {floor} operations (caps/min_interval), \
                         so the period {period} becomes {floor}",
                        spec.name
                    ));
                    spec.sampling = Sampling::Period(floor);
                }
            }
        }
        HardwareSampler::PebsMemory if spec.attr.precise_ip == 0 => {
            spec.attr.precise_ip = PEBS_MEMORY_PRECISE_IP;
            notes.push(format!(
                "{}: sampled precisely (:pp): load latencies and data sources come only in \
                 PEBS records",
                spec.name
            ));
        }
        _ => {}
    }
    Ok(notes)
}

/// The period of an Arm SPE event, which samples every Nth operation and has no frequency mode
/// (`--target-rate` on a launched command, `-F`, `freq=` ask for one).
pub fn spe_period(spec: &EventSpec) -> Result<u64, EventError> {
    match spec.sampling {
        Sampling::Period(period) => Ok(period),
        Sampling::Frequency(_) => Err(EventError::InvalidValue {
            event: spec.text.clone(),
            term: "freq".to_string(),
            value: spec.sampling.to_string(),
            reason: "Arm SPE samples every Nth operation and has no frequency mode: give a \
                     period (e.g. -c 65536 or arm_spe_0/period=65536/)"
                .to_string(),
        }),
    }
}

/// The shortest period of the kernel's clock events (cpu-clock, task-clock) in nanoseconds: their
/// hrtimer is armed with `max(10000, sample_period)` while each sample still reports the period
/// asked for, so a shorter period would make every estimate too small by the difference.
pub const CLOCK_MIN_PERIOD_NS: u64 = 10_000;

/// Whether `spec` is one of the kernel's clock events (cpu-clock, task-clock): it counts the
/// nanoseconds its counter runs, driven by an hrtimer.
pub fn is_clock(spec: &EventSpec) -> bool {
    spec.attr.type_ == PERF_TYPE_SOFTWARE
        && matches!(
            spec.attr.config,
            c if c == u64::from(bindings::PERF_COUNT_SW_CPU_CLOCK)
                || c == u64::from(bindings::PERF_COUNT_SW_TASK_CLOCK)
        )
}

/// Raises a clock event's period (or frequency's period) to the timer's floor, saying so.
fn clock_timer_floor(spec: &mut EventSpec) -> Option<String> {
    if !is_clock(spec) {
        return None;
    }
    let asked = match spec.sampling {
        Sampling::Period(period) if period < CLOCK_MIN_PERIOD_NS => format!("every {period} ns"),
        Sampling::Frequency(hz) if hz > 1_000_000_000 / CLOCK_MIN_PERIOD_NS => format!("{hz} Hz"),
        _ => return None,
    };
    spec.sampling = Sampling::Period(CLOCK_MIN_PERIOD_NS);
    Some(format!(
        "{}: the kernel's clock timer fires at most every {CLOCK_MIN_PERIOD_NS} ns, so sampling \
         every {CLOCK_MIN_PERIOD_NS} ns instead of {asked}",
        spec.name
    ))
}

/// The `sample_type` to open `spec` with when the capture program takes stacks (`stacks`), and
/// a note for each field added beyond the base (IP, TID, ADDR) saying why. Frequency-sampled
/// events also record their period (as perf does): the kernel varies it, and only then.
///
/// With CALLCHAIN set, the caller must also clear `exclude_callchain_user` and
/// `exclude_callchain_kernel`: the kernel refuses stack helpers on precise events otherwise.
pub fn hardware_sample_type(spec: &EventSpec, stacks: bool) -> (u64, Vec<String>) {
    let mut sample_type = BASE_SAMPLE_TYPE;
    if matches!(spec.sampling, Sampling::Frequency(_)) {
        sample_type |= sample::PERIOD;
    }
    let mut notes = Vec::new();
    if spec.precise() && stacks {
        sample_type |= sample::CALLCHAIN;
        notes.push(format!(
            "{}: callchains sampled: the kernel lets a precise event's program take stacks only \
             then",
            spec.name
        ));
    }
    match hardware_sampler(spec) {
        HardwareSampler::IbsOp => {
            sample_type |= sample::RAW | MEMORY_SAMPLE_TYPE;
            notes.push(format!(
                "{}: IBS op registers (raw) and the data address, latency and source the kernel \
                 decodes from them",
                spec.name
            ));
        }
        HardwareSampler::IbsFetch => {
            sample_type |= sample::RAW;
            notes.push(format!("{}: IBS fetch registers (raw)", spec.name));
        }
        HardwareSampler::PebsMemory | HardwareSampler::Precise => {
            sample_type |= MEMORY_SAMPLE_TYPE;
            notes.push(format!(
                "{}: data address, latency (weight) and data source of precise samples",
                spec.name
            ));
        }
        // Its records come through the AUX area (`capture::aux_trace`), not samples.
        HardwareSampler::Spe => notes.push(format!(
            "{}: Arm SPE records (PC, data addresses, latencies, data source, events) read from \
             the AUX area",
            spec.name
        )),
        HardwareSampler::Skid => {}
    }
    (sample_type, notes)
}

/// What the capture program decodes from PERF_SAMPLE_RAW: the IBS op and fetch events among
/// `specs` (by index), and the errata of the CPU (`cpu`, from [`cpu_identity`]).
pub fn raw_decoding(specs: &[EventSpec], cpu: Option<&CpuIdentity>) -> RawDecoding {
    let of = |sampler: HardwareSampler| {
        specs
            .iter()
            .enumerate()
            .filter(move |(_, spec)| hardware_sampler(spec) == sampler)
            .map(|(index, _)| index as u32)
    };
    RawDecoding::new(
        of(HardwareSampler::IbsOp),
        of(HardwareSampler::IbsFetch),
        ibs_errata(cpu),
    )
}

/// Whether an event's sampled IPs are the instructions that caused its events: precise events,
/// and IBS, which tags the instruction itself whatever `precise_ip` says.
pub fn exact_ip(spec: &EventSpec) -> bool {
    spec.precise()
        || matches!(
            hardware_sampler(spec),
            HardwareSampler::IbsOp | HardwareSampler::IbsFetch | HardwareSampler::Spe
        )
}

/// Whether any of `specs` samples a latency (load latency, IBS op latencies).
pub fn samples_latency(specs: &[EventSpec]) -> bool {
    specs.iter().any(|spec| {
        hardware_sample_type(spec, false).0 & sample::WEIGHT_STRUCT != 0
            || matches!(
                hardware_sampler(spec),
                HardwareSampler::IbsOp | HardwareSampler::Spe
            )
    })
}

/// The IBS errata of a CPU; none for CPUs that are not AMD's.
pub fn ibs_errata(cpu: Option<&CpuIdentity>) -> IbsErrata {
    match cpu {
        Some(cpu) if cpu.vendor == "AuthenticAMD" => IbsErrata::for_cpu(cpu.family, cpu.model),
        _ => IbsErrata::default(),
    }
}

/// The running CPU's vendor, family and model, from /proc/cpuinfo (x86 only).
pub fn cpu_identity() -> Option<CpuIdentity> {
    parse_cpuinfo(&fs::read_to_string("/proc/cpuinfo").ok()?)
}

/// Vendor, family and model of the first processor in /proc/cpuinfo text.
pub fn parse_cpuinfo(text: &str) -> Option<CpuIdentity> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim())
        })
    };
    Some(CpuIdentity {
        vendor: field("vendor_id")?.to_string(),
        family: field("cpu family")?.parse().ok()?,
        model: field("model")?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::pmu::tests::sysfs_fixture;
    use crate::events::{parse_event, PmuRegistry};

    /// An AMD Zen 5 machine's IBS PMUs beside an Intel-like core PMU.
    fn registry() -> PmuRegistry {
        let root = sysfs_fixture(&[
            ("cpu/type", "4"),
            ("cpu/format/event", "config:0-7"),
            ("cpu/format/umask", "config:8-15"),
            ("cpu/format/ldlat", "config1:0-15"),
            ("cpu/events/mem-loads", "event=0xcd,umask=0x1,ldlat=3"),
            ("cpu/events/mem-stores", "event=0xd0,umask=0x82"),
            ("cpu/caps/max_precise", "3"),
            ("ibs_op/type", "11"),
            ("ibs_op/format/cnt_ctl", "config:19"),
            ("ibs_op/format/l3missonly", "config:16"),
            ("ibs_op/format/ldlat", "config1:0-11"),
            ("ibs_fetch/type", "12"),
            ("ibs_fetch/format/rand_en", "config:57"),
            ("ibs_fetch/format/l3missonly", "config:59"),
            ("software/type", "1"),
            ("arm_spe_0/type", "9"),
            ("arm_spe_0/format/ts_enable", "config:0"),
        ]);
        PmuRegistry::from_sysfs(root.path()).expect("fixture parses")
    }

    fn spec(text: &str) -> EventSpec {
        parse_event(text, &registry()).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn prepared(text: &str) -> (EventSpec, Vec<String>) {
        let mut spec = spec(text);
        let notes = prepare_sampled_event(&mut spec).unwrap_or_else(|e| panic!("{text}: {e}"));
        (spec, notes)
    }

    const BASE: u64 = sample::IP | sample::TID | sample::ADDR;
    const MEMORY: u64 = sample::ADDR | sample::WEIGHT_STRUCT | sample::DATA_SRC | sample::PHYS_ADDR;

    #[test]
    fn sample_type_bits_are_the_kernels() {
        assert_eq!(
            (
                sample::ADDR,
                sample::CALLCHAIN,
                sample::RAW,
                sample::DATA_SRC
            ),
            (1 << 3, 1 << 5, 1 << 10, 1 << 15)
        );
        assert_eq!(
            (sample::PHYS_ADDR, sample::WEIGHT_STRUCT),
            (1 << 19, 1 << 24)
        );
    }

    /// The side-band asks for data mappings only when some event's samples can land in them.
    #[test]
    fn only_faults_breakpoints_and_memory_samples_record_data_addresses() {
        for clock_or_switch in [
            "cpu-clock",
            "task-clock",
            "context-switches",
            "cpu-migrations",
            "ibs_fetch//",
        ] {
            assert!(
                !records_data_addresses(&spec(clock_or_switch)),
                "{clock_or_switch}"
            );
        }
        for with_address in [
            "page-faults",
            "minor-faults",
            "major-faults",
            "mem-loads",
            "ibs_op//",
            "cpu/event=0x3c/pp",
        ] {
            assert!(
                records_data_addresses(&spec(with_address)),
                "{with_address}"
            );
        }
    }

    #[test]
    fn precise_level_comes_from_the_modifiers_and_callchains_follow_it_with_stacks() {
        let cycles = spec("cpu/event=0x3c/pp");
        assert_eq!(cycles.attr.precise_ip, 2);
        assert_eq!(hardware_sampler(&cycles), HardwareSampler::Precise);
        let (with_stacks, notes) = hardware_sample_type(&cycles, true);
        assert_eq!(with_stacks, BASE | sample::CALLCHAIN | MEMORY);
        assert!(notes[0].contains("callchains sampled"), "{notes:?}");
        let (without_stacks, _) = hardware_sample_type(&cycles, false);
        assert_eq!(without_stacks, BASE | MEMORY);
    }

    #[test]
    fn skidding_events_take_the_base_fields_only() {
        let plain = spec("cpu/event=0x3c/");
        assert_eq!(hardware_sampler(&plain), HardwareSampler::Skid);
        assert_eq!(hardware_sample_type(&plain, true), (BASE, Vec::new()));
        assert_eq!(hardware_sample_type(&spec("page-faults"), true).0, BASE);
    }

    #[test]
    fn clock_periods_below_the_kernels_timer_floor_are_raised_and_said() {
        let (clock, notes) = prepared("cpu-clock/period=1/");
        assert_eq!(clock.sampling, Sampling::Period(CLOCK_MIN_PERIOD_NS));
        assert!(
            notes[0].contains("every 10000 ns instead of every 1 ns"),
            "{notes:?}"
        );
        let (fast, notes) = prepared("task-clock/freq=200000/");
        assert_eq!(fast.sampling, Sampling::Period(CLOCK_MIN_PERIOD_NS));
        assert!(notes[0].contains("instead of 200000 Hz"), "{notes:?}");
        for kept in [
            "cpu-clock/period=10000/",
            "cpu-clock/freq=100000/",
            "page-faults/period=1/",
        ] {
            let (spec, notes) = prepared(kept);
            assert!(notes.is_empty(), "{kept}: {notes:?}");
            assert_eq!(spec.sampling, self::spec(kept).sampling, "{kept}");
        }
    }

    #[test]
    fn only_frequency_sampling_records_periods() {
        // With PERIOD, the kernel samples every software event whatever the period.
        for text in [
            "page-faults/period=1000/",
            "context-switches/period=7/",
            "minor-faults",
            // Hardware, raw, IBS and PEBS events in period mode: the PMU counts the period down,
            // and the program reads it from the sample data without the bit.
            "cycles",
            "cpu/event=0x3c/",
            "ibs_op/period=160000/",
            "ibs_fetch//",
            "cpu/mem-loads,ldlat=30/",
        ] {
            let (sample_type, _) = hardware_sample_type(&spec(text), true);
            assert_eq!(sample_type & sample::PERIOD, 0, "{text}");
        }
        for text in ["page-faults/freq=100/", "cpu-clock/freq=999/"] {
            let (sample_type, _) = hardware_sample_type(&spec(text), true);
            assert_eq!(sample_type, BASE | sample::PERIOD, "{text}");
        }
    }

    #[test]
    fn ibs_events_use_their_sysfs_type_and_format_and_sample_raw() {
        let op = spec("ibs_op/cnt_ctl=1,l3missonly=1,ldlat=128/");
        assert_eq!(op.attr.type_, 11);
        assert_eq!(op.attr.config, (1 << 19) | (1 << 16));
        assert_eq!(op.attr.config1, 128);
        assert_eq!(hardware_sampler(&op), HardwareSampler::IbsOp);
        let (sample_type, notes) = hardware_sample_type(&op, true);
        assert_eq!(
            sample_type,
            BASE | sample::RAW | MEMORY,
            "IBS is not precise_ip: no CALLCHAIN"
        );
        assert!(notes[0].contains("IBS op registers"), "{notes:?}");

        let fetch = spec("ibs_fetch/rand_en=1,l3missonly=1/");
        assert_eq!(
            (fetch.attr.type_, fetch.attr.config),
            (12, (1 << 57) | (1 << 59))
        );
        assert_eq!(hardware_sample_type(&fetch, false).0, BASE | sample::RAW);
    }

    #[test]
    fn ibs_periods_round_up_to_sixteens_with_a_notice() {
        let (op, notes) = prepared("ibs_op/period=100001/");
        assert_eq!(op.sampling, Sampling::Period(100_016));
        assert_eq!(notes, ["ibs_op/period=100001/: IBS counts in sixteens, so the period 100001 becomes 100016"]);
        let (exact, notes) = prepared("ibs_op/period=160000/");
        assert_eq!(
            (exact.sampling, notes.len()),
            (Sampling::Period(160_000), 0)
        );
        let (tiny, _) = prepared("ibs_fetch/period=3/");
        assert_eq!(tiny.sampling, Sampling::Period(16));
        // The default is already a multiple of 16.
        assert!(prepared("ibs_op//").1.is_empty());
        // Frequencies are the kernel's to turn into periods.
        assert!(prepared("ibs_op/freq=1000/").1.is_empty());

        let mut too_long = spec("ibs_fetch/period=2000000/");
        let err = prepare_sampled_event(&mut too_long)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 1048560 fetches"), "{err}");
        assert!(
            prepared("ibs_op/period=2000000/").1.is_empty(),
            "ops count further"
        );
    }

    #[test]
    fn pebs_memory_events_set_ldlat_and_become_precise() {
        let (loads, notes) = prepared("cpu/mem-loads,ldlat=30/");
        assert_eq!(loads.attr.config, 0xcd | (0x1 << 8));
        assert_eq!(loads.attr.config1, 30, "ldlat is config1");
        assert_eq!(loads.attr.precise_ip, 2);
        assert!(notes[0].contains("only in PEBS records"), "{notes:?}");
        assert_eq!(hardware_sampler(&loads), HardwareSampler::PebsMemory);
        assert_eq!(
            hardware_sample_type(&loads, true).0,
            BASE | sample::CALLCHAIN | MEMORY
        );

        let (stores, _) = prepared("cpu/mem-stores/");
        assert_eq!(
            (stores.attr.config, stores.attr.precise_ip),
            (0xd0 | (0x82 << 8), 2)
        );
        assert_eq!(hardware_sample_type(&stores, false).0, BASE | MEMORY);

        // A precise level the user chose is kept.
        let (chosen, notes) = prepared("cpu/mem-loads/p");
        assert_eq!((chosen.attr.precise_ip, notes.len()), (1, 0));
    }

    #[test]
    fn raw_decoding_marks_ibs_events_and_the_cpus_errata() {
        let specs = [
            spec("cycles"),
            spec("ibs_op//"),
            spec("ibs_fetch//"),
            spec("ibs_op/cnt_ctl=1/"),
        ];
        let zen3 = CpuIdentity {
            vendor: "AuthenticAMD".into(),
            family: 0x19,
            model: 0x01,
        };
        let decoding = raw_decoding(&specs, Some(&zen3));
        assert_eq!(decoding.ibs_op_events, 0b1010);
        assert_eq!(decoding.ibs_fetch_events, 0b0100);
        assert_eq!(decoding.errata(), IbsErrata::for_cpu(0x19, 0x01));
        let intel = CpuIdentity {
            vendor: "GenuineIntel".into(),
            family: 0x19,
            model: 0x01,
        };
        assert_eq!(
            raw_decoding(&specs, Some(&intel)).errata(),
            IbsErrata::default()
        );
        assert_eq!(raw_decoding(&specs, None).ibs_errata, 0);
    }

    #[test]
    fn spe_samples_by_period_only_with_exact_ips_data_addresses_and_latencies() {
        let (spe, notes) = prepared("arm_spe_0//");
        assert_eq!(hardware_sampler(&spe), HardwareSampler::Spe);
        assert!(exact_ip(&spe) && records_data_addresses(&spe));
        assert!(samples_latency(std::slice::from_ref(&spe)));
        assert_eq!(spe.sampling, Sampling::Period(65_536));
        assert!(notes.is_empty(), "{notes:?}");
        // No program runs on its records: no sample fields are asked of the kernel.
        assert_eq!(hardware_sample_type(&spe, true).0, BASE_SAMPLE_TYPE);
        let mut by_frequency = spec("arm_spe_0/freq=1000/");
        let err = prepare_sampled_event(&mut by_frequency)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("has no frequency mode: give a period"),
            "{err}"
        );
    }

    #[test]
    fn ibs_and_precise_events_have_exact_ips() {
        assert!(exact_ip(&spec("ibs_op//")) && exact_ip(&spec("ibs_fetch//")));
        assert!(exact_ip(&spec("cycles:pp")));
        assert!(!exact_ip(&spec("cycles")) && !exact_ip(&spec("cpu/mem-stores/")));
    }

    #[test]
    fn only_memory_and_ibs_op_samplers_carry_latencies() {
        assert!(!samples_latency(&[spec("cycles"), spec("ibs_fetch//")]));
        assert!(samples_latency(&[spec("cycles"), spec("ibs_op//")]));
        assert!(samples_latency(&[spec("cpu/mem-loads,ldlat=30/pp")]));
    }

    #[test]
    fn cpuinfo_gives_vendor_family_and_model() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\
                    model name\t: AMD EPYC 9654 96-Core Processor\n\nprocessor\t: 1\n";
        assert_eq!(
            parse_cpuinfo(text),
            Some(CpuIdentity {
                vendor: "AuthenticAMD".into(),
                family: 25,
                model: 17
            })
        );
        assert_eq!(
            parse_cpuinfo("processor : 0\nCPU implementer : 0x41\n"),
            None
        );
    }

    /// The IBS decoding and register streaming in the capture program run only for IBS op and
    /// fetch events, which this machine may lack; loading the program with them declared makes
    /// the verifier check those paths (it prunes branches on read-only globals), with and
    /// without errata. Needs root and BTF.
    #[test]
    fn ibs_decoding_in_the_capture_program_passes_the_verifier() {
        use aya::{programs::PerfEvent, EbpfLoader};
        use profiler_common::capture::{
            CaptureConfig, CAPTURE_DATA_SOURCES, CAPTURE_EVENT_IDS, CAPTURE_KERNEL_STACKS,
            CAPTURE_RAW, CAPTURE_USER_STACKS,
        };

        static PROGRAM_OBJECT: &[u8] =
            aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler.bpf.o"));
        let offsets = crate::capture::btf::Btf::from_sys_fs()
            .and_then(|btf| btf.kernel_offsets())
            .unwrap_or_else(|e| panic!("this test needs the kernel's BTF: {e}"));
        let config = CaptureConfig {
            offsets,
            flags: CAPTURE_USER_STACKS
                | CAPTURE_KERNEL_STACKS
                | CAPTURE_RAW
                | CAPTURE_EVENT_IDS
                | CAPTURE_DATA_SOURCES,
            ..CaptureConfig::EMPTY
        };
        for errata in [IbsErrata::default(), IbsErrata::for_cpu(0x19, 0x01)] {
            let decoding = RawDecoding::new([0, 2], [1], errata);
            let mut ebpf = EbpfLoader::new()
                .override_global("CAPTURE_CONFIG", &config, true)
                .override_global("RAW_DECODING", &decoding, true)
                .load(PROGRAM_OBJECT)
                .unwrap_or_else(|e| panic!("loading the capture program (as root?): {e}"));
            let program: &mut PerfEvent = ebpf
                .program_mut("on_overflow")
                .expect("the capture program")
                .try_into()
                .expect("a perf_event program");
            program
                .load()
                .unwrap_or_else(|e| panic!("the verifier refused the IBS decoding: {e:?}"));
        }
    }
}
