//! pprof export: the gzipped `perftools.profiles.Profile` protobuf that `go tool pprof`, Pyroscope
//! and other pprof readers load. The message types are written by hand after
//! github.com/google/pprof/proto/profile.proto, so no protoc is needed to build.
//!
//! What the file holds:
//! - Value columns, per event and in event order, named as Google's perf_to_profile names them:
//!   `<event>_sample` (count) with the samples, then `<event>_event` with the estimated event
//!   count, samples x events per sample. That column exists only when every sample stands for a
//!   known number of events: a fixed period, or a clock (unit nanoseconds: cpu-clock, task-clock)
//!   sampled at a frequency, which the kernel turns into the fixed period 1e9/freq ns. Any other
//!   frequency-sampled event has a varying period the profile does not keep, so it gets no
//!   estimate. Its unit is `nanoseconds` for clocks and `count` for everything else. A sample
//!   carries its event's values and 0 in the other events' columns.
//! - Labels per sample: `pid`, `tid` (numbers), `comm` (the process's command name: its main
//!   thread's), `thread_comm` and `container`, when known.
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
//!   naming the profiler, host, kernel, target, the samples fired per event and every non-zero
//!   loss counter.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use super::{stack_root_first, ExportError, StackEntry};
use crate::profile::{EventInfo, Frame, FrameId, Profile, StackSample};

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
    let mut gzip = GzEncoder::new(out, Compression::default());
    gzip.write_all(&encoded)?;
    gzip.finish()?;
    Ok(())
}

/// The pprof message for the whole profile (see the module documentation for its content).
pub fn pprof_profile(profile: &Profile) -> proto::Profile {
    Builder::new(profile).build()
}

/// Events each sample of `event` stands for, when that is the same for every sample.
fn events_per_sample(event: &EventInfo) -> Option<u64> {
    match (event.period, event.frequency) {
        (Some(period), _) if period > 0 => Some(period),
        (_, Some(hz)) if hz > 0 && event.unit == "nanoseconds" => Some(1_000_000_000 / hz),
        _ => None,
    }
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

/// Counts are u64, pprof values i64: saturate rather than wrap to negative.
fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Where one event's values go in `Sample::value`.
struct EventColumns {
    samples: usize,
    /// Events per sample for the `_event` column (at `samples + 1`), when there is one.
    events_per_sample: Option<u64>,
}

/// Frames of one module loaded at one address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct MappingKey<'a> {
    module: &'a str,
    /// address - module_offset: where file offset 0 is (or would be) mapped.
    load_bias: u64,
}

