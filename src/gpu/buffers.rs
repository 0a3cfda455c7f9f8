//! GPU buffers: weight tensors split by whole rows so no binding exceeds the adapter's
//! `max_storage_buffer_binding_size` (128 MiB on lavapipe) or `max_buffer_size`, and plain f32 /
//! u32 activation buffers with upload and readback.

use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::gguf::types::GgmlType;

use super::layout::{self, SplitD};
use super::upload::StagedCopy;
use super::{GpuContext, GpuError};

/// Where a weight's bytes live. Kernels read either the same way, so placement never changes the
/// arithmetic, only where the bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Device memory.
    #[default]
    Vram,
    /// Host memory the GPU reads in place over the bus (`MAP_READ | STORAGE`: wgpu places it in
    /// host-visible, host-cached system RAM, page-locked by the driver). Needs
    /// [`GpuContext::has_host_storage`].
    Host,
}

impl Placement {
    fn usage(self) -> wgpu::BufferUsages {
        match self {
            // COPY_SRC: read back by the upload test.
            Placement::Vram => {
                wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC
            }
            // COPY_SRC: units are copied from here into VRAM copies (hot experts).
            Placement::Host => {
                wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::MAP_READ
                    | wgpu::BufferUsages::COPY_SRC
            }
        }
    }
}

/// One contiguous run of whole rows of a weight tensor, in its own buffer.
pub struct WeightPart {
    pub buffer: wgpu::Buffer,
    pub first_row: usize,
    pub n_rows: usize,
    /// Split layouts (`gpu::layout`): byte offset of the part's d plane; 0 otherwise.
    pub d_base: usize,
}

/// A weight matrix in VRAM in its GGUF block format: `n_rows` rows of `row_len` values.
/// Expert tensors are `n_units` matrices of `rows_per_unit` rows each, and a part always holds
/// whole experts so a kernel never needs to look into two parts for one expert.
pub struct GpuWeight {
    pub name: String,
    pub ty: GgmlType,
    pub row_len: usize,
    pub n_rows: usize,
    /// GGUF bytes per row (what the weight costs to read).
    pub row_bytes: usize,
    /// Bytes between consecutive rows in a part: `row_bytes`, or the body bytes of a split layout.
    pub row_stride: usize,
    /// The split layout of this type, if it has one (`gpu::layout`).
    pub split: Option<SplitD>,
    pub rows_per_unit: usize,
    pub parts: Vec<WeightPart>,
}

impl GpuWeight {
    /// Upload `data` (raw GGUF bytes of `n_rows` rows). `rows_per_unit` is 1 for a plain matrix
    /// and the rows of one expert for stacked expert tensors.
    pub fn upload(
        ctx: &GpuContext,
        name: &str,
        ty: GgmlType,
        row_len: usize,
        n_rows: usize,
        rows_per_unit: usize,
        data: &[u8],
    ) -> Result<Self, GpuError> {
        Self::upload_with_limit(ctx, name, ty, row_len, n_rows, rows_per_unit, data, None)
    }

    /// As [`Self::upload`], with parts capped at `max_part_bytes` (below the adapter limit); tests
    /// use it to exercise split tensors on a small model.
    #[allow(clippy::too_many_arguments)]
    pub fn upload_with_limit(
        ctx: &GpuContext,
        name: &str,
        ty: GgmlType,
        row_len: usize,
        n_rows: usize,
        rows_per_unit: usize,
        data: &[u8],
        max_part_bytes: Option<usize>,
    ) -> Result<Self, GpuError> {
        let shape = (ty, row_len, n_rows, rows_per_unit);
        Self::upload_in(ctx, name, shape, data, max_part_bytes, Placement::Vram)
    }

    /// The upload into memory of `placement`: `shape` is (type, row length, rows, rows per
    /// unit), `data` the raw GGUF bytes of those rows; parts capped at `max_part_bytes` if given.
    pub fn upload_in(
        ctx: &GpuContext,
        name: &str,
        shape: (GgmlType, usize, usize, usize),
        data: &[u8],
        max_part_bytes: Option<usize>,
        placement: Placement,
    ) -> Result<Self, GpuError> {
        Self::upload_pieces(ctx, name, shape, &[data], max_part_bytes, placement)
    }

