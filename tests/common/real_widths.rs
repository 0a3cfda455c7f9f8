//! A synthetic model with the real Qwen3.8-Flash-Next widths (hidden 2560, 4 streams of low rank
//! 320, attention 24/2 heads × 256 with a 4 × 128 indexer, GDN 16 k / 48 v heads × 128, expert width
//! 640, PLE 16 heads × 160) but three layers (GDN, GDN with PLE, QSA), 4 experts and a 512-token
//! vocabulary: `tests/model_real_widths.rs` (CPU) and `tests/gpu_real_widths.rs`.

use strata::gguf::{GgmlType, GgufWriter, Value};
use strata::quant;

pub const H: u64 = 2560;
pub const HC: u64 = 4;
pub const WIDE: u64 = H * HC;
pub const HC_RANK: u64 = 320;
pub const VOCAB: u64 = 512;
pub const N_HEAD: u64 = 24;
pub const N_HEAD_KV: u64 = 2;
pub const HEAD_DIM: u64 = 256;
pub const IDX_HEADS: u64 = 4;
pub const IDX_DIM: u64 = 128;
pub const K_HEADS: u64 = 16;
pub const V_HEADS: u64 = 48;
pub const SSM_DIM: u64 = 128;
pub const CONV_CHANNELS: u64 = 2 * K_HEADS * SSM_DIM + V_HEADS * SSM_DIM;
pub const EXPERT_FF: u64 = 640;
pub const N_EXPERT: u64 = 4;
pub const PLE_HEAD_DIM: u64 = 160;
pub const PLE_HEADS: u64 = 16;
pub const EOS: u64 = 509;
/// GDN, GDN with PLE, QSA.
pub const RECURRENT: [bool; 3] = [true, true, false];

/// Deterministic values for the small f32 tensors.
pub struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }
    fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }
}

pub struct Builder {
    writer: GgufWriter,
    rng: Rng,
    seed: u64,
}

impl Builder {
    /// A Q8_0 matrix `[cols, rows]` whose dequantized weights have RMS ≈ gain / sqrt(cols): random
    /// code bytes, block scales set so activations stay O(1) through the stack.
    fn q8(&mut self, name: &str, dims: &[u64], gain: f32) {
        let n: u64 = dims.iter().product();
        let n_blocks = (n / 32) as usize;
        self.seed += 1;
        let mut data = quant::random_blocks(GgmlType::Q8_0, n_blocks, self.seed);
        // Uniform int8 codes have RMS ≈ 73.9; the f16 block scale comes first in each 34-byte block.
        let scale = half::f16::from_f32(gain / (73.9 * (dims[0] as f32).sqrt()));
        for block in data.chunks_exact_mut(34) {
            block[..2].copy_from_slice(&scale.to_le_bytes());
        }
        self.writer
            .add_tensor(name, dims, GgmlType::Q8_0, data)
            .expect("q8 tensor");
    }

    /// A matrix of `ty` (Q8_0, IQ1_M, or a type whose f16 `d` leads each block) with dequantized RMS ≈
    /// gain / sqrt(cols): random blocks whose `d` is set from the RMS of their codes at d = 1.
    fn quantized(&mut self, name: &str, dims: &[u64], gain: f32, ty: GgmlType) {
        if ty == GgmlType::Q8_0 {
            return self.q8(name, dims, gain);
        }
        let n: u64 = dims.iter().product();
        let n_blocks = (n / ty.block_size() as u64) as usize;
        self.seed += 1;
        let mut data = quant::random_blocks(ty, n_blocks, self.seed);
        let size = ty.type_size();
        let set_d = |data: &mut [u8], d: f32| {
            let bits = half::f16::from_f32(d).to_bits();
            for block in data.chunks_exact_mut(size) {
                if ty == GgmlType::IQ1_M {
                    set_iq1_m_d(block, bits);
                } else {
                    block[..2].copy_from_slice(&bits.to_le_bytes());
                }
            }
        };
        set_d(&mut data, 1.0);
        let sample = n_blocks.min(64);
        let mut values = vec![0f32; sample * ty.block_size()];
        quant::dequantize(ty, &data[..sample * size], &mut values).expect("dequantize");
        let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
        set_d(&mut data, gain / (rms * (dims[0] as f32).sqrt()));
        self.writer
            .add_tensor(name, dims, ty, data)
            .expect("quantized tensor");
    }

