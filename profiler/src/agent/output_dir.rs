//! `--output-dir DIR`: one gzipped pprof file per window, named so that names sort in time order
//! (`profile-<window start, Unix ms>-<sequence>.pb.gz`), and the oldest of them removed once the
//! directory's profiles pass `--max-disk`. Files other than the agent's own are never touched.

use std::{
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    time::UNIX_EPOCH,
};

use anyhow::{Context, Result};

use super::log::{log, LogLevel};
use crate::{
    export::{
        pprof::write_pprof,
        sink::{Window, WindowSink},
        ExportError,
    },
    output::Checker,
};

const PREFIX: &str = "profile-";
const SUFFIX: &str = ".pb.gz";

pub struct OutputDirSink {
    dir: PathBuf,
    max_bytes: u64,
    /// `--output-dir DIR`, for logs and metrics.
    name: String,
}

impl OutputDirSink {
    /// Creates `dir` (and its parents, mode 0750: profiles name the machine's processes) when
    /// missing, and checks now that the profiler can create files in it.
    pub fn new(dir: &Path, max_bytes: u64) -> Result<OutputDirSink> {
        let option = || format!("--output-dir {}", dir.display());
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .with_context(|| format!("{}: cannot create the directory", option()))?;
        // The check's own errors name a file: said of the directory, which the user gave.
        Checker::default()
            .check("--output-dir", &dir.join(file_name(0, 0)))
            .map_err(|error| {
                let causes: Vec<String> = error.chain().skip(1).map(ToString::to_string).collect();
                anyhow::anyhow!("{}: {}", option(), causes.join(": "))
            })?;
        Ok(OutputDirSink {
            dir: dir.to_path_buf(),
            max_bytes,
            name: format!("--output-dir {}", dir.display()),
        })
    }

    /// Removes the oldest profiles until those left fit `max_bytes`; the newest is kept even
    /// when it alone is larger (said in the log).
    fn rotate(&self) -> Result<()> {
        let mut profiles: Vec<(String, u64)> = Vec::new();
        for entry in std::fs::read_dir(&self.dir)
            .with_context(|| format!("--output-dir {}: cannot list it", self.dir.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", self.dir.display()))?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            // Not followed: a link or directory with such a name is not one of ours.
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if is_profile_name(&name) && metadata.is_file() {
                profiles.push((name, metadata.len()));
            }
        }
        profiles.sort();
        let mut total: u64 = profiles.iter().map(|(_, bytes)| bytes).sum();
        let newest = profiles.pop();
        for (name, bytes) in profiles {
            if total <= self.max_bytes {
                break;
            }
            let path = self.dir.join(&name);
            std::fs::remove_file(&path)
                .with_context(|| format!("--max-disk: cannot remove {}", path.display()))?;
            log(
                LogLevel::Debug,
                format!("removed {} (--max-disk)", path.display()),
            );
            total -= bytes;
        }
        if let Some((name, _)) = newest.filter(|_| total > self.max_bytes) {
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
        let path = self.dir.join(file_name(start_ms, window.sequence));
        let written = Checker::default()
            .check("--output-dir", &path)
            .and_then(|output| output.write(|out| Ok(write_pprof(&window.profile, out)?)))
            .and_then(|()| self.rotate());
        written.map_err(|error| ExportError::Io(std::io::Error::other(format!("{error:#}"))))?;
        log(LogLevel::Debug, format!("wrote {}", path.display()));
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
    fn rotation_removes_the_oldest_profiles_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let sink = OutputDirSink::new(dir.path(), 250).unwrap();
        for sequence in 0..4 {
            std::fs::write(
                dir.path().join(file_name(1000 + sequence, sequence as u64)),
                [0; 100],
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), [0; 1000]).unwrap();
        sink.rotate().unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["notes.txt", &file_name(1002, 2), &file_name(1003, 3)]
        );
    }
}
