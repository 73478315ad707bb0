//! Why a perf.data file could not be read, worded so the user knows what to do next.

use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug)]
pub enum PerfDataError {
    Io {
        path: PathBuf,
        source: io::Error,
    },
    /// The first 8 bytes are not a perf.data magic.
    NotPerfData {
        magic: [u8; 8],
    },
    /// A real perf.data variant this reader does not handle; the text says how to convert it.
    Unsupported(&'static str),
    /// A structure runs past the end of the file, its section or its record.
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        remaining: u64,
    },
    /// A structure is complete but its contents are impossible.
    Malformed {
        what: String,
        offset: u64,
        problem: String,
    },
}

impl PerfDataError {
    /// Says which structure (record, feature section) a field error happened in, so the
    /// message names both.
    pub(super) fn within(self, context: &str) -> Self {
        match self {
            Self::Truncated {
                what,
                offset,
                needed,
                remaining,
            } => Self::Truncated {
                what: format!("{what} of {context}"),
                offset,
                needed,
                remaining,
            },
            Self::Malformed {
                what,
                offset,
                problem,
            } => Self::Malformed {
                what: format!("{what} of {context}"),
                offset,
                problem,
            },
            other => other,
        }
    }
}

impl fmt::Display for PerfDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, source } => {
                write!(f, "cannot read perf.data file {}: {source}", path.display())
            }
            Self::NotPerfData { magic } => write!(
                f,
                "not a perf.data file (magic {:?}, expected \"PERFILE2\"): \
                 give a file written by `perf record -o FILE`",
                String::from_utf8_lossy(magic)
            ),
            Self::Unsupported(reason) => write!(f, "{reason}"),
            Self::Truncated {
                what,
                offset,
                needed,
                remaining,
            } => write!(
                f,
                "truncated {what} at offset 0x{offset:x} (needs {needed} bytes, \
                 {remaining} remain): the file is incomplete or corrupt; was `perf record` \
                 killed, or the copy cut short?"
            ),
            Self::Malformed {
                what,
                offset,
                problem,
            } => write!(
                f,
                "invalid {what} at offset 0x{offset:x}: {problem}; the file is corrupt"
            ),
        }
    }
}

impl std::error::Error for PerfDataError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
