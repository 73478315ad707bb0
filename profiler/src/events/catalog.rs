//! The counter catalog: the kernel's generic hardware, hardware-cache and software events, and
//! the short counter names of Oracle Studio's `collect -h` (`insts`, `icm`, `dcrm`, ...) mapped to
//! the Linux event that counts the same thing. Each event has a default overflow value, the unit
//! its counts are in, and a description.
//!
//! Default overflow values are prime so that sampling does not lock onto a loop whose trip count
//! divides the period:
//! - cycle- and instruction-like counters: every 9,999,991 events (a few hundred samples per
//!   second per busy CPU at GHz rates);
//! - references (loads, stores, branches, cache references): every 1,000,003;
//! - misses: every 100,003;
//! - `cpu-clock` and `task-clock`: 997 samples per second, a prime rate, so that sampling does not
//!   run in step with the 100/250/1000 Hz timer tick and the work scheduled on it;
//! - frequent software events (page faults, context switches): every 101st, which keeps the
//!   profiler's cost near 1% of the events' own cost even in fault or switch storms (give
//!   `/period=1/` to see every one);
//! - rare software events (major faults, migrations, alignment and emulation faults): every one;
//! - raw and PMU events the catalog does not know: every 1,000,003 ([`UNKNOWN_EVENT_PERIOD`]);
//!   AMD IBS: [`IBS_PERIOD`]; Arm SPE: [`SPE_PERIOD`].

use std::sync::OnceLock;

use super::sampling::Sampling;

/// Linux's generic event types (`perf_event_attr.type`).
pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_HW_CACHE: u32 = 3;
pub const PERF_TYPE_RAW: u32 = 4;

const CYCLE_PERIOD: Sampling = Sampling::Period(9_999_991);
const REFERENCE_PERIOD: Sampling = Sampling::Period(1_000_003);
const MISS_PERIOD: Sampling = Sampling::Period(100_003);
const CLOCK_FREQUENCY: Sampling = Sampling::Frequency(997);
const FREQUENT_SOFTWARE_PERIOD: Sampling = Sampling::Period(101);
const EVERY_EVENT: Sampling = Sampling::Period(1);

/// The default for events the catalog knows nothing about (raw and PMU events): between the
/// miss and the cycle rates, so a cycle-like raw event samples a few thousand times a second.
pub const UNKNOWN_EVENT_PERIOD: Sampling = REFERENCE_PERIOD;

/// AMD IBS counts in sixteens (the low 4 bits of its period must be zero) and its 16-bit
/// max-count field holds at most 0xffff sixteens on older parts, so its default period is 16 times
/// a prime (62,501) rather than a prime: about 3,000 samples per second of a 3 GHz CPU.
pub const IBS_PERIOD: Sampling = Sampling::Period(16 * 62_501);

/// Arm SPE samples one operation in every period (the kernel raises shorter periods to the
/// PMU's `caps/min_interval`, a few hundred to a few thousand). Each record is 40 to 64 bytes
/// of trace: every 65,536th operation of a CPU retiring 3 billion a second writes about 3 MB/s,
/// which the profiler's AUX buffers hold between two reads.
pub const SPE_PERIOD: Sampling = Sampling::Period(65_536);

/// The unit of a counter's counts (Oracle's "units" column).
pub mod unit {
    pub const CPU_CYCLES: &str = "CPU-cycles";
    pub const EVENTS: &str = "events";
    pub const LOAD_EVENTS: &str = "load events";
    pub const STORE_EVENTS: &str = "store events";
    pub const NANOSECONDS: &str = "nanoseconds";
    /// Operations an Arm SPE event counts between samples.
    pub const OPERATIONS: &str = "operations";
}

/// Which part of `profiler list` an event belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Hardware,
    HardwareCache,
    Software,
}

/// A kernel-defined event.
#[derive(Clone, Debug, PartialEq)]
pub struct CatalogEvent {
    /// The name perf uses, e.g. `L1-dcache-load-misses`.
    pub name: String,
    /// Other names perf accepts for it (`cpu-cycles` for `cycles`).
    pub synonyms: &'static [&'static str],
    pub section: Section,
    pub type_: u32,
    pub config: u64,
    pub default_sampling: Sampling,
    pub unit: &'static str,
    pub description: String,
}

/// An Oracle-style short counter name and the Linux event it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterAlias {
    pub alias: &'static str,
    /// A [`CatalogEvent::name`].
    pub event: &'static str,
    pub description: &'static str,
}

