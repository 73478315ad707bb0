//! The PMUs the kernel exposes under `<sysfs>/bus/event_source/devices/`: each one's type number,
//! the format fields its events are built from (`format/*`, e.g. `event` = `config:0-7`), the
//! events it names (`events/*`, with their `.unit` and `.scale` files), its capabilities (`caps/*`)
//! and, for PMUs that count per package rather than per task, the CPUs to open them on.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::Path;

/// Which `perf_event_attr` word a format field lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigWord {
    Config,
    Config1,
    Config2,
    Config3,
}

impl ConfigWord {
    pub const ALL: [ConfigWord; 4] = [
        ConfigWord::Config,
        ConfigWord::Config1,
        ConfigWord::Config2,
        ConfigWord::Config3,
    ];

    /// The name sysfs format files and event terms use for the word.
    pub fn name(self) -> &'static str {
        match self {
            ConfigWord::Config => "config",
            ConfigWord::Config1 => "config1",
            ConfigWord::Config2 => "config2",
            ConfigWord::Config3 => "config3",
        }
    }

    pub fn from_name(name: &str) -> Option<ConfigWord> {
        ConfigWord::ALL.into_iter().find(|word| word.name() == name)
    }
}

/// Where a PMU's format term goes: bit ranges of one config word, e.g. `config:0-7,32-35`.
///
/// A value is spread over the ranges low bits first: its lowest bits fill the first range, the
/// next bits the second range, and so on (the kernel's and perf's convention).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatField {
    pub word: ConfigWord,
    /// Inclusive `(low, high)` bit positions, in the order the format file lists them.
    pub ranges: Vec<(u8, u8)>,
}

impl FormatField {
    /// Parses the content of a sysfs format file (`config:0-7,32-35`, `config1:0-63`, `config:21`).
    pub fn parse(text: &str) -> Result<FormatField, String> {
        let text = text.trim();
        let (word, ranges) = text
            .split_once(':')
            .ok_or_else(|| format!("'{text}' has no ':' between the config word and the bits"))?;
        let word = ConfigWord::from_name(word).ok_or_else(|| {
            format!("'{word}' is not a config word (config, config1, config2, config3)")
        })?;
        let mut parsed: Vec<(u8, u8)> = Vec::new();
        let mut used = 0u64;
        for range in ranges.split(',') {
            let (low, high) = match range.split_once('-') {
                Some((low, high)) => (parse_bit(low)?, parse_bit(high)?),
                None => {
                    let bit = parse_bit(range)?;
                    (bit, bit)
                }
            };
            if low > high {
                return Err(format!("bit range '{range}' runs backwards"));
            }
            let mask = bit_mask(low, high);
            if used & mask != 0 {
                return Err(format!("bit range '{range}' overlaps an earlier range"));
            }
            used |= mask;
            parsed.push((low, high));
        }
        Ok(FormatField {
            word,
            ranges: parsed,
        })
    }

    /// Number of value bits the field holds.
    pub fn width(&self) -> u32 {
        self.ranges
            .iter()
            .map(|&(low, high)| u32::from(high - low) + 1)
            .sum()
    }

    /// The largest value that fits.
    pub fn max_value(&self) -> u64 {
        match self.width() {
            64 => u64::MAX,
            width => (1u64 << width) - 1,
        }
    }

    /// Returns `word` with the field's bits replaced by `value`, or `None` if `value` does not fit.
    pub fn insert(&self, word: u64, value: u64) -> Option<u64> {
        if value > self.max_value() {
            return None;
        }
        let mut word = word;
        let mut rest = value;
        for &(low, high) in &self.ranges {
            let bits = u32::from(high - low) + 1;
            let chunk = rest & low_mask(bits);
            word = (word & !bit_mask(low, high)) | (chunk << low);
            rest = rest.checked_shr(bits).unwrap_or(0);
        }
        Some(word)
    }

    /// Reads the field's value back out of `word`.
    pub fn extract(&self, word: u64) -> u64 {
        let mut value = 0u64;
        let mut shift = 0u32;
        for &(low, high) in &self.ranges {
            let bits = u32::from(high - low) + 1;
            value |= ((word >> low) & low_mask(bits)) << shift;
            shift += bits;
        }
        value
    }
}

