//! The flat views of one event: samples by thread, load module, function, source line,
//! instruction, instruction cache line or data cache line, each row with its share of the total,
//! the running (cumulative) share, the estimated event count and the latency where the samples
//! carried one.
//!
//! Thread, module, function and line rows count call-stack samples by their leaf frame (self
//! samples; functions also count total samples, anywhere on the stack). Instruction and
//! instruction-cache-line rows count the instruction map, data-cache-line rows the data map.
//! Latency is the sampled instruction's: rows get the latency of the instructions they hold;
//! threads have none (the latency maps are kept per process).

use std::collections::BTreeMap;

use crate::fast_hash::{HashMap, HashSet};

use crate::profile::{EventIndex, Frame, FrameId, Profile};

use super::{
    dataspace::{describe_data_address, DataObject},
    filter::{selected_data_lines, EventScale, SampleFilter, Selection},
    functions::{FunctionName, FunctionNumbers},
    latency::{LatencyAccumulator, LatencySummary, LineHistograms},
    location::{code_position, innermost_location, instruction_location, CACHE_LINE},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ViewKind {
    Thread,
    /// Processes (all their threads).
    Process,
    /// Containers and systemd units, from the cgroups the samples carried (`(host)` outside).
    Container,
    Module,
    Function,
    Line,
    Instruction,
    IcacheLine,
    DcacheLine,
}

impl ViewKind {
    /// The name of the view in reports and in the JSON schema.
    pub fn name(self) -> &'static str {
        match self {
            ViewKind::Thread => "thread",
            ViewKind::Process => "process",
            ViewKind::Container => "container",
            ViewKind::Module => "module",
            ViewKind::Function => "function",
            ViewKind::Line => "line",
            ViewKind::Instruction => "instruction",
            ViewKind::IcacheLine => "icache-line",
            ViewKind::DcacheLine => "dcache-line",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Most samples first.
    #[default]
    Samples,
    /// Highest mean latency first; rows without latency last.
    Latency,
    /// By name (thread, module, function, location or address).
    Name,
}

impl SortKey {
    /// The name of the key as `--sort` takes it.
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Samples => "samples",
            SortKey::Latency => "latency",
            SortKey::Name => "name",
        }
    }
}

/// What a row counts. Ordered (after samples and names) so that rows that tie, such as
/// functions of one name in two modules, keep one order whatever the order they were grouped in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RowKey {
    Thread {
        pid: u32,
        tid: u32,
        comm: String,
    },
    Process {
        pid: u32,
        comm: String,
    },
    Container {
        /// `docker:3f1c2a9b8e7d`, `nginx.service`, or `(host)`.
        container: String,
    },
    Module {
        /// Path, or a label such as `[kernel.kallsyms]`; empty when the code was in no mapping.
        module: String,
    },
    Function(FunctionName),
    Line {
        /// Innermost inlined location if any, else the frame's; `None` without line information.
        file: Option<String>,
        line: Option<u32>,
        /// The innermost function at the line (the inlined one, if inlined).
        function: String,
    },
    Instruction {
        /// The address in the process that sampled it most.
        address: u64,
        module: String,
        module_offset: u64,
        /// Function and offset in it (`compute+0x1c`), or module+offset for stripped code.
        location: String,
        /// `file:line` of the innermost inlined location, when known.
        source: Option<String>,
    },
    IcacheLine {
        /// Address of the line's first byte in the process that sampled it most.
        address: u64,
        module: String,
        /// Offset in the module's file of the line's first byte.
        module_offset: u64,
        /// Functions with sampled instructions in the line, most samples first.
        functions: Vec<String>,
        /// The line's start as people find it: `module+0xoffset` in user code, `symbol+0xoffset`
        /// in the kernel, whose module offsets are bare addresses.
        location: String,
    },
    DcacheLine {
        pid: u32,
        address: u64,
        /// What the line belongs to: a variable, the heap, a stack, a file mapping.
        object: DataObject,
    },
}

