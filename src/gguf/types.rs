//! The ggml tensor element types a GGUF file can name, with their block geometry.
//!
//! Ids and block layouts follow `ggml/include/ggml.h` and `ggml/src/ggml-common.h` in llama.cpp.
//! Ids 4, 5 (old Q4_2/Q4_3), 31–33 (Q4_0_x_x) and 36–38 (IQ4_NL_x_x) were removed from ggml and are
//! deliberately unknown here: a file using them is rejected rather than misread.

/// A ggml tensor type. `block_size` elements are stored in `type_size` bytes.
#[allow(non_camel_case_types)] // the ggml names (Q4_K, IQ3_S, …) are what users and files say
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
}

/// One row of the type table: (type, ggml id, name, elements per block, bytes per block).
type TypeRow = (GgmlType, u32, &'static str, usize, usize);

/// Super-block size of the k-quants and i-quants (`QK_K` in ggml).
const QK_K: usize = 256;

/// The single source of truth for ids and geometry; every method below reads from it.
const TYPE_TABLE: &[TypeRow] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 2 + 16),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 2 + 32),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 2 + 2 + 32),
    (
        GgmlType::Q2_K,
        10,
        "Q2_K",
        QK_K,
        QK_K / 16 + QK_K / 4 + 2 + 2,
    ),
    (
        GgmlType::Q3_K,
        11,
        "Q3_K",
        QK_K,
        QK_K / 8 + QK_K / 4 + 12 + 2,
    ),
    (GgmlType::Q4_K, 12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2),
    (
        GgmlType::Q5_K,
        13,
        "Q5_K",
        QK_K,
        2 + 2 + 12 + QK_K / 8 + QK_K / 2,
    ),
    (
        GgmlType::Q6_K,
        14,
        "Q6_K",
        QK_K,
        QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
    ),
    (GgmlType::Q8_K, 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", QK_K, 2 + QK_K / 8 * 2),
    (
        GgmlType::IQ2_XS,
        17,
        "IQ2_XS",
        QK_K,
        2 + QK_K / 8 * 2 + QK_K / 32,
    ),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", QK_K, 2 + 3 * QK_K / 8),
    (
        GgmlType::IQ1_S,
        19,
        "IQ1_S",
        QK_K,
        2 + QK_K / 8 + QK_K / 32 * 2,
    ),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
    (
        GgmlType::IQ3_S,
        21,
        "IQ3_S",
        QK_K,
        2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64,
    ),
    (
        GgmlType::IQ2_S,
        22,
        "IQ2_S",
        QK_K,
        2 + QK_K / 4 + QK_K / 32 + QK_K / 32,
    ),
    (
        GgmlType::IQ4_XS,
        23,
        "IQ4_XS",
        QK_K,
        2 + 2 + QK_K / 64 + QK_K / 2,
    ),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (
        GgmlType::IQ1_M,
        29,
        "IQ1_M",
        QK_K,
        QK_K / 8 + QK_K / 16 + QK_K / 32,
    ),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (
        GgmlType::TQ1_0,
        34,
        "TQ1_0",
        QK_K,
        (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + 2,
    ),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, QK_K / 4 + 2),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 1 + 16),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 4 + 32),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 2 + 16),
    (GgmlType::Q2_0, 42, "Q2_0", 64, 2 + 16),
];

impl GgmlType {
    /// Every known type, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TYPE_TABLE.iter().map(|row| row.0)
    }

    /// The type with ggml id `id`, or `None` for an id ggml does not (or no longer) define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPE_TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    /// The type named `name` (case-insensitive, e.g. "q4_k", "IQ3_S").
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TYPE_TABLE
            .iter()
            .find(|row| row.2.eq_ignore_ascii_case(name))
            .map(|row| row.0)
    }

    fn row(self) -> &'static TypeRow {
        // The table lists every variant exactly once (checked by a unit test), and variants are
        // declared in table order, so the discriminant is the row index.
        &TYPE_TABLE[self as usize]
    }

    /// The ggml type id written in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The ggml name: "Q4_K", "IQ3_S", "F16", …
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for the plain float and integer types).
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// True for block-quantized types (everything but the plain float and integer types).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by `n_elements` consecutive elements; `None` when `n_elements` is not a whole
    /// number of blocks or the size does not fit in a u64.
    pub fn row_bytes(self, n_elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_match_variant_order_and_ids_are_unique() {
        for (index, row) in TYPE_TABLE.iter().enumerate() {
            assert_eq!(row.0 as usize, index, "{} is out of order", row.2);
            assert_eq!(GgmlType::from_id(row.1), Some(row.0));
            assert_eq!(GgmlType::from_name(row.2), Some(row.0));
        }
        assert_eq!(GgmlType::all().count(), TYPE_TABLE.len());
    }

    #[test]
    fn block_geometry_matches_ggml_struct_sizes() {
        // Sizes of the ggml block structs (sizeof(block_xxx)), written out as literals so that a
        // slip in the table's arithmetic cannot hide.
        let expected: &[(GgmlType, usize, usize)] = &[
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q8_1, 32, 36),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::Q8_K, 256, 292),
            (GgmlType::IQ2_XXS, 256, 66),
            (GgmlType::IQ2_XS, 256, 74),
            (GgmlType::IQ3_XXS, 256, 98),
            (GgmlType::IQ1_S, 256, 50),
            (GgmlType::IQ4_NL, 32, 18),
            (GgmlType::IQ3_S, 256, 110),
            (GgmlType::IQ2_S, 256, 82),
            (GgmlType::IQ4_XS, 256, 136),
            (GgmlType::IQ1_M, 256, 56),
            (GgmlType::TQ1_0, 256, 54),
            (GgmlType::TQ2_0, 256, 66),
            (GgmlType::MXFP4, 32, 17),
            (GgmlType::NVFP4, 64, 36),
            (GgmlType::BF16, 1, 2),
        ];
        for &(ty, block, bytes) in expected {
            assert_eq!((ty.block_size(), ty.type_size()), (block, bytes), "{ty}");
        }
    }

    #[test]
    fn row_bytes_rejects_partial_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(31), None);
    }
}
