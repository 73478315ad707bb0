//! Bounds-checked little-endian reads over a slice of the file: every read either succeeds or
//! returns a [`PerfDataError::Truncated`] naming the field and its file offset, so no input can
//! make the parser index out of bounds or allocate more than the file holds.

use super::error::PerfDataError;

pub(super) struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    /// File offset of `data[0]`, for error messages.
    base: u64,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8], base: u64) -> Self {
        Self { data, pos: 0, base }
    }

    /// File offset of the next byte to be read.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub fn bytes(&mut self, len: u64, what: &str) -> Result<&'a [u8], PerfDataError> {
        let truncated = || PerfDataError::Truncated {
            what: what.to_string(),
            offset: self.offset(),
            needed: len,
            remaining: self.remaining() as u64,
        };
        let len = usize::try_from(len).map_err(|_| truncated())?;
        if len > self.remaining() {
            return Err(truncated());
        }
        let out = &self.data[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], PerfDataError> {
        let mut out = [0; N];
        out.copy_from_slice(self.bytes(N as u64, what)?);
        Ok(out)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, PerfDataError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u16(&mut self, what: &str) -> Result<u16, PerfDataError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, PerfDataError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub fn i32(&mut self, what: &str) -> Result<i32, PerfDataError> {
        self.array(what).map(i32::from_le_bytes)
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, PerfDataError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// `count` u64 values; the length is checked before anything is allocated.
    pub fn u64_array(&mut self, count: u64, what: &str) -> Result<Vec<u64>, PerfDataError> {
        let len = count
            .checked_mul(8)
            .ok_or_else(|| PerfDataError::Truncated {
                what: what.to_string(),
                offset: self.offset(),
                needed: u64::MAX,
                remaining: self.remaining() as u64,
            })?;
        Ok(self
            .bytes(len, what)?
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().expect("chunks of 8 bytes")))
            .collect())
    }

    /// The rest of this reader.
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.data[self.pos..];
        self.pos = self.data.len();
        rest
    }
}

/// `bytes` before the first NUL (file names and comms in records are NUL-padded).
pub fn until_nul(bytes: &[u8]) -> &[u8] {
    // CStr's search is the C library's memchr: the side-band reads a path per mapping.
    std::ffi::CStr::from_bytes_until_nul(bytes).map_or(bytes, |text| text.to_bytes())
}

/// The text before the first NUL, with invalid UTF-8 replaced rather than rejected: paths and
/// command names are not guaranteed to be UTF-8.
pub(super) fn c_string(bytes: &[u8]) -> String {
    String::from_utf8_lossy(until_nul(bytes)).into_owned()
}

/// `len` bytes of `file` at `offset`, or a [`PerfDataError::Truncated`] naming `what`.
pub(super) fn slice_at<'a>(
    file: &'a [u8],
    offset: u64,
    len: u64,
    what: &str,
) -> Result<&'a [u8], PerfDataError> {
    let range = usize::try_from(offset).ok().and_then(|start| {
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        (end <= file.len()).then_some(start..end)
    });
    range
        .map(|range| &file[range])
        .ok_or_else(|| PerfDataError::Truncated {
            what: what.to_string(),
            offset,
            needed: len,
            remaining: (file.len() as u64).saturating_sub(offset),
        })
}
