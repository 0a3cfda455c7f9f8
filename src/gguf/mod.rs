//! GGUF files: header, metadata, tensor infos and zero-copy tensor data (format only — no model
//! knowledge lives here).
//!
//! Reads GGUF versions 2 and 3, single files and `…-0000K-of-0000N.gguf` multi-shard models. Files
//! are memory-mapped and only their headers are touched while parsing, so opening a 55 GB shard
//! costs a few page faults. Every size, count and offset in a header is checked against the bytes
//! that are really there before it is used, so a malformed file gives a [`GgufError`] naming the
//! file and the problem — never a panic and never an allocation sized by an unchecked field.
//!
//! This module depends only on `std`, `memmap2` and `thiserror` so the fuzz target can compile it
//! on its own (see `fuzz/`).

pub mod types;
pub mod writer;

pub use types::GgmlType;
pub use writer::GgufWriter;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The largest alignment accepted: ggml stores `general.alignment` as a u32, and a larger value
/// would only serve to make writers pad a rewritten header to an absurd size.
pub const MAX_ALIGNMENT: u64 = 1 << 31;
/// ggml tensors have at most four dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Nested metadata arrays deeper than this are rejected: parsing recurses once per level, and a
/// crafted file must not be able to overflow the stack.
pub const MAX_ARRAY_NESTING: usize = 64;
/// Limits far above any real model (a 248k-token vocabulary, ~10 KB chat templates, ~100k
/// tensors) that keep a corrupt length field in a 55 GB shard from turning into a many-gigabyte
/// allocation: every bounded count is also checked against the bytes left in the file.
pub const MAX_STRING_LEN: u64 = 1 << 28;
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
pub const MAX_METADATA_ENTRIES: u64 = 1 << 20;
pub const MAX_TENSORS: u64 = 1 << 20;
/// Vectors sized from a header count start at most this big and grow as elements really parse.
const MAX_INITIAL_CAPACITY: u64 = 1 << 16;

/// Metadata key holding the tensor data alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";
/// Multi-shard keys written by llama.cpp's `gguf-split`.
pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// GGUF metadata value type ids (`gguf_type` in ggml).
mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Smallest possible encoding of one tensor info: name length (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;
/// Smallest possible encoding of one key/value pair: key length (8), value type (4), a 1-byte value.
const MIN_KV_BYTES: u64 = 13;

// ---------------------------------------------------------------------------------------------
// Metadata values

/// One metadata value. Arrays are homogeneous in the file; nested arrays are allowed.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// Any integer variant whose value fits in a u64 (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer variant whose value fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// F32, or F64 rounded to the nearest f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// F32 or F64, widened to f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The GGUF name of the value's type: "u8", "i32", "f32", "bool", "string", "array", …
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// The GGUF value type id this value is written with.
    pub fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => value_type::U8,
            Value::I8(_) => value_type::I8,
            Value::U16(_) => value_type::U16,
            Value::I16(_) => value_type::I16,
            Value::U32(_) => value_type::U32,
            Value::I32(_) => value_type::I32,
            Value::U64(_) => value_type::U64,
            Value::I64(_) => value_type::I64,
            Value::F32(_) => value_type::F32,
            Value::F64(_) => value_type::F64,
            Value::Bool(_) => value_type::BOOL,
            Value::String(_) => value_type::STRING,
            Value::Array(_) => value_type::ARRAY,
        }
    }
}

