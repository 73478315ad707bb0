//! A perf.data writer for tests: files laid out by hand from the kernel's format description
//! (tools/perf/Documentation/perf.data-file-format.txt), independent of perf's own writer.

/// Little-endian byte builder.
#[derive(Default)]
pub(crate) struct Bytes(pub(crate) Vec<u8>);

impl Bytes {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    /// `struct perf_header_string`, NUL-padded to 8 bytes as perf does (it pads to 64).
    pub(crate) fn string(&mut self, s: &str) -> &mut Self {
        let padded = (s.len() + 1).next_multiple_of(8);
        self.u32(padded as u32).raw(s.as_bytes());
        self.0.resize(self.0.len() + padded - s.len(), 0);
        self
    }
    /// A NUL-terminated name padded to 8 bytes, as in MMAP and COMM records.
    pub(crate) fn c_string(&mut self, s: &str) -> &mut Self {
        let padded = (s.len() + 1).next_multiple_of(8);
        self.raw(s.as_bytes());
        self.0.resize(self.0.len() + padded - s.len(), 0);
        self
    }
    pub(crate) fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// The attr fields the tests vary; the rest stay zero.
#[derive(Clone, Default)]
pub(crate) struct AttrSpec {
    pub(crate) event_type: u32,
    pub(crate) config: u64,
    pub(crate) period: u64,
    pub(crate) sample_type: u64,
    pub(crate) read_format: u64,
    pub(crate) flags: u64,
    pub(crate) config1: u64,
    pub(crate) config2: u64,
    pub(crate) branch_sample_type: u64,
    pub(crate) sample_regs_user: u64,
    pub(crate) sample_stack_user: u32,
    pub(crate) sample_regs_intr: u64,
    pub(crate) ids: Vec<u64>,
}

impl AttrSpec {
    /// A 128-byte `struct perf_event_attr` (PERF_ATTR_SIZE_VER7), as perf 6.1 writes it.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Bytes::default();
        b.u32(self.event_type)
            .u32(128)
            .u64(self.config)
            .u64(self.period)
            .u64(self.sample_type)
            .u64(self.read_format)
            .u64(self.flags)
            .u32(0) // wakeup_events
            .u32(0) // bp_type
            .u64(self.config1)
            .u64(self.config2)
            .u64(self.branch_sample_type)
            .u64(self.sample_regs_user)
            .u32(self.sample_stack_user)
            .u32(0) // clockid
            .u64(self.sample_regs_intr)
            .u32(0) // aux_watermark
            .u16(0) // sample_max_stack
            .u16(0)
            .u32(0) // aux_sample_size
            .u32(0)
            .u64(0); // sig_data
        assert_eq!(b.0.len(), 128);
        b.take()
    }
}

/// Lays out a perf.data file: header, attrs, their ids, data records, feature sections.
#[derive(Default)]
pub(crate) struct FileBuilder {
    attrs: Vec<AttrSpec>,
    pub(crate) data: Vec<u8>,
    features: Vec<(u32, Vec<u8>)>,
}

impl FileBuilder {
    pub(crate) fn attr(mut self, attr: AttrSpec) -> Self {
        self.attrs.push(attr);
        self
    }

    pub(crate) fn record(mut self, record_type: u32, misc: u16, body: &[u8]) -> Self {
        let size = u16::try_from(8 + body.len()).expect("record fits in u16");
        self.data.extend_from_slice(&record_type.to_le_bytes());
        self.data.extend_from_slice(&misc.to_le_bytes());
        self.data.extend_from_slice(&size.to_le_bytes());
        self.data.extend_from_slice(body);
        self
    }

    pub(crate) fn feature(mut self, bit: u32, payload: Vec<u8>) -> Self {
        self.features.push((bit, payload));
        self
    }

    pub(crate) fn build(mut self) -> Vec<u8> {
        const HEADER: u64 = 104;
        const ATTR_ENTRY: u64 = 128 + 16;
        self.features.sort_by_key(|(bit, _)| *bit);
        let attrs_offset = HEADER;
        let ids_offset = attrs_offset + ATTR_ENTRY * self.attrs.len() as u64;
        let ids_len: u64 = self.attrs.iter().map(|a| 8 * a.ids.len() as u64).sum();
        let data_offset = ids_offset + ids_len;
        let data_len = self.data.len() as u64;

        let mut feature_bits = [0u64; 4];
        for (bit, _) in &self.features {
            feature_bits[*bit as usize / 64] |= 1 << (bit % 64);
        }
        let mut f = Bytes::default();
        f.raw(b"PERFILE2").u64(HEADER).u64(ATTR_ENTRY);
        f.u64(attrs_offset)
            .u64(ATTR_ENTRY * self.attrs.len() as u64);
        f.u64(data_offset).u64(data_len);
        f.u64(0).u64(0);
        for word in feature_bits {
            f.u64(word);
        }
        let mut next_ids = ids_offset;
        for attr in &self.attrs {
            f.raw(&attr.encode());
            f.u64(next_ids).u64(8 * attr.ids.len() as u64);
            next_ids += 8 * attr.ids.len() as u64;
        }
        for attr in &self.attrs {
            for &id in &attr.ids {
                f.u64(id);
            }
        }
        f.raw(&self.data);
        let table_len = 16 * self.features.len() as u64;
        let mut payload_offset = data_offset + data_len + table_len;
        for (_, payload) in &self.features {
            f.u64(payload_offset).u64(payload.len() as u64);
            payload_offset += payload.len() as u64;
        }
        for (_, payload) in &self.features {
            f.raw(payload);
        }
        f.take()
    }
}

/// An EVENT_DESC feature section: each event's name and sample ids.
pub(crate) fn event_desc(events: &[(&str, &[u64])]) -> Vec<u8> {
    let mut b = Bytes::default();
    b.u32(events.len() as u32).u32(128);
    for (name, ids) in events {
        b.raw(&AttrSpec::default().encode())
            .u32(ids.len() as u32)
            .string(name);
        for &id in *ids {
            b.u64(id);
        }
    }
    b.take()
}
