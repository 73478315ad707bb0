use std::collections::BTreeMap;

use profiler_common::hw::ibs::events::{IbsFetchCounters, IbsOpCounters};
use serde::{Deserialize, Serialize};

/// Index into [`Profile::frames`].
pub type FrameId = u32;
/// Index into [`Profile::events`].
pub type EventIndex = u32;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Profile {
    pub meta: ProfileMeta,
    pub events: Vec<EventInfo>,
    pub threads: Vec<ThreadInfo>,
    /// Interned, symbolized frames; stacks refer to them by [`FrameId`].
    pub frames: Vec<Frame>,
    pub stacks: Vec<StackSample>,
    pub instructions: Vec<InstructionSample>,
    pub data_lines: Vec<DataLineSample>,
    pub latency: Vec<LatencyHistogram>,
    pub losses: Losses,
    /// Machine code and line table of every sampled user function, read from its module at
    /// record time, so the function details view disassembles offline.
    pub code: Vec<CodeBytes>,
    /// Memory mappings of the processes with data-address samples, as they were at the end of
    /// the recording: what a data address belongs to (file, heap, stack, anonymous).
    pub memory_maps: Vec<ProcessMemoryMap>,
    /// Global variables (ELF data symbols) that sampled data cache lines overlap.
    pub data_symbols: Vec<DataSymbol>,
    /// What precise hardware samplers reported beyond the IP, and skid corrections.
    pub hardware: HardwareProfile,
    /// Latency distributions per data cache line. Files of format 2 on carry them after the
    /// format 1 body (`profile::file`), so this field is not part of the body's shape.
    #[serde(skip)]
    pub line_latency: Vec<LineLatencyHistogram>,
    /// Sampled functions whose symbol has other names at the same address. Appended after the
    /// body from format 4 on.
    #[serde(skip)]
    pub function_aliases: Vec<FunctionAliases>,
    /// `record --off-cpu`: where the threads waited. Appended after the body from format 6 on.
    #[serde(skip)]
    pub off_cpu: Option<super::offcpu::OffCpuProfile>,
}

/// Every name one function has in one module: symbols at one address, such as glibc's
/// `__memmove_avx_unaligned_erms` and `__memcpy_avx_unaligned_erms`. Frames show one of them;
/// `--function` and `--callers` find the function by any.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FunctionAliases {
    /// The module's path, as frames have it.
    pub module: String,
    pub names: Vec<String>,
}

