//! Typed launchers: each checks its arguments against the buffer sizes, then appends dispatches to a
//! [`Recorder`]. A recorder is encoded as ONE compute pass (wgpu inserts the barriers between
//! dependent dispatches), so a whole token is one pass and one submission.

use std::collections::HashMap;
use std::sync::Arc;

use crate::gguf::types::GgmlType;

use super::buffers::{GpuBuf, GpuWeight};
use super::pipelines::PipelineKey;
use super::{GpuContext, GpuError};

/// One recorded dispatch.
pub struct Dispatch {
    pub label: String,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    immediates: Vec<u8>,
    workgroups: [u32; 3],
}

/// Bind groups already built, keyed by pipeline and bound buffers. A sequence keeps one across
/// tokens: a token of the real model has ~1700 dispatches, and building their bind groups anew each
/// time would cost more host time than the GPU spends.
pub type BindGroupCache = HashMap<(usize, Vec<(u32, wgpu::Buffer)>), wgpu::BindGroup>;

/// An ordered list of dispatches that becomes one compute pass.
#[derive(Default)]
pub struct Recorder {
    pub dispatches: Vec<Dispatch>,
    cache: Option<BindGroupCache>,
}

impl Recorder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A recorder that reuses (and extends) `cache`; get it back with [`Self::take_cache`].
    // wgpu::Buffer hashes and compares by its resource id, which never changes; the interior
    // mutability clippy sees is the mapping state, which is not part of the key.
    #[allow(clippy::mutable_key_type)]
    pub fn with_cache(cache: BindGroupCache) -> Self {
        Self {
            dispatches: Vec::new(),
            cache: Some(cache),
        }
    }

    #[allow(clippy::mutable_key_type)]
    pub fn take_cache(&mut self) -> BindGroupCache {
        self.cache.take().unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// Encode every dispatch into one compute pass. With `timestamps`, a timestamp is written
    /// before the first dispatch and after each one (query i+1 ends dispatch i).
    pub fn encode(&self, encoder: &mut wgpu::CommandEncoder, timestamps: Option<&wgpu::QuerySet>) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("strata"),
            timestamp_writes: None,
        });
        if let Some(q) = timestamps {
            pass.write_timestamp(q, 0);
        }
        for (i, d) in self.dispatches.iter().enumerate() {
            pass.set_pipeline(&d.pipeline);
            pass.set_bind_group(0, &d.bind_group, &[]);
            if !d.immediates.is_empty() {
                pass.set_immediates(0, &d.immediates);
            }
            let [x, y, z] = d.workgroups;
            pass.dispatch_workgroups(x, y, z);
            if let Some(q) = timestamps {
                pass.write_timestamp(q, i as u32 + 1);
            }
        }
    }

    /// Encode, submit and wait.
    pub fn run(&self, ctx: &GpuContext) -> Result<(), GpuError> {
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("strata"),
            });
        self.encode(&mut encoder, None);
        ctx.queue.submit([encoder.finish()]);
        ctx.wait()
    }

    /// Create the timestamp machinery for this recorder: `None` when the adapter has no
    /// timestamps inside passes or the pass has more dispatches than one query set holds.
    pub fn timestamps(&self, ctx: &GpuContext) -> Option<Timestamps> {
        let count = self.dispatches.len() + 1;
        if !ctx.has_timestamps() || count > wgpu::QUERY_SET_MAX_QUERIES as usize {
            return None;
        }
        let size = (count * 8) as u64;
        Some(Timestamps {
            set: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("dispatch timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: count as u32,
            }),
            resolve: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamp resolve"),
                size,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            staging: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamp readback"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            count: count as u32,
        })
    }

    /// Append a dispatch of `shader`/`entry` binding `buffers` at bindings `0..`; `None` skips a
    /// binding number the entry point does not use.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        ctx: &GpuContext,
        key: &PipelineKey,
        buffers: &[(u32, &wgpu::Buffer)],
        immediates: &[u8],
        workgroups: [u32; 3],
    ) -> Result<(), GpuError> {
        let limit = ctx.limits.max_compute_workgroups_per_dimension;
        if workgroups.iter().any(|&n| n > limit) {
            return Err(GpuError::BadArgs(format!(
                "{}: grid {workgroups:?} exceeds {limit} workgroups per dimension",
                key.shader
            )));
        }
        if workgroups.contains(&0) {
            return Ok(());
        }
        let pipeline = ctx.pipelines.get(key)?;
        let cache_key = (
            Arc::as_ptr(&pipeline) as usize,
            buffers
                .iter()
                .map(|(b, buf)| (*b, (*buf).clone()))
                .collect::<Vec<_>>(),
        );
        let cached = self.cache.as_ref().and_then(|c| c.get(&cache_key)).cloned();
        let bind_group = match cached {
            Some(bg) => bg,
            None => {
                let layout = pipeline.get_bind_group_layout(0);
                let entries: Vec<wgpu::BindGroupEntry> = buffers
                    .iter()
                    .map(|(binding, buffer)| wgpu::BindGroupEntry {
                        binding: *binding,
                        resource: buffer.as_entire_binding(),
                    })
                    .collect();
                let bg = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&key.shader),
                    layout: &layout,
                    entries: &entries,
                });
                if let Some(c) = self.cache.as_mut() {
                    c.insert(cache_key, bg.clone());
                }
                bg
            }
        };
        self.dispatches.push(Dispatch {
            label: format!("{}:{}", key.shader, key.entry),
            pipeline,
            bind_group,
            immediates: immediates.to_vec(),
            workgroups,
        });
        Ok(())
    }
}

