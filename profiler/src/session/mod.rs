//! One capture session, the same for `record` and `agent`: it opens the program, the counters
//! and the side-band, ticks (side-band records, ring buffers, drains on schedule and early when
//! any map fills) until the run stops, and closes windows: what was sampled since the last
//! window, the accounting over it and the processes its samples reference. `record` is one
//! window ([`CaptureSession::finish`], which drains what is left after the counters stop); the
//! agent closes one per interval ([`CaptureSession::close_window`]). What it takes in is
//! [`CaptureOptions`], sized by [`map_sizes`]; what it hands over is a [`Capture`].

mod capture;
mod config;
mod cost;
pub mod map_sizes;
mod options;
mod privileges;
mod raw;

pub use self::capture::{Capture, SessionEnd};
pub use self::options::{CaptureOptions, Unwind};

use std::{
    collections::HashSet,
    time::{Duration, SystemTime},
};

use anyhow::{anyhow, Context, Result};
use profiler_common::{
    capture::{
        CaptureConfig, LossKind, StackCopyRecord, CAPTURE_EVENT_IDS, CAPTURE_FILTER_CGROUP,
        CAPTURE_FILTER_UID, CAPTURE_TABLES_BY_FILE, CAPTURE_UNWIND_DWARF, MAX_EVENTS,
    },
    offcpu::OffCpuCount,
};
use tokio::time::{interval, Instant, Interval};

use crate::{
    capture::{
        aux_trace::AuxTrace,
        counters::{open_sampling_counters, EventCounter, Target},
        hardware::{
            cpu_identity, exact_ip, hardware_sampler, raw_decoding, records_data_addresses,
            samples_latency, spe_period, HardwareSampler,
        },
        offcpu::offcpu_config,
        program::{CaptureProgram, Ring},
        sideband::Sideband,
        stats::{CaptureStats, MapMemory},
    },
    drain::{
        ibs::IbsStream, offcpu::DrainedOffCpu, read_accounting, spe::SpeStream,
        stack_copy::StackCopyStream, Accounting, Drained, Drainer,
    },
    events::{count::Count, EventSpec, Sampling, SystemFacts},
    launch::{resolve_program, spawn_stopped, Run, Stop, StopSignals, TargetSpec},
    process::{parse_maps_line, ProcessTable, Settle},
    profile::{CpuIdentity, EventInfo},
    symbolize::ReadAhead,
    unwind::loader::UnwindLoader,
};

use self::{
    config::capture_config,
    cost::{enable_run_statistics, held_map_memory},
    map_sizes::MapNeeds,
    privileges::check_privileges,
    raw::RawStream,
};

/// How often `record` reads the side-band records (new mappings, exec, exit). Each read also
/// publishes new processes to the unwinder and checks the maps' fill: under churn, reading
/// every 50 ms cost an always-on agent at 99 Hz about 15% more CPU than every 100 ms. A process
/// the program samples before a read asks for its tables at once (when launched or followed),
/// or is walked by frame pointers until the read (system-wide).
pub const SIDEBAND_INTERVAL: Duration = Duration::from_millis(100);

/// The agent's: always on, its CPU counts for more than how soon a new process's stacks are
/// walked by its tables. Under churn at 99 Hz reading every 250 ms cut the agent's steady CPU
/// by about 14% against 100 ms (0.80-0.85% of a core to 0.69-0.75%); the side-band's 512 KiB a
/// CPU still hold about 2,500 new processes a second a CPU at that pace.
pub const AGENT_SIDEBAND_INTERVAL: Duration = Duration::from_millis(250);

