//! `strata bench`: speed and bandwidth, reported as a table and as JSON.
//!
//! * `--model PATH` (or the built-in tiny model): prefill tok/s at the requested prompt lengths,
//!   decode tok/s, bytes of weights read per decoded token, the achieved GB/s and its fraction of
//!   the streaming-read bandwidth measured in the same run, and host time per token.
//! * `--synthetic matvec`: the dequantizing mat-vec per quant type at real widths (random valid
//!   blocks) against the same streaming-read figure — the kernel roofline.
//! * `--synthetic full`: a random model of the real widths (`--layers`, `--routed-experts`),
//!   benchmarked like `--model`.
//!
//! The synthetic mat-vec and the streaming read are timed with GPU timestamps around each dispatch
//! when the adapter has them (else host wall clock with the measured submit + wait overhead of an
//! empty submission subtracted); model prefill/decode rates are host wall clock, with a per-kernel
//! GPU-timestamp profile of one decode step. Every measurement is taken after a warm-up run.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;

use crate::cli::load::adapter_from_env;
use crate::cli::load::{BackendChoice, open_gguf};
use crate::engine::{Backend, Sequence};
use crate::gguf::types::GgmlType;
use crate::gpu::GpuContext;
use crate::gpu::backend::{GpuBackend, GpuSequence};
use crate::gpu::buffers::{GpuBuf, GpuWeight};
use crate::gpu::kernels::{self, Recorder, View};
use crate::gpu::pipelines::PipelineKey;

mod long;
mod parallel;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model to benchmark (default: the built-in tiny model).
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Synthetic benchmark instead of a model: `matvec` (per-quant mat-vec roofline at the real
    /// model's shapes, each mat-vec timed in a chain where it waits for the one before, as in a
    /// decode step, and apart, `indep us`, where the mat-vecs of a pass overlap), `small` (what dependent dispatches cost inside a pass: empty ones of
    /// several grid sizes, a 2.7 MB read and the MoE router) or `full` (a random model of the
    /// real widths, `--layers` and `--routed-experts` deep, run like `--model`).
    #[arg(long)]
    pub synthetic: Option<String>,
    /// Quant types for `--synthetic matvec` (comma-separated, default: all GPU types); for
    /// `--synthetic full` the type of the large matrices (default IQ3_S; rows whose width is not a
    /// multiple of its block use IQ4_NL, as in the published files).
    #[arg(long)]
    pub quant: Option<String>,
    /// `--synthetic matvec`: only these shapes (comma-separated `ROWSxCOLS`, e.g. `10240x2560`;
    /// expert shapes as listed, `640x2560`, select the 10-of-512 expert case). Default: all.
    #[arg(long)]
    pub shapes: Option<String>,
    /// `--synthetic matvec`: `int` times the integer-digit kernel experiment (docs/int-arith.md:
    /// x split into digits inside the mat-vec's workgroups where they hold them, else by a
    /// dispatch of its own, timed apart as `split us`) for the types that have it (the split
    /// layouts but Q4_K and Q5_K: Q8_0, Q6_K, IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ1_S,
    /// IQ1_M, Q2_0; the `arith` column says which rows took it); `default` the engine's
    /// arithmetic. A weight larger than the adapter's binding limit is timed over all its parts.
    #[arg(long, value_enum, default_value = "default")]
    pub arith: ArithChoice,
    /// `--synthetic full`: number of layers (the real model has 48; every 4th is attention).
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// `--synthetic full`: routed experts per layer (the real model has 512; fewer for a quick run).
    #[arg(long, default_value_t = 512)]
    pub routed_experts: usize,
    /// cpu or gpu.
    #[arg(long, value_enum, default_value = "gpu")]
    pub backend: BackendChoice,
    /// Prompt lengths to time prefill at (comma-separated).
    #[arg(long, default_value = "512,4096")]
    pub prefill: String,
    /// Tokens to decode after the shortest prompt.
    #[arg(long, default_value_t = 32)]
    pub decode: usize,
    /// GPU prefill chunk in tokens (0: the engine's default). Results are the same bits for any
    /// chunk; only speed and memory change.
    #[arg(long, default_value_t = 0)]
    pub prefill_chunk: usize,
    /// Context cap per sequence (0 = longest prompt + decode).
    #[arg(long, default_value_t = 0)]
    pub ctx: usize,
    /// After the decode profile, time decode again with each of the N kernels that take the most
    /// GPU time left out (results wrong, speed real): what each costs inside the pipeline, where
    /// per-dispatch timestamps add their own overhead. 16 tokens per kernel.
    #[arg(long, default_value_t = 0)]
    pub ablate: usize,
    /// Also time decode of N sequences advanced together (comma-separated counts, e.g. `1,2,4,8`):
    /// one `--decode` run per count from copies of the decode prompt; on the GPU each step is one
    /// batched pass. Reports the aggregate tok/s.
    #[arg(long, default_value = "")]
    pub parallel: String,
    /// Profile the prefill chunk that starts at this depth (tokens already in the sequence,
    /// fed unprofiled first) instead of one at depth 0: what long prompts cost per kernel.
    #[arg(long, default_value_t = 0)]
    pub profile_at: usize,
    /// Long-context run: prefill the longest `--prefill` length once into one sequence (the
    /// pipelines are built first on a prompt of two chunks; progress every 16,384 tokens), then
    /// decode `--decode` tokens at that depth, and report the VRAM this process uses. No warm-up
    /// of the whole prompt and no sampled, parallel or profiled runs. GPU only.
    #[arg(long)]
    pub long: bool,
    /// Write the JSON report here as well as printing it.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Memory tiers: `--vram-budget` keeps only as many experts in VRAM as fit and serves the
    /// rest from host memory (the report then gives the hit rate and upload bandwidth).
    #[command(flatten)]
    pub tiers: crate::tiers::TierArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let report = match args.synthetic.as_deref() {
        Some("matvec") => bench_matvec(&args)?,
        Some("small") => bench_small()?,
        Some("full") => {
            let gguf = synthetic_full(&args)?;
            bench_model(&args, Some(Arc::new(gguf)))?
        }
        Some(other) => {
            anyhow::bail!("unknown synthetic benchmark {other:?} (expected matvec, small or full)")
        }
        None if args.long => {
            if matches!(args.backend, BackendChoice::Cpu) {
                anyhow::bail!("--long runs on the GPU only (drop --backend cpu)");
            }
            let longest = prefill_lengths(&args)?
                .into_iter()
                .max()
                .unwrap_or(1)
                .max(1);
            long::run(
                open_gguf(args.model.as_deref())?,
                longest,
                args.decode,
                args.prefill_chunk,
                &args.tiers,
            )?
        }
        None => bench_model(&args, None)?,
    };
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(path) = &args.json {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn gpu_context() -> anyhow::Result<Arc<GpuContext>> {
    let ctx = GpuContext::new(adapter_from_env())?;
    eprintln!("adapter: {}", ctx.describe());
    Ok(ctx)
}

/// GPU nanoseconds of each dispatch of `rec`, from timestamps written between the dispatches of
/// one pass; `None` when the adapter has no timestamps inside passes.
fn dispatch_gpu_ns(ctx: &GpuContext, rec: &Recorder) -> anyhow::Result<Option<Vec<f64>>> {
    let Some(stamps) = rec.timestamps(ctx) else {
        return Ok(None);
    };
    let mut encoder = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("bench timestamps"),
        });
    rec.encode(&mut encoder, Some(&stamps.set));
    stamps.resolve(&mut encoder);
    ctx.queue.submit([encoder.finish()]);
    ctx.wait()?;
    Ok(Some(
        stamps
            .read(ctx, rec)?
            .into_iter()
            .map(|(_, ns)| ns)
            .collect(),
    ))
}

/// Dispatches in one timed pass of the synthetic mat-vec bench.
const MATVEC_PASS: usize = 128;

