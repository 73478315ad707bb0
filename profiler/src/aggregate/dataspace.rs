//! Data space: what sampled data cache lines are (a global variable, the heap, a stack, a file
//! mapping) and who touched them (instructions, functions, threads, CPUs), with a hint of false
//! sharing when several threads write one line.
//!
//! What a data address is must be known offline, so the mappings of the processes and the global
//! variables that sampled lines overlap are captured into the profile at record time
//! ([`capture_data_objects`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use object::SymbolKind;

use crate::{
    process::ProcessTable,
    profile::{DataAccess, DataSymbol, EventIndex, MemoryMapping, ProcessMemoryMap, Profile},
    symbolize::module_file::{in_segments, load_bias, sized_symbols},
};

use super::{
    filter::{selected_data_lines, Selection},
    functions::FunctionName,
    latency::{LatencyAccumulator, LatencySummary, LineHistograms},
    location::{instruction_location, CACHE_LINE},
};

/// What a data address belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DataObject {
    /// Global variables overlapping the cache line, by address.
    Variables(Vec<DataSymbol>),
    Heap,
    Stack,
    /// A mapped file, at this offset in it.
    File {
        path: String,
        offset: u64,
    },
    /// Anonymous memory (`mmap`ed: large allocations, thread stacks, arenas).
    Anonymous,
    /// A kernel-labelled mapping (`[vdso]`, `[vvar]`).
    Special(String),
    /// In no mapping the recording knew of.
    Unknown,
}

impl DataObject {
    /// Short description for reports: `counter, hits (app)`, `heap`, `file /data/x.db+0x2000`.
    pub fn describe(&self, line: u64) -> String {
        match self {
            DataObject::Variables(variables) => variables_text(variables, Some(line)),
            DataObject::File { path, offset } => format!("file {path}+{offset:#x}"),
            _ => self.name(),
        }
    }

    /// The object without the line's place in it, which every line of the object shares:
    /// `counter, hits (app)`, `heap`, `file /data/x.db`.
    pub fn name(&self) -> String {
        match self {
            DataObject::Variables(variables) => variables_text(variables, None),
            DataObject::Heap => "heap".to_string(),
            DataObject::Stack => "stack".to_string(),
            DataObject::File { path, .. } => format!("file {path}"),
            DataObject::Anonymous => "anonymous memory".to_string(),
            DataObject::Special(label) => label.clone(),
            DataObject::Unknown => "unknown".to_string(),
        }
    }
}

/// The variables' names, each with the offset of `line` inside it when given and not 0, and
/// their module.
fn variables_text(variables: &[DataSymbol], line: Option<u64>) -> String {
    let names: Vec<String> = variables
        .iter()
        .map(
            |v| match line.and_then(|line| line.checked_sub(v.address)) {
                Some(inside) if inside > 0 => format!("{}+{inside:#x}", v.name),
                _ => v.name.clone(),
            },
        )
        .collect();
    let module = variables
        .first()
        .map(|v| crate::profile::module_basename(&v.module))
        .unwrap_or_default();
    format!("{} ({module})", names.join(", "))
}

/// What the cache line at `line` of process `pid` belongs to.
pub fn describe_data_address(profile: &Profile, pid: u32, line: u64) -> DataObject {
    let variables: Vec<DataSymbol> = profile
        .data_symbols
        .iter()
        .filter(|s| {
            s.pid == pid && s.address < line + CACHE_LINE && s.address + s.size.max(1) > line
        })
        .cloned()
        .collect();
    if !variables.is_empty() {
        return DataObject::Variables(variables);
    }
    let mapping = profile
        .memory_maps
        .iter()
        .find(|m| m.pid == pid)
        .and_then(|m| {
            m.mappings
                .iter()
                .rev()
                .find(|m| (m.start..m.end).contains(&line))
        });
    match mapping {
        None => DataObject::Unknown,
        Some(m) if m.path == "[heap]" => DataObject::Heap,
        Some(m) if m.path.starts_with("[stack") => DataObject::Stack,
        Some(m) if m.path.is_empty() || m.path.starts_with("//anon") => DataObject::Anonymous,
        Some(m) if m.path.starts_with('/') => DataObject::File {
            path: m.path.clone(),
            offset: line - m.start + m.file_offset,
        },
        Some(m) => DataObject::Special(m.path.clone()),
    }
}

