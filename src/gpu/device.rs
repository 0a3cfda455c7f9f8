//! Adapter discovery and device creation.
//!
//! The instance enables wgpu's primary backends, Vulkan, Metal and DX12 (narrowed by
//! `WGPU_BACKEND`, which `--gpu-backend` sets), and never GL: with GL enabled wgpu can silently pick
//! a GL adapter (llvmpipe's) that has no subgroups and fails every kernel later. The device is
//! created with the adapter's own limits (the defaults cap a binding at 128 MiB and workgroup
//! storage at 16 KiB) and every optional feature we can use. Adapters whose subgroup size is not a
//! power of two in [4, 128] are refused: the kernels' reductions assume such a size.

use std::sync::{Arc, Mutex};

use super::GpuError;
use super::pipelines::PipelineCache;

/// One adapter as `strata inspect --gpus` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AdapterSummary {
    /// Index to pass as `--adapter N`.
    pub index: usize,
    pub name: String,
    pub device_type: String,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub has_subgroups: bool,
    pub has_f16: bool,
    pub has_timestamps: bool,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_compute_workgroup_storage_size: u32,
}

/// The backends strata may run on: Vulkan, Metal and DX12 (`Backends::PRIMARY`), or those of them
/// that `WGPU_BACKEND` names (a comma list, e.g. `vulkan` or `dx12,vulkan`). GL is always left out.
pub fn allowed_backends() -> wgpu::Backends {
    match wgpu::Backends::from_env() {
        Some(requested) => requested & wgpu::Backends::PRIMARY,
        None => wgpu::Backends::PRIMARY,
    }
}

/// What to tell a user when no adapter is found: which backends were searched and what to do.
pub fn no_adapter_message() -> String {
    let backends = allowed_backends();
    let names: Vec<&str> = [
        (wgpu::Backends::VULKAN, "Vulkan"),
        (wgpu::Backends::METAL, "Metal"),
        (wgpu::Backends::DX12, "DX12"),
    ]
    .into_iter()
    .filter(|(b, _)| backends.contains(*b))
    .map(|(_, name)| name)
    .collect();
    if names.is_empty() {
        return format!(
            "WGPU_BACKEND={:?} names none of the GPU APIs strata runs on (vulkan, metal, dx12; \
             OpenGL lacks the subgroup operations every kernel needs)",
            std::env::var("WGPU_BACKEND").unwrap_or_default()
        );
    }
    format!(
        "no {} adapter found (install a GPU driver; on a CPU-only Linux machine \
         `apt-get install mesa-vulkan-drivers libvulkan1` gives the lavapipe software adapter)",
        names.join("/")
    )
}

fn instance() -> wgpu::Instance {
    // `with_env` applies WGPU_VALIDATION, WGPU_DEBUG etc.; the backends are ours, GL never included.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle().with_env();
    desc.backends = allowed_backends();
    wgpu::Instance::new(desc)
}

/// Whether `size` is a subgroup size the kernels handle: a power of two in [4, 128].
/// What the tensor-core tiles need besides the device's usual features.
const COOP_FEATURES: wgpu::Features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
    .union(wgpu::Features::SHADER_F16)
    .union(wgpu::Features::SUBGROUP_BARRIER);

/// Whether `adapter` can run the tensor-core prefill tiles: the features, subgroups of exactly
/// 32 and a 16x16x16 f16 cooperative matrix with f32 results. `STRATA_COOP=0` says no.
fn coop_capable(adapter: &wgpu::Adapter, summary: &AdapterSummary) -> bool {
    if std::env::var("STRATA_COOP").is_ok_and(|v| v == "0") {
        return false;
    }
    let shape = adapter.cooperative_matrix_properties().iter().any(|c| {
        c.m_size == 16
            && c.n_size == 16
            && c.k_size == 16
            && c.ab_type == wgpu::wgt::CooperativeScalarType::F16
            && c.cr_type == wgpu::wgt::CooperativeScalarType::F32
    });
    adapter.features().contains(COOP_FEATURES)
        && summary.subgroup_min_size == 32
        && summary.subgroup_max_size == 32
        && shape
}

/// `STRATA_ARITH=limb` selects the limb arithmetic for a process's contexts (experimental: the
/// groundwork of tensor-core prefill, docs/tensor-cores.md); anything else keeps today's.
fn limb_from_env() -> bool {
    std::env::var("STRATA_ARITH").is_ok_and(|v| v == "limb")
}