/// The aliased counters, in the order `profiler list` shows them.
pub const COUNTER_ALIASES: &[CounterAlias] = &[
    CounterAlias {
        alias: "cycles",
        event: "cycles",
        description: "CPU cycles",
    },
    CounterAlias {
        alias: "insts",
        event: "instructions",
        description: "Instructions executed (retired)",
    },
    CounterAlias {
        alias: "br",
        event: "branch-instructions",
        description: "Branch instructions retired",
    },
    CounterAlias {
        alias: "brm",
        event: "branch-misses",
        description: "Mispredicted branches",
    },
    CounterAlias {
        alias: "loads",
        event: "L1-dcache-loads",
        description: "Load instructions (L1 D-cache loads)",
    },
    CounterAlias {
        alias: "stores",
        event: "L1-dcache-stores",
        description: "Store instructions (L1 D-cache stores)",
    },
    CounterAlias {
        alias: "icm",
        event: "L1-icache-load-misses",
        description: "L1 I-cache misses",
    },
    CounterAlias {
        alias: "dcrm",
        event: "L1-dcache-load-misses",
        description: "L1 D-cache read misses",
    },
    CounterAlias {
        alias: "dcwm",
        event: "L1-dcache-store-misses",
        description: "L1 D-cache write misses",
    },
    CounterAlias {
        alias: "dtlbm",
        event: "dTLB-load-misses",
        description: "Data TLB misses (loads)",
    },
    CounterAlias {
        alias: "itlbm",
        event: "iTLB-load-misses",
        description: "Instruction TLB misses",
    },
    CounterAlias {
        alias: "ecref",
        event: "cache-references",
        description: "External (last-level) cache references",
    },
    CounterAlias {
        alias: "ecm",
        event: "cache-misses",
        description: "External (last-level) cache misses",
    },
    CounterAlias {
        alias: "ecrm",
        event: "LLC-load-misses",
        description: "External (last-level) cache read misses",
    },
    CounterAlias {
        alias: "ecwm",
        event: "LLC-store-misses",
        description: "External (last-level) cache write misses",
    },
];

struct Generic {
    name: &'static str,
    synonyms: &'static [&'static str],
    config: u64,
    default_sampling: Sampling,
    unit: &'static str,
    description: &'static str,
}

const HARDWARE: &[Generic] = &[
    Generic {
        name: "cycles",
        synonyms: &["cpu-cycles"],
        config: 0,
        default_sampling: CYCLE_PERIOD,
        unit: unit::CPU_CYCLES,
        description: "CPU cycles while not halted",
    },
    Generic {
        name: "instructions",
        synonyms: &[],
        config: 1,
        default_sampling: CYCLE_PERIOD,
        unit: unit::EVENTS,
        description: "Instructions retired",
    },
    Generic {
        name: "cache-references",
        synonyms: &[],
        config: 2,
        default_sampling: REFERENCE_PERIOD,
        unit: unit::EVENTS,
        description: "Last-level cache accesses (the CPU's choice of cache)",
    },
    Generic {
        name: "cache-misses",
        synonyms: &[],
        config: 3,
        default_sampling: MISS_PERIOD,
        unit: unit::EVENTS,
        description: "Last-level cache misses (the CPU's choice of cache)",
    },
    Generic {
        name: "branch-instructions",
        synonyms: &["branches"],
        config: 4,
        default_sampling: REFERENCE_PERIOD,
        unit: unit::EVENTS,
        description: "Branch instructions retired",
    },
    Generic {
        name: "branch-misses",
        synonyms: &[],
        config: 5,
        default_sampling: MISS_PERIOD,
        unit: unit::EVENTS,
        description: "Mispredicted branch instructions",
    },
    Generic {
        name: "bus-cycles",
        synonyms: &[],
        config: 6,
        default_sampling: REFERENCE_PERIOD,
        unit: unit::EVENTS,
        description: "Bus cycles (a fixed-frequency clock on most CPUs)",
    },
    Generic {
        name: "stalled-cycles-frontend",
        synonyms: &["idle-cycles-frontend"],
        config: 7,
        default_sampling: CYCLE_PERIOD,
        unit: unit::CPU_CYCLES,
        description: "Cycles the front end delivered no instructions",
    },
    Generic {
        name: "stalled-cycles-backend",
        synonyms: &["idle-cycles-backend"],
        config: 8,
        default_sampling: CYCLE_PERIOD,
        unit: unit::CPU_CYCLES,
        description: "Cycles the back end executed no instructions",
    },
    Generic {
        name: "ref-cycles",
        synonyms: &[],
        config: 9,
        default_sampling: CYCLE_PERIOD,
        unit: unit::EVENTS,
        description: "Reference cycles: a constant rate, unaffected by frequency scaling",
    },
];