impl RowKey {
    /// The name that `--sort name` orders by and that text reports show first.
    pub fn name(&self) -> String {
        match self {
            RowKey::Thread { pid, tid, comm } => format!("{comm} {pid}/{tid}"),
            RowKey::Process { pid, comm } => format!("{comm} {pid}"),
            RowKey::Container { container } => container.clone(),
            RowKey::Module { module } => module.clone(),
            RowKey::Function(function) => function.name.clone(),
            RowKey::Line {
                file,
                line,
                function,
                ..
            } => source_location(file.as_deref(), *line).unwrap_or_else(|| function.clone()),
            RowKey::Instruction { location, .. } => location.clone(),
            RowKey::IcacheLine { address, .. } | RowKey::DcacheLine { address, .. } => {
                format!("{address:#018x}")
            }
        }
    }
}

fn source_location(file: Option<&str>, line: Option<u32>) -> Option<String> {
    match (file, line) {
        (Some(file), Some(line)) => Some(format!("{file}:{line}")),
        (Some(file), None) => Some(file.to_string()),
        _ => None,
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ViewRow {
    pub key: RowKey,
    /// Self samples for functions.
    pub samples: u64,
    pub percent: f64,
    /// Share of this row and every row before it in the view's order.
    pub cumulative_percent: f64,
    /// Samples with this function anywhere on the stack (function view only).
    pub total_samples: Option<u64>,
    pub total_percent: Option<f64>,
    /// Estimated events these samples stand for; `None` when the event's periods are unknown.
    pub estimated_events: Option<f64>,
    pub latency: Option<LatencySummary>,
}

/// One view of one event.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub kind: ViewKind,
    pub event: EventIndex,
    /// Samples of the event that pass the process and thread filters (the 100% of the view).
    pub total_samples: u64,
    pub scale: EventScale,
    /// Rows before `--top` cut them.
    pub total_rows: usize,
    pub rows: Vec<ViewRow>,
}

pub struct ViewOptions<'a> {
    pub filter: &'a SampleFilter,
    pub sort: SortKey,
    pub top: usize,
}

/// What rows are grouped by, before the row keys are spelled out.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum GroupKey {
    Thread(u32, u32),
    Process(u32),
    Container(String),
    Module(String),
    Function(FunctionName),
    Line(Option<String>, Option<u32>, String),
    /// Module and file offset (the address for code outside any module), so that processes
    /// running the same binary at different addresses share rows.
    Code(String, u64),
    Data(u32, u64),
}

#[derive(Default)]
struct Group {
    samples: u64,
    total_samples: u64,
    latency: LatencyAccumulator,
    /// Samples per frame: the row is named after its hottest frame.
    frames: HashMap<FrameId, u64>,
}

impl Group {
    fn hottest_frame(&self) -> Option<FrameId> {
        self.frames
            .iter()
            .max_by_key(|(frame, samples)| (**samples, std::cmp::Reverse(**frame)))
            .map(|(frame, _)| *frame)
    }
}

/// The group of a frame in a code view.
fn code_group(kind: ViewKind, frame: &Frame) -> GroupKey {
    match kind {
        ViewKind::Module => GroupKey::Module(frame.module.clone()),
        ViewKind::Function => GroupKey::Function(FunctionName::of(frame)),
        ViewKind::Line => {
            let (file, line, function) = innermost_location(frame);
            GroupKey::Line(file.map(str::to_string), line, function)
        }
        ViewKind::Instruction => {
            let (module, offset) = code_position(frame);
            GroupKey::Code(module, offset)
        }
        ViewKind::IcacheLine => {
            let (module, offset) = code_position(frame);
            GroupKey::Code(module, offset & !(CACHE_LINE - 1))
        }
        ViewKind::Thread | ViewKind::Process | ViewKind::Container | ViewKind::DcacheLine => {
            unreachable!("{kind:?} rows are not grouped by code")
        }
    }
}

