//! Every tensor of the model bound by its GGUF name, with shape and type checks.
//!
//! Matrices stay as the quantized bytes of the memory map (`QuantMatrix` views into the `Arc<Gguf>`):
//! the real model is 84 GB, so nothing large is dequantized at load. Small 1-D tensors (norms, `ssm_a`,
//! `ssm_dt`, conv kernels) are dequantized to f32 once.
//!
//! Conversion transforms (model-spec §3.3) this code relies on:
//! * centred norms are stored folded as `1 + w`: they are used as stored, never `+ 1` again
//!   (`ssm_norm` is not folded and is also used as stored);
//! * `ssm_a` already holds `−exp(A_log)`;
//! * GDN value heads are in GGUF (tiled) order, so value head j reads key head `j % n_k_heads`
//!   (applied in `gdn.rs`);
//! * hc norm weights may be `[4H]` or `[H, 4]` — the same bytes, stream-major;
//! * routed gate/up experts may be fused as `ffn_gate_up_exps` (per expert: F gate rows, then F up rows).

use std::sync::{Arc, OnceLock};

use rayon::prelude::*;

use crate::gguf::{GgmlType, Gguf, TensorInfo};
use crate::quant;

use super::ModelError;
use super::config::{Config, LayerKind};

/// Tensors at most this big are scanned for non-finite values at load; bigger ones (experts, the
/// embedding and PLE tables, lm_head of the real model) are scanned lazily, per expert slice on first
/// use or per gathered row, so loading an 84 GB file does not read it all.
const EAGER_CHECK_BYTES: u64 = 64 << 20;

/// Rows per rayon task in a matvec: enough work to amortise the task.
const ROWS_PER_TASK: usize = 64;

/// A row-major matrix view (`rows` × `cols`) into a GGUF tensor's quantized bytes.
pub struct QuantMatrix {
    gguf: Arc<Gguf>,
    tensor_index: usize,
    /// Start of this view inside the tensor's bytes (non-zero for one expert of a 3-D tensor).
    byte_offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub ty: GgmlType,
    row_bytes: usize,
    name: String,
    /// Lazy non-finite scan for views of big tensors; `None` when checked at load.
    lazy_check: Option<OnceLock<Result<(), String>>>,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QuantMatrix({} {}×{} {})",
            self.name,
            self.rows,
            self.cols,
            self.ty.name()
        )
    }
}

impl QuantMatrix {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The view's bytes (`rows · row_bytes`).
    pub fn bytes(&self) -> &[u8] {
        let Some(info) = self.gguf.tensors().get(self.tensor_index) else {
            return &[];
        };
        let data = self.gguf.tensor_data(info);
        let end = self.byte_offset + self.rows * self.row_bytes;
        data.get(self.byte_offset..end).unwrap_or(&[])
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The quantized bytes of row `r` (empty when out of range).
    pub fn row(&self, r: usize) -> &[u8] {
        self.bytes()
            .get(r * self.row_bytes..(r + 1) * self.row_bytes)
            .unwrap_or(&[])
    }

    fn ensure_checked(&self) -> Result<(), ModelError> {
        let Some(cell) = &self.lazy_check else {
            return Ok(());
        };
        let result = cell
            .get_or_init(|| quant::check_finite(self.ty, self.bytes()).map_err(|e| e.to_string()));
        result
            .clone()
            .map_err(|detail| ModelError::NonFiniteWeight {
                name: self.name.clone(),
                detail: format!(": {detail}"),
            })
    }

    /// `y = W x`. Rows are independent tasks; each output element is one sequential reduction
    /// (inside `quant::dot_row`), so the result does not depend on the thread count.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) -> Result<(), ModelError> {
        if x.len() != self.cols || y.len() != self.rows {
            return Err(ModelError::Tensor {
                name: self.name.clone(),
                message: format!(
                    "matvec with x of {} and y of {} for a {}×{} matrix",
                    x.len(),
                    y.len(),
                    self.rows,
                    self.cols
                ),
            });
        }
        self.ensure_checked()?;
        let bytes = self.bytes();
        if bytes.len() != self.rows * self.row_bytes {
            return Err(ModelError::Tensor {
                name: self.name.clone(),
                message: "tensor data is truncated".into(),
            });
        }
        let rb = self.row_bytes;
        let run = |(chunk_index, ys): (usize, &mut [f32])| -> Result<(), ModelError> {
            let mut scratch = Vec::with_capacity(self.cols);
            for (i, out) in ys.iter_mut().enumerate() {
                let r = chunk_index * ROWS_PER_TASK + i;
                let row = &bytes[r * rb..(r + 1) * rb];
                *out = quant::dot_row(self.ty, row, x, &mut scratch).map_err(|e| {
                    ModelError::Tensor {
                        name: self.name.clone(),
                        message: e.to_string(),
                    }
                })?;
            }
            Ok(())
        };
        // Tiny matrices are faster on one thread; the result is the same either way.
        if self.rows * self.cols >= 1 << 16 {
            y.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .try_for_each(run)
        } else {
            y.chunks_mut(ROWS_PER_TASK).enumerate().try_for_each(run)
        }
    }