const SOFTWARE: &[Generic] = &[
    Generic {
        name: "cpu-clock",
        synonyms: &[],
        config: 0,
        default_sampling: CLOCK_FREQUENCY,
        unit: unit::NANOSECONDS,
        description: "CPU time, from a high-resolution per-CPU timer",
    },
    Generic {
        name: "task-clock",
        synonyms: &[],
        config: 1,
        default_sampling: CLOCK_FREQUENCY,
        unit: unit::NANOSECONDS,
        description: "CPU time of the profiled tasks",
    },
    Generic {
        name: "page-faults",
        synonyms: &["faults"],
        config: 2,
        default_sampling: FREQUENT_SOFTWARE_PERIOD,
        unit: unit::EVENTS,
        description: "Page faults, minor and major",
    },
    Generic {
        name: "context-switches",
        synonyms: &["cs"],
        config: 3,
        default_sampling: FREQUENT_SOFTWARE_PERIOD,
        unit: unit::EVENTS,
        description: "Context switches",
    },
    Generic {
        name: "cpu-migrations",
        synonyms: &["migrations"],
        config: 4,
        default_sampling: EVERY_EVENT,
        unit: unit::EVENTS,
        description: "Moves of a task to another CPU",
    },
    Generic {
        name: "minor-faults",
        synonyms: &[],
        config: 5,
        default_sampling: FREQUENT_SOFTWARE_PERIOD,
        unit: unit::EVENTS,
        description: "Page faults served without I/O",
    },
    Generic {
        name: "major-faults",
        synonyms: &[],
        config: 6,
        default_sampling: EVERY_EVENT,
        unit: unit::EVENTS,
        description: "Page faults that waited for I/O",
    },
    Generic {
        name: "alignment-faults",
        synonyms: &[],
        config: 7,
        default_sampling: EVERY_EVENT,
        unit: unit::EVENTS,
        description: "Unaligned accesses the kernel fixed up",
    },
    Generic {
        name: "emulation-faults",
        synonyms: &[],
        config: 8,
        default_sampling: EVERY_EVENT,
        unit: unit::EVENTS,
        description: "Instructions the kernel emulated",
    },
    Generic {
        name: "dummy",
        synonyms: &[],
        config: 9,
        default_sampling: EVERY_EVENT,
        unit: unit::EVENTS,
        description: "Counts nothing; a placeholder for side-band records",
    },
    Generic {
        name: "cgroup-switches",
        synonyms: &[],
        config: 11,
        default_sampling: FREQUENT_SOFTWARE_PERIOD,
        unit: unit::EVENTS,
        description: "Context switches between tasks of different cgroups",
    },
];

/// A cache of the kernel's generic cache table (`perf_hw_cache_id`) and the operations perf
/// offers for it.
struct Cache {
    name: &'static str,
    id: u64,
    description: &'static str,
    /// Whether its loads and stores are data accesses (Oracle's "load events").
    data_side: bool,
    ops: &'static [CacheOp],
}

#[derive(Clone, Copy)]
enum CacheOp {
    Load,
    Store,
    Prefetch,
}

const ALL_OPS: &[CacheOp] = &[CacheOp::Load, CacheOp::Store, CacheOp::Prefetch];

const CACHES: &[Cache] = &[
    Cache {
        name: "L1-dcache",
        id: 0,
        description: "L1 data cache",
        data_side: true,
        ops: ALL_OPS,
    },
    Cache {
        name: "L1-icache",
        id: 1,
        description: "L1 instruction cache",
        data_side: false,
        ops: &[CacheOp::Load, CacheOp::Prefetch],
    },
    Cache {
        name: "LLC",
        id: 2,
        description: "Last-level cache",
        data_side: true,
        ops: ALL_OPS,
    },
    Cache {
        name: "dTLB",
        id: 3,
        description: "Data TLB",
        data_side: true,
        ops: ALL_OPS,
    },
    Cache {
        name: "iTLB",
        id: 4,
        description: "Instruction TLB",
        data_side: false,
        ops: &[CacheOp::Load],
    },
    Cache {
        name: "branch",
        id: 5,
        description: "Branch prediction unit",
        data_side: false,
        ops: &[CacheOp::Load],
    },
    Cache {
        name: "node",
        id: 6,
        description: "Local NUMA node memory",
        data_side: true,
        ops: ALL_OPS,
    },
];

