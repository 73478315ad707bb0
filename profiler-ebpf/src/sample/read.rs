//! Reading what the kernel's `perf_sample_data` holds of a sample beyond its registers: which
//! event overflowed, the data address, latency and data source, and for AMD IBS op events what
//! the op registers say.

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::map,
    maps::{HashMap, PerCpuArray},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    capture::{
        sample_flags, CaptureConfig, LossKind, CAPTURE_EVENT_IDS, IBS_PAYLOAD_MAX_BYTES,
        MAX_EVENTS, OFFSETS_SAMPLE_FLAGS,
    },
    hw::ibs::IbsOpSample,
};

use super::{
    ibs::{add_ibs_op_fields, raw_decoding, raw_payload, read_ibs_payload},
    SampleData,
};
use crate::maps::lose;

/// perf event id (of the top-level event; inherited events report their parent's) -> index.
#[map]
static EVENT_IDS: HashMap<u64, u32> = HashMap::with_max_entries(4096, 0);

/// The event index and, with BTF offsets, the sample's data address, latency and data source;
/// for AMD IBS op events also decoded from the op registers in PERF_SAMPLE_RAW.
#[inline(always)]
pub(super) fn read_sample_data(
    ctx: &PerfEventContext,
    config: &CaptureConfig,
) -> (Option<u32>, SampleData) {
    let mut data = SampleData::default();
    let offsets = &config.offsets;
    if offsets.valid == 0 {
        return (Some(0), data);
    }
    // The context is really `struct bpf_perf_event_data_kern { regs, data, event }`: three
    // pointers. Read them whole and pick by the BTF offsets, so no arithmetic is done on the
    // context pointer itself.
    // SAFETY: bpf_probe_read_kernel checks the source and fails cleanly on a bad address.
    let Ok(kern) = (unsafe { bpf_probe_read_kernel(ctx.as_ptr() as *const [u64; 3]) }) else {
        lose(LossKind::SampleDataReadFailed);
        return (event_index(0, config), data);
    };
    let pick = |offset: u32| match offset {
        0 => kern[0],
        8 => kern[1],
        16 => kern[2],
        _ => 0,
    };
    let sample = pick(offsets.ctx_data);
    let perf_event = pick(offsets.ctx_event);
    let event = event_index(perf_event, config);
    if sample == 0 {
        lose(LossKind::SampleDataReadFailed);
        return (event, data);
    }
    let read = |offset: u32| -> Option<u64> {
        // SAFETY: reads a u64 from kernel memory through the checking helper.
        unsafe { bpf_probe_read_kernel((sample + offset as u64) as *const u64) }.ok()
    };
    // Before Linux 6.1 there are no sample_flags: the kernel fills what sample_type asks for.
    let flags = if offsets.valid & OFFSETS_SAMPLE_FLAGS != 0 {
        read(offsets.sample_flags)
    } else if perf_event != 0 {
        // SAFETY: reads a u64 from kernel memory through the checking helper.
        unsafe {
            bpf_probe_read_kernel((perf_event + offsets.event_sample_type as u64) as *const u64)
        }
        .ok()
    } else {
        None
    };
    let Some(flags) = flags else {
        lose(LossKind::SampleDataReadFailed);
        return (event, data);
    };
    data.flags = flags;
    // A field is valid only when the PMU driver set its bit; otherwise it is stale memory.
    if flags & sample_flags::ADDR != 0 {
        data.addr = read(offsets.addr).unwrap_or(0);
        // The kernel fills a 0 for events that have no address (clocks, context switches):
        // no data line for those, or every clock sample would cost a map update for nothing.
        if data.addr == 0 {
            data.flags &= !sample_flags::ADDR;
        }
    }
    if flags & sample_flags::PHYS_ADDR != 0 {
        data.phys_addr = read(offsets.phys_addr).unwrap_or(0);
    }
    if flags & sample_flags::WEIGHT_STRUCT != 0 {
        // union perf_sample_weight: var1 (the cache/load latency) is the low 32 bits.
        data.latency = read(offsets.weight).unwrap_or(0) & 0xffff_ffff;
    } else if flags & sample_flags::WEIGHT != 0 {
        data.latency = read(offsets.weight).unwrap_or(0);
    }
    if flags & sample_flags::DATA_SRC != 0 {
        data.data_src = read(offsets.data_src).unwrap_or(0);
    }
    let decoding = raw_decoding();
    // The IBS event bits are load-time constants: without IBS events the verifier drops these
    // branches instead of walking the decoder on every path.
    if decoding.ibs_events() != 0 && event.is_some_and(|event| decoding.is_ibs(event)) {
        // Without PERF_SAMPLE_RAW there are no registers to read: counted like unreadable ones.
        let raw = if flags & sample_flags::RAW != 0 {
            read(offsets.raw)
        } else {
            None
        };
        match raw.and_then(|raw| raw_payload(raw, offsets)) {
            Some((payload, size)) => {
                data.raw_payload = payload;
                data.raw_size = size;
            }
            None => lose(LossKind::IbsRegistersUnreadable),
        }
    }
    if decoding.ibs_op_events != 0
        && data.raw_payload != 0
        && event.is_some_and(|event| decoding.is_ibs_op(event))
    {
        let mut bytes = [0u8; IBS_PAYLOAD_MAX_BYTES];
        let registers = read_ibs_payload(data.raw_payload, data.raw_size, bytes.as_mut_ptr())
            .and_then(|len| IbsOpSample::parse(bytes.get(..len)?).ok());
        match registers {
            Some(registers) => add_ibs_op_fields(&registers, &decoding, &mut data),
            None => {
                lose(LossKind::IbsRegistersUnreadable);
                // Counted once: nothing is streamed of it either.
                data.raw_payload = 0;
            }
        }
    }
    (event, data)
}

/// Per-CPU scratch for [`forget_known_values`].
#[map]
static SAMPLE_SCRATCH: PerCpuArray<SampleData> = PerCpuArray::with_max_entries(1, 0);

/// Passes the sample data through a map value. The decoders leave the verifier with many
/// distinct known values for these fields, and every combination would be explored again
/// through everything that follows (past its instruction budget with IBS and several events);
/// what is loaded back from a map is an unknown value, so all those paths merge here.
#[inline(always)]
pub(super) fn forget_known_values(data: SampleData) -> Option<SampleData> {
    let scratch = SAMPLE_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array; programs do not nest on one CPU. Volatile so
    // the compiler keeps the store and the load instead of forwarding the known values.
    unsafe {
        core::ptr::write_volatile(scratch, data);
        Some(core::ptr::read_volatile(scratch))
    }
}

/// Index of the event that overflowed. With one event there is nothing to look up.
#[inline(always)]
fn event_index(perf_event: u64, config: &CaptureConfig) -> Option<u32> {
    if config.flags & CAPTURE_EVENT_IDS == 0 {
        return Some(0);
    }
    if perf_event == 0 {
        return None;
    }
    let offsets = &config.offsets;
    // SAFETY: kernel reads through the checking helper.
    let parent =
        unsafe { bpf_probe_read_kernel((perf_event + offsets.event_parent as u64) as *const u64) }
            .unwrap_or(0);
    let owner = if parent != 0 { parent } else { perf_event };
    // SAFETY: as above.
    let id =
        unsafe { bpf_probe_read_kernel((owner + offsets.event_id as u64) as *const u64) }.ok()?;
    // SAFETY: the value is copied out at once.
    let index = unsafe { EVENT_IDS.get(&id) }.copied()?;
    if (index as usize) < MAX_EVENTS {
        Some(index)
    } else {
        None
    }
}
