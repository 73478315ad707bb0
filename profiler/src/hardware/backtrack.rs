//! Skid backtracking (`--backtrack`), as Oracle's collector did it: a non-precise counter
//! interrupt reports an IP some instructions after the one that caused the event. For events that
//! count data accesses, the cause is the nearest memory-referencing instruction before the
//! reported one; [`backtrack`] finds it by decoding x86-64 from the function start, and
//! [`backtrack_profile`] moves the instruction, data cache-line and latency attributions of such
//! events to it, recording each move in `Profile::hardware.backtracked`.
//!
//! A walk back stops at anything that could have brought execution to the reported instruction
//! by another path (a branch, call or return before it, or a branch target between the
//! candidate and the reported instruction): then the attribution stays where it was.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind};
use object::ReadRef;

use crate::input::{open_regular, symbol_path, FinalLink, ModuleImage};
use crate::profile::{
    BacktrackedAttribution, DataAccess, DataLineSample, EventIndex, EventInfo, Frame, FrameId,
    InstructionSample, LatencyHistogram, Profile, Stats,
};
use crate::symbolize::{fill_from_elf, new_symbolizer};

/// Code decoded past the sampled instruction, to see branches that jump back between the
/// candidate and it (loop back-edges).
const LOOKAHEAD_BYTES: u64 = 256;

/// The address of the nearest instruction before `sampled_ip` that references memory, decoding
/// `code` (which starts at address `code_start`, a function start) forward. `None` when
/// `sampled_ip` is not an instruction boundary of that decoding, or the walk back meets a branch,
/// call, return or branch target before finding a memory access.
pub fn backtrack(code: &[u8], code_start: u64, sampled_ip: u64) -> Option<u64> {
    let instructions: Vec<Instruction> =
        Decoder::with_ip(64, code, code_start, DecoderOptions::NONE)
            .into_iter()
            .take_while(|instruction| !instruction.is_invalid())
            .collect();
    let sampled = instructions
        .iter()
        .position(|instruction| instruction.ip() == sampled_ip)?;
    for candidate in instructions[..sampled].iter().rev() {
        if candidate.flow_control() != FlowControl::Next {
            return None;
        }
        if references_memory(candidate) {
            let entered_between = instructions.iter().any(|branch| {
                is_direct_branch(branch)
                    && (candidate.next_ip()..=sampled_ip).contains(&branch.near_branch_target())
            });
            return (!entered_between).then_some(candidate.ip());
        }
    }
    None
}

/// Whether the instruction reads or writes memory: a memory operand that is not only an address
/// computation (LEA) or a hint (multi-byte NOP).
fn references_memory(instruction: &Instruction) -> bool {
    !matches!(instruction.mnemonic(), Mnemonic::Lea | Mnemonic::Nop)
        && (0..instruction.op_count()).any(|operand| instruction.op_kind(operand) == OpKind::Memory)
}

fn is_direct_branch(instruction: &Instruction) -> bool {
    matches!(
        instruction.flow_control(),
        FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
    ) && matches!(
        instruction.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    )
}

/// (pid, event, line, instruction) of a data cache-line attribution.
/// (pid, tid, access, event, line, frame)
type LineKey = (u32, Option<u32>, DataAccess, EventIndex, u64, FrameId);

/// Whether an event counts data accesses, so its samples belong at a load or store: the generic
/// data-cache, last-level-cache, data-TLB and NUMA-node events and the memory PMU events.
pub fn is_data_event(event: &EventInfo) -> bool {
    const PREFIXES: [&str; 4] = ["L1-dcache-", "LLC-", "dTLB-", "node-"];
    const NAMES: [&str; 4] = [
        "cache-misses",
        "cache-references",
        "mem-loads",
        "mem-stores",
    ];
    let name = event.name.as_str();
    PREFIXES.iter().any(|prefix| name.starts_with(prefix))
        || NAMES.iter().any(|known| name.contains(known))
}

/// What [`backtrack_profile`] did, counted in samples (as the command line reports it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BacktrackSummary {
    pub moved: u64,
    /// Left where they were: kernel code, no readable code, not an instruction boundary, or a
    /// branch in the way.
    pub kept: u64,
}

