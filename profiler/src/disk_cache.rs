//! Directories of what the profiler keeps across runs (compiled unwind tables, the kernel's
//! functions): private to the user who made them, written through [`crate::output`] (a
//! temporary file renamed into place, mode 0600), and read back as untrusted input. Their files
//! steer the unwinder and name kernel addresses, so a directory or file another user could
//! have written is refused, and every read is bounded by the file's size.

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};

use crate::input::{open_regular, FinalLink};
use crate::output::Checker;

/// How stale a file's last use may be before a read sets it anew. Pruning needs no finer
/// grain, and readers that map a file take a new modification time for a new file: blazesym
/// mapped and parsed glibc's 10 MB debug copy again at every read of it, keeping every old
/// mapping (14 MB a second of a recording under process churn).
const USE_TIME_GRAIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// One cache directory, made private to this user when first written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheDir {
    path: PathBuf,
}

impl CacheDir {
    pub fn new(path: PathBuf) -> CacheDir {
        CacheDir { path }
    }

    /// `/var/cache/profiler/KIND` for root, else `$XDG_CACHE_HOME/profiler/KIND` (default
    /// `~/.cache`); none without a home.
    pub fn default_for(kind: &str) -> Option<CacheDir> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let base = if unsafe { libc::geteuid() } == 0 {
            PathBuf::from("/var/cache")
        } else {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .filter(|path| path.is_absolute())
                .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))?
        };
        Some(CacheDir::new(base.join("profiler").join(kind)))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes of the file `name`, `None` when there is none. Refused: a link, anything but
    /// a regular file, a file or directory another user owns or may write, a file over
    /// `max_len` bytes. A file read has its modification time set to now, within an hour
    /// (see [`USE_TIME_GRAIN`]): pruning goes by last use.
    pub fn read(&self, name: &str, max_len: u64) -> Result<Option<Vec<u8>>> {
        let Some((_, file)) = self.open(name)? else {
            return Ok(None);
        };
        let len = file.metadata()?.len();
        if len > max_len {
            bail!("{len} bytes, more than such a file needs");
        }
        let mut bytes = Vec::with_capacity(len as usize);
        (&file).take(len).read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    }

    /// The file `name` checked as [`CacheBytes::checked`] checks a file's bytes (magic, version,
    /// CRC-32, key), read as a stream positioned after its key: a large file (a compiler's
    /// unwind rows) is never held whole beside what is decoded from it. `None` when there is
    /// no such file.
    pub fn read_checked(
        &self,
        name: &str,
        max_len: u64,
        header: CacheHeader<'_>,
    ) -> Result<Option<Checked<std::io::BufReader<File>>>> {
        let Some((_, mut file)) = self.open(name)? else {
            return Ok(None);
        };
        let len = file.metadata()?.len();
        if len > max_len {
            bail!("{len} bytes, more than such a file needs");
        }
        let Some(body_len) = len.checked_sub(4) else {
            bail!("truncated: {len} bytes");
        };
        let mut head = StreamBytes {
            reader: (&file).take(body_len),
            left: body_len,
        };
        if head.take_vec(header.magic.len(), "magic")? != header.magic {
            bail!("not {} cache file (wrong magic)", header.kind);
        }
        let found = head.u32("version")?;
        if found != header.version {
            bail!(
                "format version {found}, this profiler writes {}",
                header.version
            );
        }
        // The checksum first, over the whole body, a buffer at a time.
        file.seek(SeekFrom::Start(0))?;
        let mut crc = crc32fast::Hasher::new();
        let mut buffer = vec![0u8; 64 << 10];
        let mut body = (&file).take(body_len);
        loop {
            let read = body.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            crc.update(&buffer[..read]);
        }
        let mut stored = [0u8; 4];
        (&file).read_exact(&mut stored)?;
        if crc.finalize() != u32::from_le_bytes(stored) {
            bail!("checksum mismatch: the file is corrupt");
        }
        let after_version = header.magic.len() as u64 + 4;
        file.seek(SeekFrom::Start(after_version))?;
        let mut reader = StreamBytes {
            reader: std::io::BufReader::new(file).take(body_len - after_version),
            left: body_len - after_version,
        };
        let key_len = reader.count(1, "key length")?;
        Ok(Some(if reader.take_vec(key_len, "key")? == header.key {
            Checked::Matches(reader)
        } else {
            Checked::OtherKey
        }))
    }

    /// The path of the file `name`, for a reader that opens it itself (blazesym maps the files
    /// it reads), after the checks [`CacheDir::read`] makes; `None` when there is none. Only
    /// this user can replace a file in its private directory after the check.
    pub fn checked_path(&self, name: &str) -> Result<Option<PathBuf>> {
        Ok(self.open(name)?.map(|(path, _)| path))
    }

    /// The file `name` opened and checked, with its path; its modification time set to now
    /// when older than [`USE_TIME_GRAIN`].
    fn open(&self, name: &str) -> Result<Option<(PathBuf, File)>> {
        let path = self.path.join(name);
        let file = match open_regular(&path, FinalLink::Refuse) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        check_owner(&self.path, &std::fs::metadata(&self.path)?)?;
        let metadata = file.metadata()?;
        check_owner(&path, &metadata)?;
        let now = std::time::SystemTime::now();
        let used = metadata.modified()?;
        if now
            .duration_since(used)
            .is_ok_and(|age| age > USE_TIME_GRAIN)
        {
            // Failing only costs the file its place in the pruning order.
            let _ = File::set_modified(&file, now);
        }
        Ok(Some((path, file)))
    }

    /// Removes the least recently used `.EXTENSION` files of the directory until they take at
    /// most three quarters of `limit`, once they take more than `limit`: only its own regular
    /// files, never through a link.
    pub fn prune(&self, extension: &str, limit: u64) -> Result<()> {
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&self.path)? {
            let entry = entry?;
            let path = entry.path();
            let metadata = entry.metadata()?;
            if metadata.file_type().is_file() && path.extension().is_some_and(|e| e == extension) {
                files.push((metadata.modified()?, metadata.len(), path));
            }
        }
        let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
        if total <= limit {
            return Ok(());
        }
        files.sort();
        for (_, len, path) in files {
            if total <= limit / 4 * 3 {
                break;
            }
            std::fs::remove_file(&path).with_context(|| format!("pruning {}", path.display()))?;
            total -= len;
        }
        Ok(())
    }

    /// Writes `bytes` as the file `name`, creating the directory (mode 0700) if need be.
    pub fn write(&self, what: &'static str, name: &str, bytes: &[u8]) -> Result<()> {
        self.write_with(what, name, |out| out.write_all(bytes))
    }

    /// Writes the file `name` with what `fill` writes, then the CRC-32 of all of it, as
    /// [`end_file`] ends a file made in memory: a large file (a compiler's unwind rows) is
    /// written as it is made, never held whole beside what it is made from.
    pub fn write_ended(
        &self,
        what: &'static str,
        name: &str,
        fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<()> {
        self.write_with(what, name, |out| {
            let mut hashing = HashingWriter {
                out: &mut *out,
                crc: crc32fast::Hasher::new(),
            };
            fill(&mut hashing)?;
            let crc = hashing.crc.finalize();
            out.write_all(&crc.to_le_bytes())
        })
    }

    /// Writes the file `name` with what `write` writes, as it writes it.
    pub fn write_with(
        &self,
        what: &'static str,
        name: &str,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.path)
            .with_context(|| {
                format!("cannot create the {what} directory {}", self.path.display())
            })?;
        check_owner(&self.path, &std::fs::metadata(&self.path)?)?;
        Checker::default()
            .check(what, &self.path.join(name))?
            .write(|out| Ok(write(out)?))
    }
}

