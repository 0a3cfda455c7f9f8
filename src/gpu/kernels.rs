//! Typed launchers: each checks its arguments against the buffer sizes, then appends dispatches to a
//! [`Recorder`]. A recorder is encoded as ONE compute pass (wgpu inserts the barriers between
//! dependent dispatches), so a whole token is one pass and one submission.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::buffers::GpuBuf;
use super::pipelines::PipelineKey;
use super::{GpuContext, GpuError};

/// One recorded dispatch.
pub struct Dispatch {
    pub label: String,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    immediates: Vec<u8>,
    workgroups: [u32; 3],
    /// Buffers moved to the read-only storage state just before this dispatch (see
    /// [`Recorder::read_only`]).
    read_first: Vec<wgpu::Buffer>,
}

/// Bind groups already built, keyed by pipeline and bound buffers. A sequence keeps one across
/// tokens: a token of the real model has ~1700 dispatches, and building their bind groups anew each
/// time would cost more host time than the GPU spends.
pub type BindGroupCache = HashMap<(usize, Vec<(u32, wgpu::Buffer)>), wgpu::BindGroup>;

/// Dispatches of this label are left out of every encoded pass (`strata bench --ablate`): a
/// measurement of what one kind of kernel costs inside the real pipeline. Results are wrong while
/// it is set; nothing but the bench sets it.
static ABLATED: RwLock<Option<String>> = RwLock::new(None);

/// Leave out (Some) or restore (None) the dispatches labelled `label` (see [`ABLATED`]).
pub fn set_ablated(label: Option<&str>) {
    if let Ok(mut slot) = ABLATED.write() {
        *slot = label.map(str::to_string);
    }
}

