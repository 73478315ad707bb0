//! Every file the profiler writes (`record -o`, `--raw`, `--report`, `--json`, `--folded`,
//! `--flamegraph`, `--pprof`, `--histogram FILE`, `stat -o`) goes through this one writer, with
//! one set of rules:
//!
//! - Checked before any work starts ([`Checker::check`]): the directory exists and is writable,
//!   and the target is absent or a regular file. Devices, FIFOs, sockets and directories are
//!   refused; to stream to one, give `-` (standard output) and redirect it. At most one output
//!   takes standard output.
//! - Symbolic links are followed only where the kernel's `fs.protected_symlinks` would follow
//!   them: never a link in a world-writable sticky directory (`/tmp`) that belongs neither to the
//!   user running the profiler nor to the directory's owner, whatever that sysctl says.
//! - The directory is held open from the check on; the data goes to a new temporary file beside
//!   the target, created 0600 (the umask can only narrow it: profiles hold code bytes, command
//!   lines and addresses), synced, then renamed over the target. A failure leaves the old file
//!   as it was and no temporary behind. The new file is the invoking user's, mode 0600, whatever
//!   owner and mode an older file at that path had (as perf does with perf.data).

use std::{
    ffi::{CStr, CString, OsStr, OsString},
    fs::{self, File},
    io::{self, BufWriter, Read, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::DirBuilderExt},
    },
    path::{Component, Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use anyhow::{anyhow, bail, Context, Result};

/// The name that means standard output.
pub const STDOUT: &str = "-";
/// Symbolic links followed in one path before giving up, as the kernel's ELOOP limit.
const MAX_LINKS: usize = 40;

/// A checked output: where one option's file goes.
#[derive(Clone, Debug)]
pub struct Output {
    option: &'static str,
    /// As the user gave it.
    path: PathBuf,
    target: Target,
}

#[derive(Clone, Debug)]
enum Target {
    Stdout,
    /// `name` in the directory held open as `dir` (no symbolic link in between).
    File {
        dir: Arc<OwnedFd>,
        name: CString,
    },
}

/// Checks every output of one command, so that at most one of them is standard output.
#[derive(Debug, Default)]
pub struct Checker {
    stdout_taken_by: Option<&'static str>,
}

impl Checker {
    /// `option PATH`, checked now: see the module's rules.
    pub fn check(&mut self, option: &'static str, path: &Path) -> Result<Output> {
        if path.as_os_str() == STDOUT {
            if let Some(other) = self.stdout_taken_by.replace(option) {
                bail!(
                    "{option} -: {other} already writes to standard output; give one of them a \
                     file name"
                );
            }
            return Ok(Output {
                option,
                path: path.to_path_buf(),
                target: Target::Stdout,
            });
        }
        let target =
            check_file(option, path).with_context(|| format!("{option} {}", path.display()))?;
        Ok(Output {
            option,
            path: path.to_path_buf(),
            target,
        })
    }

    pub fn check_optional(
        &mut self,
        option: &'static str,
        path: Option<&Path>,
    ) -> Result<Option<Output>> {
        path.map(|path| self.check(option, path)).transpose()
    }

    /// Whether an output streams to standard output.
    pub fn stdout_taken(&self) -> bool {
        self.stdout_taken_by.is_some()
    }
}

/// Resolves `path`'s links under the protected-link rule, then checks its directory and the
/// target itself.
fn check_file(option: &str, path: &Path) -> Result<Target> {
    let resolved = resolve_links(path)?;
    let (dir_path, name) = match (resolved.parent(), resolved.file_name()) {
        (Some(dir), Some(name)) => (
            if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            },
            name,
        ),
        _ => bail!("is a directory, not a file name"),
    };
    let dir = open_directory(dir_path)?;
    let name = c_string(name)?;
    match stat_at(&dir, &name, libc::AT_SYMLINK_NOFOLLOW) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e).context("cannot look at the existing file"),
        Ok(stat) => {
            let kind = stat.st_mode & libc::S_IFMT;
            let what = match kind {
                libc::S_IFREG => None,
                libc::S_IFDIR => Some("is a directory"),
                libc::S_IFCHR | libc::S_IFBLK => Some("is a device"),
                libc::S_IFIFO => Some("is a FIFO"),
                libc::S_IFSOCK => Some("is a socket"),
                // A link planted after the links were resolved: refuse rather than follow it.
                _ => Some("changed into a symbolic link while it was checked"),
            };
            if let Some(what) = what {
                if kind == libc::S_IFDIR {
                    bail!("{what}: give a file name");
                }
                bail!(
                    "{what}: the profiler writes only regular files (to stream to it, give `-` \
                     and redirect standard output, e.g. `{option} - > {}`)",
                    path.display()
                );
            }
        }
    }
    // After the target: a device in a directory the user cannot write is named as a device.
    // SAFETY: `dir` is an open descriptor and the path a NUL-terminated string.
    if unsafe {
        libc::faccessat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    } != 0
    {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("cannot create files in {}", dir_path.display()));
    }
    Ok(Target::File {
        dir: Arc::new(dir),
        name,
    })
}

