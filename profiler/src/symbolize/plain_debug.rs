//! Uncompressed copies of separate debug files. Debian's `-dbg` and `-dbgsym` packages (and
//! debuginfod's files) compress their DWARF sections, and blazesym inflates every one of them,
//! wanted or not, and checks the debug link's CRC over the whole file, each time it opens the
//! module: symbolizing 20 addresses of glibc took 66-71 ms through libc6-dbg's file against 5-6
//! from an uncompressed copy, with the same functions, files and lines. The first recording
//! that reads a module's lines writes the copy, by build ID, into a private cache
//! ([`crate::disk_cache`]); later ones symbolize from it.

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use object::{endian::Endian, Endianness};

use crate::disk_cache::CacheDir;
use crate::input::{open_regular, FinalLink};

/// What the cache holds at most: the least recently used copies go beyond it.
const MAX_CACHE_BYTES: u64 = 1 << 30;
/// The largest copy made: larger debug files are read compressed, as before.
const MAX_COPY_BYTES: u64 = 256 << 20;

/// The uncompressed copy of the separate debug file `debug` of the module with `build_id`:
/// from the cache, or made now. `None` when there is no such file, it has nothing compressed,
/// or no copy can be had (no cache directory, a file this cannot rewrite): the module is read
/// as before.
pub fn uncompressed_copy(build_id: &str, debug: &Path) -> Option<PathBuf> {
    uncompressed_copy_in(&CacheDir::default_for("debug")?, build_id, debug)
}

fn uncompressed_copy_in(dir: &CacheDir, build_id: &str, debug: &Path) -> Option<PathBuf> {
    // Most modules have no separate debug file: no cache lookup for them.
    let debug = open_regular(debug, FinalLink::Follow).ok()?;
    let name = format!("{build_id}.debug");
    match dir.checked_path(&name) {
        Ok(Some(path)) => return Some(path),
        Ok(None) => {}
        Err(error) => {
            eprintln!(
                "note: debug-file cache {}: {error:#}; reading the compressed file",
                dir.path().join(&name).display()
            );
            return None;
        }
    }
    let copy = match read_bounded(debug).and_then(|bytes| decompressed(&bytes)) {
        Ok(Some(copy)) => copy,
        Ok(None) => return None,
        Err(error) => {
            eprintln!("note: debug file of build ID {build_id}: {error:#}; read as it is");
            return None;
        }
    };
    let written = dir
        .write("debug-file cache", &name, &copy)
        .and_then(|()| dir.prune("debug", MAX_CACHE_BYTES))
        .and_then(|()| dir.checked_path(&name));
    match written {
        Ok(path) => path,
        Err(error) => {
            eprintln!("note: debug-file cache: {error:#}");
            None
        }
    }
}

/// The whole debug file, refused above [`MAX_COPY_BYTES`].
fn read_bounded(file: File) -> Result<Vec<u8>> {
    let len = file.metadata()?.len();
    if len > MAX_COPY_BYTES {
        bail!("{len} bytes, more than a copy may take");
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

// ELF64 layout (the System V gABI): the file header's and section header's fields used here.
const EI_CLASS: usize = 4;
const EI_DATA: usize = 5;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ELFDATA2MSB: u8 = 2;
const FILE_HEADER_BYTES: usize = 64;
const SECTION_HEADER_BYTES: usize = 64;
const SHT_NOBITS: u32 = 8;
const SHF_COMPRESSED: u64 = 0x800;
const ELFCOMPRESS_ZLIB: u32 = 1;
const ELFCOMPRESS_ZSTD: u32 = 2;
/// Elf64_Chdr: type, reserved, size, alignment.
const COMPRESSION_HEADER_BYTES: usize = 24;

/// Reads and writes the file's fields in its byte order.
#[derive(Clone, Copy)]
struct Fields(Endianness);

impl Fields {
    fn u16(self, bytes: &[u8], at: usize) -> Result<u16> {
        Ok(self.0.read_u16(field(bytes, at)?))
    }

    fn u32(self, bytes: &[u8], at: usize) -> Result<u32> {
        Ok(self.0.read_u32(field(bytes, at)?))
    }

    fn u64(self, bytes: &[u8], at: usize) -> Result<u64> {
        Ok(self.0.read_u64(field(bytes, at)?))
    }

    fn set_u64(self, bytes: &mut [u8], at: usize, value: u64) {
        bytes[at..at + 8].copy_from_slice(&self.0.write_u64(value));
    }
}

fn field<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N]> {
    bytes
        .get(at..at + N)
        .and_then(|raw| raw.try_into().ok())
        .with_context(|| format!("truncated: a field at byte {at}"))
}

/// `bytes[offset..offset + len]`, refused when it lies outside.
fn range<'a>(bytes: &'a [u8], offset: u64, len: u64, what: &str) -> Result<&'a [u8]> {
    usize::try_from(offset)
        .ok()
        .zip(usize::try_from(len).ok())
        .and_then(|(offset, len)| bytes.get(offset..offset.checked_add(len)?))
        .with_context(|| format!("{what} ({len} bytes at {offset}) lies outside the file"))
}