/// An ordered list of dispatches that becomes one compute pass.
#[derive(Default)]
pub struct Recorder {
    pub dispatches: Vec<Dispatch>,
    cache: Option<BindGroupCache>,
    /// [`Self::read_only`]'s buffers, for the next dispatch pushed.
    read_first: Vec<wgpu::Buffer>,
    /// When [`Self::flush`] first handed dispatches to the GPU (the host's share of a step's
    /// latency ends there).
    first_flush: Option<std::time::Instant>,
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
            read_first: Vec::new(),
            first_flush: None,
        }
    }

    #[allow(clippy::mutable_key_type)]
    pub fn take_cache(&mut self) -> BindGroupCache {
        self.cache.take().unwrap_or_default()
    }

    /// Record the next dispatches with `cache` (the one held so far is returned).
    #[allow(clippy::mutable_key_type)]
    pub fn swap_cache(&mut self, cache: BindGroupCache) -> BindGroupCache {
        self.cache.replace(cache).unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    /// Move `buffers` to the read-only storage state together with the next dispatch's own
    /// transitions, so a later dispatch that only reads them needs no barrier of its own and can
    /// run beside that one. wgpu-core puts a barrier before every dispatch whose buffers change
    /// state (and before every write to a buffer already written in the pass); on Vulkan a
    /// barrier waits for every earlier dispatch. This changes where the GPU waits, never what a
    /// kernel reads: wgpu still tracks every state, so a write after this gets its barrier.
    pub fn read_only(&mut self, buffers: &[&GpuBuf]) {
        self.read_first
            .extend(buffers.iter().map(|b| (*b.buffer).clone()));
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// Encode every dispatch into one compute pass. With `timestamps`, a timestamp is written
    /// before the first dispatch and after each one (query i+1 ends dispatch i).
    pub fn encode(&self, encoder: &mut wgpu::CommandEncoder, timestamps: Option<&wgpu::QuerySet>) {
        self.encode_pass(encoder, timestamps, None);
    }

    /// Encode every dispatch into one compute pass with a timestamp at each end of it (queries 0
    /// and 1 of [`Self::span_timestamps`]): the GPU time of the whole pass, without the
    /// per-dispatch timestamps' cost.
    pub fn encode_span(&self, encoder: &mut wgpu::CommandEncoder, span: &Timestamps) {
        self.encode_pass(encoder, None, Some(&span.set));
    }

    fn encode_pass(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        timestamps: Option<&wgpu::QuerySet>,
        span: Option<&wgpu::QuerySet>,
    ) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("strata"),
            timestamp_writes: span.map(|query_set| wgpu::ComputePassTimestampWrites {
                query_set,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            }),
        });
        if let Some(q) = timestamps {
            pass.write_timestamp(q, 0);
        }
        let guard = ABLATED.read().ok();
        let ablated = guard.as_ref().and_then(|a| a.as_deref());
        for (i, d) in self.dispatches.iter().enumerate() {
            if !d.read_first.is_empty() {
                let moves = d.read_first.iter().map(|buffer| wgpu::BufferTransition {
                    buffer,
                    state: wgpu::BufferUses::STORAGE_READ_ONLY,
                });
                pass.transition_resources(moves, std::iter::empty());
            }
            if ablated == Some(d.label.as_str()) && timestamps.is_none() {
                continue;
            }
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
        self.submit(ctx);
        ctx.wait()
    }

    /// Encode and submit without waiting: the GPU starts on these dispatches while the host
    /// records the next ones (queue order keeps every dependency).
    pub fn submit(&self, ctx: &GpuContext) {
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("strata"),
            });
        self.encode(&mut encoder, None);
        ctx.queue.submit([encoder.finish()]);
    }

    /// Submit what this recorder holds (see [`Self::submit`]) and empty it, keeping its bind-group
    /// cache.
    pub fn flush(&mut self, ctx: &GpuContext) {
        self.submit(ctx);
        self.dispatches.clear();
        self.first_flush.get_or_insert_with(std::time::Instant::now);
    }

    /// When [`Self::flush`] first submitted (None if it never did).
    pub fn first_flush(&self) -> Option<std::time::Instant> {
        self.first_flush
    }

    /// Create the timestamp machinery for this recorder: `None` when the adapter has no
    /// timestamps inside passes or the pass has more dispatches than one query set holds.
    pub fn timestamps(&self, ctx: &GpuContext) -> Option<Timestamps> {
        let count = self.dispatches.len() + 1;
        if !ctx.has_timestamps() || count > wgpu::QUERY_SET_MAX_QUERIES as usize {
            return None;
        }
        Some(Timestamps::new(ctx, count))
    }

    /// The two timestamps of [`Self::encode_span`]: `None` when the adapter has no timestamp
    /// queries.
    pub fn span_timestamps(&self, ctx: &GpuContext) -> Option<Timestamps> {
        ctx.features
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            .then(|| Timestamps::new(ctx, 2))
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
            read_first: std::mem::take(&mut self.read_first),
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
    fn new(ctx: &GpuContext, count: usize) -> Self {
        let size = (count * 8) as u64;
        Timestamps {
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
        }
    }

    /// After `Recorder::encode(.., Some(&self.set))`: resolve into the readback buffer.
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.resolve_query_set(&self.set, 0..self.count, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.staging, 0, self.count as u64 * 8);
    }

    /// After submission: nanoseconds between the first two timestamps (the pass of
    /// [`Recorder::encode_span`]; waits for the GPU).
    pub fn read_span(&self, ctx: &GpuContext) -> Result<f64, GpuError> {
        let bytes = super::buffers::read_staging(ctx, &self.staging)?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        let period = ctx.queue.get_timestamp_period() as f64;
        match ticks.as_slice() {
            [start, end, ..] => Ok(end.saturating_sub(*start) as f64 * period),
            _ => Err(GpuError::BadArgs("a span needs two timestamps".into())),
        }
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

pub(crate) const MAX_GRID: usize = 65535;

/// Split `items` over grid y (and z beyond 65535).
pub(crate) fn item_grid(items: usize) -> (u32, u32) {
    if items <= MAX_GRID {
        (items as u32, 1)
    } else {
        (MAX_GRID as u32, items.div_ceil(MAX_GRID) as u32)
    }
}

pub(crate) fn to_u32(v: usize, what: &str) -> Result<u32, GpuError> {
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
    pub(crate) fn check_vec4(&self, what: &str) -> Result<(), GpuError> {
        if !self.offset.is_multiple_of(4) || !self.stride.is_multiple_of(4) {
            return Err(GpuError::BadArgs(format!(
                "matvec {what}: x offset {} and stride {} must be multiples of 4",
                self.offset, self.stride
            )));
        }
        Ok(())
    }

    /// Check that `count` vectors of `width` elements fit.
    pub(crate) fn check(&self, count: usize, width: usize, what: &str) -> Result<(), GpuError> {
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

pub use super::matvec::{
    ConvStore, ExpertCombine, InputNorm, SegFusion, Store, XForm, can_expert_combine,
    can_moe_combine, can_norm_input, get_rows, matvec, matvec_expert, matvec_expert_combine,
    matvec_expert_glu, matvec_expert_glu_pairs, matvec_expert_with, matvec_group, matvec_with,
    prepare_x, set_wide_pairs,
};