    /// [`Self::upload_in`] of rows given as consecutive pieces of whole rows (the matrices of
    /// stacked experts, the projections of a fused one) in order: they are read where they lie,
    /// never concatenated first.
    pub fn upload_pieces(
        ctx: &GpuContext,
        name: &str,
        shape: (GgmlType, usize, usize, usize),
        pieces: &[&[u8]],
        max_part_bytes: Option<usize>,
        placement: Placement,
    ) -> Result<Self, GpuError> {
        let (ty, row_len, n_rows, rows_per_unit) = shape;
        let bad = |m: String| GpuError::BadArgs(format!("weight {name}: {m}"));
        if placement == Placement::Host && !ctx.has_host_storage() {
            return Err(GpuError::Unsupported(format!(
                "weight {name}: this adapter cannot read storage buffers in host memory"
            )));
        }
        if !super::shaders::supports(ty) {
            return Err(GpuError::Unsupported(format!(
                "weight {name} has type {}, which has no GPU kernel",
                ty.name()
            )));
        }
        let block = ty.block_size();
        // Unquantized rows may have any length (shaders/quant/rows_any.wgsl); quantized rows are
        // whole blocks of at least 32 values.
        let whole = if block == 1 {
            row_len > 0
        } else {
            row_len > 0 && row_len.is_multiple_of(32) && row_len.is_multiple_of(block)
        };
        if !whole {
            return Err(bad(format!(
                "row length {row_len} is not a whole number of {} blocks of {block} (of at least \
                 32 values)",
                ty.name()
            )));
        }
        if rows_per_unit == 0 || !n_rows.is_multiple_of(rows_per_unit) {
            return Err(bad(format!(
                "{n_rows} rows do not split into units of {rows_per_unit}"
            )));
        }
        let row_bytes = row_len / block * ty.type_size();
        let expected = row_bytes
            .checked_mul(n_rows)
            .ok_or_else(|| bad("size overflows".into()))?;
        let given: usize = pieces.iter().map(|p| p.len()).sum();
        if given != expected {
            return Err(bad(format!("{given} bytes given, {expected} expected")));
        }
        let source = RowSource::new(pieces, row_bytes)
            .ok_or_else(|| bad(format!("a piece is not whole rows of {row_bytes} bytes")))?;
        let split = layout::split_d(ty);
        let row_stride = match split {
            Some(sd) => row_len / block * sd.body_bytes(),
            None => row_bytes,
        };
        let unit_bytes = row_bytes * rows_per_unit;
        // Byte addresses inside a part are u32 in the shaders.
        let mut limit = ctx.max_binding_bytes().min(u32::MAX as u64 - 16) as usize;
        if let Some(cap) = max_part_bytes {
            limit = limit.min(cap);
        }
        let mut units_per_part = (limit / unit_bytes.max(1)).max(1);
        // A split part pads its body and d planes to 16 bytes each (see gpu::layout).
        if let Some(sd) = split {
            let blocks = row_len / block;
            while units_per_part > 1
                && layout::split_part_bytes(sd, blocks, units_per_part * rows_per_unit) > limit
            {
                units_per_part -= 1;
            }
        }
        if unit_bytes > limit {
            return Err(bad(format!(
                "one unit of {unit_bytes} bytes exceeds the adapter's binding limit of {limit} bytes"
            )));
        }
        let n_units = n_rows / rows_per_unit;
        let mut parts = Vec::new();
        let mut unit = 0;
        while unit < n_units {
            let count = units_per_part.min(n_units - unit);
            let first_row = unit * rows_per_unit;
            let rows = count * rows_per_unit;
            let form = PartForm {
                split,
                blocks: row_len / block,
                row_bytes,
            };
            let (buffer, d_base) =
                upload_part(ctx, name, &source, first_row, rows, form, placement)?;
            parts.push(WeightPart {
                buffer,
                first_row,
                n_rows: rows,
                d_base,
            });
            unit += count;
        }
        Ok(Self {
            name: name.to_string(),
            ty,
            row_len,
            n_rows,
            row_bytes,
            row_stride,
            split,
            rows_per_unit,
            parts,
        })
    }

    pub fn bytes(&self) -> usize {
        self.row_bytes * self.n_rows
    }

