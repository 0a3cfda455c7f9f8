//! The PLE row reader against plain `pread`s of a > 2 GB sparse table: ≥ 10^5 random rows through
//! every I/O mode with the row cache on and off, rows crossing 4 KiB page boundaries, repeated
//! rows, a reused staging buffer, prefetch, four concurrent readers, and a corrupted row (a NaN
//! scale written into the file) reported with its row, token position and offset.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use strata::gguf::{GgmlType, Gguf, GgufWriter};
use strata::quant;
use strata::tiers::ple_reader::PleReaderStats;
use strata::tiers::{IoMode, PleReadError, PleReaderOptions, PleRowReader, PleTable};

const PAGE: u64 = 4096;
/// Real PLE rows: 160 values of IQ4_NL = 5 blocks of 18 bytes.
const ROW_VALUES: u64 = 160;
/// 24 M rows × 90 B = 2.16 GB > 2 GiB, so offsets past 2^31 are exercised.
const N_ROWS: u64 = 24_000_000;
const ROWS_PER_TOKEN: usize = 16;

/// Removes the file when dropped, also when the test fails.
struct TempFile(PathBuf);
impl TempFile {
    fn new(tag: &str) -> TempFile {
        TempFile(
            std::env::temp_dir().join(format!("strata-tiers-{tag}-{}.bin", std::process::id())),
        )
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// SplitMix64, for reproducible row choices.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The valid random content written for `row` (reproducible, different for every row).
fn row_content(ty: GgmlType, row: u64) -> Vec<u8> {
    let blocks = (ROW_VALUES as usize) / ty.block_size();
    quant::random_blocks(ty, blocks, 0x51EE_D000 ^ row)
}

struct Fixture {
    file: TempFile,
    table: PleTable,
    /// Rows in reading order (random, page-crossing, repeated, first and last).
    reads: Vec<u64>,
}

/// Every row that straddles a 4 KiB boundary among the first `pages` pages after `table_offset`,
/// plus a few far into the file.
fn page_crossing_rows(table_offset: u64, row_bytes: u64, n_rows: u64, pages: u64) -> Vec<u64> {
    let mut rows = Vec::new();
    let far_pages = [(1 << 31) / PAGE, (1 << 31) / PAGE + 1, 500_000, 520_000];
    for page in (1..pages).chain(far_pages) {
        let boundary = page * PAGE;
        if boundary <= table_offset {
            continue;
        }
        let row = (boundary - table_offset) / row_bytes;
        let start = table_offset + row * row_bytes;
        if row < n_rows && start < boundary && start + row_bytes > boundary {
            rows.push(row);
        }
    }
    rows
}

/// Write the rows we will read (everything else stays a hole: zeros, which are valid blocks).
fn write_rows(path: &Path, table: &PleTable, rows: &[u64]) {
    let file = File::options()
        .write(true)
        .open(path)
        .expect("open for writing");
    let mut written = std::collections::HashSet::new();
    for &row in rows {
        if written.insert(row) {
            file.write_all_at(&row_content(table.ty, row), table.row_offset(row))
                .expect("write row");
        }
    }
}

fn read_list(seed: u64, n_random: usize, n_rows: u64, crossing: &[u64]) -> Vec<u64> {
    let mut rng = Rng(seed);
    let mut reads: Vec<u64> = (0..n_random).map(|_| rng.next() % n_rows).collect();
    reads.extend_from_slice(crossing);
    reads.push(0);
    reads.push(n_rows - 1);
    // Repeats: a fifth of the list again, scattered.
    let repeats: Vec<u64> = (0..reads.len() / 5)
        .map(|_| reads[(rng.next() % reads.len() as u64) as usize])
        .collect();
    reads.extend(repeats);
    // Shuffle (Fisher–Yates) so repeats and crossers are spread through the batches.
    for i in (1..reads.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        reads.swap(i, j);
    }
    // Pad to whole tokens.
    while !reads.len().is_multiple_of(ROWS_PER_TOKEN) {
        reads.push(1);
    }
    reads
}

/// A GGUF whose table starts at a known, not page-aligned offset: a small tensor first.
fn gguf_fixture() -> Fixture {
    let file = TempFile::new("ple-gguf");
    let ty = GgmlType::IQ4_NL;
    let mut writer = GgufWriter::new();
    writer.add_metadata(
        "general.architecture",
        strata::gguf::Value::String("qwen4exp".into()),
    );
    writer
        .add_tensor("leading.weight", &[7], GgmlType::F32, vec![0u8; 28])
        .expect("small tensor");
    let table_bytes = writer
        .declare_tensor("per_layer_token_embd.weight", &[ROW_VALUES, N_ROWS], ty)
        .expect("table tensor");
    let header = writer.header_bytes();
    let table_offset = header.len() as u64 + 32; // after the 28-byte tensor, aligned to 32
    {
        let f = File::create(&file.0).expect("create");
        f.write_all_at(&header, 0).expect("header");
        f.set_len(table_offset + table_bytes)
            .expect("sparse length");
    }
    let table = PleTable {
        path: file.0.clone(),
        offset: table_offset,
        row_bytes: 90,
        n_rows: N_ROWS,
        ty,
    };
    let crossing = page_crossing_rows(table_offset, 90, N_ROWS, 600);
    assert!(
        crossing.len() > 500,
        "{} page-crossing rows",
        crossing.len()
    );
    let reads = read_list(7, 100_000, N_ROWS, &crossing);
    write_rows(&file.0, &table, &reads);
    Fixture { file, table, reads }
}

/// What a plain positioned read of each row returns.
fn pread_rows(table: &PleTable, rows: &[u64]) -> Vec<u8> {
    let file = File::open(&table.path).expect("open");
    let mut out = vec![0u8; rows.len() * table.row_bytes];
    for (row, target) in rows.iter().zip(out.chunks_exact_mut(table.row_bytes)) {
        file.read_exact_at(target, table.row_offset(*row))
            .expect("pread");
    }
    out
}

fn options(mode: IoMode, cache_rows: usize) -> PleReaderOptions {
    PleReaderOptions {
        mode,
        cache_rows,
        verify_reads: false,
    }
}

/// Gather `reads` in batches of `tokens` tokens into one reused staging buffer (which starts with
/// a prefix that must survive), comparing every batch with `expected`.
fn gather_all(
    reader: &PleRowReader,
    reads: &[u64],
    expected: &[u8],
    tokens: usize,
    prefetch: bool,
) {
    let row_bytes = reader.row_bytes();
    let prefix = b"prefix!";
    let mut staging: Vec<u8> = Vec::new();
    let batch_rows = tokens * ROWS_PER_TOKEN;
    for (batch_index, batch) in reads.chunks(batch_rows).enumerate() {
        let first_token = batch_index * tokens;
        let positions: Vec<usize> =
            (first_token..first_token + batch.len() / ROWS_PER_TOKEN).collect();
        if prefetch {
            reader.prefetch(batch).expect("prefetch");
        }
        staging.clear();
        staging.extend_from_slice(prefix);
        reader
            .gather(batch, &positions, &mut staging)
            .expect("gather");
        let start = batch_index * batch_rows * row_bytes;
        let want = &expected[start..start + batch.len() * row_bytes];
        assert_eq!(&staging[..prefix.len()], prefix);
        if &staging[prefix.len()..] != want {
            let got = &staging[prefix.len()..];
            let bad = (0..batch.len())
                .find(|&i| {
                    got[i * row_bytes..(i + 1) * row_bytes]
                        != want[i * row_bytes..(i + 1) * row_bytes]
                })
                .unwrap_or(0);
            panic!(
                "{:?}: batch {batch_index}, row {} (index {bad}) differs from pread",
                reader.options(),
                batch[bad]
            );
        }
    }
}

#[test]
fn gathers_match_pread_in_every_mode_over_a_2gb_table() {
    let fixture = gguf_fixture();
    let table = &fixture.table;
    let reads = &fixture.reads;
    assert!(reads.len() >= 100_000 + 20_000);
    assert!(table.row_offset(N_ROWS - 1) > 1 << 31);
    let expected = pread_rows(table, reads);
    // The file really holds the written random rows (so comparing with pread is not comparing zeros).
    for (i, &row) in reads.iter().enumerate().step_by(97) {
        assert_eq!(
            &expected[i * 90..(i + 1) * 90],
            &row_content(table.ty, row)[..],
            "row {row}"
        );
    }

    // The table found through the GGUF header is the one we wrote.
    let gguf = Gguf::open(&fixture.file.0).expect("parse the GGUF");
    let from_gguf = PleTable::from_gguf(&gguf).expect("table in GGUF");
    assert_eq!(&from_gguf, table);

    for mode in [IoMode::Mmap, IoMode::Read] {
        // Cache smaller than the distinct rows, so it evicts; and no cache.
        for cache_rows in [30_000, 0] {
            let reader = PleRowReader::open_gguf(&gguf, options(mode, cache_rows)).expect("open");
            let tokens = if cache_rows == 0 { 64 } else { 37 };
            gather_all(&reader, reads, &expected, tokens, false);
            let stats = reader.stats();
            assert_eq!(stats.rows_gathered, reads.len() as u64);
            if cache_rows == 0 {
                assert_eq!(stats.rows_read, reads.len() as u64);
                assert_eq!(stats.cache_hits, 0);
            } else {
                assert!(stats.cache_hits > 0, "{mode:?}: {stats:?}");
                assert_eq!(stats.cache_hits + stats.cache_misses, reads.len() as u64);
                assert_eq!(stats.rows_read, stats.cache_misses);
                assert_eq!(stats.cached_rows, cache_rows as u64);
                // A second pass over the last rows is served from the cache.
                let tail = &reads[reads.len() - 2 * 16 * 37..];
                let before = reader.stats();
                gather_all(
                    &reader,
                    tail,
                    &expected[(reads.len() - tail.len()) * 90..],
                    37,
                    false,
                );
                let after = reader.stats();
                assert_eq!(after.cache_misses, before.cache_misses);
            }
        }
    }
    // Verified reads (map and pread compared on every row) and prefetch, in both modes.
    for mode in [IoMode::Mmap, IoMode::Read] {
        let reader = PleRowReader::open(
            table.clone(),
            PleReaderOptions {
                mode,
                cache_rows: 4096,
                verify_reads: true,
            },
        )
        .expect("open");
        let part = &reads[..16 * 64 * 20];
        gather_all(&reader, part, &expected, 64, true);
        if mode == IoMode::Read {
            // Prefetch filled the cache, so the gathers themselves only hit.
            let stats: PleReaderStats = reader.stats();
            assert_eq!(stats.cache_misses, 0, "{stats:?}");
            assert!(stats.cache_hits as usize == part.len());
        }
    }
}

#[test]
fn concurrent_readers_share_one_reader() {
    // A smaller sparse table (same row geometry) keeps this test quick.
    let file = TempFile::new("ple-concurrent");
    let n_rows = 2_000_000;
    let table = PleTable {
        path: file.0.clone(),
        offset: 1000, // deliberately not aligned to anything
        row_bytes: 90,
        n_rows,
        ty: GgmlType::IQ4_NL,
    };
    File::create(&file.0)
        .and_then(|f| f.set_len(1000 + n_rows * 90))
        .expect("sparse file");
    let crossing = page_crossing_rows(1000, 90, n_rows, 300);
    let reads = read_list(99, 40_000, n_rows, &crossing);
    write_rows(&file.0, &table, &reads);
    let expected = pread_rows(&table, &reads);
    for mode in [IoMode::Mmap, IoMode::Read] {
        // A cache much smaller than the working set: threads evict each other's rows.
        let reader = PleRowReader::open(table.clone(), options(mode, 2_000)).expect("open");
        std::thread::scope(|scope| {
            for thread in 0..4usize {
                let reader = &reader;
                let reads = &reads;
                let expected = &expected;
                scope.spawn(move || {
                    // Each thread walks the whole list from a different starting batch.
                    let batch = 16 * 16;
                    let n_batches = reads.len().div_ceil(batch);
                    let mut staging = Vec::new();
                    for k in 0..n_batches {
                        let b = (k + thread * n_batches / 4) % n_batches;
                        let rows = &reads[b * batch..((b + 1) * batch).min(reads.len())];
                        let positions: Vec<usize> = (0..rows.len() / 16).collect();
                        staging.clear();
                        reader
                            .gather(rows, &positions, &mut staging)
                            .expect("gather");
                        let start = b * batch * 90;
                        assert!(
                            staging == expected[start..start + rows.len() * 90],
                            "thread {thread}, batch {b} differs from pread"
                        );
                    }
                });
            }
        });
        let stats = reader.stats();
        assert_eq!(stats.rows_gathered, 4 * reads.len() as u64);
        assert_eq!(
            stats.cache_hits + stats.cache_misses,
            4 * reads.len() as u64
        );
    }
}

#[test]
fn corrupted_rows_are_reported_with_row_position_and_offset() {
    let file = TempFile::new("ple-corrupt");
    for ty in [GgmlType::IQ4_NL, GgmlType::Q8_0] {
        let row_bytes = (ROW_VALUES as usize / ty.block_size()) * ty.type_size();
        let n_rows = 100_000;
        let table = PleTable {
            path: file.0.clone(),
            offset: 4090, // the rows start just before a page boundary
            row_bytes,
            n_rows,
            ty,
        };
        File::create(&file.0)
            .and_then(|f| f.set_len(table.offset + n_rows * row_bytes as u64))
            .expect("sparse file");
        let rows: Vec<u64> = (0..64).map(|i| i * 1531 + 7).collect();
        write_rows(&file.0, &table, &rows);
        let bad_row = rows[37];
        let bad_block = 2u64;
        // A NaN f16 (0x7E00) in the scale `d`, the first field of the block.
        let nan_at = table.row_offset(bad_row) + bad_block * ty.type_size() as u64;
        File::options()
            .write(true)
            .open(&file.0)
            .and_then(|f| f.write_all_at(&0x7E00u16.to_le_bytes(), nan_at))
            .expect("corrupt the row");

        for mode in [IoMode::Mmap, IoMode::Read] {
            for cache_rows in [0, 16] {
                let reader =
                    PleRowReader::open(table.clone(), options(mode, cache_rows)).expect("open");
                // Rows 32..48 are token 102, in a batch of 4 tokens starting at position 100.
                let positions = [100, 101, 102, 103];
                let mut staging = b"kept".to_vec();
                for _attempt in 0..2 {
                    let err = reader
                        .gather(&rows[..64], &positions, &mut staging)
                        .expect_err("the NaN scale must be caught");
                    match &err {
                        PleReadError::NonFinite {
                            row,
                            position,
                            offset,
                            block,
                            ..
                        } => {
                            assert_eq!(*row, bad_row);
                            assert_eq!(*position, 102);
                            assert_eq!(*offset, table.row_offset(bad_row));
                            assert_eq!(*block, bad_block as usize);
                        }
                        other => panic!("{ty} {mode:?}: unexpected error {other}"),
                    }
                    let message = err.to_string();
                    for needle in [
                        format!("row {bad_row}"),
                        "token position 102".to_string(),
                        format!("offset {}", table.row_offset(bad_row)),
                    ] {
                        assert!(message.contains(&needle), "{message:?} lacks {needle:?}");
                    }
                    // A failed gather leaves the staging buffer as it was.
                    assert_eq!(staging, b"kept");
                }
                // The next request without the bad row is served.
                let good: Vec<u64> = rows
                    .iter()
                    .copied()
                    .filter(|&r| r != bad_row)
                    .take(48)
                    .collect();
                staging.clear();
                reader
                    .gather(&good, &[0, 1, 2], &mut staging)
                    .expect("good rows still gather");
                assert_eq!(staging, pread_rows(&table, &good));
            }
        }
    }
}

#[test]
fn bad_requests_are_errors() {
    let file = TempFile::new("ple-bad");
    let table = PleTable {
        path: file.0.clone(),
        offset: 0,
        row_bytes: 90,
        n_rows: 1000,
        ty: GgmlType::IQ4_NL,
    };
    File::create(&file.0)
        .and_then(|f| f.set_len(90 * 1000))
        .expect("file");
    let reader = PleRowReader::open(table.clone(), options(IoMode::Read, 8)).expect("open");
    let mut staging = Vec::new();
    let err = reader
        .gather(&[5, 1000], &[7, 8], &mut staging)
        .unwrap_err();
    assert!(
        matches!(
            err,
            PleReadError::RowOutOfRange {
                row: 1000,
                position: 8,
                n_rows: 1000
            }
        ),
        "{err}"
    );
    let err = reader
        .gather(&[1, 2, 3], &[0, 1], &mut staging)
        .unwrap_err();
    assert!(matches!(err, PleReadError::LengthMismatch { .. }), "{err}");
    assert!(staging.is_empty());
    // A table that runs past the end of the file is refused when opening.
    let mut too_long = table.clone();
    too_long.n_rows = 1001;
    let err = PleRowReader::open(too_long, options(IoMode::Mmap, 0)).unwrap_err();
    assert!(
        err.to_string().contains("file is 90000 bytes long"),
        "{err}"
    );
    // Rows that are not whole blocks are refused.
    let mut odd = table;
    odd.row_bytes = 91;
    assert!(PleRowReader::open(odd, options(IoMode::Read, 0)).is_err());
}

#[test]
fn dequantized_gathers_equal_dequantized_file_bytes() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PleRowReader>();

    let file = TempFile::new("ple-f32");
    let n_rows = 10_000;
    let table = PleTable {
        path: file.0.clone(),
        offset: 77,
        row_bytes: 170,
        n_rows,
        ty: GgmlType::Q8_0,
    };
    File::create(&file.0)
        .and_then(|f| f.set_len(77 + n_rows * 170))
        .expect("file");
    let rows: Vec<u64> = (0..32).map(|i| (i * 313) % n_rows).collect();
    write_rows(&file.0, &table, &rows);
    let reader = PleRowReader::open(table.clone(), options(IoMode::Read, 0)).expect("open");
    let mut raw = Vec::new();
    let mut out = vec![1.5f32];
    reader
        .gather_dequantized(&rows, &[4, 5], &mut raw, &mut out)
        .expect("gather");
    let bytes = pread_rows(&table, &rows);
    let mut want = vec![0f32; 32 * 160];
    quant::dequantize(GgmlType::Q8_0, &bytes, &mut want).expect("dequantize");
    assert_eq!(out[0], 1.5);
    assert_eq!(out[1..].len(), want.len());
    assert!(
        out[1..]
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    assert!(want.iter().any(|&v| v != 0.0));
}

#[test]
fn the_tiny_fixture_table_reads_back_exactly() {
    let gguf = Gguf::open("tests/fixtures/tiny/tiny-IQ3_S.gguf").expect("fixture");
    let tensor = gguf
        .tensor("per_layer_token_embd.weight")
        .expect("PLE table");
    let data = gguf.tensor_data(tensor);
    let rows: Vec<u64> = (0..tensor.n_rows()).rev().collect();
    for mode in [IoMode::Mmap, IoMode::Read] {
        let reader = PleRowReader::open_gguf(&gguf, options(mode, 1000)).expect("open");
        assert_eq!((reader.n_rows(), reader.row_bytes()), (8320, 18));
        let mut staging = Vec::new();
        let positions: Vec<usize> = (0..rows.len()).collect();
        reader
            .gather(&rows, &positions, &mut staging)
            .expect("gather");
        for (i, &row) in rows.iter().enumerate() {
            let r = row as usize;
            assert_eq!(&staging[i * 18..(i + 1) * 18], &data[r * 18..(r + 1) * 18]);
        }
    }
}
