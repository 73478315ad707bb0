//! The files of executable mappings, opened while their processes live and kept by identity
//! (device and inode), so that a process's modules are read after it exited, whatever its paths
//! mean by then.

use std::{
    collections::BTreeMap,
    fs,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    build_id::build_id_of,
    mapping::{FileIdentity, Mapping},
};
use crate::fast_hash::HashMap;
use crate::input::{descriptor_path, open_regular, FinalLink, ModuleImage};
use crate::perf_data::FileId;

/// A mapped file as PERF_RECORD_MMAP2 names it when it sends no build ID: device numbers and
/// inode, to recognise the file when it is opened by path later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileInode {
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
}

impl From<FileId> for FileInode {
    fn from(id: FileId) -> FileInode {
        FileInode {
            major: id.maj,
            minor: id.min,
            inode: id.ino,
        }
    }
}

impl FileInode {
    pub(super) fn of(metadata: &fs::Metadata) -> FileInode {
        FileInode {
            major: libc::major(metadata.dev()),
            minor: libc::minor(metadata.dev()),
            inode: metadata.ino(),
        }
    }
}

/// Descriptors left under RLIMIT_NOFILE for all but module files: perf events (one per CPU and
/// event), BPF maps and programs, the metrics endpoint's sockets, outputs.
const OTHER_DESCRIPTORS: u64 = 256;
/// Module files a window may open again (those the table closed for the budget since), beyond
/// those it shares with the table; two windows may be in flight at once.
pub(super) const WINDOW_REOPENS: usize = 256;
const WINDOWS_IN_FLIGHT: u64 = 2;
/// Module files kept open whatever the limit says.
const MIN_OPEN_FILES: u64 = 64;

/// Raises the soft RLIMIT_NOFILE to the hard limit: systemd starts services at 1,024, fewer
/// than one user can map files, and every module kept open costs a descriptor. Returns the
/// soft limit now in force.
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) and setrlimit(2) with a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// How many module files the process table keeps open: under the soft descriptor limit, with
/// room for everything else and for the files windows open again.
pub fn open_file_budget() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: getrlimit(2) with a valid rlimit; on failure it stays at the usual default.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    let reserved = OTHER_DESCRIPTORS + WINDOWS_IN_FLIGHT * WINDOW_REOPENS as u64;
    limit.rlim_cur.saturating_sub(reserved).max(MIN_OPEN_FILES) as usize
}

/// The files of executable mappings, opened through the mapping process's root while it lives.
/// A process in another mount namespace (a container) that exits before the report is still
/// symbolized from these descriptors: its paths mean nothing on the host afterwards.
///
/// Shared (`Arc`) with the windows that reference a file, so a window symbolized on another
/// thread still reads it after the process and its table entry are gone.
#[derive(Clone, Debug, Default)]
pub struct MappedFiles {
    pub(super) by_identity: HashMap<FileIdentity, Arc<fs::File>>,
    /// The file last opened for each mapped path: finding a module by path must not scan the
    /// mappings of every process (thousands under process churn).
    pub(super) by_path: HashMap<String, FileIdentity>,
    /// The build ID of each open file (read once), and the open file of each build ID.
    pub(super) build_ids: HashMap<FileIdentity, Option<Arc<[u8]>>>,
    pub(super) by_build_id: HashMap<Arc<[u8]>, FileIdentity>,
    /// Files closed so far: what was kept for a file may go once it closes.
    pub(super) closed: u64,
    /// When each open file was last used, and the open files by that tick: past the budget
    /// ([`open_file_budget`]) the least recently used is closed, to be opened again on demand.
    pub(super) used: HashMap<FileIdentity, u64>,
    pub(super) by_use: BTreeMap<u64, FileIdentity>,
    pub(super) tick: u64,
}

