//! The host tier of routed experts: the bytes of every (layer, expert) on demand, for upload into a
//! VRAM slot or for the CPU path.
//!
//! [`ExpertSource::Mmap`] (the default) hands out slices of the memory-mapped GGUF: the page cache
//! is the RAM tier, there is no second copy, and a machine with little RAM still runs (pages are
//! read from the file as experts are used). [`ExpertSource::Ram`] copies every expert tensor into
//! an anonymous mapping at load — tensor by tensor in bounded chunks, refused up front when it
//! would exceed `--ram-budget` — and can lock it in memory (`mlock`, through memmap2) so experts
//! are never paged out.

use std::collections::HashMap;
use std::sync::Arc;

use memmap2::{Mmap, MmapMut};

use crate::gguf::{GgmlType, Gguf};
use crate::quant::{self, QuantError};

use super::expert_cache::ExpertKey;
use super::layout::{ExpertRole, LayerExperts, LayoutError, expert_layers};
use super::size::ByteSize;

/// Bytes copied per step when building the RAM copy, so progress is steady and no step touches
/// more than this much of the source map at once.
const COPY_CHUNK_BYTES: usize = 64 << 20;

/// Where expert bytes come from (`--experts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertSource {
    /// Slices of the memory-mapped GGUF.
    Mmap,
    /// A RAM copy made at load; `locked` asks for it to be pinned in memory.
    Ram { locked: bool },
}

#[derive(Debug, thiserror::Error)]
pub enum HostExpertsError {
    #[error("{0}")]
    Layout(#[from] LayoutError),
    #[error(
        "copying the experts into RAM needs {needed} but --ram-budget is {budget}; raise the \
         budget or serve experts from the file (--experts mmap)",
        needed = ByteSize(*needed), budget = ByteSize(*budget)
    )]
    OverRamBudget { needed: u64, budget: u64 },
    #[error("could not allocate {} of RAM for the expert copy: {error}", ByteSize(*bytes))]
    Alloc { bytes: u64, error: std::io::Error },
    #[error("tensor {name}: its data is not in the file (expected {n_bytes} bytes)")]
    MissingData { name: String, n_bytes: u64 },
    #[error("{key} does not exist in this model")]
    UnknownExpert { key: ExpertKey },
    #[error("{key}, tensor {tensor}: non-finite {field} in block {block} ({ty})")]
    NonFinite {
        key: ExpertKey,
        tensor: String,
        block: usize,
        field: &'static str,
        ty: GgmlType,
    },
    #[error("{key}, tensor {tensor}: {error}")]
    Quant {
        key: ExpertKey,
        tensor: String,
        error: QuantError,
    },
}

/// One projection of one expert.
#[derive(Debug, Clone, Copy)]
pub struct ExpertSlice<'a> {
    pub role: ExpertRole,
    pub ty: GgmlType,
    pub bytes: &'a [u8],
}

/// All projections of one expert, in slot order (gate, up, down — or gate_up, down).
#[derive(Debug, Clone)]
pub struct ExpertBytes<'a> {
    pub key: ExpertKey,
    pub parts: Vec<ExpertSlice<'a>>,
}

impl ExpertBytes<'_> {
    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.bytes.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn part(&self, role: ExpertRole) -> Option<&[u8]> {
        self.parts.iter().find(|p| p.role == role).map(|p| p.bytes)
    }
}

struct RamCopy {
    map: Mmap,
    /// Bytes copied (the map itself is at least one byte long).
    bytes: u64,
    /// Start of each layer's part tensors in `map`: `[layer index][part index]`.
    tensor_starts: Vec<Vec<usize>>,
    locked: bool,
}

/// Every routed expert of a model, from the file or a RAM copy.
pub struct HostExperts {
    gguf: Arc<Gguf>,
    layers: Vec<LayerExperts>,
    /// Layer number → index in `layers`.
    layer_index: HashMap<u32, usize>,
    ram: Option<RamCopy>,
}

impl std::fmt::Debug for HostExperts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostExperts")
            .field("layers", &self.layers.len())
            .field("ram_bytes", &self.ram_bytes())
            .field("locked", &self.is_locked())
            .finish()
    }
}

impl HostExperts {
    /// Find the expert tensors of `gguf` and, for [`ExpertSource::Ram`], copy them into RAM
    /// (refused when they exceed `ram_budget`).
    pub fn new(
        gguf: Arc<Gguf>,
        source: ExpertSource,
        ram_budget: Option<u64>,
    ) -> Result<HostExperts, HostExpertsError> {
        let layers = expert_layers(&gguf)?;
        for layer in &layers {
            for part in &layer.parts {
                if gguf.tensor_data(&part.tensor).len() as u64 != part.tensor.n_bytes {
                    return Err(HostExpertsError::MissingData {
                        name: part.tensor.name.clone(),
                        n_bytes: part.tensor.n_bytes,
                    });
                }
            }
        }
        let ram = match source {
            ExpertSource::Mmap => None,
            ExpertSource::Ram { locked } => Some(copy_to_ram(&gguf, &layers, ram_budget, locked)?),
        };
        let layer_index = layers
            .iter()
            .enumerate()
            .map(|(i, l)| (l.layer, i))
            .collect();
        Ok(HostExperts {
            gguf,
            layers,
            layer_index,
            ram,
        })
    }

    /// The layers with routed experts, in order.
    pub fn layers(&self) -> &[LayerExperts] {
        &self.layers
    }