pub fn build_view(
    profile: &Profile,
    kind: ViewKind,
    event: EventIndex,
    options: &ViewOptions,
) -> View {
    let selection = Selection::new(profile, options.filter);
    let mut groups: HashMap<GroupKey, Group> = HashMap::default();
    let total_samples = match kind {
        ViewKind::Thread
        | ViewKind::Process
        | ViewKind::Container
        | ViewKind::Module
        | ViewKind::Function
        | ViewKind::Line => group_stacks(profile, kind, event, &selection, &mut groups),
        ViewKind::Instruction | ViewKind::IcacheLine => {
            group_instructions(profile, kind, event, &selection, &mut groups)
        }
        ViewKind::DcacheLine => group_data_lines(profile, event, &selection, &mut groups),
    };
    if matches!(
        kind,
        ViewKind::Module
            | ViewKind::Function
            | ViewKind::Line
            | ViewKind::Instruction
            | ViewKind::IcacheLine
    ) {
        add_instruction_latency(profile, kind, event, &selection, &mut groups);
    }
    let scale = EventScale::of(profile, event);
    let percent = |part: u64| {
        if total_samples == 0 {
            0.0
        } else {
            100.0 * part as f64 / total_samples as f64
        }
    };
    let mut rows: Vec<ViewRow> = groups
        .into_iter()
        .filter(|(_, group)| group.samples > 0 || group.total_samples > 0)
        .map(|(key, group)| ViewRow {
            key: row_key(profile, &selection, kind, key, &group),
            samples: group.samples,
            percent: percent(group.samples),
            cumulative_percent: 0.0,
            total_samples: (kind == ViewKind::Function).then_some(group.total_samples),
            total_percent: (kind == ViewKind::Function).then(|| percent(group.total_samples)),
            estimated_events: scale.estimate(group.samples),
            latency: group.latency.summary(),
        })
        .collect();
    sort_rows(&mut rows, options.sort);
    let mut cumulative = 0;
    for row in &mut rows {
        cumulative += row.samples;
        row.cumulative_percent = percent(cumulative);
    }
    let total_rows = rows.len();
    rows.truncate(options.top);
    View {
        kind,
        event,
        total_samples,
        scale,
        total_rows,
        rows,
    }
}

fn sort_rows(rows: &mut [ViewRow], sort: SortKey) {
    let mean = |row: &ViewRow| row.latency.as_ref().map(|l| l.mean);
    match sort {
        SortKey::Samples => rows.sort_by(|a, b| {
            b.samples
                .cmp(&a.samples)
                .then(b.total_samples.cmp(&a.total_samples))
                .then_with(|| a.key.name().cmp(&b.key.name()))
                .then_with(|| a.key.cmp(&b.key))
        }),
        SortKey::Latency => rows.sort_by(|a, b| {
            // `None` sorts below every latency, so descending order puts those rows last.
            mean(b)
                .partial_cmp(&mean(a))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.samples.cmp(&a.samples))
                .then_with(|| a.key.name().cmp(&b.key.name()))
                .then_with(|| a.key.cmp(&b.key))
        }),
        SortKey::Name => rows.sort_by(|a, b| {
            a.key
                .name()
                .cmp(&b.key.name())
                .then(b.samples.cmp(&a.samples))
                .then_with(|| a.key.cmp(&b.key))
        }),
    }
}

