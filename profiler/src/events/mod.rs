//! What to sample or count: event specifications as users write them (perf, Oracle `collect -h`
//! and HP Caliper styles), parsed into one [`EventSpec`] type; the catalog of known counters;
//! this machine's PMUs from sysfs; probing whether an event opens here and explaining why not;
//! and the data behind `profiler list`.

pub mod catalog;
pub mod count;
pub mod list;
pub mod pmu;
pub mod probe;
pub mod sampling;
pub mod spec;

pub use list::run_list;
pub use pmu::PmuRegistry;
pub use probe::{open_error, probe, Availability, OpenAs, Scope, SystemFacts};
pub use sampling::Sampling;
pub use spec::{
    override_sampling, parse_event, parse_event_list, EventAttr, EventSpec, SamplingOrigin,
};

/// Why an event specification cannot be used. Every message names the offending text and says
/// what to write instead.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EventError {
    #[error(
        "no event given: name at least one, e.g. `-e cycles` (`profiler list` shows all events)"
    )]
    EmptyList,

    #[error("malformed event '{text}': {reason}")]
    Malformed { text: String, reason: String },

    #[error(
        "unknown event '{name}'.{} Run `profiler list` to see all events.",
        did_you_mean(suggestions)
    )]
    UnknownEvent {
        name: String,
        suggestions: Vec<String>,
    },

    #[error(
        "'{name}' is an event of several PMUs; write one of: {}",
        candidates.join(", ")
    )]
    AmbiguousEvent {
        name: String,
        candidates: Vec<String>,
    },

    #[error(
        "{pmu}: no such PMU on this machine ({}this machine has: {}). \
         Run `profiler list` to see all events.",
        pmu_hint(pmu),
        available.join(", ")
    )]
    UnknownPmu { pmu: String, available: Vec<String> },

    #[error(
        "unknown term '{term}' in '{event}'.{} Terms accepted here: {}.",
        did_you_mean(suggestions),
        valid.join(", ")
    )]
    UnknownTerm {
        event: String,
        term: String,
        valid: Vec<String>,
        suggestions: Vec<String>,
    },

    #[error(
        "{term}={value:#x} in '{event}' does not fit its field {field} ({width} bits): \
         the largest value is {max:#x}"
    )]
    ValueTooLarge {
        event: String,
        term: String,
        value: u64,
        field: String,
        width: u32,
        max: u64,
    },

    #[error("invalid value '{value}' for '{term}' in '{event}': {reason}")]
    InvalidValue {
        event: String,
        term: String,
        value: String,
        reason: String,
    },

    #[error(
        "invalid modifier ':{modifiers}' on '{event}': {reason}. Modifiers are u (user), \
         k (kernel), h (hypervisor) and p, pp, ppp (precise), e.g. cycles:upp"
    )]
    BadModifier {
        event: String,
        modifiers: String,
        reason: String,
    },

    #[error("conflicting settings in '{event}': {reason}")]
    Conflict { event: String, reason: String },

    #[error("'{event}' needs a value for '{parameter}': write e.g. {example}")]
    MissingParameter {
        event: String,
        parameter: String,
        example: String,
    },

    #[error("the kernel's definition of '{event}' ('{definition}') cannot be used: {reason}")]
    BadSysfsEvent {
        event: String,
        definition: String,
        reason: String,
    },

    #[error("cannot open event '{event}': {reason}")]
    Unavailable { event: String, reason: String },
}

fn did_you_mean(suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        String::new()
    } else {
        format!(" Did you mean: {}?", suggestions.join(", "))
    }
}

fn pmu_hint(pmu: &str) -> String {
    pmu_requirement(pmu).map_or(String::new(), |requirement| format!("{requirement}; "))
}

/// What a well-known PMU needs from the machine, to say why it is missing.
pub fn pmu_requirement(pmu: &str) -> Option<&'static str> {
    if pmu.starts_with("ibs_") {
        Some("AMD IBS needs an AMD CPU and a host kernel")
    } else if pmu.starts_with("arm_spe") {
        Some(
            "Arm SPE needs an Arm CPU with the Statistical Profiling Extension (Neoverse N1 and \
             later), the kernel's arm_spe_pmu driver and a host kernel",
        )
    } else {
        None
    }
}
