//! The path the symbolizer reads a module at. blazesym memory-maps the files it is given (and
//! the separate debug files their debug links name, opened by path, blocking): a mapped file
//! its owner truncates faults with SIGBUS, which kills the profiler, and a FIFO where a debug
//! link points blocks it for good. So a module only root can modify is read in place; any
//! other is copied with bounded reads into a sealed memfd (no one can shrink or write it, so
//! its mapping never faults), its debug links renamed away, and blazesym reads the copy.
//!
//! Only root modifies a file when root owns it and it is writable by no group or other user,
//! and so is every directory on its path (else another user could put files beside it, where
//! blazesym looks for its debug link). A file whose path no longer reaches it (deleted,
//! renamed, another mount namespace's) is copied.

use std::{
    collections::HashMap,
    ffi::CString,
    fs::{self, File},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::fs::{FileExt, MetadataExt},
    },
    path::PathBuf,
    sync::{Arc, Mutex, Weak},
};

use object::{
    read::elf::{FileHeader, SectionHeader},
    Endianness, FileKind, SectionIndex,
};

use super::{descriptor_path, FileWarning, ModuleImage};

/// Largest module copied: above any real program or library's file, so that a sparse file of
/// many gigabytes (costing its owner nothing) is refused rather than copied.
pub const MAX_COPY_BYTES: u64 = 256 << 20;

/// Most bytes all copies hold at once: how much of the profiler's memory other users' modules
/// can take.
pub const MAX_COPIES_BYTES: u64 = 1 << 30;

/// Bytes read from the module at once.
const CHUNK_BYTES: usize = 1 << 20;

/// Sections naming separate debug files: blazesym opens what they name (blocking, by path,
/// beside the module or under the debug directories), and in another user's module the names
/// are theirs.
const DEBUG_FILE_LINKS: [&[u8]; 3] = [b".gnu_debuglink", b".gnu_debugaltlink", b".debug_sup"];

/// Why a module another user can modify was not copied, and so not symbolized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refused {
    TooLarge,
    /// Over [`MAX_COPIES_BYTES`] with the copies held already.
    CopiesFull,
    /// Its size or change time moved while it was read: truncated or rewritten meanwhile.
    Changed,
    Unreadable,
}

impl Refused {
    /// The loss counter's name, as the report shows it.
    pub fn describe(self) -> &'static str {
        match self {
            Refused::TooLarge => "modules not symbolized: another user's file over 256 MiB",
            Refused::CopiesFull => {
                "modules not symbolized: copies of other users' files over 1 GiB in all"
            }
            Refused::Changed => {
                "modules not symbolized: another user's file changed while it was copied"
            }
            Refused::Unreadable => "modules not symbolized: another user's file unreadable",
        }
    }
}

/// Where the symbolizer reads a module, and whether the module's debug links were renamed
/// away (the debug files they name are not read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolPath {
    pub path: PathBuf,
    pub links_not_followed: bool,
}

/// The loss counter of modules whose debug links were not followed, as the report shows it.
pub const LINKS_NOT_FOLLOWED: &str =
    "debug links of other users' modules not followed (their own symbols read)";

/// What the symbolizer reads for one module file.
enum Source {
    InPlace,
    /// The sealed copy, and whether it had debug links.
    Copy(Arc<File>, bool),
    Refused(Refused),
}

/// The decision for each module file still open, by identity (device, inode).
struct Sources {
    by_file: HashMap<(u64, u64), (Weak<File>, Source)>,
    copied_bytes: u64,
}

static SOURCES: Mutex<Option<Sources>> = Mutex::new(None);

static REFUSED_WARNING: FileWarning = FileWarning::new(
    "more modules of other users are not symbolized: the sample accounting counts them",
);

