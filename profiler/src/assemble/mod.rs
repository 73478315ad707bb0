//! Building a [`Profile`], the one way: live recordings and agent windows ([`drained`]) and
//! perf.data imports (`import::convert`) feed the same [`ProfileBuilder`].
//!
//! Each source counts its samples its own way (the kernel's maps, or the decoded samples of a
//! file) and adds the aggregates at address level: interned call stacks and the samples on
//! them, sampled instructions, data cache lines, latency histograms, hardware observations,
//! threads and off-CPU blocks. [`ProfileBuilder::build`] symbolizes every address in one batch
//! and turns the aggregates into the profile's frames, stacks and samples.

pub mod drained;
pub mod offcpu;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use profiler_common::capture::{
    DataLineKey, InstructionKey, LatencyKey, LineLatencyKey, SampleStats,
};
use profiler_common::offcpu::OffCpuKey;

use self::offcpu::{assemble_offcpu, below_scheduler, waker_frames};
use crate::{
    drain::{hardware::HardwareAccumulator, offcpu::DrainedOffCpu},
    fast_hash,
    process::ProcessTable,
    profile::{
        DataAccess, DataLineSample, EventIndex, EventInfo, FrameId, HardwareProfile,
        InstructionSample, LatencyHistogram, LineLatencyHistogram, Losses, Profile, ProfileMeta,
        StackSample, Stats, ThreadInfo,
    },
    scope::{
        cgroup::{cgroup2_mount, cgroup_id, cgroup_subtree},
        container::classify_cgroup_path,
        kubernetes::KubernetesNames,
    },
    symbolize::{lookup_addresses, splice_python_frames, CodeAddress, FrameTable},
};

/// Sparse `(bucket, count)` pairs of a drained histogram.
pub fn sparse_buckets(buckets: &[u64]) -> Vec<(u16, u64)> {
    buckets
        .iter()
        .enumerate()
        .filter(|(_, count)| **count > 0)
        .map(|(bucket, count)| (bucket as u16, *count))
        .collect()
}

/// A call stack interned by a [`ProfileBuilder`] (see [`ProfileBuilder::stack`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StackId(usize);

/// Samples of one thread and event on one kernel and one user call stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StackSampleKey {
    pub pid: u32,
    pub tid: u32,
    pub event: EventIndex,
    /// 0 where the source knows no cgroup.
    pub cgroup: u64,
    pub kernel: StackId,
    pub user: StackId,
    /// The stack was lost, not empty: the program could not record it.
    pub kernel_stack_lost: bool,
    pub user_stack_lost: bool,
}

/// The stacks of an off-CPU block's key: where it blocked, and where its waker woke it.
#[derive(Clone, Copy, Debug)]
pub struct BlockStacks {
    pub kernel: StackId,
    pub user: StackId,
    pub waker_kernel: StackId,
    pub waker_user: StackId,
}

/// Where the samples come from, for what the builder adds to the threads that took them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A capture on this machine: the idle task (pid 0, which the side-band never names) is
    /// named as perf names it, every sampled process's main thread is listed (a process is
    /// named after it, and it may have taken no sample), and a thread's cgroup names its
    /// container from this machine's cgroup tree.
    Capture,
    /// A recording made elsewhere (perf.data): the threads that took samples, named as its
    /// COMM records name them.
    Recording,
}

/// Off-CPU blocks as drained, with the stacks of each key.
struct OffCpuInput {
    blocks: DrainedOffCpu,
    stacks: fast_hash::HashMap<OffCpuKey, BlockStacks>,
}