impl MappedFiles {
    /// Opens the file of `mapping` as `pid` mapped it (see [`open_mapped`]); returns the
    /// file's identity.
    pub(super) fn open(
        &mut self,
        pid: u32,
        mapping: &Mapping,
        inode: Option<FileInode>,
    ) -> Option<FileIdentity> {
        self.keep(open_mapped(pid, mapping, inode)?)
    }

    /// Opens a module by its path, for a recording imported from perf.data or a mapping whose
    /// process is gone (see [`open_identified`]).
    pub fn open_path(
        &mut self,
        path: &str,
        build_id: Option<&[u8]>,
        inode: Option<FileInode>,
    ) -> Option<FileIdentity> {
        self.keep(open_identified(path, build_id, inode)?)
    }

    /// Finds the file `identity` by `path` from now on. Under churn every process maps the same
    /// files: a known path gets no new key.
    pub(super) fn remember_path(&mut self, path: &str, identity: FileIdentity) {
        if self.by_path.get(path) != Some(&identity) {
            self.by_path.insert(path.to_string(), identity);
        }
    }

    /// Keeps `file` open, closing the least recently used file first when the budget is
    /// reached: a user who maps thousands of files costs their own oldest modules their names,
    /// not the descriptors the agent needs, nor the names of the code that runs now.
    fn keep(&mut self, file: fs::File) -> Option<FileIdentity> {
        let metadata = file.metadata().ok()?;
        let identity = (metadata.dev(), metadata.ino());
        if !self.by_identity.contains_key(&identity) {
            let budget = open_file_budget();
            while self.by_identity.len() >= budget {
                let Some((_, oldest)) = self.by_use.pop_first() else {
                    break;
                };
                self.used.remove(&oldest);
                self.by_identity.remove(&oldest);
                self.closed += 1;
            }
            self.by_identity.insert(identity, Arc::new(file));
        }
        self.touch(identity);
        Some(identity)
    }

    /// Marks the open file `identity` used now.
    pub(super) fn touch(&mut self, identity: FileIdentity) {
        self.tick += 1;
        if let Some(before) = self.used.insert(identity, self.tick) {
            self.by_use.remove(&before);
        }
        self.by_use.insert(self.tick, identity);
    }

    /// Closes the files `keep` refuses.
    pub(super) fn retain_open(&mut self, keep: impl Fn(&FileIdentity) -> bool) {
        let open = self.by_identity.len();
        self.by_identity.retain(|identity, _| keep(identity));
        self.closed += (open - self.by_identity.len()) as u64;
        self.used.retain(|identity, _| keep(identity));
        self.by_use.retain(|_, identity| keep(identity));
    }

    pub fn is_open(&self, identity: FileIdentity) -> bool {
        self.by_identity.contains_key(&identity)
    }

    /// The open file `identity`, shared by every copy of the table that holds it.
    pub fn file(&self, identity: FileIdentity) -> Option<&Arc<fs::File>> {
        self.by_identity.get(&identity)
    }

    /// How many files were closed so far: while it stays, every file is still open.
    pub fn closed(&self) -> u64 {
        self.closed
    }

    /// A path that reaches the opened file from this process, while the table lives.
    pub fn path(&self, identity: FileIdentity) -> Option<PathBuf> {
        self.by_identity
            .get(&identity)
            .map(|file| descriptor_path(file))
    }

    /// Whether the kernel's own record of a mapping of the open file `identity` (its inode's
    /// superblock device and inode number) names it as `stat` did. Not on overlayfs, whose
    /// mappings hold the layer's file, nor on btrfs, whose `stat` gives each subvolume a device
    /// of its own. Unknown (not open, `statfs` refused): assumed so.
    pub fn kernel_names_as_stat(&self, identity: FileIdentity) -> bool {
        const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
        const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
        let Some(file) = self.by_identity.get(&identity) else {
            return true;
        };
        let mut stats = std::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: fstatfs(2) on a descriptor this table holds open, into a buffer of the size
        // it writes; read only when it says it wrote it.
        let stats = unsafe {
            if libc::fstatfs(file.as_raw_fd(), stats.as_mut_ptr()) != 0 {
                return true;
            }
            stats.assume_init()
        };
        !matches!(
            stats.f_type as i64,
            OVERLAYFS_SUPER_MAGIC | BTRFS_SUPER_MAGIC
        )
    }

