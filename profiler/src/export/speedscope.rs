//! speedscope's own file format (`https://www.speedscope.app/file-format-schema.json`): one
//! sampled profile per event, its stacks root first as indices into one shared frame list, each
//! with its weight (samples, or nanoseconds blocked for `off-cpu`). speedscope imports folded
//! stacks and pprof too, but its pprof import drops inlined functions; here each inlined
//! function is a frame of its own under the function it was inlined into, as in the report.
//!
//! Frames are [`FrameTable`]'s: speedscope's sandwich view (one row per frame) gives a function
//! the share the report gives it.

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use super::{
    frame_table::{FrameTable, NamedFrame},
    samples_of, ExportError, StackRoots,
};
use crate::profile::{EventIndex, Profile};

const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
    name: &'a str,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<NamedFrame<'a>>,
}

#[derive(Serialize)]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// speedscope's unit for an event's weights: samples have none; stacks weighed by their own
/// measure (off-CPU blocks) are in the event's unit.
fn unit_of(event_unit: &str, weighed: bool) -> &'static str {
    match (weighed, event_unit) {
        (true, "nanoseconds") => "nanoseconds",
        _ => "none",
    }
}

/// Writes every event of `profile` as a speedscope file, the first event shown on opening.
pub fn write_speedscope(profile: &Profile, out: &mut impl Write) -> Result<(), ExportError> {
    if profile.events.is_empty() {
        return Err(ExportError::UnknownEvent {
            event: 0,
            events: 0,
        });
    }
    let roots = StackRoots::new(profile);
    let mut frames = FrameTable::default();
    let mut profiles = Vec::with_capacity(profile.events.len());
    for (event, info) in profile.events.iter().enumerate() {
        // Equal stacks merged, in a stable order.
        let mut merged: BTreeMap<Vec<usize>, u64> = BTreeMap::new();
        let mut weighed = false;
        for sample in samples_of(profile, event as EventIndex) {
            weighed |= sample.weight.is_some();
            let stack = frames.stack(profile, &roots, sample);
            *merged.entry(stack).or_default() += sample.measure();
        }
        let total = merged.values().sum();
        let (samples, weights) = merged.into_iter().unzip();
        profiles.push(SampledProfile {
            kind: "sampled",
            name: info.name.clone(),
            unit: unit_of(&info.unit, weighed),
            start_value: 0,
            end_value: total,
            samples,
            weights,
        });
    }
    let file = File {
        schema: SCHEMA,
        shared: Shared {
            frames: frames.list,
        },
        profiles,
        name: &profile.meta.target,
        active_profile_index: 0,
        exporter: format!("profiler {}", env!("CARGO_PKG_VERSION")),
    };
    serde_json::to_writer(&mut *out, &file).map_err(std::io::Error::from)?;
    Ok(out.write_all(b"\n")?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;

    fn exported(profile: &Profile) -> serde_json::Value {
        let mut out = Vec::new();
        write_speedscope(profile, &mut out).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    /// Each profile's stacks as `root;...;leaf weight`, in the file's order.
    fn stacks(file: &serde_json::Value, profile: usize) -> Vec<String> {
        let frames = file["shared"]["frames"].as_array().unwrap();
        let profile = &file["profiles"][profile];
        let samples = profile["samples"].as_array().unwrap();
        let weights = profile["weights"].as_array().unwrap();
        assert_eq!(samples.len(), weights.len());
        samples
            .iter()
            .zip(weights)
            .map(|(stack, weight)| {
                let names: Vec<&str> = stack
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| {
                        frames[i.as_u64().unwrap() as usize]["name"]
                            .as_str()
                            .unwrap()
                    })
                    .collect();
                format!("{} {weight}", names.join(";"))
            })
            .collect()
    }

    #[test]
    fn every_event_is_a_sampled_profile_of_root_first_stacks_with_inlined_frames() {
        let file = exported(&test_profile::profile());
        assert_eq!(file["$schema"], SCHEMA);
        assert_eq!(file["activeProfileIndex"], 0);
        assert_eq!(file["profiles"].as_array().unwrap().len(), 2);
        assert_eq!(file["profiles"][0]["type"], "sampled");
        assert_eq!(file["profiles"][0]["unit"], "none");
        let mut cpu = stacks(&file, 0);
        cpu.sort();
        // The folded stacks' content (see `folded`), without their annotations.
        assert_eq!(
            cpu,
            [
                "app worker;<[u8; 4] as app::Worker>::run;libblob.so+0x4a10 10",
                "app;[user stack lost];do_syscall_64 5",
                "app;main;run;compute;vec_sum;add_lanes 60",
                "app;main;run;do_syscall_64 25",
            ]
        );
        assert_eq!(file["profiles"][0]["endValue"], 100);
        assert_eq!(stacks(&file, 1).len(), 2);
        // A function is one frame wherever it is sampled.
        let frames = file["shared"]["frames"].as_array().unwrap();
        let mains = frames.iter().filter(|f| f["name"] == "main").count();
        assert_eq!(mains, 1);
    }

    #[test]
    fn off_cpu_weights_are_nanoseconds() {
        let profile = test_profile::profile_with_off_cpu();
        let with = crate::export::offcpu::with_off_cpu_event(&profile);
        let file = exported(&with);
        let last = file["profiles"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["name"], crate::export::offcpu::OFF_CPU_EVENT);
        assert_eq!(last["unit"], "nanoseconds");
        let blocked: u64 = profile
            .off_cpu
            .as_ref()
            .unwrap()
            .blocks
            .iter()
            .map(|b| b.total_ns)
            .sum();
        assert_eq!(last["endValue"], blocked);
    }
}
