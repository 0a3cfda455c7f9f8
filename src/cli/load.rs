//! Loading a model for any subcommand: path → GGUF → the chosen backend behind `engine::Backend`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::engine::Backend;
use crate::gguf::Gguf;
use crate::model::CpuBackend;
use crate::model::demo::demo_gguf;
use crate::tiers::TierArgs;

/// The model flags every model-using subcommand shares (`#[command(flatten)]` them).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (first shard of a split model), or a folder holding one model (its only
    /// `.gguf`, or the `-00001-of-N` shard). Without it, the tiny built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Which forward pass runs the model.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// Maximum tokens per sequence (0 = the model's context length).
    #[arg(long, default_value_t = 0)]
    pub ctx: usize,
    /// Memory tiers: VRAM budget, expert slots, host experts, PLE reader.
    #[command(flatten)]
    pub tiers: crate::tiers::TierArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The GPU when one is usable, else the CPU.
    Auto,
    /// The CPU reference forward pass.
    Cpu,
    /// The wgpu forward pass.
    Gpu,
}

impl ModelArgs {
    /// Opens the model and loads the chosen backend.
    pub fn load(&self) -> anyhow::Result<Arc<dyn Backend>> {
        let gguf = open_gguf(self.model.as_deref())?;
        load_backend_with(gguf, self.backend, self.ctx, &self.tiers)
    }
}

/// Opens a GGUF file, or the built-in demo model when `path` is `None`.
pub fn open_gguf(path: Option<&Path>) -> anyhow::Result<Arc<Gguf>> {
    let gguf = match path {
        // GgufError already names the file, so no extra context that would repeat the path.
        Some(p) => Gguf::open(&resolve_model_path(p)?)?,
        None => demo_gguf().context("opening the built-in demo model")?,
    };
    Ok(Arc::new(gguf))
}

/// A model path as given, or for a folder the GGUF to open in it: the first shard
/// (`…-00001-of-000NN.gguf`) of a split model, else the folder's only `.gguf`.
pub fn resolve_model_path(path: &Path) -> anyhow::Result<PathBuf> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let entries = std::fs::read_dir(path)
        .with_context(|| format!("cannot list the folder {}", path.display()))?;
    let mut ggufs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && has_gguf_extension(p))
        .collect();
    ggufs.sort();
    pick_gguf(path, &ggufs)
}

fn has_gguf_extension(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Whether a file name is the first shard of a split model (`name-00001-of-00003.gguf`).
fn is_first_shard(path: &Path) -> bool {
    let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
        return false;
    };
    let Some((head, count)) = stem.rsplit_once("-of-") else {
        return false;
    };
    let index = head.rsplit('-').next().unwrap_or_default();
    !count.is_empty()
        && count.bytes().all(|b| b.is_ascii_digit())
        && !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && index.trim_start_matches('0') == "1"
}

