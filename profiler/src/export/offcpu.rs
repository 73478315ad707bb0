//! Off-CPU time in the exports: the blocks of `record --off-cpu` as one more event, `off-cpu`,
//! whose "samples" are nanoseconds blocked, so that folded stacks, flame graphs and pprof (a
//! nanoseconds sample type) show where threads waited as they show where they ran.

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
        // Each "sample" is one nanosecond blocked.
        period: Some(1),
        frequency: None,
        unit: "nanoseconds".to_string(),
        precise: false,
    });
    let losses = &mut with.losses;
    // Per-event columns line up with the events: a missing column reads as zero.
    let total: u64 = off_cpu.blocks.iter().map(|blocks| blocks.total_ns).sum();
    losses.samples_fired.resize(event as usize, 0);
    losses.samples_fired.push(total);
    if !losses.period_sums.is_empty() {
        losses.period_sums.resize(event as usize, 0);
        losses.period_sums.push(total);
    }
    if !losses.event_counts.is_empty() {
        losses.event_counts.resize(event as usize, 0);
        losses.event_counts.push(total);
    }
    with.stacks.extend(
        off_cpu
            .blocks
            .iter()
            .filter(|b| b.total_ns > 0)
            .map(|blocks| StackSample {
                pid: blocks.pid,
                tid: blocks.tid,
                event,
                cgroup: 0,
                frames: blocks.frames.clone(),
                user_stack_lost: blocks.user_stack_lost,
                kernel_stack_lost: blocks.kernel_stack_lost,
                count: blocks.total_ns,
                per_cpu: Vec::new(),
            }),
    );
}