/// Per-dispatch GPU timestamps of one encoded recorder.
pub struct Timestamps {
    pub set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    staging: wgpu::Buffer,
    count: u32,
}

impl Timestamps {
    /// After `Recorder::encode(.., Some(&self.set))`: resolve into the readback buffer.
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.resolve_query_set(&self.set, 0..self.count, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.staging, 0, self.count as u64 * 8);
    }

    /// After submission: nanoseconds of each dispatch, labelled (waits for the GPU).
    pub fn read(&self, ctx: &GpuContext, rec: &Recorder) -> Result<Vec<(String, f64)>, GpuError> {
        let bytes = super::buffers::read_staging(ctx, &self.staging)?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        let period = ctx.queue.get_timestamp_period() as f64;
        Ok(rec
            .dispatches
            .iter()
            .zip(ticks.windows(2))
            .map(|(d, w)| (d.label.clone(), w[1].saturating_sub(w[0]) as f64 * period))
            .collect())
    }
}

/// Parameters of `shaders/matvec.wgsl` (must match its `Params`).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct MatvecParams {
    rows: u32,
    k: u32,
    row_bytes: u32,
    items: u32,
    x_stride: u32,
    x_offset: u32,
    y_stride: u32,
    y_offset: u32,
    slots: u32,
    x_per_item: u32,
    expert_first: u32,
    expert_count: u32,
    rows_per_wg: u32,
}

/// Rows per mat-vec workgroup: two per subgroup of a 256-invocation workgroup (shaders/matvec.wgsl),
/// from the adapter's largest reported subgroup size (32 assumed when it reports none). Any actual
/// size still computes every row, and a row's bits do not depend on this number.
fn matvec_rows_per_wg(ctx: &GpuContext) -> usize {
    let subgroup = match ctx.adapter.subgroup_max_size {
        0 => 32,
        n => n as usize,
    };
    (2 * (256 / subgroup.min(256))).max(2)
}
const MATVEC_TILE: usize = 4;
const MAX_GRID: usize = 65535;

/// Split `items` over grid y (and z beyond 65535).
fn item_grid(items: usize) -> (u32, u32) {
    if items <= MAX_GRID {
        (items as u32, 1)
    } else {
        (MAX_GRID as u32, items.div_ceil(MAX_GRID) as u32)
    }
}

fn to_u32(v: usize, what: &str) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::BadArgs(format!("{what} = {v} does not fit in u32")))
}

/// A strided view into an f32 buffer: vector i starts at `offset + i * stride`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub buf: &'a GpuBuf,
    pub offset: usize,
    pub stride: usize,
}

