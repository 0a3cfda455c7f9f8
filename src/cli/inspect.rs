//! `strata inspect PATH`: what is in a GGUF file — shards, metadata, tensors, totals per type — and
//! the model config as the engine reads it. `--json` gives the same as one JSON document.

use crate::gguf::{GgmlType, Gguf, TensorInfo, Value};
use anyhow::Context as _;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF file; for a split model, the first shard (the others are found next to it).
    #[arg(required_unless_present = "gpus")]
    pub path: Option<PathBuf>,
    /// List the GPU adapters strata can see (index for `--adapter N`, type, driver, limits) and exit.
    #[arg(long)]
    pub gpus: bool,
    /// Print the memory plan for this model without loading it: dense weights, KV cache and work
    /// buffers in VRAM, then how many expert slots fit in `--vram-budget`.
    #[arg(long)]
    pub plan: bool,
    /// VRAM budget for `--plan` (e.g. `12GiB`, `800MiB`).
    #[arg(long, value_name = "SIZE", default_value = "12GiB", value_parser = crate::tiers::parse_size)]
    pub vram_budget: u64,
    /// Context length (tokens per sequence) the `--plan` KV cache is sized for.
    #[arg(long, default_value_t = 8192)]
    pub ctx: usize,
    /// The `--plan` KV cache's storage type (as `serve --kv`).
    #[arg(long, value_enum, default_value_t = crate::model::config::KvType::F32)]
    pub kv: crate::model::config::KvType,
    /// Print one machine-readable JSON document (metadata values in full).
    #[arg(long)]
    pub json: bool,
    /// Leave out the tensor table.
    #[arg(long, conflicts_with = "tensors")]
    pub no_tensors: bool,
    /// Only list tensors whose name contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub tensors: Option<String>,
    /// Print long metadata strings and arrays in full instead of summarising them.
    #[arg(long)]
    pub full: bool,
}

/// Strings longer than this many characters are cut in the text listing.
const MAX_STRING_CHARS: usize = 80;
/// Arrays longer than this are summarised by their first elements.
const MAX_ARRAY_ITEMS: usize = 8;

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.gpus {
        return write_stdout(&gpu_report());
    }
    let Some(path) = args.path.as_ref() else {
        anyhow::bail!("inspect needs a GGUF path (or --gpus)");
    };
    let gguf = Gguf::open(path)?;
    if args.plan {
        let plan = crate::tiers::MemoryPlan::compute(
            &gguf,
            args.ctx,
            args.vram_budget,
            &crate::tiers::PlanLimits {
                kv: args.kv,
                ..crate::tiers::PlanLimits::default()
            },
        )
        .with_context(|| format!("planning {} for a VRAM budget", path.display()))?;
        return write_stdout(&format!("{plan}\n"));
    }
    let tensor_filter = |t: &&TensorInfo| {
        !args.no_tensors
            && args
                .tensors
                .as_deref()
                .is_none_or(|text| t.name.contains(text))
    };
    let listed: Vec<&TensorInfo> = gguf.tensors().iter().filter(tensor_filter).collect();
    let config = crate::model::Config::from_gguf(&gguf);
    let text = if args.json {
        let config_json = match &config {
            Ok(c) => serde_json::json!({ "ok": c.to_string() }),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        let doc = json_report(&gguf, &listed, config_json);
        serde_json::to_string_pretty(&doc).context("encoding the JSON report")? + "\n"
    } else {
        let config_text = match &config {
            Ok(c) => c.to_string(),
            Err(e) => format!("not runnable by strata: {e}\n"),
        };
        text_report(&gguf, &listed, args.full, &config_text)
    };
    write_stdout(&text)
}

fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()) {
        // `strata inspect … | head` closing the pipe early is not an error worth reporting.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// Bytes as a short human-readable size ("3.0 MiB").
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A string quoted and escaped, cut to `MAX_STRING_CHARS` characters (with its length) unless `full`.
fn quote(s: &str, full: bool) -> String {
    let char_count = s.chars().count();
    if full || char_count <= MAX_STRING_CHARS {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX_STRING_CHARS).collect();
        format!("{head:?}… ({char_count} chars, {} bytes)", s.len())
    }
}