/// Keep the GPU busy with `rec` for about 0.3 s, several submissions queued at a time: after the
/// host spent seconds writing random blocks the clocks are down (the H200 idles at 345 MHz and
/// runs at 1,980), and a pass timed before they ramp up measures the ramp, not the kernel.
fn warm_up(ctx: &GpuContext, rec: &Recorder) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < 0.3 {
        for _ in 0..4 {
            rec.submit(ctx);
        }
        ctx.wait()?;
    }
    Ok(())
}

/// Host seconds of the fastest of `runs` submit + wait round trips of `rec`.
fn best_wall_seconds(ctx: &GpuContext, rec: &Recorder, runs: usize) -> anyhow::Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let start = Instant::now();
        rec.run(ctx)?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Host round trip of a submission holding one empty-range dispatch: the fixed cost that wall
/// clock timings include on top of the GPU work.
fn submit_overhead_seconds(ctx: &GpuContext) -> anyhow::Result<f64> {
    let src = GpuBuf::zeros(ctx, "overhead probe", 4)?;
    let out = GpuBuf::zeros(ctx, "overhead probe out", 256)?;
    let mut rec = Recorder::new();
    rec.push(
        ctx,
        &PipelineKey::new("read", "read_stream"),
        &[(0, &src.buffer), (1, &out.buffer)],
        bytemuck::bytes_of(&0u32),
        [1, 1, 1],
    )?;
    rec.run(ctx)?;
    best_wall_seconds(ctx, &rec, 20)
}

/// Streaming read bandwidth: a 16-byte-load xor reduction over the largest buffer the adapter
/// binds (capped at 1 GiB), best of several passes.
struct StreamingRead {
    gbps: f64,
    timing: &'static str,
}

fn streaming_read(ctx: &GpuContext, overhead: f64) -> anyhow::Result<StreamingRead> {
    let bytes = (ctx.max_binding_bytes().min(1 << 30) as usize) / 16 * 16;
    let words = bytes / 4;
    let src = GpuBuf::zeros(ctx, "read probe", words)?;
    // Non-zero content so nothing can be skipped.
    let chunk: Vec<u32> = (0..(1usize << 20).min(words))
        .map(|i| i as u32 ^ 0x9E37_79B9)
        .collect();
    let mut offset = 0;
    while offset < words {
        let n = chunk.len().min(words - offset);
        src.write_u32(ctx, offset, &chunk[..n])?;
        offset += n;
    }
    let workgroups = 4096usize;
    let out = GpuBuf::zeros(ctx, "read probe out", workgroups * 256)?;
    let mut rec = Recorder::new();
    let n_vec4 = u32::try_from(bytes / 16)?;
    rec.push(
        ctx,
        &PipelineKey::new("read", "read_stream"),
        &[(0, &src.buffer), (1, &out.buffer)],
        bytemuck::bytes_of(&n_vec4),
        [workgroups as u32, 1, 1],
    )?;
    rec.run(ctx)?;
    if dispatch_gpu_ns(ctx, &rec)?.is_some() {
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            if let Some(ns) = dispatch_gpu_ns(ctx, &rec)? {
                best = best.min(ns.iter().sum::<f64>() * 1e-9);
            }
        }
        return Ok(StreamingRead {
            gbps: bytes as f64 / best / 1e9,
            timing: "GPU timestamps, best of 5",
        });
    }
    let wall = best_wall_seconds(ctx, &rec, 5)?;
    Ok(StreamingRead {
        gbps: bytes as f64 / (wall - overhead).max(1e-9) / 1e9,
        timing: "host wall clock minus submit overhead, best of 5",
    })
}

/// Streaming read bandwidth in GB/s (see [`streaming_read`]).
fn streaming_read_gbps(ctx: &GpuContext) -> anyhow::Result<f64> {
    let overhead = submit_overhead_seconds(ctx)?;
    Ok(streaming_read(ctx, overhead)?.gbps)
}

#[derive(serde::Serialize)]
struct MatvecRow {
    quant: String,
    /// `int` where the integer-digit experiment ran this row.
    arith: &'static str,
    /// That experiment's split of x where it is a dispatch of its own, GPU microseconds.
    split_microseconds: Option<f64>,
    rows: usize,
    cols: usize,
    /// Expert shapes: experts selected per token (of `MATVEC_EXPERTS`).
    experts: Option<usize>,
    weight_bytes: usize,
    /// Weights + x + y: what one mat-vec must move at least.
    bytes_moved: usize,
    /// GPU time of one mat-vec from per-dispatch timestamps (None without timestamps).
    gpu_microseconds: Option<f64>,
    /// Host wall clock of the rotating pass divided by its mat-vecs, after subtracting the
    /// submit + wait overhead of an empty submission.
    wall_microseconds: f64,
    /// `bytes_moved` over the GPU time when measured, else over the wall time.
    gbps: f64,
    fraction_of_streaming_read: f64,
    /// The same pass with every mat-vec writing an output of its own, so none waits for the one
    /// before (wgpu puts no barrier between them): host wall less the submit overhead, per
    /// mat-vec. What the kernel streams when dispatches overlap, without the dependent chain.
    independent_microseconds: f64,
    /// `bytes_moved` over `independent_microseconds`, as a fraction of the streaming read.
    independent_fraction_of_streaming_read: f64,
}

/// The arithmetic `--synthetic matvec` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ArithChoice {
    Default,
    Int,
}

fn bench_matvec(args: &Args) -> anyhow::Result<serde_json::Value> {
    let ctx = gpu_context()?;
    ctx.set_idot(args.arith == ArithChoice::Int);
    let overhead = submit_overhead_seconds(&ctx)?;
    let read = streaming_read(&ctx, overhead)?;
    let types: Vec<GgmlType> = match &args.quant {
        Some(list) => list
            .split(',')
            .map(|n| {
                GgmlType::from_name(n.trim()).with_context(|| format!("unknown quant type {n:?}"))
            })
            .collect::<anyhow::Result<_>>()?,
        None => GgmlType::all()
            .filter(|t| crate::gpu::shaders::supports(*t))
            .collect(),
    };
    let mut table = Vec::new();
    for ty in types {
        for shape in MATVEC_SHAPES {
            if !shape_selected(args.shapes.as_deref(), shape) {
                continue;
            }
            if !shape.cols.is_multiple_of(ty.block_size()) {
                continue;
            }
            table.push(time_matvec(&ctx, ty, shape, overhead, read.gbps)?);
        }
    }
    eprintln!(
        "streaming read: {:.1} GB/s ({}); submit + wait overhead {:.1} us (subtracted from wall)",
        read.gbps,
        read.timing,
        overhead * 1e6
    );
    eprintln!(
        "{:<8} {:<7} {:<22} {:>12} {:>10} {:>10} {:>8} {:>7} {:>9} {:>9} {:>7}",
        "quant",
        "arith",
        "shape",
        "bytes",
        "gpu us",
        "wall us",
        "GB/s",
        "of read",
        "split us",
        "indep us",
        "of read"
    );
    for r in &table {
        let gpu = r
            .gpu_microseconds
            .map_or_else(|| "-".to_string(), |us| format!("{us:.1}"));
        let shape = match r.experts {
            Some(e) => format!("{}x{} {}/{}", r.rows, r.cols, e, MATVEC_EXPERTS),
            None => format!("{}x{}", r.rows, r.cols),
        };
        let split = r
            .split_microseconds
            .map_or_else(|| "-".to_string(), |us| format!("{us:.1}"));
        eprintln!(
            "{:<8} {:<7} {:<22} {:>12} {:>10} {:>10.1} {:>8.1} {:>6.1}% {:>9} {:>9.1} {:>6.1}%",
            r.quant,
            r.arith,
            shape,
            r.bytes_moved,
            gpu,
            r.wall_microseconds,
            r.gbps,
            r.fraction_of_streaming_read * 100.0,
            split,
            r.independent_microseconds,
            r.independent_fraction_of_streaming_read * 100.0
        );
    }
    Ok(serde_json::json!({
        "benchmark": "matvec",
        "adapter": ctx.adapter,
        "timing": "per mat-vec: GPU timestamps around every dispatch of a pass over 2 to 8 \
                   rotating matrices, a mat-vec's parts added, the pass's median, best of 3 \
                   passes (gbps uses it when the adapter has timestamps); wall = best of 3 \
                   passes minus the submit overhead, divided by the pass's mat-vecs; \
                   independent = the same pass with an output per mat-vec (no mat-vec waits \
                   for another), timed the same way as wall",
        "submit_overhead_microseconds": overhead * 1e6,
        "streaming_read_gbps": read.gbps,
        "streaming_read_timing": read.timing,
        "results": table,
    }))
}

