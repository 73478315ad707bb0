//! Processes whose whole life falls between two reads of the side-band. Under process churn
//! they are nearly every process, and at a production sampling rate nearly none of them is
//! sampled: entering each into the process table, and forgetting it again at the next drain,
//! was a third of the agent's CPU. Their changes are held instead, and a process enters the
//! table only once a drain shows a sample of it.

use std::{collections::BTreeSet, sync::Arc};

use super::{HashMap, Mapping, Pending, ProcessTable, RecordBytes};

/// One step of a held life.
#[derive(Debug)]
enum Held {
    /// Its fork: the process starts with its parent's name and address space as they were.
    Forked {
        comm: String,
        mappings: Arc<Vec<Mapping>>,
    },
    /// What happened to it next, up to its exit: a kept record's fields are in the bytes of
    /// the list the step is in.
    Then(Pending),
}

/// The held lives, as two flat lists of steps in time order: under churn hundreds are held and
/// let go between two drains, and a list per process cost more allocations than the process
/// table did.
#[derive(Debug, Default)]
pub(super) struct ShortLives {
    /// Held since the last scheduled drain.
    newer: HeldList,
    /// Held before it: one more drain without a sample of them and they go. The drain after
    /// a life ends may still miss it: an off-CPU block it woke ends, and is drained, only when
    /// the woken thread runs again.
    older: HeldList,
    /// Scratch of [`whole_lives`], kept to reuse its room.
    seen: HashMap<u32, Seen>,
}

/// The lives of one list: a drain without a sample of any of them lets the older list go
/// whole and makes the newer one the older, with no work per life.
#[derive(Debug, Default)]
struct HeldList {
    steps: Vec<(u32, Held)>,
    /// The fields of the records its steps kept.
    bytes: RecordBytes,
    /// The pids of its lives, with how many (a pid reused between two reads has two).
    pids: HashMap<u32, u32>,
}

impl HeldList {
    fn holds(&self, pid: u32) -> bool {
        self.pids.contains_key(&pid)
    }

    /// Takes out the steps of the lives of `pids` (sorted), in time order.
    fn take_lives(&mut self, pids: &[u32]) -> Vec<(u32, Held)> {
        for pid in pids {
            self.pids.remove(pid);
        }
        self.steps
            .extract_if(.., |(pid, _)| pids.binary_search(pid).is_ok())
            .collect()
    }

    fn clear(&mut self) {
        self.steps.clear();
        self.bytes.clear();
        self.pids.clear();
    }
}

/// When held lives are settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// After a scheduled drain: an unsampled life is kept for one more.
    AfterDrain,
    /// As a window closes: what is not sampled now never will be (the window forgets every
    /// process that exited).
    WindowClosed,
}

/// What a batch shows of a pid.
#[derive(Debug, PartialEq)]
enum Seen {
    Living,
    Ended,
    /// Not a whole life in this batch.
    Other,
}

/// Marks in `seen` the pids whose whole life is in `batch`, a read's records in time order, as
/// [`Seen::Ended`]: forked as a new process, then exited, with nothing of that pid before the
/// fork or after the exit (a pid reused within the batch, or records the next read brings
/// late), and no process of their own forked in the batch (a fork inherits its parent's
/// address space as it is then).
fn whole_lives(batch: &[(u64, Pending)], seen: &mut HashMap<u32, Seen>) {
    seen.clear();
    for (_, pending) in batch {
        match *pending {
            Pending::Fork { pid, ppid } if pid != ppid => {
                seen.insert(ppid, Seen::Other);
                seen.entry(pid)
                    .and_modify(|state| *state = Seen::Other)
                    .or_insert(Seen::Living);
            }
            _ => {
                let Some(pid) = pending.pid() else { continue };
                let state = seen.entry(pid).or_insert(Seen::Other);
                *state = match (&*state, pending) {
                    (Seen::Living, Pending::Exit(_)) => Seen::Ended,
                    (Seen::Living, _) => Seen::Living,
                    _ => Seen::Other,
                };
            }
        }
    }
}

