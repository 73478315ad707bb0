//! Counting counters (no sampling) over a scope, for `stat` and overflow calibration: one per
//! (event, CPU) system-wide; one per (event, thread) for processes, or per (event, CPU) of a task
//! with `--per-cpu`; inherited into the threads and children the target starts.
//!
//! Per-thread counts. An inherited counter reads the sum over the thread it was opened on and
//! every thread started from it. With `inherit_stat` the kernel also writes a started thread's
//! own final count into the counter's ring buffer (PERF_RECORD_READ, tagged with the counter's
//! id) when the thread exits. The thread left holding the counters the profiler opened (the
//! kernel swaps counter contexts between a thread and those it started) and threads still
//! running at the end get no such record: their counts are the reading minus the exit records
//! ([`mod@super::assemble`]). The kernel refuses ring buffers on inherited counters that follow a
//! task on any CPU, so in this mode every counter is opened per CPU; each CPU's counters form
//! one group behind a side-band dummy counter that records thread creation and names
//! (PERF_RECORD_FORK, COMM), and every group on a CPU writes into one ring
//! (PERF_EVENT_IOC_SET_OUTPUT): one ring per CPU, whatever the number of events and threads.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::os::fd::AsRawFd;

use anyhow::{anyhow, bail, Context, Result};
use perf_event::data::Record;
use perf_event::events::Software;
use perf_event::{Builder, Counter, ReadFormat, Sampler};

use crate::capture::counters::online_cpus;
use crate::events::count::Count;
use crate::events::probe::explain;
use crate::events::{open_error, EventSpec, OpenAs, Scope, SystemFacts};
use crate::process::threads_of;

/// A thread: its process id and its own id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadId {
    pub pid: u32,
    pub tid: u32,
}

/// What to count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CountScope {
    /// Every task on every CPU.
    System,
    /// These running threads, and the threads and children they start.
    Threads(Vec<ThreadId>),
    /// A command started stopped ([`crate::launch`]): counting starts at its exec.
    Command(u32),
}

impl CountScope {
    /// Every current thread of these processes.
    pub fn processes(pids: &[u32]) -> Result<CountScope> {
        let mut threads = Vec::new();
        for &pid in pids {
            let tids = threads_of(pid).map_err(|_| {
                anyhow!(
                    "process {pid} does not exist (or exited): check the PID with `ps -p {pid}`"
                )
            })?;
            threads.extend(tids.into_iter().map(|tid| ThreadId { pid, tid }));
        }
        Ok(CountScope::Threads(threads))
    }

    fn follows_tasks(&self) -> bool {
        !matches!(self, CountScope::System)
    }

    /// The threads counters are opened on directly.
    fn roots(&self) -> Vec<ThreadId> {
        match self {
            CountScope::System => Vec::new(),
            CountScope::Threads(threads) => threads.clone(),
            CountScope::Command(pid) => vec![ThreadId {
                pid: *pid,
                tid: *pid,
            }],
        }
    }
}

/// How to split the counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// One counter per CPU also for task scopes (system-wide is always per CPU).
    pub per_cpu: bool,
    /// Record each started thread's own count when it exits (task scopes only).
    pub per_thread: bool,
}

/// Where one counter counts: a thread (and what it starts), a CPU, or a thread on a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placement {
    pub thread: Option<ThreadId>,
    pub cpu: Option<u32>,
}

/// One counter's final reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub event: usize,
    pub placement: Placement,
    pub count: Count,
}

/// A started thread's own count, written by the kernel when it exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadExit {
    pub event: usize,
    /// The thread whose counter it was inherited from.
    pub root: ThreadId,
    pub thread: ThreadId,
    pub count: Count,
}

/// What the per-thread ring buffers said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadLog {
    /// The threads counters were opened on.
    pub roots: Vec<ThreadId>,
    pub exits: Vec<ThreadExit>,
    /// Threads started during the run.
    pub started: BTreeSet<ThreadId>,
    /// The thread each started thread was created by.
    pub parents: HashMap<u32, u32>,
    /// Thread names: from /proc for threads that existed, then every rename and exec.
    pub names: HashMap<u32, String>,
    /// Records the kernel dropped because a ring buffer was full.
    pub lost: u64,
}