/// The ELF64 file `elf` with its compressed sections stored uncompressed, laid out anew after
/// the file header and program headers; `None` when no section is compressed.
pub fn decompressed(elf: &[u8]) -> Result<Option<Vec<u8>>> {
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(EI_CLASS) != Some(&ELFCLASS64) {
        bail!("not an ELF64 file");
    }
    let fields = match elf.get(EI_DATA) {
        Some(&ELFDATA2LSB) => Fields(Endianness::Little),
        Some(&ELFDATA2MSB) => Fields(Endianness::Big),
        other => bail!("unknown ELF byte order {other:?}"),
    };
    let phoff = fields.u64(elf, 32)?;
    let shoff = fields.u64(elf, 40)?;
    let phentsize = u64::from(fields.u16(elf, 54)?);
    let phnum = u64::from(fields.u16(elf, 56)?);
    let shentsize = usize::from(fields.u16(elf, 58)?);
    let shnum = u64::from(fields.u16(elf, 60)?);
    if shnum == 0 || shentsize != SECTION_HEADER_BYTES {
        bail!("{shnum} section headers of {shentsize} bytes: not rewritten");
    }
    let program_headers = range(elf, phoff, phentsize * phnum, "the program headers")?;
    let section_headers = range(
        elf,
        shoff,
        shnum * SECTION_HEADER_BYTES as u64,
        "the section headers",
    )?;
    let mut headers = section_headers.to_vec();
    let compressed = |header: &[u8]| -> Result<bool> {
        Ok(fields.u64(header, 8)? & SHF_COMPRESSED != 0 && fields.u32(header, 4)? != SHT_NOBITS)
    };
    let mut any = false;
    for header in headers.chunks(SECTION_HEADER_BYTES) {
        any |= compressed(header)?;
    }
    if !any {
        return Ok(None);
    }
    let mut out = elf[..FILE_HEADER_BYTES].to_vec();
    out.extend_from_slice(program_headers);
    fields.set_u64(&mut out, 32, FILE_HEADER_BYTES as u64);
    let mut total = 0u64;
    // Section 0 is the null section: it has no contents.
    for header in headers.chunks_mut(SECTION_HEADER_BYTES).skip(1) {
        if fields.u32(&*header, 4)? == SHT_NOBITS {
            continue;
        }
        let contents = range(
            elf,
            fields.u64(&*header, 24)?,
            fields.u64(&*header, 32)?,
            "a section",
        )?;
        let (data, align) = if compressed(&*header)? {
            let (data, align) = inflate(fields, contents, MAX_COPY_BYTES - total)?;
            let flags = fields.u64(&*header, 8)?;
            fields.set_u64(header, 8, flags & !SHF_COMPRESSED);
            (std::borrow::Cow::Owned(data), align)
        } else {
            (
                std::borrow::Cow::Borrowed(contents),
                fields.u64(&*header, 48)?,
            )
        };
        total += data.len() as u64;
        if total > MAX_COPY_BYTES {
            bail!("more than {MAX_COPY_BYTES} bytes uncompressed");
        }
        let align = align.clamp(1, 4096) as usize;
        out.resize(out.len().next_multiple_of(align), 0);
        let at = out.len() as u64;
        fields.set_u64(header, 24, at);
        fields.set_u64(header, 32, data.len() as u64);
        fields.set_u64(header, 48, align as u64);
        out.extend_from_slice(&data);
    }
    out.resize(out.len().next_multiple_of(8), 0);
    let section_headers_at = out.len() as u64;
    fields.set_u64(&mut out, 40, section_headers_at);
    out.extend_from_slice(&headers);
    Ok(Some(out))
}

