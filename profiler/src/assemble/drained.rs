//! Assembling a [`Profile`] from a live capture: drained aggregates, the process table and the
//! kernel's sample accounting.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use profiler_common::{capture::LossKind, hw::data_src::DataSource, stack::LOST_STACK};

use super::{
    offcpu::{assemble_offcpu, below_scheduler, waker_frames},
    sparse_buckets,
};
use crate::{
    capture::sideband::ProcessTable,
    drain::{Accounting, Drained},
    hardware::HardwareKey,
    profile::{
        DataAccess, DataLineSample, EventInfo, FrameId, HardwareProfile, InstructionSample,
        LatencyHistogram, LineLatencyHistogram, Losses, Profile, ProfileMeta, StackSample, Stats,
        ThreadInfo,
    },
    scope::{
        cgroup::{cgroup2_mount, cgroup_id, cgroup_subtree},
        container::classify_cgroup_path,
    },
    symbolize::{lookup_addresses, CodeAddress, FrameTable},
};

/// The container or systemd unit of every cgroup id on this machine (the ids samples carry),
/// by walking the cgroup v2 tree. The root cgroup is no workload.
/// Perf's name for the idle task (pid 0), which has no name of its own in the side-band.
const IDLE_TASK: &str = "swapper";

fn thread_name(processes: &ProcessTable, pid: u32, tid: u32) -> String {
    if pid == 0 {
        IDLE_TASK.to_string()
    } else {
        processes.thread_name(pid, tid)
    }
}

fn cgroup_workloads() -> HashMap<u64, String> {
    let Ok(mount) = cgroup2_mount() else {
        return HashMap::new();
    };
    cgroup_subtree(&mount)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|dir| {
            let relative = dir.strip_prefix(&mount).ok()?.to_str()?.to_string();
            if relative.is_empty() {
                return None;
            }
            let id = cgroup_id(&dir).ok()?;
            Some((
                id,
                classify_cgroup_path(&format!("/{relative}")).to_string(),
            ))
        })
        .collect()
}