fn c_string(name: &OsStr) -> Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| anyhow!("the name holds a NUL byte"))
}

fn open_directory(path: &Path) -> Result<OwnedFd> {
    let c_path = c_string(path.as_os_str())?;
    // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
    let fd = unsafe {
        libc::open(
            c_path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let error = io::Error::last_os_error();
        let what = match error.raw_os_error() {
            Some(libc::ENOENT) => "does not exist".to_string(),
            Some(libc::ENOTDIR) => "is not a directory".to_string(),
            _ => format!("cannot be opened: {error}"),
        };
        bail!("the directory {} {what}", path.display());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn stat_at(dir: &OwnedFd, name: &CStr, flags: i32) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: an open directory descriptor, a NUL-terminated name and a valid out-pointer.
    if unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut stat, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat)
}

/// `path` with every symbolic link replaced by what it points to, refusing links that
/// `fs.protected_symlinks` protects against (see [`may_follow`]).
fn resolve_links(path: &Path) -> Result<PathBuf> {
    let mut resolved = PathBuf::new();
    // What is left to walk, last component first.
    let mut pending: Vec<OsString> = Vec::new();
    let push_components = |pending: &mut Vec<OsString>, path: &Path, resolved: &mut PathBuf| {
        let mut parts = Vec::new();
        for component in path.components() {
            match component {
                Component::RootDir => {
                    *resolved = PathBuf::from("/");
                    parts.clear();
                }
                Component::Prefix(_) | Component::CurDir => {}
                Component::ParentDir => parts.push(OsString::from("..")),
                Component::Normal(name) => parts.push(name.to_os_string()),
            }
        }
        pending.extend(parts.into_iter().rev());
    };
    push_components(&mut pending, path, &mut resolved);
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            let at_relative_start = resolved.as_os_str().is_empty() || resolved.ends_with("..");
            if at_relative_start {
                resolved.push("..");
            } else {
                resolved.pop();
            }
            continue;
        }
        let candidate = resolved.join(&part);
        let is_link = std::fs::symlink_metadata(&candidate).is_ok_and(|m| m.is_symlink());
        if !is_link {
            resolved = candidate;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            bail!("more than {MAX_LINKS} symbolic links (a loop?)");
        }
        let dir = if resolved.as_os_str().is_empty() {
            Path::new(".")
        } else {
            resolved.as_path()
        };
        may_follow(&candidate, dir)?;
        let points_to = std::fs::read_link(&candidate)
            .with_context(|| format!("cannot read the symbolic link {}", candidate.display()))?;
        push_components(&mut pending, &points_to, &mut resolved);
    }
    Ok(resolved)
}

