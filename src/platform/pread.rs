//! Positioned reads: exactly `buf.len()` bytes at a byte offset of a file that several threads
//! read at once, without a shared cursor.
//!
//! Unix uses `pread` (`FileExt::read_exact_at`). Windows uses `seek_read` in a loop: it reads at
//! the given offset whatever the cursor is (it does move the cursor, which nothing here relies on).
//! Elsewhere the call fails with [`std::io::ErrorKind::Unsupported`] and a message naming the
//! alternative (memory-mapped reads).

use std::fs::File;
use std::io;

/// Whether [`read_exact_at`] works on this OS.
pub const SUPPORTED: bool = cfg!(any(unix, windows));

/// Fill `buf` from `file` starting at byte `offset`; an end of file before `buf` is full is
/// [`io::ErrorKind::UnexpectedEof`].
#[cfg(unix)]
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    file.read_exact_at(buf, offset)
}

/// Fill `buf` from `file` starting at byte `offset`; an end of file before `buf` is full is
/// [`io::ErrorKind::UnexpectedEof`].
#[cfg(windows)]
pub fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt as _;
    while !buf.is_empty() {
        match file.seek_read(buf, offset) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "failed to fill whole buffer",
                ));
            }
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Positioned reads are not available on this OS: always an `Unsupported` error.
#[cfg(not(any(unix, windows)))]
pub fn read_exact_at(_file: &File, _buf: &mut [u8], _offset: u64) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "positioned file reads are not supported on this OS; use memory-mapped reads \
         (--ple-io mmap)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn reads_exactly_at_the_offset_and_reports_a_short_file() {
        let path = std::env::temp_dir().join(format!("strata-pread-{}", std::process::id()));
        let mut file = File::create(&path).expect("create");
        file.write_all(&(0u8..100).collect::<Vec<_>>())
            .expect("write");
        drop(file);
        let file = File::open(&path).expect("open");
        let mut buf = [0u8; 10];
        if SUPPORTED {
            read_exact_at(&file, &mut buf, 37).expect("read");
            assert_eq!(buf, [37, 38, 39, 40, 41, 42, 43, 44, 45, 46]);
            let err = read_exact_at(&file, &mut buf, 95).expect_err("past the end");
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        } else {
            let err = read_exact_at(&file, &mut buf, 0).expect_err("unsupported");
            assert_eq!(err.kind(), io::ErrorKind::Unsupported);
        }
        let _ = std::fs::remove_file(&path);
    }
}
