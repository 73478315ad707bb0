//! The agent's half of content-addressed stacks: the stack cache (the frames of every stack hash
//! seen in the run) and taking stacks out of the kernel's stack-frames map into it.
//!
//! Why every count can be resolved: the program stores a stack's frames before it counts a
//! sample under the stack's hash, and only the agent deletes from the frames map, always by
//! taking entries into the cache, which forgets nothing. A drain reads a generation's counts
//! after every program run in it has finished, so each hash they reference was stored before:
//! it is still in the map, or it was taken into the cache by an earlier drain.
//!
//! What a drain reads: only the hashes its counts reference that the cache lacks, one lookup
//! each; or, when such new stacks are most of what the map holds or the map is a quarter full,
//! the whole map in a few batch calls, which empties it. Stacks seen again after a take are
//! stored again and read again at the next take, where each is compared with the cached frames:
//! a different stack under a cached hash (the kernel could not compare it, the first one having
//! been taken) makes that hash ambiguous, and samples counted under it from then on lose that
//! stack, counted as a hash collision.

use std::collections::{BTreeSet, HashMap, HashSet};

use anyhow::{bail, Context, Result};
use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::stack::{StackFrames, LOST_STACK, NO_STACK};

use super::batch;

/// Callchains taken from perf's own sample data carry context markers (PERF_CONTEXT_KERNEL,
/// PERF_CONTEXT_USER, ...), all at or above this value; they are not addresses.
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;

/// The frames of the stack hashes seen in this run (in the agent: those in use lately, see
/// [`StackCache::forget_cold`]), as raw instruction pointers, leaf first.
#[derive(Clone, Debug, Default)]
pub struct StackCache {
    frames: HashMap<u64, Vec<u64>>,
    /// Hashes under which a take found a different stack than the cached one.
    ambiguous: HashSet<u64>,
    /// Hashes read from the kernel since the last window closed (see
    /// [`StackCache::forget_cold`]).
    recent: HashSet<u64>,
}

impl StackCache {
    /// The frames of the stack named `hash`; none for `NO_STACK`, `LOST_STACK` and hashes not
    /// seen.
    pub fn frames(&self, hash: u64) -> &[u64] {
        self.frames.get(&hash).map_or(&[], Vec::as_slice)
    }

    /// Distinct stacks cached.
    pub fn distinct(&self) -> usize {
        self.frames.len()
    }

    /// The frames of `hashes` only (what one window references), with their ambiguity.
    pub fn subset(&self, hashes: impl IntoIterator<Item = u64>) -> StackCache {
        let mut subset = StackCache::default();
        for hash in hashes {
            if let Some(frames) = self.frames.get(&hash) {
                subset.frames.insert(hash, frames.clone());
            }
            if self.ambiguous.contains(&hash) {
                subset.ambiguous.insert(hash);
            }
        }
        subset
    }

    /// Forgets the stacks that are not in `keep` (what the window closing now references, and
    /// what blocks still off the CPU hold) and were not read from the kernel since the last
    /// window closed, so that a long-running agent's cache follows the stacks in use, not
    /// every stack it ever saw (under process churn each new process's stacks are new). The
    /// kernel's map no longer holds a stack taken from it, so a later sample of a forgotten
    /// stack stores it there again and a drain reads it anew. A stack read by the window's last
    /// drain may be counted in the generation that drain left running, so it stays for one
    /// more window.
    pub fn forget_cold(&mut self, keep: &HashSet<u64>) {
        let recent = std::mem::take(&mut self.recent);
        self.frames
            .retain(|hash, _| keep.contains(hash) || recent.contains(hash));
        let frames = &self.frames;
        self.ambiguous.retain(|hash| frames.contains_key(hash));
    }

    fn contains(&self, hash: u64) -> bool {
        self.frames.contains_key(&hash)
    }

    /// Caches the frames stored in the kernel under `hash`, or checks them against the cached
    /// ones.
    fn add(&mut self, hash: u64, stored: &StackFrames) {
        let frames: Vec<u64> = stored
            .frames()
            .iter()
            .copied()
            .filter(|ip| *ip < PERF_CONTEXT_MAX)
            .collect();
        self.recent.insert(hash);
        match self.frames.get(&hash) {
            Some(cached) if *cached == frames => {}
            Some(_) => {
                self.ambiguous.insert(hash);
            }
            None => {
                self.frames.insert(hash, frames);
            }
        }
    }

    /// Caches a stack the agent unwound itself (`--unwind copy`) under the hash the kernel
    /// would give it, and returns that hash (`NO_STACK` for no frames).
    pub fn intern(&mut self, frames: &[u64]) -> u64 {
        if frames.is_empty() {
            return NO_STACK;
        }
        let stack = StackFrames::from_frames(frames);
        let hash = stack.hash();
        self.add(hash, &stack);
        self.resolve(hash)
    }

    /// `hash` as a count may refer to it: `LOST_STACK` when ambiguous.
    pub fn resolve(&self, hash: u64) -> u64 {
        if self.ambiguous.contains(&hash) {
            LOST_STACK
        } else {
            hash
        }
    }
}

/// The agent's account of the kernel's stack-frames map.
#[derive(Debug)]
pub struct FramesMap {
    /// Entries the map holds at most.
    capacity: u64,
    /// Entries the program stored in generations already drained.
    stored: u64,
    /// Entries taken out of the map.
    taken: u64,
    /// Stacks read from the map: looked up and taken.
    pub read: u64,
}

impl FramesMap {
    pub fn new(capacity: u32) -> FramesMap {
        FramesMap {
            capacity: u64::from(capacity),
            stored: 0,
            taken: 0,
            read: 0,
        }
    }