impl fmt::Display for FormatField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.word.name())?;
        for (index, &(low, high)) in self.ranges.iter().enumerate() {
            let separator = if index == 0 { "" } else { "," };
            if low == high {
                write!(f, "{separator}{low}")?;
            } else {
                write!(f, "{separator}{low}-{high}")?;
            }
        }
        Ok(())
    }
}

fn parse_bit(text: &str) -> Result<u8, String> {
    match text.trim().parse::<u8>() {
        Ok(bit) if bit < 64 => Ok(bit),
        _ => Err(format!("'{text}' is not a bit position 0-63")),
    }
}

fn low_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

fn bit_mask(low: u8, high: u8) -> u64 {
    low_mask(u32::from(high - low) + 1) << low
}

/// An event a PMU names in sysfs, e.g. `cpu/events/cache-misses` = `event=0x2e,umask=0x41`.
#[derive(Clone, Debug, PartialEq)]
pub struct PmuEvent {
    pub name: String,
    /// The terms the name stands for, as the kernel wrote them.
    pub definition: String,
    /// From `<name>.unit`, e.g. `Joules`.
    pub unit: Option<String>,
    /// From `<name>.scale`: multiply counts by it to get `unit`.
    pub scale: Option<f64>,
}

/// One PMU of this machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Pmu {
    pub name: String,
    /// The `perf_event_attr.type` value that selects this PMU.
    pub type_: u32,
    pub formats: BTreeMap<String, FormatField>,
    pub events: BTreeMap<String, PmuEvent>,
    pub caps: BTreeMap<String, String>,
    /// CPUs to open events on, for PMUs that count per package or die (uncore, RAPL) and so
    /// cannot follow a task (sysfs `cpumask`).
    pub cpumask: Option<Vec<u32>>,
    /// Whether this is a CPU core PMU (the one behind the generic hardware events).
    pub core: bool,
}

impl Pmu {
    /// Finds a named event: exact name first, then ignoring case as perf does.
    pub fn event(&self, name: &str) -> Option<&PmuEvent> {
        self.events.get(name).or_else(|| {
            self.events
                .values()
                .find(|event| event.name.eq_ignore_ascii_case(name))
        })
    }
}

/// Every PMU of the machine, by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PmuRegistry {
    pmus: BTreeMap<String, Pmu>,
}

/// Suffixes of the files sysfs puts beside an event file to describe it.
const EVENT_ATTRIBUTE_SUFFIXES: [&str; 4] = [".unit", ".scale", ".per-pkg", ".snapshot"];

impl PmuRegistry {
    /// Reads `<root>/bus/event_source/devices/*` (`root` is `/sys` on a live system).
    pub fn from_sysfs(root: &Path) -> io::Result<PmuRegistry> {
        let devices = root.join("bus/event_source/devices");
        let mut pmus = BTreeMap::new();
        for entry in fs::read_dir(&devices).map_err(|err| with_path(&devices, err))? {
            let dir = entry.map_err(|err| with_path(&devices, err))?.path();
            let Some(name) = dir.file_name().and_then(|name| name.to_str()) else {
                continue;
            };
            let pmu = read_pmu(name, &dir)?;
            pmus.insert(pmu.name.clone(), pmu);
        }
        Ok(PmuRegistry { pmus })
    }

    /// The PMUs of the running system.
    pub fn live() -> io::Result<PmuRegistry> {
        PmuRegistry::from_sysfs(Path::new("/sys"))
    }

