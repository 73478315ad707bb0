//! Kernel structure layouts from BTF: the few field offsets the capture program needs to read
//! `perf_sample_data` and `perf_event` behind its context pointer, found in the running kernel's
//! type information (/sys/kernel/btf/vmlinux) instead of being compiled in, so one profiler
//! binary works across kernel versions.
//!
//! This reads raw BTF as laid out in the kernel's Documentation/bpf/btf.rst: a header, a type
//! section (every type a `btf_type` followed by kind-specific data) and a string section. Every
//! read is bounds-checked: a malformed blob gives an error or `None`, never a panic.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use profiler_common::{
    capture::{KernelOffsets, OFFSETS_SAMPLE_FLAGS, OFFSETS_VALID, OFFSETS_VMA_TREE, UPID_BYTES},
    maple::NodeLayout,
};

/// Where the kernel publishes its own BTF.
pub const KERNEL_BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const VERSION: u8 = 1;
/// Bytes of the fixed header fields this reader uses; `hdr_len` may be larger (newer headers).
const HEADER_LEN: usize = 24;
/// Bytes of `struct btf_type`.
const TYPE_LEN: usize = 12;
/// Bytes of `struct btf_member`.
const MEMBER_LEN: usize = 12;
/// Longest chain of typedefs/qualifiers and deepest nesting of anonymous members followed: far
/// beyond real C, small enough that a cyclic malformed blob cannot recurse without bound.
const MAX_CHAIN: usize = 64;

mod kind {
    pub const INT: u32 = 1;
    pub const PTR: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const FWD: u32 = 7;
    pub const TYPEDEF: u32 = 8;
    pub const VOLATILE: u32 = 9;
    pub const CONST: u32 = 10;
    pub const RESTRICT: u32 = 11;
    pub const FUNC: u32 = 12;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const FLOAT: u32 = 16;
    pub const DECL_TAG: u32 = 17;
    pub const TYPE_TAG: u32 = 18;
    pub const ENUM64: u32 = 19;
}

/// Why BTF could not be read or lacks what the capture program needs.
#[derive(Debug)]
pub enum BtfError {
    /// The running kernel publishes no BTF.
    NotFound { path: PathBuf },
    /// The BTF file exists but could not be read.
    Unreadable { path: PathBuf, source: io::Error },
    /// The bytes are not valid BTF.
    Malformed(String),
    /// A structure or member the capture program reads is absent from this kernel.
    MissingMember {
        structure: &'static str,
        member: &'static str,
    },
}

impl fmt::Display for BtfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BtfError::NotFound { path } => write!(
                f,
                "kernel BTF not found at {}: the kernel needs CONFIG_DEBUG_INFO_BTF=y (or give \
                 a BTF file with --btf); without it the profiler captures IPs and stacks only \
                 (no data addresses, latencies, or several events at once)",
                path.display()
            ),
            BtfError::Unreadable { path, source } => write!(
                f,
                "cannot read kernel BTF at {}: {source}; without it the profiler captures IPs \
                 and stacks only (no data addresses or latencies)",
                path.display()
            ),
            BtfError::Malformed(why) => write!(f, "malformed BTF: {why}"),
            BtfError::MissingMember { structure, member } => write!(
                f,
                "kernel BTF has no `{structure}.{member}`: this kernel's perf layout is not one \
                 the profiler knows, so it captures IPs and stacks only (no data addresses or \
                 latencies)"
            ),
        }
    }
}

impl std::error::Error for BtfError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BtfError::Unreadable { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Where a member lies inside its outermost named structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberLocation {
    /// Bits from the start of the structure, anonymous enclosing members included.
    pub bit_offset: u32,
    /// Width in bits when the member is a bitfield.
    pub bitfield_bits: Option<u32>,
}

impl MemberLocation {
    /// Byte offset, when the member starts on a byte and is not a bitfield.
    pub fn byte_offset(&self) -> Option<u32> {
        (self.bitfield_bits.is_none() && self.bit_offset.is_multiple_of(8))
            .then_some(self.bit_offset / 8)
    }
}

/// Parsed BTF: the type and string sections plus where each type starts.
pub struct Btf {
    big_endian: bool,
    types: Vec<u8>,
    strings: Vec<u8>,
    /// Byte offset in `types` of type id `i + 1` (id 0 is `void` and has no record).
    type_starts: Vec<usize>,
    /// First struct or union of each name, and first typedef of each name, by type id: kernel
    /// BTF has over a hundred thousand types, too many to scan per lookup.
    composites: HashMap<Vec<u8>, u32>,
    typedefs: HashMap<Vec<u8>, u32>,
}

/// One `btf_type` record, decoded.
#[derive(Clone, Copy)]
struct TypeRecord {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// `size` for sized kinds, the referenced type id for the others.
    size_or_type: u32,
    /// Offset in the type section of the kind-specific data that follows the record.
    extra: usize,
}

impl Btf {
    /// Reads the running kernel's BTF.
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        Btf::from_file(Path::new(KERNEL_BTF_PATH))
    }