/// Captures, at the end of a recording, the mappings of every process with data-address samples
/// and the global variables their sampled lines overlap (read from the modules' symbol tables),
/// so that [`describe_data_address`] works offline.
pub fn capture_data_objects(profile: &mut Profile, processes: &ProcessTable) {
    let mut lines: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    for sample in &profile.data_lines {
        lines.entry(sample.pid).or_default().insert(sample.line);
    }
    for (pid, lines) in &lines {
        let Some(process) = processes.processes.get(pid) else {
            continue;
        };
        let mappings: Vec<MemoryMapping> = process
            .mappings
            .iter()
            .map(|m| MemoryMapping {
                start: m.start,
                end: m.end,
                file_offset: m.file_offset,
                path: m.path.to_string(),
            })
            .collect();
        profile
            .data_symbols
            .extend(variables_on_lines(processes, *pid, &mappings, lines));
        profile.memory_maps.push(ProcessMemoryMap {
            pid: *pid,
            mappings,
        });
    }
}

/// Global variables of the mapped modules that overlap the given lines. A module's bss lies in
/// an anonymous mapping after its file mappings, so lines are matched against each module's
/// whole address range, not only its file-backed mappings.
fn variables_on_lines(
    processes: &ProcessTable,
    pid: u32,
    mappings: &[MemoryMapping],
    lines: &BTreeSet<u64>,
) -> Vec<DataSymbol> {
    // The first mapping of each file gives its load bias.
    let mut modules: BTreeMap<&str, &MemoryMapping> = BTreeMap::new();
    for mapping in mappings.iter().filter(|m| m.path.starts_with('/')) {
        modules.entry(mapping.path.as_str()).or_insert(mapping);
    }
    let mut found = Vec::new();
    for (path, mapping) in modules {
        let Some((_, image)) = processes.module_image([pid], path) else {
            continue;
        };
        let Ok(module) = object::File::parse(&image) else {
            continue;
        };
        let Some(bias) = load_bias(&module, mapping.start, mapping.file_offset) else {
            continue;
        };
        // The sampled lines at link-time addresses.
        let linked: BTreeSet<u64> = lines
            .iter()
            .map(|line| line.wrapping_sub(bias))
            .filter(|&linked| in_segments(&module, linked))
            .collect();
        if linked.is_empty() {
            continue;
        }
        let overlaps = |address: u64, size: u64| {
            // A line overlaps [address, address + size) if it starts before the end and ends
            // after the start.
            linked
                .range(..address.saturating_add(size))
                .next_back()
                .is_some_and(|&line| line + CACHE_LINE > address)
        };
        found.extend(
            sized_symbols(&module, SymbolKind::Data, overlaps)
                .into_iter()
                .map(|s| DataSymbol {
                    pid,
                    address: s.address.wrapping_add(bias),
                    size: s.size,
                    name: s.name,
                    module: path.to_string(),
                }),
        );
    }
    found.sort_by(|a, b| (a.address, &a.name).cmp(&(b.address, &b.name)));
    found.dedup();
    found
}

/// Samples of one toucher of a line (an instruction, a function, a thread or a CPU).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Touch {
    pub name: String,
    pub samples: u64,
    pub stores: u64,
}

/// A hint that a line is contended between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharingHint {
    /// Several threads stored to the line: false sharing if they write different variables.
    SeveralWriters(usize),
    /// Several threads touched the line but the samples do not say which accesses were stores.
    SeveralThreadsUnknownAccess(usize),
}

/// Everything about one sampled data cache line of one process and event.
#[derive(Clone, Debug, PartialEq)]
pub struct DataLineDetails {
    pub pid: u32,
    pub line: u64,
    pub object: DataObject,
    pub samples: u64,
    pub loads: u64,
    pub stores: u64,
    pub latency: Option<LatencySummary>,
    /// Most samples first.
    pub instructions: Vec<Touch>,
    pub functions: Vec<Touch>,
    /// `None` when the capture did not record the accessing threads.
    pub threads: Option<Vec<Touch>>,
    pub cpus: Vec<Touch>,
    pub sharing: Option<SharingHint>,
}

#[derive(Default)]
struct Tally(HashMap<String, (u64, u64)>);

impl Tally {
    fn add(&mut self, name: String, samples: u64, stores: u64) {
        let entry = self.0.entry(name).or_default();
        entry.0 += samples;
        entry.1 += stores;
    }