impl ProcessTable {
    /// Applies a read's records (kept ones' fields in `bytes`) in time order, holding the
    /// whole lives in it (where [`ProcessTable::hold_short_lives`]) until a drain settles them.
    pub(crate) fn apply_batch(&mut self, batch: &mut Vec<(u64, Pending)>, bytes: &RecordBytes) {
        let mut seen = std::mem::take(&mut self.short_lives.seen);
        if self.hold_short_lives {
            whole_lives(batch, &mut seen);
        }
        for (_, pending) in batch.drain(..) {
            match pending.pid() {
                Some(pid) if seen.get(&pid) == Some(&Seen::Ended) => self.hold(pid, pending, bytes),
                pid => {
                    // A held life of this pid came first: its process may be needed now (a late
                    // record of it, or a new process on its pid retiring its mappings).
                    if let Some(pid) = pid.filter(|&pid| self.holds(pid)) {
                        self.enter_lives(&[pid], false);
                    }
                    self.apply_pending(pending, bytes);
                }
            }
        }
        self.short_lives.seen = seen;
    }

    fn hold(&mut self, pid: u32, pending: Pending, bytes: &RecordBytes) {
        let list = &mut self.short_lives.newer;
        let step = match pending {
            Pending::Fork { ppid, .. } if ppid != pid => {
                *list.pids.entry(pid).or_default() += 1;
                let (comm, mappings) = self.inherited_from(ppid);
                Held::Forked { comm, mappings }
            }
            Pending::Kept(record) => Held::Then(Pending::Kept(list.bytes.keep_from(record, bytes))),
            pending => Held::Then(pending),
        };
        self.short_lives.newer.steps.push((pid, step));
    }

    /// Whether a life of `pid` is held.
    fn holds(&self, pid: u32) -> bool {
        self.short_lives.older.holds(pid) || self.short_lives.newer.holds(pid)
    }

    /// Enters into the table the held lives of `pids` (sorted), oldest first. With
    /// `older_going` the older list is let go next: its lives are entered in place, without
    /// taking them out of it.
    fn enter_lives(&mut self, pids: &[u32], older_going: bool) {
        let lives = &mut self.short_lives;
        let mut older = std::mem::take(&mut lives.older);
        let mut newer = std::mem::take(&mut lives.newer);
        if older_going {
            for (pid, step) in older.steps.drain(..) {
                if pids.binary_search(&pid).is_ok() {
                    self.enter(pid, step, &older.bytes);
                }
            }
        } else {
            for (pid, step) in older.take_lives(pids) {
                self.enter(pid, step, &older.bytes);
            }
        }
        for (pid, step) in newer.take_lives(pids) {
            self.enter(pid, step, &newer.bytes);
        }
        (self.short_lives.older, self.short_lives.newer) = (older, newer);
    }

    /// Applies one held step to the table, its list's kept fields in `bytes`.
    fn enter(&mut self, pid: u32, step: Held, bytes: &RecordBytes) {
        match step {
            Held::Forked { comm, mappings } => self.start_process(pid, comm, mappings),
            Held::Then(pending) => self.apply_pending(pending, bytes),
        }
    }

    /// Enters into the table the held lives of the processes a drain found samples of
    /// (`sampled`), and lets go of the others `when` allows. Returns the pids entered.
    pub fn settle_short_lives(&mut self, sampled: &BTreeSet<u32>, when: Settle) -> Vec<u32> {
        // From the drain's processes, fewer than the lives held under churn; sorted.
        let entered: Vec<u32> = sampled
            .iter()
            .filter(|&&pid| self.holds(pid))
            .copied()
            .collect();
        if !entered.is_empty() {
            self.enter_lives(&entered, true);
        }
        let lives = &mut self.short_lives;
        lives.older.clear();
        match when {
            Settle::AfterDrain => std::mem::swap(&mut lives.older, &mut lives.newer),
            Settle::WindowClosed => lives.newer.clear(),
        }
        entered
    }

