//! Reports: what a performance engineer reads.

pub mod text;
