//! Memory-map hints and pinning, and how much memory the host can still give.
//!
//! Page-cache hints (`madvise`) are advisory: on Unix they go to the kernel, elsewhere they are
//! accepted and ignored (`Ok`), since a missing hint only costs read-ahead efficiency. Locking
//! memory in RAM (`mlock`) is a promise to the user (`--experts ram-locked`), so where it is not
//! implemented it fails with [`std::io::ErrorKind::Unsupported`] and callers report it.

use std::io;

use memmap2::Mmap;

/// How a mapped range is about to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessHint {
    /// Random access: read-ahead would only waste page cache.
    Random,
    /// The range is needed soon: start reading it in.
    WillNeed,
}

#[cfg(unix)]
fn advice(hint: AccessHint) -> memmap2::Advice {
    match hint {
        AccessHint::Random => memmap2::Advice::Random,
        AccessHint::WillNeed => memmap2::Advice::WillNeed,
    }
}

/// Hint how the whole map will be read (`madvise` on Unix; a no-op elsewhere).
pub fn advise(map: &Mmap, hint: AccessHint) -> io::Result<()> {
    #[cfg(unix)]
    {
        map.advise(advice(hint))
    }
    #[cfg(not(unix))]
    {
        let _ = (map, hint);
        Ok(())
    }
}

/// Hint how `len` bytes at `offset` of the map will be read (`madvise` on Unix; a no-op elsewhere).
pub fn advise_range(map: &Mmap, hint: AccessHint, offset: usize, len: usize) -> io::Result<()> {
    #[cfg(unix)]
    {
        map.advise_range(advice(hint), offset, len)
    }
    #[cfg(not(unix))]
    {
        let _ = (map, hint, offset, len);
        Ok(())
    }
}

/// Whether [`lock`] can work on this OS.
pub const LOCK_SUPPORTED: bool = cfg!(unix);

/// Lock the map's pages in RAM (`mlock` on Unix). Elsewhere an `Unsupported` error.
pub fn lock(map: &Mmap) -> io::Result<()> {
    #[cfg(unix)]
    {
        map.lock()
    }
    #[cfg(not(unix))]
    {
        let _ = map;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "locking memory in RAM (mlock) is not supported on this OS",
        ))
    }
}

/// Memory the host can still give without swapping: `MemAvailable` of `/proc/meminfo` on Linux;
/// `None` elsewhere (and where the file cannot be read), so callers try and report a failed
/// allocation instead.
#[cfg(target_os = "linux")]
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Memory the host can still give: not queried on this OS yet.
#[cfg(not(target_os = "linux"))]
pub fn available_bytes() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use memmap2::MmapMut;

    #[test]
    fn hints_are_accepted_and_lock_says_what_it_did() {
        let mut map = MmapMut::map_anon(8192).expect("anonymous map");
        map[0] = 1;
        let map = map.make_read_only().expect("read-only");
        advise(&map, AccessHint::Random).expect("hint");
        advise_range(&map, AccessHint::WillNeed, 0, 4096).expect("range hint");
        // RLIMIT_MEMLOCK may refuse it on Unix; elsewhere it must say it is unsupported.
        let kind = lock(&map).err().map(|e| e.kind());
        if LOCK_SUPPORTED {
            assert_ne!(kind, Some(io::ErrorKind::Unsupported));
        } else {
            assert_eq!(kind, Some(io::ErrorKind::Unsupported));
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn available_memory_is_known_on_linux() {
        let bytes = super::available_bytes().expect("MemAvailable");
        assert!(bytes > 1 << 20, "{bytes} bytes available");
    }
}
