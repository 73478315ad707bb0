//! `record --off-cpu`: loading and attaching the scheduler-switch programs, putting the
//! processes in scope into their scope map, and the maps the drain reads.
//!
//! The BTF-enabled `tp_btf/sched_switch` is cheapest (no tracepoint record is built) and is used
//! where the kernel has BTF; elsewhere the classic `sched:sched_switch` tracepoint, whose record
//! carries the pids and state itself.

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap},
    programs::{
        tp_btf::BtfTracePointLinkId, trace_point::TracePointLinkId, BtfTracePoint, TracePoint,
    },
    Ebpf, EbpfLoader,
};
use profiler_common::{
    latency::LatencyBuckets,
    offcpu::{
        Blocked, OffCpuConfig, OffCpuCount, OffCpuKey, OffCpuStats, OFFCPU_ALL, OFFCPU_DWARF,
        OFFCPU_WAKERS,
    },
};

use super::{
    btf::Btf,
    maps::{take, MapSizes, TailCalls},
};

/// Entries of the blocked-threads map: threads in scope that have left the CPU, until they exit.
const BLOCKED_THREADS: u32 = 16384;
/// Processes the scope map holds: the command's or `-p`'s, and what they fork.
const SCOPE_PROCESSES: u32 = 16384;

/// What `--off-cpu` asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuOptions {
    /// `--off-cpu-min`: shorter blocks are counted without stacks.
    pub min_block_ns: u64,
    /// `--wakers`: keep who woke each blocked thread, with its stacks.
    pub wakers: bool,
}

/// How the switch programs are attached, for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attachment {
    BtfTracepoint,
    Tracepoint,
}

impl Attachment {
    pub fn describe(self) -> &'static str {
        match self {
            Attachment::BtfTracepoint => "tp_btf/sched_switch",
            Attachment::Tracepoint => "tracepoint sched:sched_switch",
        }
    }
}

/// The off-CPU maps of one generation.
pub struct OffCpuMaps {
    pub stats: PerCpuHashMap<MapData, OffCpuKey, OffCpuStats>,
    pub histograms: PerCpuHashMap<MapData, OffCpuKey, LatencyBuckets>,
}

pub struct OffCpuCapture {
    pub generations: [OffCpuMaps; 2],
    pub counts: PerCpuArray<MapData, u64>,
    scope: HashMap<MapData, u32, u8>,
    /// The threads off the CPU now, by thread id.
    blocked: HashMap<MapData, u32, Blocked>,
    pub attachment: Attachment,
    /// `--off-cpu-min`, in nanoseconds.
    pub min_block_ns: u64,
    /// `--wakers`: the wake-up program is loaded.
    wakers: bool,
    /// With `OFFCPU_DWARF`: the unwinder's program array.
    _unwinder: Option<TailCalls>,
    /// The programs attached, in their order, until detached.
    links: Vec<(&'static str, Link)>,
}

/// An attached switch, fork or wake-up program.
enum Link {
    BtfTracepoint(BtfTracePointLinkId),
    Tracepoint(TracePointLinkId),
}

/// The program's configuration for `options`: the task fields it reads, from the kernel's BTF
/// (none: the classic tracepoint is used), and with `dwarf` user stacks walked by the DWARF
/// unwinder where it can take them (`tp_btf`).
pub fn offcpu_config(
    options: &OffCpuOptions,
    system_wide: bool,
    dwarf: bool,
) -> (OffCpuConfig, Attachment) {
    let mut config = OffCpuConfig {
        flags: if system_wide { OFFCPU_ALL } else { 0 }
            | if options.wakers { OFFCPU_WAKERS } else { 0 },
        min_block_ns: options.min_block_ns,
        ..OffCpuConfig::EMPTY
    };
    let task = |btf: &Btf| {
        let field = |name: &str| btf.member_offset("task_struct", name);
        let entity = |name: &str| Some(field("se")? + btf.member_offset("sched_entity", name)?);
        // Dating missed switches needs all three; none is at offset 0, which says unknown.
        let runtime = (|| {
            Some((
                entity("sum_exec_runtime")?,
                entity("prev_sum_exec_runtime")?,
                field("policy")?,
            ))
        })()
        .unwrap_or_default();
        // `state` was renamed `__state` in Linux 5.14.
        Some(OffCpuConfig {
            task_pid: field("pid")?,
            task_tgid: field("tgid")?,
            task_state: field("__state").or_else(|| field("state"))?,
            task_runtime: runtime.0,
            task_slice_start: runtime.1,
            task_policy: runtime.2,
            ..config
        })
    };
    let fields = Btf::from_sys_fs().ok().and_then(|btf| task(&btf));
    match fields {
        // aya parses the BTF again to attach the programs: only once, in `load`.
        Some(fields) => {
            config = fields;
            if dwarf {
                config.flags |= OFFCPU_DWARF;
            }
            (config, Attachment::BtfTracepoint)
        }
        _ => (config, Attachment::Tracepoint),
    }
}

/// Sizes the off-CPU maps with `--off-cpu`, else to the smallest the kernel takes: distinct
/// (thread, stacks, state) keys per generation as `--map-entries` says (16,384 by default),
/// histograms as many as the latency maps' (`--latency-map-entries`).
pub fn size_maps(loader: &mut EbpfLoader, enabled: bool, sizes: &MapSizes) {
    let size = |entries: u32| if enabled { entries } else { 1 };
    loader
        .map_max_entries("OFFCPU_BLOCKED", size(BLOCKED_THREADS))
        .map_max_entries("OFFCPU_SCOPE", size(SCOPE_PROCESSES));
    for generation in ["0", "1"] {
        let name = |map: &str| -> &'static str {
            Box::leak(format!("{map}_{generation}").into_boxed_str())
        };
        loader
            .map_max_entries(name("OFFCPU_STATS"), size(sizes.off_cpu_blocks))
            .map_max_entries(name("OFFCPU_HISTOGRAMS"), size(sizes.off_cpu_histograms));
    }
}