/// Collects a source's aggregates until [`ProfileBuilder::build`] symbolizes their addresses;
/// lists keep the order they were added in.
pub struct ProfileBuilder<'a> {
    table: FrameTable<'a>,
    origin: Origin,
    /// Each distinct stack once, with its process (0 for kernel stacks): its frames are looked
    /// up once however many threads and events share it.
    stacks: Vec<(u32, &'a [u64])>,
    stack_ids: fast_hash::HashMap<(u32, &'a [u64]), StackId>,
    samples: Vec<(StackSampleKey, u64, Vec<u64>)>,
    instructions: Vec<(InstructionKey, SampleStats)>,
    data_lines: Vec<(DataLineKey, SampleStats, Vec<u64>)>,
    latencies: Vec<(LatencyKey, Vec<(u16, u64)>)>,
    line_latencies: Vec<LineLatencyHistogram>,
    hardware: HardwareAccumulator,
    /// (pid, tid, cgroup).
    threads: BTreeSet<(u32, u32, u64)>,
    off_cpu: Option<OffCpuInput>,
    /// Where a capture's containers in Kubernetes pods are named.
    kubernetes: Option<&'a mut KubernetesNames>,
}

impl<'a> ProfileBuilder<'a> {
    /// A builder whose addresses `table` resolves (through its processes, its symbol cache and
    /// the frames it knows already).
    pub fn new(table: FrameTable<'a>, origin: Origin) -> Self {
        ProfileBuilder {
            table,
            origin,
            stacks: Vec::new(),
            stack_ids: fast_hash::HashMap::default(),
            samples: Vec::new(),
            instructions: Vec::new(),
            data_lines: Vec::new(),
            latencies: Vec::new(),
            line_latencies: Vec::new(),
            hardware: HardwareAccumulator::default(),
            threads: BTreeSet::new(),
            off_cpu: None,
            kubernetes: None,
        }
    }

    /// Names a capture's containers that run in Kubernetes pods by their namespace, pod and
    /// container, from `names`.
    pub fn name_pods(&mut self, names: &'a mut KubernetesNames) {
        self.kubernetes = Some(names);
    }

    /// Interns the call stack `ips` (leaf first) of process `pid`, 0 for a kernel stack: a
    /// kernel stack is the same code in every process, a user stack the same code within one.
    pub fn stack(&mut self, pid: u32, ips: &'a [u64]) -> StackId {
        *self.stack_ids.entry((pid, ips)).or_insert_with(|| {
            self.stacks.push((pid, ips));
            StackId(self.stacks.len() - 1)
        })
    }

    /// Adds `count` samples on a stack, `per_cpu` of them by CPU (index = CPU number); their
    /// thread is listed.
    pub fn add_stack(&mut self, key: StackSampleKey, count: u64, per_cpu: Vec<u64>) {
        self.threads.insert((key.pid, key.tid, key.cgroup));
        self.samples.push((key, count, per_cpu));
    }

    /// Lists a thread that took samples besides those on stacks.
    pub fn add_thread(&mut self, pid: u32, tid: u32, cgroup: u64) {
        self.threads.insert((pid, tid, cgroup));
    }

    pub fn add_instruction(&mut self, key: InstructionKey, stats: SampleStats) {
        self.instructions.push((key, stats));
    }

    pub fn add_data_line(&mut self, key: DataLineKey, stats: SampleStats, per_cpu: Vec<u64>) {
        self.data_lines.push((key, stats, per_cpu));
    }

    /// Adds an instruction's latency histogram, `(bucket, count)` pairs by bucket.
    pub fn add_latency(&mut self, key: LatencyKey, buckets: Vec<(u16, u64)>) {
        self.latencies.push((key, buckets));
    }

    /// Adds a data cache line's latency histogram, `(bucket, count)` pairs by bucket.
    pub fn add_line_latency(&mut self, key: LineLatencyKey, buckets: Vec<(u16, u64)>) {
        self.line_latencies.push(LineLatencyHistogram {
            pid: key.pid,
            event: key.event,
            line: key.line,
            buckets,
        });
    }

    /// What precise samplers reported beyond the IP, aggregated by sampled instruction.
    pub fn set_hardware(&mut self, hardware: HardwareAccumulator) {
        self.hardware = hardware;
    }

    /// Adds the off-CPU blocks drained (`record --off-cpu`), `stacks` giving each key's
    /// interned stacks; their threads and wakers are listed. The profile's off-CPU part is made
    /// when the blocks name how switches were seen.
    pub fn add_off_cpu(
        &mut self,
        blocks: DrainedOffCpu,
        mut stacks: impl FnMut(&OffCpuKey) -> BlockStacks,
    ) {
        let stacks = blocks
            .blocks
            .keys()
            .map(|key| (*key, stacks(key)))
            .collect();
        self.off_cpu = Some(OffCpuInput { blocks, stacks });
    }

    /// Symbolizes every address added, in one batch, and makes the profile.
    pub fn build(self, meta: ProfileMeta, events: Vec<EventInfo>, mut losses: Losses) -> Profile {
        let ProfileBuilder {
            mut table,
            origin,
            stacks,
            stack_ids: _,
            samples,
            instructions,
            data_lines,
            latencies,
            line_latencies,
            hardware,
            threads,
            off_cpu: blocked,
            kubernetes,
        } = self;
        let processes = table.processes();
        let code = CodeAddress::sampled;
        let addresses = stacks
            .iter()
            .flat_map(|(pid, ips)| lookup_addresses(*pid, ips))
            .chain(instructions.iter().map(|(k, _)| code(k.pid, k.ip)))
            .chain(data_lines.iter().map(|(k, _, _)| code(k.pid, k.ip)))
            .chain(latencies.iter().map(|(k, _)| code(k.pid, k.ip)))
            .chain(hardware.instructions().map(|(pid, ip)| code(pid, ip)));
        table.resolve(addresses);
        count_unreadable_modules(&mut losses, &table.known.unreadable);

        // Symbolized once per distinct stack, however many threads and events share it.
        // Each evaluator call of a CPython process in place of the Python frames it ran.
        let frames: Vec<Vec<FrameId>> = stacks
            .iter()
            .map(|(pid, ips)| {
                let ids = lookup_addresses(*pid, ips)
                    .map(|address| table.frame(address))
                    .collect();
                splice_python_frames(ips, ids, &table.known.frames)
            })
            .collect();
        let frames_of = |id: StackId| frames[id.0].as_slice();
        let mut stacks: Vec<StackSample> = samples
            .into_iter()
            .map(|(key, count, per_cpu)| StackSample {
                pid: key.pid,
                tid: key.tid,
                event: key.event,
                cgroup: key.cgroup,
                frames: [frames_of(key.kernel), frames_of(key.user)].concat(),
                user_stack_lost: key.user_stack_lost,
                kernel_stack_lost: key.kernel_stack_lost,
                count,
                per_cpu,
                weight: None,
            })
            .collect();
        stacks.sort_by(|a, b| b.count.cmp(&a.count).then(a.frames.cmp(&b.frames)));
        let off_cpu = blocked.as_ref().and_then(|input| {
            let attachment = input.blocks.attachment?;
            Some(assemble_offcpu(
                &input.blocks,
                attachment,
                input.blocks.min_block_ns,
                |key| {
                    let stacks = &input.stacks[key];
                    [
                        below_scheduler(frames_of(stacks.kernel), &table.known.frames),
                        frames_of(stacks.user),
                    ]
                    .concat()
                },
                |key| {
                    let stacks = &input.stacks[key];
                    waker_frames(
                        frames_of(stacks.waker_kernel),
                        frames_of(stacks.waker_user),
                        &table.known.frames,
                        key.waker.pid == 0,
                    )
                },
            ))
        });

        let instructions = instructions
            .into_iter()
            .map(|(key, stats)| InstructionSample {
                pid: key.pid,
                event: key.event,
                frame: table.frame(code(key.pid, key.ip)),
                stats: Stats::from(&stats),
            })
            .collect();
        let data_lines = data_lines
            .into_iter()
            .map(|(key, stats, per_cpu)| DataLineSample {
                pid: key.pid,
                event: key.event,
                line: key.line,
                frame: table.frame(code(key.pid, key.ip)),
                stats: Stats::from(&stats),
                per_cpu,
                tid: Some(key.tid),
                access: DataAccess::from_code(key.access),
            })
            .collect();
        let ibs_caps = hardware.ibs_caps();
        let hardware_samples = hardware.finish(|pid, ip| table.frame(code(pid, ip)));
        let latency = latencies
            .into_iter()
            .map(|(key, buckets)| LatencyHistogram {
                pid: key.pid,
                event: key.event,
                frame: table.frame(code(key.pid, key.ip)),
                buckets,
            })
            .collect();
        let blocked = blocked.as_ref().map(|input| &input.blocks);
        let threads = thread_list(processes, origin, threads, blocked, kubernetes);
        // Files other users control that symbolizing could not read, or read only in part.
        losses.counters.extend(table.known.unread_files());
        // Debug files asked of debuginfod servers for this profile's modules that did not come.
        losses
            .counters
            .extend(crate::symbolize::debuginfod::unfetched_counters());

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
            line_latency: line_latencies,
            function_aliases: table.known.aliases,
            off_cpu,
        }
    }
}