/// What a small single-workgroup kernel costs inside a pass: 100 dependent dispatches of it
/// (each writes what the next reads, so each waits for the one before), host wall per dispatch,
/// best of 5, less the submit overhead. An empty dispatch gives the floor; then each router entry
/// point at the real model's 512 experts choosing 10 for one token.
fn bench_small() -> anyhow::Result<serde_json::Value> {
    const N: usize = 100;
    let ctx = gpu_context()?;
    let overhead = submit_overhead_seconds(&ctx)?;
    let per_dispatch = |rec: &Recorder| -> anyhow::Result<f64> {
        Ok((best_wall_seconds(&ctx, rec, 5)? - overhead) / N as f64 * 1e6)
    };
    let mut rows = Vec::new();
    // An empty dispatch, what a grid costs by itself, and one pass over a small weight's bytes:
    // the floor under the decode step's small kernels (every one of these dispatches writes
    // `out`, so each depends on the one before).
    let src = GpuBuf::zeros(&ctx, "probe source", 1 << 20)?;
    let out = GpuBuf::zeros(&ctx, "probe out", 4096 * 256)?;
    for (what, groups, n_vec4) in [
        ("empty dispatch", 1u32, 0u32),
        ("empty grid of 64 x 256", 64, 0),
        ("empty grid of 512 x 256", 512, 0),
        ("empty grid of 4096 x 256", 4096, 0),
        ("read 2.7 MB (L2), 512 x 256", 512, 172_032),
        ("read 2.7 MB (L2), 4096 x 256", 4096, 172_032),
    ] {
        let mut rec = Recorder::new();
        for _ in 0..N {
            rec.push(
                &ctx,
                &PipelineKey::new("read", "read_stream"),
                &[(0, &src.buffer), (1, &out.buffer)],
                bytemuck::bytes_of(&n_vec4),
                [groups, 1, 1],
            )?;
        }
        rows.push((what.to_string(), per_dispatch(&rec)?));
    }
    let n_expert = 512;
    let logits: Vec<f32> = (0..n_expert)
        .map(|i| ((i * 37) % 101) as f32 * 0.01)
        .collect();
    let entries = ["moe_router_wide", "moe_router"];
    for (entry, k) in entries.iter().flat_map(|e| [(*e, 1), (*e, 10)]) {
        let lb = GpuBuf::from_f32(&ctx, "logits", &logits)?;
        let ids = GpuBuf::zeros(&ctx, "ids", k)?;
        let wts = GpuBuf::zeros(&ctx, "wts", k)?;
        let mut rec = Recorder::new();
        for _ in 0..N {
            crate::gpu::ops::moe_router_entry(
                &ctx, &mut rec, entry, &lb, &ids, &wts, n_expert, k, 1,
            )?;
        }
        rec.run(&ctx)?;
        rows.push((format!("{entry} {n_expert}/{k}"), per_dispatch(&rec)?));
    }
    for (what, us) in &rows {
        eprintln!("{what:<32} {us:>8.2} us per dispatch");
    }
    Ok(serde_json::json!({
        "benchmark": "small",
        "timing": "host wall of 100 dependent dispatches in one pass, best of 5, less the submit overhead",
        "results": rows.iter().map(|(w, us)| serde_json::json!({"kernel": w, "us": us})).collect::<Vec<_>>(),
    }))
}

/// Whether `--shapes` (a comma-separated list of `ROWSxCOLS`) names `shape`; no list names all.
fn shape_selected(list: Option<&str>, shape: &MatvecShape) -> bool {
    let name = format!("{}x{}", shape.rows, shape.cols);
    list.is_none_or(|l| l.split(',').any(|s| s.trim() == name))
}

/// A mat-vec shape of the real model: `rows` x `cols`, or `experts` of 512 stacked matrices.
#[derive(Clone, Copy)]
struct MatvecShape {
    rows: usize,
    cols: usize,
    experts: Option<usize>,
}

const MATVEC_EXPERTS: usize = 512;

/// GDN qkv / z, QSA q, GDN and QSA out, HC down / up, the head, routed gate-up and down.
const MATVEC_SHAPES: &[MatvecShape] = &[
    MatvecShape {
        rows: 10240,
        cols: 2560,
        experts: None,
    },
    // The GDN input projection (q|k|v, z, beta|alpha) and the router with the shared expert's
    // gate, as the model runs them (joined).
    MatvecShape {
        rows: 16480,
        cols: 2560,
        experts: None,
    },
    MatvecShape {
        rows: 513,
        cols: 2560,
        experts: None,
    },
    MatvecShape {
        rows: 12288,
        cols: 2560,
        experts: None,
    },
    MatvecShape {
        rows: 2560,
        cols: 6144,
        experts: None,
    },
    MatvecShape {
        rows: 320,
        cols: 10240,
        experts: None,
    },
    MatvecShape {
        rows: 10240,
        cols: 320,
        experts: None,
    },
    MatvecShape {
        rows: 248320,
        cols: 2560,
        experts: None,
    },
    MatvecShape {
        rows: 640,
        cols: 2560,
        experts: Some(10),
    },
    MatvecShape {
        rows: 2560,
        cols: 640,
        experts: Some(10),
    },
];

