//! Importers for recordings made by other tools: [`crate::perf_data`] reads perf.data files into
//! a plain model, [`convert`] turns that model into our [`crate::profile::Profile`].

pub mod convert;

use std::io::{self, Read};
use std::path::Path;

use anyhow::Context;

use crate::perf_data;
use crate::profile::Profile;

/// The first bytes of a perf.data file (little-endian `PERFILE2`, big-endian, or version 1), so
/// `report -i` can tell it from a profile file and let the parser say what it does not support.
const PERF_DATA_MAGICS: [&[u8; 8]; 3] = [b"PERFILE2", b"2ELIFREP", b"PERFFILE"];

/// Whether the file at `path` starts like a perf.data file.
pub fn is_perf_data(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; 8];
    // Never blocks on a FIFO: reading it would wait for a writer.
    let mut file = crate::input::open_regular(path, crate::input::FinalLink::Follow)?;
    match file.read_exact(&mut magic) {
        Ok(()) => Ok(PERF_DATA_MAGICS.contains(&&magic)),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads a perf.data file and converts it into a profile.
pub fn profile_from_perf_data_file(path: &Path) -> anyhow::Result<Profile> {
    // The file as the user named it: perf.data files are rarely called perf.data.
    let data = perf_data::read_perf_data(path)
        .with_context(|| format!("reading the perf.data file {}", path.display()))?;
    convert::profile_from_perf_data(&data).with_context(|| format!("importing {}", path.display()))
}
