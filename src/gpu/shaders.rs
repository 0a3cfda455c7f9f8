//! WGSL sources and their assembly. Each op lives in `shaders/<op>.wgsl`; a quantized kernel is the
//! op body concatenated with `shaders/quant/common.wgsl` and the `dequant_chunk` of one type
//! (`shaders/quant/<type>.wgsl`), so every type shares one mat-vec body and one reduction order.

use crate::gguf::types::GgmlType;

use super::GpuError;

const QUANT_COMMON: &str = include_str!("../../shaders/quant/common.wgsl");
const IQ_COMMON: &str = include_str!("../../shaders/quant/iq_common.wgsl");
// Mat-vec row bodies: lanes along the row for types with a register `dq8`, else a lane per 32-value
// chunk (with the type's register `dq_chunk`, or the generic one built on `dequant_chunk`).
const ROWDOT_GROUP: &str = include_str!("../../shaders/quant/rowdot_group.wgsl");
const ROWDOT_CHUNK: &str = include_str!("../../shaders/quant/rowdot_chunk.wgsl");
const GENERIC_DQ_CHUNK: &str = include_str!("../../shaders/quant/chunk_regs.wgsl");
// Row bodies (and get_rows) of the mat-vec: split layouts (src/gpu/layout.rs) and GGUF blocks.
const ROWS_SPLIT: &str = include_str!("../../shaders/quant/rows_split.wgsl");
const ROWS_BLOCK: &str = include_str!("../../shaders/quant/rows_block.wgsl");
// Wide prefill tiles over the split row bodies (the `matvec_wide` assemblies).
const ROWS_WIDE: &str = include_str!("../../shaders/quant/rows_wide.wgsl");
// Tensor-core prefill tiles over the split row bodies (the `matvec_coop` assemblies).
const ROWS_COOP: &str = include_str!("../../shaders/quant/rows_coop.wgsl");
// The integer-digit row body (the `matvec_idot` and `matvec_conv_idot` assemblies); the other split
// assemblies get its stub.
const ROWS_IDOT: &str = include_str!("../../shaders/quant/rows_idot.wgsl");
// The digits' binding, and what replaces it in the `_idot_local` assemblies (decode stages its
// digits in workgroup memory and binds no XQ, which would order every such dispatch after the
// last one: wgpu orders writes to one buffer).
const XQ_BINDING: &str = "@group(0) @binding(19) var<storage, read_write> XQ: array<u32>;";
const XQ_UNBOUND: &str = "var<private> XQ: array<u32, 1>;";
const IDOT_NONE: &str = concat!(
    "const IDOT: bool = false;\n",
    "fn rows_dot_idot(row0: u32, row_step: u32, n_rows: u32, x_base: u32, n_items: u32, ",
    "lane: u32, sg_size: u32) -> Acc { return zero_acc(); }\n",
    "const IDOT_LOCAL: bool = false;\n",
    "fn xq_stage(xb: u32, base: u32, lid: u32) {}\n",
    "fn slot_x(xb: u32, s: u32) -> u32 { return xb; }\n"
);
const ROWS_WIDE_IDOT: &str = include_str!("../../shaders/quant/rows_wide_idot.wgsl");
const WIDE_IDOT_NONE: &str = concat!(
    "fn rows_wide_idot(row0: u32, row_step: u32, n_rows: u32, nq: u32, lane: u32, ",
    "sg_size: u32) -> Wide { return Wide(zero_quad(), zero_quad(), zero_quad(), zero_quad()); }\n"
);
// Unquantized rows of any length, read one value at a time.
const ROWS_ANY: &str = include_str!("../../shaders/quant/rows_any.wgsl");
const IQ_GRID_BINDING: &str = "@group(0) @binding(4) var<storage, read> GRID: array<u32>;\n";
// The input norm of the mat-vec (X_MODE 3): the `matvec_norm` assemblies of the split types read
// it (the norm weight bound as AUX); the others get identities that never touch AUX, so their
// pipelines do not bind it.
const X_NORM: &str = include_str!("../../shaders/quant/x_norm.wgsl");
const X_NORM_NONE: &str = concat!(
    "fn norm_prologue(tile: Tile, wg_x: u32, n_wg: u32, lid: u32, lane: u32, sg_id: u32, ",
    "n_sg: u32) {}\n"
);
const X_NORM_SEG_NONE: &str = "fn norm_seg(s: Seg, pos: u32, j: u32) -> Seg { return s; }\n";
// Decode's GDN conv in the input projection's store (Y0_MODE 3): the `matvec_conv` assemblies bind
// the conv history and taps; the others store the rows as they are.
const CONV_TAP: &str = include_str!("../../shaders/conv_tap.wgsl");
const SEG_CONV: &str = include_str!("../../shaders/quant/seg_conv.wgsl");
const SEG_CONV_NONE: &str = "fn seg0_store(c: u32, u: f32) -> f32 { return u; }\n";

