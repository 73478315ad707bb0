//! `profiler list`: every event a user can name, in order: Oracle-style aliased counters, generic
//! hardware, hardware cache and software events, AMD IBS, Intel PEBS memory sampling, then this
//! machine's PMU events from sysfs; each with whether it works here (probed, with the reason when not), its default
//! overflow value, unit and description. Building the listing and rendering it are separate so
//! tests can render fixed data.

use std::collections::BTreeMap;

use anyhow::Context;
use serde::Serialize;

use super::catalog::{self, Section, COUNTER_ALIASES, IBS_PERIOD};
use super::pmu::PmuRegistry;
use super::pmu_requirement;
use super::probe::{probe, Availability, SystemFacts};
use super::sampling::Sampling;
use super::spec::{parse_event, EventSpec};

/// Everything `profiler list` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EventListing {
    pub sections: Vec<ListSection>,
    /// This machine's PMUs and their format terms, for writing `pmu/term=value/` events.
    pub pmus: Vec<PmuSummary>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ListSection {
    pub title: String,
    pub entries: Vec<ListEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ListEntry {
    /// What to write after `-e`.
    pub name: String,
    /// Other names for the same event.
    pub aliases: Vec<String>,
    /// The Linux event it opens (for aliases, the event they stand for; for sysfs events, the
    /// kernel's definition).
    pub event: String,
    pub availability: Availability,
    pub default_overflow: Sampling,
    pub unit: String,
    pub description: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PmuSummary {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: u32,
    /// Format terms and their bits, e.g. `event` -> `config:0-7`.
    pub formats: BTreeMap<String, String>,
}

/// PMUs that sample instructions rather than count events, with what they record.
const SAMPLING_PMUS: [(&str, &str); 2] = [
    (
        "ibs_op",
        "AMD IBS op sampling: tags one op in N cycles; records its data address, load latency, \
         data source, TLB and branch outcome",
    ),
    (
        "ibs_fetch",
        "AMD IBS fetch sampling: tags one instruction fetch in N; records its I-cache and iTLB \
         outcome and fetch latency",
    ),
];

/// Intel's precise memory events: the core PMU's sysfs event, how to sample it (as `perf mem`
/// does), and what it records.
const PEBS_MEMORY_EVENTS: [(&str, &str, &str); 2] = [
    (
        "mem-loads",
        "mem-loads,ldlat=30/pp",
        "Intel PEBS load latency: samples loads slower than ldlat cycles; records the data \
         address, load latency and data source",
    ),
    (
        "mem-stores",
        "mem-stores/pp",
        "Intel PEBS stores: samples stores; records the data address and data source",
    ),
];

/// Builds the listing for the PMUs in `registry`, asking `probe` whether each event opens.
pub fn build_listing(
    registry: &PmuRegistry,
    probe: &dyn Fn(&EventSpec) -> Availability,
) -> EventListing {
    let availability = |text: &str| match parse_event(text, registry) {
        Ok(spec) => probe(&spec),
        Err(err) => Availability::Unavailable {
            reason: err.to_string(),
        },
    };

    let aliased = COUNTER_ALIASES
        .iter()
        .filter_map(|alias| {
            let event = catalog::lookup(alias.event)?.event;
            Some(ListEntry {
                name: alias.alias.to_string(),
                aliases: Vec::new(),
                event: event.name.clone(),
                availability: availability(&event.name),
                default_overflow: event.default_sampling,
                unit: event.unit.to_string(),
                description: alias.description.to_string(),
            })
        })
        .collect();
    let mut sections = vec![ListSection {
        title: "Aliased counters (Oracle collect -h names)".to_string(),
        entries: aliased,
    }];

    for (section, title) in [
        (Section::Hardware, "Hardware events"),
        (Section::HardwareCache, "Hardware cache events"),
        (Section::Software, "Software events"),
    ] {
        let entries = catalog::events()
            .iter()
            .filter(|event| event.section == section)
            .map(|event| ListEntry {
                name: event.name.clone(),
                aliases: catalog::other_names(event)
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
                event: event.name.clone(),
                availability: availability(&event.name),
                default_overflow: event.default_sampling,
                unit: event.unit.to_string(),
                description: event.description.clone(),
            })
            .collect();
        sections.push(ListSection {
            title: title.to_string(),
            entries,
        });
    }

    let sampling_entries = SAMPLING_PMUS
        .iter()
        .map(|&(pmu, description)| {
            let name = format!("{pmu}//");
            let availability = match (registry.get(pmu), pmu_requirement(pmu)) {
                (None, Some(requirement)) => Availability::Unavailable {
                    reason: format!("no {pmu} PMU on this machine: {requirement}"),
                },
                _ => availability(&name),
            };
            ListEntry {
                event: name.clone(),
                name,
                aliases: Vec::new(),
                availability,
                default_overflow: IBS_PERIOD,
                unit: catalog::unit::EVENTS.to_string(),
                description: description.to_string(),
            }
        })
        .collect();
    sections.push(ListSection {
        title: "Instruction sampling (AMD IBS)".to_string(),
        entries: sampling_entries,
    });

    let pebs_entries = PEBS_MEMORY_EVENTS
        .iter()
        .map(|&(event, sampled_as, description)| {
            // Hybrid CPUs name their big-core PMU cpu_core.
            let core = registry
                .iter()
                .find(|pmu| pmu.core && pmu.event(event).is_some());
            let name = format!(
                "{}/{sampled_as}",
                core.map_or("cpu", |pmu| pmu.name.as_str())
            );
            let availability = match core {
                Some(_) => availability(&name),
                None => Availability::Unavailable {
                    reason: format!(
                        "no core PMU with a {event} event on this machine: PEBS memory sampling \
                         needs an Intel CPU and a host kernel"
                    ),
                },
            };
            ListEntry {
                event: name.clone(),
                name,
                aliases: Vec::new(),
                availability,
                default_overflow: catalog::UNKNOWN_EVENT_PERIOD,
                unit: catalog::unit::EVENTS.to_string(),
                description: description.to_string(),
            }
        })
        .collect();
    sections.push(ListSection {
        title: "Precise memory sampling (Intel PEBS)".to_string(),
        entries: pebs_entries,
    });

    let mut pmu_entries = Vec::new();
    for pmu in registry.iter() {
        for event in pmu.events.values() {
            let name = format!("{}/{}/", pmu.name, event.name);
            let (availability, default_overflow, unit) = match parse_event(&name, registry) {
                Ok(spec) => (probe(&spec), spec.sampling, spec.unit),
                Err(err) => (
                    Availability::Unavailable {
                        reason: err.to_string(),
                    },
                    catalog::UNKNOWN_EVENT_PERIOD,
                    catalog::unit::EVENTS.to_string(),
                ),
            };
            let description = match event.scale {
                Some(scale) => format!("{} (counts x {scale} = {unit})", event.definition),
                None => event.definition.clone(),
            };
            pmu_entries.push(ListEntry {
                name,
                aliases: Vec::new(),
                event: event.definition.clone(),
                availability,
                default_overflow,
                unit,
                description,
            });
        }
    }
    sections.push(ListSection {
        title: "PMU events of this machine (sysfs)".to_string(),
        entries: pmu_entries,
    });

    let pmus = registry
        .iter()
        .map(|pmu| PmuSummary {
            name: pmu.name.clone(),
            type_: pmu.type_,
            formats: pmu
                .formats
                .iter()
                .map(|(term, field)| (term.clone(), field.to_string()))
                .collect(),
        })
        .collect();
    EventListing { sections, pmus }
}

/// The listing of the running system.
pub fn live_listing() -> anyhow::Result<EventListing> {
    let registry = PmuRegistry::live().context("reading this machine's PMUs from /sys")?;
    let facts = SystemFacts::read(&registry);
    Ok(build_listing(&registry, &|spec| probe(spec, &facts)))
}

/// What `profiler list [--json]` prints.
pub fn run_list(json: bool) -> anyhow::Result<String> {
    let listing = live_listing()?;
    if json {
        render_json(&listing)
    } else {
        Ok(render_text(&listing))
    }
}

pub fn render_json(listing: &EventListing) -> anyhow::Result<String> {
    serde_json::to_string_pretty(listing).context("serializing the event list")
}

/// The width `profiler list` output fits in.
const WIDTH: usize = 100;
/// Longer names get a line of their own.
const MAX_NAME_WIDTH: usize = 28;
const INDENT: &str = "  ";

/// Aligned text: one table per section, unavailability reasons as numbered notes at the end.
pub fn render_text(listing: &EventListing) -> String {
    let mut reasons: Vec<String> = Vec::new();
    let mut note = |reason: &str| -> usize {
        match reasons.iter().position(|known| known == reason) {
            Some(index) => index + 1,
            None => {
                reasons.push(reason.to_string());
                reasons.len()
            }
        }
    };
    let mut rows: Vec<Vec<[String; 5]>> = Vec::new();
    for section in &listing.sections {
        let section_rows = section
            .entries
            .iter()
            .map(|entry| {
                let available = match &entry.availability {
                    Availability::Available => "yes".to_string(),
                    Availability::CountOnly { reason } => format!("count [{}]", note(reason)),
                    Availability::Unavailable { reason } => format!("no [{}]", note(reason)),
                };
                let mut description = entry.description.clone();
                if entry.event != entry.name && !entry.name.contains('/') {
                    description = format!("{description} = {}", entry.event);
                }
                if !entry.aliases.is_empty() {
                    description = format!("{description} (also {})", entry.aliases.join(", "));
                }
                [
                    entry.name.clone(),
                    available,
                    entry.default_overflow.to_string(),
                    entry.unit.clone(),
                    description,
                ]
            })
            .collect();
        rows.push(section_rows);
    }

    const HEADER: [&str; 5] = ["NAME", "HERE", "OVERFLOW", "UNIT", "DESCRIPTION"];
    let column = |index: usize, cap: usize| {
        rows.iter()
            .flatten()
            .map(|row| row[index].chars().count())
            .chain(std::iter::once(HEADER[index].len()))
            .max()
            .unwrap_or(0)
            .min(cap)
    };
    let widths = [
        column(0, MAX_NAME_WIDTH),
        column(1, usize::MAX),
        column(2, usize::MAX),
        column(3, usize::MAX),
    ];
    let description_column = INDENT.len() + widths.iter().map(|width| width + 1).sum::<usize>();
    let description_width = WIDTH.saturating_sub(description_column).max(20);

    let mut out = String::from(
        "Events for -e, comma separated, e.g. -e cycles:u,icm,100003,cpu/event=0x3c/pp\n\
         Modifiers: u k h (count at those privilege levels), p pp ppp (precise sampling).\n\
         Overflow value: name/period=N/, name/freq=HZ/ or name,N.\n",
    );
    for (section, section_rows) in listing.sections.iter().zip(&rows) {
        out.push('\n');
        out.push_str(&section.title);
        out.push_str(":\n");
        if section_rows.is_empty() {
            out.push_str(INDENT);
            out.push_str("(none on this machine)\n");
            continue;
        }
        let header = HEADER.map(str::to_string);
        for row in std::iter::once(&header).chain(section_rows) {
            let mut line = String::from(INDENT);
            if row[0].chars().count() > widths[0] {
                out.push_str(&format!("{INDENT}{}\n", row[0]));
                line.push_str(&" ".repeat(widths[0]));
            } else {
                line.push_str(&format!("{:<width$}", row[0], width = widths[0]));
            }
            for (cell, width) in row[1..4].iter().zip(&widths[1..]) {
                line.push_str(&format!(" {cell:<width$}"));
            }
            line.push(' ');
            for (index, text) in wrap(&row[4], description_width).iter().enumerate() {
                if index > 0 {
                    line = " ".repeat(description_column);
                }
                line.push_str(text);
                out.push_str(line.trim_end());
                out.push('\n');
            }
        }
    }

    if !reasons.is_empty() {
        out.push_str("\nWhy not here:\n");
        for (index, reason) in reasons.iter().enumerate() {
            let tag = format!("{INDENT}[{}] ", index + 1);
            for (line_index, text) in wrap(reason, WIDTH - tag.len()).iter().enumerate() {
                if line_index == 0 {
                    out.push_str(&tag);
                } else {
                    out.push_str(&" ".repeat(tag.len()));
                }
                out.push_str(text);
                out.push('\n');
            }
        }
    }

    if !listing.pmus.is_empty() {
        out.push_str("\nPMUs of this machine (write pmu/term=value,.../):\n");
        for pmu in &listing.pmus {
            let terms: Vec<String> = pmu
                .formats
                .iter()
                .map(|(term, bits)| format!("{term}={bits}"))
                .collect();
            let text = if terms.is_empty() {
                format!("{} (type {})", pmu.name, pmu.type_)
            } else {
                format!("{} (type {}): {}", pmu.name, pmu.type_, terms.join(", "))
            };
            for (index, line) in wrap(&text, WIDTH - 2 * INDENT.len()).iter().enumerate() {
                out.push_str(if index == 0 { INDENT } else { "    " });
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Splits `text` into lines of at most `width` characters, at spaces where possible.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        // Words longer than a line are cut.
        while word.len() > width {
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
            }
            lines.push(word.drain(..width).collect());
        }
        let word: String = word.into_iter().collect();
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::catalog::{PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW};
    use super::super::pmu::tests::fixture_registry;
    use super::*;

    const NO_PMU: &str = "no hardware PMU: virtual machine? (the hypervisor exposes no \
                          performance counters)";

    /// Hardware unavailable, per-package PMUs count-only, the rest available.
    fn fake_probe(spec: &EventSpec) -> Availability {
        if spec.pmu.is_none()
            && [PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW].contains(&spec.attr.type_)
        {
            Availability::Unavailable {
                reason: NO_PMU.to_string(),
            }
        } else if spec.cpumask.is_some() {
            Availability::CountOnly {
                reason: "power can count this event but not sample it".to_string(),
            }
        } else {
            Availability::Available
        }
    }

    fn fixture_listing() -> EventListing {
        let registry = fixture_registry();
        build_listing(&registry, &fake_probe)
    }

    fn entry<'a>(listing: &'a EventListing, name: &str) -> &'a ListEntry {
        listing
            .sections
            .iter()
            .flat_map(|section| &section.entries)
            .find(|entry| entry.name == name)
            .unwrap_or_else(|| panic!("{name} listed"))
    }

    #[test]
    fn sections_come_in_the_documented_order() {
        let listing = fixture_listing();
        let titles: Vec<&str> = listing.sections.iter().map(|s| s.title.as_str()).collect();
        assert_eq!(
            titles,
            vec![
                "Aliased counters (Oracle collect -h names)",
                "Hardware events",
                "Hardware cache events",
                "Software events",
                "Instruction sampling (AMD IBS)",
                "Precise memory sampling (Intel PEBS)",
                "PMU events of this machine (sysfs)",
            ]
        );
        assert_eq!(listing.sections[0].entries[0].name, "cycles");
        assert_eq!(listing.sections[0].entries.len(), COUNTER_ALIASES.len());
        assert_eq!(listing.sections[2].entries.len(), 32);
    }

    #[test]
    fn entries_carry_event_availability_overflow_unit_and_description() {
        let listing = fixture_listing();
        let icm = entry(&listing, "icm");
        assert_eq!(icm.event, "L1-icache-load-misses");
        assert_eq!(icm.default_overflow, Sampling::Period(100_003));
        assert_eq!(icm.unit, "events");
        assert_eq!(icm.description, "L1 I-cache misses");
        assert_eq!(
            icm.availability,
            Availability::Unavailable {
                reason: NO_PMU.to_string()
            }
        );

        let clock = entry(&listing, "cpu-clock");
        assert_eq!(clock.availability, Availability::Available);
        assert_eq!(clock.default_overflow, Sampling::Frequency(997));
        assert_eq!(clock.unit, "nanoseconds");
        assert_eq!(entry(&listing, "page-faults").aliases, vec!["faults"]);

        let energy = entry(&listing, "power/energy-pkg/");
        assert_eq!(energy.unit, "Joules");
        assert!(matches!(
            energy.availability,
            Availability::CountOnly { .. }
        ));
        assert!(
            energy.description.starts_with("event=0x02 (counts x"),
            "{}",
            energy.description
        );

        // A sysfs event the parser refuses is listed with the parser's reason.
        let chan = entry(&listing, "uncore_cha_0/chan_read/");
        let Availability::Unavailable { reason } = &chan.availability else {
            panic!("{chan:?}");
        };
        assert!(reason.contains("needs a value for 'chan'"), "{reason}");

        assert_eq!(
            entry(&listing, "ibs_op//").availability,
            Availability::Available
        );
        assert_eq!(
            entry(&listing, "ibs_fetch//").availability,
            Availability::Unavailable {
                reason: "no ibs_fetch PMU on this machine: AMD IBS needs an AMD CPU and a host \
                         kernel"
                    .to_string()
            }
        );
        // PEBS memory events are listed as they sample: precise, with a latency threshold.
        assert_eq!(
            entry(&listing, "cpu/mem-loads,ldlat=30/pp").availability,
            Availability::Available
        );
        let Availability::Unavailable { reason } =
            &entry(&listing, "cpu/mem-stores/pp").availability
        else {
            panic!("the fixture's core PMU has no mem-stores");
        };
        assert!(
            reason.contains("no core PMU with a mem-stores event"),
            "{reason}"
        );
        let amd_df = listing
            .pmus
            .iter()
            .find(|pmu| pmu.name == "amd_df")
            .unwrap();
        assert_eq!(amd_df.formats["event"], "config:0-7,32-35");
    }

    #[test]
    fn text_fits_100_columns_and_footnotes_the_reasons() {
        let text = render_text(&fixture_listing());
        for line in text.lines() {
            assert!(line.chars().count() <= WIDTH, "too wide: {line:?}");
        }
        // A row with its continuation lines, spaces collapsed.
        let row = |name: &str| {
            let lines: Vec<&str> = text.lines().collect();
            let start = lines
                .iter()
                .position(|line| line.starts_with(&format!("  {name} ")))
                .unwrap_or_else(|| panic!("row {name} in\n{text}"));
            let continued = lines[start + 1..]
                .iter()
                .take_while(|line| line.starts_with("    "));
            std::iter::once(&lines[start])
                .chain(continued)
                .flat_map(|line| line.split_whitespace())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            row("cpu-clock"),
            "cpu-clock yes 997 Hz nanoseconds CPU time, from a high-resolution per-CPU timer"
        );
        assert_eq!(
            row("icm"),
            "icm no [1] 100003 events L1 I-cache misses = L1-icache-load-misses"
        );
        assert!(row("branch-instructions").ends_with("(also branches, br)"));
        // Reason 3 is the PEBS section's missing mem-stores.
        assert!(row("cpu/mem-stores/pp").starts_with("cpu/mem-stores/pp no [3] 1000003 events"));
        assert!(row("power/energy-pkg/").starts_with("power/energy-pkg/ count [4] 1000003 Joules"));
        assert!(
            text.contains("\nWhy not here:\n  [1] no hardware PMU: virtual machine?"),
            "{text}"
        );
        assert!(text.contains("  amd_df (type 11): event=config:0-7,32-35, umask=config:8-15"));
        let aliased = text.find("Aliased counters").unwrap();
        let software = text.find("Software events:").unwrap();
        let sysfs = text.find("PMU events of this machine").unwrap();
        assert!(aliased < software && software < sysfs);
    }

    #[test]
    fn long_descriptions_wrap_under_their_column() {
        assert_eq!(wrap("a bb ccc dddd", 6), vec!["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("abcdefgh", 3), vec!["abc", "def", "gh"]);
        assert_eq!(wrap("", 5), vec![""]);
        let text = render_text(&fixture_listing());
        let ibs = text
            .lines()
            .position(|line| line.starts_with("  ibs_op//"))
            .unwrap();
        let next = text.lines().nth(ibs + 1).unwrap();
        let column = text.lines().nth(ibs).unwrap().find("AMD IBS").unwrap();
        assert_eq!(next.len() - next.trim_start().len(), column, "{next:?}");
    }

    #[test]
    fn json_has_every_field() {
        let json = render_json(&fixture_listing()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        let aliased = &value["sections"][0];
        assert_eq!(
            aliased["title"],
            "Aliased counters (Oracle collect -h names)"
        );
        let cycles = &aliased["entries"][0];
        assert_eq!(cycles["name"], "cycles");
        assert_eq!(cycles["event"], "cycles");
        assert_eq!(cycles["default_overflow"]["period"], 9_999_991);
        assert_eq!(cycles["unit"], "CPU-cycles");
        assert_eq!(cycles["availability"]["status"], "unavailable");
        assert_eq!(cycles["availability"]["reason"], NO_PMU);
        let software = &value["sections"][3]["entries"][0];
        assert_eq!(software["name"], "cpu-clock");
        assert_eq!(software["availability"]["status"], "available");
        assert_eq!(software["default_overflow"]["frequency"], 997);
        assert_eq!(value["pmus"][0]["type"], 11);
    }

    #[test]
    fn this_machine_lists_software_events_as_available() {
        let text = run_list(false).unwrap();
        let row = |name: &str| {
            text.lines()
                .find(|line| line.starts_with(&format!("  {name} ")))
                .unwrap_or_else(|| panic!("row {name} in\n{text}"))
                .to_string()
        };
        for name in ["cpu-clock", "task-clock", "page-faults", "context-switches"] {
            assert!(row(name).contains(" yes "), "{}", row(name));
        }
        let json: serde_json::Value = serde_json::from_str(&run_list(true).unwrap()).unwrap();
        let cycles = &json["sections"][1]["entries"][0];
        assert_eq!(cycles["name"], "cycles");
        if !Path::new("/sys/bus/event_source/devices/cpu").exists() {
            assert!(row("cycles").contains(" no ["), "{}", row("cycles"));
            assert_eq!(cycles["availability"]["status"], "unavailable");
            let reason = cycles["availability"]["reason"].as_str().unwrap();
            assert!(
                reason.starts_with("no hardware PMU: virtual machine?"),
                "{reason}"
            );
        }
    }
}
