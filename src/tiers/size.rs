//! Byte sizes as people write them on a command line: `12GiB`, `800MiB`, `1.5G`, `4096`, `12GB`.
//!
//! Units: `KiB/MiB/GiB/TiB` are powers of 1024 and `KB/MB/GB/TB` powers of 1000, as the SI and
//! IEC prefixes say. A bare `K/M/G/T` means the binary unit: that is what `free -g`, `docker
//! --memory` and the JVM's `-Xmx` mean by it, and what people sizing GPU memory usually intend.
//! `B` (or no unit) is bytes. Units are case-insensitive; spaces between number and unit are
//! allowed. Fractions are exact (decimal digits, integer arithmetic) and round down to whole bytes,
//! so a budget is never rounded up past what was asked.

use std::fmt;

/// Why a size could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("empty size; write e.g. 12GiB, 800MiB, 1.5G or 4096 (bytes)")]
    Empty,
    #[error("{text:?} is not a size: {problem}; write e.g. 12GiB, 800MiB, 1.5G or 4096 (bytes)")]
    Malformed { text: String, problem: String },
    #[error(
        "{text:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB or K, M, G, T)"
    )]
    UnknownUnit { text: String, unit: String },
    #[error("{text:?} is larger than {} bytes", u64::MAX)]
    TooLarge { text: String },
}

/// Most fraction digits accepted: enough for any byte-exact fraction of a TiB (2^40 < 10^13).
const MAX_FRACTION_DIGITS: usize = 18;

/// Bytes per unit, or `None` for an unknown unit.
fn unit_multiplier(unit: &str) -> Option<u64> {
    const KIB: u64 = 1 << 10;
    Some(match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => KIB.pow(2),
        "g" | "gib" => KIB.pow(3),
        "t" | "tib" => KIB.pow(4),
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    })
}

/// Parse a byte size (see the module docs for the accepted forms).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(SizeError::Empty);
    }
    let malformed = |problem: &str| SizeError::Malformed {
        text: text.to_string(),
        problem: problem.to_string(),
    };
    let number_end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(number_end);
    let unit = unit.trim_start();
    let multiplier = unit_multiplier(unit).ok_or_else(|| SizeError::UnknownUnit {
        text: text.to_string(),
        unit: unit.to_string(),
    })?;

    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(malformed("no number"));
    }
    if fraction.contains('.') {
        return Err(malformed("more than one decimal point"));
    }
    if fraction.len() > MAX_FRACTION_DIGITS {
        return Err(malformed("too many digits after the decimal point"));
    }
    let too_large = || SizeError::TooLarge {
        text: text.to_string(),
    };
    // u128 holds u64::MAX × 10^18 with room to spare, so only the final narrowing can fail.
    let whole_value: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse::<u64>().map_err(|_| too_large())?.into()
    };
    let fraction_value: u128 = if fraction.is_empty() {
        0
    } else {
        fraction
            .parse::<u64>()
            .map_err(|_| malformed("bad fraction"))?
            .into()
    };
    let fraction_scale = 10u128.pow(fraction.len() as u32);
    let multiplier = u128::from(multiplier);
    let bytes = whole_value * multiplier + fraction_value * multiplier / fraction_scale;
    u64::try_from(bytes).map_err(|_| too_large())
}

/// A size for people: `12.00 GiB`, `800.0 MiB`, `4096 B`. Binary units, three significant digits
/// at least.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    if value < 10.0 {
        format!("{value:.2} {unit}")
    } else if value < 100.0 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

/// A byte size that prints itself with [`format_size`] (for plans and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&format_size(self.0))
    }
}

impl std::str::FromStr for ByteSize {
    type Err = SizeError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_size(text).map(ByteSize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_decimal_and_bare_units() {
        assert_eq!(parse_size("12GiB"), Ok(12 << 30));
        assert_eq!(parse_size("800MiB"), Ok(800 << 20));
        assert_eq!(parse_size("800mib"), Ok(800 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("12GB"), Ok(12_000_000_000));
        assert_eq!(parse_size(" 2 TiB "), Ok(2 << 40));
        assert_eq!(parse_size("64k"), Ok(64 * 1024));
        assert_eq!(parse_size("0.5KB"), Ok(500));
        assert_eq!(parse_size(".25MiB"), Ok(1 << 18));
        assert_eq!(parse_size("3."), Ok(3));
    }

    #[test]
    fn fractions_round_down_to_whole_bytes() {
        // 0.1 KiB = 102.4 bytes.
        assert_eq!(parse_size("0.1KiB"), Ok(102));
        assert_eq!(parse_size("1.999999999999999999B"), Ok(1));
    }

    #[test]
    fn bad_sizes_are_clear_errors() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        assert!(matches!(
            parse_size("12XB"),
            Err(SizeError::UnknownUnit { unit, .. }) if unit == "XB"
        ));
        assert!(matches!(
            parse_size("GiB"),
            Err(SizeError::Malformed { .. })
        ));
        assert!(matches!(parse_size("."), Err(SizeError::Malformed { .. })));
        assert!(matches!(
            parse_size("1.2.3G"),
            Err(SizeError::Malformed { .. })
        ));
        assert!(matches!(
            parse_size("-5G"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("20000000TiB"),
            Err(SizeError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(SizeError::TooLarge { .. })
        ));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        let message = parse_size("12 parsecs").unwrap_err().to_string();
        assert!(
            message.contains("parsecs") && message.contains("GiB"),
            "{message}"
        );
    }

    #[test]
    fn formatting_is_readable() {
        assert_eq!(format_size(4096), "4.00 KiB");
        assert_eq!(format_size(1000), "1000 B");
        assert_eq!(format_size(12 << 30), "12.0 GiB");
        assert_eq!(format_size(800 << 20), "800 MiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!("1.5G".parse::<ByteSize>(), Ok(ByteSize(3 << 29)));
    }
}
