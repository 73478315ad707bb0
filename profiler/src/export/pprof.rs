//! pprof export: the gzipped `perftools.profiles.Profile` protobuf that `go tool pprof`, Pyroscope
//! and other pprof readers load. The message types are written by hand after
//! github.com/google/pprof/proto/profile.proto, so no protoc is needed to build.
//!
//! What the file holds:
//! - Value columns, per event and in event order, named as Google's perf_to_profile names them
//!   but with `_` for the event name's `-`, `:` and `/` ([`column_prefix`]: Pyroscope refuses
//!   them): `<event>_sample` (count) with the samples, then `<event>_event` with the events they stand
//!   for, estimated as the report estimates them (`EventScale`: the counters' own count over the
//!   samples fired, else the period or the mean period) and rounded so that the column adds up
//!   to the report's estimate. The column exists where the report has an estimate. Off-CPU
//!   blocks (`export::offcpu`) are samples of their own, each stack with its nanoseconds
//!   blocked. Its unit is `nanoseconds` for clocks and `count` for everything else. A sample
//!   carries its event's values and 0 in the other events' columns.
//! - Data addresses: an event whose samples carried them (page faults, precise memory events)
//!   also has `<event>_data_sample` (and `_data_event`) columns, and `<event>_latency` (cycles,
//!   summed) when they carried a latency. Their samples are one per instruction and 64-byte data
//!   line, with the stack object -> line -> instruction's function (the object: a variable, the
//!   heap, the stack, a file; the line as its address), so `-sample_index=<event>_data_sample`
//!   shows a flame graph of the data touched, and 0 in the call-stack columns, so stack totals do
//!   not count them twice. The line's latency percentiles are numeric labels
//!   (`line_latency_p50`/`_p90`/`_p99`, unit cycles) beside the samples' `latency_max`.
//! - Labels per sample: `pid`, `tid` (numbers), `comm` (the process's command name: its main
//!   thread's), `thread_comm` and `container`, when known; `access` (`load`/`store`) on data
//!   samples whose data source says so.
//! - Locations, one per distinct frame, with the address, the mapping and one line per function at
//!   the address: inlined functions innermost first, the function they were inlined into last, as
//!   pprof expects. Stripped code has no lines, as pprof writes unsymbolized code; pprof then shows
//!   the address and can symbolize it from the binary. Lost user or kernel stacks are
//!   pseudo-functions (`[user stack lost]`), as Go's own profiles show lost external code.
//! - Mappings are rebuilt from the frames, since the profile keeps no memory maps: frames of one
//!   module loaded at one address (address - module_offset, the same in every process that shares
//!   the load address) form one mapping, spanning the lowest to the highest sampled address, with
//!   the file offset that makes pprof's address -> file offset translation exact. The range covers
//!   only the sampled part of the module, not all of it.
//! - `time_nanos`, `duration_nanos`, `period_type`/`period` from the first event, and comments
//!   naming the profiler, host, kernel, target, the samples fired per event, the events its
//!   counter counted (where it did) and every non-zero loss counter.

use std::collections::BTreeMap;
use std::io::Write;

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use super::{offcpu::OFF_CPU_EVENT, stack_root_first, ExportError, StackEntry};
use crate::aggregate::{
    dataspace::describe_data_address,
    filter::{EventScale, WholeEvents},
    latency::{LatencyAccumulator, LatencySummary},
};
use crate::profile::{
    DataAccess, DataLineSample, EventIndex, EventInfo, Frame, FrameId, Profile, StackSample,
};

use crate::fast_hash::HashMap;

/// The messages of profile.proto that pprof reads.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// `string_table[0]` is always "".
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// Innermost inlined function first, the function it was inlined into last.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// Writes the whole profile, every event, as a gzipped pprof protobuf.
pub fn write_pprof(profile: &Profile, out: impl Write) -> Result<(), ExportError> {
    let encoded = pprof_profile(profile).encode_to_vec();
    // The fastest level: an always-on agent writes a window every few seconds, and at 997 Hz
    // the default level was 8% of its CPU for files about a fifth smaller.
    let mut gzip = GzEncoder::new(out, Compression::fast());
    gzip.write_all(&encoded)?;
    gzip.finish()?;
    Ok(())
}

/// The pprof message for the whole profile (see the module documentation for its content).
pub fn pprof_profile(profile: &Profile) -> proto::Profile {
    Builder::new(profile).build()
}

/// The pprof unit of an event's estimated count: pprof scales and names time units, and would
/// glue any other unit ("CPU-cycles") to the numbers, so those are plain counts.
fn value_unit(event: &EventInfo) -> &'static str {
    if event.unit == "nanoseconds" {
        "nanoseconds"
    } else {
        "count"
    }
}

/// Whether data-line samples carry an address: events without one (clocks) may have line 0 in
/// older profiles, which the report does not show either.
fn has_address(access: &DataLineSample) -> bool {
    access.stats.count > 0 && access.line != 0
}

/// The latency percentiles of every data cache line with a latency histogram.
fn line_latency_summaries(profile: &Profile) -> HashMap<(u32, EventIndex, u64), LatencySummary> {
    profile
        .line_latency
        .iter()
        .filter_map(|histogram| {
            let mut line = LatencyAccumulator::default();
            line.add_buckets(&histogram.buckets);
            let key = (histogram.pid, histogram.event, histogram.line);
            Some((key, line.summary()?))
        })
        .collect()
}

