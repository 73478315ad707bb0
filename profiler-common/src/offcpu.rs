//! Off-CPU time: what the scheduler-switch programs share with the agent. A thread in scope
//! that leaves the CPU is remembered with its state and stacks; when it runs again, the time it
//! was off the CPU is added to its (process, thread, stacks, state) key and to a log-linear
//! histogram of block durations (the latency histogram's buckets, in microseconds).

/// Why a thread was off the CPU, from its task state when it left.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockState {
    /// Interruptible sleep (`S`): a timer, a pipe, a futex, a socket.
    Sleeping = 0,
    /// Uninterruptible sleep (`D`): disk I/O, page faults served from disk, some locks.
    Uninterruptible = 1,
    /// Still runnable when it left (preempted, or yielded): waiting in the run queue.
    RunQueue = 2,
    /// An idle kernel thread, stopped, traced, or another state.
    Other = 3,
}

/// `TASK_INTERRUPTIBLE` in the kernel's task state bits.
const TASK_INTERRUPTIBLE: u64 = 0x1;
/// `TASK_UNINTERRUPTIBLE`.
const TASK_UNINTERRUPTIBLE: u64 = 0x2;
/// `TASK_DEAD`: a task leaving the CPU for the last time.
const TASK_DEAD: u64 = 0x80;
/// `TASK_NOLOAD`: with `TASK_UNINTERRUPTIBLE`, `TASK_IDLE`, an idle kernel thread, not a wait
/// on the disk (`ps` shows `I`).
const TASK_NOLOAD: u64 = 0x400;
/// The classic tracepoint's `prev_state` when the task was preempted (`TASK_REPORT_MAX`).
const REPORTED_PREEMPTED: u64 = 0x100;
/// The classic tracepoint's `prev_state` of an idle kernel thread (`TASK_REPORT_IDLE`).
const REPORTED_IDLE: u64 = 0x80;
/// The classic tracepoint's `prev_state` of an exiting task (`EXIT_DEAD`, `EXIT_ZOMBIE`).
const REPORTED_EXITING: u64 = 0x10 | 0x20;

impl BlockState {
    pub const COUNT: usize = 4;
    pub const ALL: [BlockState; Self::COUNT] = [
        BlockState::Sleeping,
        BlockState::Uninterruptible,
        BlockState::RunQueue,
        BlockState::Other,
    ];

    /// The state of a task that leaves the CPU with task state `state` (`task_struct.__state`);
    /// `preempted` when the scheduler took the CPU from it (its state then says nothing about
    /// waiting). `None` for a task leaving for the last time.
    #[inline(always)]
    pub fn of_task(preempted: bool, state: u64) -> Option<BlockState> {
        Some(if preempted || state == 0 {
            BlockState::RunQueue
        } else if state & TASK_DEAD != 0 {
            return None;
        } else if state & TASK_NOLOAD != 0 {
            BlockState::Other
        } else if state & TASK_UNINTERRUPTIBLE != 0 {
            BlockState::Uninterruptible
        } else if state & TASK_INTERRUPTIBLE != 0 {
            BlockState::Sleeping
        } else {
            BlockState::Other
        })
    }

    /// The same from the classic `sched:sched_switch` record's `prev_state`, which reports one
    /// state bit, or `TASK_REPORT_MAX` when preempted.
    #[inline(always)]
    pub fn of_reported(state: u64) -> Option<BlockState> {
        if state & REPORTED_PREEMPTED != 0 {
            Some(BlockState::RunQueue)
        } else if state & REPORTED_EXITING != 0 {
            None
        } else if state & REPORTED_IDLE != 0 {
            Some(BlockState::Other)
        } else {
            BlockState::of_task(false, state)
        }
    }

    pub fn from_code(code: u32) -> BlockState {
        Self::ALL
            .get(code as usize)
            .copied()
            .unwrap_or(BlockState::Other)
    }

    /// The letter `ps` shows and what it means.
    pub const fn describe(self) -> &'static str {
        match self {
            BlockState::Sleeping => "S sleeping",
            BlockState::Uninterruptible => "D uninterruptible (disk)",
            BlockState::RunQueue => "R run queue (preempted)",
            BlockState::Other => "other (idle kernel thread, stopped, traced)",
        }
    }
}

/// A thread off the CPU, remembered from the switch that took it off until the one that puts
/// it back (the blocked-threads map, by thread id). The entry outlives the block, closed, until
/// the thread exits: its next block reuses it in place, with no map insert and delete per
/// switch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Blocked {
    /// When the block began; [`Blocked::CLOSED`] once it has ended.
    pub start_ns: u64,
    pub pid: u32,
    /// A [`BlockState`].
    pub state: u32,
    pub user_stack: u64,
    pub kernel_stack: u64,
    pub cgroup: u64,
    /// With `--wakers`: who woke the thread, as it did ([`Waker::NONE`] until then).
    pub waker: Waker,
}