/// One shape and type: a pass over several copies (rotated so the weights do not sit in cache),
/// GPU time per mat-vec from dispatch timestamps, best of 3 passes.
fn time_matvec(
    ctx: &Arc<GpuContext>,
    ty: GgmlType,
    shape: &MatvecShape,
    overhead: f64,
    read_gbps: f64,
) -> anyhow::Result<MatvecRow> {
    let MatvecShape {
        rows,
        cols,
        experts,
    } = *shape;
    let units = if experts.is_some() { MATVEC_EXPERTS } else { 1 };
    let blocks = rows * units * (cols / ty.block_size());
    let tensor_bytes = blocks * ty.type_size();
    // 2 to 8 copies, about 1 GiB in all where that fits, so the L2 never holds what a pass reads.
    let copies = (1usize << 30).div_ceil(tensor_bytes.max(1)).clamp(2, 8);
    let mut weights = Vec::new();
    for copy in 0..copies {
        let bytes = crate::quant::random_blocks(ty, blocks, copy as u64 + 1);
        let unit_rows = if experts.is_some() { rows } else { 1 };
        weights.push(GpuWeight::upload(
            ctx,
            ty.name(),
            ty,
            cols,
            rows * units,
            unit_rows,
            &bytes,
        )?);
    }
    let k = experts.unwrap_or(1);
    let x_values: Vec<f32> = (0..cols).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let x = GpuBuf::from_f32(ctx, "x", &x_values)?;
    let y = GpuBuf::zeros(ctx, "y", rows * k)?;
    // Experts spread over the tensor, as a router would pick them.
    let ids: Vec<u32> = (0..k).map(|i| (i * 37 % MATVEC_EXPERTS) as u32).collect();
    let ids = GpuBuf::from_u32(ctx, "ids", &ids)?;
    // The copies in turn, repeated to at least MATVEC_PASS dispatches: one pass keeps the GPU
    // busy for a while, so its clocks stay up while it is timed.
    let rounds = MATVEC_PASS.div_ceil(copies);
    let record = |outputs: &[GpuBuf]| -> anyhow::Result<Recorder> {
        let mut rec = Recorder::new();
        let weights = weights.iter().cycle().take(rounds * copies);
        for (w, y) in weights.zip(outputs.iter().cycle()) {
            let (xv, yv) = (View::new(&x, 0, cols), View::new(y, 0, rows));
            match experts {
                Some(k) => kernels::matvec_expert(ctx, &mut rec, w, &ids, k, false, xv, yv, k)?,
                None => kernels::matvec(ctx, &mut rec, w, xv, yv, 1)?,
            }
        }
        Ok(rec)
    };
    // Every mat-vec writes the one output, so each waits for the one before (a decode step's
    // chain); then each its own output (no waits).
    let rec = record(std::slice::from_ref(&y))?;
    warm_up(ctx, &rec)?;
    // A mat-vec records a dispatch per part of the weight (a tensor over the adapter's binding
    // limit has several), after the integer-digit split where it has one.
    let per_matvec = rec.len() / (rounds * copies);
    let splits = per_matvec.saturating_sub(weights[0].parts.len());
    // The median mat-vec of the pass (robust to a clock change inside it; its parts' dispatches
    // added), best of 3 passes; the splits apart.
    let mut gpu_seconds: Option<f64> = None;
    let mut split_seconds: Option<f64> = None;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] * 1e-9
    };
    for _ in 0..3 {
        if let Some(ns) = dispatch_gpu_ns(ctx, &rec)? {
            let groups = ns.chunks_exact(per_matvec);
            let mut mv: Vec<f64> = groups.clone().map(|g| g[splits..].iter().sum()).collect();
            let per = median(&mut mv);
            gpu_seconds = Some(gpu_seconds.map_or(per, |best| best.min(per)));
            if splits > 0 {
                let mut sp: Vec<f64> = groups.map(|g| g[..splits].iter().sum()).collect();
                let per = median(&mut sp);
                split_seconds = Some(split_seconds.map_or(per, |best| best.min(per)));
            }
        }
    }
    let dispatches = (rounds * copies) as f64;
    let wall = (best_wall_seconds(ctx, &rec, 3)? - overhead).max(1e-9) / dispatches;
    let outputs = (0..rounds * copies)
        .map(|_| GpuBuf::zeros(ctx, "y", rows * k))
        .collect::<Result<Vec<_>, _>>()?;
    let apart = record(&outputs)?;
    warm_up(ctx, &apart)?;
    let independent = (best_wall_seconds(ctx, &apart, 3)? - overhead).max(1e-9) / dispatches;
    let weight_bytes = rows * k * (cols / ty.block_size()) * ty.type_size();
    let bytes_moved = weight_bytes + 4 * (rows * k + cols);
    let gbps = bytes_moved as f64 / gpu_seconds.unwrap_or(wall) / 1e9;
    Ok(MatvecRow {
        quant: ty.name().to_string(),
        arith: if ctx.idot() && crate::gpu::shaders::idot_supported(ty) {
            "int"
        } else {
            "default"
        },
        split_microseconds: split_seconds.map(|s| s * 1e6),
        rows,
        cols,
        experts,
        weight_bytes,
        bytes_moved,
        gpu_microseconds: gpu_seconds.map(|s| s * 1e6),
        wall_microseconds: wall * 1e6,
        gbps,
        fraction_of_streaming_read: gbps / read_gbps,
        independent_microseconds: independent * 1e6,
        independent_fraction_of_streaming_read: bytes_moved as f64 / independent / 1e9 / read_gbps,
    })
}

/// The decode prompt, prefilled once: every decode measurement starts from a copy of it, so a
/// long prompt costs one prefill rather than one per measurement.
enum Prompted {
    Gpu(GpuSequence),
    Any(Box<dyn Sequence>),
}

impl Prompted {
    fn new(
        backend: &Arc<dyn Backend>,
        gpu: Option<&Arc<GpuBackend>>,
        prompt: &[u32],
    ) -> anyhow::Result<Self> {
        Ok(match gpu {
            Some(b) => {
                let mut seq = b.sequence()?;
                seq.feed(prompt, false)?;
                Prompted::Gpu(seq)
            }
            None => {
                let mut seq = Arc::clone(backend).new_sequence()?;
                seq.feed(prompt, false)?;
                Prompted::Any(seq)
            }
        })
    }

    fn fork(&self) -> anyhow::Result<Box<dyn Sequence>> {
        match self {
            Prompted::Gpu(seq) => Ok(Box::new(seq.try_fork()?)),
            Prompted::Any(seq) => seq.fork().context("the backend could not copy a sequence"),
        }
    }

    fn fork_gpu(&self) -> anyhow::Result<GpuSequence> {
        match self {
            Prompted::Gpu(seq) => Ok(seq.try_fork()?),
            Prompted::Any(_) => anyhow::bail!("not a GPU sequence"),
        }
    }
}

/// GPU time per kernel of `seq` feeding `feed` (one chunk), printed under `what`.
fn profile_feed(
    mut seq: GpuSequence,
    feed: &[u32],
    what: &str,
) -> anyhow::Result<serde_json::Value> {
    seq.set_profiling(true);
    seq.feed(feed, false)?;
    let timings = seq.take_timings();
    if timings.is_empty() {
        eprintln!("per-kernel timestamps: not available on this adapter");
        return Ok(serde_json::Value::Null);
    }
    let mut by_kernel: Vec<(String, f64, usize)> = Vec::new();
    for (label, ns) in &timings {
        match by_kernel.iter_mut().find(|(l, _, _)| l == label) {
            Some(entry) => {
                entry.1 += ns;
                entry.2 += 1;
            }
            None => by_kernel.push((label.clone(), *ns, 1)),
        }
    }
    by_kernel.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = timings.iter().map(|(_, ns)| ns).sum();
    eprintln!(
        "{what}: {} dispatches, {:.3} ms of GPU time",
        timings.len(),
        total / 1e6
    );
    for (label, ns, n) in by_kernel.iter().take(12) {
        eprintln!(
            "  {label:<32} {n:>5} x  {:>9.1} us  {:>5.1}%",
            ns / 1e3,
            ns / total * 100.0
        );
    }
    Ok(serde_json::json!({
        "dispatches": timings.len(),
        "gpu_ms": total / 1e6,
        "by_kernel": by_kernel
            .iter()
            .map(|(l, ns, n)| serde_json::json!({"kernel": l, "dispatches": n, "us": ns / 1e3}))
            .collect::<Vec<_>>(),
        // Every dispatch in recording order (label, GPU us): where a layer's time goes.
        "timeline": timings
            .iter()
            .map(|(l, ns)| serde_json::json!([l, (ns / 10.0).round() / 100.0]))
            .collect::<Vec<_>>(),
    }))
}

/// Deterministic token ids for timing (no tokenizer involved).
fn bench_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab.max(1) as u64) as u32
        })
        .collect()
}

/// The `--prefill` lengths.
fn prefill_lengths(args: &Args) -> anyhow::Result<Vec<usize>> {
    args.prefill
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .with_context(|| format!("bad prefill length {s:?}"))
        })
        .collect()
}