/// Moves the attributions of every non-precise data event (see [`is_data_event`]) from the
/// sampled instruction to the memory access before it, reading user code from the sampled
/// modules' files. Kernel code is left as sampled.
pub fn backtrack_profile(profile: &mut Profile) -> BacktrackSummary {
    let events: Vec<EventIndex> = profile
        .events
        .iter()
        .enumerate()
        .filter(|(_, event)| !event.precise && is_data_event(event))
        .map(|(index, _)| index as EventIndex)
        .collect();
    let mut summary = BacktrackSummary::default();
    if events.is_empty() {
        return summary;
    }
    let sampled: Vec<FrameId> = profile
        .instructions
        .iter()
        .filter(|sample| events.contains(&sample.event))
        .map(|sample| sample.frame)
        .collect();
    let moves = Mover::default().plan(&mut profile.frames, sampled);
    let target = |event: EventIndex, frame: FrameId| match moves.get(&frame) {
        Some(&to) if events.contains(&event) => to,
        _ => frame,
    };

    for sample in &profile.instructions {
        if !events.contains(&sample.event) {
            continue;
        }
        let attributed = target(sample.event, sample.frame);
        if attributed == sample.frame {
            summary.kept += sample.stats.count;
            continue;
        }
        summary.moved += sample.stats.count;
        profile.hardware.backtracked.push(BacktrackedAttribution {
            pid: sample.pid,
            event: sample.event,
            sampled: sample.frame,
            attributed,
            samples: sample.stats.count,
        });
    }

    let mut instructions: BTreeMap<(u32, EventIndex, FrameId), Stats> = BTreeMap::new();
    for sample in profile.instructions.drain(..) {
        let key = (sample.pid, sample.event, target(sample.event, sample.frame));
        merge_stats(instructions.entry(key).or_default(), &sample.stats);
    }
    profile.instructions = instructions
        .into_iter()
        .map(|((pid, event, frame), stats)| InstructionSample {
            pid,
            event,
            frame,
            stats,
        })
        .collect();

    let mut lines: BTreeMap<LineKey, (Stats, Vec<u64>)> = BTreeMap::new();
    for sample in profile.data_lines.drain(..) {
        let key = (
            sample.pid,
            sample.tid,
            sample.access,
            sample.event,
            sample.line,
            target(sample.event, sample.frame),
        );
        let (stats, per_cpu) = lines.entry(key).or_default();
        merge_stats(stats, &sample.stats);
        add_per_cpu(per_cpu, &sample.per_cpu);
    }
    profile.data_lines = lines
        .into_iter()
        .map(
            |((pid, tid, access, event, line, frame), (stats, per_cpu))| DataLineSample {
                pid,
                tid,
                access,
                event,
                line,
                frame,
                stats,
                per_cpu,
            },
        )
        .collect();

    let mut histograms: BTreeMap<(u32, EventIndex, FrameId), BTreeMap<u16, u64>> = BTreeMap::new();
    for histogram in profile.latency.drain(..) {
        let key = (
            histogram.pid,
            histogram.event,
            target(histogram.event, histogram.frame),
        );
        let buckets = histograms.entry(key).or_default();
        for (bucket, count) in histogram.buckets {
            *buckets.entry(bucket).or_default() += count;
        }
    }
    profile.latency = histograms
        .into_iter()
        .map(|((pid, event, frame), buckets)| LatencyHistogram {
            pid,
            event,
            frame,
            buckets: buckets.into_iter().collect(),
        })
        .collect();
    summary
}

fn merge_stats(into: &mut Stats, from: &Stats) {
    into.count += from.count;
    into.latency_count += from.latency_count;
    into.latency_sum += from.latency_sum;
    into.latency_max = into.latency_max.max(from.latency_max);
}

fn add_per_cpu(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (total, count) in into.iter_mut().zip(from) {
        *total += count;
    }
}

/// A module file open (a regular file, never opened blocking).
struct OpenModule {
    /// Held, so that the symbolizer's copy of it (if any) stays.
    _file: Arc<File>,
    /// Where the symbolizer may read it; none where it may not (`input::symbol_path`).
    symbols: Option<PathBuf>,
    image: ModuleImage,
}

/// Opens module files once each and finds where sampled frames move.
#[derive(Default)]
struct Mover {
    /// By module path.
    files: HashMap<String, Option<OpenModule>>,
}

