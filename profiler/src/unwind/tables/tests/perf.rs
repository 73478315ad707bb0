//! End to end without BPF: the stacks `perf record --call-graph dwarf` copied from a program
//! built without frame pointers (user registers and stack bytes at every sample), walked with
//! compiled rows and [`step`], against perf's own unwinding of the same samples (`perf
//! script`). Needs perf and gcc, and root or a permissive perf_event_paranoid.

use std::collections::HashMap;
use std::process::Command;

use object::ObjectSegment;
use profiler_common::unwind::Caller;

use super::*;
use crate::perf_data::{read_perf_data, PerfData, PerfSample};

/// perf's x86 register numbers (arch/x86/include/uapi/asm/perf_regs.h).
const PERF_REG_X86_BP: u32 = 6;
const PERF_REG_X86_SP: u32 = 7;
const PERF_REG_X86_IP: u32 = 8;
/// Frames walked at most, as the BPF walker will.
const MAX_FRAMES: usize = 127;

/// One frame: the module's path and the ELF virtual address its row is looked up at (as perf
/// prints callers: the return address minus one, inside the call).
type Frame = (String, u64);

/// A sample by thread and time, in both perf.data and `perf script`.
type SampleKey = (u32, u64);

/// perf's call chain of every sample, by (thread, time), innermost first, with the symbols it
/// gave each address.
fn perf_chains(data: &Path) -> (HashMap<SampleKey, Vec<Frame>>, HashMap<Frame, String>) {
    let output = Command::new("perf")
        .args([
            "script",
            "-F",
            "tid,time,ip,sym,dso",
            "--ns",
            "--no-inline",
            "-i",
        ])
        .arg(data)
        .output()
        .expect("perf runs (Debian: apt-get install linux-perf)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let mut chains = HashMap::new();
    let mut symbols = HashMap::new();
    for sample in text.split("\n\n").filter(|s| !s.trim().is_empty()) {
        let mut lines = sample.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        let tid: u32 = header[0].parse().unwrap();
        let (seconds, nanoseconds) = header[1].trim_end_matches(':').split_once('.').unwrap();
        let time =
            seconds.parse::<u64>().unwrap() * 1_000_000_000 + nanoseconds.parse::<u64>().unwrap();
        let mut chain = Vec::new();
        for line in lines {
            let (address, rest) = line.trim().split_once(' ').unwrap();
            let (symbol, module) = rest.rsplit_once(" (").unwrap();
            let frame = (
                module.trim_end_matches(')').to_string(),
                u64::from_str_radix(address, 16).unwrap(),
            );
            symbols.insert(frame.clone(), symbol.to_string());
            chain.push(frame);
        }
        chains.insert((tid, time), chain);
    }
    (chains, symbols)
}

/// An executable mapping: where a module's file offsets are in memory.
struct Mapped {
    range: Range<u64>,
    pgoff: u64,
    module: String,
}

/// A module's table and its loadable segments (file offset, size, virtual address).
struct Module {
    table: Arc<UnwindTable>,
    segments: Vec<(u64, u64, u64)>,
}

impl Module {
    fn open(path: &str, cache: &mut TableCache) -> Option<Module> {
        let data = std::fs::read(path).ok()?;
        let file = open_regular(Path::new(path), FinalLink::Follow).ok()?;
        let table = cache.table(&file, Path::new(path)).ok()?;
        Module::with_table(&data, table.table)
    }

    /// The `[vdso]`: no file, but every process maps this kernel's one image.
    fn vdso() -> Option<Module> {
        let image = crate::process::vdso::own_image()?;
        let table = compile(&object::File::parse(image).ok()?).ok()?;
        Module::with_table(image, Arc::new(table))
    }

    fn with_table(data: &[u8], table: Arc<UnwindTable>) -> Option<Module> {
        let elf = object::File::parse(data).ok()?;
        let segments = elf
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        Some(Module { table, segments })
    }

    fn virtual_address(&self, file_offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(offset, size, _)| (*offset..offset + size).contains(&file_offset))
            .map(|(offset, _, address)| file_offset - offset + address)
    }
}

/// How one sample's walk ended.
#[derive(Debug, PartialEq, Eq, Hash)]
enum WalkEnd {
    Step(StepEnd),
    NoModule,
    TooDeep,
}

/// Walks one sample's copied stack with the rows.
fn walk(
    sample: &PerfSample,
    mask: u64,
    mappings: &[Mapped],
    modules: &HashMap<String, Option<Module>>,
) -> (Vec<Frame>, WalkEnd) {
    let regs = sample.regs_user.as_ref().expect("user registers");
    let stack = sample.stack_user.as_ref().expect("a stack copy");
    let copied = &stack.data[..(stack.dyn_size as usize).min(stack.data.len())];
    let mut caller = Caller {
        regs: Registers {
            ip: regs.get(mask, PERF_REG_X86_IP).unwrap(),
            sp: regs.get(mask, PERF_REG_X86_SP).unwrap(),
            fp: regs.get(mask, PERF_REG_X86_BP).unwrap(),
        },
        // The sampled instruction is looked up as it is.
        interrupted: true,
    };
    let sp0 = caller.regs.sp;
    let read = |address: u64| -> Option<u64> {
        let at = usize::try_from(address.checked_sub(sp0)?).ok()?;
        Some(u64::from_le_bytes(copied.get(at..at + 8)?.try_into().ok()?))
    };
    let mut frames = Vec::new();
    for _ in 0..MAX_FRAMES {
        let ip = caller.regs.ip;
        let Some(mapped) = mappings.iter().find(|m| m.range.contains(&ip)) else {
            return (frames, WalkEnd::NoModule);
        };
        let Some(Some(module)) = modules.get(&mapped.module) else {
            return (frames, WalkEnd::NoModule);
        };
        let to_virtual =
            |address: u64| module.virtual_address(address - mapped.range.start + mapped.pgoff);
        let Some(lookup) = to_virtual(caller.lookup_ip()) else {
            return (frames, WalkEnd::NoModule);
        };
        frames.push((mapped.module.clone(), lookup));
        let Some(row) = module.table.lookup(lookup) else {
            return (frames, WalkEnd::Step(StepEnd::NoUnwindInfo));
        };
        match step(row, &caller.regs, read) {
            Ok(next) => caller = next,
            Err(end) => return (frames, WalkEnd::Step(end)),
        }
    }
    (frames, WalkEnd::TooDeep)
}