/// How far to follow thread creation back; a corrupt parent map must not loop forever.
const MAX_ANCESTRY: usize = 1024;

impl ThreadLog {
    /// A thread's name: its own last name, else the name of the thread that created it.
    pub fn name(&self, tid: u32) -> Option<&str> {
        self.ancestry(tid)
            .find_map(|tid| self.names.get(&tid).map(String::as_str))
    }

    /// The root thread a started thread descends from.
    pub fn root_of(&self, tid: u32) -> Option<ThreadId> {
        self.ancestry(tid)
            .find_map(|tid| self.roots.iter().find(|root| root.tid == tid).copied())
    }

    /// `tid`, its creator, its creator's creator, ...
    fn ancestry(&self, tid: u32) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors(Some(tid), |tid| self.parents.get(tid).copied()).take(MAX_ANCESTRY)
    }
}

/// Data size of each CPU's ring buffer (a power of two); a thread's exit record for one event
/// takes 48 bytes, and the rings are drained every [`super::POLL_INTERVAL`].
const RING_BYTES: usize = 128 * 1024;

struct Opened {
    event: usize,
    placement: Placement,
    counter: Counter,
}

/// The open counters of one run.
pub struct CounterSet {
    counters: Vec<Opened>,
    /// Per-thread mode: one ring per CPU, owned by that CPU's first side-band counter.
    rings: BTreeMap<u32, Sampler>,
    /// The other side-band counters, writing into their CPU's ring.
    side_bands: Vec<Counter>,
    /// Per-thread mode: counter id -> (event, root thread), to attribute exit records.
    ids: HashMap<u64, (usize, ThreadId)>,
    /// Per event: why it cannot be counted here, when it cannot.
    unsupported: Vec<Option<String>>,
    log: ThreadLog,
}

/// Where to open counters for `spec`.
fn placements(spec: &EventSpec, scope: &CountScope, split: Split) -> Result<Vec<Placement>> {
    let cpus = || -> Result<Vec<u32>> {
        // Per-package PMUs (RAPL, uncore) count on one CPU of each package.
        match &spec.cpumask {
            Some(cpus) => Ok(cpus.clone()),
            None => Ok(online_cpus()?.into_iter().map(|cpu| cpu as u32).collect()),
        }
    };
    let roots = scope.roots();
    Ok(match scope {
        CountScope::System => cpus()?
            .into_iter()
            .map(|cpu| Placement {
                thread: None,
                cpu: Some(cpu),
            })
            .collect(),
        _ if split.per_cpu => {
            let cpus = cpus()?;
            roots
                .iter()
                .flat_map(|&thread| {
                    cpus.iter().map(move |&cpu| Placement {
                        thread: Some(thread),
                        cpu: Some(cpu),
                    })
                })
                .collect()
        }
        _ => roots
            .into_iter()
            .map(|thread| Placement {
                thread: Some(thread),
                cpu: None,
            })
            .collect(),
    })
}

fn builder_for<'a>(placement: Placement, scope: &CountScope) -> Builder<'a> {
    let mut builder = Builder::new(Software::DUMMY);
    match placement.thread {
        Some(thread) => builder.observe_pid(thread.tid as i32),
        None => builder.any_pid(),
    };
    match placement.cpu {
        Some(cpu) => builder.one_cpu(cpu as usize),
        None => builder.any_cpu(),
    };
    builder
        .inherit(scope.follows_tasks())
        .enable_on_exec(matches!(scope, CountScope::Command(_)));
    builder
}

fn map_ring(counter: Counter) -> Result<Sampler> {
    counter.sampled(RING_BYTES).map_err(|err| {
        anyhow!(
            "cannot map a ring buffer for per-thread counts ({err}): the locked-memory limit for \
             perf buffers is spent; raise kernel.perf_event_mlock_kb, or count without \
             --per-thread"
        )
    })
}