/// The profile's threads: those that took samples or blocked, with (from a capture) their
/// wakers and their processes' main threads.
fn thread_list(
    processes: &ProcessTable,
    origin: Origin,
    mut threads: BTreeSet<(u32, u32, u64)>,
    blocked: Option<&DrainedOffCpu>,
    kubernetes: Option<&mut KubernetesNames>,
) -> Vec<ThreadInfo> {
    let blocks = blocked
        .into_iter()
        .flat_map(|off_cpu| off_cpu.blocks.keys());
    threads.extend(blocks.clone().map(|k| (k.pid, k.tid, k.cgroup)));
    // Wakers are named too: outside the scope they have no key of their own (nor a cgroup).
    let known: BTreeSet<(u32, u32)> = threads.iter().map(|&(pid, tid, _)| (pid, tid)).collect();
    let wakers: BTreeSet<(u32, u32)> = blocks
        .map(|k| (k.waker.pid, k.waker.tid))
        .filter(|waker| waker.0 != 0 && !known.contains(waker))
        .collect();
    threads.extend(wakers.into_iter().map(|(pid, tid)| (pid, tid, 0)));
    if origin == Origin::Recording {
        return threads
            .into_iter()
            .map(|(pid, tid, _)| ThreadInfo {
                pid,
                tid,
                comm: processes.thread_name(pid, tid),
                container: None,
            })
            .collect();
    }
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
    let cgroups = threads.iter().map(|&(_, _, cgroup)| cgroup).collect();
    let workloads = cgroup_workloads(&cgroups, kubernetes);
    threads
        .into_iter()
        .map(|(pid, tid, cgroup)| ThreadInfo {
            pid,
            tid,
            comm: thread_name(processes, pid, tid),
            container: workloads.get(&cgroup).cloned(),
        })
        .collect()
}

