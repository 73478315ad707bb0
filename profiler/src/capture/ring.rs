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

    /// Hands every ready record of at least `T`'s size to `each`, as a `T`.
    pub fn for_each<T: aya::Pod>(&mut self, mut each: impl FnMut(T) -> Result<()>) -> Result<()> {
        let ring = self.ring.get_mut();
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<T>() {
                continue;
            }
            // SAFETY: the length was checked above and `T: Pod` is valid for any bytes;
            // read_unaligned has no alignment needs.
            let record = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const T) };
            drop(item);
            each(record)?;
        }
        Ok(())
    }
}