/// Groups call-stack samples by their leaf; returns the view's total.
fn group_stacks(
    profile: &Profile,
    kind: ViewKind,
    event: EventIndex,
    selection: &Selection,
    groups: &mut HashMap<GroupKey, Group>,
) -> u64 {
    let mut total = 0;
    // Function view: each function's total samples and frames, by number.
    let mut numbers = FunctionNumbers::new(profile);
    let mut totals: HashMap<u32, Group> = HashMap::default();
    let mut seen = HashSet::default();
    for stack in profile
        .stacks
        .iter()
        .filter(|s| s.event == event && selection.thread(s.pid, s.tid))
    {
        total += stack.count;
        let leaf = stack
            .frames
            .first()
            .map(|id| (*id, &profile.frames[*id as usize]));
        let who = match kind {
            ViewKind::Thread => Some(GroupKey::Thread(stack.pid, stack.tid)),
            ViewKind::Process => Some(GroupKey::Process(stack.pid)),
            ViewKind::Container => Some(GroupKey::Container(
                selection.container(stack.pid, stack.tid).to_string(),
            )),
            _ => None,
        };
        if let Some(who) = who {
            groups.entry(who).or_default().samples += stack.count;
            continue;
        }
        if let Some((id, frame)) = leaf.filter(|(_, frame)| selection.module(frame)) {
            let group = groups.entry(code_group(kind, frame)).or_default();
            group.samples += stack.count;
            *group.frames.entry(id).or_default() += stack.count;
        }
        if kind == ViewKind::Function {
            // Total samples: each function once per stack, however deep the recursion.
            seen.clear();
            for id in &stack.frames {
                if selection.module(&profile.frames[*id as usize]) && seen.insert(numbers.own(*id))
                {
                    let group = totals.entry(numbers.own(*id)).or_default();
                    group.total_samples += stack.count;
                    group.frames.entry(*id).or_default();
                }
            }
        }
    }
    for (number, function) in totals {
        let group = groups
            .entry(GroupKey::Function(numbers.function(number).clone()))
            .or_default();
        group.total_samples += function.total_samples;
        for id in function.frames.into_keys() {
            group.frames.entry(id).or_default();
        }
    }
    total
}

fn group_instructions(
    profile: &Profile,
    kind: ViewKind,
    event: EventIndex,
    selection: &Selection,
    groups: &mut HashMap<GroupKey, Group>,
) -> u64 {
    let mut total = 0;
    for sample in profile
        .instructions
        .iter()
        .filter(|s| s.event == event && selection.process(s.pid))
    {
        total += sample.stats.count;
        let frame = &profile.frames[sample.frame as usize];
        if selection.module(frame) {
            let group = groups.entry(code_group(kind, frame)).or_default();
            group.samples += sample.stats.count;
            *group.frames.entry(sample.frame).or_default() += sample.stats.count;
        }
    }
    total
}

fn group_data_lines(
    profile: &Profile,
    event: EventIndex,
    selection: &Selection,
    groups: &mut HashMap<GroupKey, Group>,
) -> u64 {
    let total = profile
        .data_lines
        .iter()
        .filter(|s| s.event == event && selection.process(s.pid))
        .map(|s| s.stats.count)
        .sum();
    for sample in selected_data_lines(profile, event, selection) {
        let group = groups
            .entry(GroupKey::Data(sample.pid, sample.line))
            .or_default();
        group.samples += sample.stats.count;
        group.latency.add_stats(&sample.stats);
        *group.frames.entry(sample.frame).or_default() += sample.stats.count;
    }
    let histograms = LineHistograms::new(profile, event, selection);
    for (key, group) in groups.iter_mut() {
        if let GroupKey::Data(pid, line) = key {
            if let Some(buckets) = histograms.get(*pid, *line) {
                group.latency.add_buckets(buckets);
            }
        }
    }
    total
}

/// Adds the latency of the sampled instructions to the rows that hold them.
fn add_instruction_latency(
    profile: &Profile,
    kind: ViewKind,
    event: EventIndex,
    selection: &Selection,
    groups: &mut HashMap<GroupKey, Group>,
) {
    let key = |frame: FrameId| code_group(kind, &profile.frames[frame as usize]);
    for sample in profile
        .instructions
        .iter()
        .filter(|s| s.event == event && selection.process(s.pid))
    {
        if let Some(group) = groups.get_mut(&key(sample.frame)) {
            group.latency.add_stats(&sample.stats);
        }
    }
    for histogram in profile
        .latency
        .iter()
        .filter(|h| h.event == event && selection.process(h.pid))
    {
        if let Some(group) = groups.get_mut(&key(histogram.frame)) {
            group.latency.add_buckets(&histogram.buckets);
        }
    }
}

