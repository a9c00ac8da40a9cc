//! Warm start: the device is opened with its pipeline cache from `$OCTOFLOW_HOME/pipelines` (so a
//! second start skips the driver's compilation), the chains a command replays are recorded
//! before it accepts work (so the first request is not slower than the next), and the cache is
//! written back once they are built.

use std::time::Instant;

use anyhow::Context as _;
use octoflow_vk::{CacheLoad, Context, DeviceChoice};

/// Opens the device `gpu` names (or the best one) with its pipeline cache on disk; without a
/// cache folder (no `$OCTOFLOW_HOME` nor `$HOME`) the cache lives in memory only.
pub fn open_device(gpu: Option<usize>) -> anyhow::Result<Context> {
    let choice = gpu.map_or(DeviceChoice::Auto, DeviceChoice::Index);
    let ctx = match octoflow_hub::Cache::from_env() {
        Ok(cache) => Context::with_pipeline_cache(choice, &cache.pipelines_dir()),
        Err(e) => {
            tracing::warn!("pipelines are not cached on disk: {e}");
            Context::new(choice)
        }
    };
    let ctx = ctx.context("opening a Vulkan device (use --device cpu for the CPU reference)")?;
    if let CacheLoad::Rejected { .. } = ctx.pipeline_cache_load() {
        eprintln!("octoflow: warning: {}", ctx.pipeline_cache_load());
    }
    if ctx.caps().kind == octoflow_vk::DeviceKind::Cpu {
        // lavapipe and the like emulate the GPU on the CPU: the CPU path is the faster one
        eprintln!(
            "octoflow: note: {} is Vulkan on the CPU (no GPU found); `--device cpu` runs several \
             times faster here",
            ctx.caps().name
        );
    }
    Ok(ctx)
}

/// Writes the device's pipeline cache back to disk. A failure is only a warning: the next
/// start compiles the pipelines again.
pub fn save_pipelines(ctx: &Context) {
    match ctx.save_pipeline_cache() {
        Ok(Some((path, bytes))) => tracing::info!(
            "saved the pipeline cache ({} KiB) to {}",
            bytes / 1024,
            path.display()
        ),
        Ok(None) => {}
        Err(e) => eprintln!("octoflow: warning: {e}"),
    }
}

/// Runs `warm` (recording the chains a command replays, which builds their pipelines), prints
/// how long it took and what it built, and saves the pipeline cache.
pub fn warm_up(
    tag: &str,
    ctx: &Context,
    warm: impl FnOnce() -> anyhow::Result<usize>,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let built = ctx.pipelines_built();
    let chains = warm().context("warming up (recording the chains requests replay)")?;
    eprintln!(
        "{tag}: warm-up {:.2} s ({chains} chains recorded, {} pipeline(s) built; {})",
        t0.elapsed().as_secs_f64(),
        ctx.pipelines_built() - built,
        ctx.pipeline_cache_load()
    );
    save_pipelines(ctx);
    Ok(())
}
