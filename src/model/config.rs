//! The model's hyper-parameters, read from the `qwen4exp.*` GGUF metadata (model-spec §1, §3.1).
//!
//! Nothing here assumes the sizes of a particular checkpoint: every width comes from metadata and is
//! cross-checked against the tensor shapes when the weights are bound (`weights.rs`).

use std::fmt;

use crate::gguf::{Gguf, Value};

use super::ModelError;

const ARCH: &str = "qwen4exp";

/// What a decoder layer's token mixer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (linear attention with a recurrent state).
    Gdn,
    /// Indexed (QSA) attention; `compress_ratio` is the block size of the indexer, `None` means the
    /// layer attends densely to every past token.
    Qsa { compress_ratio: Option<usize> },
}

#[derive(Debug, Clone)]
pub struct AttentionConfig {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Leading dims of each head that are rotated (NeoX halves).
    pub rotary_dims: usize,
    pub rope_base: f32,
    pub rope_sections: Vec<i64>,
    pub indexer_n_head: usize,
    pub indexer_head_dim: usize,
    /// Indexer budget in tokens (GGUF `attention.indexer.top_k`); blocks = budget / ratio.
    pub indexer_budget_tokens: usize,
}

#[derive(Debug, Clone)]
pub struct GdnConfig {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    pub conv_kernel: usize,
}

impl GdnConfig {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_k_dim
    }
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_v_dim
    }
    /// Channels of the causal conv: q | k | v.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

#[derive(Debug, Clone)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub expert_ff: usize,
    pub shared_ff: usize,
}

#[derive(Debug, Clone)]
pub struct PleConfig {
    /// 0-based index of the (GDN) layer that adds the per-layer embedding.
    pub layer: usize,
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    /// Width of one hash head's table row.
    pub head_dim: usize,
    pub conv_kernel: usize,
    /// The token that resets the n-gram window.
    pub eos_token_id: u32,
    /// One multiplier per n-gram slot (`ngram_size` entries).
    pub multipliers: Vec<u64>,
    pub head_offsets: Vec<u64>,
    pub head_vocab_sizes: Vec<u64>,
}

impl PleConfig {
    /// Number of hash heads: `heads_per_ngram` for every n-gram order 2..=ngram_size.
    pub fn n_heads(&self) -> usize {
        (self.ngram_size - 1) * self.heads_per_ngram
    }
    /// Width of the gathered embedding.
    pub fn embed_dim(&self) -> usize {
        self.n_heads() * self.head_dim
    }
    /// The conv is dilated by the n-gram order.
    pub fn conv_dilation(&self) -> usize {
        self.ngram_size
    }
    /// Rows of history the dilated conv needs.
    pub fn conv_history(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dilation()
    }
}

/// How the attention layers' key/value cache stores its values (`--kv`): a run option, not a
/// property of the file. A fixed choice per run, never one that depends on the memory free
/// (determinism rule 1). F16 keeps every key (normed and rotated) and value rounded to the
/// nearest f16, for half the memory; Q8_0 keeps blocks of 32 values as ggml's q8_0 does (an f16
/// scale amax / 127 and the values divided by it, rounded to integers), in 9 words per block. The
/// CPU reference rounds the same values the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KvType {
    #[default]
    F32,
    F16,
    #[value(name = "q8_0")]
    Q8_0,
}

/// Values per block of the q8_0 cache.
pub const KV_Q8_BLOCK: usize = 32;

impl KvType {
    /// Bytes of cache per `values` keys or values (a whole number of blocks for q8_0).
    pub fn cache_bytes(self, values: usize) -> usize {
        match self {
            KvType::F32 => 4 * values,
            KvType::F16 => 4 * values.div_ceil(2),
            KvType::Q8_0 => 36 * values.div_ceil(KV_Q8_BLOCK),
        }
    }

    /// One token's keys or values (`row`: n_kv * head_dim values) as the cache keeps them.
    pub fn store_row(self, row: &mut [f32]) {
        match self {
            KvType::F32 => {}
            KvType::F16 => {
                for v in row.iter_mut() {
                    *v = half::f16::from_f32(*v).to_f32();
                }
            }
            KvType::Q8_0 => {
                for block in row.chunks_mut(KV_Q8_BLOCK) {
                    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    let scale = half::f16::from_f32(d).to_f32();
                    for v in block.iter_mut() {
                        *v = (*v * id).round_ties_even() * scale;
                    }
                }
            }
        }
    }