impl Profile {
    /// The names of the function `name` in the module whose base name is `module`, itself
    /// included; empty when it has no other.
    pub fn aliases_of(&self, module: &str, name: &str) -> &[String] {
        self.function_aliases
            .iter()
            .find(|aliases| {
                module_basename(&aliases.module) == module
                    && aliases.names.iter().any(|alias| alias == name)
            })
            .map_or(&[], |aliases| aliases.names.as_slice())
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProfileMeta {
    pub profiler_version: String,
    pub hostname: String,
    pub kernel_release: String,
    /// What was profiled, as the user said it (`-a`, `-p 123`, `-- ./cmd args`).
    pub target: String,
    /// Unix time in nanoseconds when the recording started.
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    /// The machine's architecture (`x86_64`, `aarch64`), which the addresses, registers and
    /// code bytes are of; empty in files before format 5. Appended after the body.
    #[serde(skip)]
    pub architecture: String,
}

/// One sampled event and how it was sampled.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EventInfo {
    /// As the user wrote it (`cpu-clock`, `cycles:u`, `page-faults/period=1/`).
    pub name: String,
    /// Overflow value (every Nth event): samples x period estimates the event count.
    pub period: Option<u64>,
    /// Sampling frequency in Hz when the kernel adjusts the period.
    pub frequency: Option<u64>,
    /// What the event counts: "CPU-cycles", "events", "nanoseconds", "load events".
    pub unit: String,
    /// Whether the IP is exact (precise_ip > 0) or may skid past the instruction that caused it.
    pub precise: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ThreadInfo {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Container id or systemd unit derived from the cgroup, when there is one.
    pub container: Option<String>,
}

/// A symbolized code address.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Absolute address in the process (or kernel) that was sampled.
    pub address: u64,
    pub kernel: bool,
    /// Load module path (`/usr/bin/foo`, `[kernel.kallsyms]`), empty when unknown.
    pub module: String,
    /// Offset of the address inside the module's file (ELF file offset).
    pub module_offset: u64,
    pub build_id: Option<String>,
    /// The function (symbol) containing the address; for code without symbols, the function
    /// its call-frame information bounds (`libz.so.1+0x2f40`: module and start); `None` where
    /// nothing says which function holds it.
    pub function: Option<String>,
    /// Start address of `function`, to compute the offset into it.
    pub function_address: Option<u64>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Functions inlined at this address, outermost first; the last one is where the address
    /// really is.
    pub inlined: Vec<InlinedFrame>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct InlinedFrame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Frame {
    /// Name to show: the function, module+offset for code without symbols, or perf's
    /// `[unknown]` for an address in no mapping (a garbage return address of a frame-pointer
    /// walk through code built without frame pointers).
    pub fn display_name(&self) -> String {
        match &self.function {
            Some(f) => f.clone(),
            None if self.module.is_empty() => UNKNOWN_FUNCTION.to_string(),
            None => format!(
                "{}+{:#x}",
                module_basename(&self.module),
                self.module_offset
            ),
        }
    }
}

/// What perf calls code at an address in no mapping.
pub const UNKNOWN_FUNCTION: &str = "[unknown]";

pub fn module_basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Samples of one distinct call stack of one thread and event.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StackSample {
    pub pid: u32,
    pub tid: u32,
    pub event: EventIndex,
    pub cgroup: u64,
    /// Frames leaf first: kernel frames (if any) then user frames.
    pub frames: Vec<FrameId>,
    /// Whether the user/kernel parts were lost (counted in losses by cause).
    pub user_stack_lost: bool,
    pub kernel_stack_lost: bool,
    pub count: u64,
    /// Samples per CPU, index = CPU number (empty when unknown).
    pub per_cpu: Vec<u64>,
    /// The events these samples stand for where each measures itself rather than being
    /// scaled by its event: the nanoseconds of off-CPU blocks, whose `count` is the blocks
    /// (`export::offcpu`). Exports only: never in a profile file.
    #[serde(skip)]
    pub weight: Option<u64>,
}

impl StackSample {
    /// What folded stacks and flame graphs weigh the stack by: its own measure where it has
    /// one (off-CPU nanoseconds), else its samples.
    pub fn measure(&self) -> u64 {
        self.weight.unwrap_or(self.count)
    }
}

/// Samples at one instruction of one process and event.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct InstructionSample {
    pub pid: u32,
    pub event: EventIndex,
    pub frame: FrameId,
    pub stats: Stats,
}

/// Samples whose data address fell in one 64-byte line, by instruction.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DataLineSample {
    pub pid: u32,
    pub event: EventIndex,
    /// Address of the cache line (data address & !63).
    pub line: u64,
    /// Instruction that made the access.
    pub frame: FrameId,
    pub stats: Stats,
    pub per_cpu: Vec<u64>,
    /// Thread that made the access, when the capture recorded it.
    pub tid: Option<u32>,
    /// Whether the access was a load or a store (from the sample's data source).
    pub access: DataAccess,
}

/// The kind of a sampled data access (`perf_mem_data_src.mem_op`).
#[derive(
    Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum DataAccess {
    /// The sample carried no data source (software events, or a PMU that does not say).
    #[default]
    Unknown,
    Load,
    Store,
}

impl DataAccess {
    /// From the capture's `ACCESS_*` code.
    pub fn from_code(code: u32) -> DataAccess {
        match code {
            profiler_common::capture::ACCESS_LOAD => DataAccess::Load,
            profiler_common::capture::ACCESS_STORE => DataAccess::Store,
            _ => DataAccess::Unknown,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stats {
    pub count: u64,
    pub latency_count: u64,
    pub latency_sum: u64,
    pub latency_max: u64,
}

impl From<&profiler_common::capture::SampleStats> for Stats {
    fn from(s: &profiler_common::capture::SampleStats) -> Stats {
        Stats {
            count: s.count,
            latency_count: s.latency_count,
            latency_sum: s.latency_sum,
            latency_max: s.latency_max,
        }
    }
}

/// Latency distribution of one (event, instruction): counts per log-linear bucket
/// (`profiler_common::latency`), sparse.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyHistogram {
    pub pid: u32,
    pub event: EventIndex,
    pub frame: FrameId,
    /// (bucket index, count)
    pub buckets: Vec<(u16, u64)>,
}

/// Latency distribution of the samples of one event whose data address fell in one 64-byte
/// line, whatever instruction made the access: counts per log-linear bucket, sparse.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LineLatencyHistogram {
    pub pid: u32,
    pub event: EventIndex,
    /// Address of the cache line (data address & !63).
    pub line: u64,
    /// (bucket index, count)
    pub buckets: Vec<(u16, u64)>,
}

/// Sample accounting: what the kernel fired and every way a sample or part of it was lost.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Losses {
    /// Program invocations per event, counted in the kernel.
    pub samples_fired: Vec<u64>,
    /// Loss counters by name (`profiler_common::capture::LossKind::describe`).
    pub counters: BTreeMap<String, u64>,
    /// Sum of the overflow periods of the fired samples, per event (empty when not captured):
    /// with frequency sampling the kernel varies the period, and the mean period estimates the
    /// events each sample stands for.
    pub period_sums: Vec<u64>,
    /// Events the sampling counters themselves counted, per event (empty when not read:
    /// imports, filtered recordings, files before format 3): the exact total beside the
    /// samples, as HP Caliper printed it, and what estimates scale to. Appended to the file
    /// after the format 1 body (see `profile::file`).
    #[serde(skip)]
    pub event_counts: Vec<u64>,
}

