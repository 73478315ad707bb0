//! Off-CPU time in the exports: the blocks of `record --off-cpu` as one more event, `off-cpu`,
//! whose samples are the blocks, each stack weighing the nanoseconds they blocked, so that
//! folded stacks and flame graphs (by nanoseconds) and pprof (blocks in `off-cpu_sample`,
//! nanoseconds in `off-cpu_event`) show where threads waited as they show where they ran.

use std::borrow::Cow;

use crate::profile::{EventInfo, Profile, StackSample};

/// The name of the off-CPU event in exports (`--only-event off-cpu`).
pub const OFF_CPU_EVENT: &str = "off-cpu";

/// `profile` with its off-CPU blocks as the last event; itself when it has none.
pub fn with_off_cpu_event(profile: &Profile) -> Cow<'_, Profile> {
    if profile.off_cpu.is_none() {
        return Cow::Borrowed(profile);
    }
    let mut with = profile.clone();
    add_off_cpu_event(&mut with);
    Cow::Owned(with)
}

/// Adds the off-CPU blocks of `with`, if it has any, as its last event.
pub fn add_off_cpu_event(with: &mut Profile) {
    let Some(off_cpu) = &with.off_cpu else {
        return;
    };
    let event = with.events.len() as u32;
    with.events.push(EventInfo {
        name: OFF_CPU_EVENT.to_string(),
        // Blocks are not sampled at a rate: each stack carries its own nanoseconds.
        period: None,
        frequency: None,
        unit: "nanoseconds".to_string(),
        precise: false,
    });
    let blocks: u64 = off_cpu.blocks.iter().map(|blocks| blocks.count).sum();
    let blocked_ns: u64 = off_cpu.blocks.iter().map(|blocks| blocks.total_ns).sum();
    // Per-event columns line up with the events: a missing column reads as zero, which no
    // estimate takes.
    let losses = &mut with.losses;
    for (column, value) in [
        (&mut losses.samples_fired, blocks),
        (&mut losses.event_counts, blocked_ns),
        (&mut losses.period_sums, blocked_ns),
    ] {
        column.resize(event as usize, 0);
        column.push(value);
    }
    with.stacks.extend(
        off_cpu
            .blocks
            .iter()
            .filter(|b| b.count > 0)
            .map(|blocks| StackSample {
                pid: blocks.pid,
                tid: blocks.tid,
                event,
                cgroup: 0,
                frames: blocks.frames.clone(),
                user_stack_lost: blocks.user_stack_lost,
                kernel_stack_lost: blocks.kernel_stack_lost,
                count: blocks.count,
                per_cpu: Vec::new(),
                weight: Some(blocks.total_ns),
            }),
    );
}