/// One metadata value on one line: scalars as they are, long strings cut, long arrays summarised
/// like `[248320 × string] "!", "\"", …`.
fn describe_value(value: &Value, full: bool) -> String {
    match value {
        Value::String(s) => quote(s, full),
        Value::Array(items) => {
            let element_type = items.first().map_or("?", Value::type_name);
            let shown = if full {
                items.len()
            } else {
                items.len().min(MAX_ARRAY_ITEMS)
            };
            let mut parts: Vec<String> = items[..shown]
                .iter()
                .map(|item| match item {
                    // Nested arrays and strings inside arrays are always summarised briefly.
                    Value::Array(inner) => format!("[{} items]", inner.len()),
                    Value::String(s) => quote(s, full && s.len() <= MAX_STRING_CHARS),
                    other => describe_value(other, full),
                })
                .collect();
            if shown < items.len() {
                parts.push("…".to_string());
            }
            format!("[{} × {element_type}] {}", items.len(), parts.join(", "))
        }
        Value::F32(v) => format!("{v:?}"),
        Value::F64(v) => format!("{v:?}"),
        Value::U8(v) => v.to_string(),
        Value::I8(v) => v.to_string(),
        Value::U16(v) => v.to_string(),
        Value::I16(v) => v.to_string(),
        Value::U32(v) => v.to_string(),
        Value::I32(v) => v.to_string(),
        Value::U64(v) => v.to_string(),
        Value::I64(v) => v.to_string(),
        Value::Bool(v) => v.to_string(),
    }
}

/// Count and bytes of every tensor type, in type-id order.
fn totals_per_type(gguf: &Gguf) -> BTreeMap<u32, (GgmlType, usize, u64)> {
    let mut totals = BTreeMap::new();
    for t in gguf.tensors() {
        let entry = totals.entry(t.ty.id()).or_insert((t.ty, 0usize, 0u64));
        entry.1 += 1;
        entry.2 = entry.2.saturating_add(t.n_bytes);
    }
    totals
}

fn share_percent(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 * 100.0 / total as f64
    }
}

fn shape(dims: &[u64]) -> String {
    let parts: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", parts.join(", "))
}

fn text_report(gguf: &Gguf, listed: &[&TensorInfo], full: bool, config_text: &str) -> String {
    let mut out = String::new();
    let paths = gguf.shard_paths();
    let sizes = gguf.shard_sizes();
    let shard_count = paths.len();
    for (index, (path, size)) in paths.iter().zip(&sizes).enumerate() {
        let label = if shard_count > 1 {
            format!("shard {}/{shard_count}", index + 1)
        } else {
            "file".to_string()
        };
        let _ = writeln!(
            out,
            "{label:<12} {} ({})",
            path.display(),
            human_bytes(*size)
        );
    }
    let total_bytes = gguf.total_tensor_bytes();
    let _ = writeln!(
        out,
        "GGUF v{}, {} metadata entries, {} tensors, {} of tensor data ({} bytes), alignment {}",
        gguf.version(),
        gguf.metadata().len(),
        gguf.tensors().len(),
        human_bytes(total_bytes),
        total_bytes,
        gguf.alignment()
    );

    let _ = writeln!(out, "\nmetadata:");
    let key_width = gguf
        .metadata()
        .iter()
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0);
    for (key, value) in gguf.metadata() {
        let type_name = value.type_name();
        let _ = writeln!(
            out,
            "  {key:<key_width$}  {type_name:<6}  {}",
            describe_value(value, full)
        );
    }

    if !listed.is_empty() {
        let _ = writeln!(out, "\ntensors ({} listed):", listed.len());
        let name_width = listed.iter().map(|t| t.name.len()).max().unwrap_or(0);
        let shape_width = listed
            .iter()
            .map(|t| shape(&t.dims).len())
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:<name_width$}  {:<7}  {:<shape_width$}  {:>12}{}",
            "name",
            "type",
            "shape (ne)",
            "bytes",
            if shard_count > 1 { "  shard" } else { "" }
        );
        for t in listed {
            let shard = if shard_count > 1 {
                format!("  shard {}", t.shard + 1)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  {:<name_width$}  {:<7}  {:<shape_width$}  {:>12}{shard}",
                t.name,
                t.ty.name(),
                shape(&t.dims),
                t.n_bytes
            );
        }
    }

    let _ = writeln!(out, "\ntotals per type:");
    for (ty, count, bytes) in totals_per_type(gguf).values() {
        let _ = writeln!(
            out,
            "  {:<7}  {count:>5} tensors  {:>10}  {:>5.1}%",
            ty.name(),
            human_bytes(*bytes),
            share_percent(*bytes, total_bytes)
        );
    }

    let _ = writeln!(out, "\nconfig (as the engine reads it):");
    for line in config_text.lines() {
        let _ = writeln!(out, "  {line}");
    }
    out
}