/// Counts are u64, pprof values i64: saturate rather than wrap to negative.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The unit of sampled latencies: PEBS weights, IBS and SPE latencies count core cycles.
const LATENCY_UNIT: &str = "cycles";
/// How the names of the data-sample and latency columns end (`page_faults_data_sample`).
pub const DATA_SAMPLE_SUFFIX: &str = "_data_sample";
pub const LATENCY_SUFFIX: &str = "_latency";

/// How an event is named in the names of its value columns (`cpu_clock` in `cpu_clock_sample`):
/// its name with `_` for every character but ASCII letters, digits and `_`. Pyroscope refuses a
/// sample type with a `-` (every perf event name has one), so the files the agent writes could
/// not be uploaded to it; pprof takes any name, and the event's own name stays in the comments
/// (`samples fired: cpu-clock: N`).
pub fn column_prefix(event: &str) -> String {
    event
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A count of samples and, when the event's samples have an estimate, the events they stand
/// for: the `_sample` column and the `_event` column after it.
#[derive(Clone, Copy)]
struct CountColumns {
    samples: usize,
    /// The `_event` column's events so far (it is at `samples + 1`), when there is one.
    events: Option<WholeEvents>,
}

impl CountColumns {
    /// `weight`: the events of samples that measure themselves (off-CPU nanoseconds).
    fn fill(&mut self, count: u64, weight: Option<u64>, value: &mut [i64]) {
        value[self.samples] = to_i64(count);
        if let Some(events) = &mut self.events {
            value[self.samples + 1] = to_i64(weight.unwrap_or_else(|| events.next(count)));
        }
    }
}

/// Where one event's values go in `Sample::value`.
struct EventColumns {
    /// The event's call-stack samples.
    stacks: CountColumns,
    /// `<event>_data_sample` (and `_data_event`): its samples with a data address, by
    /// instruction and data cache line, when it has any.
    data: Option<CountColumns>,
    /// `<event>_latency`: the summed latency of those samples, when they carried one.
    latency: Option<usize>,
}

/// Frames of one module loaded at one address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct MappingKey<'a> {
    module: &'a str,
    /// address - module_offset: where file offset 0 is (or would be) mapped. The same for
    /// every process where frames carry file offsets (the agent's).
    load_bias: u64,
    /// Two files at one path (a program upgraded while the window ran) are two mappings.
    build_id: Option<&'a str>,
}

impl<'a> MappingKey<'a> {
    fn of(frame: &'a Frame) -> Option<Self> {
        (!frame.module.is_empty()).then(|| MappingKey {
            module: &frame.module,
            load_bias: frame.address.wrapping_sub(frame.module_offset),
            build_id: frame.build_id.as_deref(),
        })
    }
}

struct Builder<'a> {
    profile: &'a Profile,
    out: proto::Profile,
    strings: HashMap<String, i64>,
    columns: Vec<EventColumns>,
    mapping_ids: HashMap<MappingKey<'a>, u64>,
    /// (name, filename) string indexes -> function id.
    function_ids: HashMap<(i64, i64), u64>,
    frame_locations: HashMap<FrameId, u64>,
    pseudo_locations: HashMap<String, u64>,
    /// Latency percentiles of each sampled data cache line: (pid, event, line) -> summary.
    line_latency: HashMap<(u32, EventIndex, u64), LatencySummary>,
    /// (pid, tid) -> command name.
    comms: HashMap<(u32, u32), &'a str>,
    containers: HashMap<(u32, u32), &'a str>,
}

