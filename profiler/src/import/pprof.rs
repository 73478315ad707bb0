//! pprof profiles (`report -i window.pb.gz`): the agent's windows (`--output-dir`), a `--pprof`
//! export, or any other tool's gzipped `perftools.profiles.Profile`, read into a [`Profile`] so
//! that every report, view and export (the HTML report among them) works on them.
//!
//! Events are the value columns as `export::pprof` names them: `<event>_sample` holds the
//! samples (and `<event>_event` what they stand for, which the counted total is read from), the
//! event named as our comments name it (the column has `_` for its `-`).
//! Data-address columns (`_data_sample`, `_data_event`, `_latency`) are left out: their samples
//! are cache lines, not call stacks. A file without `_sample` columns (Go's, for one) has an
//! event per column. Off-CPU samples keep their nanoseconds as their weight. Each location is a
//! frame: its lines are the functions at its address, innermost first, the function they were
//! inlined into last. Our comments give back the target and the samples fired per event.
//!
//! The file is untrusted: its decompressed size is bounded, and every index in it is checked.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};
use flate2::read::GzDecoder;
use prost::Message;

use crate::{
    export::{
        offcpu::OFF_CPU_EVENT,
        pprof::{column_prefix, proto},
    },
    profile::{EventInfo, Frame, FrameId, InlinedFrame, Profile, StackSample, ThreadInfo},
};

/// Largest decompressed profile read: a window of a busy host is a few MB; a file that inflates
/// beyond this is refused rather than exhausting memory.
const MAX_DECOMPRESSED: u64 = 1 << 30;

/// Where kernel addresses start on the 64-bit architectures (the upper half).
const KERNEL_START: u64 = 1 << 63;

/// Whether `bytes` start as a gzip stream: how pprof files are written.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b])
}

/// Reads the gzipped pprof profile at `path`.
pub fn profile_from_pprof_file(path: &Path) -> Result<Profile> {
    let bytes = crate::input::read_input(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    profile_from_pprof(&bytes)
        .with_context(|| format!("importing the pprof profile {}", path.display()))
}

/// A profile of the gzipped pprof `bytes`.
pub fn profile_from_pprof(bytes: &[u8]) -> Result<Profile> {
    let mut decoded = Vec::new();
    GzDecoder::new(bytes)
        .take(MAX_DECOMPRESSED + 1)
        .read_to_end(&mut decoded)
        .context("not a gzip stream")?;
    if decoded.len() as u64 > MAX_DECOMPRESSED {
        bail!(
            "it inflates beyond {} MiB: not a profile",
            MAX_DECOMPRESSED >> 20
        );
    }
    let pprof = proto::Profile::decode(decoded.as_slice()).context("not a pprof profile")?;
    Importer::new(&pprof)?.profile()
}

/// One event: the column of its samples, and the column of what they stand for.
struct EventColumns {
    samples: usize,
    events: Option<usize>,
}

struct Importer<'p> {
    pprof: &'p proto::Profile,
    profile: Profile,
    columns: Vec<EventColumns>,
    /// Frame of each location id (`None`: a pseudo-function for a lost stack part).
    frames: HashMap<u64, Vec<Located>>,
}

/// What a location stands for.
#[derive(Clone, Copy)]
enum Located {
    Frame(FrameId),
    UserStackLost,
    KernelStackLost,
}

impl<'p> Importer<'p> {
    fn new(pprof: &'p proto::Profile) -> Result<Importer<'p>> {
        let mut importer = Importer {
            pprof,
            profile: Profile::default(),
            columns: Vec::new(),
            frames: HashMap::new(),
        };
        importer.events()?;
        importer.locations()?;
        Ok(importer)
    }

    fn text(&self, index: i64) -> Result<&'p str> {
        usize::try_from(index)
            .ok()
            .and_then(|at| self.pprof.string_table.get(at))
            .map(String::as_str)
            .with_context(|| format!("string index {index} is outside the string table"))
    }