impl Blocked {
    /// `start_ns` of an entry whose block has ended (no switch happens at boot time zero).
    pub const CLOSED: u64 = 0;

    /// Whether the thread is still off the CPU in this block.
    #[inline(always)]
    pub fn is_open(&self) -> bool {
        self.start_ns != Blocked::CLOSED
    }

    /// The hashes of the stacks a block still running holds: the thread's, and its waker's
    /// once it was woken.
    pub fn stack_hashes(&self) -> [u64; 4] {
        [
            self.user_stack,
            self.kernel_stack,
            self.waker.user_stack,
            self.waker.kernel_stack,
        ]
    }
}

/// The task that woke a blocked thread (`--wakers`): its thread and its stacks when it did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Waker {
    /// 1 when a wake-up was seen; 0 when not (a preempted thread is not woken, and a wake-up
    /// may race with the switch that takes the thread off).
    pub seen: u32,
    pub _pad: u32,
    /// The task current when the wake-up was made: 0 for the idle task, which wakes threads
    /// only from interrupts.
    pub pid: u32,
    pub tid: u32,
    pub user_stack: u64,
    pub kernel_stack: u64,
}

impl Waker {
    pub const NONE: Waker = Waker {
        seen: 0,
        _pad: 0,
        pid: 0,
        tid: 0,
        user_stack: 0,
        kernel_stack: 0,
    };
}

/// Key of the off-CPU maps: where a thread waited, why, and with `--wakers` who woke it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffCpuKey {
    pub pid: u32,
    pub tid: u32,
    /// A [`BlockState`].
    pub state: u32,
    pub _pad: u32,
    /// `NO_STACK` for blocks shorter than `--off-cpu-min`, which are counted without stacks.
    pub user_stack: u64,
    pub kernel_stack: u64,
    pub cgroup: u64,
    /// [`Waker::NONE`] without `--wakers`, and for blocks counted without stacks.
    pub waker: Waker,
}

impl OffCpuKey {
    /// The hashes of the stacks the key holds: the blocked thread's and its waker's.
    pub fn stack_hashes(&self) -> [u64; 4] {
        [
            self.user_stack,
            self.kernel_stack,
            self.waker.user_stack,
            self.waker.kernel_stack,
        ]
    }
}

/// Per-CPU value of the off-CPU map: blocks ended on that CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuStats {
    pub total_ns: u64,
    pub count: u64,
    pub max_ns: u64,
}

impl OffCpuStats {
    pub fn merge(&mut self, other: &OffCpuStats) {
        self.total_ns += other.total_ns;
        self.count += other.count;
        self.max_ns = self.max_ns.max(other.max_ns);
    }
}

/// Block durations are bucketed in this unit: the histogram's u32 range then covers 71 minutes.
pub const HISTOGRAM_UNIT_NS: u64 = 1000;

/// Options of the scheduler-switch programs, a read-only global set at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuConfig {
    /// `OFFCPU_*` bits.
    pub flags: u32,
    /// `task_struct.pid` (the thread id), `.tgid` and the task state (`__state`, `state` before
    /// 5.14), from BTF.
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_state: u32,
    /// `task_struct.se.sum_exec_runtime` and `.se.prev_sum_exec_runtime` (its value when the
    /// fair scheduler last put the task on a CPU), and `.policy`, from BTF: how long the task
    /// has been on the CPU since it last came on. 0: unknown.
    pub task_runtime: u32,
    pub task_slice_start: u32,
    pub task_policy: u32,
    pub _pad: u32,
    /// Blocks shorter than this are counted without stacks.
    pub min_block_ns: u64,
}

impl OffCpuConfig {
    pub const EMPTY: OffCpuConfig = OffCpuConfig {
        flags: 0,
        task_pid: 0,
        task_tgid: 0,
        task_state: 0,
        task_runtime: 0,
        task_slice_start: 0,
        task_policy: 0,
        _pad: 0,
        min_block_ns: 0,
    };
}

/// Every thread but the idle tasks is in scope (`-a`); else the processes in the scope map and
/// the processes they fork.
pub const OFFCPU_ALL: u32 = 1 << 0;
/// Blocked threads' wakers are kept (`--wakers`): the `sched_waking` program is attached.
pub const OFFCPU_WAKERS: u32 = 1 << 2;
/// User stacks are walked by the DWARF unwinder (`tp_btf` only: its tail calls need a program
/// of the same type), frame pointers where it cannot.
pub const OFFCPU_DWARF: u32 = 1 << 1;

