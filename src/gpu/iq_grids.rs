//! The i-quant codebooks for the GPU. The tables are owned by `quant` (transcribed from ggml);
//! they are private to that module, so the GPU side reads the same source text at compile time and
//! parses the one it needs, instead of keeping a second copy that could drift.

use crate::gguf::types::GgmlType;

use super::GpuError;

const TABLES_SOURCE: &str = include_str!("../quant/iq_tables.rs");

/// (table name in `quant/iq_tables.rs`, entries are u64)
fn table_of(ty: GgmlType) -> Option<(&'static str, bool)> {
    Some(match ty {
        GgmlType::IQ2_XXS => ("IQ2XXS_GRID", true),
        GgmlType::IQ2_XS => ("IQ2XS_GRID", true),
        GgmlType::IQ2_S => ("IQ2S_GRID", true),
        GgmlType::IQ3_XXS => ("IQ3XXS_GRID", false),
        GgmlType::IQ3_S => ("IQ3S_GRID", false),
        GgmlType::IQ1_S | GgmlType::IQ1_M => ("IQ1S_GRID", true),
        _ => return None,
    })
}

/// The codebook of `ty` as u32 words (u64 entries low word first), or None if `ty` has none.
pub fn grid_words(ty: GgmlType) -> Result<Option<Vec<u32>>, GpuError> {
    let Some((name, wide)) = table_of(ty) else {
        return Ok(None);
    };
    let fail = |m: &str| GpuError::Unsupported(format!("codebook {name}: {m}"));
    let start = TABLES_SOURCE
        .find(&format!("static {name}:"))
        .ok_or_else(|| fail("not found in quant/iq_tables.rs"))?;
    let rest = &TABLES_SOURCE[start..];
    let declared: usize = rest
        .split_once("; ")
        .and_then(|(_, r)| r.split_once(']'))
        .and_then(|(n, _)| n.trim().parse().ok())
        .ok_or_else(|| fail("no length"))?;
    let body_start = rest.find("= [").ok_or_else(|| fail("no initializer"))? + 3;
    let body_len = rest[body_start..]
        .find("];")
        .ok_or_else(|| fail("unterminated"))?;
    let mut words = Vec::with_capacity(declared * 2);
    let mut count = 0;
    for token in rest[body_start..body_start + body_len].split(',') {
        let t = token.trim();
        if t.is_empty() {
            continue;
        }
        let v = match t.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => t.parse::<u64>(),
        }
        .map_err(|_| fail(&format!("bad entry {t:?}")))?;
        if wide {
            words.push(v as u32);
            words.push((v >> 32) as u32);
        } else {
            words.push(u32::try_from(v).map_err(|_| fail("entry exceeds u32"))?);
        }
        count += 1;
    }
    if count != declared {
        return Err(fail(&format!(
            "{count} entries parsed, {declared} declared"
        )));
    }
    Ok(Some(words))
}