    /// Bytes of one expert per layer number (0 for layers without experts): the argument of
    /// [`ExpertSlotCache::new`](super::ExpertSlotCache::new).
    pub fn expert_bytes_per_layer(&self) -> Vec<u64> {
        let n = self
            .layers
            .iter()
            .map(|l| l.layer as usize + 1)
            .max()
            .unwrap_or(0);
        let mut sizes = vec![0; n];
        for layer in &self.layers {
            if let Some(size) = sizes.get_mut(layer.layer as usize) {
                *size = layer.bytes_per_expert();
            }
        }
        sizes
    }

    /// Bytes held in RAM by the copy (0 when serving from the mmap).
    pub fn ram_bytes(&self) -> u64 {
        self.ram.as_ref().map_or(0, |r| r.bytes)
    }

    /// True when the RAM copy exists and is locked in memory.
    pub fn is_locked(&self) -> bool {
        self.ram.as_ref().is_some_and(|r| r.locked)
    }

    /// The bytes of one expert's projections.
    pub fn expert(&self, key: ExpertKey) -> Result<ExpertBytes<'_>, HostExpertsError> {
        let unknown = || HostExpertsError::UnknownExpert { key };
        let &index = self.layer_index.get(&key.layer).ok_or_else(unknown)?;
        let layer = self.layers.get(index).ok_or_else(unknown)?;
        if key.expert >= layer.n_experts {
            return Err(unknown());
        }
        let mut parts = Vec::with_capacity(layer.parts.len());
        for (part_index, part) in layer.parts.iter().enumerate() {
            let per = part.bytes_per_expert as usize;
            let within = key.expert as usize * per;
            let bytes = match &self.ram {
                Some(ram) => {
                    let start = ram
                        .tensor_starts
                        .get(index)
                        .and_then(|starts| starts.get(part_index))
                        .ok_or_else(unknown)?
                        + within;
                    ram.map.get(start..start + per)
                }
                None => self
                    .gguf
                    .tensor_data(&part.tensor)
                    .get(within..within + per),
            }
            .ok_or_else(unknown)?;
            parts.push(ExpertSlice {
                role: part.role,
                ty: part.ty,
                bytes,
            });
        }
        Ok(ExpertBytes { key, parts })
    }

    /// Check one expert's scales where it enters the GPU (rule 2): an error names the expert,
    /// the tensor and the first bad block.
    pub fn check_expert(&self, key: ExpertKey) -> Result<(), HostExpertsError> {
        let expert = self.expert(key)?;
        let layer = self
            .layer_index
            .get(&key.layer)
            .and_then(|&index| self.layers.get(index))
            .ok_or(HostExpertsError::UnknownExpert { key })?;
        for (slice, part) in expert.parts.iter().zip(&layer.parts) {
            quant::check_finite(slice.ty, slice.bytes).map_err(|error| match error {
                QuantError::NonFinite { block, field, ty } => HostExpertsError::NonFinite {
                    key,
                    tensor: part.tensor.name.clone(),
                    block,
                    field,
                    ty,
                },
                error => HostExpertsError::Quant {
                    key,
                    tensor: part.tensor.name.clone(),
                    error,
                },
            })?;
        }
        Ok(())
    }
}

fn copy_to_ram(
    gguf: &Gguf,
    layers: &[LayerExperts],
    ram_budget: Option<u64>,
    lock: bool,
) -> Result<RamCopy, HostExpertsError> {
    let needed: u64 = layers
        .iter()
        .flat_map(|l| &l.parts)
        .map(|p| p.tensor.n_bytes)
        .sum();
    if let Some(budget) = ram_budget
        && needed > budget
    {
        return Err(HostExpertsError::OverRamBudget { needed, budget });
    }
    let alloc_error = |error| HostExpertsError::Alloc {
        bytes: needed,
        error,
    };
    let len =
        usize::try_from(needed).map_err(|_| alloc_error(std::io::ErrorKind::OutOfMemory.into()))?;
    // An anonymous map rather than a Vec: it can be made read-only and locked as a whole, and its
    // pages are only committed as the copy writes them. (A zero-length map is refused by the OS.)
    let mut map = MmapMut::map_anon(len.max(1)).map_err(alloc_error)?;
    let mut tensor_starts = Vec::with_capacity(layers.len());
    let mut next = 0usize;
    for layer in layers {
        let mut starts = Vec::with_capacity(layer.parts.len());
        for part in &layer.parts {
            let source = gguf.tensor_data(&part.tensor);
            starts.push(next);
            for chunk in source.chunks(COPY_CHUNK_BYTES) {
                let target = map.get_mut(next..next + chunk.len()).ok_or_else(|| {
                    HostExpertsError::MissingData {
                        name: part.tensor.name.clone(),
                        n_bytes: part.tensor.n_bytes,
                    }
                })?;
                target.copy_from_slice(chunk);
                next += chunk.len();
            }
        }
        tensor_starts.push(starts);
    }
    let map = map.make_read_only().map_err(alloc_error)?;
    let locked = lock
        && match crate::platform::memory::lock(&map) {
            Ok(()) => true,
            Err(error) => {
                // Usually RLIMIT_MEMLOCK; the copy still works, it can just be paged out.
                tracing::warn!(
                    "could not lock the {} expert copy in RAM ({error}); continuing unlocked",
                    ByteSize(needed)
                );
                false
            }
        };
    Ok(RamCopy {
        map,
        bytes: needed,
        tensor_starts,
        locked,
    })
}
