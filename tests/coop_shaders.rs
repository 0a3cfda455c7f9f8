//! The tensor-core prefill tiles (`shaders/quant/rows_coop.wgsl`) cannot run on any CI adapter
//! (lavapipe has no cooperative matrices), so their assemblies are validated here with naga, the
//! compiler wgpu runs, for every split-layout type without mins: a shader that does not parse or validate
//! fails here instead of at a GPU machine's first prefill.

use strata::gguf::types::GgmlType;
use strata::gpu::shaders::{assemble, limb_supported};

fn validate(name: &str) -> Result<naga::valid::ModuleInfo, String> {
    let source = assemble(name).map_err(|e| format!("{name}: {e}"))?;
    let module = naga::front::wgsl::parse_str(&source)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(&source)))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{name}: {}", e.emit_to_string(&source)))
}

#[test]
fn coop_tiles_validate_for_every_split_type() {
    let split: Vec<GgmlType> = GgmlType::all().filter(|&t| limb_supported(t)).collect();
    assert!(split.len() >= 4, "split types: {split:?}");
    for ty in split {
        let name = format!("matvec_coop:{}", ty.name());
        if let Err(e) = validate(&name) {
            panic!("{e}");
        }
    }
}

#[test]
fn coop_tiles_exist_for_split_layouts_without_mins_only() {
    // Block layouts have no task interface, and the tiles do not read mins (Q4_K, Q5_K): their
    // assembly is refused, not miscompiled.
    assert!(assemble("matvec_coop:Q3_K").is_err());
    assert!(assemble("matvec_coop:Q4_K").is_err());
    assert!(assemble("matvec_coop:Q5_K").is_err());
    assert!(assemble("matvec_coop:F32").is_err());
    assert!(assemble("matvec_coop:Q6_K").is_ok());
}