fn record(dir: &Path, workload: &Path) -> (PathBuf, PerfData) {
    let data = dir.join("perf.data");
    let status = Command::new("perf")
        .args([
            "record",
            "-q",
            "-e",
            "cpu-clock:u",
            "-F",
            "999",
            "--call-graph",
            "dwarf,32768",
            "-o",
        ])
        .arg(&data)
        .arg("--")
        .arg(workload)
        .args(["3000", "mix"])
        .status()
        .expect("perf runs (Debian: apt-get install linux-perf)");
    assert!(status.success(), "perf record failed");
    let parsed = read_perf_data(&data).unwrap_or_else(|e| panic!("{e}"));
    (data, parsed)
}

#[test]
fn stacks_copied_by_perf_unwind_with_the_rows_as_perf_unwinds_them() {
    let dir = tempfile::tempdir().unwrap();
    let workload = build_workload(dir.path(), "no_frame_pointers", &[]);
    let (data_path, data) = record(dir.path(), &workload);
    let (chains, symbols) = perf_chains(&data_path);
    let mappings: Vec<Mapped> = data
        .mmaps
        .iter()
        .filter(|m| !m.data && (m.filename.starts_with('/') || m.filename == "[vdso]"))
        .map(|m| Mapped {
            range: m.start..m.start + m.len,
            pgoff: m.pgoff,
            module: m.filename.clone(),
        })
        .collect();
    let mut cache = TableCache::new(None);
    let mut modules = HashMap::new();
    for mapped in &mappings {
        if !modules.contains_key(&mapped.module) {
            let module = match mapped.module.as_str() {
                "[vdso]" => Module::vdso(),
                path => Module::open(path, &mut cache),
            };
            modules.insert(mapped.module.clone(), module);
        }
    }
    let mut samples = 0;
    let mut agree = 0;
    let mut complete = 0;
    let mut through_signal_frames = 0;
    let mut ends: HashMap<WalkEnd, u64> = HashMap::new();
    let mut disagreements = Vec::new();
    for sample in &data.samples {
        let mask = data.attrs[sample.attr_index].sample_regs_user;
        let key = (sample.tid.unwrap(), sample.time.unwrap());
        let Some(perf_chain) = chains.get(&key) else {
            continue;
        };
        samples += 1;
        let (frames, end) = walk(sample, mask, &mappings, &modules);
        // Compared by function: perf's name for each of our addresses.
        let name = |frame: &Frame| {
            symbols
                .get(frame)
                .cloned()
                .unwrap_or_else(|| format!("{frame:x?}"))
        };
        let ours: Vec<String> = frames.iter().map(name).collect();
        let theirs: Vec<String> = perf_chain.iter().map(name).collect();
        if ours == theirs {
            agree += 1;
            // The handler's caller is the signal trampoline, then the interrupted frame.
            if ours.iter().any(|f| f == "on_alarm")
                && ours.last().is_some_and(|f| f == "_start" || f == "clone3")
            {
                through_signal_frames += 1;
            }
        } else if disagreements.len() < 5 {
            disagreements.push(format!("{end:?}\n ours:  {ours:?}\n perf: {theirs:?}"));
        }
        let outermost = ours.last().map(String::as_str).unwrap_or("");
        if end == WalkEnd::Step(StepEnd::EndOfStack)
            && (ours.iter().any(|f| f == "main") && outermost == "_start"
                || ours.iter().any(|f| f == "start_thread") && outermost == "clone3")
        {
            complete += 1;
        }
        *ends.entry(end).or_default() += 1;
    }
    println!(
        "{samples} samples: {agree} agree with perf ({through_signal_frames} through a signal \
         frame), {complete} complete; ends {ends:?}; tables compiled {}, reused {}",
        cache.stats.compiled, cache.stats.from_memory
    );
    println!("{}", disagreements.join("\n"));
    assert!(
        samples > 500,
        "only {samples} samples matched perf script's"
    );
    assert!(
        agree * 100 >= samples * 98,
        "{agree} of {samples} samples agree with perf; first disagreements:\n{}",
        disagreements.join("\n")
    );
    assert!(
        complete * 100 >= samples * 99,
        "{complete} of {samples} samples reach main and _start, or start_thread and clone3: \
         {ends:?}"
    );
    assert!(
        through_signal_frames > 0,
        "no walk went through a signal frame"
    );
    // Both threads, the callback from qsort and memcpy were sampled.
    for function in ["thread_main", "compare_ints", "qsort", "memmove"] {
        assert!(
            symbols.values().any(|s| s.contains(function)),
            "no sample in {function}"
        );
    }
}
