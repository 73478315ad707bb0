//! The kernel's own record of a process's mappings (Linux 6.1 on): a maple tree of its VMAs
//! under `mm_struct.mm_mt`, walked here the way the kernel's lookup (`mtree_lookup_walk`) walks
//! it, so that the unwinder finds the mapping that holds an address in the sampled process
//! itself, before the agent has published the process (a short process's whole life).
//!
//! The walker reads the tree without its lock (a BPF program may not take it more than once a
//! run), from copies of the nodes the reader makes with a checking helper: a node freed or
//! rewritten meanwhile gives a stale or no answer, never a fault, and the caller checks the VMA
//! it gets against the address. Written for the verifier: constant bounds, masked indexes.

/// Words of one tree node (256 bytes, the size of every node kind).
pub const NODE_WORDS: usize = 32;

/// Levels walked at most: inner nodes have 10 or 16 children, so 8 levels hold far more VMAs
/// than a process may have (`vm.max_map_count`, 65,530 by default).
pub const MAX_LEVELS: u32 = 8;

/// Low bits of an encoded node pointer: its type and flags (`MAPLE_NODE_MASK`).
const NODE_MASK: u64 = 0xff;
/// The bit that marks the tree's root entry as a node (`MAPLE_ROOT_NODE`); the nodes below
/// are encoded without it.
const ROOT_NODE: u64 = 0x2;
const TYPE_SHIFT: u32 = 3;
const TYPE_MASK: u64 = 0xf;
/// `enum maple_type`: a leaf's slots hold the entries; the two inner kinds hold children.
const LEAF_64: u64 = 1;
const RANGE_64: u64 = 2;
const ARANGE_64: u64 = 3;
/// Pivots of each node kind (`mt_pivots`): one fewer than its slots.
const RANGE_PIVOTS: u32 = 15;
const ARANGE_PIVOTS: u32 = 9;

/// Where the node kinds keep their pivots and slots, in words from the node's start, and the
/// byte that says how many slots a node uses (`maple_metadata.end`), in bytes from its start
/// (from the kernel's BTF: `maple_range_64`, whose layout leaves share, and `maple_arange_64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLayout {
    pub range_pivots: u32,
    pub range_slots: u32,
    pub range_end: u32,
    pub arange_pivots: u32,
    pub arange_slots: u32,
    pub arange_end: u32,
}

impl NodeLayout {
    /// The layout from byte offsets (pivots, slots, end byte of each kind), `None` unless every
    /// array lies whole inside a node, on word boundaries, and the end bytes inside it (a
    /// kernel laid out otherwise is not walked).
    pub fn from_offsets(range: [u32; 3], arange: [u32; 3]) -> Option<NodeLayout> {
        let words = |offset: u32, len: u32| {
            (offset.is_multiple_of(8) && offset / 8 + len <= NODE_WORDS as u32)
                .then_some(offset / 8)
        };
        let byte = |offset: u32| (offset < NODE_WORDS as u32 * 8).then_some(offset);
        Some(NodeLayout {
            range_pivots: words(range[0], RANGE_PIVOTS)?,
            range_slots: words(range[1], RANGE_PIVOTS + 1)?,
            range_end: byte(range[2])?,
            arange_pivots: words(arange[0], ARANGE_PIVOTS)?,
            arange_slots: words(arange[1], ARANGE_PIVOTS + 1)?,
            arange_end: byte(arange[2])?,
        })
    }
}

/// Whether the tree's root entry is a node (`xa_is_node`): an internal entry (low bits `10`)
/// above the first page; otherwise the tree holds at most one entry, at index 0.
#[inline(always)]
fn root_is_node(root: u64) -> bool {
    root & 3 == ROOT_NODE && root > 4096
}

