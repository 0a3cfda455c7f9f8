//! Probe for the prefill issue's tensor-core path: `cargo bench --bench coop`. What it found and
//! the design it supports: docs/tensor-cores.md.
//!
//! 1. `exact`: products of integer f16 operands (codes up to 127 in magnitude, x limbs up to
//!    2048) accumulated by the cooperative matrices in f32, against exact integer sums.
//! 2. Tile kernels whose block sums come from the cooperative matrices against the decode form of
//!    the same arithmetic (fma chains, one subgroup per output), on the same data: equal bits
//!    mean tensor-core prefill can keep decode's bits. Four reductions over tasks: 32 classes
//!    with `subgroupAdd` (`tile` / `reference`), 16 and 8 classes with a fixed tree (`tile32` /
//!    `reference16`, `tile8` / `reference8`), and one class, each output folding its tasks in
//!    order (`tile1`, `tile1w` / `reference1`).
//! 3. Throughput of each at model shapes (median of 5 timed submissions after a 0.3 s warm-up),
//!    and diagnostics of what the tiles' time goes to (`tile1_nos`, `tile1_noe`, `tile8_noepi`,
//!    `tile8_bare`).
//!
//! On an adapter without cooperative matrices (lavapipe) it says so and runs nothing.

use std::time::Instant;

use half::f16;
use wgpu::util::DeviceExt;

const SHADER: &str = include_str!("coop_tile.wgsl");

struct Probe {
    device: wgpu::Device,
    queue: wgpu::Queue,
    layout: wgpu::BindGroupLayout,
    module: wgpu::ShaderModule,
    pipeline_layout: wgpu::PipelineLayout,
}

fn main() {
    let Some(probe) = Probe::new() else {
        return;
    };
    probe.exactness();
    let tile = Form::new("tile", "reference", (16, 16), 1, false);
    let mma_only = Form::new("mma_only", "", (16, 16), 1, false);
    let tile32 = Form::new("tile32", "reference16", (32, 32), 2, true);
    let tile8 = Form::new("tile8", "reference8", (32, 64), 4, true);
    let tile1 = Form::new("tile1", "reference1", (64, 128), 1, true);
    let tile1w = Form::new("tile1w", "reference1", (128, 128), 1, true);
    let big = (10240, 512, 2560);
    let short = (2560, 2048, 640);
    let expert = (1280, 64, 2560);
    probe.form_bits(&tile, (64, 32, 2560));
    probe.form_bits(&tile, (48, 16, 640));
    probe.form_throughput(&mma_only, big);
    probe.form_throughput(&tile, big);
    for shape in [(64, 64, 2560), (96, 32, 640), (32, 32, 2592)] {
        probe.form_bits(&tile32, shape);
    }
    probe.form_throughput(&tile32, big);
    probe.form_throughput(&tile32, expert);
    probe.form_bits(&tile8, (64, 128, 2560));
    probe.form_bits(&tile8, (96, 64, 2592));
    for shape in [big, expert, short] {
        probe.form_throughput(&tile8, shape);
    }
    probe.form_bits(&tile1, (128, 128, 2560));
    probe.form_bits(&tile1, (64, 128, 2592));
    probe.form_throughput(&tile1, big);
    probe.form_throughput(&tile1, short);
    // Diagnostics (meaningless outputs): tile1 without its scale loads, without its epilogue;
    // tile8 without its epilogue, then without the dequant staging too.
    for kernel in ["tile1_nos", "tile1_noe"] {
        probe.form_throughput(&Form { kernel, ..tile1 }, big);
    }
    probe.form_bits(&tile1w, (128, 256, 2592));
    probe.form_throughput(&tile1w, big);
    probe.form_throughput(&tile1w, short);
    for kernel in ["tile8_noepi", "tile8_bare"] {
        probe.form_throughput(&Form { kernel, ..tile8 }, big);
    }
}