    fn events(&mut self) -> Result<()> {
        let types: Vec<(&str, &str)> = (self.pprof.sample_type.iter())
            .map(|t| Ok((self.text(t.r#type)?, self.text(t.unit)?)))
            .collect::<Result<_>>()?;
        let ours = types.iter().any(|(name, _)| name.ends_with("_sample"));
        // Column names hold the event's name with `_` for its `-`, `:` and `/`; our comments
        // name every event as it was (`samples fired: cpu-clock: N`).
        let mut named: HashMap<String, &str> = HashMap::new();
        for &comment in &self.pprof.comment {
            let text = self.text(comment)?;
            if let Some((event, _)) =
                (text.strip_prefix("samples fired: ")).and_then(|rest| rest.rsplit_once(": "))
            {
                named.insert(column_prefix(event), event);
            }
        }
        for (column, (name, unit)) in types.iter().enumerate() {
            let event = match ours {
                true => match name.strip_suffix("_sample") {
                    Some(event) if !event.ends_with("_data") => event,
                    _ => continue,
                },
                false => name,
            };
            let events = ours
                .then(|| {
                    types
                        .iter()
                        .position(|(other, _)| *other == format!("{event}_event"))
                })
                .flatten();
            let unit = events.map_or(*unit, |column| types[column].1);
            self.profile.events.push(EventInfo {
                name: named.get(event).copied().unwrap_or(event).to_string(),
                unit: unit.to_string(),
                ..EventInfo::default()
            });
            self.columns.push(EventColumns {
                samples: column,
                events,
            });
        }
        if self.columns.is_empty() {
            bail!("it has no value column of samples");
        }
        Ok(())
    }

    fn locations(&mut self) -> Result<()> {
        let pprof = self.pprof;
        let mappings: HashMap<u64, &proto::Mapping> =
            pprof.mapping.iter().map(|m| (m.id, m)).collect();
        let functions: HashMap<u64, &proto::Function> =
            pprof.function.iter().map(|f| (f.id, f)).collect();
        let mut interned: HashMap<Frame, FrameId> = HashMap::new();
        for location in &pprof.location {
            let mapping = match location.mapping_id {
                0 => None,
                id => Some(*mappings.get(&id).with_context(|| {
                    format!(
                        "location {} names mapping {id}, which it has not",
                        location.id
                    )
                })?),
            };
            // Innermost first; the function they were inlined into last.
            let mut lines = Vec::with_capacity(location.line.len());
            for line in &location.line {
                let function = functions.get(&line.function_id).with_context(|| {
                    format!(
                        "location {} names function {}, which it has not",
                        location.id, line.function_id
                    )
                })?;
                let name = self.text(function.name)?;
                let file = Some(self.text(function.filename)?).filter(|f| !f.is_empty());
                let line = u32::try_from(line.line).ok().filter(|&l| l > 0);
                lines.push((name, file, line));
            }
            let pseudo = match (mapping, lines.as_slice()) {
                (None, [(name, None, None)]) if *name == "[user stack lost]" => {
                    Some(Located::UserStackLost)
                }
                (None, [(name, None, None)]) if *name == "[kernel stack lost]" => {
                    Some(Located::KernelStackLost)
                }
                _ => None,
            };
            let located = match pseudo {
                Some(pseudo) => vec![pseudo],
                None => {
                    let frame = self.frame(location, mapping, &lines)?;
                    let next = self.profile.frames.len() as FrameId;
                    let id = *interned.entry(frame.clone()).or_insert(next);
                    if id == next {
                        self.profile.frames.push(frame);
                    }
                    vec![Located::Frame(id)]
                }
            };
            self.frames.insert(location.id, located);
        }
        Ok(())
    }

    fn frame(
        &self,
        location: &proto::Location,
        mapping: Option<&proto::Mapping>,
        lines: &[(&str, Option<&str>, Option<u32>)],
    ) -> Result<Frame> {
        let module = match mapping {
            Some(mapping) => self.text(mapping.filename)?.to_string(),
            None => String::new(),
        };
        let build_id = match mapping {
            Some(mapping) => {
                Some(self.text(mapping.build_id)?.to_string()).filter(|b| !b.is_empty())
            }
            None => None,
        };
        let module_offset = mapping.map_or(location.address, |mapping| {
            (location.address.wrapping_sub(mapping.memory_start)).wrapping_add(mapping.file_offset)
        });
        let outer = lines.last();
        Ok(Frame {
            address: location.address,
            kernel: location.address >= KERNEL_START || module.starts_with("[kernel"),
            module,
            module_offset,
            build_id,
            function: outer.map(|(name, _, _)| name.to_string()),
            function_address: None,
            file: outer.and_then(|(_, file, _)| file.map(str::to_string)),
            line: outer.and_then(|(_, _, line)| *line),
            // Outermost first, as symbolization makes them.
            inlined: lines[..lines.len().saturating_sub(1)]
                .iter()
                .rev()
                .map(|(name, file, line)| InlinedFrame {
                    function: name.to_string(),
                    file: file.map(str::to_string),
                    line: *line,
                })
                .collect(),
        })
    }

    fn profile(mut self) -> Result<Profile> {
        let pprof = self.pprof;
        let mut threads: HashMap<(u32, u32), ThreadInfo> = HashMap::new();
        let mut fired = vec![0u64; self.columns.len()];
        let mut counted = vec![0u64; self.columns.len()];
        for sample in &pprof.sample {
            let mut frames = Vec::with_capacity(sample.location_id.len());
            let (mut user_stack_lost, mut kernel_stack_lost) = (false, false);
            for id in &sample.location_id {
                let located = self
                    .frames
                    .get(id)
                    .with_context(|| format!("a sample names location {id}, which it has not"))?;
                for located in located {
                    match located {
                        Located::Frame(frame) => frames.push(*frame),
                        Located::UserStackLost => user_stack_lost = true,
                        Located::KernelStackLost => kernel_stack_lost = true,
                    }
                }
            }
            let (mut pid, mut tid) = (0u32, None);
            let (mut comm, mut thread_comm, mut container) = (None, None, None);
            for label in &sample.label {
                match self.text(label.key)? {
                    "pid" => pid = u32::try_from(label.num).unwrap_or(0),
                    "tid" => tid = u32::try_from(label.num).ok(),
                    "comm" => comm = Some(self.text(label.str)?),
                    "thread_comm" => thread_comm = Some(self.text(label.str)?),
                    "container" => container = Some(self.text(label.str)?),
                    _ => {}
                }
            }
            let tid = tid.unwrap_or(pid);
            if let Some(name) = thread_comm.or(comm) {
                threads.entry((pid, tid)).or_insert_with(|| ThreadInfo {
                    pid,
                    tid,
                    comm: name.to_string(),
                    container: container.map(str::to_string),
                });
            }
            if let Some(name) = comm {
                threads.entry((pid, pid)).or_insert_with(|| ThreadInfo {
                    pid,
                    tid: pid,
                    comm: name.to_string(),
                    container: container.map(str::to_string),
                });
            }
            for (event, columns) in self.columns.iter().enumerate() {
                let value = |column: usize| -> u64 {
                    sample
                        .value
                        .get(column)
                        .map_or(0, |&v| u64::try_from(v).unwrap_or(0))
                };
                let count = value(columns.samples);
                if count == 0 {
                    continue;
                }
                let measured = columns.events.map(value);
                fired[event] += count;
                counted[event] += measured.unwrap_or(0);
                let off_cpu = self.profile.events[event].name == OFF_CPU_EVENT;
                self.profile.stacks.push(StackSample {
                    pid,
                    tid,
                    event: event as u32,
                    frames: frames.clone(),
                    user_stack_lost,
                    kernel_stack_lost,
                    count,
                    weight: measured.filter(|_| off_cpu),
                    ..StackSample::default()
                });
            }
        }
        self.profile.threads = threads.into_values().collect();
        self.profile.threads.sort_by_key(|t| (t.pid, t.tid));
        self.meta(&fired, &counted)?;
        Ok(self.profile)
    }

    /// The target, and per event the samples fired and the events counted, from our comments
    /// where the file has them, else from its samples.
    fn meta(&mut self, fired: &[u64], counted: &[u64]) -> Result<()> {
        let pprof = self.pprof;
        let meta = &mut self.profile.meta;
        meta.start_unix_ns = u64::try_from(pprof.time_nanos).unwrap_or(0);
        meta.duration_ns = u64::try_from(pprof.duration_nanos).unwrap_or(0);
        meta.target = "a pprof profile".to_string();
        self.profile.losses.samples_fired = fired.to_vec();
        // Estimates are scaled from what was counted where the file says it (`_event` columns).
        self.profile.losses.event_counts = counted.to_vec();
        for &comment in &pprof.comment {
            let text = self.text(comment)?;
            // `profiler VERSION on HOST (kernel RELEASE): TARGET`, as `export::pprof` writes it.
            let about = text.strip_prefix("profiler ").and_then(|rest| {
                let (version, rest) = rest.split_once(" on ")?;
                let (host, rest) = rest.split_once(" (kernel ")?;
                let (kernel, target) = rest.split_once("): ")?;
                Some((version, host, kernel, target))
            });
            if let Some((version, host, kernel, target)) = about {
                let meta = &mut self.profile.meta;
                meta.profiler_version = version.to_string();
                meta.hostname = host.to_string();
                meta.kernel_release = kernel.to_string();
                meta.target = target.to_string();
            }
            for (prefix, column) in [
                ("samples fired: ", &mut self.profile.losses.samples_fired),
                ("events counted: ", &mut self.profile.losses.event_counts),
            ] {
                let Some((event, number)) = text
                    .strip_prefix(prefix)
                    .and_then(|rest| rest.rsplit_once(": "))
                else {
                    continue;
                };
                let at = self.profile.events.iter().position(|e| e.name == event);
                if let (Some(at), Ok(number)) = (at, number.parse::<u64>()) {
                    column[at] = number;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{folded::folded_stacks, offcpu::with_off_cpu_event, pprof::write_pprof};
    use crate::profile::test_profile;

    fn round_trip(profile: &Profile) -> Profile {
        let mut bytes = Vec::new();
        write_pprof(profile, &mut bytes).unwrap();
        assert!(is_gzip(&bytes));
        profile_from_pprof(&bytes).unwrap()
    }

    #[test]
    fn a_pprof_export_reads_back_to_the_same_folded_stacks_and_counts() {
        let profile = with_off_cpu_event(&test_profile::profile_with_off_cpu()).into_owned();
        let read = round_trip(&profile);
        let names: Vec<&str> = read.events.iter().map(|e| e.name.as_str()).collect();
        let written: Vec<&str> = profile.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, written);
        for event in 0..profile.events.len() as u32 {
            let mut before = folded_stacks(&profile, event).unwrap();
            let mut after = folded_stacks(&read, event).unwrap();
            before.sort();
            after.sort();
            assert_eq!(after, before, "event {event}");
        }
        assert_eq!(read.losses.samples_fired, profile.losses.samples_fired);
        assert_eq!(read.meta.target, profile.meta.target);
        assert_eq!(read.meta.hostname, profile.meta.hostname);
        assert_eq!(read.meta.kernel_release, profile.meta.kernel_release);
        // Inlined functions come back under the function they were inlined into.
        let compute = (read.frames.iter())
            .find(|f| f.function.as_deref() == Some("compute"))
            .unwrap();
        let inlined: Vec<&str> = compute
            .inlined
            .iter()
            .map(|i| i.function.as_str())
            .collect();
        assert_eq!(inlined, ["vec_sum", "add_lanes"]);
    }

    #[test]
    fn hostile_files_are_refused_with_what_is_wrong() {
        let refused = |bytes: &[u8]| format!("{:#}", profile_from_pprof(bytes).unwrap_err());
        assert!(refused(b"not gzip").contains("not a gzip stream"));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &[0xff; 64]).unwrap();
        assert!(refused(&gz.finish().unwrap()).contains("not a pprof profile"));
        // A sample that names a location the file does not have.
        let mut bytes = Vec::new();
        write_pprof(&test_profile::profile(), &mut bytes).unwrap();
        let mut decoded = Vec::new();
        GzDecoder::new(bytes.as_slice())
            .read_to_end(&mut decoded)
            .unwrap();
        let mut pprof = proto::Profile::decode(decoded.as_slice()).unwrap();
        pprof.sample[0].location_id.push(999_999);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &pprof.encode_to_vec()).unwrap();
        assert!(refused(&gz.finish().unwrap()).contains("location 999999"));
        // A string index past the table.
        pprof.sample[0].location_id.pop();
        pprof.sample_type[0].r#type = 1 << 40;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &pprof.encode_to_vec()).unwrap();
        assert!(refused(&gz.finish().unwrap()).contains("outside the string table"));
    }
}
