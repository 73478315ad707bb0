//! The embedded eBPF capture program: loading it with its configuration and map sizes, attaching
//! it to perf counters, and the maps the agent reads.

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{PerfEvent, ProgramError},
    Ebpf, EbpfError, EbpfLoader,
};
use perf_event::Counter;

use super::{
    maps::{take, MapSizes, TailCalls},
    offcpu::{size_maps as size_offcpu_maps, Attachment, OffCpuCapture},
    stats::{ProgramRuns, SAMPLE_PROGRAM},
};
use profiler_common::{
    capture::{
        CaptureConfig, DataLineKey, DataSourceKey, InstructionKey, LatencyKey, LineLatencyKey,
        RawDecoding, SampleStats, StackKey, CAPTURE_UNWIND_DWARF,
    },
    latency::LatencyBuckets,
    offcpu::OffCpuConfig,
    stack::StackFrames,
};

/// The capture program, built from `profiler-ebpf/` by build.rs.
static PROGRAM_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler.bpf.o"));
const UNWINDER_NAME: &str = "unwind_user";

/// The ring buffers the program streams through.
#[derive(Clone, Copy, Debug)]
pub enum Ring {
    /// Every sample, with `record --raw`.
    RawSamples,
    /// The registers of IBS samples.
    IbsSamples,
    /// The program's requests to check the maps' fill (a `Fill` index each).
    DrainRequests,
    /// User registers, user stack bytes and kernel frames of every sample (`--unwind copy`).
    StackCopies,
}

/// The maps of one generation, drained together.
pub struct GenerationMaps {
    pub stack_counts: PerCpuHashMap<MapData, StackKey, u64>,
    pub instructions: PerCpuHashMap<MapData, InstructionKey, SampleStats>,
    pub data_lines: PerCpuHashMap<MapData, DataLineKey, SampleStats>,
    pub latencies: PerCpuHashMap<MapData, LatencyKey, LatencyBuckets>,
    pub line_latencies: PerCpuHashMap<MapData, LineLatencyKey, LatencyBuckets>,
    pub data_sources: PerCpuHashMap<MapData, DataSourceKey, u64>,
}

/// Fields drop in order: the programs (`ebpf`) close before the program arrays they tail-call
/// through ([`TailCalls`]).
pub struct CaptureProgram {
    ebpf: Ebpf,
    pub generations: [GenerationMaps; 2],
    /// Stack hash -> frames of the stacks the agent has not taken yet.
    pub stack_frames: HashMap<MapData, u64, StackFrames>,
    pub control: Array<MapData, u32>,
    pub inflight: PerCpuArray<MapData, u64>,
    pub new_keys: PerCpuArray<MapData, u64>,
    pub samples_fired: PerCpuArray<MapData, u64>,
    pub samples_filtered: PerCpuArray<MapData, u64>,
    pub period_sums: PerCpuArray<MapData, u64>,
    pub losses: PerCpuArray<MapData, u64>,
    event_ids: HashMap<MapData, u64, u32>,
    cgroup_filter: HashMap<MapData, u64, u8>,
    raw_samples: Option<RingBuf<MapData>>,
    ibs_samples: Option<RingBuf<MapData>>,
    stack_copies: Option<RingBuf<MapData>>,
    drain_requests: Option<RingBuf<MapData>>,
    /// With `--unwind dwarf`: the unwinder's program array.
    _unwinder: Option<TailCalls>,
    /// With `--off-cpu`: the scheduler-switch programs' maps.
    pub offcpu: Option<OffCpuCapture>,
}

fn take_generation(ebpf: &mut Ebpf, generation: usize) -> Result<GenerationMaps> {
    Ok(GenerationMaps {
        stack_counts: take(ebpf, &format!("STACK_COUNTS_{generation}"))?,
        instructions: take(ebpf, &format!("INSTRUCTIONS_{generation}"))?,
        data_lines: take(ebpf, &format!("DATA_LINES_{generation}"))?,
        latencies: take(ebpf, &format!("LATENCIES_{generation}"))?,
        line_latencies: take(ebpf, &format!("LINE_LATENCIES_{generation}"))?,
        data_sources: take(ebpf, &format!("DATA_SOURCES_{generation}"))?,
    })
}