/// Passes bytes on, hashing them.
struct HashingWriter<'a> {
    out: &'a mut dyn Write,
    crc: crc32fast::Hasher,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(bytes)?;
        self.crc.update(&bytes[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Refuses a cache directory or file another user could have written.
fn check_owner(path: &Path, metadata: &std::fs::Metadata) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if metadata.uid() != me {
        bail!(
            "{} belongs to uid {}, not to this user (uid {me})",
            path.display(),
            metadata.uid()
        );
    }
    if metadata.mode() & 0o022 != 0 {
        bail!(
            "{} is writable by other users (mode {:o})",
            path.display(),
            metadata.mode() & 0o7777
        );
    }
    Ok(())
}

/// What a cache file starts with, for [`CacheDir::read_checked`].
pub struct CacheHeader<'a> {
    pub magic: &'a [u8; 8],
    pub version: u32,
    /// What the file holds, for messages (`an unwind-table`).
    pub kind: &'a str,
    /// The key of what is looked for.
    pub key: &'a [u8],
}

/// A checked cache file: its reader after the key, or a file written for another key.
pub enum Checked<R> {
    Matches(StreamBytes<std::io::Take<R>>),
    OtherKey,
}

/// Reads a cache file as a stream, each read bounded by what is left before its checksum;
/// the same reads and messages as [`CacheBytes`].
pub struct StreamBytes<R> {
    reader: R,
    left: u64,
}

