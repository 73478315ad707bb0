//! Reading files the profiler did not write: sampled programs and libraries, JIT perf maps,
//! and the profiles and perf.data files given to `report -i`. Running as root, the profiler
//! must not block on a FIFO, read a device without end, or load a whole file of any size
//! because another user planted it where a module was. Files are opened without blocking and
//! kept only when they are regular files; modules are read in bounded ranges, only where a
//! parser looks; inputs are read whole, up to the size they had when opened.

use std::{
    fmt::Display,
    fs::File,
    io::{self, Read},
    ops::Range,
    os::{
        fd::AsRawFd,
        unix::fs::{FileTypeExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use object::{ReadCache, ReadRef};

mod module_copy;
pub use module_copy::{symbol_path, Refused, SymbolPath, LINKS_NOT_FOLLOWED};

/// Whether the last component of a path may be a symbolic link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalLink {
    /// Kernel-made links (`/proc/PID/map_files/...`, `/proc/self/fd/N`) reach the right file.
    Follow,
    /// Paths another user could have replaced by a link.
    Refuse,
}

/// Opens `path` for reading if it is a regular file. Opening never blocks (a FIFO with no
/// writer returns at once, and is then refused); devices, FIFOs, sockets and directories are
/// refused with an error saying what they are.
pub fn open_regular(path: &Path, link: FinalLink) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if link == FinalLink::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = File::options().read(true).custom_flags(flags).open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    let what = if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file"),
    ))
}

/// Most bytes one read of a module may take: above any real symbol or string table, so that a
/// crafted file declaring a table of many gigabytes (sparse, costing its owner nothing) is
/// refused rather than loaded.
pub const MAX_MODULE_READ: u64 = 256 << 20;

/// A module file read on demand with `pread`, never whole and never mapped: a parser's reads
/// are cached, each refused past [`MAX_MODULE_READ`] or past the end of the file. (A mapping
/// would fault with SIGBUS if the file's owner truncated it meanwhile.)
pub struct ModuleImage {
    cache: ReadCache<File>,
}

impl ModuleImage {
    pub fn new(file: File) -> Self {
        ModuleImage {
            cache: ReadCache::new(file),
        }
    }

    /// The module open as `file`, read through a new open file description, so that its
    /// reads do not move `file`'s offset. (The symbolizer reads it at [`symbol_path`].)
    pub fn of(file: &File) -> Option<ModuleImage> {
        Some(ModuleImage::new(
            open_regular(&descriptor_path(file), FinalLink::Follow).ok()?,
        ))
    }
}

/// `/proc/self/fd/N`: reaches the open file itself, whatever is at its path now.
pub fn descriptor_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

impl<'a> ReadRef<'a> for &'a ModuleImage {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size > MAX_MODULE_READ {
            return Err(());
        }
        (&self.cache).read_bytes_at(offset, size)
    }

    /// Strings, looked for in at most [`MAX_STRING`] bytes. Symbol names are read one after
    /// another from tables of thousands, and the cache read each with a seek and a read of its
    /// own: the block of the table around a string is read once and searched in memory; a
    /// string across the block's end is read by the cache.
    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let block_start = range.start - range.start % STRING_BLOCK;
        let block_end = block_start.saturating_add(STRING_BLOCK).min(range.end);
        if block_end > range.start {
            if let Ok(block) = (&self.cache).read_bytes_at(block_start, block_end - block_start) {
                let within = &block[(range.start - block_start) as usize..];
                let searched = &within[..within.len().min(MAX_STRING)];
                match searched.iter().position(|&byte| byte == delimiter) {
                    Some(len) => return Ok(&within[..len]),
                    None if searched.len() == MAX_STRING || block_end == range.end => {
                        return Err(())
                    }
                    None => {}
                }
            }
        }
        (&self.cache).read_bytes_at_until(range, delimiter)
    }
}

/// Bytes of a module read at once around a string (see [`ModuleImage`]'s reads).
const STRING_BLOCK: u64 = 64 << 10;

/// The longest string looked for in a module, as `object`'s cache bounds it.
const MAX_STRING: usize = 4096;

/// Files named by each kind of warning, at most, in one run. Another user can map thousands of
/// crafted files: a line for each was megabytes of standard error, and a profiler whose stderr
/// is a pipe nobody reads until it exits (a supervisor's, a test's) blocked in write(2) when it
/// filled, capture and shutdown with it.
pub const MAX_FILES_NAMED: u64 = 20;

/// A kind of warning that names a file another user controls: printed for the first
/// [`MAX_FILES_NAMED`] files, then once more to say that further files go unnamed.
pub struct FileWarning {
    said: AtomicU64,
    /// What the last line says of the files not named (where they are counted).
    further: &'static str,
}

impl FileWarning {
    pub const fn new(further: &'static str) -> FileWarning {
        FileWarning {
            said: AtomicU64::new(0),
            further,
        }
    }

    /// Prints `warning: {message}` on stderr while under the cap.
    pub fn warn(&self, message: impl Display) {
        if let Some(line) = self.line(message) {
            eprintln!("{line}");
        }
    }