    /// How many lives are held, for tests.
    #[cfg(test)]
    fn held_lives(&self) -> usize {
        let lives = &self.short_lives;
        lives
            .older
            .steps
            .iter()
            .chain(&lives.newer.steps)
            .filter(|(_, step)| matches!(step, Held::Forked { .. }))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{parse_maps_line, pending::encode};

    fn code(path: &str) -> Mapping {
        parse_maps_line(&format!("1000-2000 r-xp 0 0:0 0 {path}")).unwrap()
    }

    /// One record of a test batch, as [`batch`] encodes it.
    enum Step {
        Fork(u32, u32),
        Exit(u32),
        ThreadExit(u32),
        /// An executable mapping of the path at 0x1000.
        Map(u32, &'static str),
        /// A name given by exec.
        Exec(u32, &'static str),
    }

    /// A read's records, timed from `start` in their order, with the bytes of those kept.
    fn batch(start: u64, steps: Vec<Step>) -> (Vec<(u64, Pending)>, RecordBytes) {
        let mut bytes = RecordBytes::default();
        let records = steps
            .into_iter()
            .enumerate()
            .map(|(at, step)| {
                let pending = match step {
                    Step::Fork(pid, ppid) => Pending::Fork { pid, ppid },
                    Step::Exit(pid) => Pending::Exit(pid),
                    Step::ThreadExit(tid) => Pending::ThreadExit(tid),
                    Step::Map(pid, path) => encode::code(&mut bytes, pid, path),
                    Step::Exec(pid, name) => encode::name(&mut bytes, pid, name, true),
                };
                (start + at as u64, pending)
            })
            .collect();
        (records, bytes)
    }

    fn apply(table: &mut ProcessTable, start: u64, steps: Vec<Step>) {
        let (mut records, bytes) = batch(start, steps);
        table.apply_batch(&mut records, &bytes);
    }

    /// A shell (1) runs `ls` (10) and `cat` (11), each forked, exec'd and gone before the read;
    /// 12 is forked and still runs.
    fn churn_batch() -> Vec<Step> {
        vec![
            Step::Fork(10, 1),
            Step::Exec(10, "ls"),
            Step::Map(10, "/bin/ls"),
            Step::Exit(10),
            Step::Fork(11, 1),
            Step::Exec(11, "cat"),
            Step::Map(11, "/bin/cat"),
            Step::Exit(11),
            Step::Fork(12, 1),
        ]
    }

    fn shell() -> ProcessTable {
        let mut table = ProcessTable::new(true);
        table.map(1, code("/bin/sh"));
        table.name_thread(1, 1, "sh".into(), false);
        table
    }

    #[test]
    fn whole_lives_are_held_and_only_sampled_ones_enter_the_table() {
        let mut table = shell();
        apply(&mut table, 0, churn_batch());
        assert!(!table.knows(10) && !table.knows(11));
        assert!(table.knows(12), "a living process enters at once");
        assert_eq!(table.held_lives(), 2);

        // A drain found a sample of `cat`: it enters, as it was, exited.
        let entered = table.settle_short_lives(&[11].into(), Settle::AfterDrain);
        assert_eq!(entered, [11]);
        let cat = &table.processes[&11];
        assert!(cat.exited);
        assert_eq!(cat.comm, "cat");
        assert_eq!(
            &*table.code_mapping_for(11, 0x1100).unwrap().path,
            "/bin/cat"
        );
        // Sampled before its exec: the shell's image it was forked with.
        assert_eq!(cat.retired.len(), 1);
        assert_eq!(&*cat.retired[0][0].path, "/bin/sh");
        assert_eq!(table.thread_name(11, 11), "cat");

        // `ls` is kept through one more drain (an off-CPU block it woke may end later), then
        // let go.
        assert_eq!(table.held_lives(), 1);
        assert!(table
            .settle_short_lives(&BTreeSet::new(), Settle::AfterDrain)
            .is_empty());
        assert!(!table.knows(10) && table.held_lives() == 0);
    }

    /// A life held over a drain keeps its records' bytes: sampled at the next drain, it enters
    /// whole, though the lives of a later read were held since.
    #[test]
    fn a_life_held_over_a_drain_enters_whole_at_the_next() {
        let mut table = shell();
        apply(&mut table, 0, churn_batch());
        assert!(table
            .settle_short_lives(&BTreeSet::new(), Settle::AfterDrain)
            .is_empty());
        apply(
            &mut table,
            100,
            vec![
                Step::Fork(20, 1),
                Step::Exec(20, "grep"),
                Step::Map(20, "/bin/grep"),
                Step::Exit(20),
            ],
        );
        assert_eq!(
            table.settle_short_lives(&[10, 20].into(), Settle::AfterDrain),
            [10, 20]
        );
        for (pid, comm, path) in [(10, "ls", "/bin/ls"), (20, "grep", "/bin/grep")] {
            assert_eq!(table.processes[&pid].comm, comm);
            assert_eq!(&*table.code_mapping_for(pid, 0x1100).unwrap().path, path);
        }
        assert!(!table.knows(11), "cat was let go at that drain");
        assert_eq!(table.held_lives(), 0);
    }

    #[test]
    fn a_closing_window_lets_go_of_every_unsampled_life() {
        let mut table = shell();
        apply(&mut table, 0, churn_batch());
        assert_eq!(
            table.settle_short_lives(&[10].into(), Settle::WindowClosed),
            [10]
        );
        assert_eq!(table.held_lives(), 0);
        assert!(table.knows(10) && !table.knows(11));
    }

    /// A held life's pid that a later record names again enters the table first: a new process
    /// on that pid keeps the old one's image for samples drained later, and a late record of
    /// the old one finds it.
    #[test]
    fn a_pid_named_again_enters_its_held_life_first() {
        let mut table = shell();
        apply(&mut table, 0, churn_batch());
        apply(
            &mut table,
            20,
            vec![Step::Fork(10, 1), Step::Map(10, "/bin/vi")],
        );
        assert_eq!(table.held_lives(), 1, "only cat is held");
        assert_eq!(
            &*table.code_mapping_for(10, 0x1100).unwrap().path,
            "/bin/vi"
        );
        let images: Vec<&str> = table.processes[&10]
            .retired
            .iter()
            .flat_map(|image| image.iter().map(|mapping| &*mapping.path))
            .collect();
        assert_eq!(images, ["/bin/sh", "/bin/ls"]);
    }

    /// A pid reused between drains has a life in each list: letting the older go keeps the
    /// newer one known, so a record naming the pid still enters it first.
    #[test]
    fn a_pid_held_twice_stays_held_until_both_lives_go() {
        let mut table = shell();
        let life = || vec![Step::Fork(10, 1), Step::Exec(10, "ls"), Step::Exit(10)];
        apply(&mut table, 0, life());
        table.settle_short_lives(&BTreeSet::new(), Settle::AfterDrain);
        apply(&mut table, 10, life());
        assert_eq!(table.held_lives(), 2);
        table.settle_short_lives(&BTreeSet::new(), Settle::AfterDrain);
        assert_eq!(table.held_lives(), 1);
        // A late record of the second life.
        apply(&mut table, 20, vec![Step::Map(10, "/bin/ls")]);
        assert_eq!(table.held_lives(), 0);
        let ls = &table.processes[&10];
        assert!(ls.exited && ls.comm == "ls");
        assert_eq!(
            &*table.code_mapping_for(10, 0x1100).unwrap().path,
            "/bin/ls"
        );
    }

    /// Not whole lives: a process that forked another in the batch (its child inherits its
    /// image then), a pid reused within the batch, records of a pid from before its fork, and
    /// any process while holding is off (stack copies are unwound as they are read).
    #[test]
    fn only_whole_lives_without_children_are_held() {
        let (records, _) = batch(
            0,
            vec![
                Step::Fork(10, 1),
                Step::Fork(11, 10),
                Step::Exit(10),
                Step::Exit(11),
                Step::Fork(12, 1),
                Step::Exit(12),
                Step::Fork(12, 1),
                Step::Exit(12),
                Step::Map(13, "/bin/late"),
                Step::Fork(13, 1),
                Step::Exit(13),
                Step::Fork(14, 1),
                Step::Fork(14, 14),
                Step::ThreadExit(15),
                Step::Exit(14),
            ],
        );
        let mut seen = HashMap::default();
        whole_lives(&records, &mut seen);
        let mut whole: Vec<u32> = seen
            .into_iter()
            .filter(|(_, state)| *state == Seen::Ended)
            .map(|(pid, _)| pid)
            .collect();
        whole.sort();
        assert_eq!(whole, [11, 14]);

        let mut table = shell();
        table.hold_short_lives = false;
        apply(&mut table, 0, churn_batch());
        assert!(table.knows(10) && table.knows(11) && table.held_lives() == 0);
    }
}