    pub fn get(&self, name: &str) -> Option<&Pmu> {
        self.pmus.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Pmu> {
        self.pmus.values()
    }

    pub fn names(&self) -> Vec<&str> {
        self.pmus.keys().map(String::as_str).collect()
    }

    /// Whether the CPU exposes a hardware PMU; without one (most virtual machines) generic
    /// hardware, cache and raw events cannot be opened.
    pub fn has_hardware_pmu(&self) -> bool {
        self.pmus.values().any(|pmu| pmu.core)
    }

    /// An Arm core PMU (`armv8_pmuv3_0`, `armv8_neoverse_n1`, `armv9_...`): the machine is an
    /// Arm one, whose PMUs have no precise modes.
    pub fn arm_core_pmu(&self) -> Option<&Pmu> {
        self.pmus
            .values()
            .find(|pmu| pmu.core && pmu.name.starts_with("armv"))
    }
}

fn read_pmu(name: &str, dir: &Path) -> io::Result<Pmu> {
    let type_path = dir.join("type");
    let type_text = read_trimmed(&type_path)?;
    let type_ = type_text.parse::<u32>().map_err(|_| {
        invalid_data(
            &type_path,
            &format!("'{type_text}' is not a PMU type number"),
        )
    })?;

    let mut formats = BTreeMap::new();
    for (term, path) in list_files(&dir.join("format"))? {
        let text = read_trimmed(&path)?;
        let field = FormatField::parse(&text).map_err(|reason| invalid_data(&path, &reason))?;
        formats.insert(term, field);
    }

    let event_files = list_files(&dir.join("events"))?;
    let mut events = BTreeMap::new();
    for (event_name, path) in &event_files {
        let is_attribute = EVENT_ATTRIBUTE_SUFFIXES.iter().any(|suffix| {
            event_name
                .strip_suffix(suffix)
                .is_some_and(|stem| event_files.iter().any(|(other, _)| other.as_str() == stem))
        });
        if is_attribute {
            continue;
        }
        let unit = read_optional(&dir.join("events").join(format!("{event_name}.unit")))?;
        let scale_path = dir.join("events").join(format!("{event_name}.scale"));
        let scale = match read_optional(&scale_path)? {
            Some(text) => Some(
                text.parse::<f64>()
                    .map_err(|_| invalid_data(&scale_path, &format!("'{text}' is not a number")))?,
            ),
            None => None,
        };
        events.insert(
            event_name.clone(),
            PmuEvent {
                name: event_name.clone(),
                definition: read_trimmed(path)?,
                unit,
                scale,
            },
        );
    }

    let mut caps = BTreeMap::new();
    for (cap, path) in list_files(&dir.join("caps"))? {
        caps.insert(cap, read_trimmed(&path)?);
    }

    let cpumask_path = dir.join("cpumask");
    let cpumask = match read_optional(&cpumask_path)? {
        Some(text) => {
            Some(parse_cpu_list(&text).map_err(|reason| invalid_data(&cpumask_path, &reason))?)
        }
        None => None,
    };
    // x86 names its core PMU `cpu`; hybrid x86 (`cpu_core`, `cpu_atom`) and Arm core PMUs
    // publish the CPUs they cover in a `cpus` file, which uncore PMUs do not have.
    let core = name == "cpu" || dir.join("cpus").is_file();

    Ok(Pmu {
        name: name.to_string(),
        type_,
        formats,
        events,
        caps,
        cpumask,
        core,
    })
}

/// Parses a kernel CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|part| !part.is_empty()) {
        let parse = |cpu: &str| {
            cpu.trim()
                .parse::<u32>()
                .map_err(|_| format!("'{cpu}' in CPU list '{text}' is not a CPU number"))
        };
        match part.split_once('-') {
            Some((first, last)) => cpus.extend(parse(first)?..=parse(last)?),
            None => cpus.push(parse(part)?),
        }
    }
    Ok(cpus)
}

/// The regular files of a directory as (name, path), sorted; a missing directory is empty.
fn list_files(dir: &Path) -> io::Result<Vec<(String, std::path::PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(with_path(dir, err)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| with_path(dir, err))?;
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        if let Some(name) = entry.file_name().to_str() {
            files.push((name.to_string(), path));
        }
    }
    files.sort();
    Ok(files)
}

fn read_trimmed(path: &Path) -> io::Result<String> {
    fs::read_to_string(path)
        .map(|text| text.trim().to_string())
        .map_err(|err| with_path(path, err))
}

fn read_optional(path: &Path) -> io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(with_path(path, err)),
    }
}

fn with_path(path: &Path, err: io::Error) -> io::Error {
    io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}