pub struct CaptureSession {
    config: CaptureConfig,
    events: Vec<EventInfo>,
    cpu: Option<CpuIdentity>,
    /// Closed before the program: each holds it loaded, and it should be gone when its program
    /// arrays close (see `maps::TailCalls`).
    counters: Vec<EventCounter>,
    program: CaptureProgram,
    drainer: Drainer,
    unwinder: Option<UnwindLoader>,
    raw: Option<RawStream>,
    ibs: Option<IbsStream>,
    /// The Arm SPE event's AUX trace.
    spe: Option<SpeStream>,
    stack_copies: Option<StackCopyStream>,
    sideband: Sideband,
    processes: ProcessTable,
    drained: Drained,
    run: Run,
    /// `--duration`, counted from the start.
    duration: Option<Duration>,
    map_memory: MapMemory,
    /// What the maps would lock on a large host (see [`CaptureStats::host_map_memory`]).
    host_map_memory: u64,
    host_sample_entries: Option<u32>,
    /// While held, the kernel counts the program's runs and run time (`--stats`).
    _run_statistics: Option<std::os::fd::OwnedFd>,
    start: SystemTime,
    window_start: SystemTime,
    /// The cumulative accounting when the last window closed.
    closed: Accounting,
    /// The switch programs' cumulative counters when the last window closed.
    off_cpu_closed: [u64; OffCpuCount::COUNT],
    ticker: Interval,
    sideband_ticker: Interval,
    /// The process table's change counter read before the last scheduled drain: the processes
    /// that had exited by then have every sample drained (see
    /// [`ProcessTable::forget_unsampled`]).
    exited_by_last_drain: u64,
}

impl CaptureSession {
    /// Loads the program, opens the side-band and the counters (a launched command is started,
    /// stopped before its exec) and attaches them; nothing is sampled before
    /// [`CaptureSession::start`].
    pub fn open(options: &CaptureOptions) -> Result<CaptureSession> {
        if options.events.is_empty() || options.events.len() > MAX_EVENTS {
            return Err(anyhow!("record takes 1 to {MAX_EVENTS} events"));
        }
        if options.events.len() > 1 && options.offsets.is_none() {
            return Err(anyhow!(
                "sampling several events at once needs kernel BTF (/sys/kernel/btf/vmlinux) to \
                 tell their samples apart: sample one event per run on this kernel"
            ));
        }
        for note in check_privileges(options)? {
            eprintln!("note: {note}");
        }
        let config = capture_config(options);
        let facts = SystemFacts::read(&options.pmus);
        let run_statistics = options.stats.then(enable_run_statistics).flatten();
        let cpu = cpu_identity();
        let raw_decoding = raw_decoding(&options.events, cpu.as_ref());
        let ibs_events = raw_decoding.ibs_events() != 0;
        // Data mappings and data lines only where an event records data addresses.
        let data_addresses = options.events.iter().any(records_data_addresses);
        let sizes = options.sizes.fitted(MapNeeds {
            latencies: samples_latency(&options.events),
            data_addresses,
            raw: options.raw.is_some(),
            ibs: ibs_events,
            stack_copies: options.stack_copy_kib.is_some(),
            instructions: options.per_instruction,
        });
        let cpus = aya::util::online_cpus()
            .map_err(|(what, e)| anyhow!("counting online CPUs ({what}): {e}"))?
            .len();
        let config = CaptureConfig {
            drain_request_steps: sizes.maps.drain_request_steps(cpus),
            ..config
        };
        let offcpu = options.off_cpu.map(|off_cpu| {
            offcpu_config(
                &off_cpu,
                options.target == TargetSpec::System,
                config.flags & CAPTURE_UNWIND_DWARF != 0,
            )
        });
        let mut program = CaptureProgram::load(&config, &raw_decoding, &sizes.maps, offcpu)?;
        let drainer = Drainer::new(&mut program, sizes.maps)?;
        program.filter_cgroups(&options.cgroups)?;
        let unwinder = match config.flags & CAPTURE_UNWIND_DWARF {
            0 => None,
            _ => {
                let mut unwinder = UnwindLoader::for_program(
                    &mut program,
                    options.memory_budget,
                    config.flags & CAPTURE_TABLES_BY_FILE != 0,
                )?;
                unwinder.preload(&files_to_preload(&options.target))?;
                Some(unwinder)
            }
        };
        let mut map_memory = held_map_memory();
        // The stack-copy scratch array has an entry per possible CPU.
        if sizes.maps.stack_copy_scratch > 1 {
            map_memory.per_cpu += std::mem::size_of::<StackCopyRecord>() as u64;
        }
        let host_map_memory = sizes.on_host(&map_memory, data_addresses);
        let raw = match &options.raw {
            Some(output) => Some(RawStream::create(
                output,
                program.take_ring(Ring::RawSamples)?,
            )?),
            None => None,
        };
        let ibs = match ibs_events {
            true => Some(IbsStream::new(
                program.take_ring(Ring::IbsSamples)?,
                raw_decoding,
            )?),
            false => None,
        };
        let stack_copies = match options.stack_copy_kib {
            Some(_) => Some(StackCopyStream::new(program.take_ring(Ring::StackCopies)?)?),
            None => None,
        };

        let command = match &options.target {
            TargetSpec::Command(argv) => Some(spawn_stopped(argv)?),
            _ => None,
        };
        let (target, pids) = match (&options.target, &command) {
            (TargetSpec::Command(_), Some(stopped)) => (Target::Command(stopped.pid()?), vec![]),
            (TargetSpec::Processes(pids), _) => (Target::Processes(pids.clone()), pids.clone()),
            _ => (Target::System, vec![]),
        };
        if let Some(offcpu) = &mut program.offcpu {
            match &target {
                Target::Command(pid) => offcpu.add_to_scope(&[*pid])?,
                Target::Processes(pids) => offcpu.add_to_scope(pids)?,
                Target::System => {}
            }
        }
        let sideband = Sideband::open(&target, &options.pmus, &facts, data_addresses)?;
        let spe = open_spe(&options.events, &target, &facts, options.raw.is_some())?;
        let mut counters =
            open_sampling_counters(&options.events, &target, options.stacks, &facts)?;
        for counter in &mut counters {
            program.attach(&mut counter.counter)?;
            if config.flags & CAPTURE_EVENT_IDS != 0 {
                program.register_event(counter.counter.id(), counter.event)?;
            }
        }
        let now = SystemTime::now();
        Ok(CaptureSession {
            config,
            events: options.events.iter().map(event_info).collect(),
            cpu,
            program,
            drainer,
            unwinder,
            raw,
            ibs,
            spe,
            stack_copies,
            sideband,
            counters,
            processes: ProcessTable::new(options.stack_copy_kib.is_none()),
            drained: Drained::default(),
            run: Run::new(command, pids),
            duration: options.duration,
            map_memory,
            host_map_memory,
            host_sample_entries: sizes.host_sample_entries,
            _run_statistics: run_statistics,
            start: now,
            window_start: now,
            closed: Accounting::default(),
            off_cpu_closed: [0; OffCpuCount::COUNT],
            ticker: interval(options.drain_interval),
            sideband_ticker: interval(options.sideband_interval),
            exited_by_last_drain: 0,
        })
    }

