//! Synthetic perf.data files laid out by hand from the kernel's format description, so every
//! field's position is checked independently of perf's own writer; plus fuzzing for panics.

use proptest::prelude::*;

use super::writer::*;
use super::*;

const PERF_CONTEXT_KERNEL: u64 = -128i64 as u64;
const PERF_CONTEXT_USER: u64 = -512i64 as u64;
const PERF_CONTEXT_GUEST_KERNEL: u64 = -2176i64 as u64;

const SAMPLE: u32 = 9;
const MISC_KERNEL: u16 = 1;
const MISC_USER: u16 = 2;
const MISC_EXACT_IP: u16 = 1 << 14;

// perf_event_attr flag bits.
const ATTR_FREQ: u64 = 1 << 10;
const ATTR_SAMPLE_ID_ALL: u64 = 1 << 18;
const ATTR_EXCLUDE_KERNEL: u64 = 1 << 5;

fn one_event(sample_type: u64) -> FileBuilder {
    FileBuilder::default().attr(AttrSpec {
        event_type: 4,
        config: 0x1cd,
        period: 10007,
        sample_type,
        flags: ATTR_SAMPLE_ID_ALL,
        ids: vec![7],
        ..AttrSpec::default()
    })
}

#[test]
fn fields_after_weight_struct_are_read_at_their_own_offsets() {
    // An Intel PEBS load-latency sample: cpu/mem-loads,ldlat=30/P with perf mem's sample_type.
    let sample_type = PERF_SAMPLE_IDENTIFIER
        | PERF_SAMPLE_IP
        | PERF_SAMPLE_TID
        | PERF_SAMPLE_TIME
        | PERF_SAMPLE_ADDR
        | PERF_SAMPLE_CPU
        | PERF_SAMPLE_PERIOD
        | PERF_SAMPLE_WEIGHT_STRUCT
        | PERF_SAMPLE_DATA_SRC
        | PERF_SAMPLE_PHYS_ADDR;
    let weight = 312 | (27 << 32) | (9 << 48);
    let mut body = Bytes::default();
    body.u64(7) // identifier
        .u64(0x40_1234)
        .u32(100)
        .u32(101)
        .u64(5_000_000)
        .u64(0x7ffd_0000_1040)
        .u32(1)
        .u32(0)
        .u64(10007)
        .u64(weight)
        .u64(0x6_8100_0142)
        .u64(0x1_2345_6040);
    let file = one_event(sample_type)
        .record(SAMPLE, MISC_USER | MISC_EXACT_IP, &body.take())
        .build();

    let parsed = parse(&file).unwrap();
    assert_eq!(parsed.samples.len(), 1);
    let s = &parsed.samples[0];
    assert_eq!(s.ip, Some(0x40_1234));
    assert_eq!((s.pid, s.tid), (Some(100), Some(101)));
    assert_eq!(s.addr, Some(0x7ffd_0000_1040));
    assert_eq!(s.cpu, Some(1));
    assert_eq!(s.period, Some(10007));
    assert_eq!(
        s.weight,
        Some(Weight {
            raw: weight,
            parts: Some(WeightParts {
                var1: 312,
                var2: 27,
                var3: 9
            }),
        })
    );
    assert_eq!(s.data_src, Some(0x6_8100_0142));
    assert_eq!(s.phys_addr, Some(0x1_2345_6040));
    assert!(s.exact_ip);
    assert_eq!(s.cpumode, CpuMode::User);
}

#[test]
fn plain_weight_has_no_struct_parts() {
    let sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_WEIGHT | PERF_SAMPLE_DATA_SRC;
    let mut body = Bytes::default();
    body.u64(0x1000).u64(77).u64(0x142);
    let file = one_event(sample_type)
        .record(SAMPLE, 2, &body.take())
        .build();
    let s = &parse(&file).unwrap().samples[0];
    assert_eq!(
        s.weight,
        Some(Weight {
            raw: 77,
            parts: None
        })
    );
    assert_eq!(s.data_src, Some(0x142));
}