/// The path blazesym reads the open module `file` at: its descriptor path when only root can
/// modify it, else its sealed copy's. A module is decided (and copied) once while `file` stays
/// open; its copy goes once it closed, at the next call.
pub fn symbol_path(file: &Arc<File>) -> Result<SymbolPath, Refused> {
    let metadata = file.metadata().map_err(|_| Refused::Unreadable)?;
    let identity = (metadata.dev(), metadata.ino());
    let mut guard = SOURCES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let sources = guard.get_or_insert_with(|| Sources {
        by_file: HashMap::new(),
        copied_bytes: 0,
    });
    sources.forget_closed();
    let known = sources
        .by_file
        .get(&identity)
        .filter(|(source, _)| std::ptr::eq(source.as_ptr(), Arc::as_ptr(file)));
    if known.is_none() {
        let source = if only_root_modifies(file, &metadata) {
            Source::InPlace
        } else {
            let room = MAX_COPIES_BYTES.saturating_sub(sources.copied_bytes);
            match sealed_copy(file, &metadata, room) {
                Ok((copy, links)) => {
                    sources.copied_bytes += metadata.len();
                    Source::Copy(Arc::new(copy), links)
                }
                Err(refused) => {
                    REFUSED_WARNING.warn(format_args!(
                        "{}: not symbolized: {}",
                        fs::read_link(descriptor_path(file))
                            .unwrap_or_default()
                            .display(),
                        refused
                            .describe()
                            .trim_start_matches("modules not symbolized: ")
                    ));
                    Source::Refused(refused)
                }
            }
        };
        sources.forget(identity);
        sources
            .by_file
            .insert(identity, (Arc::downgrade(file), source));
    }
    match &sources.by_file[&identity].1 {
        Source::InPlace => Ok(SymbolPath {
            path: descriptor_path(file),
            links_not_followed: false,
        }),
        Source::Copy(copy, links) => Ok(SymbolPath {
            path: descriptor_path(copy),
            links_not_followed: *links,
        }),
        Source::Refused(refused) => Err(*refused),
    }
}

impl Sources {
    fn forget_closed(&mut self) {
        let closed: Vec<(u64, u64)> = self
            .by_file
            .iter()
            .filter(|(_, (file, _))| file.strong_count() == 0)
            .map(|(identity, _)| *identity)
            .collect();
        for identity in closed {
            self.forget(identity);
        }
    }

    fn forget(&mut self, identity: (u64, u64)) {
        if let Some((_, Source::Copy(copy, _))) = self.by_file.remove(&identity) {
            let len = copy.metadata().map_or(0, |metadata| metadata.len());
            self.copied_bytes = self.copied_bytes.saturating_sub(len);
        }
    }
}

/// Whether root alone can change `file` or what lies beside it on its path (see the module's
/// documentation).
fn only_root_modifies(file: &File, metadata: &fs::Metadata) -> bool {
    let root_only = |metadata: &fs::Metadata| metadata.uid() == 0 && metadata.mode() & 0o022 == 0;
    if !root_only(metadata) {
        return false;
    }
    let Ok(path) = fs::read_link(descriptor_path(file)) else {
        return false;
    };
    // The path reaches this very file, through directories only root writes.
    let reached = fs::symlink_metadata(&path)
        .is_ok_and(|at_path| (at_path.dev(), at_path.ino()) == (metadata.dev(), metadata.ino()));
    reached
        && path
            .ancestors()
            .skip(1)
            .filter(|dir| !dir.as_os_str().is_empty())
            .all(|dir| fs::symlink_metadata(dir).is_ok_and(|dir| root_only(&dir)))
}

/// A copy of `file` in a sealed memfd, read with bounded `pread`s and refused when it changed
/// meanwhile, larger than [`MAX_COPY_BYTES`] or than `room`; its debug links renamed (with
/// whether it had any).
fn sealed_copy(file: &File, before: &fs::Metadata, room: u64) -> Result<(File, bool), Refused> {
    let len = before.len();
    if len > MAX_COPY_BYTES {
        return Err(Refused::TooLarge);
    }
    if len > room {
        return Err(Refused::CopiesFull);
    }
    let copy = memfd().map_err(|_| Refused::Unreadable)?;
    copy.set_len(len).map_err(|_| Refused::Unreadable)?;
    let mut chunk = vec![0; CHUNK_BYTES.min(len as usize)];
    let mut offset = 0;
    while offset < len {
        let want = chunk.len().min((len - offset) as usize);
        let read = file
            .read_at(&mut chunk[..want], offset)
            .map_err(|_| Refused::Unreadable)?;
        if read == 0 {
            return Err(Refused::Changed);
        }
        copy.write_all_at(&chunk[..read], offset)
            .map_err(|_| Refused::Unreadable)?;
        offset += read as u64;
    }
    // The change time, which its owner cannot set back (unlike the modification time).
    let after = file.metadata().map_err(|_| Refused::Unreadable)?;
    let changed =
        |metadata: &fs::Metadata| (metadata.len(), metadata.ctime(), metadata.ctime_nsec());
    if changed(&after) != changed(before) {
        return Err(Refused::Changed);
    }
    // Truncated or caught half rewritten before the copy began, the file passes the check
    // above with its new size: empty, or an ELF file whose section headers are not all in it.
    // It is not what the process mapped, and the symbolizer would name nothing from it.
    if len == 0 || !elf_headers_within(&copy).map_err(|_| Refused::Unreadable)? {
        return Err(Refused::Changed);
    }
    let links = rename_debug_links(&copy).map_err(|_| Refused::Unreadable)?;
    seal(&copy).map_err(|_| Refused::Unreadable)?;
    Ok((copy, links))
}

