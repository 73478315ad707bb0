//! The process model: what the agent knows of the processes it samples. Their memory mappings
//! ([`Mapping`], from /proc/PID/maps and the side-band), the files those map, opened while the
//! processes live ([`MappedFiles`]), the process table that the side-band's records keep
//! current ([`ProcessTable`]), the kernel code loaded meanwhile ([`KernelCode`]), and the vDSO
//! image every process maps ([`vdso`]). Capture feeds it; unwinding, symbolizing and importing
//! read it.

mod build_id;
mod files;
mod kernel_code;
mod mapping;
mod pending;
pub mod python;
mod table;
pub mod vdso;

pub use build_id::hex;
pub use files::{open_file_budget, raise_open_file_limit, FileInode, MappedFiles};
pub use kernel_code::KernelCode;
pub use mapping::{parse_maps_line, FileIdentity, Mapping};
pub(crate) use pending::{Pending, RecordBytes};
pub use table::{threads_of, ProcessInfo, ProcessTable, Settle};
