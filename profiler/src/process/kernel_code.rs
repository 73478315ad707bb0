//! Kernel code that comes and goes while the kernel runs: BPF programs' JIT images and
//! trampolines. /proc/kallsyms lists them without their sizes and only while they live, so a
//! program loaded after it was read, or unloaded before, was named after whatever function it
//! listed below the address. The side-band's PERF_RECORD_KSYMBOL records give each one's extent
//! as it is loaded and unloaded (system-wide; a task's side-band sees what that task loads).

use std::{collections::BTreeMap, sync::Arc};

/// The kernel code loaded since the side-band started, by start address.
#[derive(Clone, Debug, Default)]
pub struct KernelCode {
    by_start: BTreeMap<u64, LoadedCode>,
}

#[derive(Clone, Debug)]
struct LoadedCode {
    end: u64,
    name: Arc<str>,
    /// Unloaded since: kept until the window it may have been sampled in closes.
    unloaded: bool,
}

impl KernelCode {
    /// `name` was loaded at `start..start + len`. Code loaded over an unloaded one's addresses
    /// replaces it: samples drained later name the newer.
    pub fn load(&mut self, start: u64, len: u32, name: Arc<str>) {
        let end = start.saturating_add(u64::from(len));
        let overlapping: Vec<u64> = self
            .by_start
            .range(..end)
            .rev()
            .take_while(|(_, code)| code.end > start)
            .map(|(start, _)| *start)
            .collect();
        for old in overlapping {
            self.by_start.remove(&old);
        }
        self.by_start.insert(
            start,
            LoadedCode {
                end,
                name,
                unloaded: false,
            },
        );
    }

    /// The code at `start` was unloaded.
    pub fn unload(&mut self, start: u64) {
        if let Some(code) = self.by_start.get_mut(&start) {
            code.unloaded = true;
        }
    }

    /// The code that holds `address`: its name and start.
    pub fn lookup(&self, address: u64) -> Option<(&str, u64)> {
        let (start, code) = self.by_start.range(..=address).next_back()?;
        (address < code.end).then_some((&*code.name, *start))
    }

    /// Forgets the code unloaded: called as a window closes, after its copy was taken.
    pub fn forget_unloaded(&mut self) {
        self.by_start.retain(|_, code| !code.unloaded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_named_within_its_extent_until_its_window_closes_after_it_unloads() {
        let mut code = KernelCode::default();
        code.load(0x1000, 0x100, "bpf_prog_a".into());
        code.load(0x2000, 0x80, "bpf_trampoline_b".into());
        assert_eq!(code.lookup(0x1000), Some(("bpf_prog_a", 0x1000)));
        assert_eq!(code.lookup(0x10ff), Some(("bpf_prog_a", 0x1000)));
        assert_eq!(code.lookup(0x1100), None, "past its end: not this code");
        assert_eq!(code.lookup(0xfff), None);
        assert_eq!(code.lookup(0x2010), Some(("bpf_trampoline_b", 0x2000)));
        // Unloaded: still named until the window closes.
        code.unload(0x1000);
        assert_eq!(code.lookup(0x1010), Some(("bpf_prog_a", 0x1000)));
        let window = code.clone();
        code.forget_unloaded();
        assert_eq!(window.lookup(0x1010), Some(("bpf_prog_a", 0x1000)));
        assert_eq!(code.lookup(0x1010), None);
        assert_eq!(code.lookup(0x2010), Some(("bpf_trampoline_b", 0x2000)));
        // New code over an unloaded one's addresses replaces it.
        code.unload(0x2000);
        code.load(0x1f80, 0x100, "bpf_prog_c".into());
        assert_eq!(code.lookup(0x2010), Some(("bpf_prog_c", 0x1f80)));
        assert_eq!(code.lookup(0x2070), Some(("bpf_prog_c", 0x1f80)));
    }
}