/// A metadata value as JSON; non-finite floats become null (JSON has no NaN).
fn value_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::U8(v) => J::from(*v),
        Value::I8(v) => J::from(*v),
        Value::U16(v) => J::from(*v),
        Value::I16(v) => J::from(*v),
        Value::U32(v) => J::from(*v),
        Value::I32(v) => J::from(*v),
        Value::U64(v) => J::from(*v),
        Value::I64(v) => J::from(*v),
        Value::F32(v) => J::from(*v),
        Value::F64(v) => J::from(*v),
        Value::Bool(v) => J::from(*v),
        Value::String(s) => J::from(s.as_str()),
        Value::Array(items) => J::Array(items.iter().map(value_json).collect()),
    }
}

fn json_report(
    gguf: &Gguf,
    listed: &[&TensorInfo],
    config: serde_json::Value,
) -> serde_json::Value {
    use serde_json::json;
    let files: Vec<_> = gguf
        .shard_paths()
        .iter()
        .zip(gguf.shard_sizes())
        .map(|(path, bytes)| json!({ "path": path.display().to_string(), "bytes": bytes }))
        .collect();
    // An array of entries (not an object) keeps the file order of the keys.
    let metadata: Vec<_> = gguf
        .metadata()
        .iter()
        .map(|(key, value)| json!({ "key": key, "type": value.type_name(), "value": value_json(value) }))
        .collect();
    let tensors: Vec<_> = listed
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "dims": t.dims,
                "shard": t.shard,
                "offset": t.offset,
                "bytes": t.n_bytes,
            })
        })
        .collect();
    let total_bytes = gguf.total_tensor_bytes();
    let types: Vec<_> = totals_per_type(gguf)
        .values()
        .map(|(ty, count, bytes)| {
            json!({
                "type": ty.name(),
                "count": count,
                "bytes": bytes,
                "share": share_percent(*bytes, total_bytes) / 100.0,
            })
        })
        .collect();
    json!({
        "files": files,
        "version": gguf.version(),
        "alignment": gguf.alignment(),
        "tensor_count": gguf.tensors().len(),
        "total_tensor_bytes": total_bytes,
        "metadata": metadata,
        "tensors": tensors,
        "types": types,
        "config": config,
    })
}

/// `strata inspect --gpus`: every adapter wgpu finds on every allowed backend (Vulkan, Metal, DX12;
/// `--gpu-backend` narrows it), with what strata needs.
fn gpu_report() -> String {
    let adapters = crate::gpu::list_adapters();
    if adapters.is_empty() {
        return format!("{}\n", crate::gpu::device::no_adapter_message());
    }
    let mut out = String::new();
    for a in adapters {
        let _ = writeln!(
            out,
            "[{}] {} ({}, {}) driver {} {}\n    subgroups {} (size {}..{}), f16 {}, timestamps {}, \
             max buffer {}, max binding {}, storage buffers/stage {}, workgroup storage {}",
            a.index,
            a.name,
            a.device_type,
            a.backend,
            a.driver,
            a.driver_info,
            if a.has_subgroups {
                "yes"
            } else {
                "NO (unusable)"
            },
            a.subgroup_min_size,
            a.subgroup_max_size,
            a.has_f16,
            a.has_timestamps,
            human_bytes(a.max_buffer_size),
            human_bytes(a.max_storage_buffer_binding_size),
            a.max_storage_buffers_per_shader_stage,
            human_bytes(a.max_compute_workgroup_storage_size as u64),
        );
    }
    out
}