impl OffCpuCapture {
    /// Loads the switch and fork programs for `attachment` and takes their maps; attached by
    /// [`OffCpuCapture::attach`] once the scope is in place.
    pub fn load(
        ebpf: &mut Ebpf,
        config: &OffCpuConfig,
        attachment: Attachment,
    ) -> Result<OffCpuCapture> {
        let verifier = |e| anyhow!("the kernel verifier rejected the off-CPU program: {e:?}");
        let mut unwinder = None;
        match attachment {
            Attachment::BtfTracepoint => {
                let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
                for (name, tracepoint) in programs(attachment, config.flags & OFFCPU_WAKERS != 0) {
                    let program: &mut BtfTracePoint = program(ebpf, name)?.try_into()?;
                    program.load(tracepoint, &btf).map_err(verifier)?;
                }
                if config.flags & OFFCPU_DWARF != 0 {
                    let program: &mut BtfTracePoint = program(ebpf, "offcpu_unwind")?.try_into()?;
                    program.load("sched_switch", &btf).map_err(verifier)?;
                    let fd = program.fd()?.try_clone()?;
                    unwinder = Some(TailCalls::hold(take(ebpf, "OFFCPU_UNWINDER")?, &fd)?);
                }
            }
            Attachment::Tracepoint => {
                for (name, _) in programs(attachment, config.flags & OFFCPU_WAKERS != 0) {
                    let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
                    program.load().map_err(verifier)?;
                }
            }
        }
        let generation = |ebpf: &mut Ebpf, index: usize| -> Result<OffCpuMaps> {
            Ok(OffCpuMaps {
                stats: take(ebpf, &format!("OFFCPU_STATS_{index}"))?,
                histograms: take(ebpf, &format!("OFFCPU_HISTOGRAMS_{index}"))?,
            })
        };
        Ok(OffCpuCapture {
            generations: [generation(ebpf, 0)?, generation(ebpf, 1)?],
            counts: take(ebpf, "OFFCPU_COUNTS")?,
            scope: take(ebpf, "OFFCPU_SCOPE")?,
            blocked: take(ebpf, "OFFCPU_BLOCKED")?,
            attachment,
            min_block_ns: config.min_block_ns,
            wakers: config.flags & OFFCPU_WAKERS != 0,
            _unwinder: unwinder,
            links: Vec::new(),
        })
    }

    /// The stacks of the blocks still running: they are counted when their threads run again,
    /// however many windows later, so the agent's stack cache must keep them.
    pub fn pending_stacks(&self) -> Result<Vec<u64>> {
        let mut hashes = Vec::new();
        for entry in self.blocked.iter() {
            let (_, blocked) = entry.context("reading the off-CPU blocked-threads map")?;
            if blocked.is_open() {
                hashes.extend(blocked.stack_hashes());
            }
        }
        Ok(hashes)
    }