/// The entry the tree rooted at `root` holds for `index` (a VMA's address, 0 where no VMA
/// is), reading each node into `node` with `read(address, node)`; `None` when the walk could
/// not finish: a node that could not be read, one being replaced (dead), an unknown node kind,
/// a root that is no node (a tree of at most one entry), or deeper than [`MAX_LEVELS`].
#[inline(always)]
pub fn lookup(
    root: u64,
    index: u64,
    layout: &NodeLayout,
    node: &mut [u64; NODE_WORDS],
    mut read: impl FnMut(u64, &mut [u64; NODE_WORDS]) -> bool,
) -> Option<u64> {
    let word = |i: u32| (i as usize) & (NODE_WORDS - 1);
    let byte = |node: &[u64; NODE_WORDS], at: u32| (node[word(at / 8)] >> (at % 8 * 8)) & 0xff;
    if !root_is_node(root) {
        return None;
    }
    let mut entry = root & !ROOT_NODE;
    for _ in 0..MAX_LEVELS {
        let address = entry & !NODE_MASK;
        if address == 0 {
            return None;
        }
        let kind = (entry >> TYPE_SHIFT) & TYPE_MASK;
        let (pivots, slots, count, end_at) = match kind {
            LEAF_64 | RANGE_64 => (
                layout.range_pivots,
                layout.range_slots,
                RANGE_PIVOTS,
                layout.range_end,
            ),
            ARANGE_64 => (
                layout.arange_pivots,
                layout.arange_slots,
                ARANGE_PIVOTS,
                layout.arange_end,
            ),
            _ => return None,
        };
        if !read(address, node) {
            return None;
        }
        // A node being replaced points its parent at itself (`ma_dead_node`).
        if node[0] & !NODE_MASK == address {
            return None;
        }
        // The last slot in use (`ma_data_end`): a range node or leaf whose last pivot is set
        // is full (its last slot's range ends at the node's end, which is no pivot); any other
        // node says in its metadata.
        let full = kind != ARANGE_64 && node[word(pivots + RANGE_PIVOTS - 1)] != 0;
        let end = if full {
            u64::from(count)
        } else {
            byte(node, end_at)
        };
        // The first slot in use whose pivot (its range's last index) reaches `index`; past the
        // pivots, the last slot in use, whose range ends at the node's end.
        let mut offset = end.min(u64::from(count)) as u32;
        for i in 0..RANGE_PIVOTS {
            if u64::from(i) < end && i < count && node[word(pivots + i)] >= index {
                offset = i;
                break;
            }
        }
        entry = node[word(slots + offset)];
        if kind == LEAF_64 {
            return Some(entry);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    /// The x86-64 layout of Linux 6.1 to 6.18.
    const LAYOUT: NodeLayout = NodeLayout {
        range_pivots: 1,
        range_slots: 16,
        range_end: 248,
        arange_pivots: 1,
        arange_slots: 10,
        arange_end: 240,
    };

    /// A tree in a map of node address -> words, as a test reads it.
    struct Tree {
        nodes: std::collections::BTreeMap<u64, [u64; NODE_WORDS]>,
    }

    impl Tree {
        /// A node as the kernel writes it: the last slot's pivot is the node's end, stored only
        /// where the node has room for it, and a node not full says where its data ends.
        fn node(&mut self, address: u64, kind: u64, pivots: &[u64], slots: &[u64]) -> u64 {
            let (pivot_at, slot_at, end_at, count) = match kind {
                ARANGE_64 => (
                    LAYOUT.arange_pivots,
                    LAYOUT.arange_slots,
                    LAYOUT.arange_end,
                    ARANGE_PIVOTS,
                ),
                _ => (
                    LAYOUT.range_pivots,
                    LAYOUT.range_slots,
                    LAYOUT.range_end,
                    RANGE_PIVOTS,
                ),
            };
            let mut words = [0; NODE_WORDS];
            words[0] = 0x1000_0000; // a parent elsewhere
            for (i, pivot) in pivots.iter().enumerate().take(count as usize) {
                words[pivot_at as usize + i] = *pivot;
            }
            for (i, slot) in slots.iter().enumerate() {
                words[slot_at as usize + i] = *slot;
            }
            if kind == ARANGE_64 || pivots.len() < count as usize {
                let end = slots.len() as u64 - 1;
                words[end_at as usize / 8] |= end << (end_at % 8 * 8);
            }
            self.nodes.insert(address, words);
            // `mt_mk_node`: the address, the type, and the bit every encoded node carries.
            address | kind << TYPE_SHIFT | 4
        }

        fn lookup(&self, root: u64, index: u64) -> Option<u64> {
            let mut node = [0; NODE_WORDS];
            lookup(
                root,
                index,
                &LAYOUT,
                &mut node,
                |address, into| match self.nodes.get(&address) {
                    Some(words) => {
                        *into = *words;
                        true
                    }
                    None => false,
                },
            )
        }
    }

    #[test]
    fn finds_the_entry_whose_range_holds_the_index_through_inner_nodes() {
        let mut tree = Tree {
            nodes: Default::default(),
        };
        // Leaf 1: gap to 0x3fff, VMA A 0x4000-0x4fff, gap to the leaf's end 0x7fff, which its
        // pivots need not hold; leaf 2: VMA B 0x8000-0x8fff, then a gap to the end.
        let left = tree.node(0x10_0000, LEAF_64, &[0x3fff, 0x4fff], &[0, 0xa0, 0]);
        let right = tree.node(0x10_0100, LEAF_64, &[0x8fff], &[0xb0, 0]);
        let root = tree.node(0x10_0200, ARANGE_64, &[0x7fff], &[left, right]) | ROOT_NODE;
        assert_eq!(tree.lookup(root, 0x4000), Some(0xa0));
        assert_eq!(tree.lookup(root, 0x4fff), Some(0xa0));
        assert_eq!(tree.lookup(root, 0x5000), Some(0));
        assert_eq!(tree.lookup(root, 0x1000), Some(0));
        assert_eq!(tree.lookup(root, 0x8000), Some(0xb0));
        assert_eq!(tree.lookup(root, 0x9000), Some(0));
        // A full node: past its last pivot, its last slot.
        let pivots: [u64; 16] = core::array::from_fn(|i| (i as u64 + 1) * 0x1000 - 1);
        let slots: [u64; 16] = core::array::from_fn(|i| (i as u64 + 1) * 0x10);
        let full = tree.node(0x20_0000, LEAF_64, &pivots, &slots) | ROOT_NODE;
        assert_eq!(tree.lookup(full, 0x0), Some(0x10));
        assert_eq!(tree.lookup(full, 0xe000), Some(0xf0));
        assert_eq!(tree.lookup(full, 0xf_0000), Some(0x100));
    }

    #[test]
    fn a_walk_that_cannot_finish_gives_no_entry() {
        let mut tree = Tree {
            nodes: Default::default(),
        };
        let leaf = tree.node(0x10_0000, LEAF_64, &[], &[0xa0]);
        // Unreadable child, a root that is a plain entry, a dead node, an unknown kind.
        let unreadable = 0x30_0000 | LEAF_64 << TYPE_SHIFT | 4;
        let root = tree.node(0x10_0200, RANGE_64, &[0xfff], &[leaf, unreadable]) | ROOT_NODE;
        assert_eq!(tree.lookup(root, 0x100), Some(0xa0));
        assert_eq!(tree.lookup(root, 0x1000), None);
        assert_eq!(tree.lookup(0xa0, 0x100), None);
        tree.nodes.get_mut(&0x10_0000).unwrap()[0] = 0x10_0000 | 0x7;
        assert_eq!(tree.lookup(root, 0x100), None);
        assert_eq!(
            tree.lookup(0x10_0000 | 4 | ROOT_NODE, 0x100),
            None,
            "maple_dense"
        );
        // A cycle of inner nodes ends at the level bound.
        let cycle = 0x40_0000 | RANGE_64 << TYPE_SHIFT | 4;
        tree.node(0x40_0000, RANGE_64, &[], &[cycle]);
        assert_eq!(tree.lookup(cycle | ROOT_NODE, 0x100), None);
        // A leaf as the root: a process with few mappings.
        let small = tree.node(0x50_0000, LEAF_64, &[0xfff], &[0, 0xc0]) | ROOT_NODE;
        assert_eq!(tree.lookup(small, 0x1000), Some(0xc0));
    }

    #[test]
    fn layouts_that_do_not_fit_a_node_are_refused() {
        let layout = |range_slots| NodeLayout::from_offsets([8, range_slots, 248], [8, 80, 240]);
        assert_eq!(layout(128), Some(LAYOUT));
        assert_eq!(layout(132), None, "unaligned");
        assert_eq!(layout(136), None, "past the node");
        assert_eq!(NodeLayout::from_offsets([8, 128, 256], [8, 80, 240]), None);
    }
}
