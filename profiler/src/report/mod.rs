//! Reports: what a performance engineer reads.

pub mod json;
pub mod text;