    /// The opened file, to be read in bounded ranges.
    pub fn image(&self, identity: FileIdentity) -> Option<ModuleImage> {
        ModuleImage::of(self.by_identity.get(&identity)?)
    }
}

/// Opens the file of `mapping` as `pid` mapped it. The kernel's link to the mapped file comes
/// first (it cannot be swapped). Once that is gone (the mapping or the process already is), the
/// path as the process saw it, else as the host sees it: its owner may since have put anything
/// there, so only a regular file is opened, without blocking, and kept only if it is the file
/// the kernel reported mapped.
fn open_mapped(pid: u32, mapping: &Mapping, inode: Option<FileInode>) -> Option<fs::File> {
    let mapped = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    if let Ok(file) = open_regular(Path::new(&mapped), FinalLink::Follow) {
        return Some(file);
    }
    let in_its_root = format!("/proc/{pid}/root{}", mapping.path);
    let build_id = mapping.build_id.as_deref();
    open_identified(&in_its_root, build_id, inode)
        .or_else(|| open_identified(&mapping.path, build_id, inode))
}

/// The file `identity` that `pid` maps with `mapping`, opened again for a window after the
/// table closed it for the budget: [`open_mapped`], and only that very file.
pub(super) fn open_again(pid: u32, mapping: &Mapping, identity: FileIdentity) -> Option<fs::File> {
    let (device, inode) = identity;
    let inode = FileInode {
        major: libc::major(device),
        minor: libc::minor(device),
        inode,
    };
    let file = open_mapped(pid, mapping, Some(inode))?;
    let metadata = file.metadata().ok()?;
    ((metadata.dev(), metadata.ino()) == identity).then_some(file)
}

/// A regular file at `path`, opened without blocking, no link in its last component, and, when
/// the recording identified the file (build ID or inode), that file.
fn open_identified(
    path: &str,
    build_id: Option<&[u8]>,
    inode: Option<FileInode>,
) -> Option<fs::File> {
    let file = open_regular(Path::new(path), FinalLink::Refuse).ok()?;
    let is_mapped_file = match (inode, build_id) {
        (Some(inode), _) => {
            let metadata = file.metadata().ok()?;
            FileInode::of(&metadata) == inode
        }
        (None, Some(expected)) => build_id_of(&file).as_deref() == Some(expected),
        (None, None) => true,
    };
    is_mapped_file.then_some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A module opened by path after its process exited is kept only if it is the file the
    /// kernel reported mapped: another file put at the path since is refused.
    #[test]
    fn files_opened_by_path_must_be_the_mapped_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("program");
        fs::write(&path, b"first").unwrap();
        let mapped = FileInode::of(&fs::metadata(&path).unwrap());
        let path = path.to_str().unwrap();
        let mut files = MappedFiles::default();
        assert!(files.open_path(path, None, Some(mapped)).is_some());
        // Replaced: same path, another inode.
        fs::remove_file(path).unwrap();
        fs::write(path, b"second").unwrap();
        assert_eq!(files.open_path(path, None, Some(mapped)), None);
        // Identified by build ID: not an ELF file, so not the one mapped.
        assert_eq!(files.open_path(path, Some(&[0xc0, 0xde]), None), None);
        // The running test binary has the build ID it has.
        let exe = std::env::current_exe().unwrap();
        let build_id = build_id_of(&fs::File::open(&exe).unwrap());
        if let Some(id) = build_id {
            let exe = exe.to_str().unwrap();
            assert!(files.open_path(exe, Some(&id), None).is_some());
            assert_eq!(files.open_path(exe, Some(&[0; 20]), None), None);
        }
    }
}