fn memfd() -> io::Result<File> {
    let name = CString::new("profiler-module").expect("no NUL");
    // SAFETY: a valid NUL-terminated name; the descriptor returned is ours alone.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Seals the copy's size and bytes: its mapping can then never fault.
fn seal(copy: &File) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `copy`, if it is ELF, holds its whole header and section header table. A file
/// that is not ELF is not judged here: the symbolizer refuses it.
fn elf_headers_within(copy: &File) -> io::Result<bool> {
    fn sections_within<Elf: FileHeader<Endian = Endianness>>(image: &ModuleImage) -> bool {
        Elf::parse(image)
            .and_then(|header| header.sections(header.endian()?, image))
            .is_ok()
    }
    let image = ModuleImage::new(copy.try_clone()?);
    Ok(match FileKind::parse(&image) {
        Ok(FileKind::Elf32) => sections_within::<object::elf::FileHeader32<Endianness>>(&image),
        Ok(FileKind::Elf64) => sections_within::<object::elf::FileHeader64<Endianness>>(&image),
        Ok(_) => true,
        // Too short to tell its kind: an ELF file cut short, or no module at all.
        Err(_) => !image_starts_with_elf_magic(copy)?,
    })
}

/// Whether the file begins with ELF's magic bytes.
fn image_starts_with_elf_magic(file: &File) -> io::Result<bool> {
    let mut magic = [0u8; 4];
    let read = file.read_at(&mut magic, 0)?;
    Ok(magic[..read] == object::elf::ELFMAG[..read])
}

/// Renames the sections in [`DEBUG_FILE_LINKS`] in `copy` (`.gnu_debuglink` becomes
/// `Xgnu_debuglink`), so that the symbolizer reads the module's own symbols and DWARF only.
/// A file that is not ELF is left as it is: the symbolizer refuses it. Whether it had any.
fn rename_debug_links(copy: &File) -> io::Result<bool> {
    let image = ModuleImage::new(copy.try_clone()?);
    let names = match FileKind::parse(&image) {
        Ok(FileKind::Elf32) => link_names::<object::elf::FileHeader32<Endianness>>(&image),
        Ok(FileKind::Elf64) => link_names::<object::elf::FileHeader64<Endianness>>(&image),
        _ => None,
    };
    let names = names.unwrap_or_default();
    for &at in &names {
        copy.write_all_at(b"X", at)?;
    }
    Ok(!names.is_empty())
}

/// The file offsets of the names of the debug-link sections of an ELF file.
fn link_names<Elf: FileHeader<Endian = Endianness>>(image: &ModuleImage) -> Option<Vec<u64>> {
    let header = Elf::parse(image).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, image).ok()?;
    let names = sections
        .section(SectionIndex(header.shstrndx(endian, image).ok()? as usize))
        .ok()?;
    let names_at: u64 = names.sh_offset(endian).into();
    Some(
        sections
            .iter()
            .filter(|section| {
                sections
                    .section_name(endian, section)
                    .is_ok_and(|name| DEBUG_FILE_LINKS.contains(&name))
            })
            .map(|section| names_at + u64::from(section.sh_name(endian)))
            .collect(),
    )
}