impl Probe {
    fn new() -> Option<Self> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle().with_env());
        let adapter = pollster::block_on(instance.request_adapter(&Default::default())).ok()?;
        let info = adapter.get_info();
        let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::SUBGROUP_BARRIER;
        if !adapter.features().contains(needed) || info.subgroup_min_size != 32 {
            eprintln!(
                "{} ({:?}): no cooperative matrices with f16 and subgroups of 32; nothing probed",
                info.name, info.backend
            );
            return None;
        }
        println!(
            "adapter: {} ({:?}, {})",
            info.name, info.backend, info.driver_info
        );
        for c in adapter.cooperative_matrix_properties() {
            println!(
                "  coop {}x{}x{} ab {:?} cr {:?}",
                c.m_size, c.n_size, c.k_size, c.ab_type, c.cr_type
            );
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("coop probe"),
            required_features: needed,
            required_limits: adapter.limits(),
            // SAFETY: the probe only runs the cooperative-matrix shaders of this file.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
            ..Default::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc)).ok()?;
        let storage = |binding: u32, read_only: bool| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let mut entries: Vec<_> = (0..5).map(|b| storage(b, true)).collect();
        entries.push(storage(5, false));
        entries.push(storage(7, true));
        entries.push(storage(8, true));
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: 6,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        });
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: None,
            entries: &entries,
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("coop_tile"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        Some(Self {
            device,
            queue,
            layout,
            module,
            pipeline_layout,
        })
    }

    fn pipeline(&self, entry: &str) -> wgpu::ComputePipeline {
        self.device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(entry),
                layout: Some(&self.pipeline_layout),
                module: &self.module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
    }

    fn buffer(&self, bytes: &[u8]) -> wgpu::Buffer {
        let padded;
        let contents = if bytes.is_empty() {
            padded = vec![0u8; 16];
            &padded[..]
        } else {
            bytes
        };
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::UNIFORM,
            })
    }

    fn out_buffer(&self, floats: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (floats * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    fn bind(&self, data: &Data, y: &wgpu::Buffer) -> wgpu::BindGroup {
        let bufs = [
            &data.w,
            &data.s,
            &data.xh,
            &data.xl,
            &data.e,
            y,
            &data.params,
            &data.e2,
            &data.s2,
        ];
        let entries: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.layout,
            entries: &entries,
        })
    }

    /// Runs `entry` over `groups`, `reps` times in one pass; returns seconds of wall time.
    fn run(&self, entry: &str, bind: &wgpu::BindGroup, groups: (u32, u32), reps: u32) -> f64 {
        let pipeline = self.pipeline(entry);
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, bind, &[]);
            for _ in 0..reps {
                pass.dispatch_workgroups(groups.0, groups.1, 1);
            }
        }
        let start = Instant::now();
        self.queue.submit([enc.finish()]);
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        start.elapsed().as_secs_f64()
    }

    /// Seconds per dispatch of `entry`: a warm-up of at least 0.3 s (clocks up), then the median
    /// of 5 submissions of enough dispatches to take about 20 ms each.
    fn time(&self, entry: &str, bind: &wgpu::BindGroup, groups: (u32, u32)) -> f64 {
        let once = self.run(entry, bind, groups, 1).max(1e-6);
        let reps = ((0.02 / once).ceil() as u32).clamp(1, 2000);
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < 0.3 {
            self.run(entry, bind, groups, reps);
        }
        let mut samples: Vec<f64> = (0..5)
            .map(|_| self.run(entry, bind, groups, reps) / reps as f64)
            .collect();
        samples.sort_by(f64::total_cmp);
        samples[2]
    }

    fn read(&self, buf: &wgpu::Buffer, floats: usize) -> Vec<f32> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (floats * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, 0, &staging, 0, Some((floats * 4) as u64));
        self.queue.submit([enc.finish()]);
        staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        let Ok(view) = staging.slice(..).get_mapped_range() else {
            panic!("probe readback failed to map");
        };
        bytemuck::cast_slice(&view).to_vec()
    }

    fn exactness(&self) {
        let mut rng = Rng(11);
        let cases = 512usize;
        let mut a = vec![0f32; cases * 512];
        let mut b = vec![0f32; cases * 512];
        for c in 0..cases {
            // Case kinds: random codes and limbs; every product at the maximum (one sign);
            // mixed magnitudes (one large product per row, the rest +-1).
            for i in 0..512 {
                let (x, y) = match c % 3 {
                    0 => (rng.int(127), rng.int(2048)),
                    1 => (127.0, 2048.0),
                    _ => {
                        if i % 32 == 0 {
                            (127.0, 2048.0)
                        } else {
                            (rng.int(1), rng.int(1))
                        }
                    }
                };
                a[c * 512 + i] = x;
                b[c * 512 + i] = y;
            }
        }
        let data = Data::new(self, &[], &[], &a, &b, &[], [0, 0, 0, 0]);
        let y = self.out_buffer(cases * 256);
        self.run("exact", &self.bind(&data, &y), (cases as u32, 1), 1);
        let got = self.read(&y, cases * 256);
        let mut bad = 0usize;
        let mut first = None;
        for c in 0..cases {
            for r in 0..16 {
                for n in 0..16 {
                    let mut want = 0i64;
                    for k in 0..32 {
                        want += a[c * 512 + r * 32 + k] as i64 * b[c * 512 + k * 16 + n] as i64;
                    }
                    let g = got[c * 256 + r * 16 + n];
                    if g as i64 != want || g.fract() != 0.0 {
                        bad += 1;
                        first.get_or_insert((c, r, n, g, want));
                    }
                }
            }
        }
        println!(
            "exact: {} of {} integer sums of 32 products differ from the exact sums (first: {:?})",
            bad,
            cases * 256,
            first
        );
    }

    fn compare(&self, what: &str, a: &[f32], b: &[f32]) {
        let differ = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        let max = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let finite = a.iter().all(|v| v.is_finite()) && b.iter().any(|v| *v != 0.0);
        println!(
            "{what}: {differ} of {} outputs differ in bits (max abs diff {max:e}; finite and \
             nonzero: {finite})",
            a.len()
        );
    }

    /// `form`'s tile kernel against its decode form on the same data; for the one-scale forms
    /// also against f64 on the unsplit x (the limbs' accuracy).
    fn form_bits(&self, form: &Form, shape: (usize, usize, usize)) {
        let (rows, toks, k) = shape;
        let seed = if form.per_block { 3 } else { 5 };
        let data = Data::random(self, rows, toks, k, seed, form.per_block);
        let ya = self.out_buffer(rows * toks);
        let yb = self.out_buffer(rows * toks);
        self.run(
            form.kernel,
            &self.bind(&data, &ya),
            form.groups(rows, toks),
            1,
        );
        let rgroups = ((rows / form.per_wg) as u32, toks as u32);
        self.run(form.reference, &self.bind(&data, &yb), rgroups, 1);
        let a = self.read(&ya, rows * toks);
        let b = self.read(&yb, rows * toks);
        self.compare(
            &format!(
                "{} vs {}, {rows} rows x {toks} tokens x {k}",
                form.kernel, form.reference
            ),
            &a,
            &b,
        );
        if !form.per_block {
            return;
        }
        let mut worst = 0f64;
        let mut scale = 0f64;
        for t in 0..toks {
            for r in 0..rows {
                let mut want = 0f64;
                for i in 0..k {
                    want += data.host_w[r * k + i] as f64
                        * data.host_s2[r * (k / 32) + i / 32] as f64
                        * data.host_x[t * k + i] as f64;
                }
                worst = worst.max((want - a[t * rows + r] as f64).abs());
                scale = scale.max(want.abs());
            }
        }
        println!(
            "  against f64 on the unsplit x: max abs error {worst:e} (largest output {scale:e})"
        );
    }

    fn form_throughput(&self, form: &Form, shape: (usize, usize, usize)) {
        let (rows, toks, k) = shape;
        let data = Data::random(self, rows, toks, k, 9, form.per_block);
        let y = self.out_buffer(rows * toks);
        let bind = self.bind(&data, &y);
        let macs = (rows * toks * k) as f64;
        let secs = self.time(form.kernel, &bind, form.groups(rows, toks));
        println!(
            "{}: {rows} x {toks} x {k}: {:.3} ms, {:.1} TFLOP/s of real products",
            form.kernel,
            secs * 1e3,
            2.0 * macs / secs / 1e12
        );
    }
}

