//! A [`Profile`] from a live capture: drained aggregates, the process table and the kernel's
//! sample accounting, fed to the [`ProfileBuilder`].

use std::collections::{BTreeSet, HashMap};

use profiler_common::{capture::LossKind, hw::data_src::DataSource, stack::LOST_STACK};

use super::{sparse_buckets, BlockStacks, Origin, ProfileBuilder, StackSampleKey};
use crate::{
    drain::{hardware::HardwareKey, Accounting, Drained},
    process::ProcessTable,
    profile::{EventInfo, Losses, Profile, ProfileMeta},
    scope::kubernetes::KubernetesNames,
    symbolize::FrameTable,
};

/// The profile of what a capture drained, its frames resolved by `table` (through the table's
/// processes and symbol cache, and from the frames it knows already), its containers in
/// Kubernetes pods named by `kubernetes`.
pub fn assemble(
    meta: ProfileMeta,
    events: Vec<EventInfo>,
    drained: Drained,
    accounting: &Accounting,
    table: FrameTable<'_>,
    kubernetes: &mut KubernetesNames,
) -> Profile {
    let losses = losses(accounting, table.processes());
    // Each distinct stack once: a kernel stack is the same code in every process, a user stack
    // the same code within one.
    let kernel_stacks: BTreeSet<u64> = drained.kernel_stacks().collect();
    let user_stacks: BTreeSet<(u32, u64)> = drained.user_stacks().collect();
    let Drained {
        stacks,
        stack_cache,
        losses: _,
        instructions,
        data_lines,
        latencies,
        line_latencies,
        data_sources,
        mut hardware,
        offcpu,
    } = drained;
    let mut builder = ProfileBuilder::new(table, Origin::Capture);
    builder.name_pods(kubernetes);
    let kernel: HashMap<u64, _> = kernel_stacks
        .into_iter()
        .map(|hash| (hash, builder.stack(0, stack_cache.frames(hash))))
        .collect();
    let user: HashMap<(u32, u64), _> = user_stacks
        .into_iter()
        .map(|(pid, hash)| ((pid, hash), builder.stack(pid, stack_cache.frames(hash))))
        .collect();
    for (stack, per_cpu) in stacks {
        let key = StackSampleKey {
            pid: stack.pid,
            tid: stack.tid,
            event: stack.event,
            cgroup: stack.cgroup,
            kernel: kernel[&stack.kernel],
            user: user[&(stack.pid, stack.user)],
            kernel_stack_lost: stack.kernel == LOST_STACK,
            user_stack_lost: stack.user == LOST_STACK,
        };
        builder.add_stack(key, per_cpu.iter().sum(), per_cpu);
    }
    for (key, stats) in instructions {
        builder.add_instruction(key, stats);
    }
    for (key, (stats, per_cpu)) in data_lines {
        builder.add_data_line(key, stats, per_cpu);
    }
    for (key, buckets) in latencies {
        builder.add_latency(key, sparse_buckets(&buckets));
    }
    // Sorted: the drained map has no order of its own.
    let mut line_latencies: Vec<_> = line_latencies.into_iter().collect();
    line_latencies.sort_by_key(|(key, _)| (key.event, key.pid, key.line));
    for (key, buckets) in line_latencies {
        builder.add_line_latency(key, sparse_buckets(&buckets));
    }
    // Kernel-counted data sources join the streamed IBS samples, keyed alike.
    for (key, count) in &data_sources {
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
    builder.set_hardware(hardware);
    builder.add_off_cpu(offcpu, |key| BlockStacks {
        kernel: kernel[&key.kernel_stack],
        user: user[&(key.pid, key.user_stack)],
        waker_kernel: kernel[&key.waker.kernel_stack],
        waker_user: user[&(key.waker.pid, key.waker.user_stack)],
    });
    builder.build(meta, events, losses)
}

/// The kernel's and the agent's sample accounting, and the side-band's losses.
fn losses(accounting: &Accounting, processes: &ProcessTable) -> Losses {
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
    losses
}
