//! Tests that run on a Vulkan device (lavapipe in CI). Each fails with the reason when there is
//! no device, unless `OCTOFLOW_SKIP_GPU_TESTS=1`.

mod buffers;
mod chains;
mod devices;
mod pipeline_cache;
mod pipelines;
mod profiling;
mod subgroups;
mod timelines;

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

/// A fresh empty folder under the system's temporary folder, removed when dropped.
pub(crate) struct TempDir(std::path::PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> Self {
        let unique: u64 = rand::random();
        let path = std::env::temp_dir().join(format!("octoflow-vk-{name}-{unique:016x}"));
        std::fs::create_dir_all(&path).expect("create a temporary folder");
        TempDir(path)
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
