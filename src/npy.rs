//! Minimal `.npy` (format 1.0) reader and writer for little-endian f32 / i32 arrays, used by
//! `strata logits` and by the oracle tests.

use std::io::Write;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a supported .npy file: {why}")]
    Format { path: String, why: String },
}

/// An array read from a `.npy` file; values converted to f32 (`<f4`, `<i4`, `<i8` and `<f8` accepted).
#[derive(Debug, Clone)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl NpyArray {
    /// Row `i` of a 2-D array.
    pub fn row(&self, i: usize) -> &[f32] {
        let w = self.shape.last().copied().unwrap_or(1);
        &self.data[i * w..(i + 1) * w]
    }
}

pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), NpyError> {
    let io = |source| NpyError::Io {
        path: path.display().to_string(),
        source,
    };
    let shape_txt = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Pad so that magic(6) + version(2) + len(2) + header + '\n' is a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(&out).map_err(io)
}

pub fn read(path: &Path) -> Result<NpyArray, NpyError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io {
        path: p.clone(),
        source,
    })?;
    parse(&bytes).map_err(|why| NpyError::Format { path: p, why })
}

pub fn parse(bytes: &[u8]) -> Result<NpyArray, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("missing NUMPY magic".into());
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated header".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("unsupported version {v}")),
    };
    let header = bytes.get(hstart..hstart + hlen).ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "header not utf-8")?;
    let descr = header
        .split("'descr':")
        .nth(1)
        .and_then(|s| s.split('\'').nth(1))
        .ok_or("no descr")?;
    if header.contains("'fortran_order': True") {
        return Err("fortran order not supported".into());
    }
    let shape_txt = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split('(').nth(1))
        .and_then(|s| s.split(')').next())
        .ok_or("no shape")?;
    let shape: Vec<usize> = shape_txt
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad dim {s}")))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let body = &bytes[hstart + hlen..];
    let (width, conv): (usize, fn(&[u8]) -> f32) = match descr {
        "<f4" => (4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        "<i4" => (4, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32),
        "<f8" => (8, |b| {
            f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f32
        }),
        "<i8" => (8, |b| {
            i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f32
        }),
        d => return Err(format!("unsupported dtype {d}")),
    };
    if body.len() < n * width {
        return Err(format!(
            "body has {} bytes, shape needs {}",
            body.len(),
            n * width
        ));
    }
    let data = body[..n * width].chunks_exact(width).map(conv).collect();
    Ok(NpyArray { shape, data })
}