    /// Why a cache of this type cannot hold rows of `width` values, if it cannot.
    pub fn unsupported_width(self, width: usize) -> Option<String> {
        (self == KvType::Q8_0 && !width.is_multiple_of(KV_Q8_BLOCK)).then(|| {
            format!(
                "--kv q8_0 needs key rows of a multiple of {KV_Q8_BLOCK} values; this model's are \
                 {width} (use --kv f16 or f32)"
            )
        })
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub n_embd: usize,
    /// Trunk layers (the MTP block, when present, is not counted).
    pub n_layer: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub layers: Vec<LayerKind>,
    pub attention: AttentionConfig,
    pub gdn: GdnConfig,
    pub moe: MoeConfig,
    pub hc_count: usize,
    pub hc_low_rank: usize,
    pub ple: Option<PleConfig>,
    /// Set when the file's `attention.compress_ratios` were all zero and QSA was assumed (finding F2).
    pub assumed_qsa_ratio: bool,
    /// The KV cache's storage type (a run option; F32 unless the loader sets it).
    pub kv: KvType,
}

/// The compress ratio assumed for a QSA layer when the file says 0 everywhere (see [`Config::from_gguf`]).
pub const DEFAULT_COMPRESS_RATIO: usize = 4;

fn key(name: &str) -> String {
    format!("{ARCH}.{name}")
}

fn bad(key: &str, message: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        message: message.into(),
    }
}

fn value_u64(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_i64().and_then(|i| u64::try_from(i).ok()))
}

fn opt_u64(g: &Gguf, k: &str) -> Option<u64> {
    g.get(k).and_then(value_u64)
}

fn req_usize(g: &Gguf, name: &str) -> Result<usize, ModelError> {
    let k = key(name);
    let v = g.get(&k).ok_or_else(|| bad(&k, "missing"))?;
    let n = value_u64(v).ok_or_else(|| bad(&k, "is not a non-negative integer"))?;
    usize::try_from(n).map_err(|_| bad(&k, "does not fit in usize"))
}

fn opt_usize(g: &Gguf, name: &str) -> Result<Option<usize>, ModelError> {
    match g.get(&key(name)) {
        None => Ok(None),
        Some(_) => req_usize(g, name).map(Some),
    }
}

fn req_f32(g: &Gguf, name: &str) -> Result<f32, ModelError> {
    let k = key(name);
    let v = g.get(&k).ok_or_else(|| bad(&k, "missing"))?;
    v.as_f32().ok_or_else(|| bad(&k, "is not a float"))
}

/// An integer array (any integer element type; 64-bit PLE arrays may be u64 or i64).
fn int_array(g: &Gguf, name: &str) -> Result<Option<Vec<i64>>, ModelError> {
    let k = key(name);
    let Some(v) = g.get(&k) else { return Ok(None) };
    let items = v.as_array().ok_or_else(|| bad(&k, "is not an array"))?;
    let mut out = Vec::new();
    for item in items.iter() {
        let n = item
            .as_i64()
            .or_else(|| item.as_u64().and_then(|u| i64::try_from(u).ok()))
            .ok_or_else(|| bad(&k, "has a non-integer element"))?;
        out.push(n);
    }
    Ok(Some(out))
}

fn u64_array(g: &Gguf, name: &str) -> Result<Option<Vec<u64>>, ModelError> {
    let k = key(name);
    let Some(v) = g.get(&k) else { return Ok(None) };
    let items = v.as_array().ok_or_else(|| bad(&k, "is not an array"))?;
    let mut out = Vec::new();
    for item in items.iter() {
        out.push(
            value_u64(item)
                .ok_or_else(|| bad(&k, "has an element that is not a non-negative integer"))?,
        );
    }
    Ok(Some(out))
}