/// A type's file with the task builders it shares with its family appended.
macro_rules! quant_with {
    ($file:literal, $tasks:literal) => {
        concat!(
            include_str!(concat!("../../shaders/quant/", $file, ".wgsl")),
            include_str!(concat!("../../shaders/quant/", $tasks, ".wgsl"))
        )
    };
}

/// Weight formats the GPU kernels can read, with the WGSL file that dequantizes them.
pub fn quant_source(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => include_str!("../../shaders/quant/f32.wgsl"),
        GgmlType::F16 => include_str!("../../shaders/quant/f16.wgsl"),
        GgmlType::BF16 => include_str!("../../shaders/quant/bf16.wgsl"),
        GgmlType::Q8_0 => include_str!("../../shaders/quant/q8_0.wgsl"),
        GgmlType::Q4_0 => include_str!("../../shaders/quant/q4_0.wgsl"),
        GgmlType::Q4_1 => include_str!("../../shaders/quant/q4_1.wgsl"),
        GgmlType::Q5_0 => include_str!("../../shaders/quant/q5_0.wgsl"),
        GgmlType::Q5_1 => include_str!("../../shaders/quant/q5_1.wgsl"),
        GgmlType::IQ4_NL => quant_with!("iq4_nl", "iq4_tasks"),
        GgmlType::IQ4_XS => quant_with!("iq4_xs", "iq4_tasks"),
        GgmlType::Q2_K => include_str!("../../shaders/quant/q2_k.wgsl"),
        GgmlType::Q3_K => include_str!("../../shaders/quant/q3_k.wgsl"),
        GgmlType::Q4_K => quant_with!("q4_k", "k_tasks"),
        GgmlType::Q5_K => quant_with!("q5_k", "k_tasks"),
        GgmlType::Q6_K => include_str!("../../shaders/quant/q6_k.wgsl"),
        GgmlType::IQ2_XXS => include_str!("../../shaders/quant/iq2_xxs.wgsl"),
        GgmlType::IQ2_XS => quant_with!("iq2_xs", "iq2_tasks"),
        GgmlType::IQ2_S => quant_with!("iq2_s", "iq2_tasks"),
        GgmlType::IQ3_XXS => include_str!("../../shaders/quant/iq3_xxs.wgsl"),
        GgmlType::IQ3_S => include_str!("../../shaders/quant/iq3_s.wgsl"),
        GgmlType::IQ1_S => quant_with!("iq1_s", "iq1_tasks"),
        GgmlType::IQ1_M => quant_with!("iq1_m", "iq1_tasks"),
        GgmlType::Q1_0 => include_str!("../../shaders/quant/q1_0.wgsl"),
        GgmlType::Q2_0 => include_str!("../../shaders/quant/q2_0.wgsl"),
        GgmlType::TQ1_0 => include_str!("../../shaders/quant/tq1_0.wgsl"),
        GgmlType::TQ2_0 => include_str!("../../shaders/quant/tq2_0.wgsl"),
        GgmlType::MXFP4 => include_str!("../../shaders/quant/mxfp4.wgsl"),
        GgmlType::NVFP4 => include_str!("../../shaders/quant/nvfp4.wgsl"),
        _ => return None,
    })
}

/// Whether the type's dequantizer reads a codebook table (bound as `GRID`, binding 4).
pub fn needs_grid(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ1_S
            | GgmlType::IQ1_M
    )
}

/// The mat-vec row body for the types without a split layout: lanes along the row (`dq8`) for the
/// float types; the generic chunk path for the rest.
fn row_body(ty: GgmlType) -> String {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ROWDOT_GROUP.to_string(),
        _ => format!("{GENERIC_DQ_CHUNK}\n{ROWDOT_CHUNK}"),
    }
}

