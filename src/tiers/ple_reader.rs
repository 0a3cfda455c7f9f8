//! Checked row gathers from the PLE n-gram table (`per_layer_token_embd.weight`, 28.8 GB in the real
//! IQ3_S model, so it stays on disk and is read by row).
//!
//! Why every row is checked where it enters: the original engine's direct-I/O PLE reader produced
//! non-finite embeddings (issue #879) that surfaced layers later as "the model's output became NaN",
//! after they had poisoned the recurrent state, with nothing pointing at the reader. Here each row
//! read from the file passes [`quant::check_finite`] before it is used or cached, and a bad row is
//! an error naming the row, the token position and the file offset; the request fails, the reader
//! stays usable.
//!
//! Two I/O modes, both plain and exact: [`IoMode::Mmap`] copies from a read-only map of the table,
//! [`IoMode::Read`] uses positioned reads (`pread`) of exactly the row's bytes. No O_DIRECT: its
//! alignment rules (offset, length and buffer at 4 KiB multiples while 90-byte rows cross page
//! boundaries) are where the original's bug was born, and the page cache is the RAM tier anyway.
//! With `verify_reads` each row is also read through the other path and compared byte for byte.
//!
//! A bounded LRU row cache (capacity in rows) holds checked rows; the cache is locked only to look
//! rows up and to insert them, never during I/O, so several threads can gather at once.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{Mmap, MmapOptions};

use crate::platform::memory::{self, AccessHint};
use crate::platform::pread;

use crate::gguf::{GgmlType, Gguf};
use crate::quant::{self, QuantError};

use super::plan::PLE_TABLE_TENSOR;

/// Default row-cache capacity: 1 Mi rows (90 MiB for the real table's 90-byte rows).
pub const DEFAULT_CACHE_ROWS: usize = 1 << 20;

/// How rows are read from the file (`--ple-io`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Copy from a read-only memory map of the table (the page cache serves repeats).
    #[default]
    Mmap,
    /// Positioned reads (`pread`) of exactly one row each.
    Read,
}

/// Where the table is: a file, the byte offset of row 0, and the row geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PleTable {
    pub path: PathBuf,
    /// Absolute offset of row 0 in `path`.
    pub offset: u64,
    pub row_bytes: usize,
    pub n_rows: u64,
    pub ty: GgmlType,
}

impl PleTable {
    /// The PLE table of a GGUF opened from disk (any shard of a split model).
    pub fn from_gguf(gguf: &Gguf) -> Result<PleTable, PleReadError> {
        let bad = |problem: String| PleReadError::BadTable {
            file: gguf.name().to_string(),
            problem,
        };
        let tensor = gguf
            .tensor(PLE_TABLE_TENSOR)
            .ok_or_else(|| bad(format!("has no {PLE_TABLE_TENSOR}")))?;
        let path = gguf
            .shard_paths()
            .get(tensor.shard)
            .cloned()
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or_else(|| {
                bad("is not a file on disk; the PLE reader reads the table from its file".into())
            })?;
        let row_bytes = usize::try_from(tensor.row_bytes())
            .ok()
            .filter(|&r| r > 0)
            .ok_or_else(|| bad(format!("{PLE_TABLE_TENSOR} has no usable row size")))?;
        Ok(PleTable {
            path,
            offset: tensor.offset,
            row_bytes,
            n_rows: tensor.n_rows(),
            ty: tensor.ty,
        })
    }

    /// Absolute file offset of `row` (callers check the row is in range first).
    pub fn row_offset(&self, row: u64) -> u64 {
        self.offset + row * self.row_bytes as u64
    }

    fn n_bytes(&self) -> Option<u64> {
        self.n_rows.checked_mul(self.row_bytes as u64)
    }
}

/// Reader settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PleReaderOptions {
    pub mode: IoMode,
    /// Rows kept in the LRU row cache; 0 disables it.
    pub cache_rows: usize,
    /// Read every row a second time through the other I/O path and compare the bytes (a
    /// diagnostic for suspected I/O corruption; doubles the reads).
    pub verify_reads: bool,
}

impl Default for PleReaderOptions {
    fn default() -> Self {
        PleReaderOptions {
            mode: IoMode::Mmap,
            cache_rows: DEFAULT_CACHE_ROWS,
            verify_reads: false,
        }
    }
}

