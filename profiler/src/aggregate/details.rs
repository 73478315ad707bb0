//! Function details: the statements and instructions of one function with their samples, in
//! address order, grouped by 64-byte instruction cache line (HP Caliper's icache report).
//!
//! Lines come from the line table captured with the code, else from the sampled frames. An
//! instruction without a line of its own inherits the one before it (after it, at the start) and
//! is marked approximate. A statement whose line comes before a line already seen in the same
//! file is out of source order (the optimizer moved it).

use std::collections::{BTreeMap, HashMap};

use crate::profile::{EventIndex, Frame, FrameId, Profile};

use super::{
    code::{can_disassemble, code_of, disassemble, function_file_offset},
    filter::Selection,
    functions::FunctionName,
    latency::{LatencyAccumulator, LatencySummary},
    location::{innermost_location, CACHE_LINE},
};

/// Where the instruction rows come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeSource {
    /// Every instruction, disassembled from the bytes captured at record time.
    Disassembled,
    /// Sampled instructions only: the kernel's code is not captured.
    Kernel,
    /// Sampled instructions only: the module file was not readable at record time (or the
    /// profile comes from a source that does not capture code).
    NotCaptured,
    /// Sampled instructions only: the code was captured, but the profile's architecture (not
    /// x86-64) has no disassembler here.
    NoDisassembler,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StatementRow {
    pub file: Option<String>,
    pub line: u32,
    /// The statement's line comes before a line already shown from the same file.
    pub out_of_order: bool,
    /// Samples of the instructions up to the next statement.
    pub samples: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct InstructionRow {
    /// Offset from the function's first byte.
    pub offset: u64,
    /// Link-time address with captured code, else the sampled address.
    pub address: u64,
    /// Byte position in its 64-byte cache line.
    pub slot: u64,
    pub line: Option<u32>,
    /// The line is inherited from a neighbouring instruction.
    pub approximate_line: bool,
    /// Disassembly, when the code was captured.
    pub text: Option<String>,
    pub samples: u64,
    pub latency: Option<LatencySummary>,
    /// Samples of the whole cache line, on the line's first row only.
    pub cache_line_samples: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum DetailRow {
    Statement(StatementRow),
    Instruction(InstructionRow),
    /// A row of dashes: the next instruction starts the next cache line.
    CacheLineBoundary,
    /// A row of tildes: cache lines between these two are not shown.
    Gap,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FunctionDetails {
    pub function: FunctionName,
    /// For an inlined function, the function whose instructions hold it: those are shown, with
    /// the samples taken in the inlined code.
    pub inlined_into: Option<FunctionName>,
    pub module: String,
    pub event: EventIndex,
    /// Instruction samples of the event that pass the filters (the 100% of the shares).
    pub event_samples: u64,
    /// Instruction samples in the function.
    pub samples: u64,
    pub source: CodeSource,
    pub rows: Vec<DetailRow>,
}

/// One instruction before rows are laid out.
struct Site {
    offset: u64,
    address: u64,
    text: Option<String>,
    /// File and line of the instruction itself (the innermost inlined location).
    location: Option<(Option<String>, u32)>,
    samples: u64,
    latency: LatencyAccumulator,
}

/// Details of `function` in `event`; `None` when no instruction sample fell in it.
pub fn function_details(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
    function: &FunctionName,
) -> Option<FunctionDetails> {
    let mut event_samples = 0;
    // Samples per function instance (module, file offset of its start), then per frame.
    let mut instances: BTreeMap<(String, u64), HashMap<FrameId, u64>> = BTreeMap::new();
    for sample in profile
        .instructions
        .iter()
        .filter(|s| s.event == event && selection.process(s.pid))
    {
        event_samples += sample.stats.count;
        let frame = &profile.frames[sample.frame as usize];
        // An inlined function's instructions are those of the function it was inlined into.
        if !FunctionName::logical(frame).any(|f| f == *function) {
            continue;
        }
        let start = function_file_offset(frame).unwrap_or(frame.module_offset);
        *instances
            .entry((frame.module.clone(), start))
            .or_default()
            .entry(sample.frame)
            .or_default() += sample.stats.count;
    }
    // Processes running the same function from different files: show the hottest.
    let (_, frames) = instances.into_iter().max_by_key(|(key, frames)| {
        (frames.values().sum::<u64>(), std::cmp::Reverse(key.clone()))
    })?;
    let any_frame = &profile.frames[*frames.keys().next()? as usize];
    let offset_of = |frame: &Frame| {
        frame
            .function_address
            .map_or(0, |start| frame.address.wrapping_sub(start))
    };
    let captured = code_of(profile, any_frame);
    let code = captured.filter(|_| can_disassemble(&profile.meta.architecture));
    let source = match (captured, code, any_frame.kernel) {
        (_, Some(_), _) => CodeSource::Disassembled,
        (Some(_), None, _) => CodeSource::NoDisassembler,
        (None, _, true) => CodeSource::Kernel,
        (None, _, false) => CodeSource::NotCaptured,
    };
    let mut sites: BTreeMap<u64, Site> = BTreeMap::new();
    if let Some(code) = code {
        let lines: HashMap<u32, (&str, u32)> = code
            .lines
            .iter()
            .map(|l| (l.offset, (l.file.as_str(), l.line)))
            .collect();
        for instruction in disassemble(&code.bytes, code.address) {
            let location = lines
                .get(&instruction.offset)
                .map(|(file, line)| (Some(file.to_string()), *line));
            sites.insert(
                u64::from(instruction.offset),
                Site {
                    offset: u64::from(instruction.offset),
                    address: instruction.address,
                    text: Some(instruction.text),
                    location,
                    samples: 0,
                    latency: LatencyAccumulator::default(),
                },
            );
        }
    }
    for (id, samples) in &frames {
        let frame = &profile.frames[*id as usize];
        let offset = offset_of(frame);
        let (file, line, _) = innermost_location(frame);
        let site = sites.entry(offset).or_insert_with(|| Site {
            offset,
            address: frame.address,
            text: None,
            location: None,
            samples: 0,
            latency: LatencyAccumulator::default(),
        });
        site.samples += samples;
        if site.location.is_none() {
            site.location = line.map(|line| (file.map(str::to_string), line));
        }
    }
    add_latency(profile, event, selection, &frames, &mut sites, offset_of);
    let sites: Vec<Site> = sites.into_values().collect();
    let samples = sites.iter().map(|s| s.samples).sum();
    // The link-time and the runtime address of a byte share their position in a cache line.
    let line_of =
        |site: &Site| (code.map_or(site.address, |c| c.address) + site.offset) / CACHE_LINE;
    let line_position =
        |site: &Site| (code.map_or(site.address, |c| c.address) + site.offset) % CACHE_LINE;
    let rows = lay_out(&sites, line_of, line_position);
    let host = FunctionName::of(any_frame);
    Some(FunctionDetails {
        function: function.clone(),
        inlined_into: (host != *function).then_some(host),
        module: any_frame.module.clone(),
        event,
        event_samples,
        samples,
        source,
        rows,
    })
}

fn add_latency(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
    frames: &HashMap<FrameId, u64>,
    sites: &mut BTreeMap<u64, Site>,
    offset_of: impl Fn(&Frame) -> u64,
) {
    // The offset of a frame of this function.
    let offset = |frame: FrameId| {
        frames
            .contains_key(&frame)
            .then(|| offset_of(&profile.frames[frame as usize]))
    };
    for sample in profile
        .instructions
        .iter()
        .filter(|s| s.event == event && selection.process(s.pid))
    {
        if let Some(site) = offset(sample.frame).and_then(|o| sites.get_mut(&o)) {
            site.latency.add_stats(&sample.stats);
        }
    }
    for histogram in profile
        .latency
        .iter()
        .filter(|h| h.event == event && selection.process(h.pid))
    {
        if let Some(site) = offset(histogram.frame).and_then(|o| sites.get_mut(&o)) {
            site.latency.add_buckets(&histogram.buckets);
        }
    }
}

/// Rows in address order: statements where the line changes, separators between cache lines,
/// each cache line's total on its first instruction.
fn lay_out(
    sites: &[Site],
    line_of: impl Fn(&Site) -> u64,
    line_position: impl Fn(&Site) -> u64,
) -> Vec<DetailRow> {
    let mut line_totals: HashMap<u64, u64> = HashMap::new();
    for site in sites {
        *line_totals.entry(line_of(site)).or_default() += site.samples;
    }
    let mut rows = Vec::new();
    // Lines inherited by instructions without one: the previous instruction's, or for leading
    // instructions the first line of the function.
    let first_line = sites.iter().find_map(|s| s.location.as_ref().map(|l| l.1));
    let mut inherited = first_line;
    let mut statement: Option<(usize, (Option<String>, u32))> = None;
    let mut highest_line: HashMap<Option<String>, u32> = HashMap::new();
    let mut previous_cache_line = None;
    for site in sites {
        let cache_line = line_of(site);
        let first_in_cache_line = previous_cache_line != Some(cache_line);
        match previous_cache_line {
            Some(previous) if previous + 1 == cache_line => rows.push(DetailRow::CacheLineBoundary),
            Some(previous) if previous != cache_line => rows.push(DetailRow::Gap),
            _ => {}
        }
        previous_cache_line = Some(cache_line);
        if let Some((file, line)) = &site.location {
            let key = (file.clone(), *line);
            if statement
                .as_ref()
                .is_none_or(|(_, current)| *current != key)
            {
                let highest = highest_line.entry(file.clone()).or_insert(0);
                let out_of_order = *line < *highest;
                *highest = (*highest).max(*line);
                rows.push(DetailRow::Statement(StatementRow {
                    file: file.clone(),
                    line: *line,
                    out_of_order,
                    samples: 0,
                }));
                statement = Some((rows.len() - 1, key));
            }
            inherited = Some(*line);
        }
        if let Some((index, _)) = &statement {
            if let DetailRow::Statement(row) = &mut rows[*index] {
                row.samples += site.samples;
            }
        }
        rows.push(DetailRow::Instruction(InstructionRow {
            offset: site.offset,
            address: site.address,
            slot: line_position(site),
            line: site.location.as_ref().map(|l| l.1).or(inherited),
            approximate_line: site.location.is_none() && inherited.is_some(),
            text: site.text.clone(),
            samples: site.samples,
            latency: site.latency.summary(),
            cache_line_samples: first_in_cache_line.then(|| line_totals[&cache_line]),
        }));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{filter::SampleFilter, test_samples};

    fn compute() -> FunctionName {
        FunctionName {
            name: "compute".into(),
            module: "app".into(),
        }
    }

    fn details(profile: &Profile, event: EventIndex, function: &FunctionName) -> FunctionDetails {
        let filter = SampleFilter::default();
        let selection = Selection::new(profile, &filter);
        function_details(profile, event, &selection, function).expect("sampled function")
    }

    fn instructions(details: &FunctionDetails) -> Vec<&InstructionRow> {
        details
            .rows
            .iter()
            .filter_map(|row| match row {
                DetailRow::Instruction(i) => Some(i),
                _ => None,
            })
            .collect()
    }

    fn statements(details: &FunctionDetails) -> Vec<(Option<&str>, u32, bool, u64)> {
        details
            .rows
            .iter()
            .filter_map(|row| match row {
                DetailRow::Statement(s) => {
                    Some((s.file.as_deref(), s.line, s.out_of_order, s.samples))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn disassembled_function_by_statement_and_cache_line() {
        let profile = test_samples::profile();
        let details = details(&profile, 0, &compute());
        assert_eq!(details.source, CodeSource::Disassembled);
        assert_eq!((details.samples, details.event_samples), (65, 100));
        // Every instruction: push, mov, 0xaa nops, pop, ret.
        let rows = instructions(&details);
        assert_eq!(rows.len(), 2 + 0xaa + 2);
        assert_eq!(rows[0].text.as_deref(), Some("push   %rbp"));
        assert_eq!(rows.last().unwrap().text.as_deref(), Some("ret"));
        assert_eq!(
            statements(&details),
            [
                (Some("src/app.rs"), 40, false, 5),
                (Some("src/app.rs"), 41, false, 0),
                (Some("src/vec.rs"), 7, false, 50),
                (Some("src/app.rs"), 39, true, 10),
            ]
        );
        // 0x80..0x90 has no line: inherited from 0x7f (line 41), approximate.
        let at = |offset: u64| *rows.iter().find(|r| r.offset == offset).unwrap();
        assert_eq!((at(0x85).line, at(0x85).approximate_line), (Some(41), true));
        assert_eq!((at(0x90).line, at(0x90).approximate_line), (Some(7), false));
        assert_eq!((at(0x90).samples, at(0x90).slot), (50, 0x10));
        // Cache lines 0x1200, 0x1240, 0x1280: two rows of dashes, no gap; totals on first rows.
        let boundaries = details
            .rows
            .iter()
            .filter(|r| **r == DetailRow::CacheLineBoundary)
            .count();
        assert_eq!(boundaries, 2);
        assert!(!details.rows.contains(&DetailRow::Gap));
        assert_eq!(at(0x0).cache_line_samples, Some(5));
        assert_eq!(at(0x40).cache_line_samples, Some(0));
        assert_eq!(at(0x80).cache_line_samples, Some(60));
        assert_eq!(at(0x81).cache_line_samples, None);
        // The dashes come right before the first instruction of the next line.
        let dash = details
            .rows
            .iter()
            .position(|r| *r == DetailRow::CacheLineBoundary)
            .unwrap();
        match &details.rows[dash + 1] {
            DetailRow::Statement(s) => assert_eq!(s.line, 41),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn without_code_only_sampled_instructions_with_gaps() {
        let profile = test_samples::profile_without_code();
        let details = details(&profile, 0, &compute());
        assert_eq!(details.source, CodeSource::NotCaptured);
        let rows = instructions(&details);
        let offsets: Vec<(u64, u64)> = rows.iter().map(|r| (r.offset, r.samples)).collect();
        assert_eq!(offsets, [(0x4, 5), (0x90, 50), (0xa4, 10)]);
        assert!(rows.iter().all(|r| r.text.is_none()));
        // Lines 0x1200 and 0x1280 are not adjacent: tildes between them.
        let gap = details
            .rows
            .iter()
            .position(|r| *r == DetailRow::Gap)
            .unwrap();
        assert!(matches!(details.rows[gap - 1], DetailRow::Instruction(ref i) if i.offset == 0x4));
        // Lines from the frames: the innermost inlined location of compute+0x90.
        assert_eq!(
            statements(&details),
            [
                (Some("src/app.rs"), 40, false, 5),
                (Some("src/simd.rs"), 88, false, 50),
                (Some("src/app.rs"), 39, true, 10),
            ]
        );
    }

    #[test]
    fn aarch64_code_is_not_decoded_as_x86() {
        let mut profile = test_samples::profile();
        profile.meta.architecture = "aarch64".into();
        let details = details(&profile, 0, &compute());
        assert_eq!(details.source, CodeSource::NoDisassembler);
        let rows = instructions(&details);
        let offsets: Vec<(u64, u64)> = rows.iter().map(|r| (r.offset, r.samples)).collect();
        assert_eq!(offsets, [(0x4, 5), (0x90, 50), (0xa4, 10)]);
        assert!(rows.iter().all(|r| r.text.is_none()));
    }

    #[test]
    fn kernel_functions_say_their_code_is_not_captured() {
        let profile = test_samples::profile();
        let fault = FunctionName {
            name: "exc_page_fault".into(),
            module: "[kernel.kallsyms]".into(),
        };
        let details = details(&profile, 1, &fault);
        assert_eq!(details.source, CodeSource::Kernel);
        let rows = instructions(&details);
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].offset, rows[0].samples, rows[0].line),
            (0x78, 3, None)
        );
        assert_eq!(rows[0].latency.as_ref().unwrap().max, 2000);
        let filter = SampleFilter::default();
        let selection = Selection::new(&profile, &filter);
        assert!(function_details(&profile, 0, &selection, &fault).is_none());
    }
}
