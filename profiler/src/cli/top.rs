//! `profiler top`'s arguments, and their resolution into its options.

use anyhow::Result;

use super::{
    options::{capture_options, system_wide_sampling},
    SamplingArgs,
};
use crate::{
    session::CaptureOptions,
    top::{check_terminal, TopOptions},
};

/// Samples per second per CPU when no event or rate is given: a thousand a second, perf top's
/// order, at a cost a busy host barely sees.
const DEFAULT_FREQUENCY: u64 = 999;

/// `profiler top` arguments: what to sample and where, as `record` takes them; the whole
/// system unless scoped.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

impl TopArgs {
    pub fn resolve(mut self) -> Result<TopOptions> {
        check_terminal("profiler top")?;
        let (target, title) = system_wide_sampling(&mut self.sampling, "top", DEFAULT_FREQUENCY)?;
        let capture = CaptureOptions {
            // Its views are functions, processes and containers.
            per_instruction: false,
            ..capture_options(&self.sampling, target)?
        };
        Ok(TopOptions {
            capture,
            target: title,
            node_root: self.sampling.node_root,
        })
    }
}
