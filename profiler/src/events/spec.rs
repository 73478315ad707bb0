//! Event specifications: the text users give to `-e` turned into [`EventSpec`], the one type the
//! recorder, `stat` and `list` use.
//!
//! Accepted forms, comma separated:
//! - catalog names: `cycles`, `L1-dcache-load-misses`, `page-faults`, Oracle aliases (`icm`);
//! - raw core PMU events: `r01c2` (hex `config`);
//! - any sysfs PMU: `pmu/term=value,.../` with the PMU's format terms, `config`..`config3`, or
//!   the PMU's named events (`cpu/mem-loads,ldlat=30/`), plus `ibs_op//`, `ibs_fetch//`;
//! - a PMU's named event on its own (`tsc` for `msr/tsc/`) when one PMU names it;
//! - modifiers after `:` (or after the closing `/`): `u`, `k`, `h` restrict counting to those
//!   privilege levels (`:uk` counts both), `p`, `pp`, `ppp` ask for precise sampling;
//! - overflow per event: `/period=N/`, `/freq=HZ/` (also `cpu-clock/period=N/`), or Oracle's
//!   `name,N`, where a bare number after an event is that event's overflow value;
//! - `/name=LABEL/` to choose the name reports show.
//!
//! Overflow precedence, as in perf: the event's own value, then a global `-c`/`-s`/`--freq`
//! value ([`override_sampling`]), then the catalog default.

use perf_event_open_sys::bindings::perf_event_attr;
use serde::Serialize;

use super::catalog::{self, PERF_TYPE_RAW, UNKNOWN_EVENT_PERIOD};
use super::pmu::{ConfigWord, Pmu, PmuRegistry};
use super::sampling::Sampling;
use super::EventError;

/// Where an event's [`Sampling`] came from, so reports can say so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplingOrigin {
    /// The catalog's default for the event.
    Default,
    /// Given in the event's own spec.
    Spec,
    /// A global `-c N` / `-s N` / `--freq HZ`.
    Override,
}

/// The event-identity part of `perf_event_attr`: which counter, and at which privilege levels
/// and precision it counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventAttr {
    pub type_: u32,
    pub config: u64,
    pub config1: u64,
    pub config2: u64,
    pub config3: u64,
    pub exclude_user: bool,
    pub exclude_kernel: bool,
    pub exclude_hv: bool,
    /// 0 arbitrary skid, 1 constant skid, 2 zero skid requested, 3 zero skid required.
    pub precise_ip: u8,
}

impl EventAttr {
    /// Sets type, config words, exclude bits and precise_ip; leaves scope, sampling and
    /// sample_type to the caller.
    pub fn apply(&self, attr: &mut perf_event_attr) {
        attr.type_ = self.type_;
        attr.config = self.config;
        attr.config1 = self.config1;
        attr.config2 = self.config2;
        attr.config3 = self.config3;
        attr.set_exclude_user(self.exclude_user.into());
        attr.set_exclude_kernel(self.exclude_kernel.into());
        attr.set_exclude_hv(self.exclude_hv.into());
        attr.set_precise_ip(self.precise_ip.into());
    }

    pub fn word(&self, word: ConfigWord) -> u64 {
        match word {
            ConfigWord::Config => self.config,
            ConfigWord::Config1 => self.config1,
            ConfigWord::Config2 => self.config2,
            ConfigWord::Config3 => self.config3,
        }
    }

    fn word_mut(&mut self, word: ConfigWord) -> &mut u64 {
        match word {
            ConfigWord::Config => &mut self.config,
            ConfigWord::Config1 => &mut self.config1,
            ConfigWord::Config2 => &mut self.config2,
            ConfigWord::Config3 => &mut self.config3,
        }
    }

    /// The modifier suffix that reproduces the exclude bits and precise level (`upp`).
    fn modifiers(&self) -> String {
        let mut text = String::new();
        if self.exclude_user || self.exclude_kernel || self.exclude_hv {
            for (excluded, letter) in [
                (self.exclude_user, 'u'),
                (self.exclude_kernel, 'k'),
                (self.exclude_hv, 'h'),
            ] {
                if !excluded {
                    text.push(letter);
                }
            }
        }
        text.extend(std::iter::repeat_n('p', self.precise_ip.into()));
        text
    }
}

/// One event to sample or count.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSpec {
    /// As the user wrote it, e.g. `icm` or `cycles,9999991`.
    pub text: String,
    /// The name reports show: the catalog's name (`L1-icache-load-misses` for `icm`), the PMU
    /// event as written without modifiers (`cpu/event=0x3c/`), or a `name=` term.
    pub name: String,
    pub attr: EventAttr,
    pub sampling: Sampling,
    pub sampling_origin: SamplingOrigin,
    /// What the counts are in (`CPU-cycles`, `events`, `nanoseconds`, a sysfs `.unit`).
    pub unit: String,
    /// Multiply counts by this to get `unit` (sysfs `.scale`, e.g. RAPL energy).
    pub scale: Option<f64>,
    /// The sysfs PMU the event belongs to, when given as `pmu/.../` or a PMU's named event.
    pub pmu: Option<String>,
    /// CPUs to open the event on when its PMU counts per package or die and cannot follow a task.
    pub cpumask: Option<Vec<u32>>,
}

impl EventSpec {
    /// Whether the event asks for precise (low-skid) samples.
    pub fn precise(&self) -> bool {
        self.attr.precise_ip > 0
    }

    /// The name profiles and reports keep: as the user wrote it when that says more than the
    /// event's name (modifiers `cycles:u`, terms `page-faults/period=1/`), else the catalog's
    /// name (`L1-icache-load-misses` for `icm`) or the `name=` term.
    pub fn report_name(&self) -> String {
        let spelled_out = self.text.contains([':', '/']) && !self.text.contains("name=");
        if spelled_out {
            self.text.clone()
        } else {
            self.name.clone()
        }
    }

    /// A spec text that parses back to the same counter and overflow value on this machine, for
    /// profile files and logs (the written text may rely on aliases or sysfs event names).
    pub fn encoded(&self) -> String {
        let attr = &self.attr;
        let mut terms: Vec<String> = Vec::new();
        let head = match &self.pmu {
            Some(pmu) => {
                for word in ConfigWord::ALL {
                    let value = attr.word(word);
                    if value != 0 || word == ConfigWord::Config {
                        terms.push(format!("{}={value:#x}", word.name()));
                    }
                }
                pmu.clone()
            }
            None => catalog::events()
                .iter()
                .find(|event| event.type_ == attr.type_ && event.config == attr.config)
                .map(|event| event.name.clone())
                .unwrap_or_else(|| format!("r{:x}", attr.config)),
        };
        match (self.sampling_origin, self.sampling) {
            (SamplingOrigin::Default, _) => {}
            (_, Sampling::Period(period)) => terms.push(format!("period={period}")),
            (_, Sampling::Frequency(hz)) => terms.push(format!("freq={hz}")),
        }
        let mut text = head;
        if self.pmu.is_some() || !terms.is_empty() {
            text = format!("{text}/{}/", terms.join(","));
        }
        let modifiers = attr.modifiers();
        if !modifiers.is_empty() {
            text.push(':');
            text.push_str(&modifiers);
        }
        text
    }
}