/// A file whose one event samples every field, with one sample.
fn every_field_file() -> Vec<u8> {
    let regs_user_mask = 0b1011; // three registers
    let regs_intr_mask = 0b110; // two registers
    let sample_type = KNOWN_SAMPLE_TYPE & !PERF_SAMPLE_WEIGHT;
    let attr = AttrSpec {
        event_type: 0,
        sample_type,
        read_format: PERF_FORMAT_GROUP
            | PERF_FORMAT_TOTAL_TIME_ENABLED
            | PERF_FORMAT_TOTAL_TIME_RUNNING
            | PERF_FORMAT_ID
            | PERF_FORMAT_LOST,
        branch_sample_type: PERF_SAMPLE_BRANCH_HW_INDEX | PERF_SAMPLE_BRANCH_COUNTERS,
        sample_regs_user: regs_user_mask,
        sample_regs_intr: regs_intr_mask,
        sample_stack_user: 16,
        ids: vec![42],
        ..AttrSpec::default()
    };
    let mut b = Bytes::default();
    b.u64(42) // IDENTIFIER
        .u64(0xffff_ffff_8100_0010) // IP
        .u32(10)
        .u32(11) // TID
        .u64(123_456) // TIME
        .u64(0xdead_b000) // ADDR
        .u64(42) // ID
        .u64(43) // STREAM_ID
        .u32(3)
        .u32(0) // CPU
        .u64(2000) // PERIOD
        // READ, group: nr, time_enabled, time_running, {value, id, lost} x2
        .u64(2)
        .u64(900)
        .u64(800)
        .u64(5)
        .u64(42)
        .u64(0)
        .u64(6)
        .u64(44)
        .u64(1)
        // CALLCHAIN
        .u64(3)
        .u64(PERF_CONTEXT_KERNEL)
        .u64(0xffff_ffff_8100_0010)
        .u64(0xffff_ffff_8100_0020)
        // RAW: size 12, then 12 bytes (4 + 12 = 16, u64 aligned)
        .u32(12)
        .raw(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
        // BRANCH_STACK: nr, hw_idx, entries, counters
        .u64(2)
        .u64(17)
        .u64(0x100)
        .u64(0x200)
        .u64(1)
        .u64(0x300)
        .u64(0x400)
        .u64(2)
        .u64(0xa)
        .u64(0xb)
        // REGS_USER: abi 2 (64-bit), three registers
        .u64(2)
        .u64(31)
        .u64(32)
        .u64(33)
        // STACK_USER: size, data, dyn_size
        .u64(16)
        .raw(&[0xee; 16])
        .u64(8)
        // WEIGHT_STRUCT
        .u64(50 | (4 << 32) | (2 << 48))
        .u64(0x1234) // DATA_SRC
        .u64(0x5678) // TRANSACTION
        // REGS_INTR: abi 2, two registers
        .u64(2)
        .u64(41)
        .u64(42)
        .u64(0xabc_d000) // PHYS_ADDR
        .u64(99) // CGROUP
        .u64(4096) // DATA_PAGE_SIZE
        .u64(2 << 20) // CODE_PAGE_SIZE
        // AUX: size, data
        .u64(8)
        .raw(b"auxdata!");
    FileBuilder::default()
        .attr(attr)
        .record(SAMPLE, MISC_KERNEL, &b.take())
        .build()
}

#[test]
fn every_sample_field_is_decoded_in_kernel_order() {
    let parsed = parse(&every_field_file()).unwrap();
    let s = &parsed.samples[0];
    let expected = PerfSample {
        attr_index: 0,
        cpumode: CpuMode::Kernel,
        exact_ip: false,
        id: Some(42),
        ip: Some(0xffff_ffff_8100_0010),
        pid: Some(10),
        tid: Some(11),
        time: Some(123_456),
        addr: Some(0xdead_b000),
        stream_id: Some(43),
        cpu: Some(3),
        period: Some(2000),
        read: Some(ReadValues {
            time_enabled: Some(900),
            time_running: Some(800),
            values: vec![
                ReadValue {
                    value: 5,
                    id: Some(42),
                    lost: Some(0),
                },
                ReadValue {
                    value: 6,
                    id: Some(44),
                    lost: Some(1),
                },
            ],
        }),
        callchain_kernel: vec![0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020],
        callchain_user: vec![],
        callchain_other: vec![],
        raw: Some((1..=12).collect()),
        branch_stack: Some(BranchStack {
            hw_idx: Some(17),
            entries: vec![
                BranchEntry {
                    from: 0x100,
                    to: 0x200,
                    flags: 1,
                },
                BranchEntry {
                    from: 0x300,
                    to: 0x400,
                    flags: 2,
                },
            ],
            counters: vec![0xa, 0xb],
        }),
        regs_user: Some(Registers {
            abi: 2,
            regs: vec![31, 32, 33],
        }),
        stack_user: Some(UserStack {
            data: vec![0xee; 16],
            dyn_size: 8,
        }),
        weight: Some(Weight {
            raw: 50 | (4 << 32) | (2 << 48),
            parts: Some(WeightParts {
                var1: 50,
                var2: 4,
                var3: 2,
            }),
        }),
        data_src: Some(0x1234),
        transaction: Some(0x5678),
        regs_intr: Some(Registers {
            abi: 2,
            regs: vec![41, 42],
        }),
        phys_addr: Some(0xabc_d000),
        cgroup: Some(99),
        data_page_size: Some(4096),
        code_page_size: Some(2 << 20),
        aux: Some(b"auxdata!".to_vec()),
    };
    assert_eq!(s, &expected);
}

#[test]
fn empty_registers_and_user_stack_take_no_space() {
    // A kernel-mode sample: the kernel writes ABI_NONE and a zero-size stack, nothing more.
    let sample_type = PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER | PERF_SAMPLE_PERIOD;
    let attr = AttrSpec {
        sample_type,
        sample_regs_user: 0xff,
        sample_stack_user: 8192,
        ids: vec![1],
        ..AttrSpec::default()
    };
    let mut b = Bytes::default();
    b.u64(3).u64(0).u64(0); // period, regs abi NONE, stack size 0
    let file = FileBuilder::default()
        .attr(attr)
        .record(SAMPLE, MISC_KERNEL, &b.take())
        .build();
    let s = &parse(&file).unwrap().samples[0];
    assert_eq!(s.regs_user, Some(Registers::default()));
    assert_eq!(s.stack_user, Some(UserStack::default()));
    assert_eq!(s.period, Some(3));
}

/// The raw payload as Linux delivers an IBS op sample: u32 size (4 + 8n), u32 caps, then the
/// op registers.
fn ibs_op_raw(regs: &[u64]) -> Vec<u8> {
    let mut b = Bytes::default();
    b.u32(4 + 8 * regs.len() as u32).u32(0x7ff);
    for &reg in regs {
        b.u64(reg);
    }
    b.take()
}

#[test]
fn ibs_op_raw_payload_is_kept_whole_and_later_fields_follow_it() {
    let sample_type = PERF_SAMPLE_IP
        | PERF_SAMPLE_TID
        | PERF_SAMPLE_TIME
        | PERF_SAMPLE_ADDR
        | PERF_SAMPLE_CPU
        | PERF_SAMPLE_PERIOD
        | PERF_SAMPLE_RAW
        | PERF_SAMPLE_WEIGHT_STRUCT
        | PERF_SAMPLE_DATA_SRC
        | PERF_SAMPLE_PHYS_ADDR;
    // OP_CTL, OP_RIP, OP_DATA, OP_DATA2, OP_DATA3, DC_LINADDR, DC_PHYSADDR, BR_TARGET, OP_DATA4
    let regs = [
        0x0006_0000_0001_0fff,
        0x5555_5555_1234,
        0x0000_0020_0010_0008,
        0x3,
        0x0032_0000_0006_0081,
        0x7f00_dead_beef,
        0x1_0bad_cafe,
        0,
        0,
    ];
    let raw = ibs_op_raw(&regs);
    let mut b = Bytes::default();
    b.u64(0x5555_5555_1234)
        .u32(500)
        .u32(501)
        .u64(99)
        .u64(0x7f00_dead_beef)
        .u32(0)
        .u32(0)
        .u64(100_000)
        .raw(&raw)
        .u64(50)
        .u64(0x4_4100_0142)
        .u64(0x1_0bad_cafe);
    let pmu_type = 11;
    let file = FileBuilder::default()
        .attr(AttrSpec {
            event_type: pmu_type,
            period: 100_000,
            sample_type,
            flags: ATTR_SAMPLE_ID_ALL | ATTR_EXCLUDE_KERNEL,
            ids: vec![3],
            ..AttrSpec::default()
        })
        .record(SAMPLE, MISC_USER | MISC_EXACT_IP, &b.take())
        .feature(16, {
            let mut f = Bytes::default();
            f.u32(2).u32(pmu_type).string("ibs_op").u32(4).string("cpu");
            f.take()
        })
        .feature(31, {
            let mut f = Bytes::default();
            f.u32(1)
                .u32(2)
                .string("zen4_ibs_extensions")
                .string("1")
                .string("max_precise")
                .string("0")
                .string("ibs_op");
            f.take()
        })
        .build();

    let parsed = parse(&file).unwrap();
    let s = &parsed.samples[0];
    assert_eq!(s.raw.as_deref(), Some(&raw[4..]));
    let raw_regs: Vec<u64> = s.raw.as_ref().unwrap()[4..]
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect();
    assert_eq!(raw_regs, regs);
    assert_eq!(s.weight.map(|w| w.raw), Some(50));
    assert_eq!(s.data_src, Some(0x4_4100_0142));
    assert_eq!(s.phys_addr, Some(0x1_0bad_cafe));
    assert_eq!(parsed.attrs[0].event_type, pmu_type);
    assert!(parsed.attrs[0].exclude_kernel && !parsed.attrs[0].exclude_user);
    assert_eq!(
        parsed.features.pmu_mappings,
        vec![(11, "ibs_op".to_string()), (4, "cpu".to_string())]
    );
    let caps: Vec<(&str, &str, &str)> = parsed
        .features
        .pmu_caps
        .iter()
        .map(|c| (c.pmu.as_str(), c.name.as_str(), c.value.as_str()))
        .collect();
    assert_eq!(
        caps,
        [
            ("ibs_op", "zen4_ibs_extensions", "1"),
            ("ibs_op", "max_precise", "0")
        ]
    );
}

#[test]
fn callchain_context_markers_split_kernel_user_and_guest_frames() {
    let mut b = Bytes::default();
    b.u64(0xffff_ffff_8100_0001)
        .u64(8)
        .u64(PERF_CONTEXT_KERNEL)
        .u64(0xffff_ffff_8100_0001)
        .u64(0xffff_ffff_8100_0002)
        .u64(PERF_CONTEXT_USER)
        .u64(0x40_1000)
        .u64(0x40_2000)
        .u64(PERF_CONTEXT_GUEST_KERNEL)
        .u64(0xffff_8000_0000_0001);
    let mut unmarked = Bytes::default();
    // Frames before any marker belong to the sample's own mode.
    unmarked.u64(0x40_3000).u64(2).u64(0x40_3000).u64(0x40_4000);
    let file = one_event(PERF_SAMPLE_IP | PERF_SAMPLE_CALLCHAIN)
        .record(SAMPLE, MISC_KERNEL, &b.take())
        .record(SAMPLE, MISC_USER, &unmarked.take())
        .build();

    let parsed = parse(&file).unwrap();
    let s = &parsed.samples[0];
    assert_eq!(
        s.callchain_kernel,
        [0xffff_ffff_8100_0001, 0xffff_ffff_8100_0002]
    );
    assert_eq!(s.callchain_user, [0x40_1000, 0x40_2000]);
    assert_eq!(s.callchain_other, [0xffff_8000_0000_0001]);
    let s = &parsed.samples[1];
    assert!(s.callchain_kernel.is_empty());
    assert_eq!(s.callchain_user, [0x40_3000, 0x40_4000]);
}

/// Two events with different sample layouts, told apart by PERF_SAMPLE_IDENTIFIER, as `perf
/// record -e cycles -e mem-loads` writes them.
fn two_events_with_identifier() -> FileBuilder {
    let common = PERF_SAMPLE_IDENTIFIER | PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
    FileBuilder::default()
        .attr(AttrSpec {
            event_type: 0,
            period: 4000,
            sample_type: common | PERF_SAMPLE_PERIOD,
            flags: ATTR_SAMPLE_ID_ALL | ATTR_FREQ,
            ids: vec![10, 11],
            ..AttrSpec::default()
        })
        .attr(AttrSpec {
            event_type: 4,
            config: 0x1cd,
            config1: 30,
            period: 1009,
            sample_type: common | PERF_SAMPLE_ADDR | PERF_SAMPLE_WEIGHT_STRUCT,
            flags: ATTR_SAMPLE_ID_ALL | (2 << 15),
            ids: vec![20],
            ..AttrSpec::default()
        })
}

#[test]
fn several_events_are_told_apart_by_identifier() {
    let mut cycles = Bytes::default();
    cycles.u64(11).u64(0x1000).u32(1).u32(1).u64(100).u64(4001);
    let mut loads = Bytes::default();
    loads
        .u64(20)
        .u64(0x2000)
        .u32(1)
        .u32(2)
        .u64(200)
        .u64(0xbeef0)
        .u64(77);
    let mut stray = Bytes::default();
    stray.u64(99).u64(0).u32(0).u32(0).u64(0);
    // A COMM with a trailer of the second event's layout: TID, TIME, IDENTIFIER.
    let mut comm = Bytes::default();
    comm.u32(1)
        .u32(2)
        .c_string("worker")
        .u32(1)
        .u32(2)
        .u64(150)
        .u64(20);
    let file = two_events_with_identifier()
        .record(SAMPLE, MISC_USER, &cycles.take())
        .record(SAMPLE, MISC_USER, &loads.take())
        .record(SAMPLE, MISC_USER, &stray.take())
        .record(3, 0, &comm.take())
        .feature(
            12,
            event_desc(&[("cycles", &[10, 11]), ("cpu/mem-loads,ldlat=30/P", &[20])]),
        )
        .build();

    let parsed = parse(&file).unwrap();
    assert_eq!(parsed.samples.len(), 2);
    assert_eq!(parsed.samples_with_unknown_id, 1);
    assert_eq!(parsed.samples[0].attr_index, 0);
    assert_eq!(parsed.samples[0].period, Some(4001));
    assert_eq!(parsed.samples[1].attr_index, 1);
    assert_eq!(parsed.samples[1].addr, Some(0xbeef0));
    assert_eq!(parsed.samples[1].weight.map(|w| w.raw), Some(77));
    assert_eq!(parsed.attrs[0].name.as_deref(), Some("cycles"));
    assert_eq!(parsed.attrs[0].sampling, Sampling::Frequency(4000));
    assert_eq!(
        parsed.attrs[1].name.as_deref(),
        Some("cpu/mem-loads,ldlat=30/P")
    );
    assert_eq!(parsed.attrs[1].sampling, Sampling::Period(1009));
    assert_eq!(parsed.attrs[1].precise_ip, 2);
    assert_eq!(
        (parsed.attrs[1].config, parsed.attrs[1].config1),
        (0x1cd, 30)
    );
    assert_eq!(
        parsed.comms,
        [Comm {
            pid: 1,
            tid: 2,
            comm: "worker".to_string(),
            exec: false,
            time: Some(150),
        }]
    );
}

#[test]
fn several_events_with_the_same_layout_are_told_apart_by_id() {
    // perf 6.1 records `-e cpu-clock,page-faults` with PERF_SAMPLE_ID, not IDENTIFIER.
    let sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_ID;
    let event = |ids: Vec<u64>| AttrSpec {
        sample_type,
        flags: ATTR_SAMPLE_ID_ALL,
        ids,
        ..AttrSpec::default()
    };
    let sample = |id: u64| {
        let mut b = Bytes::default();
        b.u64(0x1000).u32(5).u32(5).u64(1).u64(id);
        b.take()
    };
    let file = FileBuilder::default()
        .attr(event(vec![26, 27]))
        .attr(event(vec![28, 29]))
        .record(SAMPLE, MISC_USER, &sample(29))
        .record(SAMPLE, MISC_USER, &sample(27))
        .build();
    let parsed = parse(&file).unwrap();
    let events: Vec<usize> = parsed.samples.iter().map(|s| s.attr_index).collect();
    assert_eq!(events, [1, 0]);
}

#[test]
fn events_without_a_common_id_position_are_rejected() {
    let file = FileBuilder::default()
        .attr(AttrSpec {
            sample_type: PERF_SAMPLE_IP,
            ..AttrSpec::default()
        })
        .attr(AttrSpec {
            sample_type: PERF_SAMPLE_IP | PERF_SAMPLE_TID,
            ..AttrSpec::default()
        })
        .record(SAMPLE, MISC_USER, &0x1000u64.to_le_bytes())
        .build();
    let err = parse(&file).unwrap_err().to_string();
    assert!(err.contains("cannot be told apart"), "{err}");
}

/// The `struct sample_id` trailer of [`one_event`]'s layout with `sample_id_all`: none of the
/// id fields are sampled, so it is empty unless TIME is added.
fn timed_event() -> FileBuilder {
    one_event(PERF_SAMPLE_IP | PERF_SAMPLE_TIME)
}

#[test]
fn mappings_threads_and_losses_are_decoded() {
    let mut mmap = Bytes::default();
    mmap.u32(0xffff_ffff)
        .u32(0)
        .u64(0xffff_ffff_8100_0000)
        .u64(0x100_0000)
        .u64(0xffff_ffff_8100_0000)
        .c_string("[kernel.kallsyms]_text")
        .u64(1); // trailer: time
    let mut mmap2_inode = Bytes::default();
    mmap2_inode
        .u32(300)
        .u32(300)
        .u64(0x5555_0000_0000)
        .u64(0x2000)
        .u64(0x1000)
        .u32(8)
        .u32(1)
        .u64(123_456)
        .u64(7)
        .u32(5) // PROT_READ | PROT_EXEC
        .u32(2) // MAP_PRIVATE
        .c_string("/usr/bin/workload")
        .u64(2);
    let mut mmap2_build_id = Bytes::default();
    mmap2_build_id
        .u32(300)
        .u32(301)
        .u64(0x7f00_0000_0000)
        .u64(0x1000)
        .u64(0)
        .u8(3)
        .u8(0)
        .u16(0)
        .raw(&[0xab, 0xcd, 0xef])
        .raw(&[0; 17])
        .u32(3)
        .u32(2)
        .c_string("/lib/libc.so.6")
        .u64(3);
    let mut data_mmap = Bytes::default();
    data_mmap
        .u32(300)
        .u32(300)
        .u64(0x6000_0000)
        .u64(0x10_0000)
        .u64(0)
        .u32(0)
        .u32(0)
        .u64(0)
        .u64(0)
        .u32(3)
        .u32(0x22)
        .c_string("//anon")
        .u64(4);
    let mut comm = Bytes::default();
    comm.u32(300).u32(300).c_string("workload").u64(5);
    let task = |pid: u32, time: u64| {
        let mut b = Bytes::default();
        b.u32(pid).u32(1).u32(pid).u32(1).u64(time).u64(time);
        b.take()
    };
    let mut lost = Bytes::default();
    lost.u64(7).u64(12).u64(8);
    let mut lost_samples = Bytes::default();
    lost_samples.u64(3).u64(9);
    let mut throttle = Bytes::default();
    throttle.u64(10).u64(7).u64(7).u64(10);
    let mut auxtrace = Bytes::default();
    // size 16, offset 0x1000, reference, idx 1, tid -1 (traced per CPU), cpu 3, reserved.
    auxtrace
        .u64(16)
        .u64(0x1000)
        .u64(0)
        .u32(1)
        .u32(u32::MAX)
        .u32(3)
        .u32(0);
    let file = timed_event()
        .record(1, MISC_KERNEL, &mmap.take())
        .record(10, MISC_USER, &mmap2_inode.take())
        .record(10, MISC_USER | (1 << 14), &mmap2_build_id.take())
        .record(10, MISC_USER | (1 << 13), &data_mmap.take())
        .record(3, 1 << 13, &comm.take())
        .record(7, 0, &task(301, 6))
        .record(4, 0, &task(301, 7))
        .record(2, 0, &lost.take())
        .record(13, 0, &lost_samples.take())
        .record(5, 0, &throttle.take())
        .record(68, 0, &[])
        .record(68, 0, &[])
        .record(71, 0, &auxtrace.take());
    // The AUXTRACE payload follows its record, outside header.size.
    let mut file = file;
    file.data.extend_from_slice(&[0x55; 16]);
    let parsed = parse(&file.record(68, 0, &[]).build()).unwrap();

    assert_eq!(parsed.mmaps.len(), 4);
    let kernel = &parsed.mmaps[0];
    assert_eq!(kernel.filename, "[kernel.kallsyms]_text");
    assert_eq!(kernel.cpumode, CpuMode::Kernel);
    assert_eq!(
        (kernel.start, kernel.len),
        (0xffff_ffff_8100_0000, 0x100_0000)
    );
    assert_eq!(kernel.prot, None);
    assert_eq!(kernel.time, Some(1));
    let exe = &parsed.mmaps[1];
    assert_eq!(exe.filename, "/usr/bin/workload");
    assert_eq!(
        exe.file_id,
        Some(FileId {
            maj: 8,
            min: 1,
            ino: 123_456,
            ino_generation: 7
        })
    );
    assert_eq!((exe.prot, exe.flags, exe.pgoff), (Some(5), Some(2), 0x1000));
    assert!(!exe.data);
    let libc = &parsed.mmaps[2];
    assert_eq!(libc.build_id.as_deref(), Some(&[0xab, 0xcd, 0xef][..]));
    assert_eq!(libc.file_id, None);
    assert_eq!((libc.filename.as_str(), libc.tid), ("/lib/libc.so.6", 301));
    assert!(parsed.mmaps[3].data);
    assert_eq!(parsed.comms[0].comm, "workload");
    assert!(parsed.comms[0].exec);
    assert_eq!(parsed.comms[0].time, Some(5));
    assert_eq!(parsed.forks[0].pid, 301);
    assert_eq!(parsed.forks[0].time, 6);
    assert_eq!(parsed.exits[0].time, 7);
    assert_eq!(parsed.lost, 12);
    assert_eq!(parsed.lost_samples, 3);
    assert_eq!(
        parsed.throttles,
        [Throttle {
            throttled: true,
            time: 10,
            id: 7,
            attr_index: Some(0)
        }]
    );
    assert_eq!(parsed.skipped_records, BTreeMap::from([(68, 3)]));
    assert_eq!(
        parsed.aux_traces,
        [AuxTrace {
            offset: 0x1000,
            idx: 1,
            tid: None,
            cpu: Some(3),
            data: vec![0x55; 16],
        }]
    );
}

#[test]
fn header_features_are_decoded() {
    let string = |s: &str| {
        let mut b = Bytes::default();
        b.string(s);
        b.take()
    };
    let mut build_ids = Bytes::default();
    // With the size flag: a 4-byte build id.
    build_ids
        .u32(67)
        .u16(MISC_USER | (1 << 15))
        .u16(8 + 4 + 24 + 16)
        .u32(300)
        .raw(&[1, 2, 3, 4])
        .raw(&[0; 16])
        .u8(4)
        .raw(&[0; 3])
        .c_string("/usr/bin/app");
    // Without it: a 20-byte SHA-1 build id.
    build_ids
        .u32(67)
        .u16(MISC_KERNEL)
        .u16(8 + 4 + 24 + 24)
        .u32(-1i32 as u32)
        .raw(&[9; 20])
        .raw(&[0; 4])
        .c_string("[kernel.kallsyms]");
    let file = timed_event()
        .feature(2, build_ids.take())
        .feature(3, string("builder"))
        .feature(4, string("6.18.0-test"))
        .feature(5, string("6.1.0"))
        .feature(6, string("x86_64"))
        .feature(7, {
            let mut b = Bytes::default();
            b.u32(8).u32(4);
            b.take()
        })
        .feature(8, string("AMD EPYC 9654"))
        .feature(9, string("AuthenticAMD,25,17,1"))
        .feature(10, 24_684_096u64.to_le_bytes().to_vec())
        .feature(11, {
            let mut b = Bytes::default();
            b.u32(3).string("perf").string("record").string("-g");
            b.take()
        })
        .feature(12, event_desc(&[("cpu-clock", &[7])]))
        .feature(13, vec![0; 24]) // CPU_TOPOLOGY: not modelled
        .feature(21, {
            let mut b = Bytes::default();
            b.u64(1000).u64(2000);
            b.take()
        })
        .feature(28, {
            let mut b = Bytes::default();
            b.u32(1).string("branches").string("32");
            b.take()
        })
        .build();

    let parsed = parse(&file).unwrap();
    let f = &parsed.features;
    assert_eq!(f.hostname.as_deref(), Some("builder"));
    assert_eq!(f.os_release.as_deref(), Some("6.18.0-test"));
    assert_eq!(f.perf_version.as_deref(), Some("6.1.0"));
    assert_eq!(f.arch.as_deref(), Some("x86_64"));
    assert_eq!(
        f.nr_cpus,
        Some(NrCpus {
            available: 8,
            online: 4
        })
    );
    assert_eq!(f.cpu_desc.as_deref(), Some("AMD EPYC 9654"));
    assert_eq!(f.cpuid.as_deref(), Some("AuthenticAMD,25,17,1"));
    assert_eq!(f.total_mem_kib, Some(24_684_096));
    assert_eq!(f.cmdline, ["perf", "record", "-g"]);
    assert_eq!(f.sample_time, Some((1000, 2000)));
    assert_eq!(f.skipped, [13]);
    assert_eq!(parsed.attrs[0].name.as_deref(), Some("cpu-clock"));
    assert_eq!(
        f.build_ids,
        [
            BuildId {
                pid: 300,
                cpumode: CpuMode::User,
                build_id: vec![1, 2, 3, 4],
                filename: "/usr/bin/app".to_string(),
            },
            BuildId {
                pid: -1,
                cpumode: CpuMode::Kernel,
                build_id: vec![9; 20],
                filename: "[kernel.kallsyms]".to_string(),
            }
        ]
    );
    assert_eq!(
        f.pmu_caps,
        [PmuCap {
            pmu: "cpu".to_string(),
            name: "branches".to_string(),
            value: "32".to_string()
        }]
    );
}

#[test]
fn files_that_are_not_plain_perf_data_are_rejected_with_what_to_do() {
    let err = |bytes: &[u8]| parse(bytes).unwrap_err().to_string();
    assert!(err(b"\x7fELF\x02\x01\x01\0rest").contains("not a perf.data file"));
    let valid = timed_event().build();

    let mut big_endian = valid.clone();
    big_endian[..8].copy_from_slice(b"2ELIFREP");
    assert!(err(&big_endian).contains("big-endian"));

    let mut pipe = b"PERFILE2".to_vec();
    pipe.extend_from_slice(&16u64.to_le_bytes());
    assert!(err(&pipe).contains("pipe-mode perf.data (from `perf record -o -`)"));

    let compressed = timed_event().record(81, 0, &[0; 16]).build();
    assert!(err(&compressed).contains("record again without -z"));

    assert!(err(&valid[..50]).contains("truncated"));
}

#[test]
fn a_truncated_record_names_its_type_offset_and_sizes() {
    let mut b = Bytes::default();
    b.u64(0x1000).u64(5);
    let mut file = timed_event().record(SAMPLE, MISC_USER, &b.take());
    // The next record claims 80 bytes, but only its header and 4 more bytes exist.
    file.data.extend_from_slice(&9u32.to_le_bytes());
    file.data.extend_from_slice(&2u16.to_le_bytes());
    file.data.extend_from_slice(&80u16.to_le_bytes());
    file.data.extend_from_slice(&[0; 4]);
    let bytes = file.build();
    let record_offset = 104 + 144 + 8 + 24;
    let err = parse(&bytes).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "truncated PERF_RECORD_SAMPLE record (type 9) at offset 0x{record_offset:x} \
             (needs 80 bytes, 12 remain): the file is incomplete or corrupt; was `perf record` \
             killed, or the copy cut short?"
        )
    );
}

