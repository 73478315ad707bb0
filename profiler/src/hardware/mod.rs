//! Hardware sampling results in the profile: skid backtracking of non-precise data events
//! ([`backtrack`]), which moves their attributions to the memory access before the sampled
//! instruction. The report that renders hardware samples is `report::hardware`.

pub mod backtrack;

pub use backtrack::{backtrack_profile, BacktrackSummary};