/// Why the kernel refused the capture program or one of its maps, by errno, and what to do:
/// a missing privilege is no map's fault (the first map tried, in no fixed order, fails), a
/// refused size is one map's.
fn load_error(error: EbpfError) -> anyhow::Error {
    let errno = {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        std::iter::from_fn(|| {
            let current = source?;
            source = current.source();
            Some(current)
        })
        .find_map(|e| e.downcast_ref::<std::io::Error>()?.raw_os_error())
    };
    let map = match &error {
        EbpfError::MapError(MapError::CreateError { name, .. }) => Some(name.as_str()),
        _ => None,
    };
    match (errno, map) {
        (Some(libc::EPERM | libc::EACCES), _) => {
            let setting = std::fs::read_to_string("/proc/sys/kernel/unprivileged_bpf_disabled")
                .map(|value| format!(" (kernel.unprivileged_bpf_disabled = {})", value.trim()))
                .unwrap_or_default();
            anyhow!(
                "the kernel refused to create the capture program's BPF maps: permission \
                 denied (EPERM){setting}. Loading BPF programs needs root, or CAP_BPF and \
                 CAP_PERFMON: run it with sudo, or grant them to the binary with \
                 `sudo setcap cap_bpf,cap_perfmon+ep {}`",
                std::env::current_exe()
                    .map(|path| path.display().to_string())
                    .unwrap_or_else(|_| "profiler".into())
            )
        }
        (Some(libc::E2BIG), Some(map)) => anyhow!(
            "BPF map `{map}` is larger than the kernel allows (E2BIG): lower {}",
            size_option(map)
        ),
        (Some(libc::ENOMEM), Some(map)) => anyhow!(
            "the kernel could not allocate BPF map `{map}` (ENOMEM): lower {}, or raise the \
             locked-memory limit (`ulimit -l`, which kernels before 5.11 charge maps to) or \
             the memory limit of this process's cgroup",
            size_option(map)
        ),
        (Some(code @ (libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)), Some(map)) => anyhow!(
            "the kernel does not support BPF map `{map}` as the capture program defines it \
             ({}): it needs Linux 5.8 or later (BPF ring buffers), built with CONFIG_BPF_SYSCALL",
            errno_name(code)
        ),
        _ => anyhow!(
            "loading the eBPF capture program failed: {}\nThe profiler needs root (or CAP_BPF + \
             CAP_PERFMON) and a kernel with BPF perf_event programs.",
            error_chain(&error)
        ),
    }
}

/// An error and its causes, as one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The option that sizes a map of the capture program.
fn size_option(map: &str) -> &'static str {
    match map.trim_end_matches(|c: char| c == '_' || c.is_ascii_digit()) {
        "STACK_FRAMES" => "--stack-map-entries",
        "LATENCIES" | "LINE_LATENCIES" => "--latency-map-entries",
        "RAW_SAMPLES" | "IBS_SAMPLES" | "STACK_COPIES" => "--ring-buffer-kib",
        "UNWIND_ROWS" => "--unwind-table-mib",
        _ => "--map-entries",
    }
}

fn errno_name(code: i32) -> &'static str {
    match code {
        libc::EINVAL => "EINVAL",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSYS => "ENOSYS",
        _ => "an error",
    }
}

/// Loads the unwinder's program (`--unwind dwarf`) into the program array the capture program
/// tail-calls.
fn load_unwinder(ebpf: &mut Ebpf) -> Result<TailCalls> {
    let unwinder: &mut PerfEvent = ebpf
        .program_mut(UNWINDER_NAME)
        .ok_or_else(|| anyhow!("the capture program has no {UNWINDER_NAME}"))?
        .try_into()?;
    unwinder
        .load()
        .map_err(|e| anyhow!("the kernel verifier rejected the unwinder program: {e:?}"))?;
    let fd = unwinder.fd()?.try_clone()?;
    TailCalls::hold(take(ebpf, "UNWINDER")?, &fd)
}