/// Bytes that one value of GGUF type `type_id` takes at least (exactly, for scalars); `None` for
/// an unknown type id. Used to bound array counts by the bytes left in the file.
fn min_encoded_size(type_id: u32) -> Option<u64> {
    Some(match type_id {
        value_type::U8 | value_type::I8 | value_type::BOOL => 1,
        value_type::U16 | value_type::I16 => 2,
        value_type::U32 | value_type::I32 | value_type::F32 => 4,
        value_type::U64 | value_type::I64 | value_type::F64 => 8,
        value_type::STRING => 8,    // length prefix of an empty string
        value_type::ARRAY => 4 + 8, // element type + count of an empty array
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// Tensor infos

/// Where one tensor lives and what it holds.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// ggml `ne` order: `dims[0]` is the contiguous dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Index of the shard file holding the data (0 for single-file models).
    pub shard: usize,
    /// Absolute byte offset of the data inside its shard file.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Product of all dims (1 for a zero-dimensional tensor).
    pub fn n_elements(&self) -> u64 {
        // Parsed tensors are checked not to overflow; saturating keeps hand-built ones panic-free.
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Elements per row: `dims[0]`.
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of `dims[1..]`.
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Bytes per row (0 only for a hand-built info whose row is not whole blocks).
    pub fn row_bytes(&self) -> u64 {
        self.ty.row_bytes(self.row_len()).unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

/// Everything that can be wrong with a GGUF file. Display is always "<file>: <what is wrong>".
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{file}: {error}")]
    Io { file: String, error: std::io::Error },
    #[error("{file}: not a GGUF file (starts with {found:02x?}, expected \"GGUF\")")]
    NotGguf { file: String, found: Vec<u8> },
    #[error("{file}: unsupported GGUF version {version} (strata reads versions 2 and 3)")]
    UnsupportedVersion { file: String, version: u32 },
    #[error(
        "{file}: truncated: {what} at byte {offset} needs {needed} bytes, but the file is {len} bytes long"
    )]
    Truncated {
        file: String,
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("{file}: {problem}")]
    Malformed { file: String, problem: String },
    #[error(
        "{file}: shard {missing} of this split model is missing (looked for it next to the first shard)"
    )]
    MissingShard { file: String, missing: String },
}

impl GgufError {
    /// The file the error is about.
    pub fn file(&self) -> &str {
        match self {
            GgufError::Io { file, .. }
            | GgufError::NotGguf { file, .. }
            | GgufError::UnsupportedVersion { file, .. }
            | GgufError::Truncated { file, .. }
            | GgufError::Malformed { file, .. }
            | GgufError::MissingShard { file, .. } => file,
        }
    }
}

fn malformed(file: &str, problem: impl Into<String>) -> GgufError {
    GgufError::Malformed {
        file: file.to_string(),
        problem: problem.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing one file

/// A bounds-checked little-endian reader over a file's bytes.
struct Reader<'a> {
    file: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                file: self.file.to_string(),
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                len: self.bytes.len() as u64,
            });
        }
        // n <= remaining, which fits in usize.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let slice = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        if len > MAX_STRING_LEN {
            return Err(malformed(
                self.file,
                format!(
                    "{what} at byte {}: string length {len} exceeds the limit of {MAX_STRING_LEN}",
                    self.pos - 8
                ),
            ));
        }
        // `take` checks the length against the bytes left before anything is allocated.
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            malformed(
                self.file,
                format!(
                    "{what} at byte {} is not valid UTF-8 ({e})",
                    self.pos - bytes.len()
                ),
            )
        })
    }

    /// A value of GGUF type `type_id`; `depth` counts enclosing arrays.
    fn value(&mut self, type_id: u32, depth: usize, what: &str) -> Result<Value, GgufError> {
        Ok(match type_id {
            value_type::U8 => Value::U8(self.u8(what)?),
            value_type::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            value_type::U16 => Value::U16(self.u16(what)?),
            value_type::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            value_type::U32 => Value::U32(self.u32(what)?),
            value_type::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            value_type::U64 => Value::U64(self.u64(what)?),
            value_type::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            value_type::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            value_type::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            value_type::BOOL => match self.u8(what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                other => {
                    return Err(malformed(
                        self.file,
                        format!("{what}: bool byte is {other}, expected 0 or 1"),
                    ));
                }
            },
            value_type::STRING => Value::String(self.string(what)?),
            value_type::ARRAY => self.array_value(depth, what)?,
            other => {
                return Err(malformed(
                    self.file,
                    format!("{what}: unknown metadata value type {other}"),
                ));
            }
        })
    }

    fn array_value(&mut self, depth: usize, what: &str) -> Result<Value, GgufError> {
        let element_type = self.u32(what)?;
        let count = self.u64(what)?;
        let Some(min_size) = min_encoded_size(element_type) else {
            return Err(malformed(
                self.file,
                format!("{what}: array of unknown value type {element_type}"),
            ));
        };
        if element_type == value_type::ARRAY && depth + 1 >= MAX_ARRAY_NESTING {
            return Err(malformed(
                self.file,
                format!("{what}: arrays nested more than {MAX_ARRAY_NESTING} deep"),
            ));
        }
        if count > MAX_ARRAY_LEN {
            return Err(malformed(
                self.file,
                format!("{what}: array of {count} elements exceeds the limit of {MAX_ARRAY_LEN}"),
            ));
        }
        // Bound the count by what the remaining bytes could possibly hold before reserving memory.
        if count > self.remaining() / min_size {
            return Err(malformed(
                self.file,
                format!(
                    "{what}: array claims {count} elements but only {} bytes are left (truncated or corrupt file)",
                    self.remaining()
                ),
            ));
        }
        let mut items = Vec::with_capacity(count.min(MAX_INITIAL_CAPACITY) as usize);
        for _ in 0..count {
            items.push(self.value(element_type, depth + 1, what)?);
        }
        Ok(Value::Array(items))
    }
}