/// A tile kernel of the probe, its decode form and how both are dispatched.
struct Form {
    kernel: &'static str,
    reference: &'static str,
    /// Rows x tokens per workgroup of `kernel`.
    tile: (usize, usize),
    /// Rows per workgroup of `reference` (one token each).
    per_wg: usize,
    /// x limbs per 32-value block with one scale per task (the second data set), else per
    /// 16-value segment with two.
    per_block: bool,
}

impl Form {
    const fn new(
        kernel: &'static str,
        reference: &'static str,
        tile: (usize, usize),
        per_wg: usize,
        per_block: bool,
    ) -> Self {
        Self {
            kernel,
            reference,
            tile,
            per_wg,
            per_block,
        }
    }

    fn groups(&self, rows: usize, toks: usize) -> (u32, u32) {
        ((rows / self.tile.0) as u32, (toks / self.tile.1) as u32)
    }
}

struct Data {
    w: wgpu::Buffer,
    s: wgpu::Buffer,
    xh: wgpu::Buffer,
    xl: wgpu::Buffer,
    e: wgpu::Buffer,
    params: wgpu::Buffer,
    e2: wgpu::Buffer,
    s2: wgpu::Buffer,
    host_w: Vec<i8>,
    host_s2: Vec<f32>,
    host_x: Vec<f32>,
}

impl Data {
    fn new(
        probe: &Probe,
        w: &[u8],
        s: &[f32],
        xh: &[f32],
        xl: &[f32],
        e: &[f32],
        params: [u32; 4],
    ) -> Self {
        let half = |v: &[f32]| -> Vec<u8> {
            let h: Vec<f16> = v.iter().map(|x| f16::from_f32(*x)).collect();
            bytemuck::cast_slice(&h).to_vec()
        };
        Self {
            w: probe.buffer(w),
            s: probe.buffer(bytemuck::cast_slice(s)),
            xh: probe.buffer(&half(xh)),
            xl: probe.buffer(&half(xl)),
            e: probe.buffer(bytemuck::cast_slice(e)),
            params: probe.buffer(bytemuck::cast_slice(&params)),
            e2: probe.buffer(&[]),
            s2: probe.buffer(&[]),
            host_w: Vec::new(),
            host_s2: Vec::new(),
            host_x: Vec::new(),
        }
    }