impl Mover {
    /// Sampled frame -> the frame of the memory access before it; new frames are appended to
    /// `frames` and symbolized.
    fn plan(
        &mut self,
        frames: &mut Vec<Frame>,
        sampled: Vec<FrameId>,
    ) -> BTreeMap<FrameId, FrameId> {
        let mut targets: Vec<(FrameId, Frame)> = Vec::new();
        for id in sampled {
            if targets.iter().any(|(seen, _)| *seen == id) {
                continue;
            }
            if let Some(target) = self.target(&frames[id as usize]) {
                targets.push((id, target));
            }
        }
        let mut by_module: BTreeMap<PathBuf, Vec<usize>> = BTreeMap::new();
        for (index, (_, frame)) in targets.iter().enumerate() {
            // Targets exist only for modules that opened.
            if let Some(Some(OpenModule {
                symbols: Some(path),
                ..
            })) = self.files.get(&frame.module)
            {
                by_module.entry(path.clone()).or_default().push(index);
            }
        }
        let symbolizer = new_symbolizer();
        for (path, indices) in by_module {
            let mut batch: Vec<Frame> = indices.iter().map(|&i| targets[i].1.clone()).collect();
            fill_from_elf(&symbolizer, &path, true, &mut batch);
            for (index, frame) in indices.into_iter().zip(batch) {
                targets[index].1 = frame;
            }
        }
        let mut moves = BTreeMap::new();
        for (sampled, frame) in targets {
            let existing = frames.iter().position(|known| *known == frame);
            let id = existing.unwrap_or_else(|| {
                frames.push(frame);
                frames.len() - 1
            });
            moves.insert(sampled, id as FrameId);
        }
        moves
    }

