//! Where a module's separate debug file is: installed by the distribution under its build ID
//! (Debian's `-dbg` and `-dbgsym` packages), else, for a module with no debug information of
//! its own, from the debuginfod servers ([`super::debuginfod`]).

use std::path::PathBuf;

use object::{Object, ReadRef};

use crate::{
    input::{open_regular, FinalLink, ModuleImage},
    symbolize::{debuginfod, module_file::build_id},
};

/// Where separate debug files are installed, by build ID (`xx/yyyy….debug`).
const INSTALLED_BY_BUILD_ID: &str = "/usr/lib/debug/.build-id";

/// The separate debug file of `module`, with its build ID; `None` when it has none here and
/// none can be fetched.
pub fn find<'d, R: ReadRef<'d>>(module: &object::File<'d, R>) -> Option<(String, PathBuf)> {
    let build_id = build_id(module)?;
    let installed = installed_path(&build_id)?;
    if std::fs::metadata(&installed).is_ok_and(|metadata| metadata.is_file()) {
        return Some((build_id, installed));
    }
    // A module that has its own lines and inlined functions needs no one else's.
    if module.section_by_name(".debug_info").is_some() {
        return None;
    }
    let fetched = debuginfod::debug_file(&build_id)?;
    Some((build_id, fetched))
}

/// The separate debug file of `module`, open.
pub fn open<'d, R: ReadRef<'d>>(module: &object::File<'d, R>) -> Option<ModuleImage> {
    let (_, path) = find(module)?;
    Some(ModuleImage::new(
        open_regular(&path, FinalLink::Follow).ok()?,
    ))
}

/// Where the distribution installs the separate debug file of the module with `build_id`
/// (in hex).
pub fn installed_path(build_id: &str) -> Option<PathBuf> {
    if build_id.len() < 3 {
        return None;
    }
    Some(
        format!(
            "{INSTALLED_BY_BUILD_ID}/{}/{}.debug",
            &build_id[..2],
            &build_id[2..]
        )
        .into(),
    )
}
