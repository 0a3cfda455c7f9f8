//! The host expert tier: for every (layer, expert) of the tiny fixtures, the bytes served from the
//! mmap and from a RAM copy equal the expert's slice of the GGUF tensors; budgets and bad keys are
//! errors; the fused gate_up layout works.

use std::sync::Arc;

use strata::gguf::{GgmlType, Gguf, GgufWriter};
use strata::quant;
use strata::tiers::host_experts::HostExpertsError;
use strata::tiers::layout::ExpertRole;
use strata::tiers::{ExpertKey, ExpertSlotCache, ExpertSource, HostExperts};

const FIXTURES: [&str; 2] = [
    "tests/fixtures/tiny/tiny-IQ3_S.gguf",
    "tests/fixtures/tiny/tiny-F16.gguf",
];

/// Expert `e`'s slice of tensor `name`, cut by hand: a 3-D tensor is `n_expert` equal slices.
fn slice_of<'a>(gguf: &'a Gguf, name: &str, expert: usize) -> &'a [u8] {
    let tensor = gguf.tensor(name).expect("tensor");
    let n_experts = tensor.dims[2] as usize;
    let data = gguf.tensor_data(tensor);
    let per = data.len() / n_experts;
    &data[expert * per..(expert + 1) * per]
}

#[test]
fn every_expert_matches_its_gguf_slices_from_mmap_and_ram() {
    for path in FIXTURES {
        let gguf = Arc::new(Gguf::open(path).expect("fixture"));
        let tensor_total: u64 = gguf
            .tensors()
            .iter()
            .filter(|t| t.name.contains("_exps."))
            .map(|t| t.n_bytes)
            .sum();
        for source in [
            ExpertSource::Mmap,
            ExpertSource::Ram { locked: false },
            ExpertSource::Ram { locked: true },
        ] {
            let experts = HostExperts::new(gguf.clone(), source, Some(tensor_total)).expect("open");
            assert_eq!(experts.layers().len(), 4);
            match source {
                ExpertSource::Mmap => assert_eq!(experts.ram_bytes(), 0),
                ExpertSource::Ram { .. } => assert_eq!(experts.ram_bytes(), tensor_total),
            }
            let mut checked = 0;
            for layer in 0..4u32 {
                for expert in 0..8u32 {
                    let key = ExpertKey::new(layer, expert);
                    let bytes = experts.expert(key).expect("expert");
                    let roles: Vec<ExpertRole> = bytes.parts.iter().map(|p| p.role).collect();
                    assert_eq!(roles, [ExpertRole::Gate, ExpertRole::Up, ExpertRole::Down]);
                    for (role, suffix) in [
                        (ExpertRole::Gate, "ffn_gate_exps"),
                        (ExpertRole::Up, "ffn_up_exps"),
                        (ExpertRole::Down, "ffn_down_exps"),
                    ] {
                        let want = slice_of(
                            &gguf,
                            &format!("blk.{layer}.{suffix}.weight"),
                            expert as usize,
                        );
                        assert!(
                            bytes.part(role) == Some(want),
                            "{path} {source:?} {key} {role:?}"
                        );
                    }
                    experts.check_expert(key).expect("finite");
                    checked += 1;
                }
            }
            assert_eq!(checked, 32);
            // Keys outside the model are errors, not panics.
            for key in [
                ExpertKey::new(0, 8),
                ExpertKey::new(4, 0),
                ExpertKey::new(u32::MAX, 0),
            ] {
                let err = experts.expert(key).unwrap_err();
                assert!(
                    matches!(err, HostExpertsError::UnknownExpert { .. }),
                    "{err}"
                );
            }
        }
    }
}

#[test]
fn the_host_tier_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<HostExperts>();
}

