//! The pipeline cache on disk, on a real device: what one context saves, the next one loads and
//! builds working pipelines from; a corrupt or foreign file leaves an empty cache that works.

use std::path::Path;

use crate::test_shaders::CONTROL_ADD;
use crate::testing::{assert_no_validation_errors, gpu_or_skip};
use crate::{
    Buffer, CacheLoad, Chain, Context, DeviceChoice, MemoryKind, Pipeline, PipelineDesc, Push,
};

/// Builds a pipeline on `ctx` and checks it computes `x + c` (so a pipeline that came out of a
/// loaded cache is shown to work, not only to exist).
fn builds_a_working_pipeline(ctx: &Context) {
    let p = Pipeline::new(ctx, &PipelineDesc::new(CONTROL_ADD, 3, 8)).unwrap();
    let n = 64usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let dev = |name| Buffer::new(ctx, name, 4 * n as u64, MemoryKind::DeviceLocal).unwrap();
    let (xb, yb) = (dev("x"), dev("y"));
    let ctrl = Buffer::new(ctx, "ctrl", 8, MemoryKind::Upload).unwrap();
    ctx.upload(&xb, 0, &x).unwrap();
    ctrl.write(0, &[0.5f32, 0.0]).unwrap();
    let mut chain = Chain::new(ctx).unwrap();
    let groups = ctx.groups_1d(n as u64, 64).unwrap();
    let push = Push::new().u32(n as u32).u32(0);
    chain
        .dispatch(&p, &[xb.whole(), yb.whole(), ctrl.whole()], &push, groups)
        .unwrap();
    chain.run().unwrap();
    let mut y = vec![0f32; n];
    ctx.download(&yb, 0, &mut y).unwrap();
    for (i, v) in y.iter().enumerate() {
        assert_eq!(*v, i as f32 + 0.5, "element {i}");
    }
    assert_no_validation_errors(ctx);
}

/// Opens the device with the cache in `dir`, builds and runs a pipeline, saves.
fn open_build_save(dir: &Path) -> (Context, Option<(std::path::PathBuf, usize)>) {
    let ctx = Context::with_pipeline_cache(DeviceChoice::Auto, dir).unwrap();
    builds_a_working_pipeline(&ctx);
    let saved = ctx.save_pipeline_cache().unwrap();
    (ctx, saved)
}

#[test]
fn a_saved_cache_is_loaded_by_the_next_start_and_builds_pipelines() {
    let Some(_) = gpu_or_skip("pipeline_cache_round_trip") else {
        return;
    };
    let dir = crate::tests::TempDir::new("pipeline_cache");
    let (first, saved) = open_build_save(dir.path());
    assert!(
        matches!(first.pipeline_cache_load(), CacheLoad::Missing(_)),
        "{}",
        first.pipeline_cache_load()
    );
    let (path, bytes) = saved.expect("the first start writes the cache");
    assert!(bytes >= 32, "{bytes} bytes: not even a header");
    assert_eq!(std::fs::read(&path).unwrap().len(), bytes);
    let (second, _) = open_build_save(dir.path());
    assert_eq!(
        second.pipeline_cache_load(),
        &CacheLoad::Loaded { path, bytes },
    );
}

#[test]
fn a_corrupt_or_truncated_cache_file_is_ignored_with_an_empty_cache() {
    let Some(_) = gpu_or_skip("pipeline_cache_corrupt") else {
        return;
    };
    let dir = crate::tests::TempDir::new("pipeline_cache");
    let (_, saved) = open_build_save(dir.path());
    let (path, _) = saved.expect("the first start writes the cache");
    let good = std::fs::read(&path).unwrap();
    for (what, bad) in [
        ("garbage", vec![0xA5u8; 4096]),
        ("truncated", good[..good.len().min(20)].to_vec()),
        ("empty", Vec::new()),
    ] {
        std::fs::write(&path, &bad).unwrap();
        let ctx = Context::with_pipeline_cache(DeviceChoice::Auto, dir.path()).unwrap();
        assert!(
            matches!(ctx.pipeline_cache_load(), CacheLoad::Rejected { .. }),
            "{what}: {}",
            ctx.pipeline_cache_load()
        );
        builds_a_working_pipeline(&ctx);
        // the next save replaces the bad file with one the start after loads
        ctx.save_pipeline_cache().unwrap();
        let next = Context::with_pipeline_cache(DeviceChoice::Auto, dir.path()).unwrap();
        assert!(
            matches!(next.pipeline_cache_load(), CacheLoad::Loaded { .. }),
            "{what}, saved again: {}",
            next.pipeline_cache_load()
        );
    }
}

#[test]
fn a_cache_from_another_device_is_ignored() {
    let Some(_) = gpu_or_skip("pipeline_cache_foreign") else {
        return;
    };
    let dir = crate::tests::TempDir::new("pipeline_cache");
    let (_, saved) = open_build_save(dir.path());
    let (path, _) = saved.expect("the first start writes the cache");
    let mut foreign = std::fs::read(&path).unwrap();
    foreign[16] ^= 0xFF; // another driver build's pipelineCacheUUID
    std::fs::write(&path, &foreign).unwrap();
    let ctx = Context::with_pipeline_cache(DeviceChoice::Auto, dir.path()).unwrap();
    let load = ctx.pipeline_cache_load();
    assert!(
        matches!(load, CacheLoad::Rejected { reason, .. } if reason.contains("pipelineCacheUUID")),
        "{load}"
    );
    builds_a_working_pipeline(&ctx);
}