/// The profile of what a capture drained, its frames resolved by `table` (through the table's
/// processes and symbol cache, and from the frames it knows already).
pub fn assemble(
    meta: ProfileMeta,
    events: Vec<EventInfo>,
    drained: Drained,
    accounting: &Accounting,
    mut table: FrameTable<'_>,
) -> Profile {
    let processes = table.processes();
    let mut addresses = Vec::new();
    let cache = &drained.stack_cache;
    // Each distinct stack once: a kernel stack is the same code in every process, a user stack
    // the same code within one.
    let kernel_stacks: BTreeSet<u64> = drained.kernel_stacks().collect();
    let user_stacks: BTreeSet<(u32, u64)> = drained.user_stacks().collect();
    for hash in &kernel_stacks {
        addresses.extend(lookup_addresses(0, cache.frames(*hash)));
    }
    for (pid, hash) in &user_stacks {
        addresses.extend(lookup_addresses(*pid, cache.frames(*hash)));
    }
    let code = CodeAddress::sampled;
    addresses.extend(drained.instructions.keys().map(|k| code(k.pid, k.ip)));
    addresses.extend(drained.data_lines.keys().map(|k| code(k.pid, k.ip)));
    addresses.extend(drained.latencies.keys().map(|k| code(k.pid, k.ip)));
    // Kernel-counted data sources join the streamed IBS samples, keyed alike.
    let mut hardware = drained.hardware;
    for (key, count) in &drained.data_sources {
        let at = HardwareKey {
            pid: key.pid,
            event: key.event,
            ip: key.ip,
            line: (key.line != 0).then_some(key.line),
        };
        // Normalized as the streamed samples' are, so equal sources share one entry.
        let source = DataSource::decode(key.data_src).encode();
        hardware.add_data_source(at, source, *count);
    }
    let ibs_caps = hardware.ibs_caps();
    addresses.extend(hardware.code_addresses());
    table.resolve(addresses);

    // Symbolized once per distinct stack, however many threads and events share it.
    let kernel_frames: HashMap<u64, Vec<FrameId>> = kernel_stacks
        .into_iter()
        .map(|hash| {
            let frames = lookup_addresses(0, cache.frames(hash));
            (hash, frames.map(|address| table.frame(address)).collect())
        })
        .collect();
    let user_frames: HashMap<(u32, u64), Vec<FrameId>> = user_stacks
        .into_iter()
        .map(|(pid, hash)| {
            let frames = lookup_addresses(pid, cache.frames(hash));
            (
                (pid, hash),
                frames.map(|address| table.frame(address)).collect(),
            )
        })
        .collect();
    let mut stacks: Vec<StackSample> = drained
        .stacks
        .iter()
        .map(|(stack, per_cpu)| StackSample {
            pid: stack.pid,
            tid: stack.tid,
            event: stack.event,
            cgroup: stack.cgroup,
            frames: [
                kernel_frames[&stack.kernel].as_slice(),
                user_frames[&(stack.pid, stack.user)].as_slice(),
            ]
            .concat(),
            user_stack_lost: stack.user == LOST_STACK,
            kernel_stack_lost: stack.kernel == LOST_STACK,
            count: per_cpu.iter().sum(),
            per_cpu: per_cpu.clone(),
        })
        .collect();
    stacks.sort_by(|a, b| b.count.cmp(&a.count).then(a.frames.cmp(&b.frames)));
    let off_cpu = drained.offcpu.attachment.map(|attachment| {
        assemble_offcpu(
            &drained.offcpu,
            attachment,
            drained.offcpu.min_block_ns,
            |key| {
                [
                    below_scheduler(&kernel_frames[&key.kernel_stack], &table.known.frames),
                    user_frames[&(key.pid, key.user_stack)].as_slice(),
                ]
                .concat()
            },
            |key| {
                waker_frames(
                    &kernel_frames[&key.waker.kernel_stack],
                    &user_frames[&(key.waker.pid, key.waker.user_stack)],
                    &table.known.frames,
                    key.waker.pid == 0,
                )
            },
        )
    });

    let instructions = drained
        .instructions
        .iter()
        .map(|(key, s)| InstructionSample {
            pid: key.pid,
            event: key.event,
            frame: table.frame(code(key.pid, key.ip)),
            stats: Stats::from(s),
        })
        .collect();
    let data_lines = drained
        .data_lines
        .iter()
        .map(|(key, (s, per_cpu))| DataLineSample {
            pid: key.pid,
            event: key.event,
            line: key.line,
            frame: table.frame(code(key.pid, key.ip)),
            stats: Stats::from(s),
            per_cpu: per_cpu.clone(),
            tid: Some(key.tid),
            access: DataAccess::from_code(key.access),
        })
        .collect();
    let hardware_samples = hardware.finish(|address| table.frame(address));
    let latency = drained
        .latencies
        .iter()
        .map(|(key, buckets)| LatencyHistogram {
            pid: key.pid,
            event: key.event,
            frame: table.frame(code(key.pid, key.ip)),
            buckets: sparse_buckets(buckets),
        })
        .collect();
    let mut line_latency: Vec<LineLatencyHistogram> = drained
        .line_latencies
        .iter()
        .map(|(key, buckets)| LineLatencyHistogram {
            pid: key.pid,
            event: key.event,
            line: key.line,
            buckets: sparse_buckets(buckets),
        })
        .collect();
    line_latency.sort_by_key(|h| (h.event, h.pid, h.line));

    let mut threads: BTreeSet<(u32, u32, u64)> = drained
        .stacks
        .keys()
        .map(|s| (s.pid, s.tid, s.cgroup))
        .chain(
            drained
                .offcpu
                .blocks
                .keys()
                .map(|k| (k.pid, k.tid, k.cgroup)),
        )
        .collect();
    // Wakers are named too: outside the scope they have no key of their own (nor a cgroup).
    let known: BTreeSet<(u32, u32)> = threads.iter().map(|&(pid, tid, _)| (pid, tid)).collect();
    let wakers: BTreeSet<(u32, u32)> = drained
        .offcpu
        .blocks
        .keys()
        .map(|k| (k.waker.pid, k.waker.tid))
        .filter(|waker| waker.0 != 0 && !known.contains(waker))
        .collect();
    threads.extend(wakers.into_iter().map(|(pid, tid)| (pid, tid, 0)));
    // A process is named after its main thread, which may have taken no sample of its own.
    let sampled_mains: BTreeSet<u32> = threads
        .iter()
        .filter(|(pid, tid, _)| pid == tid)
        .map(|(pid, _, _)| *pid)
        .collect();
    let unsampled_mains: BTreeMap<u32, u64> = threads
        .iter()
        .filter(|(pid, _, _)| *pid != 0 && !sampled_mains.contains(pid))
        .map(|&(pid, _, cgroup)| (pid, cgroup))
        .collect();
    threads.extend(
        unsampled_mains
            .into_iter()
            .map(|(pid, cgroup)| (pid, pid, cgroup)),
    );
    let workloads = cgroup_workloads();
    let threads = threads
        .into_iter()
        .map(|(pid, tid, cgroup)| ThreadInfo {
            pid,
            tid,
            comm: thread_name(processes, pid, tid),
            container: workloads.get(&cgroup).cloned(),
        })
        .collect();

    let mut losses = Losses {
        samples_fired: accounting.samples_fired.clone(),
        period_sums: accounting.period_sums.clone(),
        event_counts: accounting.event_counts.clone(),
        ..Losses::default()
    };
    for kind in LossKind::ALL {
        losses.counters.insert(
            kind.describe().to_string(),
            accounting.losses[kind as usize],
        );
    }
    losses.counters.insert(
        "side-band records lost (mappings, names)".to_string(),
        processes.lost_records,
    );

    Profile {
        meta,
        events,
        threads,
        frames: table.known.frames,
        stacks,
        instructions,
        data_lines,
        latency,
        losses,
        // Filled after assembly from the module files and the side-band process table
        // (`aggregate::code::capture_code`, `aggregate::dataspace::capture_data_objects`).
        code: Vec::new(),
        memory_maps: Vec::new(),
        data_symbols: Vec::new(),
        hardware: HardwareProfile {
            ibs_caps,
            samples: hardware_samples,
            ..HardwareProfile::default()
        },
        line_latency,
        function_aliases: table.known.aliases,
        off_cpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_task_is_named_as_perf_names_it() {
        let processes = ProcessTable::default();
        assert_eq!(thread_name(&processes, 0, 0), "swapper");
        assert_eq!(thread_name(&processes, 7, 7), "");
    }
}