#[test]
fn a_ram_copy_over_budget_is_refused() {
    let gguf = Arc::new(Gguf::open(FIXTURES[0]).expect("fixture"));
    let err = HostExperts::new(
        gguf.clone(),
        ExpertSource::Ram { locked: false },
        Some(1 << 20),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            HostExpertsError::OverRamBudget {
                budget: 1_048_576,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--experts mmap"), "{err}");
    // Serving from the mmap makes no copy, so the budget does not apply.
    HostExperts::new(gguf, ExpertSource::Mmap, Some(1 << 20)).expect("mmap ignores the budget");
}

#[test]
fn slot_cache_sizes_come_from_the_host_tier() {
    let gguf = Arc::new(Gguf::open(FIXTURES[0]).expect("fixture"));
    let experts = HostExperts::new(gguf, ExpertSource::Mmap, None).expect("open");
    let sizes = experts.expert_bytes_per_layer();
    assert_eq!(sizes, vec![10_560 + 10_560 + 13_824; 4]);
    let mut cache = ExpertSlotCache::new(4, sizes);
    cache
        .lookup_or_assign(&[ExpertKey::new(0, 1), ExpertKey::new(3, 7)])
        .expect("fits");
    assert_eq!(cache.stats().bytes_uploaded, 2 * 34_944);
}

/// A one-layer model with fused gate_up experts and a NaN planted in expert 1's down scales.
fn fused_model() -> Gguf {
    let (n_in, n_ff, n_experts) = (64u64, 32u64, 3u64);
    let mut w = GgufWriter::new();
    let gate_up = quant::random_blocks(
        GgmlType::Q8_0,
        (n_in / 32 * 2 * n_ff * n_experts) as usize,
        1,
    );
    let mut down = quant::random_blocks(GgmlType::Q8_0, (n_ff / 32 * n_in * n_experts) as usize, 2);
    let down_per_expert = (n_ff / 32 * n_in) as usize * 34;
    // Block 5 of expert 1: its f16 scale `d` becomes NaN.
    let nan_at = down_per_expert + 5 * 34;
    down[nan_at..nan_at + 2].copy_from_slice(&0x7E00u16.to_le_bytes());
    w.add_tensor(
        "blk.0.ffn_gate_up_exps.weight",
        &[n_in, 2 * n_ff, n_experts],
        GgmlType::Q8_0,
        gate_up,
    )
    .expect("gate_up");
    w.add_tensor(
        "blk.0.ffn_down_exps.weight",
        &[n_ff, n_in, n_experts],
        GgmlType::Q8_0,
        down,
    )
    .expect("down");
    Gguf::from_vec("fused", w.to_bytes()).expect("parse")
}

#[test]
fn fused_gate_up_experts_are_served_and_checked() {
    let gguf = Arc::new(fused_model());
    for source in [ExpertSource::Mmap, ExpertSource::Ram { locked: false }] {
        let experts = HostExperts::new(gguf.clone(), source, None).expect("open");
        for expert in 0..3u32 {
            let bytes = experts.expert(ExpertKey::new(0, expert)).expect("expert");
            let roles: Vec<ExpertRole> = bytes.parts.iter().map(|p| p.role).collect();
            assert_eq!(roles, [ExpertRole::GateUp, ExpertRole::Down]);
            assert_eq!(
                bytes.part(ExpertRole::GateUp),
                Some(slice_of(
                    &gguf,
                    "blk.0.ffn_gate_up_exps.weight",
                    expert as usize
                ))
            );
            assert_eq!(
                bytes.part(ExpertRole::Down),
                Some(slice_of(
                    &gguf,
                    "blk.0.ffn_down_exps.weight",
                    expert as usize
                ))
            );
        }
        experts
            .check_expert(ExpertKey::new(0, 0))
            .expect("expert 0 is finite");
        let err = experts.check_expert(ExpertKey::new(0, 1)).unwrap_err();
        match &err {
            HostExpertsError::NonFinite {
                key, tensor, block, ..
            } => {
                assert_eq!(*key, ExpertKey::new(0, 1));
                assert_eq!(tensor, "blk.0.ffn_down_exps.weight");
                assert_eq!(*block, 5);
            }
            other => panic!("unexpected {other}"),
        }
        assert!(err.to_string().contains("layer 0 expert 1"), "{err}");
    }
}

#[test]
fn incomplete_expert_layers_are_rejected() {
    let mut w = GgufWriter::new();
    let data = quant::random_blocks(GgmlType::Q8_0, 2 * 2 * 2, 3);
    w.add_tensor(
        "blk.2.ffn_gate_exps.weight",
        &[64, 2, 2],
        GgmlType::Q8_0,
        data.clone(),
    )
    .expect("gate");
    w.add_tensor(
        "blk.2.ffn_down_exps.weight",
        &[64, 2, 2],
        GgmlType::Q8_0,
        data,
    )
    .expect("down");
    let gguf = Arc::new(Gguf::from_vec("no-up", w.to_bytes()).expect("parse"));
    let err = HostExperts::new(gguf, ExpertSource::Mmap, None).unwrap_err();
    assert!(err.to_string().contains("layer 2"), "{err}");
}
