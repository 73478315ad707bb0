//! Where the files' unwind tables lie in the capture program's row arena, and which to evict
//! when a table does not fit: first the tables no live process maps any more, then those of the
//! processes sampled longest ago, never one in use by a process about as busy as the one that
//! needs the room (two busy processes would evict each other's tables on every sample).

use std::collections::BTreeMap;

/// A table's rows in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub start: u32,
    pub len: u32,
}

/// The arena's occupied row ranges.
#[derive(Debug)]
pub struct ArenaSpace {
    capacity: u32,
    /// Start -> rows, not overlapping.
    used: BTreeMap<u32, u32>,
}

impl ArenaSpace {
    pub fn new(capacity: u32) -> ArenaSpace {
        ArenaSpace {
            capacity,
            used: BTreeMap::new(),
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Rows held by tables.
    pub fn used_rows(&self) -> u64 {
        self.used.values().map(|&len| u64::from(len)).sum()
    }

    /// Takes `len` rows at the lowest free place; `None` when no free run is that long.
    pub fn allocate(&mut self, len: u32) -> Option<Placed> {
        let start = self.first_fit(len, &[])?;
        self.used.insert(start, len);
        Some(Placed { start, len })
    }

    pub fn free(&mut self, start: u32) {
        self.used.remove(&start);
    }

    /// How many of `victims` (table starts, in the order they may go) must be freed for `len`
    /// rows to fit; `None` when freeing them all is not enough.
    pub fn victims_needed(&self, len: u32, victims: &[u32]) -> Option<usize> {
        (0..=victims.len()).find(|&n| self.first_fit(len, &victims[..n]).is_some())
    }

    /// Where `len` rows can go once the tables at `freed` are gone, moving tables aside where
    /// the free rows are split: the run's start and the moves (old start, new place), each
    /// table moved to free rows outside the run (its old rows stay readable until it is
    /// repointed). Tables at `pinned` do not move. `None` when no run can be cleared.
    pub fn room_for(&self, len: u32, freed: &[u32], pinned: &[u32]) -> Option<RoomPlan> {
        let mut space = ArenaSpace {
            capacity: self.capacity,
            used: self.used.clone(),
        };
        freed.iter().for_each(|start| space.free(*start));
        if let Some(start) = space.first_fit(len, &[]) {
            return Some(RoomPlan {
                start,
                moves: Vec::new(),
            });
        }
        // Runs starting where free rows start: each run's tables move out, the fewest rows
        // moved first.
        let starts =
            std::iter::once(0).chain(space.used.iter().map(|(&start, &used)| start + used));
        let mut plans: Vec<RoomPlan> = starts
            .filter_map(|start| space.clear_run(start, len, pinned))
            .collect();
        plans.sort_by_key(|plan| {
            plan.moves
                .iter()
                .map(|(_, to)| u64::from(to.len))
                .sum::<u64>()
        });
        plans.into_iter().next()
    }

    /// Clears `start..start + len` by moving its tables to free rows outside it.
    fn clear_run(&self, start: u32, len: u32, pinned: &[u32]) -> Option<RoomPlan> {
        let end = start.checked_add(len).filter(|&end| end <= self.capacity)?;
        let inside: Vec<(u32, u32)> = self
            .used
            .range(..end)
            .filter(|(&table, &used)| table + used > start)
            .map(|(&table, &used)| (table, used))
            .collect();
        if inside.iter().any(|(table, _)| pinned.contains(table)) {
            return None;
        }
        let mut space = ArenaSpace {
            capacity: self.capacity,
            used: self.used.clone(),
        };
        inside.iter().for_each(|(table, _)| space.free(*table));
        space.used.insert(start, len);
        // The largest first, while the free rows are least split.
        let mut moving = inside.clone();
        moving.sort_by_key(|&(table, used)| (std::cmp::Reverse(used), table));
        let mut moves = Vec::new();
        for (table, used) in moving {
            let to = space.allocate(used)?;
            moves.push((table, to));
        }
        Some(RoomPlan { start, moves })
    }

    /// Takes the rows at `placed`, chosen by a [`RoomPlan`].
    pub fn take(&mut self, placed: Placed) {
        self.used.insert(placed.start, placed.len);
    }

    /// The lowest start of `len` free rows, counting the tables at `freed` as gone.
    fn first_fit(&self, len: u32, freed: &[u32]) -> Option<u32> {
        let mut free_from = 0u64;
        for (&start, &used) in &self.used {
            if freed.contains(&start) {
                continue;
            }
            if u64::from(start) - free_from >= u64::from(len) {
                return u32::try_from(free_from).ok();
            }
            free_from = u64::from(start) + u64::from(used);
        }
        (u64::from(self.capacity).saturating_sub(free_from) >= u64::from(len))
            .then_some(free_from as u32)
    }
}

/// How to make a free run: the tables to move, each to a new place outside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoomPlan {
    pub start: u32,
    pub moves: Vec<(u32, Placed)>,
}

/// How recently a placed table was used: by the process that used it last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableUse {
    /// No live process maps it.
    Unmapped,
    /// The newest use stamp among the processes that map it.
    LastUsed(u32),
}

/// Use-stamp periods (about 17 ms each) by which the process needing room must have been
/// sampled more recently than every user of a table it evicts: about 250 ms.
pub const BUSIER_BY: u32 = 15;