    fn f32(&mut self, name: &str, dims: &[u64], mut value: impl FnMut(&mut Rng) -> f32) {
        let n: u64 = dims.iter().product();
        let values: Vec<f32> = (0..n).map(|_| value(&mut self.rng)).collect();
        self.writer
            .add_tensor(
                name,
                dims,
                GgmlType::F32,
                bytemuck::cast_slice::<f32, u8>(&values).to_vec(),
            )
            .expect("f32 tensor");
    }

    fn norm(&mut self, name: &str, n: u64) {
        self.f32(name, &[n], |r| r.range(0.95, 1.05));
    }

    fn small_matrix(&mut self, name: &str, dims: &[u64]) {
        let bound = 3.0f32.sqrt() / (dims[0] as f32).sqrt();
        self.f32(name, dims, |r| r.range(-bound, bound));
    }

    fn hc(&mut self, prefix: &str, inject: bool) {
        self.norm(&format!("{prefix}_norm.weight"), WIDE);
        self.q8(&format!("{prefix}_down.weight"), &[WIDE, HC_RANK], 1.0);
        self.q8(&format!("{prefix}_up.weight"), &[HC_RANK, WIDE], 1.0);
        if inject {
            self.small_matrix(&format!("{prefix}_inject.weight"), &[WIDE, HC]);
        }
    }
}

fn primes_from(mut p: u64, count: usize) -> Vec<u64> {
    let mut out = Vec::new();
    while out.len() < count {
        if (2..p)
            .take_while(|d| d * d <= p)
            .all(|d| !p.is_multiple_of(d))
        {
            out.push(p);
        }
        p += 1;
    }
    out
}

/// IQ1_M's f16 d: nibble i of its bits in the top nibble of the block's scale word i (bytes 48..56).
fn set_iq1_m_d(block: &mut [u8], bits: u16) {
    for i in 0..4 {
        let at = 48 + 2 * i;
        let word = u16::from_le_bytes([block[at], block[at + 1]]);
        let word = (word & 0x0fff) | (((bits >> (4 * i)) & 0xf) << 12);
        block[at..at + 2].copy_from_slice(&word.to_le_bytes());
    }
}