    /// Reads BTF from a file (the kernel's, or one shipped separately for kernels without it).
    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let bytes = std::fs::read(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => BtfError::NotFound {
                path: path.to_path_buf(),
            },
            _ => BtfError::Unreadable {
                path: path.to_path_buf(),
                source,
            },
        })?;
        Btf::parse(&bytes)
    }

    /// Parses a raw BTF blob (either byte order, as told by its magic).
    pub fn parse(bytes: &[u8]) -> Result<Btf, BtfError> {
        let big_endian = match bytes.get(..2) {
            Some(m) if u16::from_le_bytes([m[0], m[1]]) == MAGIC => false,
            Some(m) if u16::from_be_bytes([m[0], m[1]]) == MAGIC => true,
            _ => return Err(malformed("no BTF magic 0xeb9f at the start")),
        };
        let header_u32 = |pos| {
            read_u32(bytes, pos, big_endian)
                .ok_or_else(|| malformed(format!("header truncated at {} bytes", bytes.len())))
        };
        match bytes.get(2) {
            Some(&VERSION) => {}
            Some(version) => {
                return Err(malformed(format!(
                    "version {version} (this reader knows {VERSION})"
                )))
            }
            None => return Err(malformed("header truncated at 2 bytes")),
        }
        let hdr_len = header_u32(4)? as usize;
        if hdr_len < HEADER_LEN || hdr_len > bytes.len() {
            return Err(malformed(format!(
                "header length {hdr_len} outside {HEADER_LEN}..={}",
                bytes.len()
            )));
        }
        let section = |off_pos: usize, name: &str| -> Result<&[u8], BtfError> {
            let off = header_u32(off_pos)? as usize;
            let len = header_u32(off_pos + 4)? as usize;
            hdr_len
                .checked_add(off)
                .and_then(|start| Some(start..start.checked_add(len)?))
                .and_then(|range| bytes.get(range))
                .ok_or_else(|| {
                    malformed(format!(
                        "{name} section ({len} bytes at {off}) runs past the end of the {} bytes",
                        bytes.len()
                    ))
                })
        };
        let types = section(8, "type")?.to_vec();
        let strings = section(16, "string")?.to_vec();
        let type_starts = index_types(&types, big_endian)?;
        let mut btf = Btf {
            big_endian,
            types,
            strings,
            type_starts,
            composites: HashMap::new(),
            typedefs: HashMap::new(),
        };
        btf.index_names();
        Ok(btf)
    }

    /// Byte offset of `member` in the struct or union named `struct_name`, looking through
    /// anonymous struct/union members. `None` when either is absent, or the member is a bitfield.
    pub fn member_offset(&self, struct_name: &str, member: &str) -> Option<u32> {
        self.member_location(struct_name, member)?.byte_offset()
    }

    /// Bit position (and bitfield width) of `member` in the struct or union named
    /// `struct_name` (or a typedef of one), looking through anonymous struct/union members.
    pub fn member_location(&self, struct_name: &str, member: &str) -> Option<MemberLocation> {
        let id = self.composite_named(struct_name)?;
        self.locate_member(id, member.as_bytes(), 0, 0)
    }

    /// The offsets the capture program needs to read sample data behind its context pointer.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, BtfError> {
        let offset = |structure: &'static str, member: &'static str| {
            self.member_offset(structure, member)
                .ok_or(BtfError::MissingMember { structure, member })
        };
        let ctx = "bpf_perf_event_data_kern";
        let sample = "perf_sample_data";
        let event = "perf_event";
        let raw = "perf_raw_record";
        let frag = "perf_raw_frag";
        // Linux 6.1 added it; before, the event's sample_type says what the sample holds.
        let sample_flags = self.member_offset(sample, "sample_flags");
        let vma_tree = self.vma_tree_offsets();
        let namespaced_tid = self.namespaced_tid_offsets();
        Ok(KernelOffsets {
            valid: OFFSETS_VALID
                | if sample_flags.is_some() {
                    OFFSETS_SAMPLE_FLAGS
                } else {
                    0
                }
                | if vma_tree.is_some() {
                    OFFSETS_VMA_TREE
                } else {
                    0
                },
            ctx_data: offset(ctx, "data")?,
            ctx_event: offset(ctx, "event")?,
            sample_flags: sample_flags.unwrap_or(0),
            addr: offset(sample, "addr")?,
            phys_addr: offset(sample, "phys_addr")?,
            weight: offset(sample, "weight")?,
            data_src: offset(sample, "data_src")?,
            raw: offset(sample, "raw")?,
            event_parent: offset(event, "parent")?,
            event_id: offset(event, "id")?,
            event_sample_type: offset(event, "attr")? + offset("perf_event_attr", "sample_type")?,
            raw_frag_data: offset(raw, "frag")? + offset(frag, "data")?,
            raw_frag_size: offset(raw, "frag")? + offset(frag, "size")?,
            task_fsbase: self
                .member_offset("task_struct", "thread")
                .zip(self.member_offset("thread_struct", "fsbase"))
                .map_or(0, |(thread, fsbase)| thread + fsbase),
            task_thread_pid: namespaced_tid.map_or(0, |(thread_pid, _, _)| thread_pid),
            pid_level: namespaced_tid.map_or(0, |(_, level, _)| level),
            pid_numbers: namespaced_tid.map_or(0, |(_, _, numbers)| numbers),
            ..vma_tree.unwrap_or_default()
        })
    }

    /// `task_struct.thread_pid`, `pid.level` and `pid.numbers`, which give a thread's id in its
    /// own pid namespace; `None` where the kernel lays them out otherwise (a `upid` not an `int`
    /// then a pointer, [`UPID_BYTES`] in all).
    fn namespaced_tid_offsets(&self) -> Option<(u32, u32, u32)> {
        let offset = |structure: &str, member: &str| self.member_offset(structure, member);
        (offset("upid", "nr")? == 0 && u64::from(offset("upid", "ns")?) + 8 == UPID_BYTES)
            .then_some(())?;
        Some((
            offset("task_struct", "thread_pid")?,
            offset("pid", "level")?,
            offset("pid", "numbers")?,
        ))
    }

    /// The offsets of the kernel's tree of a process's mappings and of what a mapping names
    /// (`OFFSETS_VMA_TREE`), as the defaults of a [`KernelOffsets`]; `None` where the kernel
    /// keeps no maple tree (before 6.1: a red-black tree the walker does not read) or lays its
    /// nodes out otherwise.
    fn vma_tree_offsets(&self) -> Option<KernelOffsets> {
        let offset = |structure: &str, member: &str| self.member_offset(structure, member);
        let (range, arange) = ("maple_range_64", "maple_arange_64");
        let end = offset("maple_metadata", "end")?;
        let range_layout = [
            offset(range, "pivot")?,
            offset(range, "slot")?,
            offset(range, "meta")? + end,
        ];
        let arange_layout = [
            offset(arange, "pivot")?,
            offset(arange, "slot")?,
            offset(arange, "meta")? + end,
        ];
        NodeLayout::from_offsets(range_layout, arange_layout)?;
        let [range_pivots, range_slots, range_end] = range_layout;
        let [arange_pivots, arange_slots, arange_end] = arange_layout;
        let vma = "vm_area_struct";
        Some(KernelOffsets {
            task_mm: offset("task_struct", "mm")?,
            mm_vma_root: offset("mm_struct", "mm_mt")? + offset("maple_tree", "ma_root")?,
            maple_range_pivots: range_pivots,
            maple_range_slots: range_slots,
            maple_range_end: range_end,
            maple_arange_pivots: arange_pivots,
            maple_arange_slots: arange_slots,
            maple_arange_end: arange_end,
            vma_start: offset(vma, "vm_start")?,
            vma_end: offset(vma, "vm_end")?,
            vma_flags: offset(vma, "vm_flags")?,
            vma_pgoff: offset(vma, "vm_pgoff")?,
            vma_file: offset(vma, "vm_file")?,
            file_inode: offset("file", "f_inode")?,
            inode_ino: offset("inode", "i_ino")?,
            inode_sb: offset("inode", "i_sb")?,
            sb_dev: offset("super_block", "s_dev")?,
            mm_vdso: offset("mm_struct", "context")? + offset("mm_context_t", "vdso")?,
            ..KernelOffsets::default()
        })
    }

    fn index_names(&mut self) {
        for id in 1..=self.type_starts.len() as u32 {
            let Some(record) = self.record(id) else {
                continue;
            };
            let index = match record.kind {
                kind::STRUCT | kind::UNION => &mut self.composites,
                kind::TYPEDEF => &mut self.typedefs,
                _ => continue,
            };
            if let Some(name) =
                string_at(&self.strings, record.name_off).filter(|name| !name.is_empty())
            {
                index.entry(name.to_vec()).or_insert(id);
            }
        }
    }

    /// The first struct or union with this name, else the first typedef of one.
    fn composite_named(&self, name: &str) -> Option<u32> {
        let name = name.as_bytes();
        self.composites.get(name).copied().or_else(|| {
            let target = self.resolve(*self.typedefs.get(name)?)?;
            self.record(target).filter(is_composite).map(|_| target)
        })
    }

    /// Searches `member` in composite `id`, whose start lies `base_bits` into the outermost
    /// structure; descends into anonymous struct/union members in declaration order.
    fn locate_member(
        &self,
        id: u32,
        member: &[u8],
        base_bits: u32,
        depth: usize,
    ) -> Option<MemberLocation> {
        let composite = self.record(id).filter(is_composite)?;
        for index in 0..composite.vlen {
            let pos = composite.extra + index * MEMBER_LEN;
            let name_off = self.u32_at(pos)?;
            let member_type = self.u32_at(pos + 4)?;
            let offset = self.u32_at(pos + 8)?;
            // With kind_flag the offset word packs the bitfield width into its top byte.
            let (bit_offset, bitfield_bits) = if composite.kind_flag {
                (offset & 0x00ff_ffff, offset >> 24)
            } else {
                (offset, 0)
            };
            let bit_offset = base_bits.checked_add(bit_offset)?;
            let name = self.name(name_off)?;
            if name.is_empty() {
                if depth >= MAX_CHAIN {
                    return None;
                }
                // Anonymous non-composite members (padding bitfields) hold no names.
                let found = self
                    .resolve(member_type)
                    .and_then(|inner| self.locate_member(inner, member, bit_offset, depth + 1));
                if found.is_some() {
                    return found;
                }
            } else if name == member {
                return if bitfield_bits != 0 {
                    Some(MemberLocation {
                        bit_offset,
                        bitfield_bits: Some(bitfield_bits),
                    })
                } else {
                    self.plain_member_location(member_type, bit_offset)
                };
            }
        }
        None
    }

    /// Location of a member declared without a kind_flag bitfield width: older BTF encodes
    /// bitfields as an INT whose bit count is narrower than its size, possibly shifted.
    fn plain_member_location(&self, member_type: u32, bit_offset: u32) -> Option<MemberLocation> {
        let resolved = self.resolve(member_type)?;
        let location = match self.record(resolved) {
            Some(int) if int.kind == kind::INT => {
                let encoding = self.u32_at(int.extra)?;
                let shift = (encoding >> 16) & 0xff;
                let bits = encoding & 0xff;
                let bitfield = shift != 0 || u64::from(bits) != u64::from(int.size_or_type) * 8;
                MemberLocation {
                    bit_offset: bit_offset.checked_add(shift)?,
                    bitfield_bits: bitfield.then_some(bits),
                }
            }
            _ => MemberLocation {
                bit_offset,
                bitfield_bits: None,
            },
        };
        Some(location)
    }

    /// Follows typedefs and qualifiers (const, volatile, restrict, type tags) to the type they
    /// name.
    fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..MAX_CHAIN {
            let record = self.record(id)?;
            match record.kind {
                kind::TYPEDEF | kind::CONST | kind::VOLATILE | kind::RESTRICT | kind::TYPE_TAG => {
                    id = record.size_or_type;
                }
                _ => return Some(id),
            }
        }
        None
    }

    fn record(&self, id: u32) -> Option<TypeRecord> {
        let start = *self.type_starts.get((id as usize).checked_sub(1)?)?;
        decode_record(&self.types, start, self.big_endian)
    }

    fn name(&self, offset: u32) -> Option<&[u8]> {
        string_at(&self.strings, offset)
    }

    fn u32_at(&self, pos: usize) -> Option<u32> {
        read_u32(&self.types, pos, self.big_endian)
    }
}

