//! Weight uploads through reused staging buffers.
//!
//! Loading a model moves tens of gigabytes from the file's pages into GPU buffers. Creating each
//! buffer with its contents (`create_buffer_init`) allocates and zeroes a fresh staging buffer per
//! tensor, and the split layout had been built in a fresh `Vec` before that (experts even
//! concatenated into another): several passes over newly faulted memory per byte, on one thread
//! (the 61.7 GB benchmark file took 104 s to load on an H100). Here each byte is written once,
//! by every core, into one of two mapped staging buffers that live for the whole load; a copy
//! command moves a batch to its buffers while the next batch is written. Only where bytes travel
//! changes: a buffer holds the same bytes either way.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use super::{GpuContext, GpuError};

/// Bytes per staging buffer at most (the default of [`GpuContext::staging_bytes`]). Batches are
/// cut to fit.
pub const STAGING_BYTES: usize = 64 << 20;

/// Staging buffers in flight: one being written while the other's copy runs.
const SLOTS: usize = 2;

/// One copy out of a staged batch: `size` bytes at `src_offset` of the batch into `dst` at
/// `dst_offset` (all multiples of 4, as wgpu's buffer copies require).
pub struct StagedCopy<'a> {
    pub dst: &'a wgpu::Buffer,
    pub dst_offset: u64,
    pub src_offset: u64,
    pub size: u64,
}

type MapResult = Result<(), wgpu::BufferAsyncError>;

struct Slot {
    buffer: wgpu::Buffer,
    /// Set once the slot's copy was submitted: the submission and the map request's answer.
    pending: Option<(wgpu::SubmissionIndex, mpsc::Receiver<MapResult>)>,
}

/// The reused staging buffers of a context (created by the first staged batch, dropped by
/// [`GpuContext::release_staging`]).
pub struct StagingRing {
    slots: Vec<Slot>,
    /// Where a batch is written by several threads before its one copy into mapped memory.
    scratch: Vec<u8>,
    next: usize,
    size: usize,
}

impl StagingRing {
    fn new(ctx: &GpuContext, size: usize) -> Self {
        let slots = (0..SLOTS)
            .map(|i| Slot {
                buffer: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("staging {i}")),
                    size: size as u64,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                }),
                pending: None,
            })
            .collect();
        Self {
            slots,
            scratch: Vec::new(),
            next: 0,
            size,
        }
    }

    /// Wait until every slot is mapped again (no copy in flight).
    fn drain(&mut self, ctx: &GpuContext) -> Result<(), GpuError> {
        for i in 0..self.slots.len() {
            self.ready(ctx, i)?;
        }
        Ok(())
    }

    /// Wait until slot `i` is mapped for writing.
    fn ready(&mut self, ctx: &GpuContext, i: usize) -> Result<(), GpuError> {
        let Some((index, answer)) = self.slots[i].pending.take() else {
            return Ok(());
        };
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map_err(|e| GpuError::Device(format!("poll failed: {e}")))?;
        match answer.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(GpuError::Device(format!("staging map failed: {e}"))),
            Err(_) => Err(GpuError::Device("staging map callback never ran".into())),
        }
    }
}

/// The number of rows of `row_bytes` staged bytes each that fit a batch of `capacity` bytes, a
/// multiple of `align` (at least `align`: callers keep `align` rows below the capacity).
pub fn rows_per_batch(capacity: usize, row_bytes: usize, align: usize) -> usize {
    // 16 bytes spare for the padding of a batch's planes.
    let fit = capacity.saturating_sub(16) / row_bytes.max(1);
    (fit / align * align).max(align)
}

impl GpuContext {
    /// The most bytes one staged batch holds.
    pub fn staging_bytes(&self) -> usize {
        self.staging_limit.load(Ordering::Relaxed)
    }

    /// Set [`Self::staging_bytes`] (at least 64; tests cut uploads into many small batches with
    /// it). Takes effect from the next staged batch.
    pub fn set_staging_bytes(&self, bytes: usize) {
        self.staging_limit.store(bytes.max(64), Ordering::Relaxed);
    }

    /// Stage `len` bytes (at most [`Self::staging_bytes`]) written by `fill` into a slice of exactly
    /// `len` bytes (a reused host buffer, copied into the mapped staging memory in one pass:
    /// that memory may be write-combined, so it is written once and never read), then copy them out by `copies`. The copies run in order after every earlier
    /// staged batch; `fill` runs while the previous batch's copies may still be in flight.
    pub fn stage(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
        copies: &[StagedCopy<'_>],
    ) -> Result<(), GpuError> {
        let padded = len.div_ceil(4) * 4;
        let limit = self.staging_bytes();
        if padded > limit {
            return Err(GpuError::BadArgs(format!(
                "a staged batch of {len} bytes exceeds {limit}"
            )));
        }
        for c in copies {
            let aligned = [c.dst_offset, c.src_offset, c.size]
                .iter()
                .all(|v| v.is_multiple_of(4));
            if !aligned || c.src_offset + c.size > padded as u64 {
                return Err(GpuError::BadArgs(format!(
                    "staged copy of {} bytes at {} (to {}) does not fit a batch of {padded}",
                    c.size, c.src_offset, c.dst_offset
                )));
            }
        }
        let mut guard = match self.staging.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Small first: a tiny model's load needs no 128 MiB of pinned memory.
        let want = padded
            .next_power_of_two()
            .max(1 << 20)
            .min(limit)
            .max(padded);
        if guard.as_ref().is_none_or(|r| r.size < padded) {
            if let Some(mut old) = guard.take() {
                old.drain(self)?;
            }
            *guard = Some(StagingRing::new(self, want));
        }
        let Some(ring) = guard.as_mut() else {
            return Err(GpuError::Device("staging ring missing".into()));
        };
        let i = ring.next;
        ring.ready(self, i)?;
        let slot = &mut ring.slots[i];
        {
            let mut view = slot
                .buffer
                .slice(..padded as u64)
                .get_mapped_range_mut()
                .map_err(|e| GpuError::Device(format!("staging range: {e}")))?;
            ring.scratch.resize(padded, 0);
            let (body, tail) = ring.scratch.split_at_mut(len);
            fill(body);
            tail.fill(0);
            view.copy_from_slice(&ring.scratch[..padded]);
        }
        slot.buffer.unmap();
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("staged upload"),
            });
        for c in copies {
            encoder.copy_buffer_to_buffer(&slot.buffer, c.src_offset, c.dst, c.dst_offset, c.size);
        }
        let index = self.queue.submit([encoder.finish()]);
        let (sender, receiver) = mpsc::channel();
        slot.buffer
            .slice(..)
            .map_async(wgpu::MapMode::Write, move |r| {
                let _ = sender.send(r);
            });
        slot.pending = Some((index, receiver));
        ring.next = (i + 1) % ring.slots.len();
        Ok(())
    }

    /// Wait for every staged copy and free the staging buffers (after a model's load).
    pub fn release_staging(&self) -> Result<(), GpuError> {
        let mut guard = match self.staging.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(mut ring) = guard.take() {
            ring.drain(self)?;
        }
        self.check_errors()
    }
}