impl CaptureProgram {
    /// Loads the program with its options, and with `offcpu` the scheduler-switch programs;
    /// the verifier runs here.
    pub fn load(
        config: &CaptureConfig,
        raw: &RawDecoding,
        sizes: &MapSizes,
        offcpu: Option<(OffCpuConfig, Attachment)>,
    ) -> Result<CaptureProgram> {
        lift_memlock_limit();
        // Module files are kept open for as long as the capture runs.
        crate::process::raise_open_file_limit();
        let offcpu_config = offcpu.map_or(OffCpuConfig::EMPTY, |(config, _)| config);
        let mut loader = EbpfLoader::new();
        loader
            .override_global("CAPTURE_CONFIG", config, true)
            .override_global("RAW_DECODING", raw, true)
            .override_global("OFFCPU_CONFIG", &offcpu_config, true);
        size_offcpu_maps(&mut loader, offcpu.is_some(), sizes);
        for generation in ["0", "1"] {
            let size = |name: &str| -> &'static str {
                Box::leak(format!("{name}_{generation}").into_boxed_str())
            };
            loader
                .map_max_entries(size("STACK_COUNTS"), sizes.stack_counts)
                .map_max_entries(size("INSTRUCTIONS"), sizes.instructions)
                .map_max_entries(size("DATA_LINES"), sizes.data_lines)
                .map_max_entries(size("LATENCIES"), sizes.latencies)
                .map_max_entries(size("LINE_LATENCIES"), sizes.latencies)
                .map_max_entries(size("DATA_SOURCES"), sizes.data_lines);
        }
        loader
            .map_max_entries("STACK_FRAMES", sizes.stacks)
            .map_max_entries("RAW_SAMPLES", sizes.ring_buffer_bytes)
            .map_max_entries("IBS_SAMPLES", sizes.ibs_ring_bytes)
            .map_max_entries("STACK_COPIES", sizes.stack_copy_ring_bytes)
            .map_max_entries("STACK_COPY_SCRATCH", sizes.stack_copy_scratch)
            .map_max_entries("UNWIND_ROWS", sizes.unwind_rows)
            .map_max_entries("UNWIND_PROCESSES", sizes.unwind_processes)
            .map_max_entries("UNWIND_FILES", sizes.unwind_files);
        let mut ebpf = loader.load(PROGRAM_OBJECT).map_err(load_error)?;
        let program: &mut PerfEvent = ebpf
            .program_mut(SAMPLE_PROGRAM)
            .ok_or_else(|| anyhow!("the capture program has no {SAMPLE_PROGRAM}"))?
            .try_into()?;
        // The verifier log tells what the kernel refused: keep it in the error.
        program
            .load()
            .map_err(|e| anyhow!("the kernel verifier rejected the capture program: {e:?}"))?;
        let unwinder = match config.flags & CAPTURE_UNWIND_DWARF {
            0 => None,
            _ => Some(load_unwinder(&mut ebpf)?),
        };
        let offcpu = match offcpu {
            Some((config, attachment)) => {
                Some(OffCpuCapture::load(&mut ebpf, &config, attachment)?)
            }
            None => None,
        };
        drop(loader);
        // Attaching the off-CPU programs to BTF tracepoints parsed the kernel's BTF, about 19
        // MB of short-lived allocations here.
        if offcpu.is_some() {
            crate::heap::release_free_pages();
        }
        let generations = [
            take_generation(&mut ebpf, 0)?,
            take_generation(&mut ebpf, 1)?,
        ];
        Ok(CaptureProgram {
            generations,
            stack_frames: take(&mut ebpf, "STACK_FRAMES")?,
            control: take(&mut ebpf, "CONTROL")?,
            inflight: take(&mut ebpf, "INFLIGHT")?,
            new_keys: take(&mut ebpf, "NEW_KEYS")?,
            samples_fired: take(&mut ebpf, "SAMPLES_FIRED")?,
            samples_filtered: take(&mut ebpf, "SAMPLES_FILTERED")?,
            period_sums: take(&mut ebpf, "PERIOD_SUMS")?,
            losses: take(&mut ebpf, "LOSSES")?,
            event_ids: take(&mut ebpf, "EVENT_IDS")?,
            cgroup_filter: take(&mut ebpf, "CGROUP_FILTER")?,
            raw_samples: Some(take(&mut ebpf, "RAW_SAMPLES")?),
            ibs_samples: Some(take(&mut ebpf, "IBS_SAMPLES")?),
            stack_copies: Some(take(&mut ebpf, "STACK_COPIES")?),
            drain_requests: Some(take(&mut ebpf, "DRAIN_REQUESTS")?),
            _unwinder: unwinder,
            offcpu,
            ebpf,
        })
    }

    fn program(&self) -> Result<&PerfEvent> {
        Ok(self
            .ebpf
            .program(SAMPLE_PROGRAM)
            .ok_or_else(|| anyhow!("the capture program has no {SAMPLE_PROGRAM}"))?
            .try_into()?)
    }

    /// Runs the program on every overflow of `counter` (PERF_EVENT_IOC_SET_BPF). Inherited
    /// child counters (threads, children) run it too.
    pub fn attach(&self, counter: &mut Counter) -> Result<()> {
        let fd = self.program()?.fd()?.as_fd().as_raw_fd();
        counter
            .set_bpf(fd)
            .context("attaching the capture program to a perf event (PERF_EVENT_IOC_SET_BPF)")
    }

    /// Attaches the scheduler-switch programs (`--off-cpu`), once their scope is in place.
    pub fn attach_offcpu(&mut self) -> Result<()> {
        match &mut self.offcpu {
            Some(offcpu) => offcpu.attach(&mut self.ebpf),
            None => Ok(()),
        }
    }

    /// Detaches the scheduler-switch programs (see [`OffCpuCapture::detach`]).
    pub fn detach_offcpu(&mut self) -> Result<()> {
        match &mut self.offcpu {
            Some(offcpu) => offcpu.detach(&mut self.ebpf),
            None => Ok(()),
        }
    }

    /// Maps a perf event id to the index of its event, so samples are tagged with their event.
    pub fn register_event(&mut self, perf_event_id: u64, index: u32) -> Result<()> {
        self.event_ids
            .insert(perf_event_id, index, 0)
            .context("registering a perf event id with the capture program")
    }

    /// Keeps only samples of these cgroups (with `CAPTURE_FILTER_CGROUP`).
    pub fn filter_cgroups(&mut self, cgroup_ids: &[u64]) -> Result<()> {
        for id in cgroup_ids {
            self.cgroup_filter
                .insert(id, 1, 0)
                .context("filling the cgroup filter map")?;
        }
        Ok(())
    }

    /// A ring buffer of the program, handed to its reader once.
    pub fn take_ring(&mut self, ring: Ring) -> Result<RingBuf<MapData>> {
        let slot = match ring {
            Ring::RawSamples => &mut self.raw_samples,
            Ring::IbsSamples => &mut self.ibs_samples,
            Ring::DrainRequests => &mut self.drain_requests,
            Ring::StackCopies => &mut self.stack_copies,
        };
        slot.take()
            .ok_or_else(|| anyhow!("the {ring:?} ring buffer was already taken"))
    }

    /// The program's map `name`, handed once to the stage that fills or reads it (the
    /// unwinder's, `--unwind dwarf`): as a typed map, or as the [`aya::maps::Map`] itself.
    pub fn take_map<T>(&mut self, name: &str) -> Result<T>
    where
        T: TryFrom<aya::maps::Map>,
        T::Error: std::error::Error + Send + Sync + 'static,
    {
        take(&mut self.ebpf, name)
    }

    /// The kernel's run-time statistics of every program loaded (those of another attachment
    /// are not), by name. Zero unless `kernel.bpf_stats_enabled` is 1.
    pub fn run_statistics(&self) -> Result<Vec<ProgramRuns>> {
        let mut programs = Vec::new();
        for (name, program) in self.ebpf.programs() {
            let info = match program.info() {
                Ok(info) => info,
                Err(ProgramError::NotLoaded) => continue,
                Err(e) => return Err(e).context(format!("reading program {name}'s statistics")),
            };
            programs.push(ProgramRuns {
                name: name.to_string(),
                runs: info.run_count(),
                run_time: info.run_time(),
            });
        }
        Ok(programs)
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK (64 KiB by default), where the maps
/// would fail to load; later ones charge the memory cgroup and ignore the limit. Raised as far
/// as this process may (no limit with CAP_SYS_RESOURCE, else to the hard limit), as libbpf does.
fn lift_memlock_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) and setrlimit(2) with a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) != 0 {
            return;
        }
        let unlimited = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) != 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit);
        }
    }
}