fn row_key(
    profile: &Profile,
    selection: &Selection,
    kind: ViewKind,
    key: GroupKey,
    group: &Group,
) -> RowKey {
    let hottest = group.hottest_frame().map(|id| &profile.frames[id as usize]);
    match key {
        GroupKey::Thread(pid, tid) => RowKey::Thread {
            pid,
            tid,
            comm: selection.thread_name(pid, tid).to_string(),
        },
        GroupKey::Process(pid) => RowKey::Process {
            pid,
            comm: selection.thread_name(pid, pid).to_string(),
        },
        GroupKey::Container(container) => RowKey::Container { container },
        GroupKey::Module(module) => RowKey::Module { module },
        GroupKey::Function(function) => RowKey::Function(function),
        GroupKey::Line(file, line, function) => RowKey::Line {
            file,
            line,
            function,
        },
        GroupKey::Code(module, module_offset) => {
            let frame = hottest.expect("a code row has a frame");
            let address = frame.address - (frame.module_offset - module_offset);
            if kind == ViewKind::Instruction {
                let (file, line, _) = innermost_location(frame);
                RowKey::Instruction {
                    address,
                    module,
                    module_offset,
                    location: instruction_location(frame),
                    source: source_location(file, line),
                }
            } else {
                RowKey::IcacheLine {
                    location: line_location(frame, address, &module, module_offset),
                    address,
                    module,
                    module_offset,
                    functions: functions_by_samples(profile, &group.frames),
                }
            }
        }
        GroupKey::Data(pid, line) => RowKey::DcacheLine {
            pid,
            address: line,
            object: describe_data_address(profile, pid, line),
        },
    }
}

/// Where a code line starts (see `RowKey::IcacheLine::location`); `frame` is one of its
/// instructions.
fn line_location(frame: &Frame, address: u64, module: &str, module_offset: u64) -> String {
    match (&frame.function, frame.function_address) {
        (Some(function), Some(start)) if frame.kernel => {
            if address >= start {
                format!("{function}+{:#x}", address - start)
            } else {
                format!("{function}-{:#x}", start - address)
            }
        }
        _ => format!(
            "{}+{module_offset:#x}",
            crate::profile::module_basename(module)
        ),
    }
}