/// Parses a comma-separated event list (`cycles:u,cpu/event=0x3c,umask=0/,icm,100003`).
pub fn parse_event_list(text: &str, pmus: &PmuRegistry) -> Result<Vec<EventSpec>, EventError> {
    let mut specs: Vec<EventSpec> = Vec::new();
    for piece in split_list(text)? {
        if let Some(value) = parse_number(piece) {
            // Oracle style `name,N`: a bare number is the previous event's overflow value.
            let Some(previous) = specs.last_mut() else {
                return Err(EventError::Malformed {
                    text: text.to_string(),
                    reason: format!(
                        "overflow value {piece} must follow an event, e.g. cycles,{piece}"
                    ),
                });
            };
            if previous.sampling_origin == SamplingOrigin::Spec {
                return Err(EventError::Conflict {
                    event: format!("{},{piece}", previous.text),
                    reason: "the overflow value is given twice".to_string(),
                });
            }
            let sampling = positive(&previous.text, "overflow value", piece, value)?;
            previous.sampling = Sampling::Period(sampling);
            previous.sampling_origin = SamplingOrigin::Spec;
            previous.text = format!("{},{piece}", previous.text);
        } else {
            specs.push(parse_event(piece, pmus)?);
        }
    }
    if specs.is_empty() {
        return Err(EventError::EmptyList);
    }
    Ok(specs)
}

/// Applies a global overflow value (`-c N`, `-s N`, `--freq HZ`) to every event that does not
/// set its own.
pub fn override_sampling(specs: &mut [EventSpec], sampling: Sampling) -> Result<(), EventError> {
    let (Sampling::Period(value) | Sampling::Frequency(value)) = sampling;
    if value == 0 {
        return Err(EventError::InvalidValue {
            event: "all events".to_string(),
            term: "overflow value".to_string(),
            value: "0".to_string(),
            reason: "must be at least 1".to_string(),
        });
    }
    for spec in specs
        .iter_mut()
        .filter(|spec| spec.sampling_origin != SamplingOrigin::Spec)
    {
        spec.sampling = sampling;
        spec.sampling_origin = SamplingOrigin::Override;
    }
    Ok(())
}

/// Splits on commas outside `pmu/.../` term lists.
fn split_list(text: &str) -> Result<Vec<&str>, EventError> {
    let mut pieces = Vec::new();
    let mut inside_terms = false;
    let mut start = 0;
    for (index, c) in text.char_indices() {
        match c {
            '/' => inside_terms = !inside_terms,
            ',' if !inside_terms => {
                pieces.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    if inside_terms {
        return Err(EventError::Malformed {
            text: text.to_string(),
            reason: "a '/' term list is not closed: write pmu/term=value,.../".to_string(),
        });
    }
    pieces.push(&text[start..]);
    let pieces: Vec<&str> = pieces.into_iter().map(str::trim).collect();
    if pieces.iter().all(|piece| piece.is_empty()) {
        return Err(EventError::EmptyList);
    }
    if pieces.iter().any(|piece| piece.is_empty()) {
        return Err(EventError::Malformed {
            text: text.to_string(),
            reason: "empty event between commas".to_string(),
        });
    }
    Ok(pieces)
}

/// Parses a decimal or `0x` hexadecimal number.
fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() && !hex.starts_with('+') => u64::from_str_radix(hex, 16).ok(),
        Some(_) => None,
        None if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => text.parse().ok(),
        None => None,
    }
}

fn positive(event: &str, term: &str, text: &str, value: u64) -> Result<u64, EventError> {
    if value == 0 {
        return Err(EventError::InvalidValue {
            event: event.to_string(),
            term: term.to_string(),
            value: text.to_string(),
            reason: "must be at least 1".to_string(),
        });
    }
    Ok(value)
}

/// One `key` or `key=value` inside `/.../`.
#[derive(Clone, Copy)]
struct Term<'a> {
    key: &'a str,
    value: Option<&'a str>,
}

fn parse_terms<'a>(event: &str, text: &'a str) -> Result<Vec<Term<'a>>, EventError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|term| {
            let term = term.trim();
            let (key, value) = match term.split_once('=') {
                Some((key, value)) => (key.trim(), Some(value.trim())),
                None => (term, None),
            };
            if key.is_empty() {
                return Err(EventError::Malformed {
                    text: event.to_string(),
                    reason: format!("empty term '{term}' in the term list"),
                });
            }
            Ok(Term { key, value })
        })
        .collect()
}

fn number_term(event: &str, term: Term<'_>) -> Result<u64, EventError> {
    let text = term.value.unwrap_or("");
    parse_number(text).ok_or_else(|| EventError::InvalidValue {
        event: event.to_string(),
        term: term.key.to_string(),
        value: text.to_string(),
        reason: "not a number (write decimal or 0x-prefixed hex)".to_string(),
    })
}

/// The terms every event accepts: how to sample it and what to call it.
const META_TERMS: [&str; 3] = ["period", "freq", "name"];

#[derive(Default)]
struct MetaTerms {
    period: Option<u64>,
    freq: Option<u64>,
    name: Option<String>,
}