    /// Starts sampling: releases the launched command (its counters start at its exec), or
    /// reads the running processes and enables the counters.
    pub async fn start(&mut self, target: &TargetSpec) -> Result<()> {
        self.start = SystemTime::now();
        self.window_start = self.start;
        if let Some(stopped) = &mut self.run.command {
            // Nothing in scope forks before the command is released.
            self.program.attach_offcpu()?;
            // Counters with enable_on_exec start when the command execs, which this releases.
            stopped.release()?;
        } else {
            // The side-band first, then /proc: a process that starts or maps code in between
            // is in both, and the table keeps one copy.
            self.sideband.enable()?;
            // A running process forks into off-CPU scope from here, and the side-band already
            // sees its children: attached earlier, a child gone before the side-band was enabled
            // would be counted without a name.
            self.program.attach_offcpu()?;
            match target {
                TargetSpec::Processes(pids) => pids
                    .iter()
                    .for_each(|pid| self.processes.scan_process_tree(*pid)),
                _ => self.processes.scan_all(),
            }
            self.sync_unwinder()?;
            for counter in &mut self.counters {
                counter.counter.enable()?;
            }
            if let Some(spe) = &mut self.spe {
                spe.enable()?;
            }
        }
        self.run.begin(self.duration);
        // The first tick of a tokio interval is immediate.
        self.ticker.tick().await;
        self.sideband_ticker.tick().await;
        Ok(())
    }

    /// The events sampled, as reports describe them.
    pub fn events(&self) -> &[EventInfo] {
        &self.events
    }