/// Whether the type's weights have mins (a weight is scale * code - min: Q4_K, Q5_K). Their tasks
/// carry the mins, which the limb arithmetic and its tensor-core tiles do not read: such weights
/// keep the default arithmetic in a limb context.
pub fn has_min(ty: GgmlType) -> bool {
    quant_source(ty).is_some_and(|s| s.contains("const HAS_MIN: bool = true;"))
}

/// Whether the limb arithmetic (and its tensor-core tiles) applies to weights of this type.
pub fn limb_supported(ty: GgmlType) -> bool {
    super::layout::split_d(ty).is_some() && !has_min(ty)
}

/// Whether the type has integer codes for the `matvec_idot` assemblies (its `task_wi`).
pub fn idot_supported(ty: GgmlType) -> bool {
    super::layout::split_d(ty).is_some()
        && quant_source(ty).is_some_and(|s| s.contains("fn task_wi("))
}

/// Whether the GPU kernels can read tensors of this type.
pub fn supports(ty: GgmlType) -> bool {
    quant_source(ty).is_some()
}

fn op_source(op: &str) -> Option<&'static str> {
    Some(match op {
        "matvec" | "matvec_any" | "matvec_norm" | "matvec_conv" | "matvec_wide" | "matvec_coop"
        | "matvec_idot" | "matvec_conv_idot" | "matvec_norm_idot" | "matvec_wide_idot" => {
            include_str!("../../shaders/matvec.wgsl")
        }
        "norm" => include_str!("../../shaders/norm.wgsl"),
        "elementwise" => include_str!("../../shaders/elementwise.wgsl"),
        "hc" => include_str!("../../shaders/hc.wgsl"),
        "gdn" => include_str!("../../shaders/gdn.wgsl"),
        "ple" => include_str!("../../shaders/ple.wgsl"),
        "qsa" => include_str!("../../shaders/qsa.wgsl"),
        "moe" => include_str!("../../shaders/moe.wgsl"),
        "read" => include_str!("../../shaders/read.wgsl"),
        "argmax" => include_str!("../../shaders/argmax.wgsl"),
        "topk" => include_str!("../../shaders/topk.wgsl"),
        "stage" => include_str!("../../shaders/stage.wgsl"),
        _ => return None,
    })
}

/// The fusions of a mat-vec assembly (`op`): the input norm (`matvec_norm`, split row bodies
/// only) and decode's GDN conv store (`matvec_conv`), each an identity elsewhere, so only their
/// own assemblies bind what they read.
fn fusion_sources(op: &str, split: bool) -> String {
    let mut s = String::new();
    if op == "matvec_norm" || op == "matvec_norm_idot" {
        s.push_str(X_NORM);
    } else {
        s.push_str(X_NORM_NONE);
        if split && op != "matvec_any" {
            s.push_str(X_NORM_SEG_NONE);
        }
    }
    if op == "matvec_conv" || op == "matvec_conv_idot" {
        s.push_str(CONV_TAP);
        s.push_str(SEG_CONV);
    } else {
        s.push_str(SEG_CONV_NONE);
    }
    s
}

const STASH_NONE: &str = "const STASH_WG: u32 = 2u;";
const STASH_FULL: &str = "const STASH_WG: u32 = 128u;";

/// The wide tiles' assembly with the stash that ROUNDS and PAIRS use (workgroups of up to 128).
fn with_stash(source: String) -> Result<String, GpuError> {
    if !source.contains(STASH_NONE) {
        return Err(GpuError::Shader {
            shader: "matvec_wide_stash".into(),
            message: "quant/rows_wide.wgsl no longer declares the stash this assembly sizes".into(),
        });
    }
    Ok(source.replace(STASH_NONE, STASH_FULL))
}

