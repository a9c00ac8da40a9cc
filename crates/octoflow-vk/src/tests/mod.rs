//! Tests that run on a Vulkan device (lavapipe in CI). Each fails with the reason when there is
//! no device, unless `OCTOFLOW_SKIP_GPU_TESTS=1`.

mod buffers;
mod chains;
mod devices;
mod pipeline_cache;
mod pipelines;
mod profiling;
mod subgroups;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A fresh seed for this run and its generator; print the seed in every assertion message.
pub(crate) fn rng() -> (u64, StdRng) {
    let seed: u64 = rand::random();
    (seed, StdRng::seed_from_u64(seed))
}

/// `n` floats uniform in [-1, 1).
pub(crate) fn random_f32(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}