    /// The CPU the samples were taken on (model, for hardware event names).
    pub fn cpu(&self) -> Option<CpuIdentity> {
        self.cpu.clone()
    }

    fn read_sideband(&mut self) {
        self.sideband.read_into(&mut self.processes);
    }

    fn sync_unwinder(&mut self) -> Result<()> {
        match &mut self.unwinder {
            Some(unwinder) => unwinder.sync(&self.processes),
            None => Ok(()),
        }
    }

    /// Captures until `until` (then `Ok(None)`) or until the run stops (`Ok(Some(stop))`).
    pub async fn run_until(
        &mut self,
        until: Option<Instant>,
        signals: &mut StopSignals,
    ) -> Result<Option<Stop>> {
        loop {
            if let Some(stop) = self.tick(until, signals).await? {
                return Ok(Some(stop));
            }
            if until.is_some_and(|until| Instant::now() >= until) {
                return Ok(None);
            }
        }
    }

    /// Waits for the next thing to do and does it; `Some(stop)` when the run stops.
    async fn tick(
        &mut self,
        until: Option<Instant>,
        signals: &mut StopSignals,
    ) -> Result<Option<Stop>> {
        let CaptureSession {
            program,
            drainer,
            unwinder,
            raw,
            ibs,
            spe,
            stack_copies,
            sideband,
            processes,
            drained,
            run,
            ticker,
            sideband_ticker,
            exited_by_last_drain,
            ..
        } = self;
        let raw_ready = async {
            match raw {
                Some(stream) => stream.readable().await,
                None => std::future::pending().await,
            }
        };
        let ibs_ready = async {
            match ibs {
                Some(stream) => stream.readable().await,
                None => std::future::pending().await,
            }
        };
        let stack_copies_ready = async {
            match stack_copies {
                Some(stream) => stream.readable().await,
                None => std::future::pending().await,
            }
        };
        let unwind_requested = async {
            match unwinder {
                Some(unwinder) => unwinder.requested().await,
                None => std::future::pending().await,
            }
        };
        let window_end = async {
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        /// What woke the session, acted on once the select's borrows are over.
        enum Wake {
            Sideband,
            UnwindRequest(std::io::Result<()>),
            DrainRequest(std::io::Result<()>),
            Drain,
            Raw(std::io::Result<()>),
            Ibs(std::io::Result<()>),
            StackCopies(std::io::Result<()>),
            Run(crate::launch::RunEvent),
            WindowEnd,
        }
        let wake = tokio::select! {
            // Mappings are read often so their files are opened while short-lived processes
            // live.
            _ = sideband_ticker.tick() => Wake::Sideband,
            requested = unwind_requested => Wake::UnwindRequest(requested),
            requested = drainer.requested() => Wake::DrainRequest(requested),
            _ = ticker.tick() => Wake::Drain,
            ready = raw_ready => Wake::Raw(ready),
            ready = ibs_ready => Wake::Ibs(ready),
            ready = stack_copies_ready => Wake::StackCopies(ready),
            event = run.next(signals) => Wake::Run(event),
            _ = window_end => Wake::WindowEnd,
        };
        match wake {
            Wake::Sideband | Wake::Drain => {
                sideband.read_into(processes);
                if let Some(unwinder) = unwinder {
                    unwinder.sync(processes)?;
                }
                // The program wakes us only when the IBS ring is half full.
                if let Some(stream) = ibs {
                    stream.read_into(&mut drained.hardware)?;
                }
                if let Some(stream) = spe {
                    stream.read_into(drained);
                }
                // Unwound while the mappings just read are the processes' own.
                if let Some(stream) = stack_copies {
                    stream.read_into(processes, drained)?;
                }
                if matches!(wake, Wake::Drain) {
                    let exited_by = processes.last_change();
                    drainer.drain(program, drained)?;
                    // A drain later than the one that found them exited: an off-CPU block
                    // ends (and names its waker) only when the woken thread runs again.
                    let sampled = drained.referenced_processes();
                    processes.forget_unsampled(*exited_by_last_drain, &sampled);
                    processes.settle_short_lives(&sampled, Settle::AfterDrain);
                    *exited_by_last_drain = exited_by;
                } else {
                    drainer.drain_if_filling(program, drained)?;
                }
                if let Some(stop) = run.targets_exited() {
                    return Ok(Some(stop));
                }
            }
            Wake::UnwindRequest(requested) => {
                requested.context("waiting on the unwinder's requests")?;
                sideband.read_into(processes);
                if let Some(unwinder) = unwinder {
                    unwinder.sync(processes)?;
                }
            }
            Wake::DrainRequest(requested) => {
                requested.context("waiting on the capture program's drain requests")?;
                drainer.drain_if_filling(program, drained)?;
            }
            Wake::Raw(ready) => {
                ready.context("waiting on the raw sample ring buffer")?;
                if let Some(stream) = raw {
                    stream.write_ready()?;
                }
            }
            Wake::Ibs(ready) => {
                ready.context("waiting on the IBS ring buffer")?;
                if let Some(stream) = ibs {
                    stream.read_into(&mut drained.hardware)?;
                }
            }
            Wake::StackCopies(ready) => {
                ready.context("waiting on the stack-copy ring buffer")?;
                sideband.read_into(processes);
                if let Some(stream) = stack_copies {
                    stream.read_into(processes, drained)?;
                }
            }
            Wake::Run(event) => return run.act(event).await,
            Wake::WindowEnd => {}
        }
        Ok(None)
    }

    /// Sends `ahead` the code of the stacks drained since its last call, while their
    /// processes' mappings are at hand.
    pub fn read_ahead(&self, ahead: &mut ReadAhead) {
        ahead.send_new_stacks(&self.drained, &self.processes);
    }

    /// The cumulative accounting: the program's counters, and the losses of the streams the
    /// agent reads (stack copies, IBS registers).
    fn accounting(&mut self) -> Result<Accounting> {
        let mut accounting = read_accounting(&self.program, self.events.len())?;
        // A filter drops samples of what the counters still count: their totals would not
        // match.
        if self.config.flags & (CAPTURE_FILTER_CGROUP | CAPTURE_FILTER_UID) == 0 {
            accounting.event_counts = event_counts(&mut self.counters, self.events.len())?;
        }
        if let Some(stream) = &self.ibs {
            accounting.losses[LossKind::IbsRegistersUnreadable as usize] += stream.unreadable();
        }
        if let Some((event, counts)) = self.spe.as_ref().map(|s| (s.event(), s.counts())) {
            // Every record read is a sample fired; the damaged ones are lost whole.
            accounting.samples_fired[event as usize] += counts.records + counts.damaged;
            counts.add_losses(&mut accounting.losses);
            // No counter counts SPE's operations: no event's exact count is claimed.
            accounting.event_counts.clear();
        }
        if let Some(stream) = &self.stack_copies {
            for (total, walks) in accounting.losses.iter_mut().zip(stream.losses()) {
                *total += walks;
            }
        }
        // The in-kernel walker's stacks cut short; with `--unwind check` the copies of those
        // walks are only compared, never counted above.
        if let Some(unwinder) = &self.unwinder {
            for (kind, walks) in unwinder.losses() {
                accounting.losses[kind as usize] += walks;
            }
        }
        Ok(accounting)
    }

    /// Closes the window that began at the last close (or the start): drains it and hands over
    /// its samples, the processes they reference and its accounting; processes that exited
    /// before it closed are forgotten, since no later window can sample them.
    pub fn close_window(&mut self) -> Result<Capture> {
        // Exits read before the drain: every sample of those processes is drained below.
        self.read_sideband();
        self.sync_unwinder()?;
        let mut exited = self.processes.exited();
        if let Some(stream) = &mut self.ibs {
            stream.read_into(&mut self.drained.hardware)?;
        }
        if let Some(stream) = &mut self.spe {
            stream.read_into(&mut self.drained);
        }
        if let Some(stream) = &mut self.stack_copies {
            stream.read_into(&self.processes, &mut self.drained)?;
        }
        // Read before the generation flips: a sample fired after this read is counted in the
        // next window, where its generation is drained. Only one fired between this read and
        // the flip (microseconds apart) is drained here and counted in the next window.
        let accounting = self.accounting()?;
        self.close_off_cpu()?;
        let pending = match &self.program.offcpu {
            Some(offcpu) => offcpu.pending_stacks()?,
            None => Vec::new(),
        };
        self.drainer.drain(&mut self.program, &mut self.drained)?;
        self.compare_unwinders();
        let end = SystemTime::now();
        let sampled = self.drained.referenced_processes();
        // Gone before the drain, like the processes in `exited`.
        exited.extend(
            self.processes
                .settle_short_lives(&sampled, Settle::WindowClosed),
        );
        self.learn_wakers();
        let start = self.window_start;
        let (drained, accounting) = self.take_drained(accounting, end, pending);
        let processes = self.processes.close_window(&sampled, &exited);
        Ok(Capture {
            start,
            end,
            drained,
            processes,
            accounting,
            programs: self.program.run_statistics()?,
            unwind_tables: self.unwinder.as_ref().map(UnwindLoader::loaded),
        })
    }

    /// A copy of what was drained since the last window closed (a recording's whole run), with
    /// the processes it references and its accounting, the session going on: `record --live`
    /// shows it while the recording keeps every sample for its profile.
    pub fn snapshot(&mut self) -> Result<Capture> {
        self.read_sideband();
        let accounting = self.accounting()?.since(&self.closed);
        let offcpu = &self.drained.offcpu;
        let drained = Drained {
            stacks: self.drained.stacks.clone(),
            stack_cache: self.drained.stack_cache.clone(),
            offcpu: DrainedOffCpu {
                blocks: offcpu.blocks.clone(),
                attachment: offcpu.attachment,
                min_block_ns: offcpu.min_block_ns,
                ..DrainedOffCpu::default()
            },
            ..Drained::default()
        };
        let processes = self.processes.snapshot(&drained.referenced_processes());
        Ok(Capture {
            start: self.window_start,
            end: SystemTime::now(),
            drained,
            processes,
            accounting,
            programs: self.program.run_statistics()?,
            unwind_tables: None,
        })
    }

    /// `--unwind check`: compares the stack copies read so far with the kernel's walks drained.
    fn compare_unwinders(&mut self) {
        if let Some(stream) = &mut self.stack_copies {
            stream.compare_drained(&self.drained.stack_cache, &self.processes);
        }
    }

    /// `--wakers`: a waker outside the scope is in no side-band record; read from /proc while
    /// it may still run, so that its name and its user stack's code are known.
    fn learn_wakers(&mut self) {
        let wakers: std::collections::BTreeSet<u32> = self
            .drained
            .offcpu
            .blocks
            .keys()
            .map(|key| key.waker.pid)
            .filter(|pid| *pid != 0 && !self.processes.knows(*pid))
            .collect();
        for pid in wakers {
            self.processes.scan_process(pid);
        }
    }

    /// The off-CPU side of the window closing now: the switch programs' counters since the last
    /// close (read with the accounting, before the drain), and how the switches were seen.
    fn close_off_cpu(&mut self) -> Result<()> {
        let Some(offcpu) = &self.program.offcpu else {
            return Ok(());
        };
        let counts = offcpu.read_counts()?;
        let window = &mut self.drained.offcpu;
        for ((count, total), closed) in window
            .counts
            .iter_mut()
            .zip(counts)
            .zip(self.off_cpu_closed)
        {
            *count = total - closed;
        }
        self.off_cpu_closed = counts;
        window.attachment = Some(offcpu.attachment.describe());
        window.min_block_ns = offcpu.min_block_ns;
        Ok(())
    }

    /// Moves what was drained since the last window into a window ending at `end`, with the
    /// accounting over it (`accounting` is the cumulative one at its close).
    /// `pending`: the stacks of off-CPU blocks still running, read before the window's last
    /// drain (a block that ends after that read is drained with them kept).
    fn take_drained(
        &mut self,
        accounting: Accounting,
        end: SystemTime,
        pending: Vec<u64>,
    ) -> (Drained, Accounting) {
        let mut drained = std::mem::take(&mut self.drained);
        // Off-CPU blocks carry stacks of their own, often never sampled on the CPU.
        let referenced: HashSet<u64> = drained
            .kernel_stacks()
            .chain(drained.user_stacks().map(|(_, hash)| hash))
            .collect();
        // The window gets the frames it references; the cache lives across windows.
        let mut cache = std::mem::take(&mut drained.stack_cache);
        drained.stack_cache = cache.subset(referenced.iter().copied());
        let mut keep = referenced;
        keep.extend(pending);
        cache.forget_cold(&keep);
        self.drained.stack_cache = cache;
        let mut window = accounting.since(&self.closed);
        // Agent-counted losses (stack hash collisions) are the window's own.
        for (total, counted) in window.losses.iter_mut().zip(drained.losses) {
            *total += counted;
        }
        self.closed = accounting;
        self.window_start = end;
        (drained, window)
    }

    /// Stops sampling and drains everything left: the last window, with the whole process
    /// table (a recording's profile file keeps the code and data of every process in it), and
    /// how the run ended and what it cost.
    pub fn finish(mut self, stop: Stop) -> Result<(Capture, SessionEnd)> {
        for counter in &mut self.counters {
            counter.counter.disable()?;
        }
        if let Some(spe) = &mut self.spe {
            spe.disable()?;
        }
        // Before the side-band stops: a thread forked after it would be counted nameless.
        self.program.detach_offcpu()?;
        self.sideband.disable()?;
        let end = SystemTime::now();
        self.read_sideband();
        self.drainer
            .drain_all(&mut self.program, &mut self.drained)?;
        let mut failures = Vec::new();
        if let Some(stream) = &mut self.raw {
            failures.extend(stream.finish()?);
        }
        if let Some(stream) = &mut self.ibs {
            stream.finish(&mut self.drained.hardware)?;
        }
        if let Some(stream) = &mut self.spe {
            stream.read_into(&mut self.drained);
        }
        if let Some(stream) = &mut self.stack_copies {
            stream.finish(&self.processes, &mut self.drained)?;
        }
        self.compare_unwinders();
        let accounting = self.accounting()?;
        let programs = self.program.run_statistics()?;
        let stats = CaptureStats {
            programs: programs.clone(),
            map_memory: self.map_memory,
            host_map_memory: (self.host_map_memory, self.host_sample_entries),
            drain_time: self.drainer.drain_time,
            drains: self.drainer.drains,
            stacks_cached: self.drained.stack_cache.distinct() as u64,
            stacks_read: self.drainer.frames_map.read,
            raw_samples_written: self.raw.as_ref().map_or(0, RawStream::written),
            unwind: self.unwinder.as_ref().map(UnwindLoader::render_stats),
            unwind_check: self
                .stack_copies
                .as_ref()
                .filter(|_| self.config.flags & CAPTURE_UNWIND_DWARF != 0)
                .map(|stream| stream.comparison().render()),
        };
        self.close_off_cpu()?;
        self.processes
            .settle_short_lives(&self.drained.referenced_processes(), Settle::WindowClosed);
        self.learn_wakers();
        let start = self.window_start;
        // Nothing is drained after this: no stack needs keeping.
        let (drained, accounting) = self.take_drained(accounting, end, Vec::new());
        let capture = Capture {
            start,
            end,
            drained,
            processes: std::mem::take(&mut self.processes),
            accounting,
            programs,
            // The session is over: the agent's gauges keep the last full window's.
            unwind_tables: None,
        };
        let session_end = SessionEnd {
            events: self.events,
            cpu: self.cpu,
            stats,
            ending: self.run.ending(stop),
            failures,
        };
        Ok((capture, session_end))
    }
}

/// What the sampling counters counted, per event: each counter's reading (inherited children
/// included) scaled for multiplexing, summed over its placements.
///
/// A clock counts the nanoseconds it runs, so its count is at most its running time. The
/// kernel's task-clock overshoots that when its timer is saturated (every 10 us: 1.1 to 6
/// times its running time here, exact from 20 us up), which would inflate every estimate.
fn event_counts(counters: &mut [EventCounter], events: usize) -> Result<Vec<u64>> {
    let mut totals = vec![0u64; events];
    for counter in counters {
        let reading = counter
            .counter
            .read_count_and_time()
            .context("reading a sampling counter's count")?;
        let raw = if counter.clock {
            reading.count.min(reading.time_running)
        } else {
            reading.count
        };
        let count = Count::from_reading(raw, reading.time_enabled, reading.time_running);
        totals[counter.event as usize] += count.estimate;
    }
    Ok(totals)
}

/// What reports say about an event.
fn event_info(spec: &EventSpec) -> EventInfo {
    let (period, frequency) = match spec.sampling {
        Sampling::Period(period) => (Some(period), None),
        Sampling::Frequency(hz) => (None, Some(hz)),
    };
    EventInfo {
        name: spec.report_name(),
        period,
        frequency,
        unit: spec.unit.clone(),
        precise: exact_ip(spec),
    }
}

/// The Arm SPE event among `events`, opened for `target`: one at most (a CPU has one SPE unit),
/// and not with `--raw` (`raw`), whose stream holds the samples the capture program takes.
fn open_spe(
    events: &[EventSpec],
    target: &Target,
    facts: &SystemFacts,
    raw: bool,
) -> Result<Option<SpeStream>> {
    let mut spe = events
        .iter()
        .enumerate()
        .filter(|(_, event)| hardware_sampler(event) == HardwareSampler::Spe);
    let Some((index, event)) = spe.next() else {
        return Ok(None);
    };
    if let Some((_, second)) = spe.next() {
        return Err(anyhow!(
            "cannot sample '{}' beside '{}': a CPU has one SPE unit, which samples one event \
             at a time; give one SPE event per run (its filters select loads, stores or branches)",
            second.name,
            event.name
        ));
    }
    if raw {
        return Err(anyhow!(
            "cannot stream '{}' with --raw: the raw stream holds the samples the capture \
             program takes, and Arm SPE's records are read from its AUX trace instead; record \
             SPE without --raw (its records are in the profile's instruction, data-line, \
             latency and --hardware views)",
            event.name
        ));
    }
    spe_period(event)?;
    let trace = AuxTrace::open(event, target, facts)?;
    Ok(Some(SpeStream::new(trace, index as u32, target)))
}

/// The files whose unwind tables are placed before the capture starts: the command's program,
/// and the shared libraries the profiler maps itself (the C library and the dynamic loader,
/// which nearly every process maps too), so that a process's first samples and blocks are
/// walked by tables.
fn files_to_preload(target: &TargetSpec) -> Vec<std::path::PathBuf> {
    let own_maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let own_program = std::fs::read_link("/proc/self/exe").ok();
    let mut paths: Vec<std::path::PathBuf> = own_maps
        .lines()
        .filter_map(parse_maps_line)
        .filter(|mapping| mapping.executable && mapping.is_file())
        .map(|mapping| std::path::PathBuf::from(&*mapping.path))
        .filter(|path| Some(path) != own_program.as_ref())
        .collect();
    if let TargetSpec::Command(argv) = target {
        paths.extend(argv.first().and_then(|program| resolve_program(program)));
    }
    paths.dedup();
    paths
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{parse_event, pmu::tests::sysfs_fixture, PmuRegistry};

    #[test]
    fn one_spe_event_at_a_time_and_not_in_the_raw_stream() {
        let root = sysfs_fixture(&[
            ("arm_spe_0/type", "9"),
            ("arm_spe_0/format/load_filter", "config:33"),
        ]);
        let pmus = PmuRegistry::from_sysfs(root.path()).unwrap();
        let events = [
            parse_event("arm_spe_0//", &pmus).unwrap(),
            parse_event("arm_spe_0/load_filter/", &pmus).unwrap(),
        ];
        let err = |events: &[EventSpec], raw| {
            open_spe(events, &Target::System, &SystemFacts::default(), raw)
                .err()
                .unwrap()
                .to_string()
        };
        let two = err(&events, false);
        assert!(
            two.starts_with("cannot sample 'arm_spe_0/load_filter/' beside 'arm_spe_0//'"),
            "{two}"
        );
        let raw = err(&events[..1], true);
        assert!(
            raw.starts_with("cannot stream 'arm_spe_0//' with --raw"),
            "{raw}"
        );
    }
}