/// What went wrong reading PLE rows. Display names the row, token position and file offset.
#[derive(Debug, thiserror::Error)]
pub enum PleReadError {
    #[error("PLE table in {file}: {problem}")]
    BadTable { file: String, problem: String },
    #[error("{file}: {error}")]
    Open { file: String, error: std::io::Error },
    #[error(
        "PLE row {row} (token position {position}) is out of range: the table has {n_rows} rows"
    )]
    RowOutOfRange {
        row: u64,
        position: usize,
        n_rows: u64,
    },
    #[error(
        "PLE row {row} (token position {position}) at byte offset {offset} of {file}: non-finite \
         {field} in block {block} ({ty}); the file is damaged or was read wrongly"
    )]
    NonFinite {
        row: u64,
        position: usize,
        file: String,
        offset: u64,
        block: usize,
        field: &'static str,
        ty: GgmlType,
    },
    #[error(
        "PLE row {row} (token position {position}) at byte offset {offset} of {file}: the memory \
         map and a positioned read returned different bytes"
    )]
    Mismatch {
        row: u64,
        position: usize,
        file: String,
        offset: u64,
    },
    #[error(
        "PLE row {row} (token position {position}) at byte offset {offset} of {file}: read failed: {error}"
    )]
    Io {
        row: u64,
        position: usize,
        file: String,
        offset: u64,
        error: std::io::Error,
    },
    #[error("PLE row {row} (token position {position}): {error}")]
    Quant {
        row: u64,
        position: usize,
        error: QuantError,
    },
    #[error(
        "PLE gather: {rows} rows for {positions} token positions (need one position per row or \
         an equal number of rows per position)"
    )]
    LengthMismatch { rows: usize, positions: usize },
}

/// Counters since the reader was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PleReaderStats {
    /// Rows requested by `gather`.
    pub rows_gathered: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Rows read from the file (misses and prefetches).
    pub rows_read: u64,
    pub bytes_read: u64,
    /// Rows currently in the cache.
    pub cached_rows: u64,
}

/// Bounded LRU of checked rows. Deterministic: the least recently used row is evicted; a row's
/// recency is the sequence number of the last lookup or insert that touched it.
struct RowCache {
    capacity: usize,
    row_bytes: usize,
    /// row → (slot in `data`, last-use stamp).
    index: HashMap<u64, (usize, u64)>,
    /// last-use stamp → row, oldest first.
    by_age: BTreeMap<u64, u64>,
    data: Vec<u8>,
    clock: u64,
}

impl RowCache {
    fn new(capacity: usize, row_bytes: usize) -> RowCache {
        RowCache {
            capacity,
            row_bytes,
            index: HashMap::new(),
            by_age: BTreeMap::new(),
            data: Vec::new(),
            clock: 0,
        }
    }

    fn touch(&mut self, row: u64) -> Option<usize> {
        let entry = self.index.get_mut(&row)?;
        self.by_age.remove(&entry.1);
        self.clock += 1;
        entry.1 = self.clock;
        self.by_age.insert(self.clock, row);
        Some(entry.0)
    }

    fn get(&mut self, row: u64) -> Option<&[u8]> {
        let slot = self.touch(row)?;
        let start = slot * self.row_bytes;
        self.data.get(start..start + self.row_bytes)
    }

    fn insert(&mut self, row: u64, bytes: &[u8]) {
        if self.capacity == 0 || bytes.len() != self.row_bytes || self.touch(row).is_some() {
            return;
        }
        let slot = if self.index.len() < self.capacity {
            // Grow the arena only as rows arrive, so a large capacity costs nothing until used.
            let slot = self.index.len();
            self.data.extend_from_slice(bytes);
            slot
        } else {
            let Some((_, victim)) = self.by_age.pop_first() else {
                return;
            };
            let Some((slot, _)) = self.index.remove(&victim) else {
                return;
            };
            let start = slot * self.row_bytes;
            if let Some(target) = self.data.get_mut(start..start + self.row_bytes) {
                target.copy_from_slice(bytes);
            }
            slot
        };
        self.clock += 1;
        self.index.insert(row, (slot, self.clock));
        self.by_age.insert(self.clock, row);
    }
}

/// Gathers PLE table rows, checked, through the chosen I/O mode and an optional row cache.
/// All methods take `&self` and may be called from several threads at once.
pub struct PleRowReader {
    table: PleTable,
    file_name: String,
    options: PleReaderOptions,
    file: File,
    /// Map of exactly the table's bytes (mmap mode, or read mode with `verify_reads`).
    map: Option<Mmap>,
    cache: Option<Mutex<RowCache>>,
    rows_gathered: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    rows_read: AtomicU64,
    bytes_read: AtomicU64,
}