impl<R: Read> StreamBytes<R> {
    /// Fills `out` from the file.
    pub fn read_into(&mut self, out: &mut [u8], what: &str) -> Result<()> {
        if out.len() as u64 > self.left {
            bail!(
                "truncated: {what} needs {} bytes, {} are left",
                out.len(),
                self.left
            );
        }
        self.reader.read_exact(out)?;
        self.left -= out.len() as u64;
        Ok(())
    }

    fn take_vec(&mut self, n: usize, what: &str) -> Result<Vec<u8>> {
        if n as u64 > self.left {
            bail!("truncated: {what} needs {n} bytes, {} are left", self.left);
        }
        let mut out = vec![0; n];
        self.read_into(&mut out, what)?;
        Ok(out)
    }
}

impl<R: Read> CacheFields for StreamBytes<R> {
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0; N];
        self.read_into(&mut out, what)?;
        Ok(out)
    }

    fn left(&self) -> u64 {
        self.left
    }
}

/// The fields of a cache file, read in order, each bounded by what is left of the file.
pub trait CacheFields {
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]>;

    /// Bytes left unread (before the checksum).
    fn left(&self) -> u64;

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count of `item_len`-byte items, refused when the file cannot hold that many.
    fn count(&mut self, item_len: usize, what: &str) -> Result<usize> {
        let count = self.u32(what)? as usize;
        if (count as u64).saturating_mul(item_len as u64) > self.left() {
            bail!("{what} says {count}, more than the file holds");
        }
        Ok(count)
    }
}

/// Reads a cache file's bytes, each read bounded by what is left.
pub struct CacheBytes<'a> {
    rest: &'a [u8],
}

impl<'a> CacheBytes<'a> {
    pub fn new(bytes: &'a [u8]) -> CacheBytes<'a> {
        CacheBytes { rest: bytes }
    }

    /// What is left unread.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.rest.len() {
            bail!(
                "truncated: {what} needs {n} bytes, {} are left",
                self.rest.len()
            );
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    /// Checks the header every cache file starts with (magic, format version, the key of what
    /// it was written for) and the CRC-32 of the whole file that ends it; returns a reader of
    /// what lies between, `None` when the file was written for another key.
    pub fn checked(
        bytes: &'a [u8],
        magic: &[u8; 8],
        version: u32,
        kind: &str,
        key: &[u8],
    ) -> Result<Option<CacheBytes<'a>>> {
        let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
            bail!("truncated: {} bytes", bytes.len());
        };
        let mut reader = CacheBytes::new(body);
        if reader.take(magic.len(), "magic")? != magic {
            bail!("not {kind} cache file (wrong magic)");
        }
        let found = reader.u32("version")?;
        if found != version {
            bail!("format version {found}, this profiler writes {version}");
        }
        if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
            bail!("checksum mismatch: the file is corrupt");
        }
        let key_len = reader.count(1, "key length")?;
        Ok((reader.take(key_len, "key")? == key).then_some(reader))
    }
}

impl CacheFields for CacheBytes<'_> {
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }

    fn left(&self) -> u64 {
        self.rest.len() as u64
    }
}

/// A cache file's first bytes: magic, format version and the key of what it holds, as
/// [`CacheBytes::checked`] reads them.
pub fn start_file(magic: &[u8; 8], version: u32, key: &[u8], capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity + key.len() + 20);
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out
}