impl<'a> View<'a> {
    pub fn new(buf: &'a GpuBuf, offset: usize, stride: usize) -> Self {
        Self {
            buf,
            offset,
            stride,
        }
    }

    /// The mat-vec reads x as vec4: every vector must start on a multiple of 4 floats.
    fn check_vec4(&self, what: &str) -> Result<(), GpuError> {
        if !self.offset.is_multiple_of(4) || !self.stride.is_multiple_of(4) {
            return Err(GpuError::BadArgs(format!(
                "matvec {what}: x offset {} and stride {} must be multiples of 4",
                self.offset, self.stride
            )));
        }
        Ok(())
    }

    /// Check that `count` vectors of `width` elements fit.
    fn check(&self, count: usize, width: usize, what: &str) -> Result<(), GpuError> {
        if count == 0 {
            return Ok(());
        }
        let end = self
            .offset
            .checked_add((count - 1).saturating_mul(self.stride))
            .and_then(|v| v.checked_add(width));
        match end {
            Some(e) if e <= self.buf.len => Ok(()),
            _ => Err(GpuError::BadArgs(format!(
                "{what}: {count} vectors of {width} at offset {} stride {} overrun a buffer of {}",
                self.offset, self.stride, self.buf.len
            ))),
        }
    }
}

fn grid_key(shader: &str, ty: GgmlType, entry: &'static str) -> PipelineKey {
    PipelineKey::new(format!("{shader}:{}", ty.name()), entry)
}