fn bench_model(
    args: &Args,
    synthetic: Option<Arc<crate::gguf::Gguf>>,
) -> anyhow::Result<serde_json::Value> {
    let lengths = prefill_lengths(args)?;
    let parallel_counts = parallel::counts(&args.parallel)?;
    let longest = lengths.iter().copied().max().unwrap_or(1);
    let shortest = lengths.iter().copied().min().unwrap_or(1).max(1);
    let gguf = match synthetic {
        Some(g) => g,
        None => open_gguf(args.model.as_deref())?,
    };
    let model_ctx = crate::model::config::Config::from_gguf(&gguf)?.context_length;
    let ablate_tokens = (args.ablate + 2) * ABLATE_STEPS;
    let ctx_len = if args.ctx == 0 {
        (longest
            .max(shortest + args.decode.max(ablate_tokens))
            .max(args.profile_at + longest)
            + 1)
        .min(model_ctx)
    } else {
        args.ctx
    };
    let mut gpu_backend = None;
    let (backend, gpu, bytes_per_token, read_gbps): (
        Arc<dyn Backend>,
        Option<serde_json::Value>,
        Option<usize>,
        Option<f64>,
    ) = match args.backend {
        BackendChoice::Cpu => (
            crate::cli::load::load_backend(gguf, BackendChoice::Cpu, ctx_len)?,
            None,
            None,
            None,
        ),
        BackendChoice::Gpu | BackendChoice::Auto => {
            let ctx = gpu_context()?;
            let read = streaming_read_gbps(&ctx)?;
            let mut loaded = GpuBackend::load_with(ctx.clone(), gguf, ctx_len, &args.tiers)?;
            if args.prefill_chunk > 0 {
                loaded.set_max_chunk(args.prefill_chunk);
            }
            let b = Arc::new(loaded);
            let bytes = b.bytes_per_decoded_token();
            gpu_backend = Some(Arc::clone(&b));
            (
                b,
                Some(serde_json::to_value(&ctx.adapter)?),
                Some(bytes),
                Some(read),
            )
        }
    };
    let vocab = backend.info().vocab_size;
    let mut prefill = Vec::new();
    for &n in &lengths {
        if n > ctx_len {
            anyhow::bail!("prefill length {n} exceeds the context {ctx_len}");
        }
        let tokens = bench_tokens(n, vocab);
        // Warm-up on the same prompt: every pipeline it takes (tile widths and remainders follow
        // the length) is compiled and every buffer touched before the timed run.
        Arc::clone(&backend).new_sequence()?.feed(&tokens, false)?;
        let mut seq = Arc::clone(&backend).new_sequence()?;
        let start = Instant::now();
        seq.feed(&tokens, false)?;
        let secs = start.elapsed().as_secs_f64();
        prefill.push(
            serde_json::json!({"tokens": n, "seconds": secs, "tokens_per_second": n as f64 / secs}),
        );
    }
    // The prompt (prefilled once: each decode measurement below starts from a copy), one untimed
    // decode step (its pipelines are built on first use), then the timed steps.
    let tokens = bench_tokens(shortest + 1 + args.decode, vocab);
    let base = Prompted::new(&backend, gpu_backend.as_ref(), &tokens[..shortest])?;
    let mut seq = base.fork()?;
    seq.feed(&tokens[shortest..shortest + 1], false)?;
    let mut per_token = Vec::with_capacity(args.decode);
    let start = Instant::now();
    for &t in &tokens[shortest + 1..] {
        let step = Instant::now();
        seq.feed(&[t], false)?;
        per_token.push(step.elapsed().as_secs_f64());
    }
    let decode_secs = start.elapsed().as_secs_f64();
    let decode_tps = args.decode as f64 / decode_secs.max(1e-12);
    per_token.sort_by(f64::total_cmp);
    let median = per_token.get(per_token.len() / 2).copied().unwrap_or(0.0);
    drop(seq);
    let sampled = sampled_decode(&base, &tokens, shortest)?;
    let step_gpu = match &gpu_backend {
        Some(_) => step_gpu_seconds(&base, &tokens, shortest)?,
        None => None,
    };
    let decode_parallel = if parallel_counts.is_empty() {
        serde_json::Value::Null
    } else {
        parallel::decode(
            &backend,
            &base,
            &tokens[shortest..],
            &parallel_counts,
            args.decode.max(2),
        )?
    };
    let achieved = bytes_per_token.map(|b| b as f64 * decode_tps / 1e9);
    let kernels = match &gpu_backend {
        Some(_) => Some(profile_feed(
            base.fork_gpu()?,
            &tokens[shortest..shortest + 1],
            "decode step",
        )?),
        None => None,
    };
    let ablation = match (&gpu_backend, &kernels) {
        (Some(b), Some(k)) if args.ablate > 0 => Some(ablate(b, &base, k, args.ablate)?),
        _ => None,
    };
    // One full prefill chunk of the longest prompt, at depth `--profile-at`.
    let prefill_kernels = match &gpu_backend {
        Some(b) => {
            let n = longest.min(b.max_chunk());
            let depth = args.profile_at;
            let tokens = bench_tokens(depth + n, vocab);
            let mut seq = b.sequence()?;
            if depth > 0 {
                seq.feed(&tokens[..depth], false)?;
            }
            let what = format!("prefill chunk of {n} tokens at depth {depth}");
            Some(profile_feed(seq, &tokens[depth..], &what)?)
        }
        None => None,
    };
    eprintln!(
        "model: {} on {}",
        backend.info().name,
        backend.info().backend
    );
    for p in &prefill {
        eprintln!(
            "prefill {:>6} tokens: {:>10.1} tok/s",
            p["tokens"],
            p["tokens_per_second"].as_f64().unwrap_or(0.0)
        );
    }
    eprintln!(
        "decode  {:>6} tokens: {decode_tps:>10.1} tok/s (median {:.3} ms/token host wall)",
        args.decode,
        median * 1e3
    );
    for (what, tps) in [
        ("candidates found on the GPU", sampled.0),
        ("whole logits row read back", sampled.1),
    ] {
        eprintln!(
            "decode  {:>6} tokens: {tps:>10.1} tok/s sampled (top-k 20, top-p 0.95, temperature \
             0.6): {what}",
            args.decode
        );
    }
    // The host's share of a sampled step: its wall time less the GPU's own time for it.
    let host_overhead = step_gpu.map(|g| 1.0 / sampled.0.max(1e-12) - g);
    if let (Some(g), Some(o)) = (step_gpu, host_overhead) {
        eprintln!(
            "decode step on the GPU: {:.3} ms (median, the step in one pass timed at its ends); \
             host overhead {:.3} ms per token (the sampled step's {:.3} ms wall less that)",
            g * 1e3,
            o * 1e3,
            1e3 / sampled.0.max(1e-12)
        );
    }
    if let (Some(b), Some(a), Some(r)) = (bytes_per_token, achieved, read_gbps) {
        eprintln!(
            "weights read per token: {b} bytes; {a:.2} GB/s = {:.1}% of the {r:.1} GB/s streaming read",
            a / r * 100.0
        );
    }
    let tiers = gpu_backend.as_ref().and_then(|b| b.tier_stats());
    let pinned = gpu_backend.as_ref().map_or((0, 0), |b| {
        (b.pinned_expert_bytes(), b.pinned_bytes_per_decoded_token())
    });
    let stage = gpu_backend.as_ref().and_then(|b| b.expert_stage_units());
    if let (true, Some(t)) = (pinned.0 > 0, &tiers) {
        // Routed bytes of a token that the hot copies did not serve cross the bus.
        let bus = pinned.1 as f64 * (1.0 - t.hit_rate());
        let read = match stage {
            Some(units) => format!(
                "a decode step's misses copied into a VRAM stage of {units}, longer steps' read \
                 in place"
            ),
            None => "read in place".to_string(),
        };
        eprintln!(
            "experts: all in pinned host memory ({:.2} GB), {read}; {} hot copies in VRAM, \
             hit rate {:.1}% over every token fed ({} hits, {} misses), {} promotions ({:.2} GB \
             copied); {:.3} GB per decoded token over the bus = {:.2} GB/s at the decode rate",
            pinned.0 as f64 / 1e9,
            t.slots,
            t.hit_rate() * 100.0,
            t.hits,
            t.misses,
            t.promotions,
            t.bytes_uploaded as f64 / 1e9,
            bus / 1e9,
            bus * decode_tps / 1e9
        );
        eprintln!(
            "hit rate per layer: {}",
            per_layer_rates(&t.per_layer).join(" ")
        );
    } else if let Some(t) = tiers.as_ref().filter(|t| t.slots == 0) {
        eprintln!(
            "expert slots: none needed ({} experts accounted), every expert resident in VRAM",
            t.total_experts
        );
    } else if let Some(t) = &tiers {
        eprintln!(
            "expert slots: {} of {} experts in VRAM; hit rate {:.1}% ({} hits, {} misses); \
             {:.2} GB uploaded at {:.2} GB/s",
            t.slots,
            t.total_experts,
            t.hit_rate() * 100.0,
            t.hits,
            t.misses,
            t.bytes_uploaded as f64 / 1e9,
            t.upload_gb_per_s()
        );
        eprintln!(
            "hit rate per layer: {}",
            per_layer_rates(&t.per_layer).join(" ")
        );
    }
    let rss = host_rss_bytes();
    if let Some(r) = rss {
        eprintln!("host RSS: {:.2} GB", r as f64 / 1e9);
    }
    Ok(serde_json::json!({
        "benchmark": "model",
        "pinned_expert_bytes": pinned.0,
        "pinned_bytes_per_decoded_token": pinned.1,
        "expert_stage_units": stage,
        "expert_tier": tiers.as_ref().map(|t| serde_json::json!({
            "slots": t.slots,
            "total_experts": t.total_experts,
            "hits": t.hits,
            "misses": t.misses,
            "hit_rate": t.hit_rate(),
            "per_layer": t.per_layer.iter().enumerate()
                .filter(|(_, (h, m))| h + m > 0)
                .map(|(l, (h, m))| serde_json::json!({"layer": l, "hits": h, "misses": m}))
                .collect::<Vec<_>>(),
            "bytes_uploaded": t.bytes_uploaded,
            "upload_gb_per_s": t.upload_gb_per_s(),
            "promotions": t.promotions,
        })),
        "host_rss_bytes": rss,
        "model": backend.info().name,
        "backend": backend.info().backend,
        "adapter": gpu,
        "timing": "host wall clock; decode = one feed call per token (includes the logits readback)",
        "prefill": prefill,
        "decode_tokens": args.decode,
        "decode_tokens_per_second": decode_tps,
        "decode_median_ms_per_token": median * 1e3,
        "decode_sampled_top_tokens_per_second": sampled.0,
        "decode_sampled_row_tokens_per_second": sampled.1,
        "decode_step_gpu_ms": step_gpu.map(|g| g * 1e3),
        "decode_host_overhead_ms": host_overhead.map(|o| o * 1e3),
        "decode_parallel": decode_parallel,
        "weight_bytes_per_decoded_token": bytes_per_token,
        "achieved_gbps": achieved,
        "streaming_read_gbps": read_gbps,
        "fraction_of_streaming_read": achieved.zip(read_gbps).map(|(a, r)| a / r),
        "decode_step_kernels": kernels,
        "prefill_chunk_kernels": prefill_kernels,
        "ablation": ablation,
    }))
}