impl<'a> Builder<'a> {
    fn new(profile: &'a Profile) -> Self {
        let mut builder = Builder {
            profile,
            out: proto::Profile::default(),
            strings: HashMap::default(),
            columns: Vec::new(),
            mapping_ids: HashMap::default(),
            function_ids: HashMap::default(),
            frame_locations: HashMap::default(),
            pseudo_locations: HashMap::default(),
            line_latency: line_latency_summaries(profile),
            comms: profile
                .threads
                .iter()
                .map(|t| ((t.pid, t.tid), t.comm.as_str()))
                .collect(),
            containers: profile
                .threads
                .iter()
                .filter_map(|t| Some(((t.pid, t.tid), t.container.as_deref()?)))
                .collect(),
        };
        builder.string("");
        builder
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&index) = self.strings.get(s) {
            return index;
        }
        let index = self.out.string_table.len() as i64;
        self.out.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), index);
        index
    }

    fn value_type(&mut self, r#type: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(r#type),
            unit: self.string(unit),
        }
    }

    fn build(mut self) -> proto::Profile {
        self.sample_types();
        self.meta();
        self.mappings();
        let profile = self.profile;
        for sample in &profile.stacks {
            if sample.count > 0 {
                self.sample(sample);
            }
        }
        for access in profile.data_lines.iter().filter(|d| has_address(d)) {
            self.data_sample(access);
        }
        self.out
    }

    fn sample_types(&mut self) {
        let profile = self.profile;
        for (index, event) in profile.events.iter().enumerate() {
            let scale = match EventScale::of(profile, index as EventIndex) {
                // Off-CPU blocks weigh themselves (each stack its nanoseconds): the column is
                // there in a window without blocks too, so that every window has the same.
                EventScale::Unknown if event.name == OFF_CPU_EVENT => EventScale::Period(1),
                scale => scale,
            };
            let prefix = column_prefix(&event.name);
            let stacks = self.count_columns(&prefix, event, scale);
            let data_lines = || {
                profile
                    .data_lines
                    .iter()
                    .filter(move |d| d.event as usize == index && has_address(d))
            };
            let data = (data_lines().next().is_some())
                .then(|| self.count_columns(&format!("{prefix}_data"), event, scale));
            let latency = data_lines().any(|d| d.stats.latency_count > 0).then(|| {
                let latency_type =
                    self.value_type(&format!("{prefix}{LATENCY_SUFFIX}"), LATENCY_UNIT);
                self.out.sample_type.push(latency_type);
                self.out.sample_type.len() - 1
            });
            self.columns.push(EventColumns {
                stacks,
                data,
                latency,
            });
        }
        // The first event's best estimate is what pprof shows unless told otherwise.
        if let Some(first) = self.columns.first() {
            let stacks = first.stacks;
            let column = stacks.samples + usize::from(stacks.events.is_some());
            self.out.default_sample_type = self.out.sample_type[column].r#type;
        }
    }

    /// Adds the `<name>_sample` column and, when the event's samples have a known weight, the
    /// `<name>_event` column.
    fn count_columns(&mut self, name: &str, event: &EventInfo, scale: EventScale) -> CountColumns {
        let samples = self.out.sample_type.len();
        let sample_type = self.value_type(&format!("{name}_sample"), "count");
        self.out.sample_type.push(sample_type);
        let events = WholeEvents::new(scale);
        if events.is_some() {
            let event_type = self.value_type(&format!("{name}_event"), value_unit(event));
            self.out.sample_type.push(event_type);
        }
        CountColumns { samples, events }
    }

    fn meta(&mut self) {
        let profile = self.profile;
        let meta = &profile.meta;
        self.out.time_nanos = to_i64(meta.start_unix_ns);
        self.out.duration_nanos = to_i64(meta.duration_ns);
        if let Some(event) = profile.events.first() {
            self.out.period_type = Some(self.value_type(&event.name, value_unit(event)));
            self.out.period = EventScale::of(profile, 0)
                .estimate(1)
                .map_or(0, |per_sample| per_sample.round() as i64);
        }
        let mut comments = vec![format!(
            "profiler {} on {} (kernel {}): {}",
            meta.profiler_version, meta.hostname, meta.kernel_release, meta.target
        )];
        // What the samples are out of: per event, the samples the kernel fired.
        comments.extend(
            profile
                .events
                .iter()
                .zip(&profile.losses.samples_fired)
                .map(|(event, fired)| format!("samples fired: {}: {fired}", event.name)),
        );
        // And what the counters counted, which the `_event` columns are scaled to.
        comments.extend(
            profile
                .events
                .iter()
                .zip(&profile.losses.event_counts)
                .filter(|(_, &counted)| counted > 0)
                .map(|(event, counted)| format!("events counted: {}: {counted}", event.name)),
        );
        comments.extend(
            profile
                .losses
                .counters
                .iter()
                .filter(|(_, &count)| count > 0)
                .map(|(what, count)| format!("{what}: {count}")),
        );
        for comment in comments {
            let index = self.string(&comment);
            self.out.comment.push(index);
        }
    }

    /// One mapping per module and load address among the sampled frames, the most sampled first.
    fn mappings(&mut self) {
        #[derive(Default)]
        struct Span<'a> {
            frames: Vec<&'a Frame>,
            samples: u64,
        }
        let profile = self.profile;
        let mut frame_samples: HashMap<FrameId, u64> = HashMap::default();
        for sample in profile.stacks.iter().filter(|s| s.count > 0) {
            for &id in &sample.frames {
                *frame_samples.entry(id).or_default() += sample.count;
            }
        }
        for access in profile.data_lines.iter().filter(|d| has_address(d)) {
            *frame_samples.entry(access.frame).or_default() += access.stats.count;
        }
        frame_samples.retain(|_, samples| *samples > 0);
        let mut spans: BTreeMap<MappingKey<'a>, Span<'a>> = BTreeMap::new();
        for (id, samples) in frame_samples {
            let frame = &profile.frames[id as usize];
            if let Some(key) = MappingKey::of(frame) {
                let span = spans.entry(key).or_default();
                span.frames.push(frame);
                span.samples += samples;
            }
        }
        let mut spans: Vec<_> = spans.into_iter().collect();
        // Stable sort: equal weights keep the key order, so the output is deterministic.
        spans.sort_by_key(|(_, span)| std::cmp::Reverse(span.samples));

        for (key, span) in spans {
            let lowest = span
                .frames
                .iter()
                .min_by_key(|f| f.address)
                .expect("a span holds the frame that created it");
            let highest = span.frames.iter().map(|f| f.address).max().unwrap_or(0);
            let all = |has: fn(&Frame) -> bool| span.frames.iter().all(|f| has(f));
            let id = self.out.mapping.len() as u64 + 1;
            let build_id = key.build_id.unwrap_or("");
            let mapping = proto::Mapping {
                id,
                memory_start: lowest.address,
                memory_limit: highest.saturating_add(1),
                file_offset: lowest.module_offset,
                filename: self.string(key.module),
                build_id: self.string(build_id),
                has_functions: all(|f| f.function.is_some()),
                has_filenames: all(|f| f.file.is_some()),
                has_line_numbers: all(|f| f.line.is_some()),
                has_inline_frames: span.frames.iter().any(|f| !f.inlined.is_empty()),
            };
            self.out.mapping.push(mapping);
            self.mapping_ids.insert(key, id);
        }
    }

    fn sample(&mut self, sample: &'a StackSample) {
        let profile = self.profile;
        let mut location_id: Vec<u64> = stack_root_first(profile, sample)
            .map(|entry| self.location(entry))
            .collect();
        location_id.reverse();

        let mut value = vec![0; self.out.sample_type.len()];
        self.columns[sample.event as usize]
            .stacks
            .fill(sample.count, sample.weight, &mut value);
        let label = self.thread_labels(sample.pid, Some(sample.tid));
        self.out.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }

    /// The samples of one instruction whose data addresses fell in one cache line: a stack whose
    /// root is the object the line belongs to (a variable, the heap, a file), then the line,
    /// then the instruction's function, so a flame graph shows which data is touched and by
    /// what. Latency percentiles of the line ride along as numeric labels.
    fn data_sample(&mut self, access: &'a DataLineSample) {
        let profile = self.profile;
        let object = describe_data_address(profile, access.pid, access.line).name();
        let location_id = vec![
            self.frame_location(access.frame, &profile.frames[access.frame as usize]),
            self.pseudo_location(&format!("{:#x}", access.line)),
            self.pseudo_location(&object),
        ];
        let columns = &mut self.columns[access.event as usize];
        let latency = columns.latency;
        let mut value = vec![0; self.out.sample_type.len()];
        if let Some(data) = &mut columns.data {
            data.fill(access.stats.count, None, &mut value);
        }
        if let Some(latency) = latency {
            value[latency] = to_i64(access.stats.latency_sum);
        }
        let mut label = self.thread_labels(access.pid, access.tid);
        let access_kind = match access.access {
            DataAccess::Load => Some("load"),
            DataAccess::Store => Some("store"),
            DataAccess::Unknown => None,
        };
        if let Some(kind) = access_kind {
            label.push(self.str_label("access", kind));
        }
        if access.stats.latency_count > 0 {
            let max = access.stats.latency_max;
            label.push(self.latency_label("latency_max", max));
        }
        let line = self
            .line_latency
            .get(&(access.pid, access.event, access.line))
            .cloned();
        if let Some(line) = line {
            let percentiles = [
                ("line_latency_p50", line.p50),
                ("line_latency_p90", line.p90),
                ("line_latency_p99", line.p99),
            ];
            for (key, value) in percentiles {
                if let Some(value) = value {
                    label.push(self.latency_label(key, value));
                }
            }
        }
        self.out.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }

    /// `pid`, `tid` (when known), and the names of the process, thread and container.
    fn thread_labels(&mut self, pid: u32, tid: Option<u32>) -> Vec<proto::Label> {
        let mut label = vec![self.num_label("pid", i64::from(pid), "")];
        label.extend(tid.map(|tid| self.num_label("tid", i64::from(tid), "")));
        let thread = (pid, tid.unwrap_or(pid));
        let strings = [
            ("comm", self.comms.get(&(pid, pid)).copied()),
            ("thread_comm", tid.and(self.comms.get(&thread).copied())),
            ("container", self.containers.get(&thread).copied()),
        ];
        for (key, text) in strings {
            if let Some(text) = text {
                label.push(self.str_label(key, text));
            }
        }
        label
    }

    fn str_label(&mut self, key: &str, text: &str) -> proto::Label {
        proto::Label {
            key: self.string(key),
            str: self.string(text),
            ..Default::default()
        }
    }

    fn num_label(&mut self, key: &str, num: i64, unit: &str) -> proto::Label {
        proto::Label {
            key: self.string(key),
            num,
            num_unit: if unit.is_empty() {
                0
            } else {
                self.string(unit)
            },
            ..Default::default()
        }
    }

    fn latency_label(&mut self, key: &str, cycles: u64) -> proto::Label {
        self.num_label(key, to_i64(cycles), LATENCY_UNIT)
    }

    fn location(&mut self, entry: StackEntry<'a>) -> u64 {
        match entry {
            StackEntry::Frame(id, frame) => self.frame_location(id, frame),
            StackEntry::UserStackLost => self.pseudo_location(StackEntry::USER_STACK_LOST),
            StackEntry::KernelStackLost => self.pseudo_location(StackEntry::KERNEL_STACK_LOST),
        }
    }

    fn frame_location(&mut self, frame_id: FrameId, frame: &'a Frame) -> u64 {
        if let Some(&id) = self.frame_locations.get(&frame_id) {
            return id;
        }
        let mut line = Vec::with_capacity(frame.inlined.len() + 1);
        if let Some(function) = &frame.function {
            for inlined in frame.inlined.iter().rev() {
                line.push(self.line(&inlined.function, inlined.file.as_deref(), inlined.line));
            }
            line.push(self.line(function, frame.file.as_deref(), frame.line));
        }
        let mapping_id = MappingKey::of(frame).map_or(0, |key| self.mapping_ids[&key]);
        let id = self.push_location(mapping_id, frame.address, line);
        self.frame_locations.insert(frame_id, id);
        id
    }

    /// A location with no address or mapping, for a pseudo-function.
    fn pseudo_location(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.pseudo_locations.get(name) {
            return id;
        }
        let line = vec![self.line(name, None, None)];
        let id = self.push_location(0, 0, line);
        self.pseudo_locations.insert(name.to_string(), id);
        id
    }

    fn push_location(&mut self, mapping_id: u64, address: u64, line: Vec<proto::Line>) -> u64 {
        let id = self.out.location.len() as u64 + 1;
        self.out.location.push(proto::Location {
            id,
            mapping_id,
            address,
            line,
            is_folded: false,
        });
        id
    }

    fn line(&mut self, function: &str, file: Option<&str>, line: Option<u32>) -> proto::Line {
        let name = self.string(function);
        let filename = self.string(file.unwrap_or(""));
        let next_id = self.out.function.len() as u64 + 1;
        let function_id = *self.function_ids.entry((name, filename)).or_insert(next_id);
        if function_id == next_id {
            self.out.function.push(proto::Function {
                id: function_id,
                name,
                // Symbols are demangled at record time; the mangled name is not kept.
                system_name: name,
                filename,
                start_line: 0,
            });
        }
        proto::Line {
            function_id,
            line: line.map_or(0, i64::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use flate2::read::GzDecoder;

    use super::*;
    use crate::profile::test_profile::{self, APP, APP_BASE, LIBBLOB, LIBBLOB_BASE};

    /// `profile` as a recording leaves it: the counters' own counts beside the samples they
    /// fired (cpu-clock: 100 samples over 100,000,003 ns; page-faults: 7 over 70).
    fn recorded(mut profile: Profile) -> Profile {
        profile.losses.samples_fired = vec![100, 7];
        profile.losses.event_counts = vec![100_000_003, 70];
        profile
    }

    fn exported() -> (Vec<u8>, proto::Profile) {
        let mut gz = Vec::new();
        write_pprof(&recorded(test_profile::profile()), &mut gz).unwrap();
        let mut encoded = Vec::new();
        GzDecoder::new(gz.as_slice())
            .read_to_end(&mut encoded)
            .expect("the export is gzip");
        let decoded = proto::Profile::decode(encoded.as_slice()).expect("the export is a Profile");
        (gz, decoded)
    }

    fn text(p: &proto::Profile, index: i64) -> &str {
        &p.string_table[index as usize]
    }

    /// (type, unit) of each value column.
    fn value_types(p: &proto::Profile) -> Vec<(&str, &str)> {
        p.sample_type
            .iter()
            .map(|t| (text(p, t.r#type), text(p, t.unit)))
            .collect()
    }

    fn column(p: &proto::Profile, name: &str) -> usize {
        p.sample_type
            .iter()
            .position(|t| text(p, t.r#type) == name)
            .unwrap_or_else(|| panic!("no sample type {name}"))
    }

    fn total(p: &proto::Profile, name: &str) -> i64 {
        let column = column(p, name);
        p.sample.iter().map(|s| s.value[column]).sum()
    }

    fn function_names(p: &proto::Profile, location: &proto::Location) -> Vec<(String, i64)> {
        location
            .line
            .iter()
            .map(|l| {
                let f = &p.function[l.function_id as usize - 1];
                assert_eq!(f.id, l.function_id);
                (text(p, f.name).to_owned(), l.line)
            })
            .collect()
    }

    #[test]
    fn columns_hold_samples_and_estimated_event_counts() {
        let (_, p) = exported();
        assert_eq!(p.string_table[0], "");
        assert_eq!(
            value_types(&p),
            [
                ("cpu_clock_sample", "count"),
                ("cpu_clock_event", "nanoseconds"),
                ("page_faults_sample", "count"),
                ("page_faults_event", "count"),
            ]
        );
        assert_eq!(text(&p, p.default_sample_type), "cpu_clock_event");
        assert_eq!(total(&p, "cpu_clock_sample"), 100);
        // The report's estimate: the counted nanoseconds, not 100 x the nominal 1 ms.
        assert_eq!(total(&p, "cpu_clock_event"), 100_000_003);
        assert_eq!(total(&p, "page_faults_sample"), 7);
        assert_eq!(total(&p, "page_faults_event"), 70);
        // A sample carries only its own event's values.
        assert!(p
            .sample
            .iter()
            .all(|s| s.value.len() == 4 && ((s.value[0] > 0) != (s.value[2] > 0))));
        assert_eq!(p.period, 1_000_000);
        let period_type = p.period_type.as_ref().unwrap();
        assert_eq!(text(&p, period_type.r#type), "cpu-clock");
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.duration_nanos, 2_000_000_000);
    }

    #[test]
    fn off_cpu_samples_count_blocks_and_their_values_are_nanoseconds() {
        let mut profile = test_profile::profile_with_off_cpu();
        crate::export::offcpu::add_off_cpu_event(&mut profile);
        let p = pprof_profile(&profile);
        assert_eq!(
            value_types(&p)[3..],
            [
                ("off_cpu_sample", "count"),
                ("off_cpu_event", "nanoseconds")
            ]
        );
        assert_eq!(total(&p, "off_cpu_sample"), 7);
        assert_eq!(total(&p, "off_cpu_event"), 250_001_500);
        // Each stack its own time, not the mean block's.
        let event = column(&p, "off_cpu_event");
        let mut values: Vec<i64> = p.sample.iter().map(|s| s.value[event]).collect();
        values.retain(|&value| value > 0);
        values.sort();
        assert_eq!(values, [1_500, 250_000_000]);
        let comments: Vec<&str> = p.comment.iter().map(|&c| text(&p, c)).collect();
        assert!(
            comments.contains(&"samples fired: off-cpu: 7"),
            "{comments:?}"
        );
        // Folded stacks weigh them by their time, as off-CPU flame graphs do.
        let folded: u64 = crate::export::folded::folded_stacks(&profile, 2)
            .unwrap()
            .iter()
            .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(folded, 250_001_500);
    }

    #[test]
    fn data_addresses_are_samples_of_their_own_columns_under_object_and_line() {
        let p = pprof_profile(&recorded(test_profile::profile_with_data()));
        assert_eq!(
            value_types(&p)[2..],
            [
                ("page_faults_sample", "count"),
                ("page_faults_event", "count"),
                ("page_faults_data_sample", "count"),
                ("page_faults_data_event", "count"),
                ("page_faults_latency", "cycles"),
            ]
        );
        // The call-stack columns are as without data addresses: nothing counted twice.
        assert_eq!(total(&p, "page_faults_sample"), 7);
        assert_eq!(total(&p, "cpu_clock_sample"), 100);
        assert_eq!(total(&p, "page_faults_data_sample"), 7);
        assert_eq!(total(&p, "page_faults_data_event"), 70);
        assert_eq!(total(&p, "page_faults_latency"), 400);

        let data = column(&p, "page_faults_data_sample");
        // (object, line, function), samples, labels other than the thread's.
        type DataStack = (Vec<String>, i64, Vec<(String, String)>);
        let mut stacks: Vec<DataStack> = p
            .sample
            .iter()
            .filter(|s| s.value[data] > 0)
            .map(|s| {
                // Root first, each location's outermost function.
                let names = s
                    .location_id
                    .iter()
                    .rev()
                    .map(|&id| {
                        let location = &p.location[id as usize - 1];
                        function_names(&p, location)
                            .pop()
                            .map_or_else(|| format!("{:#x}", location.address), |(name, _)| name)
                    })
                    .collect();
                let labels = s
                    .label
                    .iter()
                    .filter(|l| {
                        !["pid", "comm", "thread_comm", "container"].contains(&text(&p, l.key))
                    })
                    .map(|l| {
                        let value = match l.str {
                            0 => format!("{} {}", l.num, text(&p, l.num_unit)),
                            text_index => text(&p, text_index).to_string(),
                        };
                        (text(&p, l.key).to_string(), value)
                    })
                    .collect();
                (names, s.value[data], labels)
            })
            .collect();
        stacks.sort();
        let heap_line = format!("{:#x}", test_profile::HEAP_LINE);
        let global_line = format!("{:#x}", test_profile::GLOBAL_LINE);
        let label = |key: &str, value: &str| (key.to_string(), value.to_string());
        assert_eq!(
            stacks,
            [
                (
                    vec!["heap".to_string(), heap_line, "compute".to_string()],
                    4,
                    vec![
                        label("tid", "100 "),
                        label("access", "load"),
                        label("latency_max", "250 cycles"),
                        label("line_latency_p50", "5 cycles"),
                        // The midpoint of the bucket holding 250 (buckets are 1/8 wide).
                        label("line_latency_p90", "247 cycles"),
                        label("line_latency_p99", "247 cycles"),
                    ]
                ),
                (
                    vec![
                        "request_count (app)".to_string(),
                        global_line,
                        format!("{:#x}", LIBBLOB_BASE + 0x4a10)
                    ],
                    3,
                    vec![label("tid", "101 "), label("access", "store")]
                ),
            ]
        );
    }

    #[test]
    fn frequency_sampling_without_recorded_periods_has_no_estimate_column() {
        // As the report, which says "event counts not estimated, samples only".
        let mut profile = test_profile::profile();
        profile.events[1] = EventInfo {
            name: "cycles".into(),
            frequency: Some(4000),
            unit: "CPU-cycles".into(),
            ..EventInfo::default()
        };
        let p = pprof_profile(&profile);
        let types: Vec<&str> = p.sample_type.iter().map(|t| text(&p, t.r#type)).collect();
        assert_eq!(types, ["cpu_clock_sample", "cycles_sample"]);
        assert_eq!(total(&p, "cycles_sample"), 7);
    }

    #[test]
    fn locations_carry_inlined_lines_innermost_first_and_mappings() {
        let (_, p) = exported();
        let frames = test_profile::profile().frames;
        let location_at = |address: u64| {
            p.location
                .iter()
                .find(|l| l.address == address)
                .unwrap_or_else(|| panic!("no location at {address:#x}"))
        };

        let inlined = location_at(frames[test_profile::COMPUTE_INLINED as usize].address);
        assert_eq!(
            function_names(&p, inlined),
            [
                ("add_lanes".to_owned(), 88),
                ("vec_sum".to_owned(), 7),
                ("compute".to_owned(), 42)
            ]
        );
        let add_lanes = &p.function[inlined.line[0].function_id as usize - 1];
        assert_eq!(text(&p, add_lanes.filename), "src/simd.rs");

        let app = &p.mapping[inlined.mapping_id as usize - 1];
        assert_eq!(text(&p, app.filename), APP);
        assert_eq!(text(&p, app.build_id), "a1b2c3d4");
        assert_eq!(
            (app.memory_start, app.memory_limit, app.file_offset),
            (APP_BASE + 0x1010, APP_BASE + 0x1401, 0x1010)
        );
        assert!(app.has_functions && app.has_line_numbers && app.has_inline_frames);
        // The most sampled module is the first mapping, pprof's main binary.
        assert_eq!(app.id, 1);

        let stripped = location_at(LIBBLOB_BASE + 0x4a10);
        assert!(stripped.line.is_empty());
        let libblob = &p.mapping[stripped.mapping_id as usize - 1];
        assert_eq!(text(&p, libblob.filename), LIBBLOB);
        assert_eq!(text(&p, libblob.build_id), "ffee0011");
        assert_eq!(libblob.file_offset, 0x4a10);
        assert!(!libblob.has_functions);

        let syscall = location_at(frames[test_profile::SYSCALL as usize].address);
        let kernel = &p.mapping[syscall.mapping_id as usize - 1];
        assert_eq!(text(&p, kernel.filename), test_profile::KERNEL);
    }

    /// Two files at one path and load address (a program upgraded while a window ran, frames
    /// at file offsets): two mappings, each with its own build ID.
    #[test]
    fn one_path_with_two_build_ids_is_two_mappings() {
        let mut profile = test_profile::profile();
        let main = &profile.frames[test_profile::MAIN as usize];
        let upgraded = Frame {
            build_id: Some("99887766".into()),
            ..main.clone()
        };
        let upgraded_id = profile.frames.len() as FrameId;
        profile.frames.push(upgraded);
        profile.stacks.push(StackSample {
            pid: 100,
            tid: 100,
            frames: vec![upgraded_id],
            count: 1,
            ..StackSample::default()
        });
        let p = pprof_profile(&profile);
        let mut build_ids: Vec<&str> = p
            .mapping
            .iter()
            .filter(|mapping| text(&p, mapping.filename) == APP)
            .map(|mapping| text(&p, mapping.build_id))
            .collect();
        build_ids.sort();
        assert_eq!(build_ids, ["99887766", "a1b2c3d4"]);
    }

    #[test]
    fn samples_are_leaf_first_with_thread_labels() {
        let (_, p) = exported();
        let lost = p
            .sample
            .iter()
            .find(|s| s.value[0] == 5)
            .expect("the sample with the lost user stack");
        let names: Vec<String> = lost
            .location_id
            .iter()
            .map(|&id| {
                function_names(&p, &p.location[id as usize - 1])[0]
                    .0
                    .clone()
            })
            .collect();
        assert_eq!(names, ["do_syscall_64", "[user stack lost]"]);

        let worker = p.sample.iter().find(|s| s.value[0] == 10).unwrap();
        let labels: Vec<(&str, String)> = worker
            .label
            .iter()
            .map(|l| {
                let value = if l.str != 0 {
                    text(&p, l.str).to_owned()
                } else {
                    l.num.to_string()
                };
                (text(&p, l.key), value)
            })
            .collect();
        assert_eq!(
            labels,
            [
                ("pid", "100".to_owned()),
                ("tid", "101".to_owned()),
                ("comm", "app".to_owned()),
                ("thread_comm", "app worker".to_owned()),
                ("container", "docker-1234".to_owned()),
            ]
        );
    }

    /// Google's pprof, built from Debian's packaged sources once and kept in the target
    /// directory: an independent decoder of what we write.
    fn google_pprof() -> PathBuf {
        const SOURCE: &str = "/usr/share/gocode/src/github.com/google/pprof";
        const INSTALL: &str = "apt-get install -y golang-go golang-github-google-pprof-dev";
        let exe = std::env::current_exe().unwrap();
        // target/<profile>/deps/<test binary>
        let tools = exe.parent().unwrap().parent().unwrap().join("tools");
        let pprof = tools.join("pprof");
        if pprof.exists() {
            return pprof;
        }
        assert!(
            Path::new(SOURCE).is_dir(),
            "Google's pprof sources are missing ({SOURCE}): run `{INSTALL}`"
        );
        std::fs::create_dir_all(&tools).unwrap();
        // Built under a unique name and renamed, so test processes building at once never run
        // a half-written binary.
        let partial = tools.join(format!("pprof.{}", std::process::id()));
        let output = Command::new("go")
            .args(["build", "-o"])
            .arg(&partial)
            .arg("github.com/google/pprof")
            .env("GOPATH", "/usr/share/gocode")
            .env("GO111MODULE", "off")
            .env("GOCACHE", tools.join("go-cache"))
            .output()
            .unwrap_or_else(|e| panic!("cannot run `go` ({e}): run `{INSTALL}`"));
        assert!(
            output.status.success(),
            "building Google's pprof failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&partial, &pprof).unwrap();
        pprof
    }

    fn run_pprof(file: &Path, args: &[&str]) -> String {
        let output = Command::new(google_pprof())
            .args(args)
            .arg("-symbolize=none")
            .arg(file)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "pprof {args:?} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// `pprof -top` rows as (function, flat, cum).
    fn top(file: &Path, sample_index: &str) -> Vec<(String, i64, i64)> {
        let out = run_pprof(
            file,
            &[
                "-top",
                "-nodecount=1000",
                &format!("-sample_index={sample_index}"),
            ],
        );
        out.lines()
            .skip_while(|l| !l.trim_start().starts_with("flat"))
            .skip(1)
            .map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                let name = fields[5..].join(" ");
                (name, fields[0].parse().unwrap(), fields[3].parse().unwrap())
            })
            .collect()
    }

    /// `profile` as a pprof file in a temporary directory (removed when dropped).
    fn pprof_file(profile: &Profile) -> (tempfile::TempDir, PathBuf) {
        let mut gz = Vec::new();
        write_pprof(profile, &mut gz).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("profile.pb.gz");
        std::fs::write(&file, gz).unwrap();
        (dir, file)
    }

    /// The (flat, cum) of `name` among `pprof -top` rows.
    fn top_row(rows: &[(String, i64, i64)], name: &str) -> (i64, i64) {
        rows.iter()
            .find(|(n, _, _)| n == name)
            .map(|&(_, flat, cum)| (flat, cum))
            .unwrap_or_else(|| panic!("no {name} in pprof -top: {rows:?}"))
    }

    #[test]
    fn google_pprof_reads_the_same_totals_and_functions() {
        let (_dir, file) = pprof_file(&recorded(test_profile::profile()));

        let cpu = top(&file, "cpu_clock_sample");
        let row = |name: &str| top_row(&cpu, name);
        // pprof marks the functions a location's lines say were inlined.
        assert_eq!(row("add_lanes (inline)"), (60, 60));
        assert_eq!(row("vec_sum (inline)"), (0, 60));
        assert_eq!(row("compute"), (0, 60));
        assert_eq!(row("do_syscall_64"), (30, 30));
        assert_eq!(row("run"), (0, 85));
        assert_eq!(row("main"), (0, 85));
        assert_eq!(row("[user stack lost]"), (0, 5));
        assert_eq!(row("<[u8; 4] as app::Worker>::run"), (0, 10));
        // Stripped code: pprof names it by its mapping.
        assert_eq!(row("[libblob.so]"), (10, 10));
        assert_eq!(cpu.iter().map(|r| r.1).sum::<i64>(), 100);

        let faults = top(&file, "page_faults_event");
        assert_eq!(faults.iter().map(|r| r.1).sum::<i64>(), 70);
        assert!(faults.contains(&("exc_page_fault".to_owned(), 70, 70)));

        let raw = run_pprof(&file, &["-raw"]);
        assert!(
            raw.contains("cpu_clock_sample/count cpu_clock_event/nanoseconds"),
            "{raw}"
        );
        assert!(raw.contains(&format!("{LIBBLOB} ffee0011")), "{raw}");
        assert!(raw.contains("thread_comm:[app worker]"), "{raw}");
    }

    #[test]
    fn google_pprof_shows_data_lines_and_their_latency() {
        let (_dir, file) = pprof_file(&recorded(test_profile::profile_with_data()));

        let data = top(&file, "page_faults_data_sample");
        let cum = |name: &str| top_row(&data, name).1;
        assert_eq!(cum("heap"), 4);
        assert_eq!(cum(&format!("{:#x}", test_profile::HEAP_LINE)), 4);
        assert_eq!(cum("request_count (app)"), 3);
        assert_eq!(cum("add_lanes (inline)"), 4);
        // Not a call-stack sample: the stack columns do not see them.
        let faults = top(&file, "page_faults_sample");
        assert_eq!(faults.iter().map(|r| r.1).sum::<i64>(), 7);
        assert!(!faults.iter().any(|(name, _, _)| name == "heap"));
        // pprof writes the unit after latencies: the heap line's 400 cycles are all of them.
        let latency = run_pprof(&file, &["-top", "-sample_index=page_faults_latency"]);
        let heap = latency.lines().find(|l| l.ends_with(" heap"));
        let heap: Vec<&str> = heap.expect(&latency).split_whitespace().collect();
        assert_eq!(heap[3..5], ["400cycles", "100%"], "{latency}");

        let tags = run_pprof(&file, &["-tags", "-sample_index=page_faults_data_sample"]);
        let percentile = tags.split("line_latency_p99: Total 4.0").nth(1);
        let percentile = percentile.expect(&tags).lines().nth(1).unwrap_or_default();
        assert!(percentile.trim().ends_with("): 247"), "{tags}");
    }
}
