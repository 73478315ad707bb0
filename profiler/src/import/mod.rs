//! Importers for recordings made by other tools, turned into plain in-memory models that the
//! profile builder converts into our [`crate::profile::Profile`].

pub mod perf_data;