#[cfg(test)]
fn is_sealed(file: &File) -> bool {
    // SAFETY: fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals & libc::F_SEAL_SHRINK != 0 && seals & libc::F_SEAL_WRITE != 0
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A module another user could modify (in a directory anyone writes) is read from a
    /// sealed copy holding its bytes, with its debug link renamed; one file, one copy.
    #[test]
    fn modules_others_can_modify_are_copied_sealed_once() {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let module = dir.path().join("libmodule.so");
        let exe = std::env::current_exe().unwrap();
        // A module with a debug link: objcopy adds one to a copy of this test binary.
        let linked = std::process::Command::new("objcopy")
            .arg("--add-gnu-debuglink=/dev/null")
            .arg(&exe)
            .arg(&module)
            .status()
            .is_ok_and(|status| status.success());
        if !linked {
            fs::copy(&exe, &module).unwrap();
        }
        let file = Arc::new(File::open(&module).unwrap());
        let copied = symbol_path(&file).unwrap();
        assert_eq!(copied.links_not_followed, linked);
        let path = copied.path;
        assert_ne!(path, descriptor_path(&file));
        assert_eq!(symbol_path(&file).unwrap().path, path, "copied once");
        let copy = File::open(&path).unwrap();
        assert!(is_sealed(&copy));
        let bytes = fs::read(&path).unwrap();
        let original = fs::read(&module).unwrap();
        assert_eq!(bytes.len(), original.len());
        let has = |bytes: &[u8], name: &[u8]| bytes.windows(name.len()).any(|w| w == name);
        assert!(!has(&bytes, b".gnu_debuglink\0"));
        if linked {
            assert!(has(&original, b".gnu_debuglink\0"));
            assert!(has(&bytes, b"Xgnu_debuglink\0"));
        }
        // Truncating the module leaves the copy whole.
        fs::OpenOptions::new()
            .write(true)
            .open(&module)
            .unwrap()
            .set_len(0)
            .unwrap();
        assert_eq!(fs::read(&path).unwrap().len(), original.len());
    }

    #[test]
    fn modules_of_root_in_root_directories_are_read_in_place() {
        let file = Arc::new(File::open("/bin/sh").unwrap());
        let metadata = file.metadata().unwrap();
        if metadata.uid() == 0 && metadata.mode() & 0o022 == 0 {
            assert_eq!(symbol_path(&file).unwrap().path, descriptor_path(&file));
        }
    }

    /// A module truncated, or caught half rewritten, before its copy began (its size and change
    /// time then hold still while it is read) is refused as changed: an empty file, or an ELF
    /// file whose section headers are not all in it. A file that is not ELF is left to the
    /// symbolizer.
    #[test]
    fn a_module_cut_short_before_its_copy_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let exe = fs::read(std::env::current_exe().unwrap()).unwrap();
        for (name, bytes, refused) in [
            ("empty", &[][..], true),
            ("magic", &exe[..2], true),
            ("half", &exe[..exe.len() / 2], true),
            ("whole", &exe[..], false),
            ("text", &b"not a module"[..], false),
        ] {
            let path = dir.path().join(name);
            fs::write(&path, bytes).unwrap();
            let file = File::open(&path).unwrap();
            let before = file.metadata().unwrap();
            let copied = sealed_copy(&file, &before, MAX_COPIES_BYTES);
            assert_eq!(copied.err() == Some(Refused::Changed), refused, "{name}");
        }
    }

    /// A file truncated between the size read and its bytes is refused as changed, never
    /// copied short.
    #[test]
    fn a_file_shrunk_while_copied_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shrinking");
        fs::write(&path, vec![1u8; 3 * CHUNK_BYTES]).unwrap();
        let file = File::open(&path).unwrap();
        let before = file.metadata().unwrap();
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(CHUNK_BYTES as u64)
            .unwrap();
        assert_eq!(
            sealed_copy(&file, &before, MAX_COPIES_BYTES).unwrap_err(),
            Refused::Changed
        );
        let sparse = dir.path().join("sparse");
        File::create(&sparse)
            .unwrap()
            .set_len(MAX_COPY_BYTES + 1)
            .unwrap();
        let file = File::open(&sparse).unwrap();
        let metadata = file.metadata().unwrap();
        assert_eq!(
            sealed_copy(&file, &metadata, MAX_COPIES_BYTES).unwrap_err(),
            Refused::TooLarge
        );
        assert_eq!(
            sealed_copy(
                &File::open(&path).unwrap(),
                &fs::metadata(&path).unwrap(),
                10
            )
            .unwrap_err(),
            Refused::CopiesFull
        );
    }

    #[test]
    fn only_files_root_alone_writes_are_read_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = &dir.path().join("module");
        fs::write(path, b"\x7fELF").unwrap();
        let file = File::open(path).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!only_root_modifies(&file, &file.metadata().unwrap()));
    }
}
