use half::f16;

use super::{random_f32, rng};
use crate::test_shaders::{COOPMAT_MUL, SUBGROUP_SUM};
use crate::testing::{assert_no_validation_errors, gpu_or_skip};
use crate::{Buffer, Chain, MemoryKind, Pipeline, PipelineDesc, Push};

#[test]
fn subgroup_reductions_sum_correctly_at_every_selectable_subgroup_size() {
    let Some(ctx) = gpu_or_skip("subgroup_reductions_sum_correctly") else {
        return;
    };
    let sg = ctx.caps().subgroup.clone();
    assert!(
        sg.has("arithmetic"),
        "kernels rely on subgroup arithmetic: {sg:?}"
    );
    let (seed, mut r) = rng();
    let (n, wg) = (10_000usize, 128u32);
    let x = random_f32(&mut r, n);
    let groups = (n as u32).div_ceil(wg);
    let xb = Buffer::new(&ctx, "x", 4 * n as u64, MemoryKind::DeviceLocal).unwrap();
    let pb = Buffer::new(
        &ctx,
        "partial",
        4 * u64::from(groups),
        MemoryKind::DeviceLocal,
    )
    .unwrap();
    ctx.upload(&xb, 0, &x).unwrap();
    let mut sizes = vec![None];
    if sg.size_control {
        sizes.extend(
            (0..8)
                .map(|k| 1u32 << k)
                .filter(|s| (sg.min_size..=sg.max_size).contains(s))
                .map(Some),
        );
    }
    let spec = [wg];
    for size in sizes {
        let mut desc = PipelineDesc::new(SUBGROUP_SUM, 2, 4).spec(&spec);
        desc.subgroup_size = size;
        let p = Pipeline::new(&ctx, &desc).unwrap();
        ctx.fill(&pb, 0, pb.size(), f32::NAN.to_bits()).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        chain
            .dispatch(
                &p,
                &[xb.whole(), pb.whole()],
                &Push::new().u32(n as u32),
                [groups, 1, 1],
            )
            .unwrap();
        chain.run().unwrap();
        let mut got = vec![0f32; groups as usize];
        ctx.download(&pb, 0, &mut got).unwrap();
        for (g, &v) in got.iter().enumerate() {
            let want: f32 = x[g * wg as usize..((g + 1) * wg as usize).min(n)]
                .iter()
                .sum();
            assert!(
                (v - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "subgroup size {size:?}, group {g}: {v} vs {want} (seed {seed})"
            );
        }
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn cooperative_matrix_tiles_multiply_where_the_device_has_them() {
    let Some(ctx) = gpu_or_skip("cooperative_matrix_tiles_multiply") else {
        return;
    };
    if !ctx.caps().coopmat_supports(16, 16, 16, "f16", "f32") {
        println!(
            "skipped cooperative_matrix_tiles_multiply: {} has no 16x16x16 f16→f32 coopmat",
            ctx.caps().name
        );
        return;
    }
    let (seed, mut r) = rng();
    let a = random_f32(&mut r, 256);
    let b = random_f32(&mut r, 256);
    let (ah, bh): (Vec<f16>, Vec<f16>) = (
        a.iter().map(|&v| f16::from_f32(v)).collect(),
        b.iter().map(|&v| f16::from_f32(v)).collect(),
    );
    let ab = Buffer::new(&ctx, "a", 512, MemoryKind::DeviceLocal).unwrap();
    let bb = Buffer::new(&ctx, "b", 512, MemoryKind::DeviceLocal).unwrap();
    let cb = Buffer::new(&ctx, "c", 1024, MemoryKind::DeviceLocal).unwrap();
    ctx.upload(&ab, 0, &ah).unwrap();
    ctx.upload(&bb, 0, &bh).unwrap();
    ctx.fill(&cb, 0, 1024, f32::NAN.to_bits()).unwrap();
    let p = Pipeline::new(
        &ctx,
        &PipelineDesc::new(COOPMAT_MUL, 3, 0).spec(&[ctx.caps().subgroup.size]),
    )
    .unwrap();
    let mut chain = Chain::new(&ctx).unwrap();
    chain
        .dispatch(&p, &[ab.whole(), bb.whole(), cb.whole()], &[], [1, 1, 1])
        .unwrap();
    chain.run().unwrap();
    let mut c = vec![0f32; 256];
    ctx.download(&cb, 0, &mut c).unwrap();
    for i in 0..16 {
        for j in 0..16 {
            let want: f32 = (0..16)
                .map(|k| ah[i * 16 + k].to_f32() * bh[k * 16 + j].to_f32())
                .sum();
            let got = c[i * 16 + j];
            assert!(
                (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                "c[{i}][{j}] = {got} vs {want} (seed {seed})"
            );
        }
    }
    assert_no_validation_errors(&ctx);
}