/// Makes `counter` write its records into `ring` (same CPU).
fn set_output(counter: &Counter, ring: &Sampler) -> Result<()> {
    // SAFETY: both descriptors are open perf events owned by the caller for the duration of the
    // call; the ioctl only links the kernel objects.
    let result =
        unsafe { perf_event_open_sys::ioctls::SET_OUTPUT(counter.as_raw_fd(), ring.as_raw_fd()) };
    if result < 0 {
        return Err(io::Error::last_os_error())
            .context("sharing a CPU's ring buffer between per-thread counters");
    }
    Ok(())
}

/// What per-thread counters and their side-band counters read: the id tags exit records.
fn per_thread_read_format() -> ReadFormat {
    ReadFormat::TOTAL_TIME_ENABLED | ReadFormat::TOTAL_TIME_RUNNING | ReadFormat::ID
}

/// Errors that are the user's to fix rather than the machine's inability to count an event.
fn fatal(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EMFILE | libc::ENFILE)
    )
}

fn thread_name(thread: ThreadId) -> Option<String> {
    fs::read_to_string(format!("/proc/{}/task/{}/comm", thread.pid, thread.tid))
        .ok()
        .map(|name| name.trim_end().to_string())
}

/// How open errors are explained: the kernel's rules differ for tasks and CPUs.
fn open_as(scope: &CountScope) -> OpenAs {
    OpenAs {
        scope: if scope.follows_tasks() {
            Scope::Task
        } else {
            Scope::SystemWide
        },
        sampling: false,
    }
}

/// What became of one attempt to open a counter.
enum Outcome {
    Opened(Counter),
    /// The thread exited meanwhile (not an error for running processes).
    Gone,
    /// The machine cannot count the event; the reason.
    Unsupported(String),
}

fn outcome(
    built: io::Result<Counter>,
    spec: &EventSpec,
    scope: &CountScope,
    facts: &SystemFacts,
) -> Result<Outcome> {
    match built {
        Ok(counter) => Ok(Outcome::Opened(counter)),
        Err(err)
            if err.raw_os_error() == Some(libc::ESRCH)
                && matches!(scope, CountScope::Threads(_)) =>
        {
            Ok(Outcome::Gone)
        }
        Err(err) if fatal(&err) => Err(open_error(spec, &err, open_as(scope), facts).into()),
        Err(err) => Ok(Outcome::Unsupported(explain(
            spec,
            &err,
            open_as(scope),
            facts,
        ))),
    }
}

impl CounterSet {
    /// Opens every event on the scope, disabled (or enabled at the command's exec). Events the
    /// machine cannot count are kept as unsupported with the reason; permission and file-limit
    /// errors fail the run.
    pub fn open(
        specs: &[EventSpec],
        scope: &CountScope,
        split: Split,
        facts: &SystemFacts,
    ) -> Result<CounterSet> {
        let mut set = CounterSet {
            counters: Vec::new(),
            rings: BTreeMap::new(),
            side_bands: Vec::new(),
            ids: HashMap::new(),
            unsupported: vec![None; specs.len()],
            log: ThreadLog {
                roots: scope.roots(),
                ..ThreadLog::default()
            },
        };
        if split.per_thread && scope.follows_tasks() {
            set.open_per_thread(specs, scope, facts)?;
        } else {
            set.open_independent(specs, scope, split, facts)?;
        }
        if set.counters.is_empty() && set.unsupported.iter().any(Option::is_none) {
            bail!("every thread of the target exited before counting began");
        }
        Ok(set)
    }

    /// One counter per event and placement, each on its own.
    fn open_independent(
        &mut self,
        specs: &[EventSpec],
        scope: &CountScope,
        split: Split,
        facts: &SystemFacts,
    ) -> Result<()> {
        for (event, spec) in specs.iter().enumerate() {
            let mut opened = Vec::new();
            for placement in placements(spec, scope, split)? {
                let mut builder = builder_for(placement, scope);
                spec.attr.apply(builder.attrs_mut());
                match outcome(builder.build(), spec, scope, facts)? {
                    Outcome::Opened(counter) => opened.push(Opened {
                        event,
                        placement,
                        counter,
                    }),
                    Outcome::Gone => {}
                    Outcome::Unsupported(reason) => {
                        self.unsupported[event] = Some(reason);
                        opened.clear();
                        break;
                    }
                }
            }
            self.counters.extend(opened);
        }
        Ok(())
    }

