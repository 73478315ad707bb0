//! AMD IBS: the op registers an IBS sample carries in PERF_SAMPLE_RAW, read and decoded into
//! the sample's fields where the kernel did not fill them, and streamed whole to the agent.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    helpers::bpf_probe_read_kernel,
    macros::map,
    maps::RingBuf,
};
use profiler_common::{
    capture::{
        sample_flags, IbsRecord, LossKind, RawDecoding, CACHE_LINE_BYTES, IBS_PAYLOAD_MAX_BYTES,
        IBS_PAYLOAD_MIN_BYTES,
    },
    hw::ibs::IbsOpSample,
};

use super::SampleData;
use crate::maps::lose;

/// Which events' PERF_SAMPLE_RAW payloads are decoded, and the CPU's IBS errata.
#[unsafe(no_mangle)]
static RAW_DECODING: profiler_common::capture::RawDecoding =
    profiler_common::capture::RawDecoding::EMPTY;

/// The registers of every IBS sample, for the derived counters the agent accumulates.
#[map]
static IBS_SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 22, 0);

#[inline(always)]
pub(super) fn raw_decoding() -> RawDecoding {
    // SAFETY: a plain read of our own read-only global; volatile so the compiler cannot fold
    // the all-zero initializer that the agent overrides at load time.
    unsafe { core::ptr::read_volatile(&RAW_DECODING) }
}

/// The PERF_SAMPLE_RAW payload behind `perf_sample_data.raw` (a `perf_raw_record *`): its
/// address and length.
#[inline(always)]
pub(super) fn raw_payload(
    raw_record: u64,
    offsets: &profiler_common::capture::KernelOffsets,
) -> Option<(u64, u64)> {
    // SAFETY: kernel reads through the checking helper.
    let payload =
        unsafe { bpf_probe_read_kernel((raw_record + offsets.raw_frag_data as u64) as *const u64) }
            .ok()?;
    // SAFETY: as above.
    let size =
        unsafe { bpf_probe_read_kernel((raw_record + offsets.raw_frag_size as u64) as *const u32) }
            .ok()?;
    (payload != 0).then_some((payload, u64::from(size)))
}

/// Copies an IBS payload of `size` bytes at `payload` to the `IBS_PAYLOAD_MAX_BYTES` bytes at
/// `into`, in fixed-size pieces the verifier can bound: the part every payload has, then whole
/// registers while the payload has more. The bytes copied; `None` when the payload is too short
/// or unreadable. `into` is a raw pointer because it may be uninitialized ring-buffer memory.
#[inline(always)]
pub(super) fn read_ibs_payload(payload: u64, size: u64, into: *mut u8) -> Option<usize> {
    let size = size as usize;
    if size < IBS_PAYLOAD_MIN_BYTES {
        return None;
    }
    let copy = |offset: usize, bytes: usize| -> Option<()> {
        // SAFETY: the callers' buffers hold `IBS_PAYLOAD_MAX_BYTES >= offset + bytes` writable
        // bytes at `into`, and `offset + bytes <= size` bytes are behind `payload`; the checking
        // helper fails cleanly on a bad source address.
        let failed = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                into.add(offset) as *mut core::ffi::c_void,
                bytes as u32,
                (payload + offset as u64) as *const core::ffi::c_void,
            )
        };
        (failed == 0).then_some(())
    };
    copy(0, IBS_PAYLOAD_MIN_BYTES)?;
    let mut len = IBS_PAYLOAD_MIN_BYTES;
    while len + 8 <= IBS_PAYLOAD_MAX_BYTES && len + 8 <= size {
        copy(len, 8)?;
        len += 8;
    }
    Some(len)
}

/// Fills what the kernel did not put in `perf_sample_data` (kernels before 6.1 decode nothing
/// of IBS themselves) from the op registers.
#[inline(always)]
pub(super) fn add_ibs_op_fields(
    registers: &IbsOpSample,
    decoding: &RawDecoding,
    data: &mut SampleData,
) {
    let fields = registers.decode(decoding.errata()).sample_fields();
    if data.flags & sample_flags::ADDR == 0 {
        if let Some(addr) = fields.data_addr {
            data.addr = addr;
            data.flags |= sample_flags::ADDR;
        }
    }
    if data.flags & sample_flags::PHYS_ADDR == 0 {
        if let Some(phys_addr) = fields.phys_addr {
            data.phys_addr = phys_addr;
            data.flags |= sample_flags::PHYS_ADDR;
        }
    }
    if data.latency == 0 {
        data.latency = fields.load_latency.unwrap_or(0);
    }
    if data.flags & sample_flags::DATA_SRC == 0 {
        if let Some(source) = fields.data_source {
            data.data_src = source.encode();
            data.flags |= sample_flags::DATA_SRC;
        }
    }
}

/// Streams an IBS sample's registers to the agent; whether it was streamed (the ring may be
/// full: counted as a loss).
#[inline(always)]
pub(super) fn stream_ibs(pid: u32, event: u32, ip: u64, data: &SampleData) -> bool {
    let Some(mut entry) = IBS_SAMPLES.reserve::<IbsRecord>(0) else {
        lose(LossKind::IbsRingFull);
        return false;
    };
    let record = entry.as_mut_ptr();
    // SAFETY: `record` points to the reserved, exclusively owned ring entry of IbsRecord size;
    // only the field's address is taken, no reference to the uninitialized bytes.
    let payload = unsafe { core::ptr::addr_of_mut!((*record).payload) } as *mut u8;
    let Some(len) = read_ibs_payload(data.raw_payload, data.raw_size, payload) else {
        entry.discard(0);
        lose(LossKind::IbsRegistersUnreadable);
        return false;
    };
    // SAFETY: as above; every header field is written before the entry is submitted.
    unsafe {
        (*record).pid = pid;
        (*record).event = event;
        (*record).ip = ip;
        (*record).line = data.addr & !(CACHE_LINE_BYTES - 1);
        (*record).data_src = data.data_src;
        (*record).sample_flags = data.flags;
        (*record).payload_len = len as u32;
    }
    // Wake the agent when this record fills the ring past half: it also reads the ring on a
    // timer, and a wakeup per sample would cost more than the sample.
    let half = IBS_SAMPLES.query(BPF_RB_RING_SIZE as u64) / 2;
    let waiting = IBS_SAMPLES.query(BPF_RB_AVAIL_DATA as u64);
    let crossing = waiting <= half && waiting + core::mem::size_of::<IbsRecord>() as u64 > half;
    let wakeup = if crossing {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    entry.submit(wakeup as u64);
    true
}
