//! `--output-dir DIR`: one gzipped pprof file per window, named so that names sort in time order
//! (`profile-<window start, Unix ms>-<sequence>.pb.gz`), and the oldest of them removed once the
//! profiles the agent wrote pass `--max-disk`.
//!
//! The directory is checked like the spool (see [`PrivateDir`]) and created 0750 if absent. Only
//! files the agent wrote are ever removed: each is recorded when written, by name and identity
//! (device and inode) with the size it was written at, in an index kept in the directory
//! ([`INDEX`]), so that the next run knows them too. A file with a profile's name that the agent
//! did not write is never removed, and its size never counts.

use std::{collections::BTreeMap, io::Write, path::Path, time::UNIX_EPOCH};

use anyhow::Result;

use super::log::{log, LogLevel};
use crate::{
    export::{
        pprof::write_pprof,
        sink::{Window, WindowSink},
        ExportError,
    },
    output::{DirFile, OutputWriter, PrivateDir},
};

const PREFIX: &str = "profile-";
const SUFFIX: &str = ".pb.gz";
/// The profiles the agent wrote, one per line: `NAME DEVICE INODE BYTES`.
const INDEX: &str = ".profiler-agent-index";
/// The index is read back bounded, as everything the agent reads from disk: this is about a
/// million profiles' lines, far more than a directory holds under `--max-disk`.
const MAX_INDEX_BYTES: u64 = 64 << 20;
const OPTION: &str = "--output-dir";

pub struct OutputDirSink {
    dir: PrivateDir,
    max_bytes: u64,
    /// The profiles this agent wrote, in this run or earlier ones, oldest first.
    written: BTreeMap<String, DirFile>,
    /// `--output-dir DIR`, for logs and metrics.
    name: String,
}

impl OutputDirSink {
    /// Opens `dir` (created 0750 if absent), checks it, and takes over the profiles that
    /// earlier runs wrote and are still there, unchanged.
    pub fn new(dir: &Path, max_bytes: u64) -> Result<OutputDirSink> {
        let name = format!("{OPTION} {}", dir.display());
        let dir = PrivateDir::open(dir, 0o750).map_err(|e| e.context(name.clone()))?;
        let index = match dir.read(INDEX, MAX_INDEX_BYTES) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                log(
                    LogLevel::Warn,
                    format!("{name}: the index of earlier profiles is unreadable ({e}): they are left alone"),
                );
                String::new()
            }
        };
        let written = index
            .lines()
            .filter_map(parse_index_line)
            .filter(|(name, recorded)| dir.file(name).is_some_and(|now| same_file(now, *recorded)))
            .collect();
        Ok(OutputDirSink {
            dir,
            max_bytes,
            written,
            name,
        })
    }

    /// Writes the profile `name` with `write`, then records it and removes the oldest.
    fn write_profile(
        &mut self,
        name: &str,
        write: impl FnOnce(&mut OutputWriter) -> Result<()>,
    ) -> Result<()> {
        self.dir.output(OPTION, name)?.write(write)?;
        // In a directory no other user can write: the file just renamed into place.
        if let Some(file) = self.dir.file(name) {
            self.written.insert(name.to_string(), file);
        }
        self.rotate()?;
        self.save_index()
    }

    /// Removes the oldest profiles this agent wrote until those left fit `max_bytes`; the
    /// newest is kept even when it alone is larger (said in the log).
    fn rotate(&mut self) -> Result<()> {
        let mut total: u64 = self.written.values().map(|file| file.bytes).sum();
        while total > self.max_bytes && self.written.len() > 1 {
            let Some((name, recorded)) = self.written.pop_first() else {
                break;
            };
            total -= recorded.bytes;
            // Gone or replaced since: not ours to remove any more.
            if !self
                .dir
                .file(&name)
                .is_some_and(|now| same_file(now, recorded))
            {
                continue;
            }
            let path = self.dir.path().join(&name);
            self.dir.remove(&name).map_err(|e| {
                anyhow::anyhow!("--max-disk: cannot remove {} ({e})", path.display())
            })?;
            log(
                LogLevel::Debug,
                format!("removed {} (--max-disk)", path.display()),
            );
        }
        if let Some(name) = self
            .written
            .keys()
            .next()
            .filter(|_| total > self.max_bytes)
        {
            log(
                LogLevel::Warn,
                format!(
                    "{name} alone is larger than --max-disk ({} bytes): kept",
                    self.max_bytes
                ),
            );
        }
        Ok(())
    }

    fn save_index(&self) -> Result<()> {
        self.dir.output(OPTION, INDEX)?.write(|out| {
            for (name, file) in &self.written {
                writeln!(out, "{name} {} {} {}", file.device, file.inode, file.bytes)?;
            }
            Ok(())
        })
    }
}

