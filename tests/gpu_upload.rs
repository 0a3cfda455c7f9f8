//! Weight uploads through the staging buffers (`strata::gpu::upload`): whatever the batch size,
//! the pieces the rows come in and the parts a tensor is cut into, every buffer holds exactly the
//! bytes of the one-piece layout (the split layout of `gpu::layout`, or the GGUF rows as they are).

mod common;

use strata::gguf::types::GgmlType;
use strata::gpu::GpuContext;
use strata::gpu::buffers::{GpuWeight, Placement, read_staging};
use strata::gpu::layout;

/// The bytes of `buffer` (`size` of them).
fn read_back(ctx: &GpuContext, buffer: &wgpu::Buffer, size: u64) -> Vec<u8> {
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
    encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, size);
    ctx.queue.submit([encoder.finish()]);
    read_staging(ctx, &staging).expect("readback")
}

/// What part `rows` rows of GGUF bytes `data` must look like in a buffer.
fn expected_part(ty: GgmlType, row_len: usize, rows: usize, data: &[u8]) -> Vec<u8> {
    match layout::split_d(ty) {
        Some(sd) => layout::split_rows(sd, row_len / ty.block_size(), rows, data),
        None => {
            let mut v = data.to_vec();
            v.resize(data.len().div_ceil(4).max(1) * 4, 0);
            v
        }
    }
}

/// Upload `rows` random rows of `ty` given in pieces of `cuts` rows, in parts of at most
/// `part_rows` rows, through batches of at most `staging` bytes; check every part's bytes.
fn check(
    ctx: &GpuContext,
    ty: GgmlType,
    row_len: usize,
    cuts: &[usize],
    part_rows: usize,
    staging: usize,
) {
    let rows: usize = cuts.iter().sum();
    let row_bytes = row_len / ty.block_size() * ty.type_size();
    let data = strata::quant::random_blocks(ty, rows * row_len / ty.block_size(), 7 + rows as u64);
    let mut pieces = Vec::new();
    let mut at = 0;
    for &c in cuts {
        pieces.push(&data[at * row_bytes..(at + c) * row_bytes]);
        at += c;
    }
    let part_bytes = match layout::split_d(ty) {
        Some(sd) => layout::split_part_bytes(sd, row_len / ty.block_size(), part_rows),
        None => part_rows * row_bytes,
    };
    ctx.set_staging_bytes(staging);
    let w = GpuWeight::upload_pieces(
        ctx,
        "test weight",
        (ty, row_len, rows, 1),
        &pieces,
        Some(part_bytes),
        Placement::Vram,
    )
    .expect("upload");
    ctx.release_staging().expect("staging released");
    let mut row = 0;
    for part in &w.parts {
        assert_eq!(part.first_row, row, "{ty:?}: parts cover the rows in order");
        let want = expected_part(
            ty,
            row_len,
            part.n_rows,
            &data[row * row_bytes..(row + part.n_rows) * row_bytes],
        );
        let got = read_back(ctx, &part.buffer, want.len() as u64);
        assert!(
            got == want,
            "{ty:?} row_len {row_len}, pieces {cuts:?}, staging {staging}: part at row {row} differs \
             (first difference at byte {:?})",
            got.iter().zip(&want).position(|(a, b)| a != b)
        );
        row += part.n_rows;
    }
    assert_eq!(row, rows, "{ty:?}: every row uploaded");
}

#[test]
fn staged_uploads_hold_the_bytes_of_the_one_piece_layout() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    // Split types (Q8_0, Q6_K, IQ4_NL, IQ3_S), GGUF-block types (Q4_K, Q2_0) and plain rows of an
    // odd length (F16: 74-byte rows, not a multiple of 4).
    let cases = [
        (GgmlType::Q8_0, 96),
        (GgmlType::Q6_K, 512),
        (GgmlType::IQ4_NL, 64),
        (GgmlType::IQ3_S, 256),
        (GgmlType::Q4_K, 256),
        (GgmlType::Q2_0, 128),
        (GgmlType::F16, 37),
        (GgmlType::F32, 5),
    ];
    for (ty, row_len) in cases {
        // Uneven pieces (one empty) over 37 rows: batches and parts cut across them.
        let cuts = [5, 0, 13, 19];
        // One batch for the whole part; batches of 4-8 rows; the smallest batches.
        for staging in [64 << 20, 8 * row_len * 4 + 64, 64] {
            for part_rows in [37, 11] {
                check(&ctx, ty, row_len, &cuts, part_rows, staging);
            }
        }
    }
    ctx.set_staging_bytes(strata::gpu::upload::STAGING_BYTES);
}

#[test]
fn pieces_that_are_not_whole_rows_are_an_error() {
    let Some(ctx) = common::gpu_context() else {
        return;
    };
    let row_bytes = GgmlType::Q8_0.type_size() * 2;
    let data = strata::quant::random_blocks(GgmlType::Q8_0, 8, 1);
    let (a, b) = data.split_at(row_bytes + 3);
    let err = GpuWeight::upload_pieces(
        &ctx,
        "bad",
        (GgmlType::Q8_0, 64, 4, 1),
        &[a, b],
        None,
        Placement::Vram,
    )
    .err()
    .expect("a piece cut mid-row is refused");
    assert!(err.to_string().contains("whole rows"), "{err}");
}