/// Perf's name for the idle task (pid 0), which has no name of its own in the side-band.
const IDLE_TASK: &str = "swapper";

fn thread_name(processes: &ProcessTable, pid: u32, tid: u32) -> String {
    if pid == 0 {
        IDLE_TASK.to_string()
    } else {
        processes.thread_name(pid, tid)
    }
}

/// The container or systemd unit of each cgroup id of `wanted` (the ids samples carry), by
/// walking this machine's cgroup v2 tree; a container in a Kubernetes pod by its
/// `namespace/pod/container` where `kubernetes` finds them. The root cgroup is no workload.
fn cgroup_workloads(
    wanted: &BTreeSet<u64>,
    mut kubernetes: Option<&mut KubernetesNames>,
) -> HashMap<u64, String> {
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
            if !wanted.contains(&id) {
                return None;
            }
            let path = format!("/{relative}");
            let pod = kubernetes
                .as_deref_mut()
                .and_then(|names| names.of_cgroup_path(&path));
            let workload = match pod {
                Some(pod) => pod.to_string(),
                None => classify_cgroup_path(&path).to_string(),
            };
            Some((id, workload))
        })
        .collect()
}

/// How the losses name code left unnamed because its module could not be opened.
pub const UNREADABLE_MODULE_LOSS: &str = "code addresses unnamed: ";

/// Modules named one by one in the losses when their files could not be opened; the rest share
/// one line (a user can map thousands of files).
const UNREADABLE_MODULES_NAMED: usize = 16;

/// Says in the losses which modules' code stayed unnamed because their files could not be
/// opened, most addresses first.
fn count_unreadable_modules(losses: &mut Losses, unreadable: &BTreeMap<String, u64>) {
    let mut modules: Vec<(&String, &u64)> = unreadable.iter().collect();
    modules.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (module, addresses) in modules.iter().take(UNREADABLE_MODULES_NAMED) {
        losses.counters.insert(
            format!("{UNREADABLE_MODULE_LOSS}the module could not be opened: {module}"),
            **addresses,
        );
    }
    let rest = modules.len().saturating_sub(UNREADABLE_MODULES_NAMED);
    if rest > 0 {
        let addresses = modules
            .iter()
            .skip(UNREADABLE_MODULES_NAMED)
            .map(|m| *m.1)
            .sum();
        losses.counters.insert(
            format!("{UNREADABLE_MODULE_LOSS}{rest} more modules could not be opened"),
            addresses,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every unreadable module counts; the 16 with most addresses are named, the rest summed.
    #[test]
    fn modules_that_could_not_be_opened_are_named_in_the_losses_most_addresses_first() {
        let unreadable: BTreeMap<String, u64> = (0..20u64)
            .map(|i| (format!("/home/u/module{i:02}"), i + 1))
            .collect();
        let mut losses = Losses::default();
        count_unreadable_modules(&mut losses, &unreadable);
        let named = |module: &str| {
            losses.counters.get(&format!(
                "{UNREADABLE_MODULE_LOSS}the module could not be opened: {module}"
            ))
        };
        assert_eq!(named("/home/u/module19"), Some(&20));
        assert_eq!(named("/home/u/module04"), Some(&5));
        assert_eq!(named("/home/u/module03"), None);
        assert_eq!(
            losses.counters.get(&format!(
                "{UNREADABLE_MODULE_LOSS}4 more modules could not be opened"
            )),
            Some(&(1 + 2 + 3 + 4))
        );
        assert_eq!(losses.counters.len(), 17);
    }

    #[test]
    fn the_idle_task_is_named_as_perf_names_it() {
        let processes = ProcessTable::default();
        assert_eq!(thread_name(&processes, 0, 0), "swapper");
        assert_eq!(thread_name(&processes, 7, 7), "");
    }
}