impl std::fmt::Debug for PleRowReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PleRowReader")
            .field("table", &self.table)
            .field("options", &self.options)
            .finish()
    }
}

impl PleRowReader {
    /// Open the table of a GGUF on disk.
    pub fn open_gguf(gguf: &Gguf, options: PleReaderOptions) -> Result<PleRowReader, PleReadError> {
        PleRowReader::open(PleTable::from_gguf(gguf)?, options)
    }

    /// Open a table at a known place in a file (a GGUF shard or a raw table).
    pub fn open(table: PleTable, options: PleReaderOptions) -> Result<PleRowReader, PleReadError> {
        let file_name = table.path.display().to_string();
        let bad = |problem: String| PleReadError::BadTable {
            file: file_name.clone(),
            problem,
        };
        if table.row_bytes == 0 || !table.row_bytes.is_multiple_of(table.ty.type_size()) {
            return Err(bad(format!(
                "rows of {} bytes are not whole {} blocks",
                table.row_bytes, table.ty
            )));
        }
        if !quant::is_supported(table.ty) {
            return Err(bad(format!("rows of type {} cannot be checked", table.ty)));
        }
        let open_error = |error| PleReadError::Open {
            file: file_name.clone(),
            error,
        };
        let file = File::open(&table.path).map_err(open_error)?;
        let file_len = file.metadata().map_err(open_error)?.len();
        let table_bytes = table
            .n_bytes()
            .ok_or_else(|| bad("table size overflows".to_string()))?;
        let end = table
            .offset
            .checked_add(table_bytes)
            .ok_or_else(|| bad("table end overflows".to_string()))?;
        if end > file_len {
            return Err(bad(format!(
                "the table needs bytes {}..{end}, but the file is {file_len} bytes long",
                table.offset
            )));
        }
        let needs_map = options.mode == IoMode::Mmap || options.verify_reads;
        let map = if needs_map && table_bytes > 0 {
            let len = usize::try_from(table_bytes)
                .map_err(|_| bad("table does not fit in the address space".to_string()))?;
            // SAFETY: a read-only private map; another process truncating or rewriting the model
            // file while it is served is outside what any mmap reader can guard against (the same
            // stance as the GGUF loader).
            let map = unsafe { MmapOptions::new().offset(table.offset).len(len).map(&file) }
                .map_err(open_error)?;
            // Rows are gathered at random; read-ahead would only waste page cache.
            let _ = memory::advise(&map, AccessHint::Random);
            Some(map)
        } else {
            None
        };
        let cache = (options.cache_rows > 0)
            .then(|| Mutex::new(RowCache::new(options.cache_rows, table.row_bytes)));
        Ok(PleRowReader {
            table,
            file_name,
            options,
            file,
            map,
            cache,
            rows_gathered: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
            rows_read: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        })
    }

    pub fn table(&self) -> &PleTable {
        &self.table
    }

    pub fn row_bytes(&self) -> usize {
        self.table.row_bytes
    }

    pub fn n_rows(&self) -> u64 {
        self.table.n_rows
    }

    pub fn options(&self) -> PleReaderOptions {
        self.options
    }

    pub fn stats(&self) -> PleReaderStats {
        let cached_rows = self
            .cache
            .as_ref()
            .map_or(0, |c| lock(c).index.len() as u64);
        PleReaderStats {
            rows_gathered: self.rows_gathered.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            cache_misses: self.cache_misses.load(Ordering::Relaxed),
            rows_read: self.rows_read.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            cached_rows,
        }
    }

    /// Append the raw bytes of every row in `rows` to `staging`, in order, each checked.
    ///
    /// `positions` gives the token position of each row for error messages: either one per row,
    /// or one per token when each token has the same number of rows (16 for the real model:
    /// `rows.len() == 16 * positions.len()`, the rows of token 0 first). On error `staging` is
    /// left as it was.
    pub fn gather(
        &self,
        rows: &[u64],
        positions: &[usize],
        staging: &mut Vec<u8>,
    ) -> Result<(), PleReadError> {
        let rows_per_position = rows_per_position(rows.len(), positions.len())?;
        let position_of = |i: usize| {
            positions
                .get(i / rows_per_position.max(1))
                .copied()
                .unwrap_or(0)
        };
        for (i, &row) in rows.iter().enumerate() {
            if row >= self.table.n_rows {
                return Err(PleReadError::RowOutOfRange {
                    row,
                    position: position_of(i),
                    n_rows: self.table.n_rows,
                });
            }
        }
        self.rows_gathered
            .fetch_add(rows.len() as u64, Ordering::Relaxed);

        let start = staging.len();
        let row_bytes = self.table.row_bytes;
        staging.resize(start + rows.len() * row_bytes, 0);
        let result = self.fill(rows, &position_of, &mut staging[start..]);
        if result.is_err() {
            staging.truncate(start);
        }
        result
    }