    /// Where unit `unit` (an expert of a stacked tensor) lies: (buffer, byte offset, length) of
    /// its rows — one range, or two in a split layout (block bodies, then scales). Two tensors of
    /// the same type and unit shape give ranges of equal lengths, so a unit can be copied from one
    /// to the other range by range.
    pub fn unit_ranges(&self, unit: usize) -> Option<Vec<(&wgpu::Buffer, u64, u64)>> {
        let row = unit.checked_mul(self.rows_per_unit)?;
        let part = self
            .parts
            .iter()
            .find(|p| row >= p.first_row && row < p.first_row + p.n_rows)?;
        let local = (row - part.first_row) as u64;
        let rows = self.rows_per_unit as u64;
        Some(match self.split {
            Some(sd) => {
                let d_row = layout::head_row_bytes(sd, self.row_len / self.ty.block_size()) as u64;
                let stride = self.row_stride as u64;
                vec![
                    (&part.buffer, local * stride, rows * stride),
                    (
                        &part.buffer,
                        part.d_base as u64 + local * d_row,
                        rows * d_row,
                    ),
                ]
            }
            None => {
                let stride = self.row_bytes as u64;
                vec![(&part.buffer, local * stride, rows * stride)]
            }
        })
    }
}

/// Whole rows given as consecutive pieces (each a multiple of `row_bytes`).
struct RowSource<'a> {
    pieces: &'a [&'a [u8]],
    /// The first row of each piece.
    starts: Vec<usize>,
    row_bytes: usize,
}

impl<'a> RowSource<'a> {
    fn new(pieces: &'a [&'a [u8]], row_bytes: usize) -> Option<Self> {
        if row_bytes == 0 || pieces.iter().any(|p| !p.len().is_multiple_of(row_bytes)) {
            return None;
        }
        let mut starts = Vec::with_capacity(pieces.len());
        let mut row = 0;
        for p in pieces {
            starts.push(row);
            row += p.len() / row_bytes;
        }
        Some(Self {
            pieces,
            starts,
            row_bytes,
        })
    }

    /// The piece holding row `r` and the row's index in it (`r` below the total, as checked
    /// against the tensor's size). The last piece starting at or before `r` holds it: an empty
    /// piece shares its start with the next one.
    fn locate(&self, r: usize) -> (&'a [u8], usize) {
        let p = self.starts.partition_point(|&s| s <= r).saturating_sub(1);
        (self.pieces[p], r - self.starts[p])
    }

    /// Row `r`'s bytes.
    fn row(&self, r: usize) -> &'a [u8] {
        let (piece, local) = self.locate(r);
        &piece[local * self.row_bytes..(local + 1) * self.row_bytes]
    }

    /// Rows `r .. r + out.len() / row_bytes` into `out`.
    fn copy_rows(&self, mut r: usize, out: &mut [u8]) {
        let mut at = 0;
        while at < out.len() {
            let (piece, local) = self.locate(r);
            let bytes = (piece.len() - local * self.row_bytes).min(out.len() - at);
            let start = local * self.row_bytes;
            out[at..at + bytes].copy_from_slice(&piece[start..start + bytes]);
            at += bytes;
            r += bytes / self.row_bytes;
        }
    }
}

/// How a part's rows are laid out in its buffer.
#[derive(Clone, Copy)]
struct PartForm {
    split: Option<SplitD>,
    blocks: usize,
    row_bytes: usize,
}

/// Rows written by one parallel task of a staged batch: about 256 KiB.
fn rows_per_task(staged_row: usize) -> usize {
    ((256 << 10) / staged_row.max(1)).max(1)
}