/// `STRATA_ARITH=int`: the integer-digit arithmetic (docs/int-arith.md) for the split types that
/// have it.
/// Digit buffers the integer-digit arithmetic takes in turn.
const XQ_RING: usize = 4;

fn idot_from_env() -> bool {
    std::env::var("STRATA_ARITH").is_ok_and(|v| v == "int")
}

pub fn subgroup_size_ok(size: u32) -> bool {
    size.is_power_of_two() && (4..=128).contains(&size)
}

fn enumerate() -> Vec<wgpu::Adapter> {
    let instance = instance();
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    // A stable order so `--adapter N` means the same adapter on every run: discrete GPUs first.
    adapters.sort_by_key(|a| {
        let info = a.get_info();
        (device_type_rank(info.device_type), info.name.clone())
    });
    adapters
}

fn device_type_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

/// Every adapter the instance can see on every allowed backend, in `--adapter` order.
pub fn list_adapters() -> Vec<AdapterSummary> {
    enumerate()
        .iter()
        .enumerate()
        .map(|(index, a)| summarize(index, a))
        .collect()
}

fn summarize(index: usize, adapter: &wgpu::Adapter) -> AdapterSummary {
    let info = adapter.get_info();
    let features = adapter.features();
    let limits = adapter.limits();
    AdapterSummary {
        index,
        name: info.name,
        device_type: format!("{:?}", info.device_type),
        backend: format!("{:?}", info.backend),
        driver: info.driver,
        driver_info: info.driver_info,
        subgroup_min_size: info.subgroup_min_size,
        subgroup_max_size: info.subgroup_max_size,
        has_subgroups: features.contains(wgpu::Features::SUBGROUP),
        has_f16: features.contains(wgpu::Features::SHADER_F16),
        has_timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
        max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
    }
}

/// A created device plus what the kernels need to know about it.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub adapter: AdapterSummary,
    pub limits: wgpu::Limits,
    pub features: wgpu::Features,
    pub pipelines: PipelineCache,
    /// Validation errors wgpu reports asynchronously; checked after every submission so a bad
    /// dispatch becomes an error instead of silently wrong numbers.
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// i-quant codebooks, uploaded on first use.
    grids: Mutex<std::collections::HashMap<crate::gguf::types::GgmlType, Arc<wgpu::Buffer>>>,
    /// Prefill's x vectors in task order for the wide tiles (`crate::gpu::matvec`), grown on
    /// demand and shared by every sequence of the context (each use is recorded right after the
    /// copy that fills it).
    xperm: Mutex<Option<super::buffers::GpuBuf>>,
    /// Prefill's x in limbs for the tensor-core tiles (hi, lo, exponents), grown on demand.
    limbs: Mutex<Option<[super::buffers::GpuBuf; 3]>>,
    /// The integer-digit arithmetic (`crate::gpu::matvec::idot`): `STRATA_ARITH=int`, or `strata
    /// bench --synthetic matvec --arith int`.
    idot: std::sync::atomic::AtomicBool,
    /// x split into digits for that arithmetic: a ring of buffers taken in turn, so that a split
    /// never waits for the mat-vec before it to finish reading (wgpu orders a write after a read
    /// of the same buffer), each grown on demand.
    xq: Mutex<(usize, Vec<Option<super::buffers::GpuBuf>>)>,
    /// Whether split-layout prefill runs on the matrix units (limb arithmetic and 16x16 f16
    /// cooperative matrices with subgroups of 32; `STRATA_COOP=0` turns it off).
    coop: bool,
    /// The staging buffers of weight uploads (`crate::gpu::upload`), while a load runs.
    pub(super) staging: Mutex<Option<super::upload::StagingRing>>,
    /// The most bytes of one staged batch.
    pub(super) staging_limit: std::sync::atomic::AtomicUsize,
}

impl GpuContext {
    /// Create a device on adapter `index` (see [`list_adapters`]), or on the best adapter when
    /// `None` (discrete GPU first).
    pub fn new(index: Option<usize>) -> Result<Arc<Self>, GpuError> {
        Self::with_arithmetic(index, limb_from_env())
    }