    /// [`gather`](Self::gather), then dequantize: appends `rows.len() × values_per_row` f32 values
    /// to `out` (the rows of a token concatenated = its PLE embedding, head 0 first). `raw` is a
    /// reusable scratch buffer for the row bytes (overwritten); `out` is left as it was on error.
    pub fn gather_dequantized(
        &self,
        rows: &[u64],
        positions: &[usize],
        raw: &mut Vec<u8>,
        out: &mut Vec<f32>,
    ) -> Result<(), PleReadError> {
        raw.clear();
        self.gather(rows, positions, raw)?;
        let values_per_row =
            self.table.row_bytes / self.table.ty.type_size() * self.table.ty.block_size();
        let start = out.len();
        out.resize(start + rows.len() * values_per_row, 0.0);
        quant::dequantize(self.table.ty, raw, &mut out[start..]).map_err(|error| {
            out.truncate(start);
            PleReadError::Quant {
                row: rows.first().copied().unwrap_or(0),
                position: positions.first().copied().unwrap_or(0),
                error,
            }
        })
    }

    fn fill(
        &self,
        rows: &[u64],
        position_of: &dyn Fn(usize) -> usize,
        out: &mut [u8],
    ) -> Result<(), PleReadError> {
        let row_bytes = self.table.row_bytes;
        // Rows to read from the file: (index in `rows`).
        let mut misses: Vec<usize> = Vec::new();
        match &self.cache {
            Some(cache) => {
                let mut cache = lock(cache);
                for (i, (&row, target)) in
                    rows.iter().zip(out.chunks_exact_mut(row_bytes)).enumerate()
                {
                    match cache.get(row) {
                        Some(bytes) => target.copy_from_slice(bytes),
                        None => misses.push(i),
                    }
                }
            }
            None => misses.extend(0..rows.len()),
        }
        let hits = rows.len() - misses.len();
        if self.cache.is_some() {
            self.cache_hits.fetch_add(hits as u64, Ordering::Relaxed);
            self.cache_misses
                .fetch_add(misses.len() as u64, Ordering::Relaxed);
        }
        for &i in &misses {
            let target = &mut out[i * row_bytes..(i + 1) * row_bytes];
            self.read_checked(rows[i], position_of(i), target)?;
        }
        if let Some(cache) = &self.cache {
            let mut cache = lock(cache);
            for &i in &misses {
                cache.insert(rows[i], &out[i * row_bytes..(i + 1) * row_bytes]);
            }
        }
        Ok(())
    }

    /// Read one in-range row from the file into `target` and check it.
    fn read_checked(
        &self,
        row: u64,
        position: usize,
        target: &mut [u8],
    ) -> Result<(), PleReadError> {
        let offset = self.table.row_offset(row);
        self.read_row(row, position, self.options.mode, target)?;
        if self.options.verify_reads {
            let other_mode = match self.options.mode {
                IoMode::Mmap => IoMode::Read,
                IoMode::Read => IoMode::Mmap,
            };
            let mut again = vec![0u8; target.len()];
            self.read_row(row, position, other_mode, &mut again)?;
            if again != target {
                return Err(PleReadError::Mismatch {
                    row,
                    position,
                    file: self.file_name.clone(),
                    offset,
                });
            }
        }
        self.rows_read.fetch_add(1, Ordering::Relaxed);
        self.bytes_read
            .fetch_add(target.len() as u64, Ordering::Relaxed);
        quant::check_finite(self.table.ty, target).map_err(|error| match error {
            QuantError::NonFinite { block, field, ty } => PleReadError::NonFinite {
                row,
                position,
                file: self.file_name.clone(),
                offset,
                block,
                field,
                ty,
            },
            error => PleReadError::Quant {
                row,
                position,
                error,
            },
        })
    }