#[test]
fn a_sample_longer_than_its_layout_is_rejected() {
    let mut b = Bytes::default();
    b.u64(0x1000).u64(5).u64(0xdead);
    let file = timed_event().record(SAMPLE, MISC_USER, &b.take()).build();
    let err = parse(&file).unwrap_err().to_string();
    assert!(err.contains("8 bytes remain after the last field"), "{err}");
    assert!(err.contains("PERF_RECORD_SAMPLE record at 0x"), "{err}");
}

#[test]
fn a_callchain_longer_than_its_record_is_reported_not_allocated() {
    let mut b = Bytes::default();
    b.u64(0x1000).u64(u64::MAX / 4).u64(PERF_CONTEXT_USER);
    let file = one_event(PERF_SAMPLE_IP | PERF_SAMPLE_CALLCHAIN)
        .record(SAMPLE, MISC_USER, &b.take())
        .build();
    let err = parse(&file).unwrap_err().to_string();
    assert!(
        err.contains("truncated callchain of PERF_RECORD_SAMPLE"),
        "{err}"
    );
}

/// Two events told apart by identifier, a COMM with a trailer and features: with
/// [`every_field_file`], the seeds for mutation fuzzing.
fn two_event_file() -> Vec<u8> {
    let mut cycles = Bytes::default();
    cycles.u64(11).u64(0x1000).u32(1).u32(1).u64(100).u64(4001);
    let mut comm = Bytes::default();
    comm.u32(1)
        .u32(2)
        .c_string("worker")
        .u32(1)
        .u32(2)
        .u64(150)
        .u64(20);
    two_events_with_identifier()
        .record(SAMPLE, MISC_USER, &cycles.take())
        .record(3, 0, &comm.take())
        .feature(3, {
            let mut b = Bytes::default();
            b.string("host");
            b.take()
        })
        .feature(12, event_desc(&[("cycles", &[10, 11]), ("loads", &[20])]))
        .build()
}