    /// A context whose split-layout mat-vecs use the limb arithmetic (`limb`, the arithmetic a
    /// tensor-core prefill can reproduce: docs/tensor-cores.md) or today's.
    pub fn with_arithmetic(index: Option<usize>, limb: bool) -> Result<Arc<Self>, GpuError> {
        let adapters = enumerate();
        if adapters.is_empty() {
            return Err(GpuError::NoAdapter(no_adapter_message()));
        }
        let chosen = index.unwrap_or(0);
        let Some(adapter) = adapters.get(chosen) else {
            return Err(GpuError::NoAdapter(format!(
                "adapter {chosen} requested but only {} found",
                adapters.len()
            )));
        };
        let summary = summarize(chosen, adapter);
        let available = adapter.features();
        if !available.contains(wgpu::Features::SUBGROUP) {
            return Err(GpuError::NoAdapter(format!(
                "adapter {:?} ({}) has no subgroup support, which every strata kernel needs",
                summary.name, summary.backend
            )));
        }
        for (what, size) in [
            ("minimum", summary.subgroup_min_size),
            ("maximum", summary.subgroup_max_size),
        ] {
            if !subgroup_size_ok(size) {
                return Err(GpuError::NoAdapter(format!(
                    "adapter {:?} ({}) reports a {what} subgroup size of {size}; strata's kernels \
                     need a power of two between 4 and 128",
                    summary.name, summary.backend
                )));
            }
        }
        if !available.contains(wgpu::Features::IMMEDIATES) {
            return Err(GpuError::NoAdapter(format!(
                "adapter {:?} lacks immediates (push constants), which strata kernels use for their parameters",
                summary.name
            )));
        }
        let wanted = wgpu::Features::SUBGROUP
            | wgpu::Features::IMMEDIATES
            | wgpu::Features::SHADER_F16
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::MAPPABLE_PRIMARY_BUFFERS
            | wgpu::Features::SUBGROUP_BARRIER;
        let coop = limb && coop_capable(adapter, &summary);
        let features = (available & wanted)
            | if coop {
                COOP_FEATURES
            } else {
                wgpu::Features::empty()
            };
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("strata"),
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: cooperative matrices are wgpu's experimental feature; they are enabled only
            // for the limb arithmetic's tensor-core tiles (shaders/quant/rows_coop.wgsl), whose
            // results the tests compare with the portable kernels' bit for bit.
            experimental_features: if coop {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| {
            GpuError::NoAdapter(format!("request_device on {:?} failed: {e}", summary.name))
        })?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut errors) = sink.lock() {
                errors.push(e.to_string());
            }
        }));
        tracing::info!(adapter = %summary.name, driver = %summary.driver, "gpu device created");
        Ok(Arc::new(Self {
            pipelines: PipelineCache::new(device.clone(), limb),
            device,
            queue,
            adapter: summary,
            limits,
            features,
            uncaptured,
            grids: Mutex::new(std::collections::HashMap::new()),
            xperm: Mutex::new(None),
            limbs: Mutex::new(None),
            idot: std::sync::atomic::AtomicBool::new(!limb && idot_from_env()),
            xq: Mutex::new((0, vec![None; XQ_RING])),
            coop,
            staging: Mutex::new(None),
            staging_limit: std::sync::atomic::AtomicUsize::new(super::upload::STAGING_BYTES),
        }))
    }

    /// The largest storage binding any kernel may use.
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// Whether kernels may use `subgroupBarrier` (the wide tiles' rounds for short rows do).
    pub fn has_subgroup_barrier(&self) -> bool {
        self.features.contains(wgpu::Features::SUBGROUP_BARRIER)
    }

    /// Whether storage buffers may live in host memory (`MAP_READ | STORAGE`, which wgpu places
    /// in host-visible, host-cached system RAM): kernels then read them in place over the bus.
    pub fn has_host_storage(&self) -> bool {
        self.features
            .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
    }

    pub fn has_timestamps(&self) -> bool {
        self.features
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    }

    /// Turn any asynchronous validation error into a `GpuError`.
    pub fn check_errors(&self) -> Result<(), GpuError> {
        let mut errors = match self.uncaptured.lock() {
            Ok(e) => e,
            Err(poisoned) => poisoned.into_inner(),
        };
        if errors.is_empty() {
            return Ok(());
        }
        let message = errors.join("; ");
        errors.clear();
        Err(GpuError::Validation(message))
    }

    /// Block until all submitted work is done.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| GpuError::Device(format!("poll failed: {e}")))?;
        self.check_errors()
    }

    /// The codebook buffer of an i-quant type (None for types without one).
    pub fn grid_buffer(
        &self,
        ty: crate::gguf::types::GgmlType,
    ) -> Result<Option<Arc<wgpu::Buffer>>, GpuError> {
        let mut grids = match self.grids.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(b) = grids.get(&ty) {
            return Ok(Some(b.clone()));
        }
        let Some(words) = super::iq_grids::grid_words(ty)? else {
            return Ok(None);
        };
        let buffer = Arc::new(super::buffers::storage_with_bytes(
            self,
            &format!("{} grid", ty.name()),
            bytemuck::cast_slice(&words),
        ));
        grids.insert(ty, buffer.clone());
        Ok(Some(buffer))
    }

    /// The task-order x buffer of the wide tiles, at least `floats` long (grown to twice the old
    /// size or `floats`, whichever is more; never shrunk).
    pub fn xperm_buffer(&self, floats: usize) -> Result<super::buffers::GpuBuf, GpuError> {
        let mut held = match self.xperm.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(b) = held.as_ref().filter(|b| b.len >= floats) {
            return Ok(b.clone());
        }
        let old = held.as_ref().map_or(0, |b| b.len);
        let len = floats
            .max(2 * old)
            .min(self.max_binding_bytes() as usize / 4)
            .max(floats);
        let b = super::buffers::GpuBuf::zeros(self, "wide tiles' x in task order", len)?;
        *held = Some(b.clone());
        Ok(b)
    }

    /// Whether prefill's split-layout mat-vecs run on the matrix units (see the field).
    pub fn coop(&self) -> bool {
        self.coop
    }

    /// The limb buffers of the tensor-core tiles: `words` u32 each for hi and lo, `exps` i32 for
    /// the exponents; shared by every sequence of the context, each use recorded right after the
    /// dispatch that fills them.
    pub fn limb_buffers(
        &self,
        words: usize,
        exps: usize,
    ) -> Result<[super::buffers::GpuBuf; 3], GpuError> {
        let mut held = match self.limbs.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(b) = held
            .as_ref()
            .filter(|b| b[0].len >= words && b[2].len >= exps)
        {
            return Ok(b.clone());
        }
        let most = self.max_binding_bytes() as usize / 4;
        let grow = |want: usize, old: usize| want.max(2 * old).min(most).max(want);
        let old = held.as_ref().map_or([0, 0], |b| [b[0].len, b[2].len]);
        let z = |label: &str, len: usize| super::buffers::GpuBuf::zeros(self, label, len);
        let b = [
            z("prefill x hi limbs", grow(words, old[0]))?,
            z("prefill x lo limbs", grow(words, old[0]))?,
            z("prefill x limb exponents", grow(exps, old[1]))?,
        ];
        *held = Some(b.clone());
        Ok(b)
    }

    /// Turn the integer-digit arithmetic (docs/int-arith.md) on or off for this context's later
    /// mat-vecs: `strata bench --synthetic matvec --arith int`; a model's context gets it from
    /// `STRATA_ARITH=int` when created, never later (its rows would change arithmetic midway).
    pub fn set_idot(&self, on: bool) {
        self.idot.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the integer-digit arithmetic is on.
    pub fn idot(&self) -> bool {
        self.idot.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The next digit buffer of the integer-digit arithmetic (of a ring of [`XQ_RING`]): at
    /// least `words` u32. Each is recorded right after the split that fills it.
    pub fn xq_buffer(&self, words: usize) -> Result<super::buffers::GpuBuf, GpuError> {
        let mut held = match self.xq.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (next, ring) = &mut *held;
        let at = *next % ring.len();
        *next = next.wrapping_add(1);
        if let Some(b) = ring[at].as_ref().filter(|b| b.len >= words) {
            return Ok(b.clone());
        }
        let b = super::buffers::GpuBuf::zeros(self, "x digits", words.max(1))?;
        ring[at] = Some(b.clone());
        Ok(b)
    }

    /// Human-readable adapter line, e.g. for test output.
    pub fn describe(&self) -> String {
        let a = &self.adapter;
        let arithmetic = if self.coop {
            ", limb arithmetic, tensor-core prefill"
        } else if self.pipelines.limb() {
            ", limb arithmetic"
        } else if self.idot() {
            ", integer-digit arithmetic"
        } else {
            ""
        };
        format!(
            "{} ({} / {}, driver {} {}, subgroup {}..{}{arithmetic})",
            a.name,
            a.device_type,
            a.backend,
            a.driver,
            a.driver_info,
            a.subgroup_min_size,
            a.subgroup_max_size
        )
    }
}