    fn line(&self, message: impl Display) -> Option<String> {
        // Saturating: past the cap a count is only "more".
        let said = self
            .said
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |said| {
                Some((said + 1).min(MAX_FILES_NAMED + 1))
            })
            .unwrap_or_else(|said| said);
        match said.cmp(&MAX_FILES_NAMED) {
            std::cmp::Ordering::Less => Some(format!("warning: {message}")),
            std::cmp::Ordering::Equal => Some(format!(
                "warning: {} (only the first {MAX_FILES_NAMED} are named)",
                self.further
            )),
            std::cmp::Ordering::Greater => None,
        }
    }
}

/// The bytes of an input file (`report -i`): a regular file, read up to the size it had when
/// opened (a file still growing is read as it was then). Anything else is refused: a device
/// or a FIFO would feed the decoder without end, or block.
pub fn read_input(path: &Path) -> io::Result<Vec<u8>> {
    let file = open_regular(path, FinalLink::Follow)?;
    let len = file.metadata()?.len();
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(usize::try_from(len).unwrap_or(usize::MAX))?;
    file.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Reads at most `limit` bytes of a regular file, as text when it is: for small text files
/// (perf maps) that another user may make arbitrarily large.
pub fn read_text_bounded(file: File, limit: u64) -> io::Result<String> {
    let mut text = String::new();
    file.take(limit).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn mkfifo(path: &Path) {
        let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn fifos_devices_and_directories_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        for (path, what) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a device"),
            (dir.path(), "a directory"),
        ] {
            let err = open_regular(path, FinalLink::Follow).unwrap_err();
            assert_eq!(err.to_string(), format!("{what}, not a regular file"));
        }
    }

    #[test]
    fn planted_links_are_refused_where_asked() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("module");
        std::fs::write(&target, b"\x7fELF").unwrap();
        let link = dir.path().join("link");
        symlink(&target, &link).unwrap();
        assert!(open_regular(&link, FinalLink::Follow).is_ok());
        let err = open_regular(&link, FinalLink::Refuse).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
    }

    #[test]
    fn a_sparse_module_declaring_huge_tables_is_read_in_bounded_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = File::create(&path).unwrap();
        file.set_len(64 << 30).unwrap();
        let image = ModuleImage::new(open_regular(&path, FinalLink::Refuse).unwrap());
        assert_eq!((&image).len(), Ok(64 << 30));
        assert_eq!((&image).read_bytes_at(1 << 30, 4), Ok(&[0u8; 4][..]));
        assert_eq!((&image).read_bytes_at(0, MAX_MODULE_READ + 1), Err(()));
        // A string with no end is looked for in a bounded range.
        assert_eq!((&image).read_bytes_at_until(0..64 << 30, b'x'), Err(()));
        assert_eq!(
            (&image).read_bytes_at_until((1 << 30) - 10..64 << 30, b'x'),
            Err(())
        );
        // Not ELF: refused at once, whatever it is big.
        assert!(object::File::parse(&image).is_err());
    }

    #[test]
    fn strings_are_read_a_block_at_a_time_as_the_cache_reads_them() {
        // Strings of every length up to past the longest looked for, some across the block's
        // end, a last one without its delimiter.
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        let mut length = 0;
        while bytes.len() < 3 * STRING_BLOCK as usize {
            starts.push(bytes.len() as u64);
            bytes.extend(std::iter::repeat_n(b'a' + (length % 26) as u8, length));
            bytes.push(0);
            length = (length * 7 + 13) % (MAX_STRING + 100);
        }
        starts.push(bytes.len() as u64);
        bytes.extend_from_slice(b"unterminated");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("strings");
        std::fs::write(&path, &bytes).unwrap();
        let image = ModuleImage::new(File::open(&path).unwrap());
        let end = bytes.len() as u64;
        for &start in &starts {
            for range in [start..end, start..(start + 100).min(end)] {
                // A cache of its own for each: the cache answers a string it read before
                // whatever the range.
                let cache = ReadCache::new(File::open(&path).unwrap());
                assert_eq!(
                    (&image).read_bytes_at_until(range.clone(), 0),
                    (&cache).read_bytes_at_until(range, 0),
                    "the string at {start}"
                );
            }
        }
    }

    #[test]
    fn inputs_are_regular_files_read_as_they_were_when_opened() {
        let err = read_input(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(err.to_string(), "a device, not a regular file");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile");
        std::fs::write(&path, b"EBPFPROF").unwrap();
        assert_eq!(read_input(&path).unwrap(), b"EBPFPROF");
    }

    #[test]
    fn warnings_name_a_bounded_number_of_files() {
        let warning = FileWarning::new("more files refused");
        let lines: Vec<String> = (0..MAX_FILES_NAMED * 50)
            .filter_map(|n| warning.line(format!("file{n}: refused")))
            .collect();
        assert_eq!(lines.len() as u64, MAX_FILES_NAMED + 1);
        assert_eq!(lines[0], "warning: file0: refused");
        assert_eq!(
            lines.last().unwrap(),
            &format!("warning: more files refused (only the first {MAX_FILES_NAMED} are named)")
        );
    }

    #[test]
    fn bounded_text_stops_at_its_limit() {
        let zero = File::open("/dev/zero").unwrap();
        assert_eq!(read_text_bounded(zero, 10).unwrap(), "\0".repeat(10));
    }
}