/// The same file as recorded: its size is the one written, not what the file says now.
fn same_file(now: DirFile, recorded: DirFile) -> bool {
    (now.device, now.inode) == (recorded.device, recorded.inode)
}

fn parse_index_line(line: &str) -> Option<(String, DirFile)> {
    let mut fields = line.split(' ');
    let name = fields.next().filter(|name| is_profile_name(name))?;
    let mut number = || fields.next()?.parse::<u64>().ok();
    let file = DirFile {
        device: number()?,
        inode: number()?,
        bytes: number()?,
    };
    Some((name.to_string(), file))
}

/// The file of window `sequence` starting at `start_ms` (Unix milliseconds).
fn file_name(start_ms: u128, sequence: u64) -> String {
    format!("{PREFIX}{start_ms:013}-{sequence:06}{SUFFIX}")
}

fn is_profile_name(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(SUFFIX))
        .and_then(|stem| stem.split_once('-'))
        .is_some_and(|(start, sequence)| {
            [start, sequence]
                .iter()
                .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
        })
}

impl WindowSink for OutputDirSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn export(&mut self, window: &Window) -> Result<(), ExportError> {
        let start_ms = window
            .start
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let name = file_name(start_ms, window.sequence);
        self.write_profile(&name, |out| Ok(write_pprof(&window.profile, out)?))
            .map_err(|error| ExportError::Io(std::io::Error::other(format!("{error:#}"))))?;
        log(
            LogLevel::Debug,
            format!("wrote {}", self.dir.path().join(name).display()),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_in_time_order_and_only_ours_are_recognised() {
        let early = file_name(999_999_999_999, 7);
        let late = file_name(1_700_000_000_000, 8);
        assert!(early < late, "{early} {late}");
        assert!(is_profile_name(&early) && is_profile_name(&late));
        for other in [
            "profile-.pb.gz",
            "profile-12.pb.gz",
            "notes.txt",
            "profile-1-x.pb.gz",
        ] {
            assert!(!is_profile_name(other), "{other}");
        }
    }

    #[test]
    fn rotation_removes_the_oldest_profiles_the_agent_wrote_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = OutputDirSink::new(dir.path(), 250).unwrap();
        // Not written by the agent: a profile's name, a size that would empty the directory.
        let planted = file_name(999, 0);
        std::fs::write(dir.path().join(&planted), [0; 1000]).unwrap();
        std::fs::write(dir.path().join("notes.txt"), [0; 1000]).unwrap();
        for sequence in 0..3 {
            sink.write_profile(&file_name(1000 + sequence, sequence as u64), |out| {
                Ok(out.write_all(&[0; 100])?)
            })
            .unwrap();
        }
        let left = || {
            let mut left: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .collect();
            left.sort();
            left
        };
        let expected = [
            INDEX,
            "notes.txt",
            &planted,
            &file_name(1001, 1),
            &file_name(1002, 2),
        ];
        assert_eq!(left(), expected);

        // The next run knows what this one wrote: the oldest of it goes first, the planted
        // file never.
        drop(sink);
        let mut sink = OutputDirSink::new(dir.path(), 250).unwrap();
        sink.write_profile(&file_name(1003, 3), |out| Ok(out.write_all(&[0; 100])?))
            .unwrap();
        assert_eq!(
            left(),
            [
                INDEX,
                "notes.txt",
                &planted,
                &file_name(1002, 2),
                &file_name(1003, 3)
            ]
        );
    }

    #[test]
    fn a_directory_others_can_write_or_a_link_to_one_is_refused_and_a_missing_one_created() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let error = format!("{:#}", OutputDirSink::new(&shared, 1).err().unwrap());
        assert!(
            error.contains("other users may write in it (mode 1777)"),
            "{error}"
        );
        let link = dir.path().join("link");
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::os::unix::fs::symlink(&private, &link).unwrap();
        let error = format!("{:#}", OutputDirSink::new(&link, 1).err().unwrap());
        assert!(error.contains("it is a symbolic link"), "{error}");
        let created = dir.path().join("new/profiles");
        OutputDirSink::new(&created, 1).unwrap();
        // 0750, narrowed by the umask only.
        let mode = std::fs::metadata(&created).unwrap().permissions().mode();
        assert_eq!(mode & 0o727, 0o700, "{mode:o}");
    }
}
