//! A closed window of a capture session, symbolized into its profile: what the agent exports
//! and what `profiler top` shows, made one way.

use std::path::Path;

use crate::{
    aggregate::dataspace::capture_data_objects,
    assemble::drained::assemble,
    export::offcpu::add_off_cpu_event,
    profile::{CpuIdentity, EventInfo, Profile},
    scope::kubernetes::KubernetesNames,
    session::{Capture, CaptureSession},
    symbolize::{
        kernel_addresses::{hide_kernel_addresses, kernel_addresses_shown},
        FrameAddresses, FrameTable, SymbolCache,
    },
};

/// What every window of one session is assembled with.
pub struct WindowAssembler {
    /// The session's target, as profiles name it.
    pub target: String,
    pub events: Vec<EventInfo>,
    pub cpu: Option<CpuIdentity>,
    /// Containers' Kubernetes names, remembered from window to window.
    pub kubernetes: KubernetesNames,
}

impl WindowAssembler {
    pub fn new(session: &CaptureSession, target: String, node_root: &Path) -> WindowAssembler {
        WindowAssembler {
            target,
            events: session.events().to_vec(),
            cpu: session.cpu(),
            kubernetes: KubernetesNames::new(node_root),
        }
    }

    /// Symbolizes a window into its profile.
    pub fn profile(&mut self, capture: Capture, symbols: &mut SymbolCache) -> Profile {
        let meta = capture.profile_meta(self.target.clone());
        let frames = FrameTable::with_cache(
            &capture.processes,
            Some(symbols),
            FrameAddresses::FileOffsets,
        );
        let mut profile = assemble(
            meta,
            self.events.clone(),
            capture.drained,
            &capture.accounting,
            frames,
            &mut self.kubernetes,
        );
        profile.hardware.cpu = self.cpu.clone();
        // What the sampled data addresses belong to, while the window's processes are at hand:
        // the exports name the variable, heap, stack or file of each data cache line.
        capture_data_objects(&mut profile, &capture.processes);
        // Off-CPU time is a profile type of its own: nanoseconds blocked.
        add_off_cpu_event(&mut profile);
        if !kernel_addresses_shown() {
            hide_kernel_addresses(&mut profile);
        }
        // With the window's share of the open files gone, what nobody else holds is closed.
        drop(capture.processes);
        symbols.forget_closed();
        profile
    }
}