fn bool_array(g: &Gguf, name: &str) -> Result<Option<Vec<bool>>, ModelError> {
    let k = key(name);
    let Some(v) = g.get(&k) else { return Ok(None) };
    let items = v.as_array().ok_or_else(|| bad(&k, "is not an array"))?;
    let mut out = Vec::new();
    for item in items.iter() {
        let b = item
            .as_bool()
            .or_else(|| value_u64(item).map(|n| n != 0))
            .ok_or_else(|| bad(&k, "has a non-boolean element"))?;
        out.push(b);
    }
    Ok(Some(out))
}

fn nonzero(value: usize, name: &str) -> Result<usize, ModelError> {
    if value == 0 {
        Err(bad(&key(name), "must not be 0"))
    } else {
        Ok(value)
    }
}

impl Config {
    /// Reads the configuration.
    ///
    /// Layer kinds come from `attention.recurrent_layers` when present, else from
    /// `full_attention_interval` (layer i is attention iff (i+1) % interval == 0).
    ///
    /// **Compress ratio 0 (finding F2).** llama.cpp's converter, run with transformers ≥ 5, writes
    /// `attention.compress_ratios` as all zeros although the checkpoint uses indexed (QSA) attention;
    /// llama.cpp then runs those layers densely. strata follows the checkpoint: when *every* entry is 0
    /// (or the key is missing) the attention layers are treated as QSA with ratio
    /// [`DEFAULT_COMPRESS_RATIO`] (4, the checkpoint's `indexer_compress_ratio`), `assumed_qsa_ratio` is
    /// set and a warning is logged. The weights loader falls back to dense attention for a layer that
    /// has no indexer tensors. When some attention layers have a non-zero ratio, a 0 on another
    /// attention layer is taken literally: that layer attends densely.
    pub fn from_gguf(g: &Gguf) -> Result<Config, ModelError> {
        let arch_key = "general.architecture";
        let arch = g
            .get(arch_key)
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad(arch_key, "missing"))?;
        if arch != ARCH {
            return Err(bad(
                arch_key,
                format!("is {arch:?}; strata runs only {ARCH:?} models"),
            ));
        }
        let name = g
            .get("general.name")
            .and_then(|v| v.as_str())
            .unwrap_or("qwen4exp model")
            .to_string();