/// The contents of a compressed section (Elf64_Chdr, then the stream) and their alignment,
/// refused beyond `most` bytes or when the stream does not hold the size its header says.
fn inflate(fields: Fields, section: &[u8], most: u64) -> Result<(Vec<u8>, u64)> {
    let kind = fields.u32(section, 0)?;
    let size = fields.u64(section, 8)?;
    let align = fields.u64(section, 16)?;
    if size > most {
        bail!("a section of {size} bytes uncompressed, more than the copy may take");
    }
    let stream = &section[COMPRESSION_HEADER_BYTES.min(section.len())..];
    let mut data = Vec::with_capacity(size as usize);
    // One byte more than the header says: a stream that holds more is refused.
    let read = match kind {
        ELFCOMPRESS_ZLIB => flate2::read::ZlibDecoder::new(stream)
            .take(size + 1)
            .read_to_end(&mut data),
        ELFCOMPRESS_ZSTD => zstd::stream::read::Decoder::new(stream)?
            .take(size + 1)
            .read_to_end(&mut data),
        other => bail!("compression type {other}"),
    };
    read.context("inflating a section")?;
    if data.len() as u64 != size {
        bail!(
            "a section inflates to {} bytes where its header says {size}",
            data.len()
        );
    }
    Ok((data, align))
}

#[cfg(test)]
mod tests {
    use blazesym::symbolize::{
        source::{Elf, Source},
        Input, Symbolized, Symbolizer,
    };
    use object::{Object, ObjectSection, ObjectSegment};

    use super::*;

