//! Importers for recordings made by other tools: [`crate::perf_data`] reads perf.data files into
//! a plain model, [`convert`] turns that model into our [`crate::profile::Profile`]; [`pprof`]
//! reads pprof profiles (the agent's windows among them).

pub mod convert;
pub mod pprof;

use std::io::{self, Read};
use std::path::Path;

use anyhow::Context;

use crate::perf_data;
use crate::profile::Profile;

/// The first bytes of a perf.data file (little-endian `PERFILE2`, big-endian, or version 1), so
/// `report -i` can tell it from a profile file and let the parser say what it does not support.
const PERF_DATA_MAGICS: [&[u8; 8]; 3] = [b"PERFILE2", b"2ELIFREP", b"PERFFILE"];

/// What a file given to `report -i` is, by its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    PerfData,
    /// A gzipped pprof profile: the agent's windows, `--pprof` exports, other tools'.
    Pprof,
    /// Anything else: read as a profile `record` wrote, whose reader says what is wrong.
    Profile,
}

/// Which kind of recording the file at `path` is.
pub fn input_kind(path: &Path) -> io::Result<InputKind> {
    let mut magic = [0u8; 8];
    // Never blocks on a FIFO: reading it would wait for a writer.
    let file = crate::input::open_regular(path, crate::input::FinalLink::Follow)?;
    let read = file.take(8).read(&mut magic)?;
    Ok(if PERF_DATA_MAGICS.contains(&&magic) {
        InputKind::PerfData
    } else if pprof::is_gzip(&magic[..read]) {
        InputKind::Pprof
    } else {
        InputKind::Profile
    })
}

/// Reads a perf.data file and converts it into a profile.
pub fn profile_from_perf_data_file(path: &Path) -> anyhow::Result<Profile> {
    // The file as the user named it: perf.data files are rarely called perf.data.
    let data = perf_data::read_perf_data(path)
        .with_context(|| format!("reading the perf.data file {}", path.display()))?;
    convert::profile_from_perf_data(&data).with_context(|| format!("importing {}", path.display()))
}