/// Function names of some frames, most samples first.
fn functions_by_samples(profile: &Profile, frames: &HashMap<FrameId, u64>) -> Vec<String> {
    let mut by_function: BTreeMap<String, u64> = BTreeMap::new();
    for (id, samples) in frames {
        *by_function
            .entry(profile.frames[*id as usize].display_name())
            .or_default() += samples;
    }
    let mut functions: Vec<(String, u64)> = by_function.into_iter().collect();
    functions.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    functions.into_iter().map(|(name, _)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::test_samples::{self, HEAP_LINE, SHARED_LINE};
    use crate::profile::test_profile;
    use crate::profile::StackSample;

    fn view(profile: &Profile, kind: ViewKind, event: EventIndex, filter: &SampleFilter) -> View {
        build_view(
            profile,
            kind,
            event,
            &ViewOptions {
                filter,
                sort: SortKey::Samples,
                top: 20,
            },
        )
    }

    fn names(view: &View) -> Vec<String> {
        view.rows.iter().map(|r| r.key.name()).collect()
    }

    fn samples(view: &View) -> Vec<u64> {
        view.rows.iter().map(|r| r.samples).collect()
    }

    fn percents(view: &View) -> Vec<(f64, f64)> {
        view.rows
            .iter()
            .map(|r| (r.percent, r.cumulative_percent))
            .collect()
    }

    #[test]
    fn threads_by_samples_with_running_share() {
        let profile = test_samples::profile();
        let view = view(&profile, ViewKind::Thread, 0, &SampleFilter::default());
        assert_eq!(view.total_samples, 100);
        assert_eq!(
            names(&view),
            ["app 100/100", "app 100/102", "app worker 100/101"]
        );
        assert_eq!(samples(&view), [75, 15, 10]);
        assert_eq!(percents(&view), [(75.0, 75.0), (15.0, 90.0), (10.0, 100.0)]);
        // cpu-clock at a frequency, without recorded periods: no estimate; no latency.
        assert_eq!(view.scale, EventScale::Unknown);
        assert!(view
            .rows
            .iter()
            .all(|r| r.estimated_events.is_none() && r.latency.is_none()));
    }

    #[test]
    fn modules_and_functions_count_the_leaf() {
        let profile = test_samples::profile();
        let filter = SampleFilter::default();
        let modules = view(&profile, ViewKind::Module, 0, &filter);
        assert_eq!(
            names(&modules),
            [
                test_profile::APP,
                test_profile::KERNEL,
                test_profile::LIBBLOB
            ]
        );
        assert_eq!(samples(&modules), [60, 30, 10]);
        let functions = view(&profile, ViewKind::Function, 0, &filter);
        let rows: Vec<(String, u64, Option<u64>)> = functions
            .rows
            .iter()
            .map(|r| (r.key.name(), r.samples, r.total_samples))
            .collect();
        assert_eq!(
            rows,
            [
                ("compute".to_string(), 60, Some(60)),
                ("do_syscall_64".to_string(), 30, Some(30)),
                ("libblob.so+0x4a10".to_string(), 10, Some(10)),
                ("main".to_string(), 0, Some(85)),
                ("run".to_string(), 0, Some(85)),
                ("<[u8; 4] as app::Worker>::run".to_string(), 0, Some(10)),
            ]
        );
        assert_eq!(functions.rows[3].total_percent, Some(85.0));
        assert_eq!(functions.rows[2].cumulative_percent, 100.0);
    }

    #[test]
    fn functions_of_one_name_in_two_modules_keep_one_order() {
        // Two `twin` functions, in app and in libblob, with the same samples: whichever was
        // grouped first, app's comes first.
        let twin = |module: &str| Frame {
            address: 0x9000,
            module: module.into(),
            module_offset: 0x9000,
            function: Some("twin".into()),
            function_address: Some(0x9000),
            ..Frame::default()
        };
        let mut rows = Vec::new();
        for modules in [
            [test_profile::APP, test_profile::LIBBLOB],
            [test_profile::LIBBLOB, test_profile::APP],
        ] {
            let mut profile = test_samples::profile();
            for module in modules {
                profile.frames.push(twin(module));
                profile.stacks.push(StackSample {
                    pid: 100,
                    tid: 100,
                    frames: vec![profile.frames.len() as FrameId - 1],
                    count: 7,
                    ..StackSample::default()
                });
            }
            let functions = view(&profile, ViewKind::Function, 0, &SampleFilter::default());
            let twins: Vec<String> = functions
                .rows
                .iter()
                .filter_map(|row| match &row.key {
                    RowKey::Function(function) if function.name == "twin" => {
                        Some(function.module.clone())
                    }
                    _ => None,
                })
                .collect();
            rows.push(twins);
        }
        assert_eq!(rows[0], ["app", "libblob.so"], "module basenames");
        assert_eq!(rows[0], rows[1]);
    }

    #[test]
    fn lines_use_the_innermost_inlined_location() {
        let profile = test_samples::profile();
        let lines = view(&profile, ViewKind::Line, 0, &SampleFilter::default());
        let rows: Vec<(String, String, u64)> = lines
            .rows
            .iter()
            .map(|r| match &r.key {
                RowKey::Line { function, .. } => (r.key.name(), function.clone(), r.samples),
                other => panic!("not a line row: {other:?}"),
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("src/simd.rs:88".to_string(), "add_lanes".to_string(), 60),
                ("do_syscall_64".to_string(), "do_syscall_64".to_string(), 30),
                (
                    "libblob.so+0x4a10".to_string(),
                    "libblob.so+0x4a10".to_string(),
                    10
                ),
            ]
        );
    }

    #[test]
    fn instructions_with_estimates_and_latency() {
        let profile = test_samples::profile();
        let filter = SampleFilter::default();
        let view0 = view(&profile, ViewKind::Instruction, 0, &filter);
        assert_eq!(view0.total_samples, 100);
        assert_eq!(
            names(&view0),
            [
                "compute+0x90",
                "libblob.so+0x4a10",
                "run+0x20",
                "compute+0xa4",
                "compute+0x4",
                "helper+0x0"
            ]
        );
        match &view0.rows[0].key {
            RowKey::Instruction {
                address,
                module_offset,
                source,
                ..
            } => {
                assert_eq!(*address, test_profile::APP_BASE + 0x1290);
                assert_eq!(*module_offset, 0x1290);
                assert_eq!(source.as_deref(), Some("src/simd.rs:88"));
            }
            other => panic!("{other:?}"),
        }
        // page-faults every 10 events: 4 samples stand for 40 faults.
        let view1 = view(&profile, ViewKind::Instruction, 1, &filter);
        assert_eq!(names(&view1), ["compute+0x90", "exc_page_fault+0x78"]);
        assert_eq!(view1.rows[0].estimated_events, Some(40.0));
        let latency = view1.rows[0].latency.as_ref().unwrap();
        assert_eq!(
            (latency.samples, latency.mean, latency.max),
            (4, 100.0, 150)
        );
        // 100 is bucket 96..=103: its midpoint, 99.
        assert_eq!(latency.p50, Some(99));
        let fault = view1.rows[1].latency.as_ref().unwrap();
        assert_eq!((fault.mean, fault.max), (1000.0, 2000));
        assert!(fault.p99.unwrap() >= 1920, "{fault:?}");
    }

    #[test]
    fn sort_by_latency_and_name_and_cut_to_top() {
        let profile = test_samples::profile();
        let filter = SampleFilter::default();
        let options = |sort, top| ViewOptions {
            filter: &filter,
            sort,
            top,
        };
        let by_latency = build_view(
            &profile,
            ViewKind::Instruction,
            1,
            &options(SortKey::Latency, 20),
        );
        assert_eq!(names(&by_latency), ["exc_page_fault+0x78", "compute+0x90"]);
        assert_eq!(percents(&by_latency)[0], (300.0 / 7.0, 300.0 / 7.0));
        let by_name = build_view(&profile, ViewKind::Module, 0, &options(SortKey::Name, 2));
        // Paths sort before labels (`/` < `[`).
        assert_eq!(names(&by_name), [test_profile::APP, test_profile::LIBBLOB]);
        assert_eq!((by_name.total_rows, by_name.rows.len()), (3, 2));
    }

    #[test]
    fn icache_lines_group_instructions_by_64_bytes() {
        let profile = test_samples::profile();
        let view = view(&profile, ViewKind::IcacheLine, 0, &SampleFilter::default());
        let rows: Vec<(u64, Vec<String>, u64)> = view
            .rows
            .iter()
            .map(|r| match &r.key {
                RowKey::IcacheLine {
                    module_offset,
                    functions,
                    ..
                } => (*module_offset, functions.clone(), r.samples),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            rows,
            [
                (
                    0x1280,
                    vec!["compute".to_string(), "helper".to_string()],
                    65
                ),
                (0x1200, vec!["run".to_string(), "compute".to_string()], 20),
                (0x4a00, vec!["libblob.so+0x4a10".to_string()], 15),
            ]
        );
        assert_eq!(
            view.rows[0].key.name(),
            format!("{:#018x}", test_profile::APP_BASE + 0x1280)
        );
    }

    #[test]
    fn dcache_lines_name_their_objects() {
        let profile = test_samples::profile();
        let view = view(&profile, ViewKind::DcacheLine, 1, &SampleFilter::default());
        assert_eq!(view.total_samples, 7);
        let rows: Vec<(u64, String, u64)> = view
            .rows
            .iter()
            .map(|r| match &r.key {
                RowKey::DcacheLine {
                    address, object, ..
                } => (*address, object.describe(*address), r.samples),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            rows,
            [
                (SHARED_LINE, "counter_a, counter_b (app)".to_string(), 4),
                (HEAP_LINE, "heap".to_string(), 3),
            ]
        );
        let latency = view.rows[0].latency.as_ref().unwrap();
        // Stores at 40 (x2) and 80, a load at 10: exact mean and maximum from the samples,
        // percentiles from the line's histogram (bucket midpoints 10, 41, 83, none above the
        // exact maximum).
        assert_eq!(
            (latency.mean, latency.max, latency.p50, latency.p99),
            (42.5, 80, Some(41), Some(80))
        );
    }

    #[test]
    fn dcache_lines_partly_filtered_out_have_no_percentiles() {
        // A load of the shared line from the stripped library, in the line's histogram too.
        let mut profile = test_samples::profile();
        let mut from_library = profile.data_lines[2].clone();
        from_library.frame = test_profile::STRIPPED;
        from_library.stats.latency_sum = 2000;
        from_library.stats.latency_max = 2000;
        profile.data_lines.push(from_library);
        profile.line_latency[0] =
            test_samples::line_histogram(SHARED_LINE, &[40, 40, 80, 10, 2000]);
        let latency = |profile: &Profile, filter: &SampleFilter| {
            view(profile, ViewKind::DcacheLine, 1, filter).rows[0]
                .latency
                .clone()
                .unwrap()
        };
        let whole = latency(&profile, &SampleFilter::default());
        // 2000 falls in the bucket 1920..=2047, recorded at its midpoint.
        assert_eq!((whole.samples, whole.max, whole.p99), (5, 2000, Some(1983)));
        // Only app's instructions: the histogram also holds the library's load, so the row
        // keeps the exact mean and maximum of its own samples and shows no percentiles.
        let only_app = SampleFilter {
            module: Some("app".into()),
            ..SampleFilter::default()
        };
        let app = latency(&profile, &only_app);
        assert_eq!(
            (app.samples, app.mean, app.max, app.p50, app.p99),
            (4, 42.5, 80, None, None)
        );
        // A histogram that missed a sample (its map was full for a while) gives no percentiles
        // either.
        profile.line_latency[0] = test_samples::line_histogram(SHARED_LINE, &[40, 80, 10, 2000]);
        let partial = latency(&profile, &SampleFilter::default());
        assert_eq!((partial.samples, partial.max, partial.p50), (5, 2000, None));
    }

    #[test]
    fn filters_keep_shares_of_the_selected_samples() {
        let profile = test_samples::profile();
        let only_app = SampleFilter {
            module: Some("app".into()),
            ..SampleFilter::default()
        };
        let view1 = view(&profile, ViewKind::Instruction, 1, &only_app);
        assert_eq!(names(&view1), ["compute+0x90"]);
        assert_eq!(view1.total_samples, 7);
        let worker = SampleFilter {
            comm: Some("app worker".into()),
            ..SampleFilter::default()
        };
        let functions = view(&profile, ViewKind::Function, 0, &worker);
        assert_eq!(functions.total_samples, 10);
        assert_eq!(functions.rows[0].key.name(), "libblob.so+0x4a10");
        assert_eq!(functions.rows[0].percent, 100.0);
        let nobody = SampleFilter {
            pids: vec![1],
            ..SampleFilter::default()
        };
        let empty = view(&profile, ViewKind::Thread, 0, &nobody);
        assert_eq!((empty.total_samples, empty.rows.len()), (0, 0));
    }
}