/// The bytes of one function as its module file holds them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CodeBytes {
    /// Module path as in [`Frame::module`].
    pub module: String,
    pub build_id: Option<String>,
    /// Offset in the module's file of the function's first byte.
    pub file_offset: u64,
    /// Link-time virtual address of the function's first byte (as `objdump -d` shows it).
    pub address: u64,
    pub bytes: Vec<u8>,
    /// Source location of every instruction that has one, by offset in `bytes`, ascending.
    pub lines: Vec<CodeLine>,
}

/// The source location of one instruction: the innermost inlined location when inlined.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CodeLine {
    pub offset: u32,
    pub file: String,
    pub line: u32,
}

/// The memory mappings of one process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessMemoryMap {
    pub pid: u32,
    /// In the order they were made: where mappings overlap, the last one holds the address.
    pub mappings: Vec<MemoryMapping>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemoryMapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// File path, a kernel label (`[heap]`, `[stack]`, `[vdso]`), or empty for anonymous memory.
    pub path: String,
}

/// A global variable of a module, at its address in one process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct DataSymbol {
    pub pid: u32,
    pub address: u64,
    pub size: u64,
    pub name: String,
    pub module: String,
}

/// Hardware sampling results: data sources, AMD IBS derived counters and skid backtracking.
/// Empty for profiles of software or non-precise events.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HardwareProfile {
    /// The CPU that took the samples: which IBS fields are reliable depends on it.
    pub cpu: Option<CpuIdentity>,
    /// IBS capabilities (CPUID 8000_001B EAX) as the IBS samples carried them.
    pub ibs_caps: Option<u32>,
    pub samples: Vec<HardwareSample>,
    /// Attributions of non-precise samples moved from the sampled IP to the memory-referencing
    /// instruction before it (`--backtrack`).
    pub backtracked: Vec<BacktrackedAttribution>,
}

/// CPUID vendor, family and model (`AuthenticAMD`, 0x19, 0x11).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CpuIdentity {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
}

/// Hardware-decoded samples of one (process, event, instruction, data cache line).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HardwareSample {
    pub pid: u32,
    pub event: EventIndex,
    /// The sampled instruction.
    pub frame: FrameId,
    /// The 64-byte line of the data address (address & !63), when the samples carried one.
    pub line: Option<u64>,
    /// Samples aggregated here.
    pub samples: u64,
    /// Samples per raw `perf_mem_data_src` value (decode with
    /// `profiler_common::hw::data_src::DataSource::decode`), ascending by value.
    pub data_sources: Vec<(u64, u64)>,
    /// IBS op derived counters; counts are IBS op samples.
    pub ibs_op: Option<IbsOpCounters>,
    /// IBS fetch derived counters; counts are IBS fetch samples.
    pub ibs_fetch: Option<IbsFetchCounters>,
    /// Arm SPE events and latencies; counts are SPE samples. Appended after the body from
    /// format 8 on.
    #[serde(skip)]
    pub spe: Option<profiler_common::hw::spe::SpeCounters>,
}

/// Samples whose attribution skid backtracking moved.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BacktrackedAttribution {
    pub pid: u32,
    pub event: EventIndex,
    /// The instruction the interrupt reported.
    pub sampled: FrameId,
    /// The memory-referencing instruction the samples are now attributed to.
    pub attributed: FrameId,
    pub samples: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_named_by_symbol_module_offset_or_unknown() {
        let garbage = Frame {
            address: 0x4141_4141,
            ..Frame::default()
        };
        assert_eq!(garbage.display_name(), "[unknown]");
        let stripped = Frame {
            module: "/usr/lib/libblob.so".into(),
            module_offset: 0x4a10,
            ..garbage.clone()
        };
        assert_eq!(stripped.display_name(), "libblob.so+0x4a10");
        let named = Frame {
            function: Some("main".into()),
            ..stripped
        };
        assert_eq!(named.display_name(), "main");
    }
}
