//! Side-band records as a read finds them, before they change the process table. Forks and
//! exits are decoded at once: they decide which lives a read holds whole. Mappings, thread names
//! and kernel code are kept as the kernel wrote them until they are applied: under process churn
//! most belong to lives that are held and let go unsampled, and decoding each (its path
//! interned, its mapped file looked up, its name copied, the decoded change moved and dropped)
//! was most of the side-band's time.

use crate::perf_data::{decode_process_record, mapping_or_name_pid, ProcessRecord};

/// One record of a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pending {
    Fork {
        pid: u32,
        ppid: u32,
    },
    /// A process's exit.
    Exit(u32),
    /// A thread's exit, other than the main one.
    ThreadExit(u32),
    /// Records the kernel dropped.
    Lost(u64),
    Kept(KeptRecord),
}

impl Pending {
    /// The process the record belongs to, if one.
    pub(super) fn pid(&self) -> Option<u32> {
        match *self {
            Pending::Fork { pid, .. } | Pending::Exit(pid) => Some(pid),
            Pending::Kept(record) => record.pid,
            Pending::ThreadExit(_) | Pending::Lost(_) => None,
        }
    }
}

/// A mapping, a thread's name or kernel code, as the kernel wrote it: its fields are in the
/// [`RecordBytes`] it was kept in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeptRecord {
    /// The process it is of (none for kernel code).
    pid: Option<u32>,
    kind: u32,
    misc: u16,
    at: u32,
    len: u32,
}

impl KeptRecord {
    /// A record about to be kept: where its fields are is set as they are.
    fn new(pid: Option<u32>, kind: u32, misc: u16) -> KeptRecord {
        KeptRecord {
            pid,
            kind,
            misc,
            at: 0,
            len: 0,
        }
    }
}

/// The fields (after the header) of kept records, one after another: a read's, or a held
/// life's, with no allocation per record.
#[derive(Debug, Default)]
pub(crate) struct RecordBytes(Vec<u8>);

impl RecordBytes {
    /// One record of a ring, its fields `own` (without the header and the time that ends it):
    /// `None` for records about nothing the table keeps, or that the kernel wrote short (perf
    /// skips them too). Mappings and names, most of the records, are read here only for their
    /// process: the rest is decoded, and checked, if they are applied.
    pub(crate) fn read(&mut self, kind: u32, misc: u16, own: &[u8]) -> Option<Pending> {
        if let Some(pid) = mapping_or_name_pid(kind, own) {
            return Some(Pending::Kept(
                self.keep(KeptRecord::new(Some(pid), kind, misc), own),
            ));
        }
        let pid = match decode_process_record(kind, misc, own, 0).ok()?? {
            ProcessRecord::Fork(task) => {
                return Some(Pending::Fork {
                    pid: task.pid,
                    ppid: task.ppid,
                })
            }
            ProcessRecord::Exit(task) if task.pid == task.tid => {
                return Some(Pending::Exit(task.pid))
            }
            ProcessRecord::Exit(task) => return Some(Pending::ThreadExit(task.tid)),
            ProcessRecord::Lost(lost) => return Some(Pending::Lost(lost)),
            ProcessRecord::Mmap(mmap) => Some(mmap.pid),
            ProcessRecord::Comm(comm) => Some(comm.pid),
            ProcessRecord::KernelSymbol(_) => None,
        };
        Some(Pending::Kept(
            self.keep(KeptRecord::new(pid, kind, misc), own),
        ))
    }

    /// `record`, kept in `from`, copied here.
    pub(super) fn keep_from(&mut self, record: KeptRecord, from: &RecordBytes) -> KeptRecord {
        self.keep(record, from.fields(record))
    }

    fn keep(&mut self, mut record: KeptRecord, fields: &[u8]) -> KeptRecord {
        record.at = self.0.len() as u32;
        record.len = fields.len() as u32;
        self.0.extend_from_slice(fields);
        record
    }

    fn fields(&self, record: KeptRecord) -> &[u8] {
        &self.0[record.at as usize..][..record.len as usize]
    }