impl CacheOp {
    /// `perf_hw_cache_op_id`.
    fn id(self) -> u64 {
        match self {
            CacheOp::Load => 0,
            CacheOp::Store => 1,
            CacheOp::Prefetch => 2,
        }
    }

    /// The access and miss suffixes perf's names use.
    fn suffixes(self) -> (&'static str, &'static str) {
        match self {
            CacheOp::Load => ("loads", "load-misses"),
            CacheOp::Store => ("stores", "store-misses"),
            CacheOp::Prefetch => ("prefetches", "prefetch-misses"),
        }
    }

    fn unit(self, data_side: bool) -> &'static str {
        match (self, data_side) {
            (CacheOp::Load, true) => unit::LOAD_EVENTS,
            (CacheOp::Store, true) => unit::STORE_EVENTS,
            _ => unit::EVENTS,
        }
    }
}

/// `perf_hw_cache_op_result_id`.
const CACHE_RESULT_ACCESS: u64 = 0;
const CACHE_RESULT_MISS: u64 = 1;

/// Every kernel-defined event, hardware first, then hardware cache, then software.
pub fn events() -> &'static [CatalogEvent] {
    static EVENTS: OnceLock<Vec<CatalogEvent>> = OnceLock::new();
    EVENTS.get_or_init(|| {
        let generic = |section, type_, table: &[Generic]| {
            table
                .iter()
                .map(|event| CatalogEvent {
                    name: event.name.to_string(),
                    synonyms: event.synonyms,
                    section,
                    type_,
                    config: event.config,
                    default_sampling: event.default_sampling,
                    unit: event.unit,
                    description: event.description.to_string(),
                })
                .collect::<Vec<_>>()
        };
        let mut events = generic(Section::Hardware, PERF_TYPE_HARDWARE, HARDWARE);
        for cache in CACHES {
            for &op in cache.ops {
                let (access, miss) = op.suffixes();
                for (suffix, result, sampling) in [
                    (access, CACHE_RESULT_ACCESS, REFERENCE_PERIOD),
                    (miss, CACHE_RESULT_MISS, MISS_PERIOD),
                ] {
                    events.push(CatalogEvent {
                        name: format!("{}-{suffix}", cache.name),
                        synonyms: &[],
                        section: Section::HardwareCache,
                        type_: PERF_TYPE_HW_CACHE,
                        config: cache.id | (op.id() << 8) | (result << 16),
                        default_sampling: sampling,
                        unit: op.unit(cache.data_side),
                        description: format!("{}: {}", cache.description, suffix.replace('-', " ")),
                    });
                }
            }
        }
        events.extend(generic(Section::Software, PERF_TYPE_SOFTWARE, SOFTWARE));
        events
    })
}

/// A name resolved against the catalog.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved {
    pub event: &'static CatalogEvent,
    /// Set when the name was an Oracle-style counter alias.
    pub alias: Option<&'static CounterAlias>,
}

/// Finds an event by name, synonym or counter alias, ignoring case as perf does.
pub fn lookup(name: &str) -> Option<Resolved> {
    let by_name = |wanted: &str| {
        events().iter().find(|event| {
            event.name.eq_ignore_ascii_case(wanted)
                || event
                    .synonyms
                    .iter()
                    .any(|synonym| synonym.eq_ignore_ascii_case(wanted))
        })
    };
    if let Some(event) = by_name(name) {
        return Some(Resolved { event, alias: None });
    }
    let alias = COUNTER_ALIASES
        .iter()
        .find(|alias| alias.alias.eq_ignore_ascii_case(name))?;
    let event = by_name(alias.event)?;
    Some(Resolved {
        event,
        alias: Some(alias),
    })
}

/// Every name the catalog accepts: names, synonyms and counter aliases.
pub fn all_names() -> impl Iterator<Item = &'static str> {
    events()
        .iter()
        .flat_map(|event| {
            std::iter::once(event.name.as_str()).chain(event.synonyms.iter().copied())
        })
        .chain(COUNTER_ALIASES.iter().map(|alias| alias.alias))
}