/// Ends a cache file begun by [`start_file`] with the CRC-32 of everything before.
pub fn end_file(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_round_trip_in_a_private_directory() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path().join("profiler/test"));
        assert_eq!(cache.read("entry", 100).unwrap(), None);
        cache.write("test cache", "entry", b"bytes").unwrap();
        assert_eq!(cache.read("entry", 100).unwrap().unwrap(), b"bytes");
        let mode = |path: &Path| std::fs::metadata(path).unwrap().mode() & 0o777;
        assert_eq!(mode(cache.path()), 0o700);
        assert_eq!(mode(&cache.path().join("entry")), 0o600);
        // Larger than the caller's bound: refused, not read.
        let error = cache.read("entry", 4).unwrap_err().to_string();
        assert!(error.contains("5 bytes, more than"), "{error}");
    }

    #[test]
    fn links_and_directories_others_may_write_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path().join("cache"));
        cache.write("test cache", "entry", b"bytes").unwrap();
        std::fs::write(dir.path().join("elsewhere"), b"planted").unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), cache.path().join("link"))
            .unwrap();
        assert!(cache.read("link", 100).is_err(), "a link is not followed");
        std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = cache.read("entry", 100).unwrap_err().to_string();
        assert!(
            error.contains("is writable by other users (mode 777)"),
            "{error}"
        );
    }

    #[test]
    fn the_directory_keeps_its_most_recently_used_files_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let now = std::time::SystemTime::now();
        // Four 100-byte tables, the first used longest ago; a file of another kind is left alone.
        for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
            let path = dir.path().join(format!("{name}.unwind"));
            std::fs::write(&path, [0u8; 100]).unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(now - std::time::Duration::from_secs(100 - i as u64))
                .unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), [0u8; 1000]).unwrap();
        let left = |dir: &Path| {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        };
        // Within the bound: nothing goes.
        let cache = CacheDir::new(dir.path().to_path_buf());
        cache.prune("unwind", 400).unwrap();
        assert_eq!(left(dir.path()).len(), 5);
        // Over 300: down to three quarters (225), the least recently used first.
        cache.prune("unwind", 300).unwrap();
        assert_eq!(left(dir.path()), ["c.unwind", "d.unwind", "notes.txt"]);
    }

    #[test]
    fn a_read_sets_the_use_time_only_when_it_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path().join("cache"));
        cache.write("test", "a.debug", b"copy").unwrap();
        let path = cache.path().join("a.debug");
        let modified = |path: &Path| std::fs::metadata(path).unwrap().modified().unwrap();
        let set = |age: u64| {
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            let time = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
            file.set_modified(time).unwrap();
            modified(&path)
        };
        // Used a minute ago: a reader that maps the file sees the same file again.
        let recent = set(60);
        assert_eq!(cache.checked_path("a.debug").unwrap(), Some(path.clone()));
        assert_eq!(modified(&path), recent);
        // Used two hours ago: it moves up in the pruning order.
        let stale = set(7200);
        cache.checked_path("a.debug").unwrap();
        assert!(modified(&path) > stale + USE_TIME_GRAIN);
    }

    #[test]
    fn checked_files_need_their_magic_version_and_checksum() {
        let file = end_file([start_file(b"TESTFILE", 3, b"key", 4), b"data".to_vec()].concat());
        let mut reader = CacheBytes::checked(&file, b"TESTFILE", 3, "a test", b"key")
            .unwrap()
            .expect("written for this key");
        assert_eq!(reader.take(4, "data").unwrap(), b"data");
        assert!(reader.rest().is_empty());
        let other_key = CacheBytes::checked(&file, b"TESTFILE", 3, "a test", b"kez").unwrap();
        assert!(other_key.is_none(), "another key's file is not read");
        let refusal = |bytes: &[u8], version| {
            CacheBytes::checked(bytes, b"TESTFILE", version, "a test", b"key")
                .err()
                .unwrap()
                .to_string()
        };
        assert!(refusal(&file, 4).starts_with("format version 3"));
        let mut flipped = file.clone();
        flipped[13] ^= 1;
        assert!(refusal(&flipped, 3).starts_with("checksum mismatch"));
        assert!(refusal(b"OTHERFIL\x03\0\0\0\0\0\0\0", 3).starts_with("not a test cache file"));
        assert!(refusal(b"abc", 3).starts_with("truncated"));
        // Counts larger than the rest of the file are refused before anything is allocated.
        let mut reader = CacheBytes::new(&[0xff, 0xff, 0xff, 0xff, 1, 2]);
        assert!(reader.count(1, "items").is_err());
    }
}