/// y[i][r] = W[r] . x[i] for `items` vectors.
pub fn matvec(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    x.check(items, w.row_len, &format!("matvec {} input", w.name))?;
    x.check_vec4(&w.name)?;
    y.check(items, w.n_rows, &format!("matvec {} output", w.name))?;
    let key = grid_key("matvec", w.ty, "matvec");
    let rows_per_wg = matvec_rows_per_wg(ctx);
    // The plain mat-vec handles MATVEC_TILE vectors per workgroup row (shaders/matvec.wgsl).
    let (gy, gz) = item_grid(items.div_ceil(MATVEC_TILE));
    for part in &w.parts {
        let params = MatvecParams {
            rows: to_u32(part.n_rows, "rows")?,
            k: to_u32(w.row_len, "k")?,
            row_bytes: to_u32(w.row_bytes, "row bytes")?,
            items: to_u32(items, "items")?,
            x_stride: to_u32(x.stride, "x stride")?,
            x_offset: to_u32(x.offset, "x offset")?,
            y_stride: to_u32(y.stride, "y stride")?,
            y_offset: to_u32(y.offset + part.first_row, "y offset")?,
            rows_per_wg: to_u32(rows_per_wg, "rows per workgroup")?,
            ..Default::default()
        };
        let mut bindings = vec![(0, &part.buffer), (1, &*x.buf.buffer), (2, &*y.buf.buffer)];
        let grid = grid_buffer(ctx, w.ty)?;
        if let Some(g) = &grid {
            bindings.push((4, &**g));
        }
        let gx = to_u32(part.n_rows.div_ceil(rows_per_wg), "grid x")?;
        rec.push(
            ctx,
            &key,
            &bindings,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}

/// Expert mat-vec: for item i (= token * slots + slot), y[i] = W_{ids[i]} . x, where x is
/// x[i] when `x_per_item`, else x[i / slots]. `ids` lives on the GPU (written by the router).
#[allow(clippy::too_many_arguments)]
pub fn matvec_expert(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    slots: usize,
    x_per_item: bool,
    x: View,
    y: View,
    items: usize,
) -> Result<(), GpuError> {
    if slots == 0 || !items.is_multiple_of(slots) || ids.len < items {
        return Err(GpuError::BadArgs(format!(
            "expert matvec {}: {items} items, {slots} slots, {} ids",
            w.name, ids.len
        )));
    }
    let x_count = if x_per_item { items } else { items / slots };
    x.check(
        x_count,
        w.row_len,
        &format!("expert matvec {} input", w.name),
    )?;
    x.check_vec4(&w.name)?;
    y.check(
        items,
        w.rows_per_unit,
        &format!("expert matvec {} output", w.name),
    )?;
    let key = grid_key("matvec", w.ty, "matvec_expert");
    let rows_per_wg = matvec_rows_per_wg(ctx);
    let (gy, gz) = item_grid(items);
    for part in &w.parts {
        let params = MatvecParams {
            rows: to_u32(w.rows_per_unit, "rows")?,
            k: to_u32(w.row_len, "k")?,
            row_bytes: to_u32(w.row_bytes, "row bytes")?,
            items: to_u32(items, "items")?,
            x_stride: to_u32(x.stride, "x stride")?,
            x_offset: to_u32(x.offset, "x offset")?,
            y_stride: to_u32(y.stride, "y stride")?,
            y_offset: to_u32(y.offset, "y offset")?,
            slots: to_u32(slots, "slots")?,
            x_per_item: x_per_item as u32,
            expert_first: to_u32(part.first_row / w.rows_per_unit, "expert")?,
            expert_count: to_u32(part.n_rows / w.rows_per_unit, "experts")?,
            rows_per_wg: to_u32(rows_per_wg, "rows per workgroup")?,
        };
        let mut bindings = vec![
            (0, &part.buffer),
            (1, &*x.buf.buffer),
            (2, &*y.buf.buffer),
            (3, &*ids.buffer),
        ];
        let grid = grid_buffer(ctx, w.ty)?;
        if let Some(g) = &grid {
            bindings.push((4, &**g));
        }
        let gx = to_u32(w.rows_per_unit.div_ceil(rows_per_wg), "grid x")?;
        rec.push(
            ctx,
            &key,
            &bindings,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
/// Dequantize rows `ids[i]` (global row numbers) into `out[i]`, repeated `reps` times
/// `rep_stride` apart (the embedding lookup writes each token's row into all HC streams).
pub fn get_rows(
    ctx: &GpuContext,
    rec: &mut Recorder,
    w: &GpuWeight,
    ids: &GpuBuf,
    items: usize,
    out: View,
    reps: usize,
    rep_stride: usize,
) -> Result<(), GpuError> {
    if ids.len < items || reps == 0 {
        return Err(GpuError::BadArgs(format!(
            "get_rows {}: {items} items, {} ids",
            w.name, ids.len
        )));
    }
    out.check(
        items,
        (reps - 1) * rep_stride + w.row_len,
        &format!("get_rows {} output", w.name),
    )?;
    let key = grid_key("matvec", w.ty, "get_rows");
    let (gy, gz) = item_grid(items);
    let chunks = w.row_len / 32;
    for part in &w.parts {
        let params = MatvecParams {
            rows: to_u32(part.n_rows, "rows")?,
            k: to_u32(w.row_len, "k")?,
            row_bytes: to_u32(w.row_bytes, "row bytes")?,
            items: to_u32(items, "items")?,
            x_stride: to_u32(reps, "reps")?,
            x_offset: to_u32(rep_stride, "rep stride")?,
            y_stride: to_u32(out.stride, "out stride")?,
            y_offset: to_u32(part.first_row, "first row")?,
            ..Default::default()
        };
        // get_rows writes at `item * y_stride + ...` from element 0: fold the view offset in by
        // binding from the start and requiring offset 0.
        if out.offset != 0 {
            return Err(GpuError::BadArgs(
                "get_rows output view must start at 0".into(),
            ));
        }
        let mut bindings = vec![(0, &part.buffer), (2, &*out.buf.buffer), (3, &*ids.buffer)];
        let grid = grid_buffer(ctx, w.ty)?;
        if let Some(g) = &grid {
            bindings.push((4, &**g));
        }
        let gx = to_u32(chunks.div_ceil(64), "grid x")?;
        rec.push(
            ctx,
            &key,
            &bindings,
            bytemuck::bytes_of(&params),
            [gx, gy, gz],
        )?;
    }
    Ok(())
}

fn grid_buffer(ctx: &GpuContext, ty: GgmlType) -> Result<Option<Arc<wgpu::Buffer>>, GpuError> {
    ctx.grid_buffer(ty)
}
