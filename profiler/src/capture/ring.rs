//! Reading a BPF ring buffer from the agent's event loop: wait until the kernel signals data,
//! then take every record that is ready.

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use tokio::io::{unix::AsyncFd, Interest};

pub struct KernelRing {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl KernelRing {
    pub fn new(ring: RingBuf<MapData>) -> Result<KernelRing> {
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as long as
        // the AsyncFd owns the ring buffer.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("polling a ring buffer of the capture program: {e}"))?;
        Ok(KernelRing { ring })
    }

    /// Waits until the kernel signals records.
    pub async fn readable(&self) -> std::io::Result<()> {
        let mut guard = self.ring.readable().await?;
        // Cleared before reading everything: data arriving meanwhile wakes us again.
        guard.clear_ready();
        Ok(())
    }

    /// Hands up to `most` ready records of at least `T`'s size to `each`, as `T`s; the records
    /// taken from the ring.
    pub fn for_each<T: aya::Pod>(
        &mut self,
        most: usize,
        mut each: impl FnMut(T) -> Result<()>,
    ) -> Result<usize> {
        self.for_each_bytes(most, |bytes| {
            if bytes.len() < std::mem::size_of::<T>() {
                return Ok(());
            }
            // SAFETY: the length was checked above and `T: Pod` is valid for any bytes;
            // read_unaligned has no alignment needs.
            each(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
        })
    }

    /// Hands up to `most` ready records to `each` as the bytes they are (records of variable
    /// length); the records taken from the ring.
    pub fn for_each_bytes(
        &mut self,
        most: usize,
        mut each: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<usize> {
        let ring = self.ring.get_mut();
        let mut taken = 0;
        while taken < most {
            let Some(item) = ring.next() else {
                break;
            };
            taken += 1;
            each(&item)?;
        }
        Ok(taken)
    }
}