/// The tables that may be evicted for a process last sampled at `needer` (a use stamp), at use
/// stamp `now`, in the order they go: the unmapped ones, then the least recently used;
/// `tables` pairs each table's start with its use.
pub fn eviction_order(tables: &[(u32, TableUse)], needer: u32, now: u32) -> Vec<u32> {
    let needer_age = now.wrapping_sub(needer);
    let mut candidates: Vec<(u32, u32)> = tables
        .iter()
        .filter_map(|&(start, used)| match used {
            TableUse::Unmapped => Some((u32::MAX, start)),
            TableUse::LastUsed(stamp) => {
                let age = now.wrapping_sub(stamp);
                (age > needer_age.saturating_add(BUSIER_BY)).then_some((age, start))
            }
        })
        .collect();
    // Oldest first; among equals, the lower start (a stable order).
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    candidates.into_iter().map(|(_, start)| start).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_placed_first_fit_and_freed_rows_are_reused() {
        let mut space = ArenaSpace::new(100);
        assert_eq!(space.allocate(40), Some(Placed { start: 0, len: 40 }));
        assert_eq!(space.allocate(30), Some(Placed { start: 40, len: 30 }));
        assert_eq!(space.allocate(31), None);
        assert_eq!(space.allocate(30), Some(Placed { start: 70, len: 30 }));
        assert_eq!(space.used_rows(), 100);
        space.free(40);
        // The hole at 40..70 takes 30 rows at most.
        assert_eq!(space.allocate(31), None);
        assert_eq!(space.allocate(20), Some(Placed { start: 40, len: 20 }));
        assert_eq!(space.allocate(10), Some(Placed { start: 60, len: 10 }));
        assert_eq!(space.used_rows(), 100);
        space.free(70);
        space.free(0);
        assert_eq!(space.used_rows(), 30);
    }

    #[test]
    fn only_as_many_victims_go_as_make_a_long_enough_free_run() {
        let mut space = ArenaSpace::new(100);
        for len in [25, 25, 25, 25] {
            space.allocate(len).unwrap();
        }
        // Freeing the tables at 0 and 50 leaves two runs of 25: 50 rows need 25 as well.
        assert_eq!(space.victims_needed(50, &[0, 50, 25, 75]), Some(3));
        assert_eq!(space.victims_needed(25, &[75]), Some(1));
        assert_eq!(space.victims_needed(0, &[75]), Some(0));
        // More than the arena holds: no victims help.
        assert_eq!(space.victims_needed(101, &[0, 25, 50, 75]), None);
        // 75 rows free once 0, 50 and 75 go, but split around the table at 25.
        assert_eq!(space.victims_needed(60, &[0, 50, 75]), None);
        // Moving the table at 25 aside joins them.
        let plan = space.room_for(60, &[0, 50, 75], &[]).unwrap();
        assert_eq!(plan.moves.len(), 1);
        assert_eq!(plan.moves[0].0, 25);
        assert_eq!(space.room_for(60, &[0, 50, 75], &[25]), None);
    }

    #[test]
    fn split_free_rows_are_joined_by_moving_tables_out_of_one_run() {
        // 100 rows: tables at 0..20, 30..50 (pinned), 60..70; free: 20..30, 50..60, 70..100.
        let mut space = ArenaSpace::new(100);
        for (start, len) in [(0, 20), (30, 20), (60, 10)] {
            space.used.insert(start, len);
        }
        assert_eq!(space.first_fit(35, &[]), None);
        // 35 rows: the run from 50 holds only the 10-row table, which moves to 20.
        let plan = space.room_for(35, &[], &[30]).unwrap();
        assert_eq!(plan.start, 50);
        assert_eq!(plan.moves, [(60, Placed { start: 20, len: 10 })]);
        // With the table at 0 freed, the pinned table still splits the free rows: the run
        // from 50 is cleared, its table moved to 0.
        let plan = space.room_for(45, &[0], &[30]).unwrap();
        assert_eq!(plan.start, 50);
        assert_eq!(plan.moves, [(60, Placed { start: 0, len: 10 })]);
        // Already free: no moves.
        assert_eq!(space.room_for(10, &[], &[]).unwrap().moves, []);
        // More than the free and movable rows: no plan.
        assert_eq!(space.room_for(61, &[], &[30]), None);
        // Nothing overlaps afterwards: the tables that stay, the run, the moved tables.
        let plan = space.room_for(50, &[], &[]).unwrap();
        let moved: Vec<u32> = plan.moves.iter().map(|(old, _)| *old).collect();
        let mut ranges: Vec<(u32, u32)> = space
            .used
            .iter()
            .filter(|(start, _)| !moved.contains(start))
            .map(|(&start, &len)| (start, start + len))
            .collect();
        ranges.push((plan.start, plan.start + 50));
        ranges.extend(
            plan.moves
                .iter()
                .map(|(_, to)| (to.start, to.start + to.len)),
        );
        ranges.sort_unstable();
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:?}");
        assert!(ranges.last().unwrap().1 <= 100);
    }

    #[test]
    fn unmapped_tables_go_first_then_the_least_recently_used_never_a_busy_one() {
        let now = 1000;
        let tables = [
            (0, TableUse::LastUsed(now - 100)),
            (10, TableUse::Unmapped),
            (20, TableUse::LastUsed(now - 400)),
            // Used about as recently as the needer: kept.
            (30, TableUse::LastUsed(now - BUSIER_BY)),
            (40, TableUse::LastUsed(now)),
        ];
        assert_eq!(eviction_order(&tables, now, now), [10, 20, 0]);
        // A needer idle for 200 periods may evict only what has been idle longer still.
        assert_eq!(eviction_order(&tables, now - 200, now), [10, 20]);
        // Across the stamp's wrap.
        let tables = [
            (0, TableUse::LastUsed(u32::MAX - 50)),
            (1, TableUse::LastUsed(3)),
        ];
        assert_eq!(eviction_order(&tables, 5, 5), [0]);
    }
}