    /// The C library this test runs with, and its separate debug file (libc6-dbg, which the
    /// test set-up installs).
    fn libc_and_its_debug_file() -> (PathBuf, PathBuf) {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|line| line.split_ascii_whitespace().nth(5))
            .find(|path| path.contains("/libc.so"))
            .expect("the test links glibc");
        let bytes = std::fs::read(libc).unwrap();
        let module = object::File::parse(&*bytes).unwrap();
        let build_id = crate::symbolize::module_file::build_id(&module).unwrap();
        let debug = super::super::separate_debug::installed_path(&build_id).unwrap();
        assert!(
            debug.exists(),
            "{} is missing: install libc6-dbg (cargo xtask setup does)",
            debug.display()
        );
        (PathBuf::from(libc), debug)
    }

    /// An address as blazesym names it: function, offset into it, file, line, inlined ones.
    type Named = Option<(String, usize, Option<String>, Option<u32>, Vec<String>)>;

    fn names(source: Source<'_>, input: Input<&[u64]>) -> Vec<Named> {
        let symbolizer = Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .build();
        symbolizer
            .symbolize(&source, input)
            .unwrap()
            .into_iter()
            .map(|result| match result {
                Symbolized::Sym(sym) => Some((
                    sym.name.to_string(),
                    sym.offset,
                    sym.code_info
                        .as_ref()
                        .map(|info| info.file.to_string_lossy().into_owned()),
                    sym.code_info.as_ref().and_then(|info| info.line),
                    sym.inlined.iter().map(|f| f.name.to_string()).collect(),
                )),
                Symbolized::Unknown(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_copy_names_every_address_as_the_compressed_debug_file_does() {
        let (libc, debug) = libc_and_its_debug_file();
        let original = std::fs::read(&debug).unwrap();
        let copy = decompressed(&original)
            .unwrap()
            .expect("Debian compresses libc6-dbg's sections");
        let parsed = object::File::parse(&*copy).unwrap();
        assert!(parsed.section_by_name(".debug_info").is_some());
        for section in parsed.sections() {
            let range = section.compressed_file_range().unwrap();
            assert_eq!(
                range.format,
                object::CompressionFormat::None,
                "{:?} is still compressed",
                section.name()
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let copy_path = dir.path().join("libc.debug");
        std::fs::write(&copy_path, &copy).unwrap();

        let bytes = std::fs::read(&libc).unwrap();
        let module = object::File::parse(&*bytes).unwrap();
        let text = module
            .segments()
            .find(|segment| segment.flags() == object::SegmentFlags::Elf { p_flags: 5 })
            .expect("an executable segment");
        let (start, size) = text.file_range();
        let offsets: Vec<u64> = (start..start + size - 0x123)
            .step_by(0x1000)
            .map(|offset| offset + 0x123)
            .collect();
        let addresses: Vec<u64> = offsets
            .iter()
            .map(|&offset| {
                crate::symbolize::module_file::address_of_file_offset(&module, offset).unwrap()
            })
            .collect();
        let mut elf = Elf::new(&libc);
        elf.debug_syms = true;
        let through_compressed = names(Source::Elf(elf), Input::FileOffset(&offsets));
        let mut elf = Elf::new(&copy_path);
        elf.debug_syms = true;
        let through_copy = names(Source::Elf(elf), Input::VirtOffset(&addresses));
        assert_eq!(through_copy, through_compressed);
        let with_lines = through_copy
            .iter()
            .filter(|name| name.as_ref().is_some_and(|name| name.3.is_some()))
            .count();
        assert!(
            with_lines * 10 >= offsets.len() * 9,
            "{with_lines} of {} addresses have lines",
            offsets.len()
        );
    }

    #[test]
    fn copies_are_made_once_into_the_private_cache() {
        let (_, debug) = libc_and_its_debug_file();
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path().join("debug"));
        let copy = uncompressed_copy_in(&cache, "c0ffee", &debug).expect("a copy");
        assert_eq!(copy, cache.path().join("c0ffee.debug"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&copy).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let written = std::fs::metadata(&copy).unwrap().modified().unwrap();
        assert_eq!(
            uncompressed_copy_in(&cache, "c0ffee", &debug),
            Some(copy.clone())
        );
        assert!(std::fs::metadata(&copy).unwrap().modified().unwrap() >= written);
        // No debug file, or one with nothing compressed (the copy itself): no copy.
        assert_eq!(
            uncompressed_copy_in(&cache, "feed", Path::new("/nonexistent")),
            None
        );
        assert_eq!(uncompressed_copy_in(&cache, "feed", &copy), None);
        // A link planted in the cache is not followed.
        std::fs::remove_file(&copy).unwrap();
        std::os::unix::fs::symlink(&debug, &copy).unwrap();
        assert_eq!(uncompressed_copy_in(&cache, "c0ffee", &debug), None);
    }

    #[test]
    fn damaged_debug_files_are_refused_without_reading_past_them() {
        let (_, debug) = libc_and_its_debug_file();
        let valid = std::fs::read(&debug).unwrap();
        // Every cut is refused or copied, never read past.
        for len in (0..valid.len()).step_by(4099).chain(0..200) {
            let _ = decompressed(&valid[..len]);
        }
        assert!(decompressed(b"not an ELF file").is_err());
        // The first compressed section's header: its size field says more, or less.
        let parsed = object::File::parse(&*valid).unwrap();
        let range = parsed
            .sections()
            .map(|section| section.compressed_file_range().unwrap())
            .find(|range| range.format != object::CompressionFormat::None)
            .unwrap();
        let size_at = range.offset as usize - COMPRESSION_HEADER_BYTES + 8;
        let with_size = |size: u64| {
            let mut edited = valid.clone();
            edited[size_at..size_at + 8].copy_from_slice(&size.to_le_bytes());
            decompressed(&edited).unwrap_err().to_string()
        };
        let error = with_size(range.uncompressed_size - 1);
        assert!(error.contains("inflates to"), "{error}");
        let error = with_size(MAX_COPY_BYTES + 1);
        assert!(error.contains("more than the copy may take"), "{error}");
    }
}