/// What parsing these kilobyte files may hold at once: the parsed records, a few times the file.
const MEMORY_BOUND: usize = 1 << 20;

/// Sizes, counts and offsets no file of this size holds.
const HUGE: [u64; 6] = [
    0xffff,
    0x7fff_ffff,
    u32::MAX as u64,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];

fn parse_within_bound(file: &[u8]) {
    let (_, peak) = crate::alloc_meter::peak_bytes(|| parse(file));
    assert!(peak < MEMORY_BOUND, "parsing held {peak} bytes");
}

/// Structure-aware: every 16-, 32- and 64-bit field position of the seed files (header
/// sections, attr sizes and id counts, record sizes, callchain and branch counts, RAW and
/// stack sizes, feature lengths) in turn set to each huge value.
#[test]
fn huge_sizes_and_counts_at_every_field_fail_within_the_memory_bound() {
    for seed in [two_event_file(), every_field_file()] {
        for width in [2, 4, 8] {
            for at in 0..=seed.len() - width {
                for huge in HUGE {
                    let mut file = seed.clone();
                    file[at..at + width].copy_from_slice(&huge.to_le_bytes()[..width]);
                    parse_within_bound(&file);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Several huge fields and random bytes at once, and a cut.
    #[test]
    fn mutated_sizes_and_counts_fail_within_the_memory_bound(
        seed in any::<bool>(),
        edits in proptest::collection::vec(
            (any::<prop::sample::Index>(), any::<u8>(), 0..HUGE.len() + 1),
            1..6,
        ),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut file = if seed { two_event_file() } else { every_field_file() };
        for (at, byte, huge) in edits {
            let at = at.index(file.len() - 7);
            match HUGE.get(huge) {
                Some(huge) => file[at..at + 8].copy_from_slice(&huge.to_le_bytes()),
                None => file[at] = byte,
            }
        }
        parse_within_bound(&file[..cut.index(file.len() + 1)]);
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&bytes);
    }

    #[test]
    fn random_bytes_after_a_valid_magic_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..1024)
    ) {
        let mut file = b"PERFILE2".to_vec();
        file.extend_from_slice(&bytes);
        let _ = parse(&file);
    }

    #[test]
    fn mutated_files_never_panic(
        seed in any::<bool>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut file = if seed { two_event_file() } else { every_field_file() };
        for (at, value) in flips {
            let i = at.index(file.len());
            file[i] = value;
        }
        let _ = parse(&file);
        let _ = parse(&file[..cut.index(file.len())]);
    }
}