/// The NUL-terminated string at `offset` in the string section.
fn string_at(strings: &[u8], offset: u32) -> Option<&[u8]> {
    let tail = strings.get(offset as usize..)?;
    let end = tail.iter().position(|&b| b == 0)?;
    Some(&tail[..end])
}

fn is_composite(record: &TypeRecord) -> bool {
    record.kind == kind::STRUCT || record.kind == kind::UNION
}

fn malformed(why: impl Into<String>) -> BtfError {
    BtfError::Malformed(why.into())
}

fn read_u32(bytes: &[u8], pos: usize, big_endian: bool) -> Option<u32> {
    let word: [u8; 4] = bytes.get(pos..pos.checked_add(4)?)?.try_into().ok()?;
    Some(if big_endian {
        u32::from_be_bytes(word)
    } else {
        u32::from_le_bytes(word)
    })
}

fn decode_record(types: &[u8], start: usize, big_endian: bool) -> Option<TypeRecord> {
    let info = read_u32(types, start + 4, big_endian)?;
    Some(TypeRecord {
        name_off: read_u32(types, start, big_endian)?,
        kind: (info >> 24) & 0x1f,
        vlen: (info & 0xffff) as usize,
        kind_flag: info >> 31 == 1,
        size_or_type: read_u32(types, start + 8, big_endian)?,
        extra: start + TYPE_LEN,
    })
}