fn pick_gguf(dir: &Path, ggufs: &[PathBuf]) -> anyhow::Result<PathBuf> {
    let first_shards: Vec<&PathBuf> = ggufs.iter().filter(|p| is_first_shard(p)).collect();
    let names = || {
        ggufs
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (first_shards.as_slice(), ggufs) {
        ([only], _) => Ok((*only).clone()),
        ([], [only]) => Ok(only.clone()),
        ([], []) => anyhow::bail!(
            "the folder {} holds no .gguf file; pass --model with a GGUF file or a folder holding one",
            dir.display()
        ),
        _ => anyhow::bail!(
            "the folder {} holds more than one model ({}); pass --model with the file to load \
             (for a split model, its -00001-of-N shard)",
            dir.display(),
            names()
        ),
    }
}

/// Progress shown only once loading has taken more than a second (tiny models load silently).
struct LoadProgress {
    started: Instant,
    bar: Option<indicatif::ProgressBar>,
}

impl LoadProgress {
    const SHOW_AFTER: Duration = Duration::from_secs(1);

    fn new() -> Self {
        LoadProgress {
            started: Instant::now(),
            bar: None,
        }
    }

    fn update(&mut self, done: usize, total: usize) {
        if self.bar.is_none() && self.started.elapsed() > Self::SHOW_AFTER {
            let bar = indicatif::ProgressBar::new(total as u64);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "loading {bar:30} layer {pos}/{len} {elapsed}",
            ) {
                bar.set_style(style);
            }
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
        }
    }

    fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Loads `gguf` on the chosen backend. `ctx` caps the context per sequence (0 = the model's).
pub fn load_backend(
    gguf: Arc<Gguf>,
    choice: BackendChoice,
    ctx: usize,
) -> anyhow::Result<Arc<dyn Backend>> {
    load_backend_with(gguf, choice, ctx, &TierArgs::default())
}

/// [`load_backend`] with the memory-tier options (`ModelArgs::tiers`). The tiers shape the GPU
/// backend; the CPU reference keeps every weight in the memory map and ignores them.
pub fn load_backend_with(
    gguf: Arc<Gguf>,
    choice: BackendChoice,
    ctx: usize,
    tiers: &TierArgs,
) -> anyhow::Result<Arc<dyn Backend>> {
    match choice {
        BackendChoice::Cpu => load_cpu(gguf, ctx, tiers.kv),
        BackendChoice::Auto => {
            if let Some(reason) = gpu_unusable_reason(&gguf) {
                eprintln!("strata: --backend auto: using the CPU because {reason}");
                return load_cpu(gguf, ctx, tiers.kv);
            }
            match load_for_cli_with(gguf.clone(), ctx, false, tiers)? {
                Some(backend) => Ok(backend),
                None => {
                    eprintln!(
                        "strata: --backend auto: using the CPU because the GPU could not be set \
                         up (see any warning above; --backend gpu shows the error, RUST_LOG=info \
                         the details)"
                    );
                    load_cpu(gguf, ctx, tiers.kv)
                }
            }
        }
        BackendChoice::Gpu => match load_for_cli_with(gguf.clone(), ctx, true, tiers)? {
            Some(backend) => Ok(backend),
            None => load_cpu(gguf, ctx, tiers.kv),
        },
    }
}

/// Why `--backend auto` will not use the GPU for this model, decided before any device is made:
/// a weight type without a GPU kernel, no adapter, or only a software / subgroup-less adapter
/// (the same adapter rule as the GPU loader's). `None`: the GPU is worth trying.
pub fn gpu_unusable_reason(gguf: &Gguf) -> Option<String> {
    let mut unsupported: Vec<&str> = gguf
        .tensors()
        .iter()
        .filter(|t| !crate::gpu::shaders::supports(t.ty))
        .map(|t| t.ty.name())
        .collect();
    unsupported.sort_unstable();
    unsupported.dedup();
    if !unsupported.is_empty() {
        return Some(format!(
            "the GPU kernels cannot read its {} weights",
            unsupported.join(", ")
        ));
    }
    let adapters = crate::gpu::list_adapters();
    let chosen = match adapter_from_env() {
        Some(i) => match adapters.get(i) {
            Some(a) => a,
            None => {
                return Some(format!(
                    "adapter {i} was asked for but only {} exist (strata inspect --gpus)",
                    adapters.len()
                ));
            }
        },
        None => match adapters.first() {
            Some(a) => a,
            None => {
                return Some(crate::gpu::device::no_adapter_message());
            }
        },
    };
    if !chosen.has_subgroups {
        return Some(format!(
            "adapter {:?} ({}) has no subgroup operations, which every GPU kernel needs",
            chosen.name, chosen.backend
        ));
    }
    if chosen.device_type == format!("{:?}", wgpu::DeviceType::Cpu) {
        return Some(format!(
            "adapter {:?} is a software rasterizer (slower than the CPU backend; --backend gpu \
             uses it anyway)",
            chosen.name
        ));
    }
    None
}

fn load_cpu(
    gguf: Arc<Gguf>,
    ctx: usize,
    kv: crate::model::config::KvType,
) -> anyhow::Result<Arc<dyn Backend>> {
    let name = gguf.name().to_string();
    let mut progress = LoadProgress::new();
    let mut backend =
        CpuBackend::load_with_progress(gguf, ctx, &mut |done, total| progress.update(done, total))
            .with_context(|| format!("loading {name} on the CPU"))?;
    backend.set_kv(kv)?;
    progress.finish();
    Ok(Arc::new(backend))
}

/// True when a load error looks like a failed VRAM allocation.
fn is_out_of_memory(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}").to_lowercase();
    text.contains("out of memory") || text.contains("outofmemory")
}

/// Adapter index from `STRATA_ADAPTER` (the CLI's `--adapter` where a subcommand offers it).
pub fn adapter_from_env() -> Option<usize> {
    std::env::var("STRATA_ADAPTER")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Load on the GPU for the CLI. `required`: `--backend gpu` (any error is returned). Otherwise
/// (`auto`) the GPU is used only when a hardware adapter (not a software rasterizer such as
/// lavapipe) is usable; `Ok(None)` tells the caller to fall back to the CPU. Asking for tiers
/// (`--vram-budget`) makes a GPU load failure an error rather than a silent fall back.
pub fn load_for_cli_with(
    gguf: Arc<Gguf>,
    ctx_len: usize,
    required: bool,
    tiers: &TierArgs,
) -> anyhow::Result<Option<Arc<dyn Backend>>> {
    let adapter = adapter_from_env();
    if !required {
        // Decide from the adapter list before creating any device: `auto` on a machine with only
        // a software rasterizer should cost nothing.
        let software = format!("{:?}", wgpu::DeviceType::Cpu);
        let adapters = crate::gpu::list_adapters();
        let chosen = match adapter {
            Some(i) => adapters.get(i),
            None => adapters.first(),
        };
        match chosen {
            Some(a) if a.device_type != software && a.has_subgroups => {}
            Some(a) => {
                tracing::info!(
                    "only a software or unsuitable adapter ({}); using the CPU",
                    a.name
                );
                return Ok(None);
            }
            None => {
                tracing::info!("no GPU adapter; using the CPU");
                return Ok(None);
            }
        }
    }
    let ctx = match crate::gpu::GpuContext::new(adapter) {
        Ok(c) => c,
        Err(e) if !required => {
            tracing::info!("no GPU ({e}); using the CPU");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    match crate::gpu::backend::GpuBackend::load_with(ctx, gguf, ctx_len, tiers) {
        Ok(b) => Ok(Some(Arc::new(b))),
        Err(e) if tiers.vram_budget.is_none() && is_out_of_memory(&e) => Err(e.context(
            "the GPU ran out of memory with every weight resident; pass --vram-budget SIZE to \
             keep only some experts in VRAM",
        )),
        Err(e) if !required && tiers.vram_budget.is_none() => {
            tracing::warn!("GPU load failed ({e:#}); using the CPU");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    fn folder_with(name: &str, files: &[&str]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("strata-load-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test folder");
        for f in files {
            std::fs::write(dir.join(f), b"x").expect("write a test file");
        }
        dir
    }

    fn resolved_name(dir: &Path) -> anyhow::Result<String> {
        let path = resolve_model_path(dir)?;
        Ok(path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default())
    }

    #[test]
    fn a_folder_resolves_to_its_first_shard_or_only_gguf() {
        let split = folder_with(
            "split",
            &[
                "m-00002-of-00003.gguf",
                "m-00001-of-00003.gguf",
                "m-00003-of-00003.gguf",
                "README.md",
            ],
        );
        assert_eq!(
            resolved_name(&split).expect("split"),
            "m-00001-of-00003.gguf"
        );
        let single = folder_with("single", &["model.GGUF", "notes.txt"]);
        assert_eq!(resolved_name(&single).expect("single"), "model.GGUF");
        let file = single.join("model.GGUF");
        assert_eq!(resolve_model_path(&file).expect("file"), file);
        for dir in [split, single] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn a_folder_without_one_clear_model_is_an_error() {
        let empty = folder_with("empty", &["a.txt"]);
        let err = resolve_model_path(&empty).expect_err("empty").to_string();
        assert!(err.contains("no .gguf"), "{err}");
        let two = folder_with("two", &["a.gguf", "b.gguf"]);
        let err = resolve_model_path(&two).expect_err("two").to_string();
        assert!(err.contains("a.gguf, b.gguf"), "{err}");
        for dir in [empty, two] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn first_shard_names() {
        assert!(is_first_shard(Path::new("x-00001-of-00002.gguf")));
        assert!(is_first_shard(Path::new("x-1-of-2.gguf")));
        assert!(!is_first_shard(Path::new("x-00002-of-00002.gguf")));
        assert!(!is_first_shard(Path::new("x.gguf")));
        assert!(!is_first_shard(Path::new("x-00001-of-.gguf")));
    }

    #[test]
    fn model_args_carry_the_tier_flags() {
        let cli = Cli::try_parse_from([
            "strata",
            "--backend",
            "gpu",
            "--vram-budget",
            "6GiB",
            "--experts",
            "ram",
            "--ple-io",
            "read",
        ])
        .expect("parse");
        assert_eq!(cli.model.backend, BackendChoice::Gpu);
        assert_eq!(cli.model.tiers.vram_budget, Some(6 << 30));
        assert_eq!(cli.model.tiers.experts, crate::tiers::ExpertsArg::Ram);
        assert_eq!(cli.model.tiers.ple_io, crate::tiers::IoMode::Read);
        let defaults = Cli::try_parse_from(["strata"]).expect("parse").model.tiers;
        assert_eq!(defaults.vram_budget, None);
        assert_eq!(defaults.experts, crate::tiers::ExpertsArg::Auto);
    }
}