/// One parsed file of a (possibly multi-shard) model.
struct ParsedFile {
    version: u32,
    metadata: Vec<(String, Value)>,
    /// Tensors with absolute offsets; `shard` is 0 until the caller assigns it.
    tensors: Vec<TensorInfo>,
}

fn lookup<'a>(metadata: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
    metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn parse_file(file: &str, bytes: &[u8]) -> Result<ParsedFile, GgufError> {
    let mut reader = Reader {
        file,
        bytes,
        pos: 0,
    };
    let magic = reader.take(4, "magic").map_err(|_| GgufError::NotGguf {
        file: file.to_string(),
        found: bytes.to_vec(),
    })?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::NotGguf {
            file: file.to_string(),
            found: magic.to_vec(),
        });
    }
    let version = reader.u32("version")?;
    match version {
        2 | 3 => {}
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(malformed(
                file,
                format!(
                    "big-endian GGUF (version {}) is not supported; convert it to little-endian",
                    v.swap_bytes()
                ),
            ));
        }
        v => {
            return Err(GgufError::UnsupportedVersion {
                file: file.to_string(),
                version: v,
            });
        }
    }

    let tensor_count = reader.u64("tensor count")?;
    let kv_count = reader.u64("metadata count")?;
    if kv_count > MAX_METADATA_ENTRIES || tensor_count > MAX_TENSORS {
        return Err(malformed(
            file,
            format!(
                "header claims {kv_count} metadata entries and {tensor_count} tensors; the limits are {MAX_METADATA_ENTRIES} and {MAX_TENSORS}"
            ),
        ));
    }
    if kv_count > reader.remaining() / MIN_KV_BYTES {
        return Err(malformed(
            file,
            format!(
                "header claims {kv_count} metadata entries but only {} bytes follow (truncated or corrupt file)",
                reader.remaining()
            ),
        ));
    }
    if tensor_count > reader.remaining() / MIN_TENSOR_INFO_BYTES {
        return Err(malformed(
            file,
            format!(
                "header claims {tensor_count} tensors but only {} bytes follow (truncated or corrupt file)",
                reader.remaining()
            ),
        ));
    }

    let mut metadata: Vec<(String, Value)> =
        Vec::with_capacity(kv_count.min(MAX_INITIAL_CAPACITY) as usize);
    let mut seen_keys: HashSet<String> =
        HashSet::with_capacity(kv_count.min(MAX_INITIAL_CAPACITY) as usize);
    for index in 0..kv_count {
        let key = reader.string(&format!("key of metadata entry {index}"))?;
        if !seen_keys.insert(key.clone()) {
            return Err(malformed(file, format!("duplicate metadata key {key:?}")));
        }
        let what = format!("value of metadata key {key:?}");
        let type_id = reader.u32(&what)?;
        let value = reader.value(type_id, 0, &what)?;
        metadata.push((key, value));
    }

    let mut tensors = Vec::with_capacity(tensor_count.min(MAX_INITIAL_CAPACITY) as usize);
    for index in 0..tensor_count {
        tensors.push(parse_tensor_info(&mut reader, index)?);
    }

    let alignment = match lookup(&metadata, KEY_ALIGNMENT) {
        None => DEFAULT_ALIGNMENT,
        Some(value) => match value.as_u64() {
            Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
            _ => {
                return Err(malformed(
                    file,
                    format!(
                        "{KEY_ALIGNMENT} is {value:?}; it must be a power of two from 1 to {MAX_ALIGNMENT}"
                    ),
                ));
            }
        },
    };
    let header_end = reader.pos as u64;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| malformed(file, "data section start overflows"))?;
    let file_len = bytes.len() as u64;
    if !tensors.is_empty() && data_start > file_len {
        return Err(GgufError::Truncated {
            file: file.to_string(),
            what: "tensor data section".to_string(),
            offset: header_end,
            needed: data_start - header_end,
            len: file_len,
        });
    }

    for tensor in &mut tensors {
        let relative = tensor.offset;
        if !relative.is_multiple_of(alignment) {
            return Err(malformed(
                file,
                format!(
                    "tensor {:?}: data offset {relative} is not a multiple of the alignment {alignment}",
                    tensor.name
                ),
            ));
        }
        let end = data_start
            .checked_add(relative)
            .and_then(|start| start.checked_add(tensor.n_bytes));
        match end {
            Some(end) if end <= file_len => tensor.offset = data_start + relative,
            _ => {
                return Err(malformed(
                    file,
                    format!(
                        "tensor {:?}: {} bytes at data offset {relative} run past the end of the file ({file_len} bytes, data section starts at {data_start})",
                        tensor.name, tensor.n_bytes
                    ),
                ));
            }
        }
    }

    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if let [first, second] = pair
            && second.offset < first.offset + first.n_bytes
        {
            return Err(malformed(
                file,
                format!(
                    "tensors {:?} (bytes {}..{}) and {:?} (from byte {}) overlap",
                    first.name,
                    first.offset,
                    first.offset + first.n_bytes,
                    second.name,
                    second.offset
                ),
            ));
        }
    }

    Ok(ParsedFile {
        version,
        metadata,
        tensors,
    })
}