    /// Codes in -15..=15 (IQ3_S-like) with task scales near 1e-2; x of varied magnitude split into
    /// limbs per 16-value segment.
    fn random(probe: &Probe, rows: usize, toks: usize, k: usize, seed: u64, second: bool) -> Self {
        let mut rng = Rng(seed);
        let tasks = k / 32;
        let w: Vec<u8> = (0..rows * k).map(|_| rng.int(15) as i8 as u8).collect();
        let s: Vec<f32> = (0..rows * tasks * 2)
            .map(|_| 0.01 * (1.0 + rng.unit()))
            .collect();
        let mut xh = vec![0f32; toks * k];
        let mut xl = vec![0f32; toks * k];
        let mut e = vec![0f32; toks * k / 16 * 2];
        for t in 0..toks {
            for g in 0..k / 16 {
                let scale = 2f32.powi((rng.unit() * 12.0) as i32 - 6);
                let x: Vec<f32> = (0..16).map(|_| (rng.unit() * 2.0 - 1.0) * scale).collect();
                let (hi, lo, eh, el) = limbs(&x);
                for i in 0..16 {
                    xh[t * k + g * 16 + i] = hi[i];
                    xl[t * k + g * 16 + i] = lo[i];
                }
                e[(t * (k / 16) + g) * 2] = eh;
                e[(t * (k / 16) + g) * 2 + 1] = el;
            }
        }
        // The second form's x: limbs per 32 values (binding 2/3 hold them instead), one scale
        // per task, and the unsplit x for the host check.
        let mut xh2 = vec![0f32; toks * k];
        let mut xl2 = vec![0f32; toks * k];
        let mut e2 = vec![0f32; toks * k / 32 * 2];
        let mut host_x = vec![0f32; toks * k];
        for t in 0..toks {
            for g in 0..k / 32 {
                let scale = 2f32.powi((rng.unit() * 12.0) as i32 - 6);
                let x: Vec<f32> = (0..32).map(|_| (rng.unit() * 2.0 - 1.0) * scale).collect();
                let (hi, lo, eh, el) = limbs(&x);
                for i in 0..32 {
                    xh2[t * k + g * 32 + i] = hi[i];
                    xl2[t * k + g * 32 + i] = lo[i];
                    host_x[t * k + g * 32 + i] = x[i];
                }
                e2[(t * (k / 32) + g) * 2] = eh;
                e2[(t * (k / 32) + g) * 2 + 1] = el;
            }
        }
        let s2: Vec<f32> = (0..rows * tasks)
            .map(|_| 0.01 * (1.0 + rng.unit()))
            .collect();
        let params = [rows as u32, toks as u32, k as u32, tasks as u32];
        let mut data = Self::new(probe, &w, &s, &xh, &xl, &e, params);
        if second {
            data = Self::new(probe, &w, &s, &xh2, &xl2, &e, params);
        }
        data.e2 = probe.buffer(bytemuck::cast_slice(&e2));
        data.s2 = probe.buffer(bytemuck::cast_slice(&s2));
        data.host_w = w.iter().map(|b| *b as i8).collect();
        data.host_s2 = s2;
        data.host_x = host_x;
        data
    }
}

/// A segment's limbs: hi = round(x / eh), lo = round((x - hi * eh) / el) with
/// eh = 2^(E - 11), el = 2^(E - 22), E = the exponent of the largest |x| plus one.
fn limbs(x: &[f32]) -> (Vec<f32>, Vec<f32>, f32, f32) {
    let m = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    if m == 0.0 {
        return (vec![0.0; x.len()], vec![0.0; x.len()], 1.0, 1.0);
    }
    let e = m.log2().floor() as i32 + 1;
    let eh = 2f32.powi(e - 11);
    let el = 2f32.powi(e - 22);
    let hi: Vec<f32> = x.iter().map(|v| (v / eh).round_ties_even()).collect();
    let lo: Vec<f32> = x
        .iter()
        .zip(&hi)
        .map(|(v, h)| ((v - h * eh) / el).round_ties_even())
        .collect();
    (hi, lo, eh, el)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A uniform integer in -m..=m.
    fn int(&mut self, m: i64) -> f32 {
        ((self.next() % (2 * m as u64 + 1)) as i64 - m) as f32
    }
}