    /// Dequantizes row `r` into `out` (`cols` values) and checks it is finite.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), ModelError> {
        if r >= self.rows || out.len() != self.cols {
            return Err(ModelError::Tensor {
                name: self.name.clone(),
                message: format!("row {r} of {} requested", self.rows),
            });
        }
        quant::dequantize(self.ty, self.row(r), out).map_err(|e| ModelError::Tensor {
            name: self.name.clone(),
            message: e.to_string(),
        })?;
        if out.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::NonFiniteWeight {
                name: self.name.clone(),
                detail: format!(" in row {r}"),
            });
        }
        Ok(())
    }
}

/// Looks tensors up by name and checks shape and type.
pub struct Binder<'a> {
    gguf: &'a Arc<Gguf>,
}

fn shape_of(info: &TensorInfo) -> Vec<u64> {
    // Trailing 1s carry no layout information ([H, 1] and [H] are the same bytes).
    let mut dims = info.dims.clone();
    while dims.len() > 1 && dims.last() == Some(&1) {
        dims.pop();
    }
    dims
}

impl<'a> Binder<'a> {
    pub fn new(gguf: &'a Arc<Gguf>) -> Self {
        Binder { gguf }
    }

    fn info(&self, name: &str) -> Result<(usize, &'a TensorInfo), ModelError> {
        let tensors = self.gguf.tensors();
        let index = tensors.iter().position(|t| t.name == name).ok_or_else(|| {
            ModelError::MissingTensor {
                name: name.to_string(),
            }
        })?;
        let info = &tensors[index];
        if !quant::is_supported(info.ty) {
            return Err(ModelError::UnsupportedType {
                name: name.to_string(),
                ty: info.ty.name().to_string(),
            });
        }
        Ok((index, info))
    }

    pub fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    fn check_shape(name: &str, info: &TensorInfo, expected: &[u64]) -> Result<(), ModelError> {
        let mut want = expected.to_vec();
        while want.len() > 1 && want.last() == Some(&1) {
            want.pop();
        }
        if shape_of(info) != want {
            return Err(ModelError::BadShape {
                name: name.to_string(),
                expected: expected.to_vec(),
                found: info.dims.clone(),
            });
        }
        Ok(())
    }

    fn eager_check(name: &str, info: &TensorInfo, bytes: &[u8]) -> Result<(), ModelError> {
        quant::check_finite(info.ty, bytes).map_err(|e| ModelError::NonFiniteWeight {
            name: name.to_string(),
            detail: format!(": {e}"),
        })
    }