/// A buffer of `placement` holding rows `first_row .. first_row + rows` of `source` in `form`
/// (with the d plane's offset of a split layout, else 0), filled through the context's staging
/// buffers in batches of whole rows.
fn upload_part(
    ctx: &GpuContext,
    name: &str,
    source: &RowSource<'_>,
    first_row: usize,
    rows: usize,
    form: PartForm,
    placement: Placement,
) -> Result<(wgpu::Buffer, usize), GpuError> {
    use rayon::prelude::*;
    let PartForm {
        split,
        blocks,
        row_bytes,
    } = form;
    // A batch is a multiple of 4 rows, so every copy's offset is a multiple of 4 bytes.
    let capacity = ctx.staging_bytes();
    if 4 * row_bytes + 16 > capacity {
        let mut bytes = vec![0u8; rows * row_bytes];
        source.copy_rows(first_row, &mut bytes);
        return Ok(match split {
            Some(sd) => {
                let packed = layout::split_rows(sd, blocks, rows, &bytes);
                let d_base = layout::split_sizes(sd, blocks, rows).1;
                (storage_in(ctx, name, &packed, placement), d_base)
            }
            None => (storage_in(ctx, name, &bytes, placement), 0),
        });
    }
    let (size, d_base) = match split {
        Some(sd) => (
            layout::split_part_bytes(sd, blocks, rows),
            layout::split_sizes(sd, blocks, rows).1,
        ),
        None => ((rows * row_bytes).div_ceil(4).max(1) * 4, 0),
    };
    let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(name),
        size: size as u64,
        usage: placement.usage() | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let per_batch = super::upload::rows_per_batch(capacity, row_bytes, 4);
    let per_task = rows_per_task(row_bytes);
    let mut r0 = 0;
    while r0 < rows {
        let n = per_batch.min(rows - r0);
        let row = first_row + r0;
        match split {
            Some(sd) => {
                let body_row = blocks * sd.body_bytes();
                let d_row = layout::head_row_bytes(sd, blocks);
                let body_len = n * body_row;
                let body_copy = body_len.div_ceil(4) * 4;
                let d_len = n * d_row;
                let fill = |out: &mut [u8]| {
                    let (body, d) = out.split_at_mut(body_copy);
                    let (body, pad) = body.split_at_mut(body_len);
                    pad.fill(0);
                    body.par_chunks_mut(body_row * per_task)
                        .zip(d.par_chunks_mut(d_row * per_task))
                        .enumerate()
                        .for_each(|(c, (b, dd))| {
                            let rows_here = b.len() / body_row;
                            for j in 0..rows_here {
                                layout::split_row(
                                    sd,
                                    source.row(row + c * per_task + j),
                                    &mut b[j * body_row..(j + 1) * body_row],
                                    &mut dd[j * d_row..(j + 1) * d_row],
                                );
                            }
                        });
                };
                let copies = [
                    StagedCopy {
                        dst: &buffer,
                        dst_offset: (r0 * body_row) as u64,
                        src_offset: 0,
                        size: body_copy as u64,
                    },
                    StagedCopy {
                        dst: &buffer,
                        dst_offset: (d_base + r0 * d_row) as u64,
                        src_offset: body_copy as u64,
                        size: d_len.div_ceil(4) as u64 * 4,
                    },
                ];
                ctx.stage(body_copy + d_len, fill, &copies)?;
            }
            None => {
                let len = n * row_bytes;
                let fill = |out: &mut [u8]| {
                    out.par_chunks_mut(row_bytes * per_task)
                        .enumerate()
                        .for_each(|(c, o)| source.copy_rows(row + c * per_task, o));
                };
                let copies = [StagedCopy {
                    dst: &buffer,
                    dst_offset: (r0 * row_bytes) as u64,
                    src_offset: 0,
                    size: len.div_ceil(4) as u64 * 4,
                }];
                ctx.stage(len, fill, &copies)?;
            }
        }
        r0 += n;
    }
    Ok((buffer, d_base))
}

/// A storage buffer holding `bytes`, zero-padded to a multiple of 4 bytes.
pub fn storage_with_bytes(ctx: &GpuContext, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    storage_in(ctx, label, bytes, Placement::Vram)
}

/// [`storage_with_bytes`] in memory of `placement`.
fn storage_in(ctx: &GpuContext, label: &str, bytes: &[u8], placement: Placement) -> wgpu::Buffer {
    let padded_len = bytes.len().div_ceil(4).max(1) * 4;
    let usage = placement.usage();
    if padded_len == bytes.len() {
        return ctx
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytes,
                usage,
            });
    }
    let mut padded = Vec::with_capacity(padded_len);
    padded.extend_from_slice(bytes);
    padded.resize(padded_len, 0);
    ctx.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: &padded,
            usage,
        })
}

