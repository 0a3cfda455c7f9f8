//! Writing GGUF v3 files: for tests, the built-in demo model, synthetic models and fuzz seeds.
//!
//! The header only needs each tensor's declared size, so tensors can be *declared* without data
//! and streamed to a file later through a callback ([`GgufWriter::write_streaming`]); a 60 GB
//! synthetic model never has to be held in memory.

use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GgmlType, KEY_ALIGNMENT, Value};
use std::io::{Read as _, Write};
use std::path::Path;

/// GGUF version this writer produces.
pub const WRITTEN_VERSION: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    #[error("tensor {name:?}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
}

/// What a streaming fill callback is asked to write.
#[derive(Debug, Clone, Copy)]
pub struct DeclaredTensor<'a> {
    /// Position among all tensors of the writer.
    pub index: usize,
    pub name: &'a str,
    pub dims: &'a [u64],
    pub ty: GgmlType,
    /// Exactly this many bytes must be written.
    pub n_bytes: u64,
}

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    n_bytes: u64,
    /// `None` for declared tensors whose bytes come from a fill callback (or zeros).
    data: Option<Vec<u8>>,
}

/// Builds a GGUF v3 file. Metadata and tensors are written in the order they were added.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

fn encode_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The payload of `value` (without its type id).
fn encode_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => encode_string(out, s),
        Value::Array(items) => {
            // An empty array has no element to take the type from; u8 is as good as any.
            let element_type = items.first().map_or(0, Value::type_id);
            out.extend_from_slice(&element_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                encode_value(out, item);
            }
        }
    }
}