    fn touches(self) -> Vec<Touch> {
        let mut touches: Vec<Touch> = self
            .0
            .into_iter()
            .map(|(name, (samples, stores))| Touch {
                name,
                samples,
                stores,
            })
            .collect();
        touches.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.name.cmp(&b.name)));
        touches
    }
}

/// Details of one line (`line` as in [`crate::profile::DataLineSample::line`]); `histograms`
/// are the event's, for the selection.
pub fn data_line_details(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
    histograms: &LineHistograms,
    pid: u32,
    line: u64,
) -> DataLineDetails {
    let mut details = DataLineDetails {
        pid,
        line,
        object: describe_data_address(profile, pid, line),
        samples: 0,
        loads: 0,
        stores: 0,
        latency: None,
        instructions: Vec::new(),
        functions: Vec::new(),
        threads: None,
        cpus: Vec::new(),
        sharing: None,
    };
    let mut latency = LatencyAccumulator::default();
    let (mut instructions, mut functions, mut threads, mut cpus) = (
        Tally::default(),
        Tally::default(),
        Tally::default(),
        Tally::default(),
    );
    let mut threads_known = false;
    let mut writers = BTreeSet::new();
    let mut sharers = BTreeSet::new();
    for sample in
        selected_data_lines(profile, event, selection).filter(|s| s.pid == pid && s.line == line)
    {
        let count = sample.stats.count;
        let stores = if sample.access == DataAccess::Store {
            count
        } else {
            0
        };
        details.samples += count;
        details.stores += stores;
        if sample.access == DataAccess::Load {
            details.loads += count;
        }
        latency.add_stats(&sample.stats);
        let frame = &profile.frames[sample.frame as usize];
        instructions.add(instruction_location(frame), count, stores);
        functions.add(FunctionName::of(frame).name, count, stores);
        if let Some(tid) = sample.tid {
            threads_known = true;
            let comm = selection.thread_name(pid, tid);
            threads.add(format!("{comm} {tid}"), count, stores);
            sharers.insert(tid);
            if stores > 0 {
                writers.insert(tid);
            }
        }
        for (cpu, samples) in sample.per_cpu.iter().enumerate().filter(|(_, n)| **n > 0) {
            // Stores per CPU are not kept: a CPU's share of the stores is not known.
            cpus.add(format!("cpu {cpu}"), *samples, 0);
        }
    }
    if let Some(buckets) = histograms.get(pid, line) {
        latency.add_buckets(buckets);
    }
    details.latency = latency.summary();
    details.instructions = instructions.touches();
    details.functions = functions.touches();
    details.cpus = cpus.touches();
    details.threads = threads_known.then(|| threads.touches());
    let access_known = details.loads + details.stores > 0;
    details.sharing = if writers.len() >= 2 {
        Some(SharingHint::SeveralWriters(writers.len()))
    } else if !access_known && sharers.len() >= 2 {
        Some(SharingHint::SeveralThreadsUnknownAccess(sharers.len()))
    } else {
        None
    };
    details
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{
        filter::SampleFilter,
        test_samples::{self, HEAP_LINE, SHARED_LINE},
    };

    fn touch(name: &str, samples: u64, stores: u64) -> Touch {
        Touch {
            name: name.into(),
            samples,
            stores,
        }
    }

    #[test]
    fn a_line_written_by_two_threads_hints_false_sharing() {
        let profile = test_samples::profile();
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let histograms = LineHistograms::new(&profile, 1, &selection);
        let line = data_line_details(&profile, 1, &selection, &histograms, 100, SHARED_LINE);
        assert_eq!((line.samples, line.loads, line.stores), (4, 1, 3));
        assert_eq!(
            line.instructions,
            [touch("compute+0x90", 3, 2), touch("compute+0xa4", 1, 1)]
        );
        assert_eq!(line.functions, [touch("compute", 4, 3)]);
        assert_eq!(
            line.threads.unwrap(),
            [touch("app 100", 3, 2), touch("app worker 101", 1, 1)]
        );
        assert_eq!(line.cpus, [touch("cpu 0", 3, 0), touch("cpu 1", 1, 0)]);
        assert_eq!(line.sharing, Some(SharingHint::SeveralWriters(2)));
        assert_eq!(line.latency.unwrap().max, 80);
        match line.object {
            DataObject::Variables(v) => assert_eq!(v.len(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lines_without_threads_or_access_kinds_say_so() {
        let profile = test_samples::profile();
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        let histograms = LineHistograms::new(&profile, 1, &selection);
        let line = data_line_details(&profile, 1, &selection, &histograms, 100, HEAP_LINE);
        assert_eq!(line.object, DataObject::Heap);
        assert_eq!((line.samples, line.loads, line.stores), (3, 0, 0));
        assert_eq!(line.threads, None);
        assert_eq!(line.sharing, None);
        assert_eq!(
            line.functions,
            [touch("<[u8; 4] as app::Worker>::run", 3, 0)]
        );
    }

    #[test]
    fn addresses_are_described_by_their_mapping() {
        let profile = test_samples::profile();
        let describe =
            |address: u64| describe_data_address(&profile, 100, address).describe(address);
        assert_eq!(describe(SHARED_LINE), "counter_a, counter_b (app)");
        assert_eq!(describe(0x5555_6000_1000), "heap");
        assert_eq!(describe(0x7ffc_0000_1000), "stack");
        assert_eq!(describe(0x7f00_1000_0040), "anonymous memory");
        assert_eq!(describe(0x7f00_2000_0040), "file /data/table.db+0x2040");
        assert_eq!(describe(0x7ffc_1000_0000), "[vdso]");
        assert_eq!(describe(0x10), "unknown");
        assert_eq!(
            describe_data_address(&profile, 7, SHARED_LINE),
            DataObject::Unknown
        );
        // A line inside a larger variable names the offset into it.
        let mut big = profile.clone();
        big.data_symbols[0].size = 0x100;
        big.data_symbols.truncate(1);
        let inside = SHARED_LINE + 0x40;
        assert_eq!(
            describe_data_address(&big, 100, inside).describe(inside),
            "counter_a+0x40 (app)"
        );
    }

    /// A global variable of this test binary: its line is found through the live mappings.
    #[no_mangle]
    static PROFILER_DATA_PROBE: [u64; 16] = [7; 16];

    /// 64 KiB of zeros: bss, most of it past the file's last page, in anonymous memory.
    #[no_mangle]
    static PROFILER_BSS_PROBE: [std::sync::atomic::AtomicU64; 8192] =
        [const { std::sync::atomic::AtomicU64::new(0) }; 8192];

    #[test]
    fn variables_of_a_running_binary_are_captured() {
        let address = std::hint::black_box(&PROFILER_DATA_PROBE) as *const _ as u64;
        let line = address & !(CACHE_LINE - 1);
        let bss = std::hint::black_box(&PROFILER_BSS_PROBE) as *const _ as u64;
        let bss_end_line = (bss + 8192 * 8 - 1) & !(CACHE_LINE - 1);
        let pid = std::process::id();
        let mut processes = ProcessTable::default();
        processes.scan_process(pid);
        let sample = |line| crate::profile::DataLineSample {
            pid,
            line,
            ..Default::default()
        };
        let mut profile = Profile {
            data_lines: vec![sample(line), sample(bss_end_line)],
            ..Profile::default()
        };
        capture_data_objects(&mut profile, &processes);
        assert_eq!(profile.memory_maps.len(), 1);
        assert!(profile.memory_maps[0]
            .mappings
            .iter()
            .any(|m| m.path == "[stack]"));
        let probe = profile
            .data_symbols
            .iter()
            .find(|s| s.name == "PROFILER_DATA_PROBE")
            .unwrap_or_else(|| panic!("probe not found in {:?}", profile.data_symbols));
        assert_eq!((probe.address, probe.size), (address, 128));
        assert_eq!(
            probe.module,
            std::env::current_exe().unwrap().to_string_lossy()
        );
        match describe_data_address(&profile, pid, line) {
            DataObject::Variables(v) => assert!(v.iter().any(|v| v.name == "PROFILER_DATA_PROBE")),
            other => panic!("{other:?}"),
        }
        // The line at the end of the bss probe lies in anonymous memory after the file's pages.
        let end = describe_data_address(&profile, pid, bss_end_line).describe(bss_end_line);
        let probe_end = format!("PROFILER_BSS_PROBE+{:#x}", bss_end_line - bss);
        assert!(
            end.split(", ").any(|name| name.starts_with(&probe_end)),
            "{end}"
        );
        assert!(!end.contains("_ZN"), "names are demangled: {end}");
    }
}
