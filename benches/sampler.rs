//! Host sampling over a whole vocabulary row (248,320 logits, the model's): `cargo bench --bench
//! sampler`. One token per iteration, as a decode step with a sampled request pays it:
//!
//! * `default`: temperature 0.6, top-k 20, top-p 0.95 (the defaults without model metadata);
//! * `no_top_k_peaked`: top-k off, top-p 0.95, on a peaked row (a few high logits over a low
//!   bulk, as a trained model gives): the total mass is summed once and only a short sorted
//!   prefix is needed;
//! * `no_top_k_flat`: the same cuts on a flat row, whose nucleus holds thousands of tokens;
//! * `temperature_only`: no cut at all, every token sorted.

use strata::sampler::{Sampler, SamplingParams};

const VOCAB: usize = 248_320;

fn main() {
    divan::main();
}

fn flat_row() -> Vec<f32> {
    let mut s = 12345u64;
    (0..VOCAB)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / 16_777_216.0) * 20.0 - 10.0
        })
        .collect()
}

fn peaked_row() -> Vec<f32> {
    flat_row()
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            if i % 24_000 == 7 {
                14.0 + (i / 24_000) as f32 * 0.5
            } else {
                l * 0.3
            }
        })
        .collect()
}

fn run(bencher: divan::Bencher, row: Vec<f32>, top_k: usize, top_p: f32) {
    let params = SamplingParams {
        top_k,
        top_p,
        seed: Some(1),
        ..SamplingParams::default()
    };
    let sampler = Sampler::new(&params, &[]).expect("valid parameters");
    let mut position = 0;
    bencher.bench_local(|| {
        position += 1;
        sampler.pick(&row, position).expect("a token")
    });
}

#[divan::bench(sample_count = 20)]
fn default(bencher: divan::Bencher) {
    run(bencher, flat_row(), 20, 0.95);
}

#[divan::bench(sample_count = 20)]
fn no_top_k_peaked(bencher: divan::Bencher) {
    run(bencher, peaked_row(), 0, 0.95);
}

#[divan::bench(sample_count = 10)]
fn no_top_k_flat(bencher: divan::Bencher) {
    run(bencher, flat_row(), 0, 0.95);
}

#[divan::bench(sample_count = 10)]
fn temperature_only(bencher: divan::Bencher) {
    run(bencher, flat_row(), 0, 1.0);
}
