use crate::test_shaders::CONTROL_ADD;
use crate::testing::gpu_or_skip;
use crate::{summarize, Buffer, Chain, MemoryKind, Pipeline, PipelineDesc, Push, VkError};

#[test]
fn profiled_chains_time_every_dispatch_under_its_label() {
    let Some(ctx) = gpu_or_skip("profiled_chains_time_every_dispatch") else {
        return;
    };
    if !ctx.caps().timestamps {
        let err = Chain::with_profiling(&ctx).err().unwrap();
        assert!(matches!(err, VkError::NoTimestamps { .. }), "{err}");
        return;
    }
    let n = 1 << 16;
    let add = Pipeline::new(&ctx, &PipelineDesc::new(CONTROL_ADD, 3, 8)).unwrap();
    let norm = Pipeline::new(&ctx, &PipelineDesc::new(CONTROL_ADD, 3, 8).label("other")).unwrap();
    let x = Buffer::new(&ctx, "x", 4 * n, MemoryKind::DeviceLocal).unwrap();
    let y = Buffer::new(&ctx, "y", 4 * n, MemoryKind::DeviceLocal).unwrap();
    let c = Buffer::new(&ctx, "c", 4, MemoryKind::Upload).unwrap();
    let groups = ctx.groups_1d(n, 64).unwrap();
    let push = Push::new().u32(n as u32).u32(0);
    let binds = [x.whole(), y.whole(), c.whole()];

    let mut chain = Chain::with_profiling(&ctx).unwrap();
    for layer in 0..3 {
        chain.set_scope(Some(&format!("layer{layer}")));
        chain.dispatch(&add, &binds, &push, groups).unwrap();
        chain.set_cost(8 * n, n);
        chain.barrier().unwrap();
        chain.dispatch(&norm, &binds, &push, groups).unwrap();
    }
    chain.set_scope(None);
    chain.dispatch(&add, &binds, &push, groups).unwrap();
    for _ in 0..2 {
        chain.run().unwrap();
        let times = chain.timings().unwrap().unwrap();
        let labels: Vec<&str> = times.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "layer0/control_add",
                "layer0/other",
                "layer1/control_add",
                "layer1/other",
                "layer2/control_add",
                "layer2/other",
                "control_add"
            ]
        );
        assert!(
            times.iter().all(|t| t.ns.is_finite() && t.ns >= 0.0),
            "{times:?}"
        );
        assert!(times.iter().map(|t| t.ns).sum::<f64>() > 0.0, "{times:?}");
        assert_eq!(summarize(&times).len(), 7);
        // costs stay with their dispatches: the `add`s of the layers declared one, the rest not
        let costs: Vec<u64> = times.iter().map(|t| t.cost.bytes).collect();
        assert_eq!(costs, [8 * n, 0, 8 * n, 0, 8 * n, 0, 0]);
        let floors = crate::summarize_at(&times, (1e9, 1e12));
        let l0 = floors
            .iter()
            .find(|l| l.label == "layer0/control_add")
            .unwrap();
        assert_eq!(l0.floor_ns, Some(8.0 * n as f64));
        let last = floors.iter().find(|l| l.label == "control_add").unwrap();
        assert_eq!(last.floor_ns, None);
    }
}

#[test]
fn chains_without_profiling_report_no_timings() {
    let Some(ctx) = gpu_or_skip("chains_without_profiling") else {
        return;
    };
    let mut chain = Chain::new(&ctx).unwrap();
    chain.run().unwrap();
    assert!(chain.timings().unwrap().is_none());
}

#[test]
fn a_span_timed_chain_reports_its_whole_gpu_time_each_submit() {
    let Some(ctx) = gpu_or_skip("a_span_timed_chain_reports_its_whole_gpu_time") else {
        return;
    };
    if !ctx.caps().timestamps {
        let err = Chain::with_span_timing(&ctx).err().unwrap();
        assert!(matches!(err, VkError::NoTimestamps { .. }), "{err}");
        return;
    }
    let n = 1 << 16;
    let add = Pipeline::new(&ctx, &PipelineDesc::new(CONTROL_ADD, 3, 8)).unwrap();
    let x = Buffer::new(&ctx, "x", 4 * n, MemoryKind::DeviceLocal).unwrap();
    let y = Buffer::new(&ctx, "y", 4 * n, MemoryKind::DeviceLocal).unwrap();
    let c = Buffer::new(&ctx, "c", 4, MemoryKind::Upload).unwrap();
    let groups = ctx.groups_1d(n, 64).unwrap();
    let push = Push::new().u32(n as u32).u32(0);
    let binds = [x.whole(), y.whole(), c.whole()];
    let mut chain = Chain::with_span_timing(&ctx).unwrap();
    for _ in 0..8 {
        chain.dispatch(&add, &binds, &push, groups).unwrap();
        chain.barrier().unwrap();
    }
    assert!(chain.span_ns().is_err(), "no span before the chain ran");
    for _ in 0..2 {
        chain.run().unwrap();
        let ns = chain.span_ns().unwrap().unwrap();
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
        assert!(ns < 10e9, "{ns} ns for 8 small dispatches");
    }
    let mut plain = Chain::new(&ctx).unwrap();
    plain.dispatch(&add, &binds, &push, groups).unwrap();
    plain.run().unwrap();
    assert_eq!(plain.span_ns().unwrap(), None);
}