/// The model, its routed experts' gate and up matrices of `experts.0` and down matrices of
/// `experts.1` (Q8_0, IQ1_M, or a type whose f16 `d` leads each block).
pub fn build_model(experts: (GgmlType, GgmlType)) -> Vec<u8> {
    let mut b = Builder {
        writer: GgufWriter::new(),
        rng: Rng(7),
        seed: 100,
    };
    let u32v = |v: u64| Value::U32(v as u32);
    let ple_sizes = primes_from(101, PLE_HEADS as usize);
    let ple_offsets: Vec<u64> = ple_sizes
        .iter()
        .scan(0, |acc, &s| Some(std::mem::replace(acc, *acc + s)))
        .collect();
    let ple_rows = ple_sizes.iter().sum::<u64>().next_multiple_of(128);
    let metadata = [
        ("general.architecture", Value::String("qwen4exp".into())),
        (
            "general.name",
            Value::String("synthetic real widths".into()),
        ),
        ("qwen4exp.block_count", u32v(RECURRENT.len() as u64)),
        ("qwen4exp.context_length", u32v(262144)),
        ("qwen4exp.embedding_length", u32v(H)),
        ("qwen4exp.vocab_size", u32v(VOCAB)),
        ("qwen4exp.attention.head_count", u32v(N_HEAD)),
        ("qwen4exp.attention.head_count_kv", u32v(N_HEAD_KV)),
        ("qwen4exp.attention.key_length", u32v(HEAD_DIM)),
        ("qwen4exp.attention.value_length", u32v(HEAD_DIM)),
        ("qwen4exp.rope.dimension_count", u32v(64)),
        ("qwen4exp.rope.freq_base", Value::F32(1.0e7)),
        (
            "qwen4exp.rope.dimension_sections",
            Value::Array([11, 11, 10, 0].map(Value::I32).to_vec()),
        ),
        (
            "qwen4exp.attention.layer_norm_rms_epsilon",
            Value::F32(1e-6),
        ),
        ("qwen4exp.expert_count", u32v(N_EXPERT)),
        ("qwen4exp.expert_used_count", u32v(2)),
        ("qwen4exp.expert_feed_forward_length", u32v(EXPERT_FF)),
        (
            "qwen4exp.expert_shared_feed_forward_length",
            u32v(EXPERT_FF),
        ),
        ("qwen4exp.ssm.conv_kernel", u32v(4)),
        ("qwen4exp.ssm.state_size", u32v(SSM_DIM)),
        ("qwen4exp.ssm.group_count", u32v(K_HEADS)),
        ("qwen4exp.ssm.time_step_rank", u32v(V_HEADS)),
        ("qwen4exp.ssm.inner_size", u32v(V_HEADS * SSM_DIM)),
        (
            "qwen4exp.attention.recurrent_layers",
            Value::Array(RECURRENT.map(Value::Bool).to_vec()),
        ),
        ("qwen4exp.full_attention_interval", u32v(4)),
        ("qwen4exp.hyper_connection.count", u32v(HC)),
        ("qwen4exp.hyper_connection.low_rank", u32v(HC_RANK)),
        ("qwen4exp.attention.indexer.head_count", u32v(IDX_HEADS)),
        ("qwen4exp.attention.indexer.key_length", u32v(IDX_DIM)),
        ("qwen4exp.attention.indexer.top_k", u32v(8)),
        (
            "qwen4exp.attention.compress_ratios",
            Value::Array(
                RECURRENT
                    .map(|r| Value::I32(if r { 0 } else { 4 }))
                    .to_vec(),
            ),
        ),
        ("qwen4exp.ple.layers", Value::Array(vec![Value::I32(1)])),
        ("qwen4exp.ple.ngram_size", u32v(3)),
        ("qwen4exp.ple.heads_per_ngram", u32v(8)),
        ("qwen4exp.ple.conv_kernel", u32v(4)),
        ("qwen4exp.ple.eos_token_id", u32v(EOS)),
        (
            "qwen4exp.embedding_length_per_layer_input",
            u32v(PLE_HEAD_DIM),
        ),
        (
            "qwen4exp.ple.layer_multipliers",
            Value::Array(
                [23703573157769u64, 20109073645365, 8052911324071]
                    .map(Value::U64)
                    .to_vec(),
            ),
        ),
        (
            "qwen4exp.ple.head_offsets",
            Value::Array(ple_offsets.into_iter().map(Value::U64).collect()),
        ),
        (
            "qwen4exp.ple.head_vocab_sizes",
            Value::Array(ple_sizes.into_iter().map(Value::U64).collect()),
        ),
    ];
    for (key, value) in metadata {
        b.writer.add_metadata(key, value);
    }

    b.q8("token_embd.weight", &[H, VOCAB], (H as f32).sqrt());
    b.q8("output.weight", &[H, VOCAB], 1.0);
    b.hc("output_hc", false);
    b.q8(
        "per_layer_token_embd.weight",
        &[PLE_HEAD_DIM, ple_rows],
        (PLE_HEAD_DIM as f32).sqrt(),
    );
    for (il, &recurrent) in RECURRENT.iter().enumerate() {
        let p = format!("blk.{il}.");
        b.hc(&format!("{p}hc_attn"), true);
        b.hc(&format!("{p}hc_ffn"), true);
        if recurrent {
            b.q8(&format!("{p}attn_qkv.weight"), &[H, CONV_CHANNELS], 1.0);
            b.q8(
                &format!("{p}attn_gate.weight"),
                &[H, V_HEADS * SSM_DIM],
                1.0,
            );
            b.f32(&format!("{p}ssm_conv1d.weight"), &[4, CONV_CHANNELS], |r| {
                r.range(-0.8, 0.8)
            });
            b.f32(&format!("{p}ssm_dt.bias"), &[V_HEADS], |r| {
                r.range(-5.0, -2.0)
            });
            b.f32(&format!("{p}ssm_a"), &[V_HEADS], |r| -r.range(0.5, 8.0));
            b.q8(&format!("{p}ssm_beta.weight"), &[H, V_HEADS], 1.0);
            b.q8(&format!("{p}ssm_alpha.weight"), &[H, V_HEADS], 1.0);
            b.norm(&format!("{p}ssm_norm.weight"), SSM_DIM);
            b.q8(&format!("{p}ssm_out.weight"), &[V_HEADS * SSM_DIM, H], 0.5);
        } else {
            b.q8(
                &format!("{p}attn_q.weight"),
                &[H, 2 * N_HEAD * HEAD_DIM],
                1.0,
            );
            b.q8(
                &format!("{p}attn_k.weight"),
                &[H, N_HEAD_KV * HEAD_DIM],
                1.0,
            );
            b.q8(
                &format!("{p}attn_v.weight"),
                &[H, N_HEAD_KV * HEAD_DIM],
                1.0,
            );
            b.q8(
                &format!("{p}attn_output.weight"),
                &[N_HEAD * HEAD_DIM, H],
                0.5,
            );
            b.norm(&format!("{p}attn_q_norm.weight"), HEAD_DIM);
            b.norm(&format!("{p}attn_k_norm.weight"), HEAD_DIM);
            b.small_matrix(
                &format!("{p}indexer.q_proj.weight"),
                &[H, IDX_HEADS * IDX_DIM],
            );
            b.small_matrix(&format!("{p}indexer.k_proj.weight"), &[H, IDX_DIM]);
            b.norm(&format!("{p}indexer.q_norm.weight"), IDX_DIM);
            b.norm(&format!("{p}indexer.k_norm.weight"), IDX_DIM);
        }
        if il == 1 {
            b.q8(&format!("{p}ple_key.weight"), &[H, WIDE], 1.0);
            b.q8(&format!("{p}ple_value.weight"), &[H, H], 1.0);
            for n in ["key", "query", "conv"] {
                b.norm(&format!("{p}ple_norm_{n}.weight"), WIDE);
            }
            b.f32(&format!("{p}ple_conv1d.weight"), &[4, WIDE], |r| {
                r.range(-0.8, 0.8)
            });
        }
        b.small_matrix(&format!("{p}ffn_gate_inp.weight"), &[H, N_EXPERT]);
        let (gate_up, down) = experts;
        b.quantized(
            &format!("{p}ffn_gate_exps.weight"),
            &[H, EXPERT_FF, N_EXPERT],
            1.0,
            gate_up,
        );
        b.quantized(
            &format!("{p}ffn_up_exps.weight"),
            &[H, EXPERT_FF, N_EXPERT],
            1.0,
            gate_up,
        );
        b.quantized(
            &format!("{p}ffn_down_exps.weight"),
            &[EXPERT_FF, H, N_EXPERT],
            0.5,
            down,
        );
        b.small_matrix(&format!("{p}ffn_gate_inp_shexp.weight"), &[H]);
        b.q8(&format!("{p}ffn_gate_shexp.weight"), &[H, EXPERT_FF], 1.0);
        b.q8(&format!("{p}ffn_up_shexp.weight"), &[H, EXPERT_FF], 1.0);
        b.q8(&format!("{p}ffn_down_shexp.weight"), &[EXPERT_FF, H], 0.5);
    }
    b.writer.to_bytes()
}