/// True when every array inside `value` holds elements of a single type, as GGUF requires.
fn is_homogeneous(value: &Value) -> bool {
    match value {
        Value::Array(items) => {
            let first_type = items.first().map(Value::type_id);
            items
                .iter()
                .all(|item| Some(item.type_id()) == first_type && is_homogeneous(item))
        }
        _ => true,
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Set a metadata key; setting an existing key replaces its value in place.
    ///
    /// # Panics
    /// If `value` contains an array whose elements are not all of one type. GGUF cannot store
    /// such an array; values parsed from a file never are, so this is always a bug in the caller.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        assert!(
            is_homogeneous(&value),
            "GGUF arrays must be homogeneous (metadata key {key:?})"
        );
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Add a tensor with its data; the data length must match `dims` and `ty` exactly.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: impl Into<Vec<u8>>,
    ) -> Result<(), WriterError> {
        let name = name.into();
        let data = data.into();
        let n_bytes = self.check_new_tensor(&name, dims, ty)?;
        if data.len() as u64 != n_bytes {
            return Err(WriterError::BadTensor {
                name,
                problem: format!(
                    "{} bytes of data given, {dims:?} of {ty} needs {n_bytes}",
                    data.len()
                ),
            });
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            n_bytes,
            data: Some(data),
        });
        Ok(())
    }

    /// Add a tensor whose bytes are supplied later by the fill callback of
    /// [`write_streaming`](Self::write_streaming) (or written as zeros by the other writers).
    /// Returns its size in bytes.
    pub fn declare_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
    ) -> Result<u64, WriterError> {
        let name = name.into();
        let n_bytes = self.check_new_tensor(&name, dims, ty)?;
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            n_bytes,
            data: None,
        });
        Ok(n_bytes)
    }

    fn check_new_tensor(&self, name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, WriterError> {
        let bad = |problem: String| WriterError::BadTensor {
            name: name.to_string(),
            problem,
        };
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(bad("added twice".to_string()));
        }
        if dims.len() > super::MAX_DIMS || dims.contains(&0) {
            return Err(bad(format!("invalid dims {dims:?}")));
        }
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("element count of {dims:?} overflows")))?;
        let row_len = dims.first().copied().unwrap_or(1);
        let row_bytes = ty.row_bytes(row_len).ok_or_else(|| {
            bad(format!(
                "rows of {row_len} elements are not whole {ty} blocks of {}",
                ty.block_size()
            ))
        })?;
        row_bytes
            .checked_mul(n_elements / row_len)
            .ok_or_else(|| bad(format!("byte size of {dims:?} overflows")))
    }

    /// Alignment the file will use: `general.alignment` if set to a power of two, else 32.
    pub fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == KEY_ALIGNMENT)
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two() && *a <= super::MAX_ALIGNMENT)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Offsets of each tensor relative to the data section.
    fn data_offsets(&self) -> Vec<u64> {
        let alignment = self.alignment();
        let mut next = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                let offset = next;
                next = (offset + t.n_bytes).next_multiple_of(alignment);
                offset
            })
            .collect()
    }

    /// Everything before the tensor data, including the padding up to the data section (none
    /// when there are no tensors: there is no data section to align).
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&WRITTEN_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            encode_string(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            encode_value(&mut out, value);
        }
        for (tensor, offset) in self.tensors.iter().zip(self.data_offsets()) {
            encode_string(&mut out, &tensor.name);
            out.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
            for dim in &tensor.dims {
                out.extend_from_slice(&dim.to_le_bytes());
            }
            out.extend_from_slice(&tensor.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        if !self.tensors.is_empty() {
            let padded = (out.len() as u64).next_multiple_of(self.alignment());
            out.resize(padded as usize, 0);
        }
        out
    }

    /// The whole file in memory. Declared tensors without data are written as zeros.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.header_bytes();
        let data_start = out.len();
        for (tensor, offset) in self.tensors.iter().zip(self.data_offsets()) {
            out.resize(data_start + offset as usize, 0);
            match &tensor.data {
                Some(data) => out.extend_from_slice(data),
                None => out.resize(out.len() + tensor.n_bytes as usize, 0),
            }
        }
        out
    }

    /// Write the file to `path`. Declared tensors without data are written as zeros.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<(), WriterError> {
        self.write_streaming(path, |tensor, out| {
            std::io::copy(&mut std::io::repeat(0).take(tensor.n_bytes), out).map(|_| ())
        })
    }

    /// Write the file to `path`, calling `fill` for each declared tensor (in file order) to write
    /// exactly `n_bytes` bytes of its data. Memory use is independent of the tensor sizes.
    pub fn write_streaming(
        &self,
        path: impl AsRef<Path>,
        mut fill: impl FnMut(&DeclaredTensor<'_>, &mut dyn Write) -> std::io::Result<()>,
    ) -> Result<(), WriterError> {
        let path = path.as_ref();
        let io_error = |error| WriterError::Io {
            path: path.display().to_string(),
            error,
        };
        let file = std::fs::File::create(path).map_err(io_error)?;
        let mut out = std::io::BufWriter::new(file);
        let header = self.header_bytes();
        out.write_all(&header).map_err(io_error)?;
        let mut written = 0u64; // bytes of the data section written so far
        for (index, (tensor, offset)) in self.tensors.iter().zip(self.data_offsets()).enumerate() {
            let padding = offset - written;
            std::io::copy(&mut std::io::repeat(0).take(padding), &mut out).map_err(io_error)?;
            match &tensor.data {
                Some(data) => out.write_all(data).map_err(io_error)?,
                None => {
                    let declared = DeclaredTensor {
                        index,
                        name: &tensor.name,
                        dims: &tensor.dims,
                        ty: tensor.ty,
                        n_bytes: tensor.n_bytes,
                    };
                    let mut counter = CountingWriter {
                        inner: &mut out,
                        count: 0,
                    };
                    fill(&declared, &mut counter).map_err(io_error)?;
                    if counter.count != tensor.n_bytes {
                        return Err(WriterError::BadTensor {
                            name: tensor.name.clone(),
                            problem: format!(
                                "fill callback wrote {} bytes, expected {}",
                                counter.count, tensor.n_bytes
                            ),
                        });
                    }
                }
            }
            written = offset + tensor.n_bytes;
        }
        out.flush().map_err(io_error)?;
        Ok(())
    }
}

/// Counts bytes passed through, so a fill callback that writes the wrong amount is caught.
struct CountingWriter<'a, W: Write> {
    inner: &'a mut W,
    count: u64,
}

impl<W: Write> Write for CountingWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
