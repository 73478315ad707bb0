//! CPython in a process, told by the file that holds the interpreter: `libpython3.X.so...`
//! (a shared interpreter, as pyenv and most distributions other than Debian build it) or the
//! program `python3.X` itself (Debian's, with the interpreter built in).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use super::Mapping;

/// What naming a Python code object's frames needs, read from its process's memory.
#[derive(Clone, Debug)]
pub struct PythonCode {
    /// The interpreter's minor version: the format of `line_table`.
    pub minor: u32,
    pub name: String,
    pub file: String,
    pub first_line: i64,
    pub line_table: Vec<u8>,
}

/// Most code objects remembered, all processes together: a process that makes code objects
/// without end (`exec` in a loop) cannot grow the profiler; past it, code is read anew.
const MAX_CODE_OBJECTS: usize = 1 << 20;

/// The code objects read so far, by process and address (`None`: it could not be read), kept
/// while their process is in the table: a frame drained after its process exited is named from
/// its code object when any frame of it was named before.
#[derive(Debug, Default)]
pub struct PythonCodeCache(Mutex<CodeObjects>);

/// Code objects by process and address.
type CodeObjects = HashMap<(u32, u64), Option<Arc<PythonCode>>>;

impl PythonCodeCache {
    /// The code object at `address` of process `pid`, read by `read` the first time.
    pub fn get_or_read(
        &self,
        pid: u32,
        address: u64,
        read: impl FnOnce() -> Option<PythonCode>,
    ) -> Option<Arc<PythonCode>> {
        let mut cache = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(known) = cache.get(&(pid, address)) {
            return known.clone();
        }
        let code = read().map(Arc::new);
        if cache.len() < MAX_CODE_OBJECTS {
            cache.insert((pid, address), code.clone());
        }
        code
    }

    /// A copy holding the code objects of the processes `kept` keeps (a window's table).
    pub fn of(&self, kept: impl Fn(u32) -> bool) -> PythonCodeCache {
        let cache = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let copy = cache
            .iter()
            .filter(|((pid, _), _)| kept(*pid))
            .map(|(key, code)| (*key, code.clone()))
            .collect();
        PythonCodeCache(Mutex::new(copy))
    }

    /// Forgets the code objects of process `pid`.
    pub fn forget(&self, pid: u32) {
        let mut cache = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.retain(|(owner, _), _| *owner != pid);
    }
}

/// The CPython minor version (`3.X`) a file named `path` holds, by its name; the walker knows
/// 3.10 to 3.13 (`profiler_common::python::PythonOffsets`). Debug (`3.Xd`) and free-threaded
/// (`3.Xt`) builds lay their objects out otherwise: none.
pub fn python_minor(path: &str) -> Option<u32> {
    let name = path.rsplit('/').next()?;
    if let Some(version) = name.strip_prefix("libpython3.") {
        let (minor, rest) = minor_and_rest(version)?;
        return rest.starts_with(".so").then_some(minor);
    }
    let (minor, rest) = minor_and_rest(name.strip_prefix("python3.")?)?;
    rest.is_empty().then_some(minor)
}

/// The number a version string starts with, and what follows it.
fn minor_and_rest(version: &str) -> Option<(u32, &str)> {
    let digits = version
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(version.len());
    Some((version[..digits].parse().ok()?, &version[digits..]))
}

/// The executable mappings of `mappings` whose files are named as CPython's, with the version:
/// the interpreter is the one that holds `_PyRuntime` (pyenv's `python3.X` is a launcher that
/// maps `libpython3.X.so`).
pub fn interpreter_mappings<'m>(
    mappings: impl IntoIterator<Item = &'m Mapping>,
) -> impl Iterator<Item = (&'m Mapping, u32)> {
    mappings
        .into_iter()
        .filter(|mapping| mapping.executable && mapping.is_file())
        .filter_map(|mapping| Some((mapping, python_minor(&mapping.path)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreters_are_told_by_their_file_names() {
        assert_eq!(
            python_minor("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"),
            Some(12)
        );
        assert_eq!(python_minor("/usr/bin/python3.11"), Some(11));
        assert_eq!(python_minor("/usr/lib/libpython3.13t.so.1.0"), None);
        assert_eq!(python_minor("/usr/lib/libpython3.10d.so.1.0"), None);
        assert_eq!(python_minor("/usr/bin/python3"), None);
        assert_eq!(python_minor("/usr/bin/python3.11-config"), None);
        assert_eq!(python_minor("/usr/lib/libpython3.so"), None);
        assert_eq!(python_minor("/opt/not-python3.12/bin/xz"), None);
    }
}