/// What the switch programs counted, indices of their counter array. Losses are `LossKind`s.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffCpuCount {
    /// Threads in scope that left the CPU and were remembered.
    SwitchesOut = 0,
    /// Blocks added with their stacks.
    Blocks = 1,
    /// Blocks shorter than `--off-cpu-min`, added without stacks.
    ShortBlocks = 2,
    /// Threads of the processes in scope that ran again without a remembered switch: off the
    /// CPU since before the recording started, or their switch was lost (a `LossKind`).
    Unmatched = 3,
    /// With `--wakers`: sleeping threads that ran again with no wake-up seen. Their blocks are
    /// in every view but the waker view. The wake-up came while the thread was still leaving
    /// the CPU (before its block was remembered), or the kernel did not trace it.
    WakerNotSeen = 4,
    /// Blocks whose switch back onto the CPU was not seen, ended where the thread's time on the
    /// CPU since then began (the scheduler keeps it). A kernel that does not trace every switch
    /// leaves them; without BTF, or for real-time threads, they are lost instead.
    SwitchInRecovered = 5,
}

impl OffCpuCount {
    pub const COUNT: usize = 6;
    pub const ALL: [OffCpuCount; Self::COUNT] = [
        OffCpuCount::SwitchesOut,
        OffCpuCount::Blocks,
        OffCpuCount::ShortBlocks,
        OffCpuCount::Unmatched,
        OffCpuCount::WakerNotSeen,
        OffCpuCount::SwitchInRecovered,
    ];

    pub const fn describe(self) -> &'static str {
        match self {
            OffCpuCount::SwitchesOut => "switches off the CPU",
            OffCpuCount::Blocks => "blocks with stacks",
            OffCpuCount::ShortBlocks => "blocks shorter than --off-cpu-min (counted, no stacks)",
            OffCpuCount::Unmatched => {
                "switches onto the CPU with no remembered switch off (off the CPU since before the start)"
            }
            OffCpuCount::WakerNotSeen => {
                "blocks whose wake-up was not seen (--wakers; not in the waker view)"
            }
            OffCpuCount::SwitchInRecovered => {
                "blocks whose switch back onto the CPU was not seen, ended by the thread's run time since"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_states_tell_why_a_thread_left_the_cpu() {
        assert_eq!(BlockState::of_task(false, 0x1), Some(BlockState::Sleeping));
        assert_eq!(
            BlockState::of_task(false, 0x2),
            Some(BlockState::Uninterruptible)
        );
        // TASK_KILLABLE (TASK_WAKEKILL | TASK_UNINTERRUPTIBLE) waits like D.
        assert_eq!(
            BlockState::of_task(false, 0x102),
            Some(BlockState::Uninterruptible)
        );
        // TASK_IDLE (TASK_NOLOAD | TASK_UNINTERRUPTIBLE) is an idle kernel thread.
        assert_eq!(BlockState::of_task(false, 0x402), Some(BlockState::Other));
        assert_eq!(BlockState::of_task(false, 0x0), Some(BlockState::RunQueue));
        assert_eq!(BlockState::of_task(true, 0x1), Some(BlockState::RunQueue));
        assert_eq!(BlockState::of_task(false, 0x4), Some(BlockState::Other));
        assert_eq!(BlockState::of_task(false, 0x80), None);
    }

    #[test]
    fn reported_states_of_the_classic_tracepoint_read_the_same() {
        assert_eq!(BlockState::of_reported(0x1), Some(BlockState::Sleeping));
        assert_eq!(
            BlockState::of_reported(0x2),
            Some(BlockState::Uninterruptible)
        );
        assert_eq!(BlockState::of_reported(0x100), Some(BlockState::RunQueue));
        assert_eq!(BlockState::of_reported(0x0), Some(BlockState::RunQueue));
        assert_eq!(BlockState::of_reported(0x80), Some(BlockState::Other));
        assert_eq!(BlockState::of_reported(0x10), None);
        assert_eq!(BlockState::of_reported(0x20), None);
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: #[repr(C)] types with only integer fields and explicit padding: every bit pattern
    // is valid and there are no uninitialized bytes.
    unsafe impl aya::Pod for Blocked {}
    unsafe impl aya::Pod for OffCpuKey {}
    unsafe impl aya::Pod for OffCpuStats {}
    unsafe impl aya::Pod for OffCpuConfig {}
}