impl<'a> MappingKey<'a> {
    fn of(frame: &'a Frame) -> Option<Self> {
        (!frame.module.is_empty()).then(|| MappingKey {
            module: &frame.module,
            load_bias: frame.address.wrapping_sub(frame.module_offset),
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
    pseudo_locations: HashMap<&'static str, u64>,
    /// (pid, tid) -> command name.
    comms: HashMap<(u32, u32), &'a str>,
    containers: HashMap<(u32, u32), &'a str>,
}

impl<'a> Builder<'a> {
    fn new(profile: &'a Profile) -> Self {
        let mut builder = Builder {
            profile,
            out: proto::Profile::default(),
            strings: HashMap::new(),
            columns: Vec::new(),
            mapping_ids: HashMap::new(),
            function_ids: HashMap::new(),
            frame_locations: HashMap::new(),
            pseudo_locations: HashMap::new(),
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
        self.out
    }

    fn sample_types(&mut self) {
        for event in &self.profile.events {
            let samples = self.out.sample_type.len();
            let sample_type = self.value_type(&format!("{}_sample", event.name), "count");
            self.out.sample_type.push(sample_type);
            let events_per_sample = events_per_sample(event);
            if events_per_sample.is_some() {
                let event_type =
                    self.value_type(&format!("{}_event", event.name), value_unit(event));
                self.out.sample_type.push(event_type);
            }
            self.columns.push(EventColumns {
                samples,
                events_per_sample,
            });
        }
        // The first event's best estimate is what pprof shows unless told otherwise.
        if let Some(first) = self.columns.first() {
            let column = first.samples + usize::from(first.events_per_sample.is_some());
            self.out.default_sample_type = self.out.sample_type[column].r#type;
        }
    }

    fn meta(&mut self) {
        let profile = self.profile;
        let meta = &profile.meta;
        self.out.time_nanos = to_i64(meta.start_unix_ns);
        self.out.duration_nanos = to_i64(meta.duration_ns);
        if let Some(event) = profile.events.first() {
            self.out.period_type = Some(self.value_type(&event.name, value_unit(event)));
            self.out.period = events_per_sample(event).map_or(0, to_i64);
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
        let mut frame_samples: HashMap<FrameId, u64> = HashMap::new();
        for sample in profile.stacks.iter().filter(|s| s.count > 0) {
            for &id in &sample.frames {
                *frame_samples.entry(id).or_default() += sample.count;
            }
        }
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
            // Every frame of a span comes from the same file, so any build ID is the file's.
            let build_id = span
                .frames
                .iter()
                .find_map(|f| f.build_id.as_deref())
                .unwrap_or("");
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

        let columns = &self.columns[sample.event as usize];
        let mut value = vec![0; self.out.sample_type.len()];
        value[columns.samples] = to_i64(sample.count);
        if let Some(per_sample) = columns.events_per_sample {
            value[columns.samples + 1] = to_i64(sample.count.saturating_mul(per_sample));
        }

        let mut label = vec![
            self.num_label("pid", sample.pid),
            self.num_label("tid", sample.tid),
        ];
        let thread = (sample.pid, sample.tid);
        let strings = [
            ("comm", self.comms.get(&(sample.pid, sample.pid)).copied()),
            ("thread_comm", self.comms.get(&thread).copied()),
            ("container", self.containers.get(&thread).copied()),
        ];
        for (key, text) in strings {
            if let Some(text) = text {
                let label_entry = proto::Label {
                    key: self.string(key),
                    str: self.string(text),
                    ..Default::default()
                };
                label.push(label_entry);
            }
        }
        self.out.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }

    fn num_label(&mut self, key: &str, num: u32) -> proto::Label {
        proto::Label {
            key: self.string(key),
            num: i64::from(num),
            ..Default::default()
        }
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
    fn pseudo_location(&mut self, name: &'static str) -> u64 {
        if let Some(&id) = self.pseudo_locations.get(name) {
            return id;
        }
        let line = vec![self.line(name, None, None)];
        let id = self.push_location(0, 0, line);
        self.pseudo_locations.insert(name, id);
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
    use crate::export::test_profile::{self, APP, APP_BASE, LIBBLOB, LIBBLOB_BASE};

    fn exported() -> (Vec<u8>, proto::Profile) {
        let mut gz = Vec::new();
        write_pprof(&test_profile::profile(), &mut gz).unwrap();
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
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (text(&p, t.r#type), text(&p, t.unit)))
            .collect();
        assert_eq!(
            types,
            [
                ("cpu-clock_sample", "count"),
                ("cpu-clock_event", "nanoseconds"),
                ("page-faults_sample", "count"),
                ("page-faults_event", "count"),
            ]
        );
        assert_eq!(text(&p, p.default_sample_type), "cpu-clock_event");
        assert_eq!(total(&p, "cpu-clock_sample"), 100);
        // 1000 Hz on a clock is a fixed 1 ms period.
        assert_eq!(total(&p, "cpu-clock_event"), 100 * 1_000_000);
        assert_eq!(total(&p, "page-faults_sample"), 7);
        assert_eq!(total(&p, "page-faults_event"), 70);
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
    fn frequency_sampled_counter_has_no_estimate_column() {
        let mut profile = test_profile::profile();
        profile.events[1] = EventInfo {
            name: "cycles".into(),
            frequency: Some(4000),
            unit: "CPU-cycles".into(),
            ..EventInfo::default()
        };
        let p = pprof_profile(&profile);
        let types: Vec<&str> = p.sample_type.iter().map(|t| text(&p, t.r#type)).collect();
        assert_eq!(
            types,
            ["cpu-clock_sample", "cpu-clock_event", "cycles_sample"]
        );
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

    #[test]
    fn google_pprof_reads_the_same_totals_and_functions() {
        let (gz, _) = exported();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("profile.pb.gz");
        std::fs::write(&file, gz).unwrap();

        let cpu = top(&file, "cpu-clock_sample");
        let row = |name: &str| {
            cpu.iter()
                .find(|(n, _, _)| n == name)
                .map(|&(_, flat, cum)| (flat, cum))
                .unwrap_or_else(|| panic!("no {name} in pprof -top: {cpu:?}"))
        };
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

        let faults = top(&file, "page-faults_event");
        assert_eq!(faults.iter().map(|r| r.1).sum::<i64>(), 70);
        assert!(faults.contains(&("exc_page_fault".to_owned(), 70, 70)));

        let raw = run_pprof(&file, &["-raw"]);
        assert!(
            raw.contains("cpu-clock_sample/count cpu-clock_event/nanoseconds"),
            "{raw}"
        );
        assert!(raw.contains(&format!("{LIBBLOB} ffee0011")), "{raw}");
        assert!(raw.contains("thread_comm:[app worker]"), "{raw}");
    }
}
