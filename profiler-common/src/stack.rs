//! Content-addressed call stacks: the frames buffer a stack is written into, the 64-bit hash
//! that names a stack wherever it is seen (either generation, every drain, every run), and
//! interning a filled buffer into the profiler's frames map with its content verified, so two
//! different stacks are never merged because their hashes are equal.
//!
//! The capture program fills the buffer with `bpf_get_stack` (kernel stacks, frame-pointer user
//! stacks); an unwinder that fills the same buffer gets interning, verification and the agent's
//! stack cache without further changes.

/// Frames one stack holds at most: the kernel's default `perf_event_max_stack`, the depth
/// `bpf_get_stack` walks.
pub const MAX_STACK_DEPTH: usize = 127;

/// Stack hash stored when there is no stack to capture: a kernel thread has no user stack, a
/// sample taken in user mode no kernel stack.
pub const NO_STACK: u64 = 0;
/// Stack hash stored when a stack existed but could not be kept (counted in the loss kinds).
pub const LOST_STACK: u64 = u64::MAX;

/// One call stack, leaf first: the per-CPU buffer a stack is captured into, and the value of
/// the frames map (keyed by [`StackFrames::hash`]). Frames at and past `depth` are stale.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackFrames {
    pub depth: u64,
    pub frames: [u64; MAX_STACK_DEPTH],
}

const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl StackFrames {
    pub const EMPTY: StackFrames = StackFrames {
        depth: 0,
        frames: [0; MAX_STACK_DEPTH],
    };

    /// The frames a buffer of `frames` holds, cut to [`MAX_STACK_DEPTH`].
    pub fn from_frames(frames: &[u64]) -> StackFrames {
        let mut stack = StackFrames::EMPTY;
        let depth = frames.len().min(MAX_STACK_DEPTH);
        stack.frames[..depth].copy_from_slice(&frames[..depth]);
        stack.depth = depth as u64;
        stack
    }

    /// Valid frames, never more than the buffer holds. Masked, not clamped: writers never store
    /// a larger depth, and a clamp is a branch, on which the verifier walks every loop over the
    /// frames once with a depth below the buffer's and once with the buffer's (a tenth of the
    /// unwinder's checked instructions).
    #[inline(always)]
    pub fn depth(&self) -> usize {
        const { assert!((MAX_STACK_DEPTH + 1).is_power_of_two()) };
        (self.depth & MAX_STACK_DEPTH as u64) as usize
    }

    /// The valid frames, leaf first.
    pub fn frames(&self) -> &[u64] {
        &self.frames[..self.depth()]
    }

    /// The stack's name: a 64-bit hash of its depth and frames, the same in every run of every
    /// build (no seed), never [`NO_STACK`] or [`LOST_STACK`].
    #[inline(always)]
    pub fn hash(&self) -> u64 {
        let depth = self.depth();
        let mut hash = (depth as u64 + 1).wrapping_mul(MULTIPLIER);
        // Bounded by the constant so the verifier sees a finite loop.
        for i in 0..MAX_STACK_DEPTH {
            if i >= depth {
                break;
            }
            let mixed = (hash ^ self.frames[i]).wrapping_mul(MULTIPLIER);
            hash = mixed ^ (mixed >> 29);
        }
        let hash = finish(hash);
        if hash == NO_STACK || hash == LOST_STACK {
            hash ^ 1
        } else {
            hash
        }
    }

    /// Whether both hold the same stack: equal depth and frames.
    #[inline(always)]
    pub fn same_stack(&self, other: &StackFrames) -> bool {
        let depth = self.depth();
        if depth != other.depth() {
            return false;
        }
        // One exit, at the depth, as in `hash`: with a second exit on the first difference the
        // loop compiles to a countdown that verifiers before Linux 6.12 cannot bound.
        let mut differences = 0;
        for i in 0..MAX_STACK_DEPTH {
            if i >= depth {
                break;
            }
            differences |= self.frames[i] ^ other.frames[i];
        }
        differences == 0
    }
}

/// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
#[inline(always)]
const fn finish(mut hash: u64) -> u64 {
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// Why the frames map did not take a new stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The hash is there already (another CPU stored it first).
    Exists,
    /// No room, or the map was busy.
    Full,
}

/// The frames map, keyed by stack hash, as interning sees it.
pub trait StackStore {
    /// The frames stored under `hash`.
    fn stored(&self, hash: u64) -> Option<&StackFrames>;
    /// Stores `frames` under `hash` unless something is stored there already.
    fn insert_new(&self, hash: u64, frames: &StackFrames) -> Result<(), Refused>;
}

/// A stack interned: its hash, and whether this call stored it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interned {
    pub hash: u64,
    pub new: bool,
}

/// Why a stack could not be interned (each is a loss kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackLoss {
    /// A different stack is stored under the same hash.
    HashCollision,
    /// The frames map refused the stack; or, rarely, another CPU stored the same hash and the
    /// agent took it out again before it could be compared.
    Full,
}

/// Interns the stack in `frames` into `store`: stores it when its hash is new, else verifies
/// that the stored stack is this one. The stack's hash is what samples are counted under.
#[inline(always)]
pub fn intern<S: StackStore>(store: &S, frames: &StackFrames) -> Result<Interned, StackLoss> {
    let hash = frames.hash();
    let stored = match store.stored(hash) {
        Some(stored) => stored,
        None => match store.insert_new(hash, frames) {
            Ok(()) => return Ok(Interned { hash, new: true }),
            Err(Refused::Full) => return Err(StackLoss::Full),
            Err(Refused::Exists) => store.stored(hash).ok_or(StackLoss::Full)?,
        },
    };
    if stored.same_stack(frames) {
        Ok(Interned { hash, new: false })
    } else {
        Err(StackLoss::HashCollision)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use core::cell::RefCell;
    use std::{boxed::Box, collections::BTreeMap, vec::Vec};

    /// A frames map in memory, with a capacity, that can be made to answer as a racing CPU
    /// would: its next insert finds the hash taken by `racer`.
    struct Store {
        stored: RefCell<BTreeMap<u64, Box<StackFrames>>>,
        capacity: usize,
        racer: RefCell<Option<StackFrames>>,
    }

    impl Store {
        fn new(capacity: usize) -> Store {
            Store {
                stored: RefCell::new(BTreeMap::new()),
                capacity,
                racer: RefCell::new(None),
            }
        }
    }

    impl StackStore for Store {
        fn stored(&self, hash: u64) -> Option<&StackFrames> {
            let stored = self.stored.borrow();
            let frames: *const StackFrames = &**stored.get(&hash)?;
            // SAFETY: entries are boxed and never removed while the test runs.
            Some(unsafe { &*frames })
        }

        fn insert_new(&self, hash: u64, frames: &StackFrames) -> Result<(), Refused> {
            let mut stored = self.stored.borrow_mut();
            if let Some(racer) = self.racer.borrow_mut().take() {
                stored.insert(hash, Box::new(racer));
                return Err(Refused::Exists);
            }
            if stored.contains_key(&hash) {
                return Err(Refused::Exists);
            }
            if stored.len() == self.capacity {
                return Err(Refused::Full);
            }
            stored.insert(hash, Box::new(*frames));
            Ok(())
        }
    }

    fn stack(frames: &[u64]) -> StackFrames {
        StackFrames::from_frames(frames)
    }

    #[test]
    fn hashes_depend_on_every_frame_their_order_and_the_depth() {
        let base = stack(&[0x401000, 0x402000, 0x403000]);
        let variants = [
            stack(&[0x401000, 0x402000, 0x403001]),
            stack(&[0x402000, 0x401000, 0x403000]),
            stack(&[0x401000, 0x402000]),
            stack(&[0x401000, 0x402000, 0x403000, 0]),
            stack(&[]),
        ];
        for other in &variants {
            assert_ne!(base.hash(), other.hash(), "{:x?}", other.frames());
        }
        // Stale frames past the depth are not part of the stack.
        let mut stale = base;
        stale.frames[5] = 0xdead;
        assert_eq!(stale.hash(), base.hash());
        assert!(stale.same_stack(&base));
        // No seed: the name of a stack is fixed, across runs and builds.
        assert_eq!(stack(&[]).hash(), 0x9ca0_66f1_a4ab_2eea);
    }

    #[test]
    fn distinct_stacks_get_distinct_hashes_never_the_reserved_ones() {
        let mut seen = std::collections::BTreeSet::new();
        for depth in 1..20u64 {
            for leaf in 0..2000u64 {
                let frames: Vec<u64> = (0..depth)
                    .map(|i| 0x7f00_0000_1000 + leaf * 16 + i)
                    .collect();
                let hash = stack(&frames).hash();
                assert!(hash != NO_STACK && hash != LOST_STACK);
                assert!(seen.insert(hash), "depth {depth} leaf {leaf}");
            }
        }
    }

    #[test]
    fn deeper_stacks_are_cut_to_the_buffer() {
        let deep: Vec<u64> = (0..200).collect();
        let cut = stack(&deep);
        assert_eq!(cut.frames(), &deep[..MAX_STACK_DEPTH]);
        // No writer stores a depth past the buffer; one read from a damaged buffer still stays
        // within it.
        for depth in [128, 1000, u64::MAX] {
            let mut corrupt = cut;
            corrupt.depth = depth;
            assert!(corrupt.depth() <= MAX_STACK_DEPTH);
            assert_eq!(corrupt.frames().len(), corrupt.depth());
        }
    }

    #[test]
    fn interning_stores_new_stacks_once_and_finds_them_again() {
        let store = Store::new(8);
        let a = stack(&[1, 2, 3]);
        let b = stack(&[1, 2, 4]);
        let first = intern(&store, &a).unwrap();
        assert_eq!(
            first,
            Interned {
                hash: a.hash(),
                new: true
            }
        );
        assert_eq!(
            intern(&store, &a).unwrap(),
            Interned {
                hash: a.hash(),
                new: false
            }
        );
        assert!(intern(&store, &b).unwrap().new);
        assert_eq!(store.stored.borrow().len(), 2);
        assert_eq!(store.stored(a.hash()).unwrap().frames(), &[1, 2, 3]);
    }

    #[test]
    fn a_different_stack_under_the_same_hash_is_a_collision_not_a_merge() {
        let store = Store::new(8);
        let ours = stack(&[0x10, 0x20, 0x30]);
        // Plant another stack under our hash, as a 64-bit collision would.
        let other = stack(&[0x10, 0x20, 0x31]);
        store
            .stored
            .borrow_mut()
            .insert(ours.hash(), Box::new(other));
        assert_eq!(intern(&store, &ours), Err(StackLoss::HashCollision));
        // Same frames, another depth: also a different stack.
        let shorter = stack(&[0x10, 0x20]);
        store
            .stored
            .borrow_mut()
            .insert(shorter.hash(), Box::new(stack(&[0x10, 0x20, 0])));
        assert_eq!(intern(&store, &shorter), Err(StackLoss::HashCollision));
        // What is stored is left alone.
        assert_eq!(store.stored(ours.hash()).unwrap().frames(), other.frames());
    }

    #[test]
    fn a_hash_another_cpu_stored_first_is_verified_too() {
        let ours = stack(&[7, 8, 9]);
        let same = Store::new(8);
        *same.racer.borrow_mut() = Some(ours);
        assert_eq!(
            intern(&same, &ours),
            Ok(Interned {
                hash: ours.hash(),
                new: false
            })
        );
        let different = Store::new(8);
        *different.racer.borrow_mut() = Some(stack(&[7, 8, 10]));
        assert_eq!(intern(&different, &ours), Err(StackLoss::HashCollision));
    }

    #[test]
    fn a_full_store_loses_new_stacks_but_keeps_counting_known_ones() {
        let store = Store::new(1);
        let known = stack(&[1]);
        intern(&store, &known).unwrap();
        assert_eq!(intern(&store, &stack(&[2])), Err(StackLoss::Full));
        assert_eq!(
            intern(&store, &known),
            Ok(Interned {
                hash: known.hash(),
                new: false
            })
        );
    }
}