        let n_embd = nonzero(req_usize(g, "embedding_length")?, "embedding_length")?;
        let block_count = nonzero(req_usize(g, "block_count")?, "block_count")?;
        let nextn = opt_usize(g, "nextn_predict_layers")?.unwrap_or(0);
        let n_layer = block_count
            .checked_sub(nextn)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                bad(
                    &key("nextn_predict_layers"),
                    "is not smaller than block_count",
                )
            })?;

        let vocab_size = match opt_usize(g, "vocab_size")? {
            Some(v) => v,
            None => g
                .tensor("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    bad(
                        &key("vocab_size"),
                        "missing and token_embd.weight has no row count",
                    )
                })?,
        };
        let vocab_size = nonzero(vocab_size, "vocab_size")?;
        let context_length = opt_usize(g, "context_length")?.unwrap_or(4096).max(1);
        let rms_eps = req_f32(g, "attention.layer_norm_rms_epsilon")?;

        // Layer kinds.
        let recurrent: Vec<bool> = match bool_array(g, "attention.recurrent_layers")? {
            Some(list) => {
                if list.len() < n_layer {
                    return Err(bad(
                        &key("attention.recurrent_layers"),
                        format!("has {} entries for {n_layer} layers", list.len()),
                    ));
                }
                list[..n_layer].to_vec()
            }
            None => {
                let interval = nonzero(
                    req_usize(g, "full_attention_interval")?,
                    "full_attention_interval",
                )?;
                (0..n_layer).map(|i| (i + 1) % interval != 0).collect()
            }
        };
        let ratios = int_array(g, "attention.compress_ratios")?;
        let attention_ratios: Vec<i64> = match &ratios {
            Some(r) => (0..n_layer)
                .filter(|&i| !recurrent[i])
                .map(|i| r.get(i).copied().unwrap_or(0))
                .collect(),
            None => Vec::new(),
        };
        let assumed_qsa_ratio = attention_ratios.iter().all(|&r| r == 0);
        if assumed_qsa_ratio && recurrent.iter().any(|r| !r) {
            tracing::warn!(
                "{}: attention.compress_ratios are all 0 or missing (known converter bug); assuming QSA with ratio {DEFAULT_COMPRESS_RATIO}",
                name
            );
        }
        let mut layers = Vec::with_capacity(n_layer);
        for (i, &is_recurrent) in recurrent.iter().enumerate() {
            if is_recurrent {
                layers.push(LayerKind::Gdn);
                continue;
            }
            let compress_ratio = if assumed_qsa_ratio {
                Some(DEFAULT_COMPRESS_RATIO)
            } else {
                let r = ratios.as_ref().and_then(|r| r.get(i).copied()).unwrap_or(0);
                match r {
                    0 => None,
                    r if r > 0 => Some(r as usize),
                    _ => {
                        return Err(bad(
                            &key("attention.compress_ratios"),
                            format!("layer {i} has ratio {r}"),
                        ));
                    }
                }
            };
            layers.push(LayerKind::Qsa { compress_ratio });
        }

        let n_head = nonzero(
            req_usize(g, "attention.head_count")?,
            "attention.head_count",
        )?;
        let n_head_kv = nonzero(
            req_usize(g, "attention.head_count_kv")?,
            "attention.head_count_kv",
        )?;
        if n_head % n_head_kv != 0 {
            return Err(bad(
                &key("attention.head_count_kv"),
                format!("{n_head_kv} does not divide head_count {n_head}"),
            ));
        }
        let head_dim = nonzero(
            req_usize(g, "attention.key_length")?,
            "attention.key_length",
        )?;
        if let Some(v) = opt_usize(g, "attention.value_length")?
            && v != head_dim
        {
            return Err(bad(
                &key("attention.value_length"),
                format!("{v} differs from key_length {head_dim}"),
            ));
        }
        let rotary_dims = opt_usize(g, "rope.dimension_count")?.unwrap_or(head_dim);
        let indexer_head_dim = opt_usize(g, "attention.indexer.key_length")?.unwrap_or(0);
        if rotary_dims % 2 != 0 || rotary_dims > head_dim {
            return Err(bad(
                &key("rope.dimension_count"),
                format!("{rotary_dims} is odd or exceeds head dim {head_dim}"),
            ));
        }
        let attention = AttentionConfig {
            n_head,
            n_head_kv,
            head_dim,
            rotary_dims,
            rope_base: g
                .get(&key("rope.freq_base"))
                .and_then(|v| v.as_f32())
                .unwrap_or(1.0e7),
            rope_sections: int_array(g, "rope.dimension_sections")?.unwrap_or_default(),
            indexer_n_head: opt_usize(g, "attention.indexer.head_count")?.unwrap_or(0),
            indexer_head_dim,
            indexer_budget_tokens: opt_usize(g, "attention.indexer.top_k")?.unwrap_or(0),
        };
        let has_qsa = layers.iter().any(|l| {
            matches!(
                l,
                LayerKind::Qsa {
                    compress_ratio: Some(_)
                }
            )
        });
        if has_qsa {
            if attention.indexer_n_head == 0 || indexer_head_dim == 0 {
                return Err(bad(
                    &key("attention.indexer.head_count"),
                    "indexed attention needs indexer head count and key_length",
                ));
            }
            if rotary_dims > indexer_head_dim {
                return Err(bad(
                    &key("attention.indexer.key_length"),
                    "is smaller than the rotary dims",
                ));
            }
            let smallest_ratio = layers
                .iter()
                .filter_map(|l| match l {
                    LayerKind::Qsa { compress_ratio } => *compress_ratio,
                    LayerKind::Gdn => None,
                })
                .min()
                .unwrap_or(1);
            if attention.indexer_budget_tokens < smallest_ratio {
                // A budget below one block would leave only the tail visible.
                return Err(bad(
                    &key("attention.indexer.top_k"),
                    format!(
                        "budget of {} tokens is missing or smaller than one block of {smallest_ratio}",
                        attention.indexer_budget_tokens
                    ),
                ));
            }
        }

        let n_k_heads = nonzero(req_usize(g, "ssm.group_count")?, "ssm.group_count")?;
        let n_v_heads = nonzero(req_usize(g, "ssm.time_step_rank")?, "ssm.time_step_rank")?;
        let head_k_dim = nonzero(req_usize(g, "ssm.state_size")?, "ssm.state_size")?;
        let inner = opt_usize(g, "ssm.inner_size")?.unwrap_or(n_v_heads * head_k_dim);
        if inner % n_v_heads != 0 || n_v_heads % n_k_heads != 0 {
            return Err(bad(
                &key("ssm.inner_size"),
                "GDN head counts / inner size are inconsistent",
            ));
        }
        let gdn = GdnConfig {
            n_k_heads,
            n_v_heads,
            head_k_dim,
            head_v_dim: nonzero(inner / n_v_heads, "ssm.inner_size")?,
            conv_kernel: nonzero(req_usize(g, "ssm.conv_kernel")?, "ssm.conv_kernel")?,
        };

        let n_expert = nonzero(req_usize(g, "expert_count")?, "expert_count")?;
        let n_expert_used = nonzero(req_usize(g, "expert_used_count")?, "expert_used_count")?;
        if n_expert_used > n_expert {
            return Err(bad(&key("expert_used_count"), "exceeds expert_count"));
        }
        let moe = MoeConfig {
            n_expert,
            n_expert_used,
            expert_ff: nonzero(
                req_usize(g, "expert_feed_forward_length")?,
                "expert_feed_forward_length",
            )?,
            shared_ff: opt_usize(g, "expert_shared_feed_forward_length")?.unwrap_or(0),
        };

        let hc_count = req_usize(g, "hyper_connection.count")?;
        if hc_count < 2 {
            return Err(bad(&key("hyper_connection.count"), "must be at least 2"));
        }
        let hc_low_rank = nonzero(
            req_usize(g, "hyper_connection.low_rank")?,
            "hyper_connection.low_rank",
        )?;

        let ple = Self::read_ple(g, &layers, vocab_size)?;

        Ok(Config {
            name,
            n_embd,
            n_layer,
            vocab_size,
            context_length,
            rms_eps,
            layers,
            attention,
            gdn,
            moe,
            hc_count,
            hc_low_rank,
            ple,
            assumed_qsa_ratio,
            kv: KvType::F32,
        })
    }

    fn read_ple(
        g: &Gguf,
        layers: &[LayerKind],
        vocab_size: usize,
    ) -> Result<Option<PleConfig>, ModelError> {
        let Some(ple_layers) = int_array(g, "ple.layers")? else {
            return Ok(None);
        };
        let layer = match ple_layers.as_slice() {
            [] => return Ok(None),
            [one] => {
                usize::try_from(*one).map_err(|_| bad(&key("ple.layers"), "negative layer"))?
            }
            _ => {
                return Err(bad(
                    &key("ple.layers"),
                    "strata supports exactly one PLE layer",
                ));
            }
        };
        if layers.get(layer) != Some(&LayerKind::Gdn) {
            return Err(bad(
                &key("ple.layers"),
                format!("layer {layer} is not a GDN layer of this model"),
            ));
        }
        let ngram_size = req_usize(g, "ple.ngram_size")?;
        if ngram_size < 2 {
            return Err(bad(&key("ple.ngram_size"), "must be at least 2"));
        }
        let heads_per_ngram = nonzero(req_usize(g, "ple.heads_per_ngram")?, "ple.heads_per_ngram")?;
        let head_dim = nonzero(
            req_usize(g, "embedding_length_per_layer_input")?,
            "embedding_length_per_layer_input",
        )?;
        let conv_kernel = nonzero(req_usize(g, "ple.conv_kernel")?, "ple.conv_kernel")?;
        let eos_key = key("ple.eos_token_id");
        let eos = opt_u64(g, &eos_key)
            .or_else(|| opt_u64(g, "tokenizer.ggml.eos_token_id"))
            .ok_or_else(|| bad(&eos_key, "missing (and no tokenizer.ggml.eos_token_id)"))?;
        let eos_token_id = u32::try_from(eos)
            .ok()
            .filter(|&e| (e as usize) < vocab_size)
            .ok_or_else(|| bad(&eos_key, "outside the vocabulary"))?;
        let req_array = |name: &str| u64_array(g, name)?.ok_or_else(|| bad(&key(name), "missing"));
        let multipliers = req_array("ple.layer_multipliers")?;
        let head_offsets = req_array("ple.head_offsets")?;
        let head_vocab_sizes = req_array("ple.head_vocab_sizes")?;
        let cfg = PleConfig {
            layer,
            ngram_size,
            heads_per_ngram,
            head_dim,
            conv_kernel,
            eos_token_id,
            multipliers,
            head_offsets,
            head_vocab_sizes,
        };
        let n_heads = cfg.n_heads();
        if cfg.multipliers.len() < ngram_size {
            return Err(bad(
                &key("ple.layer_multipliers"),
                format!(
                    "has {} entries, n-gram size is {ngram_size}",
                    cfg.multipliers.len()
                ),
            ));
        }
        if cfg.head_offsets.len() != n_heads || cfg.head_vocab_sizes.len() != n_heads {
            return Err(bad(
                &key("ple.head_offsets"),
                format!("offsets/sizes must have {n_heads} entries"),
            ));
        }
        if cfg.head_vocab_sizes.contains(&0) {
            return Err(bad(
                &key("ple.head_vocab_sizes"),
                "a head has an empty table",
            ));
        }
        Ok(Some(cfg))
    }

    pub fn n_gdn_layers(&self) -> usize {
        self.layers.iter().filter(|l| **l == LayerKind::Gdn).count()
    }

    pub fn n_attention_layers(&self) -> usize {
        self.n_layer - self.n_gdn_layers()
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.attention;
        let d = &self.gdn;
        let m = &self.moe;
        writeln!(f, "model        {}", self.name)?;
        writeln!(
            f,
            "hidden       {} × {} hyper-connection streams (low rank {})",
            self.n_embd, self.hc_count, self.hc_low_rank
        )?;
        writeln!(
            f,
            "layers       {} ({} GDN, {} attention)",
            self.n_layer,
            self.n_gdn_layers(),
            self.n_attention_layers()
        )?;
        let pattern: String = self
            .layers
            .iter()
            .map(|l| match l {
                LayerKind::Gdn => 'G',
                LayerKind::Qsa {
                    compress_ratio: Some(_),
                } => 'Q',
                LayerKind::Qsa {
                    compress_ratio: None,
                } => 'A',
            })
            .collect();
        writeln!(
            f,
            "pattern      {pattern}   (G = GDN, Q = QSA, A = dense attention)"
        )?;
        writeln!(
            f,
            "vocab        {}   context {}   rms eps {:e}",
            self.vocab_size, self.context_length, self.rms_eps
        )?;
        writeln!(
            f,
            "attention    {} q heads, {} kv heads × {}; rope {} dims, base {}, sections {:?}",
            a.n_head, a.n_head_kv, a.head_dim, a.rotary_dims, a.rope_base, a.rope_sections
        )?;
        let ratios: Vec<String> = self
            .layers
            .iter()
            .filter_map(|l| match l {
                LayerKind::Qsa { compress_ratio } => {
                    Some(compress_ratio.map_or("dense".to_string(), |r| r.to_string()))
                }
                LayerKind::Gdn => None,
            })
            .collect();
        writeln!(
            f,
            "QSA indexer  {} heads × {}, budget {} tokens, ratios [{}]{}",
            a.indexer_n_head,
            a.indexer_head_dim,
            a.indexer_budget_tokens,
            ratios.join(", "),
            if self.assumed_qsa_ratio {
                " (file said 0: assumed, see finding F2)"
            } else {
                ""
            }
        )?;
        writeln!(
            f,
            "GDN          {} k heads × {}, {} v heads × {}, conv kernel {}",
            d.n_k_heads, d.head_k_dim, d.n_v_heads, d.head_v_dim, d.conv_kernel
        )?;
        writeln!(
            f,
            "MoE          {} experts, top {}, expert ffn {}, shared ffn {}",
            m.n_expert, m.n_expert_used, m.expert_ff, m.shared_ff
        )?;
        match &self.ple {
            Some(p) => write!(
                f,
                "PLE          layer {}, {}-grams, {} heads × {}, conv kernel {} (dilation {}), eos {}",
                p.layer,
                p.ngram_size,
                p.n_heads(),
                p.head_dim,
                p.conv_kernel,
                p.conv_dilation(),
                p.eos_token_id
            ),
            None => write!(f, "PLE          none"),
        }
    }
}