/// The kernel's `fs.protected_symlinks` rule, applied whatever the sysctl says: a link in a
/// world-writable sticky directory is followed only when it belongs to the user running the
/// profiler or to the directory's owner. Anyone can plant a link in `/tmp`; following it would
/// let them choose which file root overwrites.
fn may_follow(link: &Path, dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;

    let link_meta = std::fs::symlink_metadata(link)
        .with_context(|| format!("cannot look at {}", link.display()))?;
    let dir_meta =
        std::fs::metadata(dir).with_context(|| format!("cannot look at {}", dir.display()))?;
    let sticky_and_world_writable =
        dir_meta.mode() & libc::S_ISVTX != 0 && dir_meta.mode() & libc::S_IWOTH != 0;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if sticky_and_world_writable && link_meta.uid() != me && link_meta.uid() != dir_meta.uid() {
        bail!(
            "refusing to follow the symbolic link {} in the world-writable sticky directory {}: \
             it belongs to user {}, neither you nor the directory's owner (anyone could have \
             planted it); give the link's target instead",
            link.display(),
            dir.display(),
            link_meta.uid()
        );
    }
    Ok(())
}

/// A directory the agent writes to for months (`--output-dir`, `--spool-dir`): created if
/// absent, held open from the check on (a link swapped in for it later changes nothing), and
/// refused unless this user owns it and no other user may write in it. The agent runs as root:
/// a file another user planted or swapped in there would be read back or removed as root.
#[derive(Clone, Debug)]
pub struct PrivateDir {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

/// A regular file in a [`PrivateDir`], as `fstatat` sees it without following a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirFile {
    pub device: u64,
    pub inode: u64,
    pub bytes: u64,
}

