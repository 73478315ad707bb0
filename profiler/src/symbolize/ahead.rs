//! Symbolizing a recording while it records. At its end only the code its last seconds
//! sampled is left to read from module files and kallsyms: under process churn, symbolizing
//! every module there was most of the second a 30 s system-wide recording ran past its
//! duration (issue 16).
//!
//! The [`SymbolCache`] and the frames named so far ([`KnownFrames`]) live on a thread of their
//! own (blazesym's symbolizer cannot move threads), so a module that takes long to parse never
//! delays a drain: the capture thread sends it the code of each new stack, sorted through the
//! process table while the processes are at hand ([`SortedCode`]), and the profile is assembled
//! there at the end, from the frames named.

use std::{
    sync::mpsc::{channel, Sender},
    thread::JoinHandle,
};

use anyhow::{anyhow, Context, Result};

use super::{lookup_addresses, FrameAddresses, FrameTable, KnownFrames, SortedCode, SymbolCache};
use crate::{drain::Drained, fast_hash::HashSet, process::ProcessTable};

type Job = Box<dyn FnOnce(&mut SymbolCache, &mut KnownFrames) + Send>;

/// The symbolizing thread, and the stacks whose code it was sent.
pub struct ReadAhead {
    jobs: Sender<Job>,
    thread: JoinHandle<()>,
    kernel_stacks: HashSet<u64>,
    user_stacks: HashSet<(u32, u64)>,
}

impl ReadAhead {
    /// Starts the thread, with a cache that reads source lines from DWARF where
    /// `source_lines`.
    pub fn start(source_lines: bool) -> Result<ReadAhead> {
        let (jobs, received) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("symbolize".into())
            .spawn(move || {
                let mut cache = SymbolCache::new(source_lines);
                let mut known = KnownFrames::default();
                for job in received {
                    job(&mut cache, &mut known);
                }
            })
            .context("starting the symbolizing thread")?;
        Ok(ReadAhead {
            jobs,
            thread,
            kernel_stacks: HashSet::default(),
            user_stacks: HashSet::default(),
        })
    }

    /// Sends the code of the stacks `drained` holds that were not sent before, through the
    /// mappings of `processes` as they are now.
    pub fn send_new_stacks(&mut self, drained: &Drained, processes: &ProcessTable) {
        let frames = &drained.stack_cache;
        let mut addresses = Vec::new();
        for hash in drained.kernel_stacks() {
            if self.kernel_stacks.insert(hash) {
                addresses.extend(lookup_addresses(0, frames.frames(hash)));
            }
        }
        for (pid, hash) in drained.user_stacks() {
            if self.user_stacks.insert((pid, hash)) {
                addresses.extend(lookup_addresses(pid, frames.frames(hash)));
            }
        }
        let code = FrameTable::new(processes).sort(addresses);
        if !code.is_empty() {
            // Only fails when the thread is gone, which `finish` reports.
            let _ = self
                .jobs
                .send(Box::new(move |cache, known| name_ahead(cache, known, code)));
        }
    }

    /// Runs `job` with the cache and the frames once everything sent before is named, and
    /// returns what it returns; the thread ends.
    pub fn finish<R: Send + 'static>(
        self,
        job: impl FnOnce(&SymbolCache, KnownFrames) -> R + Send + 'static,
    ) -> Result<R> {
        let (result, received) = channel();
        let sent = self.jobs.send(Box::new(move |cache, known| {
            let _ = result.send(job(cache, std::mem::take(known)));
        }));
        drop(self.jobs);
        let outcome = sent.ok().and_then(|()| received.recv().ok());
        let joined = self.thread.join();
        match (outcome, joined) {
            (Some(outcome), _) => Ok(outcome),
            // As if it had panicked here, where the profile was assembled before.
            (None, Err(panic)) => std::panic::resume_unwind(panic),
            (None, Ok(())) => Err(anyhow!("the symbolizing thread ended early")),
        }
    }
}

/// Names code sorted on the capture thread, with run-time addresses as a recording's frames
/// carry, and forgets the modules whose files closed meanwhile, as the agent does after each
/// window: the processes that mapped them exited unsampled.
fn name_ahead(cache: &mut SymbolCache, known: &mut KnownFrames, mut code: SortedCode) {
    // Sorted on the capture thread, by a table that knew none of the frames named here.
    code.retain_unknown(|address| known.knows(address));
    let hidden = indicatif::ProgressBar::hidden();
    known.name(code, Some(cache), FrameAddresses::Runtime, &hidden);
    cache.forget_closed();
}