/// Decode tok/s (host wall, from the median step) of the tokens after `tokens[..prompt + 2]`
/// with the default sampling settings: sampling from the first candidates a top-only pass returns
/// (on the GPU the logits row stays there), then from the whole row read back, as a server's
/// sampled requests do. One untimed step of each kind first: it builds that kind's pipelines.
fn sampled_decode(base: &Prompted, tokens: &[u32], prompt: usize) -> anyhow::Result<(f64, f64)> {
    let params = crate::sampler::SamplingParams {
        seed: Some(1),
        ..Default::default()
    };
    let mut rates = [0.0; 2];
    for (i, rate) in rates.iter_mut().enumerate() {
        let mut sampler = crate::sampler::Sampler::new(&params, &tokens[..prompt])?;
        let k = sampler
            .top_only()
            .context("the default sampling settings take the candidate path")?;
        let mut seq = base.fork()?;
        let mut steps = Vec::new();
        for (pos, &t) in tokens.iter().enumerate().skip(prompt) {
            let start = Instant::now();
            if i == 0 {
                let top = seq.feed_top(&[t], k)?;
                sampler.sample_top(&top, pos + 1)?;
            } else {
                let logits = seq.feed(&[t], false)?;
                sampler.sample(&logits, pos + 1)?;
            }
            if pos > prompt {
                steps.push(start.elapsed().as_secs_f64());
            }
        }
        steps.sort_by(f64::total_cmp);
        let median = steps.get(steps.len() / 2).copied().unwrap_or(0.0);
        *rate = 1.0 / median.max(1e-12);
    }
    Ok((rates[0], rates[1]))
}

/// The GPU's own time for a sampled decode step (the median of the tokens after
/// `tokens[..prompt + 1]`, at most 16): each step's forward and candidate pass recorded in one
/// pass with a timestamp at each end, so nothing of the host's recording, submission or readback
/// is in it. `None` where the adapter has no timestamp queries.
fn step_gpu_seconds(base: &Prompted, tokens: &[u32], prompt: usize) -> anyhow::Result<Option<f64>> {
    let params = crate::sampler::SamplingParams::default();
    let sampler = crate::sampler::Sampler::new(&params, &tokens[..prompt])?;
    let k = sampler
        .top_only()
        .context("the default sampling settings take the candidate path")?;
    let mut seq = base.fork_gpu()?;
    seq.set_span_timing(true);
    let steps = tokens.iter().skip(prompt).take(17);
    for &t in steps {
        seq.feed_top(&[t], k)?;
    }
    let mut spans: Vec<f64> = seq
        .take_timings()
        .into_iter()
        .skip(1)
        .map(|(_, ns)| ns * 1e-9)
        .collect();
    if spans.is_empty() {
        return Ok(None);
    }
    spans.sort_by(f64::total_cmp);
    Ok(Some(spans[spans.len() / 2]))
}

const ABLATE_STEPS: usize = 16;