    /// `record`, kept here, decoded (borrowing these bytes).
    pub(super) fn decode(&self, record: KeptRecord) -> Option<ProcessRecord<'_>> {
        decode_process_record(record.kind, record.misc, self.fields(record), 0)
            .ok()
            .flatten()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Records encoded as the kernel writes them, for tests.
#[cfg(test)]
pub(super) mod encode {
    use super::{Pending, RecordBytes};
    use crate::perf_data::writer::Bytes;

    const PERF_RECORD_COMM: u32 = 3;
    const PERF_RECORD_MMAP2: u32 = 10;
    const PERF_RECORD_MISC_USER: u16 = 2;
    const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;

    /// An executable mapping of `path` at 0x1000..0x2000 (no device or inode: it never matches
    /// a file on disk).
    pub(crate) fn code(bytes: &mut RecordBytes, pid: u32, path: &str) -> Pending {
        let mut fields = Bytes::default();
        fields
            .u32(pid)
            .u32(pid)
            .u64(0x1000)
            .u64(0x1000)
            .u64(0)
            .u32(0)
            .u32(0)
            .u64(0)
            .u64(0)
            .u32((libc::PROT_READ | libc::PROT_EXEC) as u32)
            .u32(libc::MAP_PRIVATE as u32)
            .c_string(path);
        bytes
            .read(PERF_RECORD_MMAP2, PERF_RECORD_MISC_USER, &fields.take())
            .expect("a whole MMAP2 record")
    }

    /// `pid`'s main thread named `name`, by an exec or not.
    pub(crate) fn name(bytes: &mut RecordBytes, pid: u32, name: &str, exec: bool) -> Pending {
        let mut fields = Bytes::default();
        fields.u32(pid).u32(pid).c_string(name);
        let misc = if exec { PERF_RECORD_MISC_COMM_EXEC } else { 0 };
        bytes
            .read(PERF_RECORD_COMM, misc, &fields.take())
            .expect("a whole COMM record")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_records_decode_as_read_and_copied() {
        let mut bytes = RecordBytes::default();
        let Pending::Kept(map) = encode::code(&mut bytes, 10, "/bin/ls") else {
            panic!("a mapping is kept")
        };
        let Pending::Kept(name) = encode::name(&mut bytes, 10, "ls", true) else {
            panic!("a name is kept")
        };
        assert_eq!(Pending::Kept(map).pid(), Some(10));
        let mut held = RecordBytes::default();
        let name = held.keep_from(name, &bytes);
        let map = held.keep_from(map, &bytes);
        bytes.clear();
        match held.decode(map) {
            Some(ProcessRecord::Mmap(mmap)) => {
                assert_eq!((mmap.pid, mmap.start, mmap.len), (10, 0x1000, 0x1000));
                assert_eq!(mmap.filename, b"/bin/ls");
            }
            _ => panic!("the mapping decodes"),
        }
        match held.decode(name) {
            Some(ProcessRecord::Comm(comm)) => assert!(comm.exec && comm.comm == b"ls"),
            _ => panic!("the name decodes"),
        }
    }

    #[test]
    fn short_records_change_nothing() {
        let mut bytes = RecordBytes::default();
        // A mapping is read for its process alone, and decodes to nothing when applied.
        assert_eq!(bytes.read(10, 2, &[1, 0, 0]), None);
        let Some(Pending::Kept(short)) = bytes.read(10, 2, &[1, 0, 0, 0]) else {
            panic!("a mapping is kept for its process")
        };
        assert_eq!(Pending::Kept(short).pid(), Some(1));
        assert!(bytes.decode(short).is_none());
        // A FORK record's fields: pid, ppid, tid, ptid and a time.
        let fork: Vec<u8> = [7u32, 1, 7, 1, 0, 0]
            .iter()
            .flat_map(|field| field.to_le_bytes())
            .collect();
        assert_eq!(bytes.read(7, 0, &fork[..20]), None);
        assert_eq!(
            bytes.read(7, 0, &fork),
            Some(Pending::Fork { pid: 7, ppid: 1 })
        );
    }
}