/// Assemble shader `name`: either an op (`norm`) or a quantized op (`matvec:Q4_K`).
pub fn assemble(name: &str) -> Result<String, GpuError> {
    let unknown = || GpuError::Shader {
        shader: name.to_string(),
        message: "no such shader".into(),
    };
    match name.split_once(':') {
        // The GDN conv shares its tap expression with matvec_conv's store.
        None if name == "gdn" => op_source(name)
            .map(|s| format!("{s}\n{CONV_TAP}"))
            .ok_or_else(unknown),
        None => op_source(name).map(str::to_string).ok_or_else(unknown),
        Some((op, ty_name)) => {
            // Decode's workgroup-staged digits: the same assembly without the XQ binding.
            let (op, staged) = match op.strip_suffix("_local") {
                Some(base) if base.ends_with("_idot") => (base, true),
                _ => (op, false),
            };
            // The wide tiles with their rounds' and pairs' stash (quant/rows_wide.wgsl).
            let (op, stash) = match op {
                "matvec_wide_stash" => ("matvec_wide", true),
                _ => (op, false),
            };
            let body = op_source(op).ok_or_else(unknown)?;
            let ty = GgmlType::from_name(ty_name).ok_or_else(unknown)?;
            let quant = quant_source(ty).ok_or_else(|| {
                GpuError::Unsupported(format!("no GPU dequantizer for {}", ty.name()))
            })?;
            let grid = if needs_grid(ty) {
                format!("{IQ_GRID_BINDING}{IQ_COMMON}\n")
            } else {
                String::new()
            };
            let head = super::layout::split_d(ty).map(|sd| sd.head_bytes);
            let split = head.is_some();
            let idot = op.ends_with("_idot");
            if (idot || matches!(op, "matvec_norm" | "matvec_wide" | "matvec_coop")) && !split {
                return Err(GpuError::Unsupported(format!(
                    "no {op} for {} (split layouts only)",
                    ty.name()
                )));
            }
            if op == "matvec_coop" && has_min(ty) {
                return Err(GpuError::Unsupported(format!(
                    "no tensor-core tiles for {} (weights with mins)",
                    ty.name()
                )));
            }
            if idot && !idot_supported(ty) {
                return Err(GpuError::Unsupported(format!(
                    "no integer-digit codes for {}",
                    ty.name()
                )));
            }
            let rows = if op == "matvec_any" {
                format!("{ROWS_ANY}\n{IDOT_NONE}")
            } else if op == "matvec_wide" {
                format!("{ROWS_SPLIT}\n{IDOT_NONE}{ROWS_WIDE}\n{WIDE_IDOT_NONE}")
            } else if op == "matvec_wide_idot" {
                format!("{ROWS_SPLIT}\n{ROWS_IDOT}\n{ROWS_WIDE}\n{ROWS_WIDE_IDOT}")
            } else if op == "matvec_coop" {
                format!("{ROWS_SPLIT}\n{IDOT_NONE}{ROWS_COOP}")
            } else if idot {
                format!("{ROWS_SPLIT}\n{ROWS_IDOT}")
            } else if split {
                format!("{ROWS_SPLIT}\n{IDOT_NONE}")
            } else {
                format!("{}\n{ROWS_BLOCK}\n{IDOT_NONE}", row_body(ty))
            };
            // Types without a workgroup codebook get an empty prologue (shaders/matvec.wgsl).
            let prologue = if quant.contains("fn prologue(") {
                ""
            } else {
                "fn prologue(lid: u32) {}\n"
            };
            // Only the types with mins declare HAS_MIN; they never take the limb arithmetic.
            let mins = if quant.contains("const HAS_MIN") {
                ""
            } else {
                "const HAS_MIN: bool = false;\n"
            };
            let fused = fusion_sources(op, split);
            // WGSL's enable directives come before any declaration.
            let enables = if op == "matvec_coop" {
                "enable f16;\nenable wgpu_cooperative_matrix;\n"
            } else {
                ""
            };
            // A split layout's head bytes per block (src/gpu/layout.rs), for its rows' heads.
            let head = head.map_or(String::new(), |h| {
                format!("const HEAD_BYTES: u32 = {h}u;\n")
            });
            let source = format!(
                "{enables}{body}\n{grid}{QUANT_COMMON}\n{head}{quant}\n{prologue}{mins}{rows}\n{fused}"
            );
            let source = if has_min(ty) {
                source.replace("override LIMB: bool = false;", "const LIMB: bool = false;")
            } else {
                source
            };
            let source = if stash { with_stash(source)? } else { source };
            Ok(if staged {
                source.replace(XQ_BINDING, XQ_UNBOUND)
            } else {
                source
            })
        }
    }
}