fn invalid_data(path: &Path, reason: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {reason}", path.display()),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Writes a sysfs-like tree: `(relative path, content)` pairs under `bus/event_source/devices`.
    pub(crate) fn sysfs_fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("temp dir");
        for (path, content) in files {
            let path = root.path().join("bus/event_source/devices").join(path);
            fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            fs::write(&path, format!("{content}\n")).expect("write fixture");
        }
        root
    }

    /// An x86-like machine: a core PMU with named events, an uncore PMU, IBS, software. Read
    /// from a sysfs-like tree once; the registry holds everything it read.
    pub(crate) fn fixture_registry() -> PmuRegistry {
        static REGISTRY: std::sync::OnceLock<PmuRegistry> = std::sync::OnceLock::new();
        REGISTRY.get_or_init(read_fixture).clone()
    }

    fn read_fixture() -> PmuRegistry {
        let root = sysfs_fixture(&[
            ("cpu/type", "4"),
            ("cpu/format/event", "config:0-7"),
            ("cpu/format/umask", "config:8-15"),
            ("cpu/format/edge", "config:18"),
            ("cpu/format/cmask", "config:24-31"),
            ("cpu/format/ldlat", "config1:0-15"),
            ("cpu/format/frontend", "config1:0-23"),
            ("cpu/events/cpu-cycles", "event=0x3c"),
            ("cpu/events/mem-loads", "event=0xcd,umask=0x1,ldlat=3"),
            ("cpu/events/mem-loads-aux", "event=0x03,umask=0x82"),
            ("cpu/caps/max_precise", "3"),
            ("cpu/caps/pmu_name", "skylake"),
            ("amd_df/type", "11"),
            ("amd_df/format/event", "config:0-7,32-35"),
            ("amd_df/format/umask", "config:8-15"),
            ("amd_df/cpumask", "0,8"),
            ("power/type", "17"),
            ("power/format/event", "config:0-7"),
            ("power/events/energy-pkg", "event=0x02"),
            (
                "power/events/energy-pkg.scale",
                "2.3283064365386962890625e-10",
            ),
            ("power/events/energy-pkg.unit", "Joules"),
            ("power/cpumask", "0"),
            ("ibs_op/type", "10"),
            ("ibs_op/format/cnt_ctl", "config:19"),
            ("ibs_op/caps/zen4_ibs_extensions", "1"),
            ("uncore_cha_0/type", "20"),
            ("uncore_cha_0/format/event", "config:0-7"),
            ("uncore_cha_0/format/chan", "config:36-39"),
            ("uncore_cha_0/events/chan_read", "event=0x10,chan=?"),
            ("software/type", "1"),
        ]);
        PmuRegistry::from_sysfs(root.path()).expect("fixture parses")
    }

    #[test]
    fn format_files_parse_single_bits_ranges_and_multi_ranges() {
        let single = FormatField::parse("config:21").unwrap();
        assert_eq!(single.word, ConfigWord::Config);
        assert_eq!(single.ranges, vec![(21, 21)]);
        assert_eq!(single.width(), 1);

        let multi = FormatField::parse("config:0-7,32-35").unwrap();
        assert_eq!(multi.ranges, vec![(0, 7), (32, 35)]);
        assert_eq!(multi.width(), 12);
        assert_eq!(multi.max_value(), 0xfff);
        assert_eq!(multi.to_string(), "config:0-7,32-35");

        let full = FormatField::parse("config1:0-63").unwrap();
        assert_eq!(full.word, ConfigWord::Config1);
        assert_eq!(full.max_value(), u64::MAX);
    }

    #[test]
    fn multi_range_values_fill_ranges_low_bits_first() {
        let field = FormatField::parse("config:0-7,32-35").unwrap();
        // Low byte 0xcd lands in bits 0-7, the next nibble 0x5 in bits 32-35.
        let word = field.insert(0, 0x5cd).unwrap();
        assert_eq!(word, 0x5_0000_00cd);
        assert_eq!(field.extract(word), 0x5cd);
        // Bits outside the field are kept; bits inside are replaced.
        assert_eq!(field.insert(0xff00 | 0xff, 0x001).unwrap(), 0xff01);
        assert_eq!(field.insert(0, 0x1000), None);
    }

    #[test]
    fn malformed_format_files_are_rejected_with_the_reason() {
        assert!(FormatField::parse("config0-7")
            .unwrap_err()
            .contains("no ':'"));
        assert!(FormatField::parse("config9:0-7")
            .unwrap_err()
            .contains("not a config word"));
        assert!(FormatField::parse("config:7-0")
            .unwrap_err()
            .contains("backwards"));
        assert!(FormatField::parse("config:0-64")
            .unwrap_err()
            .contains("0-63"));
        assert!(FormatField::parse("config:0-7,4-9")
            .unwrap_err()
            .contains("overlaps"));
    }

    #[test]
    fn registry_reads_types_formats_events_caps_and_cpumasks() {
        let registry = fixture_registry();
        assert_eq!(
            registry.names(),
            vec![
                "amd_df",
                "cpu",
                "ibs_op",
                "power",
                "software",
                "uncore_cha_0"
            ]
        );
        let cpu = registry.get("cpu").unwrap();
        assert_eq!(cpu.type_, 4);
        assert!(cpu.core);
        assert_eq!(
            cpu.formats["umask"],
            FormatField::parse("config:8-15").unwrap()
        );
        assert_eq!(
            cpu.events["mem-loads"].definition,
            "event=0xcd,umask=0x1,ldlat=3"
        );
        assert_eq!(cpu.caps["max_precise"], "3");
        assert_eq!(cpu.cpumask, None);
        assert!(cpu.event("CPU-CYCLES").is_some());

        let power = registry.get("power").unwrap();
        assert!(!power.core);
        // `.scale` and `.unit` describe the event beside them; they are not events themselves.
        assert_eq!(power.events.keys().collect::<Vec<_>>(), vec!["energy-pkg"]);
        let energy = &power.events["energy-pkg"];
        assert_eq!(energy.unit.as_deref(), Some("Joules"));
        assert_eq!(energy.scale, Some(2.328_306_436_538_696_3e-10));
        assert_eq!(power.cpumask, Some(vec![0]));
        assert_eq!(registry.get("amd_df").unwrap().cpumask, Some(vec![0, 8]));
        assert!(registry.has_hardware_pmu());
    }

    #[test]
    fn registry_errors_name_the_file() {
        let root = sysfs_fixture(&[("cpu/type", "4"), ("cpu/format/event", "bogus")]);
        let err = PmuRegistry::from_sysfs(root.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("cpu/format/event"), "{err}");

        let missing = tempfile::tempdir().unwrap();
        let err = PmuRegistry::from_sysfs(missing.path()).unwrap_err();
        assert!(
            err.to_string().contains("bus/event_source/devices"),
            "{err}"
        );
    }

    #[test]
    fn cpu_lists_expand_ranges() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert!(parse_cpu_list("0-x").unwrap_err().contains("'x'"));
    }

    #[test]
    fn this_machines_sysfs_has_the_software_pmu() {
        let registry = PmuRegistry::live().expect("/sys is readable");
        assert_eq!(registry.get("software").map(|pmu| pmu.type_), Some(1));
        if Path::new("/sys/bus/event_source/devices/cpu").exists() {
            assert!(registry.has_hardware_pmu());
        }
    }

    /// A random multi-range format: up to four disjoint ranges in random order.
    fn arbitrary_format() -> impl Strategy<Value = FormatField> {
        (
            proptest::collection::btree_set(0u8..64, 1..9),
            any::<bool>(),
            0usize..4,
        )
            .prop_map(|(cuts, reverse, word)| {
                let cuts: Vec<u8> = cuts.into_iter().collect();
                let mut ranges: Vec<(u8, u8)> = cuts
                    .chunks(2)
                    .map(|pair| (pair[0], *pair.last().unwrap()))
                    .collect();
                if reverse {
                    ranges.reverse();
                }
                FormatField {
                    word: ConfigWord::ALL[word],
                    ranges,
                }
            })
    }

    proptest! {
        #[test]
        fn values_round_trip_through_any_multi_range_format(
            field in arbitrary_format(),
            value in any::<u64>(),
            background in any::<u64>(),
        ) {
            let value = value & field.max_value();
            let word = field.insert(background, value).unwrap();
            prop_assert_eq!(field.extract(word), value);
            // Bits outside the field are untouched.
            let outside = field.ranges.iter().fold(u64::MAX, |mask, &(l, h)| mask & !bit_mask(l, h));
            prop_assert_eq!(word & outside, background & outside);
            // The text form parses back to the same field.
            prop_assert_eq!(FormatField::parse(&field.to_string()).unwrap(), field);
        }

        #[test]
        fn values_wider_than_the_field_are_refused(field in arbitrary_format(), value in any::<u64>()) {
            prop_assume!(field.width() < 64);
            let too_big = value | (field.max_value() + 1);
            prop_assert_eq!(field.insert(0, too_big), None);
        }
    }
}