    /// Per-thread mode: on each root thread and CPU, one group led by a side-band counter
    /// (thread creation and names) with every event as a member, all writing into the CPU's
    /// ring buffer, which the first leader on the CPU owns.
    ///
    /// Why one group: on a context swap the kernel pairs the events of the two contexts by list
    /// position to exchange their counts (`inherit_stat`). A started thread's list follows the
    /// kernel's group order (CPU, then PMU, then creation), the root's follows the order the
    /// events were opened; with a single group per CPU, opened CPU by CPU, the two agree
    /// whatever PMUs the events belong to. The cost: a CPU's events are scheduled together, so
    /// hardware events beyond the PMU's counters are not counted per thread.
    fn open_per_thread(
        &mut self,
        specs: &[EventSpec],
        scope: &CountScope,
        facts: &SystemFacts,
    ) -> Result<()> {
        let cpus = online_cpus()?;
        'roots: for root in scope.roots() {
            if !matches!(scope, CountScope::Command(_)) {
                // The launched command is still the trampoline shell; its exec names it.
                if let Some(name) = thread_name(root) {
                    self.log.names.insert(root.tid, name);
                }
            }
            for cpu in cpus.iter().map(|&cpu| cpu as u32) {
                let placement = Placement {
                    thread: Some(root),
                    cpu: Some(cpu),
                };
                let mut builder = builder_for(placement, scope);
                builder
                    .comm(true)
                    .comm_exec(true)
                    .task(true)
                    .read_format(per_thread_read_format());
                let mut leader = match builder.build() {
                    Ok(counter) => counter,
                    Err(err)
                        if err.raw_os_error() == Some(libc::ESRCH)
                            && matches!(scope, CountScope::Threads(_)) =>
                    {
                        continue 'roots
                    }
                    Err(err) => {
                        return Err(err).context("opening the side-band counter for thread names")
                    }
                };
                if let Some(ring) = self.rings.get(&cpu) {
                    set_output(&leader, ring)?;
                }
                for (event, spec) in specs.iter().enumerate() {
                    if self.unsupported[event].is_some() {
                        continue;
                    }
                    let mut builder = builder_for(placement, scope);
                    spec.attr.apply(builder.attrs_mut());
                    builder
                        .inherit_stat(true)
                        .read_format(per_thread_read_format());
                    match outcome(builder.build_with_group(&mut leader), spec, scope, facts)? {
                        Outcome::Opened(counter) => {
                            self.ids.insert(counter.id(), (event, root));
                            self.counters.push(Opened {
                                event,
                                placement,
                                counter,
                            });
                        }
                        Outcome::Gone => continue 'roots,
                        Outcome::Unsupported(reason) => {
                            self.unsupported[event] = Some(reason);
                            self.counters.retain(|opened| opened.event != event);
                        }
                    }
                }
                match self.rings.get(&cpu) {
                    Some(_) => self.side_bands.push(leader),
                    None => {
                        self.rings.insert(cpu, map_ring(leader)?);
                    }
                }
                let ring = &self.rings[&cpu];
                for opened in self.counters.iter().filter(|o| o.placement == placement) {
                    set_output(&opened.counter, ring)?;
                }
            }
        }
        Ok(())
    }

    /// Why each event cannot be counted here (`None` for events that opened).
    pub fn unsupported(&self) -> &[Option<String>] {
        &self.unsupported
    }

    pub fn enable(&mut self) -> Result<()> {
        for ring in self.rings.values_mut() {
            ring.enable()?;
        }
        for side_band in &mut self.side_bands {
            side_band.enable()?;
        }
        for opened in &mut self.counters {
            opened.counter.enable()?;
        }
        Ok(())
    }

    /// Stops counting; inherited copies in the target's threads stop too.
    pub fn disable(&mut self) -> Result<()> {
        for opened in &mut self.counters {
            opened.counter.disable()?;
        }
        Ok(())
    }

    /// Moves what the ring buffers hold into the thread log, so they do not fill up.
    pub fn drain(&mut self) {
        for ring in self.rings.values_mut() {
            while let Some(record) = ring.next_record() {
                match record.parse_record() {
                    Ok(Record::Read(read)) => {
                        let values = &read.values;
                        let Some(&(event, root)) = values.id().and_then(|id| self.ids.get(&id))
                        else {
                            continue;
                        };
                        self.log.exits.push(ThreadExit {
                            event,
                            root,
                            thread: ThreadId {
                                pid: read.pid,
                                tid: read.tid,
                            },
                            count: Count::from_reading(
                                values.value(),
                                values.time_enabled().unwrap_or_default(),
                                values.time_running().unwrap_or_default(),
                            ),
                        });
                    }
                    Ok(Record::Comm(comm)) => {
                        let name = String::from_utf8_lossy(&comm.comm).into_owned();
                        self.log.names.insert(comm.tid, name);
                    }
                    Ok(Record::Fork(fork)) => {
                        self.log.started.insert(ThreadId {
                            pid: fork.pid,
                            tid: fork.tid,
                        });
                        self.log.parents.insert(fork.tid, fork.ptid);
                    }
                    Ok(Record::Lost(lost)) => self.log.lost += lost.lost,
                    _ => {}
                }
            }
        }
    }

    /// Every counter's reading, scaled for multiplexing.
    pub fn read(&mut self) -> Result<Vec<Reading>> {
        self.counters
            .iter_mut()
            .map(|opened| {
                let read = opened
                    .counter
                    .read_count_and_time()
                    .context("reading a counter")?;
                Ok(Reading {
                    event: opened.event,
                    placement: opened.placement,
                    count: Count::from_reading(read.count, read.time_enabled, read.time_running),
                })
            })
            .collect()
    }

    /// The thread log, once the run is over and the rings are drained.
    pub fn into_log(self) -> ThreadLog {
        self.log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fall_back_to_the_creating_thread() {
        let mut log = ThreadLog {
            roots: vec![ThreadId { pid: 10, tid: 10 }],
            ..ThreadLog::default()
        };
        log.names.insert(10, "server".to_string());
        log.names.insert(12, "worker-2".to_string());
        log.parents.insert(11, 10);
        log.parents.insert(12, 10);
        log.parents.insert(13, 11);
        assert_eq!(log.name(13), Some("server"));
        assert_eq!(log.name(12), Some("worker-2"));
        assert_eq!(log.name(99), None);
        assert_eq!(log.root_of(13), Some(ThreadId { pid: 10, tid: 10 }));
        assert_eq!(log.root_of(99), None);
        // A cycle in the parent map ends rather than looping.
        log.parents.insert(20, 21);
        log.parents.insert(21, 20);
        assert_eq!(log.name(20), None);
        assert_eq!(log.root_of(20), None);
    }

    #[test]
    fn system_wide_counters_go_on_every_cpu_and_tasks_on_their_threads() {
        let spec =
            crate::events::parse_event("page-faults", &crate::events::PmuRegistry::default())
                .unwrap();
        let cpus = online_cpus().unwrap().len();
        let system = placements(&spec, &CountScope::System, Split::default()).unwrap();
        assert_eq!(system.len(), cpus);
        assert!(system.iter().all(|p| p.thread.is_none() && p.cpu.is_some()));

        let threads = CountScope::Threads(vec![
            ThreadId { pid: 1, tid: 1 },
            ThreadId { pid: 1, tid: 2 },
        ]);
        let per_thread = placements(&spec, &threads, Split::default()).unwrap();
        assert_eq!(per_thread.len(), 2);
        assert!(per_thread.iter().all(|p| p.cpu.is_none()));
        let split = Split {
            per_cpu: true,
            per_thread: false,
        };
        assert_eq!(placements(&spec, &threads, split).unwrap().len(), 2 * cpus);

        let command = placements(&spec, &CountScope::Command(7), split).unwrap();
        assert_eq!(command.len(), cpus);
        assert!(command
            .iter()
            .all(|p| p.thread == Some(ThreadId { pid: 7, tid: 7 })));
    }

    #[test]
    fn processes_that_do_not_exist_are_named() {
        let err = CountScope::processes(&[u32::MAX - 1]).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        let CountScope::Threads(threads) = CountScope::processes(&[std::process::id()]).unwrap()
        else {
            panic!("a process scope counts threads");
        };
        assert!(threads.iter().any(|t| t.tid == std::process::id()));
    }
}
