//! Compute pipelines, built once and cached by (shader, entry point, override constants).
//!
//! Shaders are assembled from the files under `shaders/` (see [`super::shaders`]); the assembled
//! source is compiled on the first request only. Layouts are derived from the shader, so a kernel's
//! bind group must bind exactly the resources its entry point uses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::GpuError;
use super::shaders;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    /// Assembled shader name, e.g. `matvec:q4_k`.
    pub shader: String,
    pub entry: &'static str,
    /// Override constants by name; values stored as their f64 bit pattern so the key is hashable.
    pub constants: Vec<(&'static str, u64)>,
}

impl PipelineKey {
    pub fn new(shader: impl Into<String>, entry: &'static str) -> Self {
        Self {
            shader: shader.into(),
            entry,
            constants: Vec::new(),
        }
    }

    pub fn constant(mut self, name: &'static str, value: f64) -> Self {
        self.constants.push((name, value.to_bits()));
        self
    }
}

pub struct PipelineCache {
    device: wgpu::Device,
    /// Limb arithmetic (docs/tensor-cores.md): every pipeline of a shader that declares the
    /// `LIMB` override gets it set.
    limb: bool,
    modules: Mutex<HashMap<String, wgpu::ShaderModule>>,
    /// Shaders that declare `override LIMB`.
    limb_shaders: Mutex<std::collections::HashSet<String>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    pub fn new(device: wgpu::Device, limb: bool) -> Self {
        Self {
            device,
            limb,
            modules: Mutex::new(HashMap::new()),
            limb_shaders: Mutex::new(std::collections::HashSet::new()),
            pipelines: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, key: &PipelineKey) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        if let Some(p) = lock(&self.pipelines).get(key) {
            return Ok(p.clone());
        }
        let module = self.module(&key.shader)?;
        let mut constants: Vec<(&str, f64)> = key
            .constants
            .iter()
            .map(|(n, bits)| (*n, f64::from_bits(*bits)))
            .collect();
        if self.limb && lock(&self.limb_shaders).contains(&key.shader) {
            constants.push(("LIMB", 1.0));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let started = std::time::Instant::now();
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&key.shader),
                layout: None,
                module: &module,
                entry_point: Some(key.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Shader {
                shader: format!("{} ({})", key.shader, key.entry),
                message: err.to_string(),
            });
        }
        // `RUST_LOG=strata=debug` lists every pipeline build with its time (a driver's compile
        // time is part of a first feed's latency).
        tracing::debug!(
            shader = %key.shader,
            entry = key.entry,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "pipeline built"
        );
        let pipeline = Arc::new(pipeline);
        lock(&self.pipelines).insert(key.clone(), pipeline.clone());
        Ok(pipeline)
    }

    fn module(&self, shader: &str) -> Result<wgpu::ShaderModule, GpuError> {
        if let Some(m) = lock(&self.modules).get(shader) {
            return Ok(m.clone());
        }
        let source = shaders::assemble(shader)?;
        if source.contains("override LIMB") {
            lock(&self.limb_shaders).insert(shader.to_string());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(shader),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let module = match runtime_checks() {
            None => self.device.create_shader_module(desc),
            // SAFETY: see `runtime_checks`: every loop of these kernels ends, and no kernel
            // divides by zero; out-of-bounds accesses stay checked unless `none` is asked for.
            Some(checks) => unsafe { self.device.create_shader_module_trusted(desc, checks) },
        };
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Shader {
                shader: shader.to_string(),
                message: err.to_string(),
            });
        }
        lock(&self.modules).insert(shader.to_string(), module.clone());
        Ok(module)
    }

    /// Whether this cache's pipelines use the limb arithmetic.
    pub fn limb(&self) -> bool {
        self.limb
    }
}

/// The runtime checks wgpu adds to the kernels. By default the bounds checks stay (no kernel can
/// read or write past a binding, whatever its arguments) and two checks go: the counter wgpu adds
/// to every loop against infinite loops (every loop of these kernels runs over sizes fixed by its
/// dispatch) and the guards around integer division (no kernel divides by a value that can be
/// zero: sizes are checked by the launchers). Without them a decode step took 4.5 % less GPU
/// time on the H200 (8 layers: 2.80 against 2.93 ms), with the same bits. `STRATA_SHADER_CHECKS`
/// = `full` keeps every check wgpu adds, `none` drops the bounds checks too (both for tuning).
fn runtime_checks() -> Option<wgpu::ShaderRuntimeChecks> {
    let lean = wgpu::ShaderRuntimeChecks {
        force_loop_bounding: false,
        int_div_checks: false,
        ..wgpu::ShaderRuntimeChecks::checked()
    };
    match std::env::var("STRATA_SHADER_CHECKS").as_deref() {
        Ok("full") => None,
        Ok("none") => Some(wgpu::ShaderRuntimeChecks::unchecked()),
        _ => Some(lean),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::runtime_checks;

    /// The default keeps wgpu's bounds checks (no kernel may reach past a binding) and drops only
    /// the loop counters and division guards; `full` keeps everything.
    #[test]
    fn default_checks_keep_bounds_checks() {
        if std::env::var("STRATA_SHADER_CHECKS").is_ok() {
            return;
        }
        let checks = runtime_checks().expect("lean checks by default");
        assert!(checks.bounds_checks);
        assert!(!checks.force_loop_bounding);
        assert!(!checks.int_div_checks);
    }
}