fn parse_tensor_info(reader: &mut Reader<'_>, index: u64) -> Result<TensorInfo, GgufError> {
    let file = reader.file;
    let name = reader.string(&format!("name of tensor {index}"))?;
    let what = format!("tensor {name:?}");
    let n_dims = reader.u32(&what)?;
    if n_dims as usize > MAX_DIMS {
        return Err(malformed(
            file,
            format!("{what}: {n_dims} dimensions (ggml allows at most {MAX_DIMS})"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        let dim = reader.u64(&what)?;
        // ggml stores dims as int64, and an empty dimension holds no data worth mapping.
        if dim == 0 || dim > i64::MAX as u64 {
            return Err(malformed(file, format!("{what}: invalid dimension {dim}")));
        }
        dims.push(dim);
    }
    let type_id = reader.u32(&what)?;
    let ty = GgmlType::from_id(type_id)
        .ok_or_else(|| malformed(file, format!("{what}: unknown ggml type id {type_id}")))?;
    let offset = reader.u64(&what)?;

    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| malformed(file, format!("{what}: element count of {dims:?} overflows")))?;
    let row_len = dims.first().copied().unwrap_or(1);
    let row_bytes = ty.row_bytes(row_len).ok_or_else(|| {
        malformed(
            file,
            format!(
                "{what}: rows of {row_len} elements are not a whole number of {ty} blocks ({} elements)",
                ty.block_size()
            ),
        )
    })?;
    let n_bytes = row_bytes
        .checked_mul(n_elements / row_len)
        .ok_or_else(|| malformed(file, format!("{what}: byte size of {dims:?} overflows")))?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        shard: 0,
        offset,
        n_bytes,
    })
}

// ---------------------------------------------------------------------------------------------
// The model: one or more shard files

enum ShardBytes {
    Mapped(memmap2::Mmap),
    Static(&'static [u8]),
    Owned(Vec<u8>),
}

impl ShardBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            ShardBytes::Mapped(map) => map,
            ShardBytes::Static(bytes) => bytes,
            ShardBytes::Owned(bytes) => bytes,
        }
    }
}

struct Shard {
    /// Empty for in-memory models.
    path: PathBuf,
    bytes: ShardBytes,
}

/// An opened GGUF model: metadata of the first shard, tensors of all shards.
pub struct Gguf {
    /// Shown in messages: the first shard's path, or the name given for an in-memory model.
    name: String,
    version: u32,
    metadata: Vec<(String, Value)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    shards: Vec<Shard>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("shards", &self.shards.len())
            .finish()
    }
}