    /// Puts processes in scope (the command, `-p`); with `OFFCPU_ALL` every thread is.
    pub fn add_to_scope(&mut self, pids: &[u32]) -> Result<()> {
        for pid in pids {
            self.scope
                .insert(pid, 1, 0)
                .context("filling the off-CPU scope map")?;
        }
        Ok(())
    }

    /// Attaches the loaded programs: from here every switch is seen, until
    /// [`OffCpuCapture::detach`].
    pub fn attach(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let attaching = |what: &str| format!("attaching the off-CPU program to {what}");
        for (name, tracepoint) in programs(self.attachment, self.wakers) {
            let link = match self.attachment {
                Attachment::BtfTracepoint => {
                    let program: &mut BtfTracePoint = program(ebpf, name)?.try_into()?;
                    Link::BtfTracepoint(program.attach().with_context(|| attaching(name))?)
                }
                Attachment::Tracepoint => {
                    let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
                    let link = program.attach("sched", tracepoint).with_context(|| {
                        format!(
                            "{} (the classic tracepoint needs tracefs, mounted at \
                             /sys/kernel/tracing)",
                            attaching(tracepoint)
                        )
                    })?;
                    Link::Tracepoint(link)
                }
            };
            self.links.push((name, link));
        }
        Ok(())
    }

    /// Detaches the programs, in the reverse order of [`OffCpuCapture::attach`]: from here no
    /// switch is seen. A recording does this before it stops its side-band, so that no thread
    /// forked later is counted without the side-band's record of its name.
    pub fn detach(&mut self, ebpf: &mut Ebpf) -> Result<()> {
        let detaching = |name: &str| format!("detaching the off-CPU program {name}");
        while let Some((name, link)) = self.links.pop() {
            match link {
                Link::BtfTracepoint(link) => {
                    let program: &mut BtfTracePoint = program(ebpf, name)?.try_into()?;
                    program.detach(link).with_context(|| detaching(name))?;
                }
                Link::Tracepoint(link) => {
                    let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
                    program.detach(link).with_context(|| detaching(name))?;
                }
            }
        }
        Ok(())
    }

    /// The programs' counters, by `OffCpuCount` index.
    pub fn read_counts(&self) -> Result<[u64; OffCpuCount::COUNT]> {
        let mut counts = [0; OffCpuCount::COUNT];
        for what in OffCpuCount::ALL {
            counts[what as usize] = self
                .counts
                .get(&(what as u32), 0)
                .context("reading the off-CPU counters")?
                .iter()
                .sum();
        }
        Ok(counts)
    }
}

/// The programs of `attachment` (with `wakers`, the wake-up one) and their tracepoints, in the
/// order they are attached: forks first, so no thread forked into scope runs unseen; wake-ups
/// before the switches, so every remembered block can learn its waker.
fn programs(attachment: Attachment, wakers: bool) -> Vec<(&'static str, &'static str)> {
    let named =
        |btf: &'static str, classic: &'static str, tracepoint: &'static str| match attachment {
            Attachment::BtfTracepoint => (btf, tracepoint),
            Attachment::Tracepoint => (classic, tracepoint),
        };
    let mut programs = vec![named(
        "offcpu_fork",
        "offcpu_fork_tracepoint",
        "sched_process_fork",
    )];
    if wakers {
        programs.push(named(
            "offcpu_waking",
            "offcpu_waking_tracepoint",
            "sched_waking",
        ));
    }
    programs.push(named(
        "offcpu_switch",
        "offcpu_switch_tracepoint",
        "sched_switch",
    ));
    programs
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("the capture program has no {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_time_that_dates_a_missed_switch_comes_from_btf() {
        let options = OffCpuOptions {
            wakers: false,
            min_block_ns: 0,
        };
        let (config, attachment) = offcpu_config(&options, false, false);
        assert_eq!(attachment, Attachment::BtfTracepoint);
        // `sched_entity` has kept `prev_sum_exec_runtime` right after `sum_exec_runtime`.
        assert_ne!(config.task_runtime, 0);
        assert_eq!(config.task_slice_start, config.task_runtime + 8);
        assert_ne!(config.task_policy, 0);
    }
}