/// Walks the type section once, checking that every record and its kind-specific data fit, and
/// returns where each type starts.
fn index_types(types: &[u8], big_endian: bool) -> Result<Vec<usize>, BtfError> {
    let mut starts = Vec::new();
    let mut pos = 0;
    while pos < types.len() {
        let id = starts.len() + 1;
        let record = decode_record(types, pos, big_endian).ok_or_else(|| {
            malformed(format!(
                "type id {id} truncated at byte {pos} of the type section"
            ))
        })?;
        let extra_len = match record.kind {
            kind::INT | kind::VAR | kind::DECL_TAG => 4,
            kind::ARRAY => 12,
            kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => 12 * record.vlen,
            kind::ENUM | kind::FUNC_PROTO => 8 * record.vlen,
            kind::PTR
            | kind::FWD
            | kind::TYPEDEF
            | kind::VOLATILE
            | kind::CONST
            | kind::RESTRICT
            | kind::FUNC
            | kind::FLOAT
            | kind::TYPE_TAG => 0,
            unknown => {
                return Err(malformed(format!(
                    "type id {id} has kind {unknown}, unknown to this reader (it knows kinds \
                     1..={})",
                    kind::ENUM64
                )))
            }
        };
        let end = record.extra + extra_len;
        if end > types.len() {
            return Err(malformed(format!(
                "type id {id} (kind {}) needs {extra_len} bytes after byte {} of the {}-byte type \
                 section",
                record.kind,
                record.extra,
                types.len()
            )));
        }
        starts.push(pos);
        pos = end;
    }
    Ok(starts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Builds BTF blobs type by type, in either byte order.
    struct Builder {
        big_endian: bool,
        types: Vec<u8>,
        strings: Vec<u8>,
        next_id: u32,
    }

    /// A struct or union member: name ("" for anonymous), type id, offset word.
    type Member<'a> = (&'a str, u32, u32);

    impl Builder {
        fn new(big_endian: bool) -> Builder {
            Builder {
                big_endian,
                types: Vec::new(),
                strings: vec![0],
                next_id: 1,
            }
        }

        fn word(&mut self, value: u32) {
            let bytes = if self.big_endian {
                value.to_be_bytes()
            } else {
                value.to_le_bytes()
            };
            self.types.extend_from_slice(&bytes);
        }

        fn string(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let offset = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            offset
        }

        /// Appends a type record followed by `extra` words; returns its id.
        fn add(
            &mut self,
            name: &str,
            kind: u32,
            vlen: u32,
            kind_flag: bool,
            size_or_type: u32,
            extra: &[u32],
        ) -> u32 {
            let name_off = self.string(name);
            self.word(name_off);
            self.word(((kind_flag as u32) << 31) | (kind << 24) | vlen);
            self.word(size_or_type);
            for &w in extra {
                self.word(w);
            }
            self.next_id += 1;
            self.next_id - 1
        }

        fn int(&mut self, name: &str, size: u32, bits: u32, shift: u32) -> u32 {
            self.add(name, kind::INT, 0, false, size, &[(shift << 16) | bits])
        }

        fn composite(
            &mut self,
            kind: u32,
            name: &str,
            size: u32,
            kind_flag: bool,
            members: &[Member],
        ) -> u32 {
            let mut extra = Vec::new();
            for &(member, type_id, offset) in members {
                extra.extend([self.string(member), type_id, offset]);
            }
            self.add(name, kind, members.len() as u32, kind_flag, size, &extra)
        }

        fn build(&self) -> Vec<u8> {
            let put = |out: &mut Vec<u8>, v: u32| {
                out.extend(if self.big_endian {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                })
            };
            let mut out = Vec::new();
            out.extend(if self.big_endian {
                MAGIC.to_be_bytes()
            } else {
                MAGIC.to_le_bytes()
            });
            out.extend([VERSION, 0]);
            put(&mut out, HEADER_LEN as u32);
            put(&mut out, 0);
            put(&mut out, self.types.len() as u32);
            put(&mut out, self.types.len() as u32);
            put(&mut out, self.strings.len() as u32);
            out.extend(&self.types);
            out.extend(&self.strings);
            out
        }
    }

    /// One type of every kind, each with the trailing data its kind carries, so that a wrong
    /// skip length shifts every later type; then structures that exercise member lookup.
    fn sample_blob(big_endian: bool) -> Vec<u8> {
        let mut b = Builder::new(big_endian);
        let u64_t = b.int("u64", 8, 64, 0); // 1
        let u32_t = b.int("unsigned int", 4, 32, 0); // 2
        let ptr = b.add("", kind::PTR, 0, false, u64_t, &[]); // 3
        b.add("", kind::ARRAY, 0, false, 0, &[u32_t, u32_t, 4]);
        b.add("colour", kind::ENUM, 2, false, 4, &[0, 0, 0, 1]);
        b.add("later", kind::FWD, 0, false, 0, &[]);
        b.add("", kind::VOLATILE, 0, false, u32_t, &[]);
        b.add("", kind::RESTRICT, 0, false, ptr, &[]);
        let proto = b.add("", kind::FUNC_PROTO, 2, false, u32_t, &[0, u64_t, 0, ptr]);
        b.add("do_sample", kind::FUNC, 0, false, proto, &[]);
        let var = b.add("sample_count", kind::VAR, 0, false, u64_t, &[1]);
        b.add(".bss", kind::DATASEC, 1, false, 8, &[var, 0, 8]);
        b.add("double", kind::FLOAT, 0, false, 8, &[]);
        b.add("hot", kind::DECL_TAG, 0, false, var, &[u32::MAX]);
        let tagged = b.add("user", kind::TYPE_TAG, 0, false, u64_t, &[]);
        b.add("big", kind::ENUM64, 1, false, 8, &[0, 1, 2]);

        // typedef chain: sample_addr_t -> const -> typedef -> u64 (through a type tag).
        let inner_typedef = b.add("raw_addr_t", kind::TYPEDEF, 0, false, tagged, &[]);
        let constant = b.add("", kind::CONST, 0, false, inner_typedef, &[]);
        let addr_t = b.add("sample_addr_t", kind::TYPEDEF, 0, false, constant, &[]);

        // struct weight_parts { u32 var1; u32 var2; } behind a typedef and a const.
        let parts = b.composite(
            kind::STRUCT,
            "",
            8,
            false,
            &[("var1", u32_t, 0), ("var2", u32_t, 32)],
        );
        let parts_t = b.add("parts_t", kind::TYPEDEF, 0, false, parts, &[]);
        let parts_c = b.add("", kind::CONST, 0, false, parts_t, &[]);
        // union { u64 full; const parts_t; }
        let anon_union = b.composite(
            kind::UNION,
            "",
            8,
            false,
            &[("full", u64_t, 0), ("", parts_c, 0)],
        );
        // struct sample { u64 flags; union {...}; u32 kind:3 (kind_flag); u32 cpu:5; u32 pid; sample_addr_t addr; }
        b.composite(
            kind::STRUCT,
            "sample",
            32,
            true,
            &[
                ("flags", u64_t, 0),
                ("", anon_union, 64),
                ("kind", u32_t, (3 << 24) | 128),
                ("cpu", u32_t, (5 << 24) | 131),
                ("pid", u32_t, 160),
                ("addr", addr_t, 192),
            ],
        );
        // Old-style bitfield (no kind_flag): an INT of 4 bits shifted by 2; then an anonymous
        // padding bitfield, which lookups must step over.
        let nibble = b.int("unsigned int", 4, 4, 2);
        let legacy = b.composite(
            kind::STRUCT,
            "legacy",
            8,
            false,
            &[("mode", nibble, 32), ("", nibble, 36), ("level", u32_t, 0)],
        );
        b.add("legacy_t", kind::TYPEDEF, 0, false, legacy, &[]);
        b.build()
    }

    #[test]
    fn finds_members_after_every_kind_in_both_byte_orders() {
        for big_endian in [false, true] {
            let btf = Btf::parse(&sample_blob(big_endian)).unwrap();
            assert_eq!(btf.member_offset("sample", "flags"), Some(0));
            assert_eq!(btf.member_offset("sample", "pid"), Some(20));
            assert_eq!(btf.member_offset("sample", "addr"), Some(24));
            assert_eq!(btf.member_offset("sample", "nope"), None);
            assert_eq!(btf.member_offset("missing", "flags"), None);
        }
    }

    #[test]
    fn descends_into_anonymous_members_through_typedefs() {
        let btf = Btf::parse(&sample_blob(false)).unwrap();
        assert_eq!(btf.member_offset("sample", "full"), Some(8));
        assert_eq!(btf.member_offset("sample", "var1"), Some(8));
        assert_eq!(btf.member_offset("sample", "var2"), Some(12));
    }

    #[test]
    fn reports_bitfields_by_bits_and_not_as_bytes() {
        let btf = Btf::parse(&sample_blob(false)).unwrap();
        let kind = btf.member_location("sample", "kind").unwrap();
        assert_eq!(
            kind,
            MemberLocation {
                bit_offset: 128,
                bitfield_bits: Some(3)
            }
        );
        let cpu = btf.member_location("sample", "cpu").unwrap();
        assert_eq!(
            cpu,
            MemberLocation {
                bit_offset: 131,
                bitfield_bits: Some(5)
            }
        );
        assert_eq!(btf.member_offset("sample", "kind"), None);

        let mode = btf.member_location("legacy", "mode").unwrap();
        assert_eq!(
            mode,
            MemberLocation {
                bit_offset: 34,
                bitfield_bits: Some(4)
            }
        );
        assert_eq!(btf.member_offset("legacy", "level"), Some(0));
    }

    #[test]
    fn looks_up_a_struct_through_its_typedef_name() {
        let btf = Btf::parse(&sample_blob(false)).unwrap();
        assert_eq!(btf.member_offset("legacy_t", "level"), Some(0));
        assert_eq!(btf.member_offset("parts_t", "var2"), Some(4));
    }

    #[test]
    fn kernel_offsets_names_the_missing_member() {
        let btf = Btf::parse(&sample_blob(false)).unwrap();
        let err = btf.kernel_offsets().unwrap_err();
        assert!(matches!(
            err,
            BtfError::MissingMember {
                structure: "bpf_perf_event_data_kern",
                member: "data"
            }
        ));
        assert!(
            err.to_string().contains("bpf_perf_event_data_kern.data"),
            "{err}"
        );
    }

    #[test]
    fn rejects_bad_headers_with_the_reason() {
        let blob = sample_blob(false);
        let reason = |bytes: &[u8]| Btf::parse(bytes).err().unwrap().to_string();
        assert!(reason(&[]).contains("magic"));
        let mut version = blob.clone();
        version[2] = 2;
        assert!(reason(&version).contains("version 2"));
        let mut unknown_kind = Builder::new(false);
        unknown_kind.add("", 20, 0, false, 0, &[]);
        assert!(reason(&unknown_kind.build()).contains("kind 20"));
        let mut long_struct = Builder::new(false);
        long_struct.add("s", kind::STRUCT, 2, false, 8, &[0, 0, 0]);
        assert!(reason(&long_struct.build()).contains("needs 24 bytes"));
    }

    #[test]
    fn never_panics_on_truncated_or_corrupted_blobs() {
        let blob = sample_blob(false);
        for len in 0..blob.len() {
            if let Ok(btf) = Btf::parse(&blob[..len]) {
                btf.member_offset("sample", "var2");
            }
        }
        // Deterministic xorshift so failures reproduce.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut corrupt = blob.clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let pos = (state % corrupt.len() as u64) as usize;
                corrupt[pos] = (state >> 32) as u8;
            }
            if let Ok(btf) = Btf::parse(&corrupt) {
                for member in ["flags", "var2", "kind", "addr"] {
                    btf.member_location("sample", member);
                }
                let _ = btf.kernel_offsets();
            }
        }
    }

    #[test]
    fn cyclic_anonymous_members_end_without_overflowing_the_stack() {
        let mut b = Builder::new(false);
        // Type 1: a union whose anonymous member is a typedef (2) of itself.
        b.composite(kind::UNION, "loop", 8, false, &[("", 2, 0)]);
        b.add("loop_t", kind::TYPEDEF, 0, false, 1, &[]);
        // Type 3: a typedef of itself.
        b.add("self_t", kind::TYPEDEF, 0, false, 3, &[]);
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(btf.member_offset("loop", "x"), None);
        assert_eq!(btf.member_offset("self_t", "x"), None);
    }

    /// One member line of a bpftool dump.
    struct DumpMember {
        name: String,
        type_id: u32,
        bits_offset: u32,
        bitfield_size: Option<u32>,
    }

    /// Struct layouts as `bpftool btf dump format raw` prints them, by type id.
    struct BpftoolDump {
        kinds: HashMap<u32, (String, String, u32)>,
        members: HashMap<u32, Vec<DumpMember>>,
        first_named: HashMap<String, u32>,
    }

    impl BpftoolDump {
        /// Parses lines like `[2362] STRUCT 'perf_sample_data' size=256 vlen=26`, each followed
        /// by its members `\t'addr' type_id=38 bits_offset=1472 [bitfield_size=N]`.
        fn parse(text: &str) -> BpftoolDump {
            let mut dump = BpftoolDump {
                kinds: HashMap::new(),
                members: HashMap::new(),
                first_named: HashMap::new(),
            };
            let mut current = None;
            for line in text.lines() {
                let quoted = |s: &str| s.split('\'').nth(1).unwrap().to_string();
                let field = |key: &str| -> Option<u32> {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
                };
                if let Some(rest) = line.strip_prefix('[') {
                    let id: u32 = rest.split(']').next().unwrap().parse().unwrap();
                    let kind = rest.split_whitespace().nth(1).unwrap().to_string();
                    let name = quoted(rest);
                    let target = field("type_id").unwrap_or(0);
                    if kind == "STRUCT" || kind == "UNION" {
                        dump.first_named.entry(name.clone()).or_insert(id);
                        dump.members.insert(id, Vec::new());
                        current = Some(id);
                    } else {
                        current = None;
                    }
                    dump.kinds.insert(id, (kind, name, target));
                } else if let (Some(id), Some(member)) = (current, line.strip_prefix('\t')) {
                    let entry = DumpMember {
                        name: quoted(member),
                        type_id: field("type_id").unwrap(),
                        bits_offset: field("bits_offset").unwrap(),
                        bitfield_size: field("bitfield_size"),
                    };
                    dump.members.get_mut(&id).unwrap().push(entry);
                }
            }
            dump
        }

        fn resolve(&self, mut id: u32) -> u32 {
            while let Some((kind, _, target)) = self.kinds.get(&id) {
                match kind.as_str() {
                    "TYPEDEF" | "CONST" | "VOLATILE" | "RESTRICT" | "TYPE_TAG" => id = *target,
                    _ => break,
                }
            }
            id
        }

        /// Every member reachable from composite `id`, with bit offsets from its start.
        fn flatten(&self, id: u32, base: u32, out: &mut Vec<(String, u32, Option<u32>)>) {
            for DumpMember {
                name,
                type_id,
                bits_offset: bits,
                bitfield_size: bitfield,
            } in &self.members[&id]
            {
                if name == "(anon)" {
                    let inner = self.resolve(*type_id);
                    if self.members.contains_key(&inner) {
                        self.flatten(inner, base + bits, out);
                    }
                } else {
                    out.push((name.clone(), base + bits, *bitfield));
                }
            }
        }
    }

    #[test]
    fn agrees_with_bpftool_on_the_running_kernel() {
        let btf = Btf::from_sys_fs().expect("this test reads the running kernel's BTF");
        let output = Command::new("bpftool")
            .args(["btf", "dump", "file", KERNEL_BTF_PATH, "format", "raw"])
            .output()
            .expect("bpftool is needed to cross-check BTF offsets: apt-get install bpftool");
        assert!(
            output.status.success(),
            "bpftool failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let dump = BpftoolDump::parse(&String::from_utf8(output.stdout).unwrap());

        let expected = |structure: &str, member: &str| {
            let mut members = Vec::new();
            dump.flatten(dump.first_named[structure], 0, &mut members);
            let (_, bits, bitfield) = members
                .into_iter()
                .find(|(name, ..)| name == member)
                .unwrap();
            assert_eq!(bitfield, None);
            bits / 8
        };
        let offsets = btf.kernel_offsets().unwrap();
        let ctx = "bpf_perf_event_data_kern";
        let sample = "perf_sample_data";
        assert_eq!(
            offsets.valid,
            OFFSETS_VALID | OFFSETS_SAMPLE_FLAGS | OFFSETS_VMA_TREE
        );
        assert_eq!(
            offsets.event_sample_type,
            expected("perf_event", "attr") + expected("perf_event_attr", "sample_type")
        );
        assert_eq!(offsets.ctx_data, expected(ctx, "data"));
        assert_eq!(offsets.ctx_event, expected(ctx, "event"));
        assert_eq!(offsets.sample_flags, expected(sample, "sample_flags"));
        assert_eq!(offsets.addr, expected(sample, "addr"));
        assert_eq!(offsets.phys_addr, expected(sample, "phys_addr"));
        assert_eq!(offsets.weight, expected(sample, "weight"));
        assert_eq!(offsets.data_src, expected(sample, "data_src"));
        assert_eq!(offsets.raw, expected(sample, "raw"));
        assert_eq!(offsets.event_parent, expected("perf_event", "parent"));
        assert_eq!(offsets.event_id, expected("perf_event", "id"));
        let frag = expected("perf_raw_record", "frag");
        assert_eq!(
            offsets.raw_frag_data,
            frag + expected("perf_raw_frag", "data")
        );
        assert_eq!(
            offsets.raw_frag_size,
            frag + expected("perf_raw_frag", "size")
        );
        // The mapping tree's, through the anonymous unions vm_area_struct wraps its fields in.
        let vma = "vm_area_struct";
        assert_eq!(offsets.task_mm, expected("task_struct", "mm"));
        assert_eq!(
            offsets.mm_vma_root,
            expected("mm_struct", "mm_mt") + expected("maple_tree", "ma_root")
        );
        assert_eq!(
            offsets.maple_range_slots,
            expected("maple_range_64", "slot")
        );
        assert_eq!(
            offsets.maple_arange_slots,
            expected("maple_arange_64", "slot")
        );
        assert_eq!(
            offsets.maple_arange_end,
            expected("maple_arange_64", "meta")
        );
        assert_eq!(offsets.vma_start, expected(vma, "vm_start"));
        assert_eq!(offsets.vma_end, expected(vma, "vm_end"));
        assert_eq!(offsets.vma_flags, expected(vma, "vm_flags"));
        assert_eq!(offsets.vma_pgoff, expected(vma, "vm_pgoff"));
        assert_eq!(offsets.vma_file, expected(vma, "vm_file"));
        assert_eq!(offsets.inode_ino, expected("inode", "i_ino"));
        assert_eq!(offsets.sb_dev, expected("super_block", "s_dev"));
        assert_eq!(
            offsets.task_fsbase,
            expected("task_struct", "thread") + expected("thread_struct", "fsbase")
        );
        assert_eq!(
            offsets.task_thread_pid,
            expected("task_struct", "thread_pid")
        );
        assert_eq!(offsets.pid_level, expected("pid", "level"));
        assert_eq!(offsets.pid_numbers, expected("pid", "numbers"));
        assert_eq!(expected("upid", "nr"), 0);
        assert_eq!(expected("upid", "ns") + 8, UPID_BYTES as u32);
        // Inside the named `context` (an architecture's own struct): past its start.
        assert!(offsets.mm_vdso >= expected("mm_struct", "context"));

        // Every member of every named struct and union, anonymous nesting and bitfields
        // included: thousands of layouts checked against an independent reader.
        let mut checked = 0;
        let mut through_anonymous = 0;
        for (name, &id) in &dump.first_named {
            if name == "(anon)" {
                continue;
            }
            let mut members = Vec::new();
            dump.flatten(id, 0, &mut members);
            for (member, bits, bitfield) in members {
                let location = btf.member_location(name, &member);
                assert_eq!(
                    location,
                    Some(MemberLocation {
                        bit_offset: bits,
                        bitfield_bits: bitfield
                    }),
                    "{name}.{member}"
                );
                through_anonymous +=
                    usize::from(!dump.members[&id].iter().any(|m| m.name == member));
                checked += 1;
            }
        }
        assert!(checked > 10_000, "only {checked} members checked");
        assert!(
            through_anonymous > 1_000,
            "only {through_anonymous} anonymous members checked"
        );
    }
}
