//! Hardware sampling results in the profile (the [`HardwareSample`]s that the drain's
//! [`HardwareAccumulator`] collected): rendering them per function, instruction and data cache
//! line ([`render`]), and skid backtracking of non-precise data events ([`backtrack`]).
//!
//! [`HardwareSample`]: crate::profile::HardwareSample
//! [`HardwareAccumulator`]: crate::drain::hardware::HardwareAccumulator

pub mod backtrack;
pub mod render;

use crate::profile::Profile;

pub use backtrack::{backtrack_profile, BacktrackSummary};
pub use render::{hardware_json, render_hardware, HardwareView};

/// The report options of this module, for `record` and `report`.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct HardwareArgs {
    /// Attribute samples of non-precise data events (cache and TLB misses) to the memory access
    /// before the sampled instruction, walking back over the skid (x86-64 user code).
    #[arg(long)]
    pub backtrack: bool,
    /// Also show what precise samplers reported (perf mem data sources, IBS counters) by
    /// function, source line, instruction, instruction cache line or data cache line.
    #[arg(long, value_enum, value_name = "VIEW")]
    pub hardware: Option<HardwareView>,
}

impl HardwareArgs {
    /// Applies `--backtrack` to a profile about to be reported.
    pub fn prepare(&self, profile: &mut Profile) -> Option<BacktrackSummary> {
        self.backtrack.then(|| backtrack_profile(profile))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_as_flags() {
        use clap::Parser;

        #[derive(Parser)]
        struct Command {
            #[command(flatten)]
            hardware: HardwareArgs,
        }
        let parsed = Command::try_parse_from(["report", "--backtrack", "--hardware", "data-line"])
            .unwrap()
            .hardware;
        assert_eq!(
            parsed,
            HardwareArgs {
                backtrack: true,
                hardware: Some(HardwareView::DataLine)
            }
        );
        let none = Command::try_parse_from(["report"]).unwrap().hardware;
        assert_eq!(none, HardwareArgs::default());
        let err = Command::try_parse_from(["report", "--hardware", "cache-line"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("function, line, instruction, icache-line, data-line"),
            "{err}"
        );
        let mut profile = Profile::default();
        assert_eq!(none.prepare(&mut profile), None);
        assert_eq!(
            parsed.prepare(&mut profile),
            Some(BacktrackSummary::default())
        );
    }
}