fn map_file(path: &Path) -> Result<ShardBytes, GgufError> {
    let io_error = |error| GgufError::Io {
        file: path.display().to_string(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io_error)?;
    // SAFETY: the map is read-only and private to this process. Another process truncating or
    // rewriting a model file while it is being served is outside what any mmap-based reader can
    // guard against; we accept that, like every GGUF runtime, to avoid reading 55 GB shards.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_error)?;
    Ok(ShardBytes::Mapped(map))
}

/// For `dir/name-00001-of-00003.gguf`, the paths of all shards in order; `None` when the file
/// name does not follow the split naming scheme.
fn sibling_shard_paths(first: &Path) -> Option<Vec<PathBuf>> {
    let file_name = first.file_name()?.to_str()?;
    let stem = file_name.strip_suffix(".gguf")?;
    let (before_of, count_text) = stem.rsplit_once("-of-")?;
    let (prefix, index_text) = before_of.rsplit_once('-')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(index_text) || !all_digits(count_text) {
        return None;
    }
    let count: usize = count_text.parse().ok()?;
    // A shard count in the file name that no real model has would make us build a huge list.
    if count == 0 || count > 99_999 {
        return None;
    }
    let width = index_text.len();
    let dir = first.parent().unwrap_or_else(|| Path::new(""));
    Some(
        (1..=count)
            .map(|k| dir.join(format!("{prefix}-{k:0width$}-of-{count_text}.gguf")))
            .collect(),
    )
}

impl Gguf {
    /// Open a GGUF file by memory-mapping it. For a split model pass the first shard
    /// (`…-00001-of-0000N.gguf`); the others are found next to it.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf, GgufError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let bytes = map_file(path)?;
        let first = parse_file(&name, bytes.as_slice())?;

        let split_count = split_key(&name, &first.metadata, KEY_SPLIT_COUNT)?.unwrap_or(1);
        let split_no = split_key(&name, &first.metadata, KEY_SPLIT_NO)?.unwrap_or(0);
        if split_count <= 1 {
            return Gguf::assemble(name, vec![(path.to_path_buf(), bytes, first)]);
        }

        let Some(paths) = sibling_shard_paths(path) else {
            return Err(malformed(
                &name,
                format!(
                    "{KEY_SPLIT_COUNT} is {split_count}, but the file name does not follow the \
                     <name>-00001-of-{split_count:05}.gguf pattern needed to find the other shards"
                ),
            ));
        };
        if paths.len() as u64 != split_count {
            return Err(malformed(
                &name,
                format!(
                    "the file name says {} shards but {KEY_SPLIT_COUNT} is {split_count}",
                    paths.len()
                ),
            ));
        }
        if split_no != 0 {
            let first_path = paths.first().map(|p| p.display().to_string());
            return Err(malformed(
                &name,
                format!(
                    "this is shard {} of {split_count}; open the first shard ({}) instead",
                    split_no + 1,
                    first_path.unwrap_or_default()
                ),
            ));
        }

        let mut shards = vec![(path.to_path_buf(), bytes, first)];
        for (index, shard_path) in paths.iter().enumerate().skip(1) {
            let shard_name = shard_path.display().to_string();
            if !shard_path.exists() {
                return Err(GgufError::MissingShard {
                    file: name,
                    missing: shard_name,
                });
            }
            let shard_bytes = map_file(shard_path)?;
            let parsed = parse_file(&shard_name, shard_bytes.as_slice())?;
            let no = split_key(&shard_name, &parsed.metadata, KEY_SPLIT_NO)?;
            let count = split_key(&shard_name, &parsed.metadata, KEY_SPLIT_COUNT)?;
            if no.is_some_and(|no| no != index as u64) || count.is_some_and(|c| c != split_count) {
                return Err(malformed(
                    &shard_name,
                    format!(
                        "split metadata says shard {} of {}, expected shard {} of {split_count}",
                        no.map_or("?".to_string(), |n| (n + 1).to_string()),
                        count.map_or("?".to_string(), |c| c.to_string()),
                        index + 1
                    ),
                ));
            }
            shards.push((shard_path.clone(), shard_bytes, parsed));
        }
        Gguf::assemble(name, shards)
    }

    /// Parse a GGUF embedded in the binary (the built-in demo model).
    pub fn from_static(name: &str, bytes: &'static [u8]) -> Result<Gguf, GgufError> {
        Gguf::in_memory(name, ShardBytes::Static(bytes))
    }

    /// Parse a GGUF held in memory (tests, synthetic models).
    pub fn from_vec(name: &str, bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Gguf::in_memory(name, ShardBytes::Owned(bytes))
    }

    fn in_memory(name: &str, bytes: ShardBytes) -> Result<Gguf, GgufError> {
        let parsed = parse_file(name, bytes.as_slice())?;
        let split_count = split_key(name, &parsed.metadata, KEY_SPLIT_COUNT)?.unwrap_or(1);
        if split_count > 1 {
            return Err(malformed(
                name,
                format!(
                    "is one shard of a {split_count}-shard model; open split models from disk with Gguf::open"
                ),
            ));
        }
        Gguf::assemble(name.to_string(), vec![(PathBuf::new(), bytes, parsed)])
    }

    /// Merge parsed shards: metadata from the first, tensors from all, names unique.
    fn assemble(
        name: String,
        parsed_shards: Vec<(PathBuf, ShardBytes, ParsedFile)>,
    ) -> Result<Gguf, GgufError> {
        let mut shards = Vec::with_capacity(parsed_shards.len());
        let mut tensors = Vec::new();
        let mut tensor_index = HashMap::new();
        let mut first_metadata = None;
        let mut version = 0;
        for (shard_no, (path, bytes, parsed)) in parsed_shards.into_iter().enumerate() {
            let shard_name = if path.as_os_str().is_empty() {
                name.clone()
            } else {
                path.display().to_string()
            };
            for mut tensor in parsed.tensors {
                tensor.shard = shard_no;
                if tensor_index.contains_key(&tensor.name) {
                    return Err(malformed(
                        &shard_name,
                        format!("duplicate tensor name {:?}", tensor.name),
                    ));
                }
                tensor_index.insert(tensor.name.clone(), tensors.len());
                tensors.push(tensor);
            }
            if first_metadata.is_none() {
                version = parsed.version;
                first_metadata = Some(parsed.metadata);
            }
            shards.push(Shard { path, bytes });
        }
        let metadata = first_metadata.unwrap_or_default();
        if let Some(expected) = split_key(&name, &metadata, KEY_SPLIT_TENSORS_COUNT)?
            && expected != tensors.len() as u64
        {
            return Err(malformed(
                &name,
                format!(
                    "{KEY_SPLIT_TENSORS_COUNT} is {expected}, but the {} shard(s) hold {} tensors",
                    shards.len(),
                    tensors.len()
                ),
            ));
        }
        let metadata_index = metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Ok(Gguf {
            name,
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            shards,
        })
    }

    /// The first shard's path, or the name an in-memory model was given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// GGUF version of the first shard (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Metadata of the first shard, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        let index = *self.metadata_index.get(key)?;
        self.metadata.get(index).map(|(_, v)| v)
    }

    /// Set a metadata value in memory (the file is not touched): replaces the key's value, or
    /// adds the key after the others.
    pub fn set_metadata(&mut self, key: &str, value: Value) {
        match self.metadata_index.get(key) {
            Some(&index) => self.metadata[index].1 = value,
            None => {
                self.metadata_index
                    .insert(key.to_string(), self.metadata.len());
                self.metadata.push((key.to_string(), value));
            }
        }
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_array(&self, key: &str) -> Option<&[Value]> {
        self.get(key)?.as_array()
    }

    /// Tensor data alignment of the first shard.
    pub fn alignment(&self) -> u64 {
        self.get_u64(KEY_ALIGNMENT).unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// All tensors of all shards, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(*self.tensor_index.get(name)?)
    }

    /// The tensor's bytes, zero-copy from the map. Infos from this `Gguf` are always in range; an
    /// info that does not belong to it (wrong shard or range) yields an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let Some(shard) = self.shards.get(t.shard) else {
            return &[];
        };
        let bytes = shard.bytes.as_slice();
        let start = usize::try_from(t.offset).ok();
        let end = t
            .offset
            .checked_add(t.n_bytes)
            .and_then(|e| usize::try_from(e).ok());
        match (start, end) {
            (Some(start), Some(end)) => bytes.get(start..end).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Paths of the shard files in order (one empty path for an in-memory model).
    pub fn shard_paths(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|s| s.path.clone()).collect()
    }

    /// Sizes in bytes of the shard files, in order.
    pub fn shard_sizes(&self) -> Vec<u64> {
        self.shards
            .iter()
            .map(|s| s.bytes.as_slice().len() as u64)
            .collect()
    }

    /// Sum of all tensors' data sizes.
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |acc, t| acc.saturating_add(t.n_bytes))
    }
}

/// A `split.*` key as an integer; present but not a non-negative integer is an error.
fn split_key(
    file: &str,
    metadata: &[(String, Value)],
    key: &str,
) -> Result<Option<u64>, GgufError> {
    match lookup(metadata, key) {
        None => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            malformed(
                file,
                format!("{key} is {value:?}; expected a non-negative integer"),
            )
        }),
    }
}