    fn view(
        &self,
        name: &str,
        (index, info): (usize, &TensorInfo),
        byte_offset: usize,
        rows: usize,
        cols: usize,
        lazy: bool,
    ) -> Result<QuantMatrix, ModelError> {
        let row_bytes = info
            .ty
            .row_bytes(cols as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| ModelError::Tensor {
                name: name.to_string(),
                message: format!(
                    "row of {cols} is not a whole number of {} blocks",
                    info.ty.name()
                ),
            })?;
        let data_len = self.gguf.tensor_data(info).len();
        let end = rows
            .checked_mul(row_bytes)
            .and_then(|n| n.checked_add(byte_offset));
        if end.is_none_or(|end| end > data_len) {
            return Err(ModelError::Tensor {
                name: name.to_string(),
                message: "tensor data is shorter than its shape".into(),
            });
        }
        Ok(QuantMatrix {
            gguf: Arc::clone(self.gguf),
            tensor_index: index,
            byte_offset,
            rows,
            cols,
            ty: info.ty,
            row_bytes,
            name: name.to_string(),
            lazy_check: lazy.then(OnceLock::new),
        })
    }

    /// A 2-D weight with `cols` inputs (ne0) and `rows` outputs (ne1).
    pub fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<QuantMatrix, ModelError> {
        let (index, info) = self.info(name)?;
        Self::check_shape(name, info, &[cols as u64, rows as u64])?;
        let lazy = info.n_bytes > EAGER_CHECK_BYTES;
        if !lazy {
            Self::eager_check(name, info, self.gguf.tensor_data(info))?;
        }
        self.view(name, (index, info), 0, rows, cols, lazy)
    }

    /// A table read by row gathers only (token embedding, PLE table): rows are checked when gathered.
    pub fn table(&self, name: &str, cols: usize, rows: usize) -> Result<QuantMatrix, ModelError> {
        let (index, info) = self.info(name)?;
        Self::check_shape(name, info, &[cols as u64, rows as u64])?;
        self.view(name, (index, info), 0, rows, cols, false)
    }

    /// A 3-D expert tensor `[cols, rows_per_expert · parts, n_expert]` split into per-expert views.
    /// `parts` > 1 for fused tensors; `part` selects which slice of each expert's rows to view.
    pub fn experts(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
        n_expert: usize,
        parts: usize,
        part: usize,
    ) -> Result<Vec<QuantMatrix>, ModelError> {
        let (index, info) = self.info(name)?;
        Self::check_shape(
            name,
            info,
            &[cols as u64, (rows * parts) as u64, n_expert as u64],
        )?;
        let lazy = info.n_bytes > EAGER_CHECK_BYTES;
        if !lazy {
            Self::eager_check(name, info, self.gguf.tensor_data(info))?;
        }
        let row_bytes = info
            .ty
            .row_bytes(cols as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| ModelError::Tensor {
                name: name.to_string(),
                message: "bad row size".into(),
            })?;
        let expert_bytes = rows * parts * row_bytes;
        (0..n_expert)
            .map(|e| {
                self.view(
                    name,
                    (index, info),
                    e * expert_bytes + part * rows * row_bytes,
                    rows,
                    cols,
                    lazy,
                )
            })
            .collect()
    }

    /// A small tensor with `n` elements in total (any shape), dequantized to f32 and checked.
    pub fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        let (_, info) = self.info(name)?;
        let total: u64 = info.dims.iter().product();
        if total != n as u64 {
            return Err(ModelError::BadShape {
                name: name.to_string(),
                expected: vec![n as u64],
                found: info.dims.clone(),
            });
        }
        let mut out = vec![0.0f32; n];
        quant::dequantize(info.ty, self.gguf.tensor_data(info), &mut out).map_err(|e| {
            ModelError::Tensor {
                name: name.to_string(),
                message: e.to_string(),
            }
        })?;
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::NonFiniteWeight {
                name: name.to_string(),
                detail: format!(" at element {i}"),
            });
        }
        Ok(out)
    }

    /// A small tensor with an exact shape, dequantized to f32.
    pub fn shaped_vector(&self, name: &str, shape: &[u64]) -> Result<Vec<f32>, ModelError> {
        let (_, info) = self.info(name)?;
        Self::check_shape(name, info, shape)?;
        self.vector(name, shape.iter().product::<u64>() as usize)
    }
}

