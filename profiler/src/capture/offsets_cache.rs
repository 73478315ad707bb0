//! The running kernel's structure offsets, kept for the boot: reading and indexing its BTF
//! (about 6 MB here) took 16 ms of every recording's start, for fourteen numbers that cannot
//! change until the next boot.

use anyhow::{bail, Result};
use profiler_common::capture::KernelOffsets;

use super::btf::{Btf, BtfError, KERNEL_BTF_PATH};
use crate::disk_cache::{end_file, start_file, CacheBytes, CacheDir, CacheFields};

/// The cache's one file (in the kernel cache directory, beside the kernel's functions): a
/// later boot replaces it.
const CACHE_FILE: &str = "offsets";
const CACHE_MAGIC: &[u8; 8] = b"PRFKOFFS";
const CACHE_VERSION: u32 = 6;
/// Far above a key and fourteen numbers.
const MAX_CACHE_FILE: u64 = 4096;

/// The offsets the capture program needs in the running kernel: this boot's cached ones, else
/// read from /sys/kernel/btf/vmlinux (and cached).
pub fn running_kernel_offsets() -> Result<KernelOffsets, BtfError> {
    running_kernel_offsets_cached(CacheDir::default_for("kernel").as_ref(), boot_key())
}

fn running_kernel_offsets_cached(
    cache: Option<&CacheDir>,
    key: Option<Vec<u8>>,
) -> Result<KernelOffsets, BtfError> {
    let cache = cache.zip(key.as_deref());
    if let Some((cache, key)) = cache {
        match load(cache, key) {
            Ok(Some(offsets)) => return Ok(offsets),
            Ok(None) => {}
            Err(error) => eprintln!(
                "note: kernel-offset cache {}: {error:#}; it is ignored and rewritten",
                cache.path().join(CACHE_FILE).display()
            ),
        }
    }
    let offsets = Btf::from_sys_fs()?.kernel_offsets()?;
    if let Some((cache, key)) = cache {
        if let Err(error) = cache.write("kernel-offset cache", CACHE_FILE, &encode(key, &offsets)) {
            eprintln!("note: kernel-offset cache: {error:#}");
        }
    }
    Ok(offsets)
}

/// What names this boot's kernel: its boot ID, and the size of its BTF, which a kernel built
/// otherwise would hardly share. `None` when either cannot be read (nothing is cached then).
fn boot_key() -> Option<Vec<u8>> {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let btf_len = std::fs::metadata(KERNEL_BTF_PATH).ok()?.len();
    Some(format!("boot {}\nbtf {btf_len}\n", boot_id.trim()).into_bytes())
}

fn load(cache: &CacheDir, key: &[u8]) -> Result<Option<KernelOffsets>> {
    match cache.read(CACHE_FILE, MAX_CACHE_FILE)? {
        Some(bytes) => decode(&bytes, key),
        None => Ok(None),
    }
}

/// Key, the offsets as words, CRC-32.
fn encode(key: &[u8], offsets: &KernelOffsets) -> Vec<u8> {
    let words = offsets.to_words();
    let mut out = start_file(CACHE_MAGIC, CACHE_VERSION, key, 4 * words.len());
    for word in words {
        out.extend_from_slice(&word.to_le_bytes());
    }
    end_file(out)
}

/// The offsets a cache file holds, `None` when it was written for another boot than `key`'s;
/// refused when damaged.
fn decode(bytes: &[u8], key: &[u8]) -> Result<Option<KernelOffsets>> {
    let Some(mut r) =
        CacheBytes::checked(bytes, CACHE_MAGIC, CACHE_VERSION, "a kernel-offset", key)?
    else {
        return Ok(None);
    };
    let mut words = [0; KernelOffsets::WORDS];
    for word in &mut words {
        *word = r.u32("offset")?;
    }
    if !r.rest().is_empty() {
        bail!("{} bytes after the offsets", r.rest().len());
    }
    Ok(Some(KernelOffsets::from_words(words)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running_kernel_key() -> Vec<u8> {
        boot_key().expect("the boot ID and the kernel's BTF (this test needs BTF)")
    }

    #[test]
    fn the_cache_gives_the_offsets_read_from_btf_for_this_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path().join("kernel"));
        let from_btf = Btf::from_sys_fs()
            .and_then(|btf| btf.kernel_offsets())
            .expect("the kernel's BTF");
        let key = running_kernel_key();
        let first = running_kernel_offsets_cached(Some(&cache), Some(key.clone())).unwrap();
        assert_eq!(first, from_btf);
        assert!(
            cache.path().join(CACHE_FILE).is_file(),
            "the first read caches"
        );
        // A planted value proves the second read comes from the cache...
        let planted = KernelOffsets {
            ctx_data: from_btf.ctx_data + 8,
            ..from_btf
        };
        cache
            .write("test", CACHE_FILE, &encode(&key, &planted))
            .unwrap();
        let cached = running_kernel_offsets_cached(Some(&cache), Some(key.clone())).unwrap();
        assert_eq!(cached, planted);
        // ...and another boot's is not used, but replaced.
        let other_boot = b"boot another\nbtf 1\n".to_vec();
        let reread = running_kernel_offsets_cached(Some(&cache), Some(other_boot.clone())).unwrap();
        assert_eq!(reread, from_btf);
        assert_eq!(
            load(&cache, &other_boot).unwrap(),
            Some(from_btf),
            "rewritten for the other boot"
        );
        assert_eq!(load(&cache, &key).unwrap(), None);
    }

    #[test]
    fn damaged_cache_files_are_refused_and_btf_read_instead() {
        let offsets = KernelOffsets {
            valid: 1,
            ctx_data: 8,
            raw_frag_size: 112,
            ..KernelOffsets::default()
        };
        let key = b"boot b\nbtf 7\n";
        let file = encode(key, &offsets);
        assert_eq!(decode(&file, key).unwrap(), Some(offsets));
        for len in 0..file.len() {
            assert!(decode(&file[..len], key).is_err(), "truncated at {len}");
        }
        let mut flipped = file.clone();
        flipped[20] ^= 1;
        let error = decode(&flipped, key).unwrap_err().to_string();
        assert!(error.contains("checksum"), "{error}");
        // Re-framed with a valid CRC: one word short, one word more.
        let body = &file[..file.len() - 4];
        for body in [&body[..body.len() - 4], &[body, &[0; 4]].concat()[..]] {
            assert!(decode(&end_file(body.to_vec()), key).is_err());
        }
        // The profiler goes on with the offsets from BTF, and rewrites the file.
        let dir = tempfile::tempdir().unwrap();
        let cache = CacheDir::new(dir.path().join("kernel"));
        let key = running_kernel_key();
        cache.write("test", CACHE_FILE, &flipped).unwrap();
        let read = running_kernel_offsets_cached(Some(&cache), Some(key.clone())).unwrap();
        assert_eq!(
            Some(read),
            Btf::from_sys_fs().and_then(|b| b.kernel_offsets()).ok()
        );
        assert_eq!(load(&cache, &key).unwrap(), Some(read));
    }
}