/// The names, synonyms and counter aliases that stand for `event`, other than its own name.
pub fn other_names(event: &CatalogEvent) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = event.synonyms.to_vec();
    names.extend(
        COUNTER_ALIASES
            .iter()
            .filter(|alias| alias.event == event.name && alias.alias != event.name)
            .map(|alias| alias.alias),
    );
    names
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn is_prime(n: u64) -> bool {
        n >= 2
            && (2..)
                .take_while(|d| d * d <= n)
                .all(|d| !n.is_multiple_of(d))
    }

    #[test]
    fn every_alias_names_a_catalog_event_with_the_documented_overflow() {
        for alias in COUNTER_ALIASES {
            let resolved = lookup(alias.alias).unwrap_or_else(|| panic!("{}", alias.alias));
            assert_eq!(resolved.event.name, alias.event);
        }
        let period = |name: &str| lookup(name).unwrap().event.default_sampling;
        assert_eq!(period("cycles"), Sampling::Period(9_999_991));
        assert_eq!(period("insts"), Sampling::Period(9_999_991));
        assert_eq!(period("icm"), Sampling::Period(100_003));
        assert_eq!(period("dcrm"), Sampling::Period(100_003));
        assert_eq!(period("dcwm"), Sampling::Period(100_003));
        assert_eq!(period("dtlbm"), Sampling::Period(100_003));
        assert_eq!(period("itlbm"), Sampling::Period(100_003));
        assert_eq!(period("ecref"), Sampling::Period(1_000_003));
        assert_eq!(period("ecm"), Sampling::Period(100_003));
        assert_eq!(period("cpu-clock"), Sampling::Frequency(997));
    }

    #[test]
    fn default_overflow_values_are_prime_except_every_event() {
        for event in events() {
            let value = match event.default_sampling {
                Sampling::Period(value) | Sampling::Frequency(value) => value,
            };
            assert!(value == 1 || is_prime(value), "{}: {value}", event.name);
        }
    }

    #[test]
    fn names_are_unique_across_events_synonyms_and_aliases() {
        let mut seen = HashSet::new();
        for name in events().iter().flat_map(|event| {
            std::iter::once(event.name.as_str()).chain(event.synonyms.iter().copied())
        }) {
            assert!(seen.insert(name.to_ascii_lowercase()), "{name} twice");
        }
        for alias in COUNTER_ALIASES {
            // An alias may repeat its own event's name (`cycles`), never another event's.
            let clash = lookup(alias.alias).unwrap().event.name != alias.event;
            assert!(!clash, "alias {} shadows another event", alias.alias);
        }
    }

    #[test]
    fn cache_events_encode_id_op_and_result() {
        let config = |name: &str| {
            let event = lookup(name).unwrap().event;
            assert_eq!(event.type_, PERF_TYPE_HW_CACHE);
            event.config
        };
        assert_eq!(config("L1-dcache-loads"), 0);
        assert_eq!(config("L1-dcache-load-misses"), 0x1_00_00);
        assert_eq!(config("L1-dcache-stores"), 0x0_01_00);
        assert_eq!(config("L1-icache-load-misses"), 0x1_00_01);
        assert_eq!(config("LLC-loads"), 0x0_00_02);
        assert_eq!(config("LLC-store-misses"), 0x1_01_02);
        assert_eq!(config("dTLB-load-misses"), 0x1_00_03);
        assert_eq!(config("iTLB-load-misses"), 0x1_00_04);
        assert_eq!(config("branch-load-misses"), 0x1_00_05);
        assert_eq!(config("node-prefetch-misses"), 0x1_02_06);
        // perf offers 32 cache events: L1d 6, L1i 4, LLC 6, dTLB 6, iTLB 2, branch 2, node 6.
        let cache_events = events()
            .iter()
            .filter(|event| event.section == Section::HardwareCache)
            .count();
        assert_eq!(cache_events, 32);
        assert_eq!(
            lookup("L1-dcache-loads").unwrap().event.unit,
            unit::LOAD_EVENTS
        );
        assert_eq!(lookup("iTLB-loads").unwrap().event.unit, unit::EVENTS);
    }

    #[test]
    fn lookup_ignores_case_and_knows_synonyms() {
        assert_eq!(lookup("CPU-CYCLES").unwrap().event.name, "cycles");
        assert_eq!(lookup("cs").unwrap().event.name, "context-switches");
        assert_eq!(lookup("faults").unwrap().event.config, 2);
        let insts = lookup("insts").unwrap();
        assert_eq!(insts.event.name, "instructions");
        assert_eq!(
            insts.alias.unwrap().description,
            "Instructions executed (retired)"
        );
        assert!(lookup("cycels").is_none());
        assert_eq!(
            other_names(lookup("cycles").unwrap().event),
            vec!["cpu-cycles"]
        );
        assert_eq!(
            other_names(lookup("branch-instructions").unwrap().event),
            vec!["branches", "br"]
        );
    }
}
