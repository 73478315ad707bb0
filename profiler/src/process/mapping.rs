//! A process's memory mappings, as /proc/PID/maps lists them and the side-band reports them.

use std::sync::Arc;

/// A file by device and inode: the same library mapped by many processes is opened once.
pub type FileIdentity = (u64, u64);

/// One memory mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// File path, or a kernel label (`[heap]`, `[stack]`, `[vdso]`), or empty (anonymous).
    /// Shared: a fork copies its parent's mappings, and under churn that copy was most of the
    /// side-band's allocations.
    pub path: Arc<str>,
    pub executable: bool,
    pub build_id: Option<Arc<[u8]>>,
    /// The mapped file as opened while the process lived (see [`super::MappedFiles`]).
    pub file: Option<FileIdentity>,
}

impl Mapping {
    pub fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }

    /// Whether a file backs the mapping. The kernel names anonymous executable memory (JIT
    /// code) `//anon`, which is no file.
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/') && !self.path.starts_with("//")
    }
}

/// Parses one line of /proc/PID/maps.
pub fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let _device = fields.next()?;
    let _inode = fields.next()?;
    let path = fields.collect::<Vec<_>>().join(" ");
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        path: path.into(),
        build_id: None,
        file: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_maps_lines() {
        let line = "7f1c2a400000-7f1c2a428000 r-xp 00028000 fe:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6";
        let mapping = parse_maps_line(line).unwrap();
        assert_eq!(mapping.start, 0x7f1c2a400000);
        assert_eq!(mapping.end, 0x7f1c2a428000);
        assert_eq!(mapping.file_offset, 0x28000);
        assert!(mapping.executable);
        assert_eq!(&*mapping.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        let anon = parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0 [stack]").unwrap();
        assert!(!anon.executable && !anon.is_file());
        assert_eq!(&*anon.path, "[stack]");
        // The side-band's name for anonymous executable memory, where JIT code lives.
        let jit = parse_maps_line("7f00-8000 r-xp 00000000 00:00 0 //anon").unwrap();
        assert!(jit.executable && !jit.is_file());
        assert!(parse_maps_line("garbage").is_none());
    }
}
