//! What every record's `perf_event_header` says beyond its type and size: the `misc` bits that
//! tell who was running when it was made. Shared by the data records and the samples, which
//! both decode it.

/// The bits of perf_event_header.misc that hold the CPU mode.
const PERF_RECORD_MISC_CPUMODE_MASK: u16 = 7;

/// Who was running when the record was made (perf_event_header.misc & 7).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuMode {
    #[default]
    Unknown,
    Kernel,
    User,
    Hypervisor,
    GuestKernel,
    GuestUser,
}

impl CpuMode {
    pub(super) fn from_misc(misc: u16) -> Self {
        match misc & PERF_RECORD_MISC_CPUMODE_MASK {
            1 => Self::Kernel,
            2 => Self::User,
            3 => Self::Hypervisor,
            4 => Self::GuestKernel,
            5 => Self::GuestUser,
            _ => Self::Unknown,
        }
    }
}