    fn read_row(
        &self,
        row: u64,
        position: usize,
        mode: IoMode,
        target: &mut [u8],
    ) -> Result<(), PleReadError> {
        let offset = self.table.row_offset(row);
        let io_error = |error| PleReadError::Io {
            row,
            position,
            file: self.file_name.clone(),
            offset,
            error,
        };
        match (mode, &self.map) {
            (IoMode::Mmap, Some(map)) => {
                let start = usize::try_from(row * self.table.row_bytes as u64)
                    .map_err(|_| io_error(std::io::ErrorKind::InvalidInput.into()))?;
                let bytes = map
                    .get(start..start + target.len())
                    .ok_or_else(|| io_error(std::io::ErrorKind::UnexpectedEof.into()))?;
                target.copy_from_slice(bytes);
                Ok(())
            }
            _ => pread::read_exact_at(&self.file, target, offset).map_err(io_error),
        }
    }

    /// Warm rows that are about to be gathered (a prefill chunk's rows, known before layer 1 runs).
    ///
    /// Mmap mode asks the kernel to read the rows' pages ahead (`madvise(WILLNEED)`). Read mode
    /// reads the rows into the row cache when there is one (rows that fail their check are left
    /// out: `gather` reports them with their token position); without a cache it does nothing.
    /// Returns the number of rows handled.
    pub fn prefetch(&self, rows: &[u64]) -> Result<usize, PleReadError> {
        let mut wanted: Vec<u64> = rows
            .iter()
            .copied()
            .filter(|&r| r < self.table.n_rows)
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let row_bytes = self.table.row_bytes;
        match (self.options.mode, &self.map) {
            (IoMode::Mmap, Some(map)) => {
                for &row in &wanted {
                    // Rows are in range, so the range is inside the map; a refused hint is harmless.
                    let start = (row * row_bytes as u64) as usize;
                    let _ = memory::advise_range(map, AccessHint::WillNeed, start, row_bytes);
                }
                Ok(wanted.len())
            }
            _ => {
                let Some(cache) = &self.cache else {
                    return Ok(0);
                };
                // Rows already cached are touched, so inserting the missing ones cannot evict
                // them before the gather that follows.
                let missing: Vec<u64> = {
                    let mut cache = lock(cache);
                    wanted
                        .into_iter()
                        .filter(|&r| cache.touch(r).is_none())
                        .collect()
                };
                let mut buffer = vec![0u8; row_bytes];
                let mut fetched = 0;
                for row in missing {
                    if self.read_checked(row, 0, &mut buffer).is_ok() {
                        lock(cache).insert(row, &buffer);
                        fetched += 1;
                    }
                }
                Ok(fetched)
            }
        }
    }

    /// The file this reader reads.
    pub fn path(&self) -> &Path {
        &self.table.path
    }
}

/// A poisoned lock only means another thread panicked mid-update of a cache of verified rows;
/// every entry is still a checked copy of the file, so keep using it.
fn lock(cache: &Mutex<RowCache>) -> std::sync::MutexGuard<'_, RowCache> {
    cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn rows_per_position(rows: usize, positions: usize) -> Result<usize, PleReadError> {
    if rows == 0 {
        return Ok(1);
    }
    if positions == 0 || !rows.is_multiple_of(positions) {
        return Err(PleReadError::LengthMismatch { rows, positions });
    }
    Ok(rows / positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_cache_evicts_least_recently_used() {
        let mut cache = RowCache::new(2, 1);
        cache.insert(10, &[1]);
        cache.insert(20, &[2]);
        assert_eq!(cache.get(10), Some(&[1u8][..])); // 10 is now newer than 20
        cache.insert(30, &[3]); // evicts 20
        assert_eq!(cache.get(20), None);
        assert_eq!(cache.get(10), Some(&[1u8][..]));
        assert_eq!(cache.get(30), Some(&[3u8][..]));
        cache.insert(40, &[4]); // evicts 10 (30 was used last)
        assert_eq!(cache.get(10), None);
        assert_eq!(cache.get(30), Some(&[3u8][..]));
        assert_eq!(cache.get(40), Some(&[4u8][..]));
        assert_eq!(cache.index.len(), 2);
        assert_eq!(cache.data.len(), 2);
    }

    #[test]
    fn positions_map_per_row_or_per_token() {
        assert_eq!(rows_per_position(16, 16).ok(), Some(1));
        assert_eq!(rows_per_position(32, 2).ok(), Some(16));
        assert!(rows_per_position(33, 2).is_err());
        assert!(rows_per_position(3, 0).is_err());
        assert_eq!(rows_per_position(0, 0).ok(), Some(1));
    }
}