impl MetaTerms {
    /// Takes `term` if it is a meta term; returns whether it was.
    fn take(&mut self, event: &str, term: Term<'_>) -> Result<bool, EventError> {
        match term.key {
            "period" => {
                let value = number_term(event, term)?;
                self.period = Some(positive(event, "period", term.value.unwrap_or(""), value)?);
            }
            "freq" => {
                let value = number_term(event, term)?;
                self.freq = Some(positive(event, "freq", term.value.unwrap_or(""), value)?);
            }
            "name" => match term.value {
                Some(name) if !name.is_empty() => self.name = Some(name.to_string()),
                _ => {
                    return Err(EventError::InvalidValue {
                        event: event.to_string(),
                        term: "name".to_string(),
                        value: String::new(),
                        reason: "give the name to show, e.g. name=loads".to_string(),
                    })
                }
            },
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn sampling(&self, event: &str) -> Result<Option<Sampling>, EventError> {
        match (self.period, self.freq) {
            (Some(_), Some(_)) => Err(EventError::Conflict {
                event: event.to_string(),
                reason: "period and freq are both given; keep one".to_string(),
            }),
            (Some(period), None) => Ok(Some(Sampling::Period(period))),
            (None, Some(hz)) => Ok(Some(Sampling::Frequency(hz))),
            (None, None) => Ok(None),
        }
    }
}

/// What a spec's name part resolved to, before modifiers and overflow are applied.
struct Resolved {
    name: String,
    attr: EventAttr,
    default_sampling: Sampling,
    unit: String,
    scale: Option<f64>,
    pmu: Option<String>,
    cpumask: Option<Vec<u32>>,
    meta: MetaTerms,
}

/// Parses one event (no top-level commas).
pub fn parse_event(text: &str, pmus: &PmuRegistry) -> Result<EventSpec, EventError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(EventError::EmptyList);
    }
    // `pmu/terms/mods`, `pmu/terms/:mods`, or `name:mods`.
    let (head, terms, modifiers) = match (text.find('/'), text.rfind('/')) {
        (Some(open), Some(close)) if open < close => {
            let rest = &text[close + 1..];
            let modifiers = (!rest.is_empty()).then(|| rest.strip_prefix(':').unwrap_or(rest));
            (&text[..open], Some(&text[open + 1..close]), modifiers)
        }
        (Some(_), _) => {
            return Err(EventError::Malformed {
                text: text.to_string(),
                reason: "a '/' term list is not closed: write pmu/term=value,.../".to_string(),
            })
        }
        (None, _) => match text.split_once(':') {
            Some((head, modifiers)) => (head, None, Some(modifiers)),
            None => (text, None, None),
        },
    };
    if head.is_empty() {
        return Err(EventError::Malformed {
            text: text.to_string(),
            reason: "no event or PMU name before the term list".to_string(),
        });
    }
    let terms = parse_terms(text, terms.unwrap_or(""))?;
    let has_term_list = text.contains('/');

    let mut resolved = if let Some(pmu) = pmus.get(head).filter(|_| has_term_list) {
        resolve_pmu_event(text, pmu, &terms)?
    } else if let Some(found) = catalog::lookup(head) {
        let mut meta = MetaTerms::default();
        take_meta_terms(text, &terms, &mut meta)?;
        Resolved {
            name: found.event.name.clone(),
            attr: EventAttr {
                type_: found.event.type_,
                config: found.event.config,
                ..EventAttr::default()
            },
            default_sampling: found.event.default_sampling,
            unit: found.event.unit.to_string(),
            scale: None,
            pmu: None,
            cpumask: None,
            meta,
        }
    } else if let Some(config) = parse_raw(head) {
        let mut meta = MetaTerms::default();
        take_meta_terms(text, &terms, &mut meta)?;
        Resolved {
            name: head.to_ascii_lowercase(),
            attr: EventAttr {
                type_: PERF_TYPE_RAW,
                config,
                ..EventAttr::default()
            },
            default_sampling: UNKNOWN_EVENT_PERIOD,
            unit: catalog::unit::EVENTS.to_string(),
            scale: None,
            pmu: None,
            cpumask: None,
            meta,
        }
    } else if has_term_list {
        return Err(EventError::UnknownPmu {
            pmu: head.to_string(),
            available: pmus.names().into_iter().map(str::to_string).collect(),
        });
    } else {
        let owners: Vec<&Pmu> = pmus
            .iter()
            .filter(|pmu| pmu.event(head).is_some())
            .collect();
        match owners.as_slice() {
            [pmu] => {
                let named = [Term {
                    key: head,
                    value: None,
                }];
                let mut resolved = resolve_pmu_event(text, pmu, &named)?;
                resolved.name = format!("{}/{}/", pmu.name, head);
                resolved
            }
            [] => {
                return Err(EventError::UnknownEvent {
                    name: head.to_string(),
                    suggestions: suggest_events(head, pmus),
                })
            }
            several => {
                return Err(EventError::AmbiguousEvent {
                    name: head.to_string(),
                    candidates: several
                        .iter()
                        .map(|pmu| format!("{}/{head}/", pmu.name))
                        .collect(),
                })
            }
        }
    };

    if let Some(modifiers) = modifiers {
        apply_modifiers(text, modifiers, &mut resolved.attr)?;
    }
    // Arm's kernel driver accepts precise_ip and ignores it: refused here, or the samples
    // would skid while the report calls them precise.
    if let Some(arm) = pmus.arm_core_pmu().filter(|_| resolved.attr.precise_ip > 0) {
        return Err(EventError::Unavailable {
            event: text.to_string(),
            reason: format!(
                "precise sampling (:p) is x86's (Intel PEBS, AMD IBS); this machine's PMU ({}) \
                 has no precise mode, so its samples skid: drop the p modifiers (Arm's \
                 counterpart of precise sampling is SPE, the arm_spe PMU)",
                arm.name
            ),
        });
    }
    let (sampling, sampling_origin) = match resolved.meta.sampling(text)? {
        Some(sampling) => (sampling, SamplingOrigin::Spec),
        None => (resolved.default_sampling, SamplingOrigin::Default),
    };
    Ok(EventSpec {
        text: text.to_string(),
        name: resolved.meta.name.take().unwrap_or(resolved.name),
        attr: resolved.attr,
        sampling,
        sampling_origin,
        unit: resolved.unit,
        scale: resolved.scale,
        pmu: resolved.pmu,
        cpumask: resolved.cpumask,
    })
}

/// Arm's Statistical Profiling Extension PMUs: `arm_spe_0`, one per SPE implementation.
pub const SPE_PMU_PREFIX: &str = "arm_spe";