/// A storage buffer of `len` 32-bit elements (f32 or u32), readable back to the host.
#[derive(Clone)]
pub struct GpuBuf {
    pub buffer: Arc<wgpu::Buffer>,
    pub len: usize,
}

impl GpuBuf {
    pub fn zeros(ctx: &GpuContext, label: &str, len: usize) -> Result<Self, GpuError> {
        // Rounded up to 16 bytes so kernels may read the last elements as a vec4.
        let size = (len.max(1).div_ceil(4) * 16) as u64;
        if size > ctx.max_binding_bytes() {
            return Err(GpuError::BadArgs(format!(
                "buffer {label} of {size} bytes exceeds the binding limit {}",
                ctx.max_binding_bytes()
            )));
        }
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(Self {
            buffer: Arc::new(buffer),
            len,
        })
    }

    pub fn from_f32(ctx: &GpuContext, label: &str, data: &[f32]) -> Result<Self, GpuError> {
        let b = Self::zeros(ctx, label, data.len())?;
        b.write_f32(ctx, 0, data)?;
        Ok(b)
    }

    pub fn from_u32(ctx: &GpuContext, label: &str, data: &[u32]) -> Result<Self, GpuError> {
        let b = Self::zeros(ctx, label, data.len())?;
        b.write_u32(ctx, 0, data)?;
        Ok(b)
    }

    pub fn write_f32(&self, ctx: &GpuContext, offset: usize, data: &[f32]) -> Result<(), GpuError> {
        self.write_bytes(ctx, offset, bytemuck::cast_slice(data), data.len())
    }

    pub fn write_u32(&self, ctx: &GpuContext, offset: usize, data: &[u32]) -> Result<(), GpuError> {
        self.write_bytes(ctx, offset, bytemuck::cast_slice(data), data.len())
    }

    fn write_bytes(
        &self,
        ctx: &GpuContext,
        offset: usize,
        bytes: &[u8],
        count: usize,
    ) -> Result<(), GpuError> {
        if offset + count > self.len {
            return Err(GpuError::BadArgs(format!(
                "write of {count} elements at {offset} into a buffer of {}",
                self.len
            )));
        }
        if !bytes.is_empty() {
            ctx.queue
                .write_buffer(&self.buffer, (offset * 4) as u64, bytes);
        }
        Ok(())
    }

    /// Copy `count` elements starting at `offset` back to the host (waits for the GPU).
    pub fn read_f32(
        &self,
        ctx: &GpuContext,
        offset: usize,
        count: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let bytes = self.read_bytes(ctx, offset, count)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    pub fn read_u32(
        &self,
        ctx: &GpuContext,
        offset: usize,
        count: usize,
    ) -> Result<Vec<u32>, GpuError> {
        let bytes = self.read_bytes(ctx, offset, count)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    fn read_bytes(
        &self,
        ctx: &GpuContext,
        offset: usize,
        count: usize,
    ) -> Result<Vec<u8>, GpuError> {
        if offset + count > self.len {
            return Err(GpuError::BadArgs(format!(
                "read of {count} elements at {offset} from a buffer of {}",
                self.len
            )));
        }
        if count == 0 {
            return Ok(Vec::new());
        }
        let size = (count * 4) as u64;
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("readback"),
            });
        encoder.copy_buffer_to_buffer(&self.buffer, (offset * 4) as u64, &staging, 0, size);
        ctx.queue.submit([encoder.finish()]);
        read_staging(ctx, &staging)
    }
}

/// Map a MAP_READ buffer (whose copy was already submitted) and return its bytes.
pub fn read_staging(ctx: &GpuContext, staging: &wgpu::Buffer) -> Result<Vec<u8>, GpuError> {
    let (sender, receiver) = std::sync::mpsc::channel();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = sender.send(r);
    });
    ctx.wait()?;
    match receiver.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(GpuError::Device(format!("buffer map failed: {e}"))),
        Err(_) => return Err(GpuError::Device("buffer map callback never ran".into())),
    }
    let view = staging
        .slice(..)
        .get_mapped_range()
        .map_err(|e| GpuError::Device(format!("mapped range: {e}")))?;
    let out = view.to_vec();
    drop(view);
    staging.unmap();
    Ok(out)
}