/// Median decode step (host wall) with each of the `n` costliest kernels of `profile` left out in
/// turn, from a copy of the prompted sequence `base`, with the full step timed before and after
/// them (see `Args::ablate`).
fn ablate(
    backend: &Arc<GpuBackend>,
    base: &Prompted,
    profile: &serde_json::Value,
    n: usize,
) -> anyhow::Result<serde_json::Value> {
    let labels: Vec<String> = profile["by_kernel"]
        .as_array()
        .map(|a| {
            a.iter()
                .take(n)
                .filter_map(|k| k["kernel"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let vocab = backend.info().vocab_size;
    let feed = bench_tokens(ABLATE_STEPS * (labels.len() + 2), vocab);
    let mut seq = base.fork_gpu()?;
    let mut runs: Vec<(Option<String>, Result<f64, String>)> = Vec::new();
    let mut sets: Vec<Option<String>> = vec![None];
    sets.extend(labels.into_iter().map(Some));
    sets.push(None);
    for (i, label) in sets.into_iter().enumerate() {
        crate::gpu::kernels::set_ablated(label.as_deref());
        let mut steps = Vec::with_capacity(ABLATE_STEPS);
        let mut failed = None;
        for &t in &feed[i * ABLATE_STEPS..(i + 1) * ABLATE_STEPS] {
            let start = Instant::now();
            if let Err(e) = seq.feed(&[t], false) {
                failed = Some(e.to_string());
                break;
            }
            steps.push(start.elapsed().as_secs_f64());
        }
        crate::gpu::kernels::set_ablated(None);
        if failed.is_some() {
            // A left-out kernel may leave values a check rejects: start over, untimed.
            seq = base.fork_gpu()?;
        }
        steps.sort_by(f64::total_cmp);
        let timed = match failed {
            Some(e) => Err(e),
            None => Ok(steps[steps.len() / 2]),
        };
        runs.push((label, timed));
    }
    let base = match (&runs[0].1, &runs[runs.len() - 1].1) {
        (Ok(a), Ok(b)) => (a + b) / 2.0,
        _ => anyhow::bail!("ablation: the full decode step failed"),
    };
    eprintln!(
        "ablation: full step {:.3} ms (median of {ABLATE_STEPS}, before and after)",
        base * 1e3
    );
    let mut rows = Vec::new();
    for (label, r) in runs.iter().filter_map(|(l, r)| l.as_ref().map(|l| (l, r))) {
        match r {
            Ok(ms) => {
                eprintln!(
                    "  without {label:<32} {:>8.3} ms  saves {:>7.3} ms",
                    ms * 1e3,
                    (base - ms) * 1e3
                );
                rows.push(serde_json::json!({"kernel": label, "step_ms": ms * 1e3,
                    "saved_ms": (base - ms) * 1e3}));
            }
            Err(e) => {
                eprintln!("  without {label:<32} failed: {e}");
                rows.push(serde_json::json!({"kernel": label, "error": e}));
            }
        }
    }
    Ok(serde_json::json!({"full_step_ms": base * 1e3, "without": rows}))
}

/// `layer:rate%` for every layer the expert cache was asked for.
fn per_layer_rates(per_layer: &[(u64, u64)]) -> Vec<String> {
    per_layer
        .iter()
        .enumerate()
        .filter(|(_, (h, m))| h + m > 0)
        .map(|(l, (h, m))| format!("{l}:{:.0}%", *h as f64 * 100.0 / (h + m) as f64))
        .collect()
}

/// Adds one random quantized matrix tensor (name, ggml dims) to the writer.
type AddMatrix<'a> =
    dyn FnMut(&mut crate::gguf::writer::GgufWriter, &str, &[usize]) -> anyhow::Result<()> + 'a;

/// A random-weight model with the real widths of Qwen3.8-Flash-Next (model-spec §1), built in
/// memory: `--layers` layers, `--experts` routed experts, large matrices in `--quant`. The PLE
/// table keeps the real row width but small hash tables (it lives on the host and is only gathered).
fn synthetic_full(args: &Args) -> anyhow::Result<crate::gguf::Gguf> {
    use crate::gguf::Value;
    use crate::gguf::writer::GgufWriter;

    let quant = match &args.quant {
        Some(n) => {
            GgmlType::from_name(n.trim()).with_context(|| format!("unknown quant type {n:?}"))?
        }
        None => GgmlType::IQ3_S,
    };
    if !crate::gpu::shaders::supports(quant) {
        anyhow::bail!("no GPU kernel for {}", quant.name());
    }
    let layers = args.layers.max(1);
    let experts = args.routed_experts.max(10);
    let (h, hc, low, vocab) = (2560usize, 4usize, 320usize, 248320usize);
    let (n_head, n_kv, hd) = (24usize, 2usize, 256usize);
    let (nk, nv, dk, dv, conv) = (16usize, 48usize, 128usize, 128usize, 4usize);
    let (ff, shared_ff, used) = (640usize, 640usize, 10usize);
    let (idx_heads, idx_dim) = (4usize, 128usize);
    let (ple_heads, ple_dim) = (16usize, 160usize);
    let wide = h * hc;
    let channels = 2 * nk * dk + nv * dv;
    let is_attention = |i: usize| (i + 1).is_multiple_of(4);
    let arch = |k: &str| format!("qwen4exp.{k}");
    let u32v = |v: usize| Value::U32(v as u32);

    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("qwen4exp".into()));
    w.add_metadata(
        "general.name",
        Value::String(format!("synthetic qwen4exp {layers}L {}", quant.name())),
    );
    for (k, v) in [
        ("block_count", layers),
        ("context_length", 262144),
        ("embedding_length", h),
        ("vocab_size", vocab),
        ("attention.head_count", n_head),
        ("attention.head_count_kv", n_kv),
        ("attention.key_length", hd),
        ("attention.value_length", hd),
        ("expert_count", experts),
        ("expert_used_count", used),
        ("expert_feed_forward_length", ff),
        ("expert_shared_feed_forward_length", shared_ff),
        ("ssm.conv_kernel", conv),
        ("ssm.state_size", dk),
        ("ssm.group_count", nk),
        ("ssm.time_step_rank", nv),
        ("ssm.inner_size", nv * dv),
        ("full_attention_interval", 4),
        ("rope.dimension_count", 64),
        ("hyper_connection.count", hc),
        ("hyper_connection.low_rank", low),
        ("attention.indexer.head_count", idx_heads),
        ("attention.indexer.key_length", idx_dim),
        ("attention.indexer.top_k", 2048),
        ("ple.ngram_size", 3),
        ("ple.heads_per_ngram", 8),
        ("ple.conv_kernel", 4),
        ("ple.eos_token_id", 248044),
        ("embedding_length_per_layer_input", ple_dim),
    ] {
        w.add_metadata(arch(k), u32v(v));
    }
    w.add_metadata(arch("rope.freq_base"), Value::F32(1e7));
    w.add_metadata(arch("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    w.add_metadata(
        arch("rope.dimension_sections"),
        Value::Array([11, 11, 10, 0].map(Value::I32).to_vec()),
    );
    w.add_metadata(
        arch("attention.recurrent_layers"),
        Value::Array((0..layers).map(|i| Value::Bool(!is_attention(i))).collect()),
    );
    w.add_metadata(
        arch("attention.compress_ratios"),
        Value::Array(
            (0..layers)
                .map(|i| Value::I32(if is_attention(i) { 4 } else { 0 }))
                .collect(),
        ),
    );
    let ple_layer = (layers > 1).then_some(1usize);
    let head_sizes: Vec<u64> = (0..ple_heads as u64).map(|i| 1009 + 2 * i).collect();
    let offsets: Vec<u64> = head_sizes
        .iter()
        .scan(0u64, |acc, s| Some(std::mem::replace(acc, *acc + s)))
        .collect();
    let ple_rows = (head_sizes.iter().sum::<u64>() as usize).div_ceil(128) * 128;
    if let Some(l) = ple_layer {
        w.add_metadata(arch("ple.layers"), Value::Array(vec![Value::I32(l as i32)]));
        w.add_metadata(
            arch("ple.layer_multipliers"),
            Value::Array(
                [23703573157769u64, 20109073645365, 8052911324071]
                    .map(Value::U64)
                    .to_vec(),
            ),
        );
        w.add_metadata(
            arch("ple.head_offsets"),
            Value::Array(offsets.iter().map(|&v| Value::U64(v)).collect()),
        );
        w.add_metadata(
            arch("ple.head_vocab_sizes"),
            Value::Array(head_sizes.iter().map(|&v| Value::U64(v)).collect()),
        );
    } else {
        w.add_metadata(arch("ple.layers"), Value::Array(Vec::new()));
    }

    // Tensors are declared first and their random bytes generated straight into the final buffer,
    // so the full-size model needs its size in host memory once, not twice.
    let fills: std::cell::RefCell<Vec<(u64, Fill)>> = std::cell::RefCell::new(Vec::new());
    let mut seed = 1u64;
    let mut next_seed = || {
        seed += 1;
        seed
    };
    // A matrix of `rows` x `cols` (ne = [cols, rows, extra...]) in `quant`, or IQ4_NL when the
    // row width does not fit the quant's block.
    let mut matrix = |w: &mut GgufWriter, name: &str, dims: &[usize]| -> anyhow::Result<()> {
        let cols = dims[0];
        let ty = if cols.is_multiple_of(quant.block_size()) {
            quant
        } else {
            GgmlType::IQ4_NL
        };
        let n: usize = dims.iter().product();
        let ne: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        let n_bytes = w.declare_tensor(name, &ne, ty)?;
        let fill = Fill::Quant {
            ty,
            blocks: n / ty.block_size(),
            seed: next_seed(),
        };
        fills.borrow_mut().push((n_bytes, fill));
        Ok(())
    };
    let vector = |w: &mut GgufWriter,
                  name: &str,
                  dims: &[usize],
                  around: f32,
                  spread: f32,
                  seed: u64|
     -> anyhow::Result<()> {
        let n: usize = dims.iter().product();
        let ne: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        let n_bytes = w.declare_tensor(name, &ne, GgmlType::F32)?;
        let fill = Fill::Floats {
            n,
            around,
            spread,
            seed,
        };
        fills.borrow_mut().push((n_bytes, fill));
        Ok(())
    };

    matrix(&mut w, "token_embd.weight", &[h, vocab])?;
    matrix(&mut w, "output.weight", &[h, vocab])?;
    let hc_module = |w: &mut GgufWriter,
                     matrix: &mut AddMatrix,
                     p: &str,
                     inject: bool,
                     seed: u64|
     -> anyhow::Result<()> {
        vector(w, &format!("{p}_norm.weight"), &[wide], 1.0, 0.1, seed)?;
        matrix(w, &format!("{p}_down.weight"), &[wide, low])?;
        matrix(w, &format!("{p}_up.weight"), &[low, wide])?;
        if inject {
            matrix(w, &format!("{p}_inject.weight"), &[wide, hc])?;
        }
        Ok(())
    };
    hc_module(&mut w, &mut matrix, "output_hc", false, 7)?;
    if ple_layer.is_some() {
        let ty = GgmlType::IQ4_NL;
        let dims = [ple_dim as u64, ple_rows as u64];
        let n_bytes = w.declare_tensor("per_layer_token_embd.weight", &dims, ty)?;
        let fill = Fill::Quant {
            ty,
            blocks: ple_rows * ple_dim / 32,
            seed: 99,
        };
        fills.borrow_mut().push((n_bytes, fill));
    }
    for i in 0..layers {
        let p = format!("blk.{i}.");
        let s = 1000 * (i as u64 + 1);
        hc_module(&mut w, &mut matrix, &format!("{p}hc_attn"), true, s + 1)?;
        hc_module(&mut w, &mut matrix, &format!("{p}hc_ffn"), true, s + 2)?;
        if Some(i) == ple_layer {
            matrix(
                &mut w,
                &format!("{p}ple_key.weight"),
                &[ple_heads * ple_dim, wide],
            )?;
            matrix(
                &mut w,
                &format!("{p}ple_value.weight"),
                &[ple_heads * ple_dim, h],
            )?;
            for (n, k) in ["ple_norm_key", "ple_norm_query", "ple_norm_conv"]
                .iter()
                .zip(3..)
            {
                vector(&mut w, &format!("{p}{n}.weight"), &[wide], 1.0, 0.1, s + k)?;
            }
            vector(
                &mut w,
                &format!("{p}ple_conv1d.weight"),
                &[4, wide],
                0.0,
                0.5,
                s + 6,
            )?;
        }
        if is_attention(i) {
            matrix(&mut w, &format!("{p}attn_q.weight"), &[h, 2 * n_head * hd])?;
            matrix(&mut w, &format!("{p}attn_k.weight"), &[h, n_kv * hd])?;
            matrix(&mut w, &format!("{p}attn_v.weight"), &[h, n_kv * hd])?;
            matrix(&mut w, &format!("{p}attn_output.weight"), &[n_head * hd, h])?;
            vector(
                &mut w,
                &format!("{p}attn_q_norm.weight"),
                &[hd],
                1.0,
                0.1,
                s + 7,
            )?;
            vector(
                &mut w,
                &format!("{p}attn_k_norm.weight"),
                &[hd],
                1.0,
                0.1,
                s + 8,
            )?;
            matrix(
                &mut w,
                &format!("{p}indexer.q_proj.weight"),
                &[h, idx_heads * idx_dim],
            )?;
            matrix(&mut w, &format!("{p}indexer.k_proj.weight"), &[h, idx_dim])?;
            vector(
                &mut w,
                &format!("{p}indexer.q_norm.weight"),
                &[idx_dim],
                1.0,
                0.1,
                s + 9,
            )?;
            vector(
                &mut w,
                &format!("{p}indexer.k_norm.weight"),
                &[idx_dim],
                1.0,
                0.1,
                s + 10,
            )?;
        } else {
            matrix(&mut w, &format!("{p}attn_qkv.weight"), &[h, channels])?;
            matrix(&mut w, &format!("{p}attn_gate.weight"), &[h, nv * dv])?;
            matrix(&mut w, &format!("{p}ssm_beta.weight"), &[h, nv])?;
            matrix(&mut w, &format!("{p}ssm_alpha.weight"), &[h, nv])?;
            vector(&mut w, &format!("{p}ssm_dt.bias"), &[nv], 0.5, 0.5, s + 11)?;
            vector(&mut w, &format!("{p}ssm_a"), &[nv], -1.0, 0.5, s + 12)?;
            vector(
                &mut w,
                &format!("{p}ssm_conv1d.weight"),
                &[conv, channels],
                0.0,
                0.5,
                s + 13,
            )?;
            vector(
                &mut w,
                &format!("{p}ssm_norm.weight"),
                &[dv],
                1.0,
                0.1,
                s + 14,
            )?;
            matrix(&mut w, &format!("{p}ssm_out.weight"), &[nv * dv, h])?;
        }
        matrix(&mut w, &format!("{p}ffn_gate_inp.weight"), &[h, experts])?;
        matrix(
            &mut w,
            &format!("{p}ffn_gate_exps.weight"),
            &[h, ff, experts],
        )?;
        matrix(&mut w, &format!("{p}ffn_up_exps.weight"), &[h, ff, experts])?;
        matrix(
            &mut w,
            &format!("{p}ffn_down_exps.weight"),
            &[ff, h, experts],
        )?;
        vector(
            &mut w,
            &format!("{p}ffn_gate_inp_shexp.weight"),
            &[h],
            0.0,
            0.05,
            s + 15,
        )?;
        matrix(
            &mut w,
            &format!("{p}ffn_gate_shexp.weight"),
            &[h, shared_ff],
        )?;
        matrix(&mut w, &format!("{p}ffn_up_shexp.weight"), &[h, shared_ff])?;
        matrix(
            &mut w,
            &format!("{p}ffn_down_shexp.weight"),
            &[shared_ff, h],
        )?;
    }
    let bytes = fill_tensors(&w, fills.into_inner());
    eprintln!(
        "synthetic model: {layers} layers, {experts} experts, {} ({:.2} GB)",
        quant.name(),
        bytes.len() as f64 / 1e9
    );
    Ok(crate::gguf::Gguf::from_vec("synthetic", bytes)?)
}

/// How the synthetic model's tensor bytes are generated.
enum Fill {
    /// Valid random blocks (finite scales) of a quant type.
    Quant {
        ty: GgmlType,
        blocks: usize,
        seed: u64,
    },
    /// f32 values uniform in [around - spread, around + spread).
    Floats {
        n: usize,
        around: f32,
        spread: f32,
        seed: u64,
    },
}

/// The whole GGUF: the writer's header, then each declared tensor's data at its aligned offset
/// (the layout `GgufWriter` declares in the header). Quant data is generated in parallel chunks.
fn fill_tensors(w: &crate::gguf::writer::GgufWriter, fills: Vec<(u64, Fill)>) -> Vec<u8> {
    use rayon::prelude::*;
    let alignment = w.alignment();
    let mut bytes = w.header_bytes();
    let data_start = bytes.len() as u64;
    let total: u64 = fills
        .iter()
        .fold(0, |at, (n, _)| (at + n).next_multiple_of(alignment));
    bytes.reserve(total as usize);
    let mut offset = 0u64;
    for (n_bytes, fill) in fills {
        bytes.resize((data_start + offset) as usize, 0);
        match fill {
            Fill::Quant { ty, blocks, seed } => {
                const CHUNK: usize = 1 << 16;
                let pieces: Vec<Vec<u8>> = (0..blocks.div_ceil(CHUNK))
                    .into_par_iter()
                    .map(|i| {
                        let count = CHUNK.min(blocks - i * CHUNK);
                        crate::quant::random_blocks(
                            ty,
                            count,
                            seed.wrapping_mul(1 << 20) + i as u64,
                        )
                    })
                    .collect();
                for piece in pieces {
                    bytes.extend_from_slice(&piece);
                }
            }
            Fill::Floats {
                n,
                around,
                spread,
                seed,
            } => {
                let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for _ in 0..n {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    let v =
                        around + spread * (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0);
                    bytes.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        offset = (offset + n_bytes).next_multiple_of(alignment);
    }
    bytes
}

/// Resident set size of this process (Linux `/proc/self/status`), for the memory-tier report.
fn host_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
