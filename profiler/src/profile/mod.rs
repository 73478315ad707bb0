//! The profile: what a recording produced, symbolized, independent of where it came from (a live
//! recording, a profile file, an imported perf.data). Every report and export reads this.

pub mod file;
mod model;
pub mod offcpu;
#[cfg(test)]
pub mod test_profile;

pub use model::*;