/// `rNNNN`: a raw core PMU event, `config` in hex.
fn parse_raw(head: &str) -> Option<u64> {
    let hex = head.strip_prefix('r')?;
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// For events that are not PMU term lists, only the meta terms are allowed.
fn take_meta_terms(
    event: &str,
    terms: &[Term<'_>],
    meta: &mut MetaTerms,
) -> Result<(), EventError> {
    for &term in terms {
        if !meta.take(event, term)? {
            return Err(EventError::UnknownTerm {
                event: event.to_string(),
                term: term.key.to_string(),
                valid: META_TERMS.iter().map(|term| term.to_string()).collect(),
                suggestions: nearest(term.key, META_TERMS.iter().copied()),
            });
        }
    }
    Ok(())
}

/// Builds a `pmu/terms/` event: named events expand first, then the other terms apply in order,
/// so `cpu/mem-loads,ldlat=30/` overrides the `ldlat` of `mem-loads`.
fn resolve_pmu_event(event: &str, pmu: &Pmu, terms: &[Term<'_>]) -> Result<Resolved, EventError> {
    let mut attr = EventAttr {
        type_: pmu.type_,
        ..EventAttr::default()
    };
    let mut meta = MetaTerms::default();
    let mut unit = None;
    let mut scale = None;
    let mut named_event = None;
    let mut required: Vec<String> = Vec::new();

    let is_named = |term: &Term<'_>| {
        term.value.is_none() && !pmu.formats.contains_key(term.key) && pmu.event(term.key).is_some()
    };
    for term in terms.iter().filter(|term| is_named(term)) {
        let named = pmu.event(term.key).expect("filtered on existence");
        let bad_definition = |reason: String| EventError::BadSysfsEvent {
            event: format!("{}/{}/", pmu.name, named.name),
            definition: named.definition.clone(),
            reason,
        };
        for definition_term in parse_terms(event, &named.definition)? {
            if definition_term.value == Some("?") {
                // The kernel marks parameters the user must supply with `?` (e.g. `chan=?`).
                required.push(definition_term.key.to_string());
            } else if !set_config_term(event, pmu, definition_term, &mut attr)? {
                return Err(bad_definition(format!(
                    "'{}' is not a format term of {}",
                    definition_term.key, pmu.name
                )));
            }
        }
        unit = named.unit.clone();
        scale = named.scale;
        named_event = Some(named.name.clone());
    }

    for &term in terms.iter().filter(|term| !is_named(term)) {
        if meta.take(event, term)? || set_config_term(event, pmu, term, &mut attr)? {
            continue;
        }
        let mut valid: Vec<String> = pmu.formats.keys().cloned().collect();
        valid.extend(ConfigWord::ALL.iter().map(|word| word.name().to_string()));
        valid.extend(META_TERMS.iter().map(|term| term.to_string()));
        let candidates = valid
            .iter()
            .map(String::as_str)
            .chain(pmu.events.keys().map(String::as_str));
        let suggestions = nearest(term.key, candidates);
        if !pmu.events.is_empty() {
            valid.push(format!("or one of {}'s named events", pmu.name));
        }
        return Err(EventError::UnknownTerm {
            event: event.to_string(),
            term: term.key.to_string(),
            valid,
            suggestions,
        });
    }

    if let Some(parameter) = required
        .iter()
        .find(|parameter| !terms.iter().any(|term| term.key == parameter.as_str()))
    {
        let named = named_event.clone().unwrap_or_default();
        return Err(EventError::MissingParameter {
            event: event.to_string(),
            parameter: parameter.clone(),
            example: format!("{}/{named},{parameter}=0/", pmu.name),
        });
    }

    // A core PMU's event that the catalog knows (cpu/cache-misses/) samples and counts like it.
    let known = named_event
        .as_deref()
        .filter(|_| pmu.core)
        .and_then(catalog::lookup)
        .map(|found| found.event);
    let default_sampling = match known {
        Some(event) => event.default_sampling,
        None if pmu.name.starts_with("ibs_") => catalog::IBS_PERIOD,
        None if pmu.name.starts_with(SPE_PMU_PREFIX) => catalog::SPE_PERIOD,
        None => UNKNOWN_EVENT_PERIOD,
    };
    // SPE records carry the generic timer's count only with `ts_enable`; system-wide, the
    // count is what says which thread ran (see `drain::spe`). Off only where the user says so.
    let timestamps = pmu.formats.get("ts_enable");
    if let Some(field) = timestamps.filter(|_| pmu.name.starts_with(SPE_PMU_PREFIX)) {
        if !terms.iter().any(|term| term.key == "ts_enable") {
            let word = attr.word_mut(field.word);
            *word = field.insert(*word, 1).unwrap_or(*word);
        }
    }
    let unit = unit.unwrap_or_else(|| {
        match known {
            Some(event) => event.unit,
            None if pmu.name.starts_with(SPE_PMU_PREFIX) => catalog::unit::OPERATIONS,
            None => catalog::unit::EVENTS,
        }
        .to_string()
    });
    let body_end = event.rfind('/').map_or(event.len(), |close| close + 1);
    Ok(Resolved {
        name: event[..body_end].to_string(),
        attr,
        default_sampling,
        unit,
        scale,
        pmu: Some(pmu.name.clone()),
        cpumask: pmu.cpumask.clone(),
        meta,
    })
}

/// Sets a format term or a whole config word; returns whether `term` was one.
fn set_config_term(
    event: &str,
    pmu: &Pmu,
    term: Term<'_>,
    attr: &mut EventAttr,
) -> Result<bool, EventError> {
    if let Some(field) = pmu.formats.get(term.key) {
        // A format term without a value is a flag: `edge` means `edge=1`.
        let value = match term.value {
            Some(_) => number_term(event, term)?,
            None => 1,
        };
        let word = attr.word_mut(field.word);
        *word = field
            .insert(*word, value)
            .ok_or_else(|| EventError::ValueTooLarge {
                event: event.to_string(),
                term: term.key.to_string(),
                value,
                field: field.to_string(),
                width: field.width(),
                max: field.max_value(),
            })?;
        return Ok(true);
    }
    if let Some(word) = ConfigWord::from_name(term.key) {
        *attr.word_mut(word) = number_term(event, term)?;
        return Ok(true);
    }
    Ok(false)
}

/// Applies `u`, `k`, `h` (count only at those levels) and `p`.. `ppp` (precise level).
fn apply_modifiers(event: &str, modifiers: &str, attr: &mut EventAttr) -> Result<(), EventError> {
    let error = |reason: String| EventError::BadModifier {
        event: event.to_string(),
        modifiers: modifiers.to_string(),
        reason,
    };
    if modifiers.is_empty() {
        return Err(error("nothing follows the ':'".to_string()));
    }
    let (mut user, mut kernel, mut hypervisor, mut precise) = (false, false, false, 0u8);
    for c in modifiers.chars() {
        let seen = match c {
            'u' => &mut user,
            'k' => &mut kernel,
            'h' => &mut hypervisor,
            'p' => {
                precise += 1;
                if precise > 3 {
                    return Err(error(
                        "at most ppp: p asks for constant skid, pp for zero skid, ppp requires it"
                            .to_string(),
                    ));
                }
                continue;
            }
            other => return Err(error(format!("'{other}' is not a modifier"))),
        };
        if *seen {
            return Err(error(format!("'{c}' is repeated")));
        }
        *seen = true;
    }
    if user || kernel || hypervisor {
        attr.exclude_user = !user;
        attr.exclude_kernel = !kernel;
        attr.exclude_hv = !hypervisor;
    }
    attr.precise_ip = precise;
    Ok(())
}

/// The known names nearest to `name`, best first.
fn nearest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Vec<String> {
    const MAX_SUGGESTIONS: usize = 5;
    let wanted = name.to_ascii_lowercase();
    let limit = (wanted.chars().count() / 3).max(1);
    let mut scored: Vec<(usize, &str)> = candidates
        .filter_map(|candidate| {
            let lower = candidate.to_ascii_lowercase();
            let distance = strsim::damerau_levenshtein(&wanted, &lower);
            let related = wanted.len() >= 3 && lower.contains(&wanted);
            (distance <= limit || related).then_some((distance, candidate))
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, candidate)| candidate.to_string())
        .collect()
}

/// Suggestions for an unknown event name: catalog names (with the other names of each suggested
/// event, so `cycels` offers `cycles, cpu-cycles`) and this machine's PMU events.
fn suggest_events(name: &str, pmus: &PmuRegistry) -> Vec<String> {
    let pmu_events: Vec<String> = pmus
        .iter()
        .flat_map(|pmu| {
            pmu.events
                .keys()
                .map(move |event| format!("{}/{event}/", pmu.name))
        })
        .collect();
    let mut candidates: Vec<&str> = catalog::all_names().collect();
    candidates.extend(
        pmus.iter()
            .flat_map(|pmu| pmu.events.keys().map(String::as_str)),
    );
    let mut suggestions = Vec::new();
    for found in nearest(name, candidates.into_iter()) {
        match catalog::lookup(&found) {
            Some(resolved) => {
                let event = resolved.event;
                for other in std::iter::once(found.as_str())
                    .chain(std::iter::once(event.name.as_str()))
                    .chain(event.synonyms.iter().copied())
                {
                    if !suggestions.iter().any(|known: &String| known == other) {
                        suggestions.push(other.to_string());
                    }
                }
            }
            None => {
                suggestions.extend(
                    pmu_events
                        .iter()
                        .filter(|qualified| qualified.ends_with(&format!("/{found}/")))
                        .cloned(),
                );
            }
        }
    }
    suggestions
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::pmu::tests::{fixture_registry, sysfs_fixture};
    use super::*;

    fn parse(text: &str) -> Result<EventSpec, EventError> {
        let registry = fixture_registry();
        parse_event(text, &registry)
    }

    fn parse_list(text: &str) -> Result<Vec<EventSpec>, EventError> {
        let registry = fixture_registry();
        parse_event_list(text, &registry)
    }

    #[test]
    fn generic_hardware_events_use_the_hardware_type() {
        for (text, config) in [
            ("cycles", 0),
            ("cpu-cycles", 0),
            ("instructions", 1),
            ("cache-references", 2),
            ("cache-misses", 3),
            ("branches", 4),
            ("branch-instructions", 4),
            ("branch-misses", 5),
            ("bus-cycles", 6),
            ("stalled-cycles-frontend", 7),
            ("stalled-cycles-backend", 8),
            ("ref-cycles", 9),
        ] {
            let spec = parse(text).unwrap();
            assert_eq!((spec.attr.type_, spec.attr.config), (0, config), "{text}");
            assert_eq!(spec.sampling_origin, SamplingOrigin::Default);
        }
        let cycles = parse("cpu-cycles").unwrap();
        assert_eq!(cycles.name, "cycles");
        assert_eq!(cycles.text, "cpu-cycles");
        assert_eq!(cycles.unit, "CPU-cycles");
        assert_eq!(cycles.sampling, Sampling::Period(9_999_991));
        assert!(
            !cycles.attr.exclude_user && !cycles.attr.exclude_kernel && !cycles.attr.exclude_hv
        );
    }

    #[test]
    fn hardware_cache_events_encode_the_generic_cache_table() {
        let spec = parse("LLC-load-misses").unwrap();
        assert_eq!(spec.attr.type_, 3);
        assert_eq!(spec.attr.config, 2 | (1 << 16));
        assert_eq!(spec.sampling, Sampling::Period(100_003));
        assert_eq!(parse("L1-dcache-stores").unwrap().attr.config, 1 << 8);
        assert_eq!(parse("dTLB-loads").unwrap().unit, "load events");
    }

    #[test]
    fn software_events_and_their_short_names() {
        for (text, config) in [
            ("cpu-clock", 0),
            ("task-clock", 1),
            ("page-faults", 2),
            ("faults", 2),
            ("context-switches", 3),
            ("cs", 3),
            ("cpu-migrations", 4),
            ("migrations", 4),
            ("minor-faults", 5),
            ("major-faults", 6),
            ("alignment-faults", 7),
            ("emulation-faults", 8),
            ("dummy", 9),
        ] {
            let spec = parse(text).unwrap();
            assert_eq!((spec.attr.type_, spec.attr.config), (1, config), "{text}");
        }
        let clock = parse("cpu-clock").unwrap();
        assert_eq!(clock.sampling, Sampling::Frequency(997));
        assert_eq!(clock.unit, "nanoseconds");
    }

    #[test]
    fn oracle_aliases_resolve_to_the_linux_event() {
        let spec = parse("icm").unwrap();
        assert_eq!(spec.name, "L1-icache-load-misses");
        assert_eq!(spec.text, "icm");
        assert_eq!((spec.attr.type_, spec.attr.config), (3, 1 | (1 << 16)));
        assert_eq!(spec.sampling, Sampling::Period(100_003));
        assert_eq!(parse("insts").unwrap().name, "instructions");
        assert_eq!(
            parse("ecref").unwrap().sampling,
            Sampling::Period(1_000_003)
        );
    }

    #[test]
    fn raw_events_are_hex_configs_of_the_raw_type() {
        let spec = parse("r01C2:u").unwrap();
        assert_eq!((spec.attr.type_, spec.attr.config), (4, 0x1c2));
        assert_eq!(spec.name, "r01c2");
        assert!(spec.attr.exclude_kernel);
        // `ref-cycles` starts with r but is a catalog name, and `rx` is no raw event.
        assert_eq!(parse("ref-cycles").unwrap().attr.type_, 0);
        assert!(matches!(
            parse("rxyz"),
            Err(EventError::UnknownEvent { .. })
        ));
    }

    #[test]
    fn pmu_terms_fill_their_format_fields() {
        let spec = parse("cpu/event=0x3c,umask=0x01,edge,cmask=2/").unwrap();
        assert_eq!(spec.attr.type_, 4);
        assert_eq!(spec.attr.config, 0x3c | (0x01 << 8) | (1 << 18) | (2 << 24));
        assert_eq!(spec.name, "cpu/event=0x3c,umask=0x01,edge,cmask=2/");
        assert_eq!(spec.pmu.as_deref(), Some("cpu"));
        assert_eq!(spec.sampling, UNKNOWN_EVENT_PERIOD);

        let spec = parse("cpu/event=0xcd,ldlat=30,config2=7/").unwrap();
        assert_eq!(spec.attr.config, 0xcd);
        assert_eq!(spec.attr.config1, 30);
        assert_eq!(spec.attr.config2, 7);

        // Multi-range format: low byte in bits 0-7, next nibble in bits 32-35.
        let spec = parse("amd_df/event=0x1f4,umask=0x38/").unwrap();
        assert_eq!(spec.attr.config, 0xf4 | (0x38 << 8) | (0x1 << 32));
        assert_eq!(spec.attr.type_, 11);
        assert_eq!(spec.cpumask, Some(vec![0, 8]));
    }

    #[test]
    fn report_names_keep_what_the_user_spelled_out() {
        let name = |text: &str| parse(text).unwrap().report_name();
        assert_eq!(name("page-faults/period=1/"), "page-faults/period=1/");
        assert_eq!(name("cpu-clock:u"), "cpu-clock:u");
        assert_eq!(name("faults"), "page-faults");
        assert_eq!(name("page-faults/name=pf/"), "pf");
    }

    #[test]
    fn named_pmu_events_expand_and_later_terms_override_them() {
        let spec = parse("cpu/mem-loads/pp").unwrap();
        assert_eq!(spec.attr.config, 0xcd | (0x1 << 8));
        assert_eq!(spec.attr.config1, 3);
        assert_eq!(spec.attr.precise_ip, 2);
        assert_eq!(spec.name, "cpu/mem-loads/");

        let spec = parse("cpu/ldlat=30,mem-loads/:p").unwrap();
        assert_eq!(spec.attr.config1, 30);
        assert_eq!(spec.attr.precise_ip, 1);

        // The core PMU's own name for a catalog event samples like the catalog event.
        let spec = parse("cpu/cpu-cycles/").unwrap();
        assert_eq!(spec.sampling, Sampling::Period(9_999_991));
        assert_eq!(spec.unit, "CPU-cycles");

        let energy = parse("power/energy-pkg/").unwrap();
        assert_eq!(energy.unit, "Joules");
        assert_eq!(energy.scale, Some(2.328_306_436_538_696_3e-10));
        assert_eq!(energy.cpumask, Some(vec![0]));
    }

    #[test]
    fn a_pmu_event_name_alone_finds_its_pmu() {
        let spec = parse("energy-pkg:k").unwrap();
        assert_eq!(spec.pmu.as_deref(), Some("power"));
        assert_eq!(spec.name, "power/energy-pkg/");
        assert_eq!(spec.attr.config, 0x02);
        assert!(spec.attr.exclude_user);
    }

    #[test]
    fn ibs_uses_its_sysfs_type_and_a_period_of_sixteens() {
        let spec = parse("ibs_op/cnt_ctl=1/").unwrap();
        assert_eq!(spec.attr.type_, 10);
        assert_eq!(spec.attr.config, 1 << 19);
        assert_eq!(spec.sampling, catalog::IBS_PERIOD);
        let Sampling::Period(period) = spec.sampling else {
            panic!("IBS samples by period");
        };
        assert_eq!(period % 16, 0);
        assert_eq!(parse("ibs_op//").unwrap().attr.config, 0);
    }

    #[test]
    fn absent_ibs_pmu_says_what_ibs_needs_and_what_the_machine_has() {
        let err = parse("ibs_fetch//").unwrap_err();
        assert_eq!(
            err.to_string(),
            "ibs_fetch: no such PMU on this machine (AMD IBS needs an AMD CPU and a host \
             kernel; this machine has: amd_df, cpu, ibs_op, power, software, uncore_cha_0). \
             Run `profiler list` to see all events."
        );
        let err = parse("nosuch/event=1/").unwrap_err();
        assert!(err
            .to_string()
            .starts_with("nosuch: no such PMU on this machine (this machine has: amd_df"));
    }

    #[test]
    fn precise_modifiers_are_refused_on_arm() {
        let root = sysfs_fixture(&[
            ("armv8_pmuv3_0/type", "8"),
            ("armv8_pmuv3_0/cpus", "0"),
            ("armv8_pmuv3_0/format/event", "config:0-15"),
            ("armv8_pmuv3_0/events/inst_retired", "event=0x08"),
            ("software/type", "1"),
        ]);
        let arm = PmuRegistry::from_sysfs(root.path()).unwrap();
        for text in [
            "cycles:p",
            "instructions:ppp",
            "armv8_pmuv3_0/inst_retired/pp",
        ] {
            let err = parse_event(text, &arm).unwrap_err().to_string();
            assert!(
                err.contains("precise sampling (:p) is x86's")
                    && err.contains("(armv8_pmuv3_0) has no precise mode"),
                "{text}: {err}"
            );
        }
        let spec = parse_event("armv8_pmuv3_0/inst_retired/u", &arm).unwrap();
        assert_eq!((spec.attr.config, spec.attr.precise_ip), (0x08, 0));
        // Arm's precise counterpart, SPE: explained where it does not exist.
        let err = parse_event("arm_spe_0//", &arm).unwrap_err().to_string();
        assert!(
            err.starts_with("arm_spe_0: no such PMU on this machine (Arm SPE needs"),
            "{err}"
        );
        // Where it does, sampled every 65,536 operations with timestamps unless told otherwise.
        let with_spe = sysfs_fixture(&[
            ("armv8_pmuv3_0/type", "8"),
            ("armv8_pmuv3_0/cpus", "0"),
            ("arm_spe_0/type", "9"),
            ("arm_spe_0/format/ts_enable", "config:0"),
            ("arm_spe_0/format/load_filter", "config:33"),
        ]);
        let with_spe = PmuRegistry::from_sysfs(with_spe.path()).unwrap();
        let spec = parse_event("arm_spe_0/load_filter/", &with_spe).unwrap();
        assert_eq!(
            (spec.attr.type_, spec.attr.config, spec.sampling),
            (9, (1 << 33) | 1, Sampling::Period(65_536))
        );
        assert_eq!(spec.unit, "operations");
        let spec = parse_event("arm_spe_0/ts_enable=0,period=4096/", &with_spe).unwrap();
        assert_eq!(
            (spec.attr.config, spec.sampling),
            (0, Sampling::Period(4096))
        );
        // x86 keeps its precise levels.
        assert_eq!(parse("cycles:pp").unwrap().attr.precise_ip, 2);
    }

    #[test]
    fn modifiers_select_privilege_levels_and_precision() {
        let attr = |text: &str| parse(text).unwrap().attr;
        let levels = |a: EventAttr| (a.exclude_user, a.exclude_kernel, a.exclude_hv, a.precise_ip);
        assert_eq!(levels(attr("cycles:u")), (false, true, true, 0));
        assert_eq!(levels(attr("cycles:k")), (true, false, true, 0));
        assert_eq!(levels(attr("cycles:h")), (true, true, false, 0));
        assert_eq!(levels(attr("cycles:uk")), (false, false, true, 0));
        assert_eq!(levels(attr("cycles:p")), (false, false, false, 1));
        assert_eq!(levels(attr("cycles:pp")), (false, false, false, 2));
        assert_eq!(levels(attr("cycles:upp")), (false, true, true, 2));
        assert_eq!(levels(attr("cycles:ppp")), (false, false, false, 3));
        assert_eq!(levels(attr("cpu/event=0x3c/u")), (false, true, true, 0));
        assert_eq!(levels(attr("cpu/event=0x3c/:kp")), (true, false, true, 1));
        assert!(parse("cycles:upp").unwrap().precise());
    }

    #[test]
    fn bad_modifiers_are_named() {
        let err = parse("cycles:pppp").unwrap_err();
        assert!(matches!(err, EventError::BadModifier { .. }));
        assert!(err.to_string().contains("at most ppp"), "{err}");
        assert!(parse("cycles:uu")
            .unwrap_err()
            .to_string()
            .contains("'u' is repeated"));
        assert!(parse("cycles:x")
            .unwrap_err()
            .to_string()
            .contains("'x' is not a modifier"));
        assert!(parse("cycles:")
            .unwrap_err()
            .to_string()
            .contains("nothing follows"));
    }

    #[test]
    fn overflow_values_per_event() {
        let spec = parse("cycles/period=1000/").unwrap();
        assert_eq!(spec.sampling, Sampling::Period(1000));
        assert_eq!(spec.sampling_origin, SamplingOrigin::Spec);
        assert_eq!(
            parse("cpu-clock/period=250000/").unwrap().sampling,
            Sampling::Period(250_000)
        );
        assert_eq!(
            parse("cpu-clock/freq=4999/").unwrap().sampling,
            Sampling::Frequency(4999)
        );
        assert_eq!(
            parse("cpu/event=0x3c,period=0x10/").unwrap().sampling,
            Sampling::Period(16)
        );
        let renamed = parse("page-faults/name=faults-in-loop,period=1/").unwrap();
        assert_eq!(renamed.name, "faults-in-loop");
        assert_eq!(renamed.sampling, Sampling::Period(1));
    }

    #[test]
    fn oracle_style_numbers_set_the_previous_events_overflow() {
        let specs = parse_list("cycles,9999991").unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].sampling, Sampling::Period(9_999_991));
        assert_eq!(specs[0].sampling_origin, SamplingOrigin::Spec);
        assert_eq!(specs[0].text, "cycles,9999991");

        let specs = parse_list("cycles,insts").unwrap();
        assert_eq!(
            specs
                .iter()
                .map(|spec| spec.name.as_str())
                .collect::<Vec<_>>(),
            vec!["cycles", "instructions"]
        );

        let specs = parse_list("icm,100,cpu/event=0x3c,umask=1/u, dcrm ,0x10").unwrap();
        assert_eq!(specs.len(), 3);
        assert_eq!(specs[0].sampling, Sampling::Period(100));
        assert_eq!(specs[1].attr.config, 0x13c);
        assert!(specs[1].attr.exclude_kernel);
        assert_eq!(specs[1].sampling_origin, SamplingOrigin::Default);
        assert_eq!(specs[2].sampling, Sampling::Period(16));
    }

    #[test]
    fn global_override_fills_in_where_the_event_is_silent() {
        let mut specs = parse_list("cycles,cpu-clock/freq=99/,insts,5").unwrap();
        override_sampling(&mut specs, Sampling::Period(12345)).unwrap();
        assert_eq!(specs[0].sampling, Sampling::Period(12345));
        assert_eq!(specs[0].sampling_origin, SamplingOrigin::Override);
        assert_eq!(specs[1].sampling, Sampling::Frequency(99));
        assert_eq!(specs[2].sampling, Sampling::Period(5));
        let err = override_sampling(&mut specs, Sampling::Frequency(0)).unwrap_err();
        assert!(err.to_string().contains("must be at least 1"));
    }

    #[test]
    fn conflicting_or_zero_overflow_values_are_refused() {
        let err = parse("cycles/period=10,freq=10/").unwrap_err();
        assert_eq!(
            err.to_string(),
            "conflicting settings in 'cycles/period=10,freq=10/': period and freq are both \
             given; keep one"
        );
        assert!(matches!(
            parse_list("cycles/period=5/,7"),
            Err(EventError::Conflict { .. })
        ));
        let err = parse("cycles/period=0/").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value '0' for 'period' in 'cycles/period=0/': must be at least 1"
        );
        assert!(matches!(
            parse_list("cycles,0"),
            Err(EventError::InvalidValue { .. })
        ));
        assert!(matches!(
            parse_list("100,cycles"),
            Err(EventError::Malformed { .. })
        ));
    }

    #[test]
    fn unknown_events_suggest_the_nearest_names() {
        let err = parse("cycels").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown event 'cycels'. Did you mean: cycles, cpu-cycles? Run `profiler list` to \
             see all events."
        );
        let EventError::UnknownEvent { suggestions, .. } =
            parse("L1-dcache-load-mises").unwrap_err()
        else {
            panic!("unknown event expected");
        };
        assert_eq!(suggestions[0], "L1-dcache-load-misses");
        let EventError::UnknownEvent { suggestions, .. } = parse("mem-load").unwrap_err() else {
            panic!("unknown event expected");
        };
        assert!(
            suggestions.contains(&"cpu/mem-loads/".to_string()),
            "{suggestions:?}"
        );
    }

    #[test]
    fn unknown_terms_list_what_the_pmu_accepts() {
        let err = parse("cpu/umsk=1/").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("unknown term 'umsk' in 'cpu/umsk=1/'. Did you mean: umask?"),
            "{text}"
        );
        assert!(
            text.contains("cmask, edge, event, frontend, ldlat, umask, config, config1"),
            "{text}"
        );
        assert!(text.contains("or one of cpu's named events"), "{text}");
        let err = parse("cpu-clock/event=1/").unwrap_err();
        assert!(
            err.to_string()
                .contains("Terms accepted here: period, freq, name."),
            "{err}"
        );
    }

    #[test]
    fn values_too_large_for_their_field_are_refused() {
        let err = parse("cpu/umask=0x1ff/").unwrap_err();
        assert_eq!(
            err.to_string(),
            "umask=0x1ff in 'cpu/umask=0x1ff/' does not fit its field config:8-15 (8 bits): the \
             largest value is 0xff"
        );
        assert!(parse("amd_df/event=0xfff/").is_ok());
        assert!(matches!(
            parse("amd_df/event=0x1000/"),
            Err(EventError::ValueTooLarge { .. })
        ));
    }

    #[test]
    fn malformed_numbers_and_lists_are_refused() {
        let err = parse("cpu/event=0xzz/").unwrap_err();
        assert!(err.to_string().contains("not a number"), "{err}");
        assert!(matches!(
            parse("cpu/event=/"),
            Err(EventError::InvalidValue { .. })
        ));
        assert!(matches!(
            parse_list("cycles,,insts"),
            Err(EventError::Malformed { .. })
        ));
        assert!(matches!(
            parse_list("cpu/event=1"),
            Err(EventError::Malformed { .. })
        ));
        assert!(matches!(parse_list(" , "), Err(EventError::EmptyList)));
        assert!(matches!(
            parse("/event=1/"),
            Err(EventError::Malformed { .. })
        ));
        assert!(matches!(
            parse("cpu/event=1,,umask=2/"),
            Err(EventError::Malformed { .. })
        ));
    }

    #[test]
    fn parameters_the_kernel_marks_required_must_be_given() {
        let err = parse("uncore_cha_0/chan_read/").unwrap_err();
        assert_eq!(
            err.to_string(),
            "'uncore_cha_0/chan_read/' needs a value for 'chan': write e.g. \
             uncore_cha_0/chan_read,chan=0/"
        );
        let spec = parse("uncore_cha_0/chan_read,chan=3/").unwrap();
        assert_eq!(spec.attr.config, 0x10 | (3 << 36));
    }

    #[test]
    fn apply_sets_the_kernel_attribute() {
        let spec = parse("cpu/event=0xcd,ldlat=30,config2=7,config3=9/upp").unwrap();
        let mut attr = perf_event_attr::default();
        attr.set_exclude_kernel(0);
        spec.attr.apply(&mut attr);
        spec.sampling.apply(&mut attr);
        assert_eq!(attr.type_, 4);
        assert_eq!(attr.config, 0xcd);
        assert_eq!(attr.config1, 30);
        assert_eq!(attr.config2, 7);
        assert_eq!(attr.config3, 9);
        assert_eq!(
            (
                attr.exclude_user(),
                attr.exclude_kernel(),
                attr.exclude_hv(),
                attr.precise_ip()
            ),
            (0, 1, 1, 2)
        );
        assert_eq!((attr.freq(), attr.sample_period), (0, 1_000_003));
        Sampling::Frequency(997).apply(&mut attr);
        assert_eq!((attr.freq(), attr.sample_freq), (1, 997));
    }

    #[test]
    fn encoded_text_reparses_to_the_same_counter() {
        let registry = fixture_registry();
        for text in [
            "icm",
            "cycles:upp",
            "cpu-clock/freq=4999/",
            "r1c2:k",
            "cpu/mem-loads,ldlat=30/pp",
            "amd_df/event=0x1f4/",
            "energy-pkg",
        ] {
            let spec = parse_event(text, &registry).unwrap();
            let again = parse_event(&spec.encoded(), &registry).unwrap();
            assert_eq!(again.attr, spec.attr, "{text} -> {}", spec.encoded());
            assert_eq!(again.sampling, spec.sampling, "{text}");
        }
        assert_eq!(parse("icm").unwrap().encoded(), "L1-icache-load-misses");
        assert_eq!(
            parse("cpu/event=0x3c/upp").unwrap().encoded(),
            "cpu/config=0x3c/:upp"
        );
    }

    /// Valid spec texts: a catalog name, raw or PMU event, an optional overflow, optional modifiers.
    fn valid_spec_text() -> impl Strategy<Value = String> {
        let names: Vec<String> = catalog::all_names().map(str::to_string).collect();
        let head = prop_oneof![
            proptest::sample::select(names),
            (0u64..0xffff).prop_map(|config| format!("r{config:x}")),
            (0u64..0x1000, 0u64..0x100)
                .prop_map(|(event, umask)| format!("amd_df/event={event:#x},umask={umask}/")),
            (0u64..0x100, 0u64..0x10000)
                .prop_map(|(event, ldlat)| format!("cpu/event={event},ldlat={ldlat}/")),
        ];
        let overflow = prop_oneof![
            Just(String::new()),
            (1u64..u64::MAX).prop_map(|period| format!("period={period}")),
            (1u64..100_000).prop_map(|hz| format!("freq={hz}")),
        ];
        let modifiers = proptest::sample::select(vec!["", "u", "k", "uk", "p", "upp", "kppp", "h"]);
        (head, overflow, modifiers).prop_map(|(head, overflow, modifiers)| {
            let mut text = match (head.strip_suffix('/'), overflow.is_empty()) {
                (_, true) => head,
                (Some(open), false) => format!("{open},{overflow}/"),
                (None, false) => format!("{head}/{overflow}/"),
            };
            if !modifiers.is_empty() {
                text = format!("{text}:{modifiers}");
            }
            text
        })
    }

    proptest! {
        #[test]
        fn valid_specs_round_trip_through_their_encoding(text in valid_spec_text()) {
            let registry = fixture_registry();
            let spec = parse_event(&text, &registry).unwrap();
            let again = parse_event(&spec.encoded(), &registry).unwrap();
            prop_assert_eq!(again.attr, spec.attr);
            prop_assert_eq!(again.sampling, spec.sampling);
            prop_assert_eq!(again.sampling_origin, spec.sampling_origin);
        }

        #[test]
        fn the_parser_never_panics(text in "\\PC{0,40}") {
            let registry = fixture_registry();
            let _ = parse_event_list(&text, &registry);
        }

        #[test]
        fn the_parser_never_panics_on_spec_like_text(text in "[a-z0-9_=,/:.x?-]{0,40}") {
            let registry = fixture_registry();
            let _ = parse_event_list(&text, &registry);
        }
    }
}
