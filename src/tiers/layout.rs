//! Where each routed expert's bytes live in a GGUF, shared by the VRAM planner (slot size and slot
//! layout) and the host expert tier (slices per expert).
//!
//! A routed-expert tensor is 3-D, `[in, out, n_expert]` in ggml order, so the bytes of expert `e`
//! are the contiguous range `[e · per_expert, (e + 1) · per_expert)` of the tensor. A layer has
//! `ffn_gate_exps` + `ffn_up_exps` + `ffn_down_exps`, or the fused `ffn_gate_up_exps` (per expert: the
//! gate rows, then the up rows) + `ffn_down_exps`.

use std::collections::BTreeMap;

use crate::gguf::{GgmlType, Gguf, TensorInfo};

/// Which projection a part of an expert is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExpertRole {
    Gate,
    Up,
    /// `ffn_gate_up_exps`: gate rows then up rows of one expert.
    GateUp,
    Down,
}

impl ExpertRole {
    /// The GGUF tensor name suffix (`blk.N.<suffix>.weight`).
    pub fn tensor_suffix(self) -> &'static str {
        match self {
            ExpertRole::Gate => "ffn_gate_exps",
            ExpertRole::Up => "ffn_up_exps",
            ExpertRole::GateUp => "ffn_gate_up_exps",
            ExpertRole::Down => "ffn_down_exps",
        }
    }

    fn from_suffix(suffix: &str) -> Option<ExpertRole> {
        [
            ExpertRole::Gate,
            ExpertRole::Up,
            ExpertRole::GateUp,
            ExpertRole::Down,
        ]
        .into_iter()
        .find(|role| role.tensor_suffix() == suffix)
    }
}

/// One projection of a layer's routed experts.
#[derive(Debug, Clone)]
pub struct ExpertPart {
    pub role: ExpertRole,
    /// The whole 3-D tensor (all experts).
    pub tensor: TensorInfo,
    pub ty: GgmlType,
    /// Bytes of one expert's slice.
    pub bytes_per_expert: u64,
}

impl ExpertPart {
    /// Absolute offset of expert `expert`'s slice in the tensor's shard file.
    pub fn slice_offset(&self, expert: u32) -> u64 {
        self.tensor.offset + u64::from(expert) * self.bytes_per_expert
    }
}

/// The routed experts of one layer: parts in the order gate, up (or gate_up), down.
#[derive(Debug, Clone)]
pub struct LayerExperts {
    pub layer: u32,
    pub n_experts: u32,
    pub parts: Vec<ExpertPart>,
}

impl LayerExperts {
    /// Bytes of one expert: the sum of its parts' slices.
    pub fn bytes_per_expert(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes_per_expert).sum()
    }

    /// Offsets of each part inside a VRAM slot when every part starts at a multiple of
    /// `alignment` (a power of two; GPU binding offsets must be aligned), and the bytes the slot
    /// needs for this layer's expert.
    pub fn slot_layout(&self, alignment: u64) -> (Vec<u64>, u64) {
        let alignment = alignment.max(1);
        let mut offsets = Vec::with_capacity(self.parts.len());
        let mut next = 0u64;
        for part in &self.parts {
            offsets.push(next);
            next = (next + part.bytes_per_expert).next_multiple_of(alignment);
        }
        (offsets, next)
    }
}

/// Why a GGUF's expert tensors cannot be laid out.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LayoutError {
    #[error("expert tensor {name}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("layer {layer}: routed experts {problem}")]
    BadLayer { layer: u32, problem: String },
}

/// `blk.<layer>.<suffix>.weight` → (layer, role) for routed-expert tensors.
fn parse_expert_name(name: &str) -> Option<(u32, ExpertRole)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let suffix = rest.strip_suffix(".weight")?;
    let role = ExpertRole::from_suffix(suffix)?;
    Some((layer.parse().ok()?, role))
}

/// True for the tensors the planner treats as routed experts.
pub fn is_expert_tensor(name: &str) -> bool {
    parse_expert_name(name).is_some()
}

fn expert_part(role: ExpertRole, tensor: &TensorInfo) -> Result<(u32, ExpertPart), LayoutError> {
    let bad = |problem: String| LayoutError::BadTensor {
        name: tensor.name.clone(),
        problem,
    };
    let [_, _, n_experts] = tensor.dims.as_slice() else {
        return Err(bad(format!(
            "has dims {:?}; routed experts are 3-D [in, out, n_expert]",
            tensor.dims
        )));
    };
    let n_experts = u32::try_from(*n_experts)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| bad(format!("expert count {n_experts} is not usable")))?;
    if !tensor.n_bytes.is_multiple_of(u64::from(n_experts)) {
        return Err(bad(format!(
            "{} bytes do not split into {n_experts} equal experts",
            tensor.n_bytes
        )));
    }
    let part = ExpertPart {
        role,
        tensor: tensor.clone(),
        ty: tensor.ty,
        bytes_per_expert: tensor.n_bytes / u64::from(n_experts),
    };
    Ok((n_experts, part))
}

/// Every layer's routed experts, in layer order. A layer has either gate + up + down or
/// gate_up + down; anything else (a missing or extra part, different expert counts) is an error.
pub fn expert_layers(gguf: &Gguf) -> Result<Vec<LayerExperts>, LayoutError> {
    expert_layers_of(gguf.tensors())
}

/// [`expert_layers`] over a list of tensor infos (planning without a file).
pub fn expert_layers_of(tensors: &[TensorInfo]) -> Result<Vec<LayerExperts>, LayoutError> {
    let mut by_layer: BTreeMap<u32, Vec<(u32, ExpertPart)>> = BTreeMap::new();
    for tensor in tensors {
        if let Some((layer, role)) = parse_expert_name(&tensor.name) {
            by_layer
                .entry(layer)
                .or_default()
                .push(expert_part(role, tensor)?);
        }
    }
    let mut layers = Vec::with_capacity(by_layer.len());
    for (layer, mut parts) in by_layer {
        parts.sort_by_key(|(_, p)| p.role);
        let roles: Vec<ExpertRole> = parts.iter().map(|(_, p)| p.role).collect();
        use ExpertRole::*;
        if roles != [Gate, Up, Down] && roles != [GateUp, Down] {
            return Err(LayoutError::BadLayer {
                layer,
                problem: format!(
                    "have parts {roles:?}; expected gate + up + down or gate_up + down"
                ),
            });
        }
        let n_experts = parts.first().map_or(0, |(n, _)| *n);
        if parts.iter().any(|(n, _)| *n != n_experts) {
            let counts: Vec<u32> = parts.iter().map(|(n, _)| *n).collect();
            return Err(LayoutError::BadLayer {
                layer,
                problem: format!("parts disagree on the expert count: {counts:?}"),
            });
        }
        layers.push(LayerExperts {
            layer,
            n_experts,
            parts: parts.into_iter().map(|(_, p)| p).collect(),
        });
    }
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names_are_recognised() {
        assert_eq!(
            parse_expert_name("blk.12.ffn_gate_exps.weight"),
            Some((12, ExpertRole::Gate))
        );
        assert_eq!(
            parse_expert_name("blk.0.ffn_gate_up_exps.weight"),
            Some((0, ExpertRole::GateUp))
        );
        assert_eq!(parse_expert_name("blk.0.ffn_gate_shexp.weight"), None);
        assert_eq!(parse_expert_name("blk.x.ffn_down_exps.weight"), None);
        assert_eq!(parse_expert_name("per_layer_token_embd.weight"), None);
    }
}