    /// The frame of the memory access before `frame`'s instruction, in the same function.
    fn target(&mut self, frame: &Frame) -> Option<Frame> {
        if frame.kernel || !frame.module.starts_with('/') {
            return None;
        }
        let function_start = frame.function_address?;
        let into_function = frame.address.checked_sub(function_start)?;
        let start_offset = frame.module_offset.checked_sub(into_function)?;
        let OpenModule { image, .. } = self
            .files
            .entry(frame.module.clone())
            .or_insert_with(|| {
                let file = open_regular(Path::new(&frame.module), FinalLink::Refuse).ok()?;
                let file = Arc::new(file);
                Some(OpenModule {
                    image: ModuleImage::of(&file)?,
                    symbols: symbol_path(&file).ok().map(|read| read.path),
                    _file: file,
                })
            })
            .as_ref()?;
        let end = (frame.module_offset + LOOKAHEAD_BYTES).min(image.len().ok()?);
        let code = image
            .read_bytes_at(start_offset, end.checked_sub(start_offset)?)
            .ok()?;
        let access = backtrack(code, function_start, frame.address)?;
        Some(Frame {
            address: access,
            kernel: false,
            module: frame.module.clone(),
            module_offset: frame.module_offset - (frame.address - access),
            build_id: frame.build_id.clone(),
            function: frame.function.clone(),
            function_address: frame.function_address,
            file: None,
            line: None,
            inlined: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x40_1000;
    /// mov rax,[rbx]
    const LOAD: [u8; 3] = [0x48, 0x8b, 0x03];
    /// add rax,1
    const ADD: [u8; 4] = [0x48, 0x83, 0xc0, 0x01];
    /// inc rcx
    const INC: [u8; 3] = [0x48, 0xff, 0xc1];
    /// lea rdx,[rbx+8]
    const LEA: [u8; 4] = [0x48, 0x8d, 0x53, 0x08];
    /// nop dword [rax+rax]
    const NOP: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
    /// mov [rbx],rax
    const STORE: [u8; 3] = [0x48, 0x89, 0x03];

    fn code(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn walks_back_to_the_load_before_the_sampled_instruction() {
        let bytes = code(&[&LOAD, &ADD, &INC]);
        assert_eq!(backtrack(&bytes, BASE, BASE + 7), Some(BASE));
        // The instruction right after the load: the load itself.
        assert_eq!(backtrack(&bytes, BASE, BASE + 3), Some(BASE));
        // Nothing before the first instruction.
        assert_eq!(backtrack(&bytes, BASE, BASE), None);
    }

    #[test]
    fn address_computations_and_hints_are_not_memory_accesses() {
        let bytes = code(&[&STORE, &LEA, &NOP, &INC]);
        // inc at 3 + 4 + 5 = 12: skips the NOP and the LEA, lands on the store.
        assert_eq!(backtrack(&bytes, BASE, BASE + 12), Some(BASE));
        let no_access = code(&[&LEA, &NOP, &INC]);
        assert_eq!(backtrack(&no_access, BASE, BASE + 9), None);
    }

    #[test]
    fn an_ip_inside_an_instruction_is_not_backtracked() {
        let bytes = code(&[&LOAD, &ADD, &INC]);
        assert_eq!(backtrack(&bytes, BASE, BASE + 5), None);
    }

    #[test]
    fn branches_and_branch_targets_stop_the_walk() {
        // mov rax,[rbx]; jmp +0 (eb 00); inc rcx: the jmp could come from anywhere.
        let bytes = code(&[&LOAD, &[0xeb, 0x00], &INC]);
        assert_eq!(backtrack(&bytes, BASE, BASE + 5), None);
        // mov rax,[rbx]; head: add rax,1; inc rcx; jnz head (75 f9 = -7 from its end): the
        // loop enters between the load and the inc.
        let looped = code(&[&LOAD, &ADD, &INC, &[0x75, 0xf9]]);
        assert_eq!(backtrack(&looped, BASE, BASE + 7), None);
        // head: mov rax,[rbx]; add rax,1; inc rcx; jnz head (75 f6 = -10): the loop head is
        // the load itself, so the walk back is sound.
        let whole_loop = code(&[&LOAD, &ADD, &INC, &[0x75, 0xf6]]);
        assert_eq!(backtrack(&whole_loop, BASE, BASE + 7), Some(BASE));
    }

    #[test]
    fn data_events_are_recognised_by_name() {
        let event = |name: &str| EventInfo {
            name: name.to_string(),
            ..EventInfo::default()
        };
        for name in [
            "L1-dcache-load-misses",
            "LLC-loads",
            "dTLB-load-misses",
            "cache-misses",
            "cpu/mem-loads/",
        ] {
            assert!(is_data_event(&event(name)), "{name}");
        }
        for name in [
            "cycles",
            "instructions",
            "cpu-clock",
            "page-faults",
            "branch-misses",
            "L1-icache-load-misses",
        ] {
            assert!(!is_data_event(&event(name)), "{name}");
        }
    }

    #[test]
    fn profile_attributions_of_skidding_data_events_move_to_the_access() {
        use crate::profile::{DataLineSample, LatencyHistogram};

        // A module file whose function `walk` starts at file offset 0x100, mapped at BASE.
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("module.bin");
        let mut bytes = vec![0u8; 0x100];
        bytes.extend(code(&[&LOAD, &ADD, &INC]));
        std::fs::write(&module, &bytes).unwrap();
        let sampled = Frame {
            address: BASE + 7,
            module: module.to_str().unwrap().to_string(),
            module_offset: 0x107,
            function: Some("walk".into()),
            function_address: Some(BASE),
            line: Some(12),
            ..Frame::default()
        };
        let stats = Stats {
            count: 5,
            latency_count: 1,
            latency_sum: 40,
            latency_max: 40,
        };
        let event = |name: &str, precise: bool| EventInfo {
            name: name.into(),
            precise,
            ..EventInfo::default()
        };
        let mut profile = Profile {
            events: vec![
                event("L1-dcache-load-misses", false),
                event("mem-loads", true),
            ],
            frames: vec![sampled.clone()],
            instructions: [0, 1]
                .map(|event| InstructionSample {
                    pid: 9,
                    event,
                    frame: 0,
                    stats,
                })
                .to_vec(),
            data_lines: vec![DataLineSample {
                pid: 9,
                tid: Some(9),
                access: DataAccess::Load,
                event: 0,
                line: 0x7000_0040,
                frame: 0,
                stats,
                per_cpu: vec![5],
            }],
            latency: vec![LatencyHistogram {
                pid: 9,
                event: 0,
                frame: 0,
                buckets: vec![(26, 1)],
            }],
            ..Profile::default()
        };

        let summary = backtrack_profile(&mut profile);
        assert_eq!(
            summary,
            BacktrackSummary { moved: 5, kept: 0 },
            "in samples"
        );
        assert_eq!(profile.frames.len(), 2);
        let access = &profile.frames[1];
        assert_eq!((access.address, access.module_offset), (BASE, 0x100));
        assert_eq!(access.function.as_deref(), Some("walk"));
        assert_eq!(access.line, None, "the sampled line is not the access's");
        // The skidding data event moved; the precise one stayed.
        let frames: Vec<(EventIndex, FrameId)> = profile
            .instructions
            .iter()
            .map(|i| (i.event, i.frame))
            .collect();
        assert_eq!(frames, vec![(0, 1), (1, 0)]);
        assert_eq!(profile.instructions[0].stats, stats);
        assert_eq!(
            (
                profile.data_lines[0].frame,
                profile.data_lines[0].per_cpu.as_slice()
            ),
            (1, &[5][..])
        );
        assert_eq!(
            (
                profile.latency[0].frame,
                profile.latency[0].buckets.as_slice()
            ),
            (1, &[(26, 1)][..])
        );
        assert_eq!(
            profile.hardware.backtracked,
            vec![BacktrackedAttribution {
                pid: 9,
                event: 0,
                sampled: 0,
                attributed: 1,
                samples: 5
            }]
        );
        let text = crate::report::hardware::render_hardware(
            &profile,
            crate::report::hardware::HardwareView::Instruction,
        );
        assert!(
            text.contains(
                "L1-dcache-load-misses: 5 samples of pid 9 at walk+0x0 (sampled at walk+0x7"
            ),
            "{text}"
        );
    }
}