/// One hyper-connection module (model-spec §2.3).
#[derive(Debug)]
pub struct HcWeights {
    /// Folded `1 + w`, 4H, stream-major.
    pub norm: Vec<f32>,
    pub down: QuantMatrix,
    pub up: QuantMatrix,
    /// Absent for the head mixer.
    pub inject: Option<QuantMatrix>,
}

#[derive(Debug)]
pub struct GdnWeights {
    pub qkv: QuantMatrix,
    pub gate: QuantMatrix,
    pub beta: QuantMatrix,
    pub alpha: QuantMatrix,
    pub dt_bias: Vec<f32>,
    /// `−exp(A_log)`.
    pub a: Vec<f32>,
    /// `[channels][kernel]`.
    pub conv: Vec<f32>,
    /// Not folded.
    pub norm: Vec<f32>,
    pub out: QuantMatrix,
}

#[derive(Debug)]
pub struct IndexerWeights {
    pub q: QuantMatrix,
    pub k: QuantMatrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

#[derive(Debug)]
pub struct QsaWeights {
    /// Per head: `head_dim` query rows then `head_dim` gate rows.
    pub q: QuantMatrix,
    pub k: QuantMatrix,
    pub v: QuantMatrix,
    pub out: QuantMatrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// `None`: dense attention.
    pub indexer: Option<IndexerWeights>,
    pub compress_ratio: Option<usize>,
}

#[derive(Debug)]
pub struct SharedExpertWeights {
    pub gate: QuantMatrix,
    pub up: QuantMatrix,
    pub down: QuantMatrix,
    /// `w_sg`, H values.
    pub gate_inp: Vec<f32>,
}

#[derive(Debug)]
pub struct MoeWeights {
    pub router: QuantMatrix,
    pub gate: Vec<QuantMatrix>,
    pub up: Vec<QuantMatrix>,
    pub down: Vec<QuantMatrix>,
    pub shared: Option<SharedExpertWeights>,
}

#[derive(Debug)]
pub struct PleWeights {
    /// `[rows, head_dim]`, gathered by hashed row index.
    pub table: QuantMatrix,
    pub key: QuantMatrix,
    pub value: QuantMatrix,
    pub norm_key: Vec<f32>,
    pub norm_query: Vec<f32>,
    pub norm_conv: Vec<f32>,
    /// `[channels][kernel]`.
    pub conv: Vec<f32>,
}

#[derive(Debug)]
pub enum MixerWeights {
    Gdn(GdnWeights),
    Qsa(QsaWeights),
}

#[derive(Debug)]
pub struct LayerWeights {
    pub ple: Option<PleWeights>,
    pub attn_hc: HcWeights,
    pub mixer: MixerWeights,
    pub ffn_hc: HcWeights,
    pub moe: MoeWeights,
}

#[derive(Debug)]
pub struct Weights {
    pub token_embd: QuantMatrix,
    pub output: QuantMatrix,
    pub head_hc: HcWeights,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// Binds every tensor the config needs, checking shapes, types and (small tensors) finiteness.
    /// `progress` is called after each layer with (layers done, total).
    pub fn bind(
        gguf: &Arc<Gguf>,
        cfg: &Config,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Weights, ModelError> {
        let b = Binder::new(gguf);
        let h = cfg.n_embd;
        let wide = cfg.hc_count * h;
        let token_embd = b.table("token_embd.weight", h, cfg.vocab_size)?;
        // Tied embeddings (no output.weight): the embedding table doubles as lm_head.
        let output_name = if b.has("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let output = b.matrix(output_name, h, cfg.vocab_size)?;
        let head_hc = bind_hc(&b, cfg, "output_hc", false)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for (il, kind) in cfg.layers.iter().enumerate() {
            let p = format!("blk.{il}.");
            let ple = match &cfg.ple {
                Some(pc) if pc.layer == il => {
                    let total_rows: u64 = gguf
                        .tensor("per_layer_token_embd.weight")
                        .and_then(|t| t.dims.get(1).copied())
                        .ok_or_else(|| ModelError::MissingTensor {
                            name: "per_layer_token_embd.weight".into(),
                        })?;
                    let rows = usize::try_from(total_rows).map_err(|_| ModelError::Tensor {
                        name: "per_layer_token_embd.weight".into(),
                        message: "too many rows".into(),
                    })?;
                    for (hd, (&off, &size)) in
                        pc.head_offsets.iter().zip(&pc.head_vocab_sizes).enumerate()
                    {
                        if off.checked_add(size).is_none_or(|end| end > total_rows) {
                            return Err(ModelError::Tensor {
                                name: "per_layer_token_embd.weight".into(),
                                message: format!(
                                    "PLE head {hd} (offset {off}, size {size}) runs past the table's {total_rows} rows"
                                ),
                            });
                        }
                    }
                    let ed = pc.embed_dim();
                    Some(PleWeights {
                        table: b.table("per_layer_token_embd.weight", pc.head_dim, rows)?,
                        key: b.matrix(&format!("{p}ple_key.weight"), ed, wide)?,
                        value: b.matrix(&format!("{p}ple_value.weight"), ed, h)?,
                        norm_key: b.vector(&format!("{p}ple_norm_key.weight"), wide)?,
                        norm_query: b.vector(&format!("{p}ple_norm_query.weight"), wide)?,
                        norm_conv: b.vector(&format!("{p}ple_norm_conv.weight"), wide)?,
                        conv: b.shaped_vector(
                            &format!("{p}ple_conv1d.weight"),
                            &[pc.conv_kernel as u64, wide as u64],
                        )?,
                    })
                }
                _ => None,
            };
            let attn_hc = bind_hc(&b, cfg, &format!("{p}hc_attn"), true)?;
            let ffn_hc = bind_hc(&b, cfg, &format!("{p}hc_ffn"), true)?;
            let mixer = match kind {
                LayerKind::Gdn => MixerWeights::Gdn(bind_gdn(&b, cfg, &p)?),
                LayerKind::Qsa { compress_ratio } => {
                    MixerWeights::Qsa(bind_qsa(&b, cfg, &p, *compress_ratio)?)
                }
            };
            let moe = bind_moe(&b, cfg, &p)?;
            layers.push(LayerWeights {
                ple,
                attn_hc,
                mixer,
                ffn_hc,
                moe,
            });
            progress(il + 1, cfg.n_layer);
        }
        Ok(Weights {
            token_embd,
            output,
            head_hc,
            layers,
        })
    }
}

fn bind_hc(
    b: &Binder,
    cfg: &Config,
    prefix: &str,
    with_inject: bool,
) -> Result<HcWeights, ModelError> {
    let wide = cfg.hc_count * cfg.n_embd;
    Ok(HcWeights {
        // [4H] or [H, 4]: the same stream-major bytes.
        norm: b.vector(&format!("{prefix}_norm.weight"), wide)?,
        down: b.matrix(&format!("{prefix}_down.weight"), wide, cfg.hc_low_rank)?,
        up: b.matrix(&format!("{prefix}_up.weight"), cfg.hc_low_rank, wide)?,
        inject: if with_inject {
            Some(b.matrix(&format!("{prefix}_inject.weight"), wide, cfg.hc_count)?)
        } else {
            None
        },
    })
}

fn bind_gdn(b: &Binder, cfg: &Config, p: &str) -> Result<GdnWeights, ModelError> {
    let h = cfg.n_embd;
    let d = &cfg.gdn;
    let channels = d.conv_channels();
    Ok(GdnWeights {
        qkv: b.matrix(&format!("{p}attn_qkv.weight"), h, channels)?,
        gate: b.matrix(&format!("{p}attn_gate.weight"), h, d.value_dim())?,
        beta: b.matrix(&format!("{p}ssm_beta.weight"), h, d.n_v_heads)?,
        alpha: b.matrix(&format!("{p}ssm_alpha.weight"), h, d.n_v_heads)?,
        dt_bias: b.vector(&format!("{p}ssm_dt.bias"), d.n_v_heads)?,
        a: b.vector(&format!("{p}ssm_a"), d.n_v_heads)?,
        conv: b.shaped_vector(
            &format!("{p}ssm_conv1d.weight"),
            &[d.conv_kernel as u64, channels as u64],
        )?,
        norm: b.vector(&format!("{p}ssm_norm.weight"), d.head_v_dim)?,
        out: b.matrix(&format!("{p}ssm_out.weight"), d.value_dim(), h)?,
    })
}

fn bind_qsa(
    b: &Binder,
    cfg: &Config,
    p: &str,
    compress_ratio: Option<usize>,
) -> Result<QsaWeights, ModelError> {
    let h = cfg.n_embd;
    let a = &cfg.attention;
    let q_name = format!("{p}indexer.q_proj.weight");
    // Ratio assumed from a zero-ratio file (finding F2) but no indexer tensors: attend densely.
    let compress_ratio = if cfg.assumed_qsa_ratio && !b.has(&q_name) {
        None
    } else {
        compress_ratio
    };
    let indexer = match compress_ratio {
        Some(_) => Some(IndexerWeights {
            q: b.matrix(&q_name, h, a.indexer_n_head * a.indexer_head_dim)?,
            k: b.matrix(&format!("{p}indexer.k_proj.weight"), h, a.indexer_head_dim)?,
            q_norm: b.vector(&format!("{p}indexer.q_norm.weight"), a.indexer_head_dim)?,
            k_norm: b.vector(&format!("{p}indexer.k_norm.weight"), a.indexer_head_dim)?,
        }),
        None => None,
    };
    Ok(QsaWeights {
        q: b.matrix(&format!("{p}attn_q.weight"), h, 2 * a.n_head * a.head_dim)?,
        k: b.matrix(&format!("{p}attn_k.weight"), h, a.n_head_kv * a.head_dim)?,
        v: b.matrix(&format!("{p}attn_v.weight"), h, a.n_head_kv * a.head_dim)?,
        out: b.matrix(&format!("{p}attn_output.weight"), a.n_head * a.head_dim, h)?,
        q_norm: b.vector(&format!("{p}attn_q_norm.weight"), a.head_dim)?,
        k_norm: b.vector(&format!("{p}attn_k_norm.weight"), a.head_dim)?,
        indexer,
        compress_ratio,
    })
}

fn bind_moe(b: &Binder, cfg: &Config, p: &str) -> Result<MoeWeights, ModelError> {
    let h = cfg.n_embd;
    let m = &cfg.moe;
    let fused = format!("{p}ffn_gate_up_exps.weight");
    let (gate, up) = if b.has(&fused) {
        (
            b.experts(&fused, h, m.expert_ff, m.n_expert, 2, 0)?,
            b.experts(&fused, h, m.expert_ff, m.n_expert, 2, 1)?,
        )
    } else {
        (
            b.experts(
                &format!("{p}ffn_gate_exps.weight"),
                h,
                m.expert_ff,
                m.n_expert,
                1,
                0,
            )?,
            b.experts(
                &format!("{p}ffn_up_exps.weight"),
                h,
                m.expert_ff,
                m.n_expert,
                1,
                0,
            )?,
        )
    };
    let down = b.experts(
        &format!("{p}ffn_down_exps.weight"),
        m.expert_ff,
        h,
        m.n_expert,
        1,
        0,
    )?;
    let shared = if m.shared_ff > 0 {
        Some(SharedExpertWeights {
            gate: b.matrix(&format!("{p}ffn_gate_shexp.weight"), h, m.shared_ff)?,
            up: b.matrix(&format!("{p}ffn_up_shexp.weight"), h, m.shared_ff)?,
            down: b.matrix(&format!("{p}ffn_down_shexp.weight"), m.shared_ff, h)?,
            gate_inp: b.vector(&format!("{p}ffn_gate_inp_shexp.weight"), h)?,
        })
    } else {
        None
    };
    Ok(MoeWeights {
        router: b.matrix(&format!("{p}ffn_gate_inp.weight"), h, m.n_expert)?,
        gate,
        up,
        down,
        shared,
    })
}
