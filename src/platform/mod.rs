//! Operating-system specifics, one module per concern, each with a Unix, a Windows and a fallback
//! implementation (or a clear "not supported on this OS" error), so the rest of the crate builds
//! and behaves the same everywhere:
//!
//! * [`pread`]: positioned reads of a shared file (`pread` / `seek_read`).
//! * [`memory`]: page-cache hints for memory maps (`madvise`), pinning memory in RAM (`mlock`) and
//!   the memory still available (Linux's `MemAvailable`).

pub mod memory;
pub mod pread;