    /// Counts the entries a generation stored, once it is drained.
    pub fn stored_in_drained_generation(&mut self, entries: u64) {
        self.stored += entries;
    }

    /// Entries in the map, with `active` stored so far by the generation being written.
    pub fn entries(&self, active: u64) -> u64 {
        (self.stored + active).saturating_sub(self.taken)
    }

    /// Whether the map is a quarter full, with `active` stored by the generation being written:
    /// time to take it.
    pub fn filling(&self, active: u64) -> bool {
        self.entries(active) * 4 > self.capacity
    }

    /// Brings the frames of every stack hash a drained generation refers to (`referenced`)
    /// into `cache`: reads those the cache lacks, or takes the whole map (see the module
    /// documentation).
    pub fn read_new_stacks(
        &mut self,
        map: &mut BpfHashMap<MapData, u64, StackFrames>,
        referenced: impl Iterator<Item = u64>,
        active: u64,
        cache: &mut StackCache,
    ) -> Result<()> {
        let unseen: BTreeSet<u64> = referenced
            .filter(|hash| *hash != NO_STACK && *hash != LOST_STACK && !cache.contains(*hash))
            .collect();
        let entries = self.entries(active);
        let mostly_new = !unseen.is_empty() && unseen.len() as u64 * 2 >= entries;
        if mostly_new || self.filling(active) {
            self.take_all(map, cache)?;
        } else {
            for hash in &unseen {
                let stored = map.get(hash, 0).with_context(|| {
                    format!("reading stack {hash:#x} from the stack-frames map")
                })?;
                cache.add(*hash, &stored);
                self.read += 1;
            }
        }
        if let Some(missing) = unseen.iter().find(|hash| !cache.contains(**hash)) {
            bail!(
                "stack {missing:#x} of a drained sample is neither in the agent's stack cache \
                 nor in the kernel's stack-frames map"
            );
        }
        Ok(())
    }

    /// Moves every entry of the map into `cache`.
    fn take_all(
        &mut self,
        map: &mut BpfHashMap<MapData, u64, StackFrames>,
        cache: &mut StackCache,
    ) -> Result<()> {
        let entries =
            match batch::take_all_shared_batched(map).context("taking the stack-frames map")? {
                Some(entries) => entries,
                None => {
                    let mut entries = Vec::new();
                    for entry in map.iter() {
                        entries.push(entry.context("reading the stack-frames map")?);
                    }
                    for (hash, _) in &entries {
                        map.remove(hash).context("clearing the stack-frames map")?;
                    }
                    entries
                }
            };
        for (hash, stored) in &entries {
            cache.add(*hash, stored);
        }
        self.taken += entries.len() as u64;
        self.read += entries.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_frames_without_perf_context_markers() {
        let mut cache = StackCache::default();
        let stored = StackFrames::from_frames(&[u64::MAX - 127, 0x401000, 0x402000]);
        cache.add(stored.hash(), &stored);
        assert_eq!(cache.frames(stored.hash()), &[0x401000, 0x402000]);
        assert_eq!(cache.frames(NO_STACK), &[] as &[u64]);
        assert_eq!(cache.resolve(stored.hash()), stored.hash());
    }

    #[test]
    fn a_different_stack_under_a_cached_hash_makes_the_hash_lose_its_stack() {
        let mut cache = StackCache::default();
        let first = StackFrames::from_frames(&[1, 2, 3]);
        let hash = first.hash();
        cache.add(hash, &first);
        // The same stack taken again changes nothing.
        cache.add(hash, &first);
        assert_eq!(cache.resolve(hash), hash);
        // Another stack stored under the hash after the first was taken.
        cache.add(hash, &StackFrames::from_frames(&[1, 2, 4]));
        assert_eq!(cache.resolve(hash), LOST_STACK);
        assert_eq!(cache.frames(hash), &[1, 2, 3]);
    }

    /// A window's close keeps what it referenced and what was cached since the last close
    /// (the running generation may count it), and forgets the rest.
    #[test]
    fn a_closing_window_forgets_the_stacks_neither_it_nor_its_drains_saw() {
        let mut cache = StackCache::default();
        let [old, used, new] = [[1, 2], [3, 4], [5, 6]].map(|frames| {
            let stack = StackFrames::from_frames(&frames);
            cache.add(stack.hash(), &stack);
            stack.hash()
        });
        // The first close: everything was cached during the window.
        cache.forget_cold(&HashSet::new());
        assert_eq!(cache.distinct(), 3);
        let again = StackFrames::from_frames(&[5, 6, 7]);
        cache.add(new, &again);
        assert_eq!(cache.resolve(new), LOST_STACK);
        // The second: only what it referenced stays, with its ambiguity.
        cache.forget_cold(&[used, new].into());
        assert_eq!(cache.frames(old), &[] as &[u64]);
        assert_eq!(cache.frames(used), &[3, 4]);
        assert_eq!(cache.resolve(new), LOST_STACK);
        // Taken from the kernel again since: it stays for the generation still running.
        cache.add(used, &StackFrames::from_frames(&[3, 4]));
        cache.forget_cold(&HashSet::new());
        assert_eq!(cache.distinct(), 1);
        assert_eq!(cache.resolve(new), new);
        cache.forget_cold(&HashSet::new());
        assert_eq!(cache.distinct(), 0);
    }

    #[test]
    fn the_map_is_filling_from_a_quarter_of_its_entries() {
        let mut map = FramesMap::new(1000);
        assert!(!map.filling(250));
        assert!(map.filling(251));
        map.stored_in_drained_generation(300);
        assert_eq!(map.entries(10), 310);
        map.taken = 300;
        assert_eq!(map.entries(10), 10);
        assert!(!map.filling(10));
    }
}