impl PrivateDir {
    /// Creates `path` (and its parents) with `mode` if it does not exist, opens it without
    /// following a link in its last component, and checks its owner and mode.
    pub fn open(path: &Path, mode: u32) -> Result<PrivateDir> {
        const FIX: &str = "give a directory only this user can write (it is created if absent)";
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)
            .with_context(|| format!("cannot create it; {FIX}"))?;
        let c_path = c_string(path.as_os_str())?;
        // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
        let fd = unsafe {
            libc::open(
                c_path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let error = io::Error::last_os_error();
            // With O_DIRECTORY, Linux answers a link with ENOTDIR rather than ELOOP.
            let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            match error.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) if is_link => bail!(
                    "it is a symbolic link, which another user may have swapped in: give the \
                     directory itself"
                ),
                Some(libc::ENOTDIR) => bail!("it is not a directory; {FIX}"),
                _ => return Err(error).context(format!("cannot open it; {FIX}")),
            }
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct; fstat writes it
        // through a valid pointer for an open descriptor.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(io::Error::last_os_error()).context("cannot look at it");
        }
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let mode = stat.st_mode & 0o7777;
        if stat.st_uid != me {
            bail!(
                "it belongs to user {}, not to this user ({me}), who may change it at any time; \
                 {FIX}",
                stat.st_uid
            );
        }
        if mode & 0o022 != 0 {
            bail!(
                "other users may write in it (mode {mode:04o}): they could plant or swap the \
                 files the agent reads back and removes; run `chmod go-w` on it or {FIX}"
            );
        }
        if mode & 0o700 != 0o700 {
            bail!("this user cannot list and write in it (mode {mode:04o}); {FIX}");
        }
        Ok(PrivateDir {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` in this directory as an output of `option`, written as every output is (a new
    /// file renamed over the old entry, never through a link).
    pub fn output(&self, option: &'static str, name: &str) -> Result<Output> {
        Ok(Output {
            option,
            path: self.path.join(name),
            target: Target::File {
                dir: self.fd.clone(),
                name: c_string(OsStr::new(name))?,
            },
        })
    }

    /// `name` if it is a regular file (not a link, whatever it points to).
    pub fn file(&self, name: &str) -> Option<DirFile> {
        let stat = stat_at(
            &self.fd,
            &c_string(OsStr::new(name)).ok()?,
            libc::AT_SYMLINK_NOFOLLOW,
        );
        let stat = stat.ok()?;
        (stat.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(DirFile {
            device: stat.st_dev,
            inode: stat.st_ino,
            bytes: stat.st_size as u64,
        })
    }

    /// The names in the directory.
    pub fn names(&self) -> io::Result<Vec<String>> {
        // The directory held open, not the path, which may lead elsewhere by now.
        let entries = fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))?;
        Ok(entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect())
    }

    /// Reads the regular file `name`, refusing one larger than `max_bytes`.
    pub fn read(&self, name: &str, max_bytes: u64) -> io::Result<Vec<u8>> {
        let c_name = c_string(OsStr::new(name)).map_err(io::Error::other)?;
        // SAFETY: an open directory descriptor and a NUL-terminated name; the descriptor
        // returned is owned below.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c_name.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        let metadata = file.metadata()?;
        if !metadata.is_file() || metadata.len() > max_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: not a regular file of at most {max_bytes} bytes",
                    self.path.join(name).display()
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(metadata.len() as usize);
        // Bounded even if the file grows while it is read.
        file.take(max_bytes + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: grew while it was read", self.path.join(name).display()),
            ));
        }
        Ok(bytes)
    }

    /// Removes the entry `name` (a link itself, never what it points to).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let c_name = c_string(OsStr::new(name)).map_err(io::Error::other)?;
        // SAFETY: an open directory descriptor and a NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c_name.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Temporary files being written, removed by [`remove_temporaries`] when the profiler exits on
/// a signal before they are renamed or dropped.
static TEMPORARIES: Mutex<Vec<(Arc<OwnedFd>, CString)>> = Mutex::new(Vec::new());
static TEMPORARY_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Removes the temporary files of outputs still being written (for an exit that skips their
/// destructors).
pub fn remove_temporaries() {
    let Ok(temporaries) = TEMPORARIES.lock() else {
        return;
    };
    for (dir, name) in temporaries.iter() {
        unlink_at(dir, name);
    }
}

fn unlink_at(dir: &OwnedFd, name: &CStr) {
    // SAFETY: an open directory descriptor and a NUL-terminated name.
    unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) };
}

impl Output {
    /// The output standard output stands for (the report of `report`, `record --json -`).
    pub fn stdout(option: &'static str) -> Output {
        Output {
            option,
            path: PathBuf::from(STDOUT),
            target: Target::Stdout,
        }
    }

    pub fn is_stdout(&self) -> bool {
        matches!(self.target, Target::Stdout)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `--folded out.txt`, `--raw standard output`: for messages.
    pub fn describe(&self) -> String {
        match self.target {
            Target::Stdout => format!("{} (standard output)", self.option),
            Target::File { .. } => format!("{} {}", self.option, self.path.display()),
        }
    }

    /// Starts writing: a new temporary file beside the target, or standard output.
    pub fn create(&self) -> Result<OutputWriter> {
        let (sink, temporary) = match &self.target {
            Target::Stdout => (Sink::Stdout(io::stdout()), None),
            Target::File { dir, name } => {
                let (file, temporary) = create_temporary(dir, name).with_context(|| {
                    format!("{}: cannot create a temporary file", self.describe())
                })?;
                (Sink::File(BufWriter::new(file)), Some(temporary))
            }
        };
        Ok(OutputWriter {
            output: self.clone(),
            sink,
            temporary,
        })
    }

    /// Writes the whole output with `write`, then puts it in place. Errors name the option, the
    /// file and the cause (the errno's text).
    pub fn write(&self, write: impl FnOnce(&mut OutputWriter) -> Result<()>) -> Result<()> {
        let mut writer = self.create()?;
        match write(&mut writer) {
            Err(error) if self.reader_went_away(&error) => Ok(()),
            Err(error) => Err(error.context(format!("{}: cannot write", self.describe()))),
            Ok(()) => writer.commit(),
        }
    }

    /// Whether `error` only says that the reader of standard output stopped reading
    /// (`profiler ... --json - | head`): not a failure, as for any filter in a pipeline.
    pub fn reader_went_away(&self, error: &anyhow::Error) -> bool {
        self.is_stdout()
            && error
                .chain()
                .filter_map(|cause| cause.downcast_ref::<io::Error>())
                .any(|io| io.kind() == io::ErrorKind::BrokenPipe)
    }
}

/// `.NAME.PID.N.tmp` beside the target, created exclusively, never through a link, mode 0600.
fn create_temporary(dir: &Arc<OwnedFd>, name: &CStr) -> io::Result<(File, CString)> {
    // Room for the decorations within the 255-byte name limit.
    let stem = &name.to_bytes()[..name.to_bytes().len().min(200)];
    loop {
        let serial = TEMPORARY_COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut temporary = b".".to_vec();
        temporary.extend_from_slice(stem);
        temporary.extend_from_slice(format!(".{}.{serial}.tmp", std::process::id()).as_bytes());
        let temporary = CString::new(temporary).expect("no NUL in a CStr's bytes");
        // SAFETY: an open directory descriptor and a NUL-terminated name; the descriptor returned
        // is owned below.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                temporary.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EEXIST) {
                continue;
            }
            return Err(error);
        }
        if let Ok(mut temporaries) = TEMPORARIES.lock() {
            temporaries.push((dir.clone(), temporary.clone()));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        return Ok((unsafe { File::from_raw_fd(fd) }, temporary));
    }
}

enum Sink {
    Stdout(io::Stdout),
    File(BufWriter<File>),
}

/// An output being written. [`OutputWriter::commit`] puts it in place; dropped without that,
/// its temporary file is removed and the target left as it was.
pub struct OutputWriter {
    output: Output,
    sink: Sink,
    temporary: Option<CString>,
}

impl Write for OutputWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match &mut self.sink {
            Sink::Stdout(out) => out.write(bytes),
            Sink::File(out) => out.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Stdout(out) => out.flush(),
            Sink::File(out) => out.flush(),
        }
    }
}

impl OutputWriter {
    pub fn output(&self) -> &Output {
        &self.output
    }

    /// Flushes, syncs and renames the temporary file over the target (and syncs the
    /// directory, which makes the rename durable).
    pub fn commit(mut self) -> Result<()> {
        let describe = self.output.describe();
        if let Err(error) = self.flush() {
            let error = anyhow::Error::new(error);
            if self.output.reader_went_away(&error) {
                return Ok(());
            }
            return Err(error.context(format!("{describe}: cannot write")));
        }
        let (Sink::File(file), Target::File { dir, name }) = (&self.sink, &self.output.target)
        else {
            return Ok(());
        };
        let temporary = self
            .temporary
            .take()
            .expect("a file output has a temporary");
        let result = commit_file(file.get_ref(), dir, &temporary, name);
        forget_temporary(dir, &temporary);
        if result.is_err() {
            unlink_at(dir, &temporary);
        }
        result.with_context(|| format!("{describe}: cannot put the file in place"))
    }
}

fn commit_file(file: &File, dir: &OwnedFd, temporary: &CStr, name: &CStr) -> Result<()> {
    file.sync_all().context("cannot flush it to disk")?;
    // SAFETY: the same open directory descriptor on both sides and NUL-terminated names.
    if unsafe {
        libc::renameat(
            dir.as_raw_fd(),
            temporary.as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error()).context("cannot rename the temporary file over it");
    }
    // SAFETY: an open directory descriptor and a NUL-terminated name; the descriptor returned is
    // owned below.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    // A directory the profiler may write but not read cannot be synced; the rename stands.
    if fd >= 0 {
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let dir = unsafe { File::from_raw_fd(fd) };
        dir.sync_all()
            .context("cannot flush its directory to disk")?;
    }
    Ok(())
}

fn forget_temporary(dir: &Arc<OwnedFd>, temporary: &CStr) {
    if let Ok(mut temporaries) = TEMPORARIES.lock() {
        temporaries
            .retain(|(held, name)| !(Arc::ptr_eq(held, dir) && name.as_c_str() == temporary));
    }
}

impl Drop for OutputWriter {
    fn drop(&mut self) {
        if let (Some(temporary), Target::File { dir, .. }) = (&self.temporary, &self.output.target)
        {
            unlink_at(dir, temporary);
            forget_temporary(dir, temporary);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    use super::*;

    fn check(path: &Path) -> Result<Output> {
        Checker::default().check("-o", path)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn write_text(output: &Output, text: &str) -> Result<()> {
        output.write(|out| Ok(out.write_all(text.as_bytes())?))
    }

    #[test]
    fn a_new_file_is_private_and_replaces_the_old_one_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.prof");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        // SAFETY: umask(2) has no preconditions; a permissive umask must not widen the mode.
        let old_umask = unsafe { libc::umask(0) };
        let result = write_text(&check(&path).unwrap(), "new");
        // SAFETY: as above, restoring the umask.
        unsafe { libc::umask(old_umask) };
        result.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(names(dir.path()), ["run.prof"]);
    }

    #[test]
    fn directories_devices_fifos_and_missing_directories_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let error = |path: &Path| format!("{:#}", check(path).unwrap_err());
        let missing = dir.path().join("no-such-dir/run.prof");
        assert_eq!(
            error(&missing),
            format!(
                "-o {}: the directory {} does not exist",
                missing.display(),
                dir.path().join("no-such-dir").display()
            )
        );
        assert!(error(dir.path()).ends_with("is a directory: give a file name"));
        let device = error(Path::new("/dev/full"));
        assert!(
            device.starts_with("-o /dev/full: is a device: the profiler writes only regular files")
                && device.contains("`-o - > /dev/full`"),
            "{device}"
        );
        let fifo = dir.path().join("fifo");
        let c_fifo = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
        assert!(error(&fifo).contains("is a FIFO"));
        // Nothing was created or changed.
        assert_eq!(names(dir.path()), ["fifo"]);
    }

    #[test]
    fn links_are_followed_where_the_kernel_would_follow_them() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.prof");
        let link = dir.path().join("link.prof");
        symlink("real.prof", &link).unwrap();
        write_text(&check(&link).unwrap(), "through the link").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "through the link");

        // A sticky world-writable directory owned by someone else (as /tmp is root's), with a
        // link a third user planted: refused. A link of the directory's owner is followed.
        let sticky = dir.path().join("sticky");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let planted = sticky.join("planted.prof");
        symlink(&real, &planted).unwrap();
        let owner = |path: &Path, uid: u32| {
            let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            assert_eq!(
                unsafe { libc::lchown(c_path.as_ptr(), uid, uid) },
                0,
                "run as root"
            );
        };
        owner(&sticky, 4242);
        owner(&planted, 4343);
        let refused = format!("{:#}", check(&planted).unwrap_err());
        assert!(
            refused.contains("refusing to follow the symbolic link")
                && refused.contains("belongs to user 4343"),
            "{refused}"
        );
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "through the link");
        owner(&planted, 4242);
        write_text(&check(&planted).unwrap(), "owner's link").unwrap();
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "owner's link");
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.prof");
        std::fs::write(&path, "old").unwrap();
        let output = check(&path).unwrap();
        let error = output
            .write(|out| {
                out.write_all(b"half")?;
                Err(io::Error::from_raw_os_error(libc::ENOSPC).into())
            })
            .unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            format!(
                "-o {}: cannot write: No space left on device (os error 28)",
                path.display()
            )
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(names(dir.path()), ["run.prof"]);
        // A directory put in the way after the check: the rename fails, nothing is lost.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("keep"), "x").unwrap();
        let error = format!("{:#}", write_text(&output, "new").unwrap_err());
        assert!(
            error.contains("cannot rename the temporary file over it"),
            "{error}"
        );
        assert!(path.join("keep").exists());
        assert_eq!(names(dir.path()), ["run.prof"]);
    }

    #[test]
    fn a_reader_of_standard_output_that_went_away_is_not_a_failure() {
        let closed = || Err(io::Error::from(io::ErrorKind::BrokenPipe).into());
        assert!(Output::stdout("--json").write(|_| closed()).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let file = check(&dir.path().join("f")).unwrap();
        assert!(file.write(|_| closed()).is_err());
    }

    #[test]
    fn one_output_at_most_takes_standard_output() {
        let mut checker = Checker::default();
        assert!(checker.check("--json", Path::new("-")).unwrap().is_stdout());
        assert!(checker.stdout_taken());
        let error = checker.check("--raw", Path::new("-")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--raw -: --json already writes to standard output; give one of them a file name"
        );
    }
}
