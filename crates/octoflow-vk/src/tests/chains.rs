use super::{random_f32, rng};
use crate::test_shaders::{CONTROL_ADD, STOP_ARGS};
use crate::testing::{assert_no_validation_errors, gpu_or_skip};
use crate::{Buffer, Chain, Context, MemoryKind, Pipeline, PipelineDesc, Push, VkError};

fn control_add(ctx: &Context) -> Pipeline {
    Pipeline::new(ctx, &PipelineDesc::new(CONTROL_ADD, 3, 8)).unwrap()
}

fn f32_buffer(ctx: &Context, name: &str, n: usize) -> Buffer {
    Buffer::new(ctx, name, 4 * n as u64, MemoryKind::DeviceLocal).unwrap()
}

#[test]
fn a_chain_recorded_once_replays_with_new_control_values_each_submit() {
    let Some(ctx) = gpu_or_skip("chain_replays_with_new_control_values") else {
        return;
    };
    let (seed, mut r) = rng();
    let n = 1000;
    let x = random_f32(&mut r, n);
    let (xb, yb, zb) = (
        f32_buffer(&ctx, "x", n),
        f32_buffer(&ctx, "y", n),
        f32_buffer(&ctx, "z", n),
    );
    let ctrl = Buffer::new(&ctx, "ctrl", 8, MemoryKind::Upload).unwrap();
    ctx.upload(&xb, 0, &x).unwrap();
    let p = control_add(&ctx);
    let groups = ctx.groups_1d(n as u64, 64).unwrap();

    // y = x + ctrl[0]; z = y + ctrl[1]: two dependent steps, one barrier.
    let mut chain = Chain::new(&ctx).unwrap();
    chain
        .dispatch(
            &p,
            &[xb.whole(), yb.whole(), ctrl.whole()],
            &Push::new().u32(n as u32).u32(0),
            groups,
        )
        .unwrap();
    chain.barrier().unwrap();
    chain
        .dispatch(
            &p,
            &[yb.whole(), zb.whole(), ctrl.whole()],
            &Push::new().u32(n as u32).u32(1),
            groups,
        )
        .unwrap();
    assert_eq!(chain.dispatch_count(), 2);

    for step in 0..5 {
        let c = random_f32(&mut r, 2);
        ctrl.write(0, &c).unwrap();
        ctx.fill(&zb, 0, zb.size(), f32::NAN.to_bits()).unwrap();
        chain.run().unwrap();
        let mut z = vec![0f32; n];
        ctx.download(&zb, 0, &mut z).unwrap();
        for (i, (&zi, &xi)) in z.iter().zip(&x).enumerate() {
            let want = (xi + c[0]) + c[1];
            let ok = (zi - want).abs() <= 1e-6 * want.abs().max(1.0);
            assert!(ok, "step {step} element {i}: {zi} vs {want} (seed {seed})");
        }
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn an_indirect_dispatch_becomes_a_no_op_when_the_stop_flag_is_set() {
    let Some(ctx) = gpu_or_skip("indirect_dispatch_stop_flag") else {
        return;
    };
    let n = 256;
    let (xb, yb) = (f32_buffer(&ctx, "x", n), f32_buffer(&ctx, "y", n));
    ctx.fill(&xb, 0, xb.size(), 1.0f32.to_bits()).unwrap();
    let ctrl = Buffer::new(&ctx, "ctrl", 8, MemoryKind::Upload).unwrap();
    let args = f32_buffer(&ctx, "args", 3);
    let add = control_add(&ctx);
    let stop = Pipeline::new(&ctx, &PipelineDesc::new(STOP_ARGS, 2, 4)).unwrap();

    let mut chain = Chain::new(&ctx).unwrap();
    chain
        .dispatch(
            &stop,
            &[ctrl.slice(0, 4).unwrap(), args.whole()],
            &Push::new().u32(n as u32 / 64),
            [1, 1, 1],
        )
        .unwrap();
    chain.barrier().unwrap();
    let push = Push::new().u32(n as u32).u32(1);
    chain
        .dispatch_indirect(
            &add,
            &[xb.whole(), yb.whole(), ctrl.whole()],
            &push,
            &args.whole(),
        )
        .unwrap();

    for (flag, want) in [(0u32, 1.0f32 + 2.0), (1, -7.0), (0, 1.0 + 2.0)] {
        ctrl.write(0, &[flag]).unwrap();
        ctrl.write(4, &[2.0f32]).unwrap();
        ctx.fill(&yb, 0, yb.size(), (-7.0f32).to_bits()).unwrap();
        chain.run().unwrap();
        let mut y = vec![0f32; n];
        ctx.download(&yb, 0, &mut y).unwrap();
        assert!(
            y.iter().all(|&v| v == want),
            "stop flag {flag}: got {:?}, want {want}",
            &y[..4]
        );
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn fills_and_copies_inside_a_chain_are_ordered_by_barriers() {
    let Some(ctx) = gpu_or_skip("fills_and_copies_inside_a_chain") else {
        return;
    };
    let a = f32_buffer(&ctx, "a", 64);
    let b = f32_buffer(&ctx, "b", 64);
    let mut chain = Chain::new(&ctx).unwrap();
    chain.fill(&a.whole(), 5).unwrap();
    chain.barrier().unwrap();
    chain.copy(&a.slice(0, 128).unwrap(), &b, 128).unwrap();
    chain.fill(&b.slice(0, 128).unwrap(), 9).unwrap();
    chain.run().unwrap();
    let mut out = vec![0u32; 64];
    ctx.download(&b, 0, &mut out).unwrap();
    assert!(
        out[..32].iter().all(|&v| v == 9) && out[32..].iter().all(|&v| v == 5),
        "{out:?}"
    );
}

#[test]
fn mismatched_dispatches_are_clear_errors() {
    let Some(ctx) = gpu_or_skip("mismatched_dispatches") else {
        return;
    };
    let p = control_add(&ctx);
    let x = f32_buffer(&ctx, "x", 64);
    let mut chain = Chain::new(&ctx).unwrap();
    let push = Push::new().u32(64).u32(0);
    let err = chain
        .dispatch(&p, &[x.whole(), x.whole()], &push, [1, 1, 1])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("2 bindings given, the pipeline has 3"),
        "{err}"
    );
    let err = chain
        .dispatch(
            &p,
            &[x.whole(), x.whole(), x.whole()],
            &Push::new().u32(1),
            [1, 1, 1],
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("4 push-constant bytes given"),
        "{err}"
    );
    if ctx.caps().storage_offset_alignment > 4 {
        let odd = x.slice(4, 64).unwrap();
        let err = chain
            .dispatch(&p, &[odd, x.whole(), x.whole()], &push, [1, 1, 1])
            .unwrap_err();
        assert!(err.to_string().contains("not a multiple"), "{err}");
    }
    chain.run().unwrap();
    let err = chain.barrier().unwrap_err();
    assert!(matches!(err, VkError::BadDispatch { .. }), "{err}");
}

#[test]
fn dropping_a_pending_chain_waits_and_keeps_its_buffers_alive_until_then() {
    let Some(ctx) = gpu_or_skip("dropping_a_pending_chain") else {
        return;
    };
    let p = control_add(&ctx);
    let n = 1 << 16;
    let mut chain = Chain::new(&ctx).unwrap();
    {
        let (x, y) = (f32_buffer(&ctx, "x", n), f32_buffer(&ctx, "y", n));
        let c = Buffer::new(&ctx, "ctrl", 4, MemoryKind::Upload).unwrap();
        let groups = ctx.groups_1d(n as u64, 64).unwrap();
        chain
            .dispatch(
                &p,
                &[x.whole(), y.whole(), c.whole()],
                &Push::new().u32(n as u32).u32(0),
                groups,
            )
            .unwrap();
    }
    chain.submit().unwrap();
    drop(chain);
    assert_eq!(
        ctx.memory_usage().0,
        0,
        "buffers freed once the chain is gone"
    );
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_gated_span_dispatches_through_its_args_slots_and_zeros_make_it_a_no_op() {
    let Some(ctx) = gpu_or_skip("gated_span") else {
        return;
    };
    let n = 300;
    let (xb, yb, zb) = (
        f32_buffer(&ctx, "x", n),
        f32_buffer(&ctx, "y", n),
        f32_buffer(&ctx, "z", n),
    );
    ctx.fill(&xb, 0, xb.size(), 1.0f32.to_bits()).unwrap();
    let ctrl = Buffer::new(&ctx, "ctrl", 8, MemoryKind::Upload).unwrap();
    ctrl.write(0, &[2.0f32, 3.0]).unwrap();
    let args = Buffer::new(&ctx, "args", 24, MemoryKind::Upload).unwrap();
    let p = control_add(&ctx);
    let groups = ctx.groups_1d(n as u64, 64).unwrap();

    let mut chain = Chain::new(&ctx).unwrap();
    chain.gate_begin(&args).unwrap();
    assert!(chain.gate_begin(&args).is_err(), "spans do not nest");
    chain
        .dispatch(
            &p,
            &[xb.whole(), yb.whole(), ctrl.whole()],
            &Push::new().u32(n as u32).u32(0),
            groups,
        )
        .unwrap();
    chain.barrier().unwrap();
    chain
        .dispatch(
            &p,
            &[yb.whole(), zb.whole(), ctrl.whole()],
            &Push::new().u32(n as u32).u32(1),
            [groups[0] + 1, groups[1], 1],
        )
        .unwrap();
    let template = chain.gate_end().unwrap();
    assert_eq!(template, vec![groups, [groups[0] + 1, groups[1], 1]]);
    assert!(chain.gate_end().is_err());

    for (open, want) in [(true, 6.0f32), (false, -1.0), (true, 6.0)] {
        let words = if open {
            crate::gate_words(&template)
        } else {
            vec![0; 6]
        };
        args.write(0, &words).unwrap();
        ctx.fill(&zb, 0, zb.size(), (-1.0f32).to_bits()).unwrap();
        chain.run().unwrap();
        let mut z = vec![0f32; n];
        ctx.download(&zb, 0, &mut z).unwrap();
        assert!(z.iter().all(|&v| v == want), "open {open}: {:?}", &z[..4]);
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_gated_span_larger_than_its_args_buffer_is_a_clear_error() {
    let Some(ctx) = gpu_or_skip("gated_span_too_small") else {
        return;
    };
    let x = f32_buffer(&ctx, "x", 64);
    let args = Buffer::new(&ctx, "tiny-args", 12, MemoryKind::Upload).unwrap();
    let p = control_add(&ctx);
    let mut chain = Chain::new(&ctx).unwrap();
    chain.gate_begin(&args).unwrap();
    let push = Push::new().u32(64).u32(0);
    let b = [x.whole(), x.whole(), x.whole()];
    chain.dispatch(&p, &b, &push, [1, 1, 1]).unwrap();
    let err = chain.dispatch(&p, &b, &push, [1, 1, 1]).unwrap_err();
    assert!(err.to_string().contains("tiny-args"), "{err}");
    assert!(chain.finish().is_err(), "an open span cannot be finished");
}

#[test]
fn chains_on_different_queues_are_both_in_flight_and_give_their_own_results() {
    let Some(ctx) = gpu_or_skip("chains_on_different_queues") else {
        return;
    };
    let count = ctx.queue_count();
    assert!((1..=crate::MAX_QUEUES).contains(&count), "{count} queues");
    let (seed, mut r) = rng();
    let n = 777;
    let p = control_add(&ctx);
    let groups = ctx.groups_1d(n as u64, 64).unwrap();
    // three chains on queues 0, 1, 2 (modulo the count: lavapipe has one queue)
    let mut runs = Vec::new();
    for q in 0..3 {
        let x = random_f32(&mut r, n);
        let (xb, yb) = (f32_buffer(&ctx, "x", n), f32_buffer(&ctx, "y", n));
        ctx.upload(&xb, 0, &x).unwrap();
        ctx.fill(&yb, 0, yb.size(), f32::NAN.to_bits()).unwrap();
        let ctrl = Buffer::new(&ctx, "ctrl", 8, MemoryKind::Upload).unwrap();
        let c = random_f32(&mut r, 2);
        ctrl.write(0, &c).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        chain.set_queue(q).unwrap();
        assert_eq!(chain.queue(), q % count);
        chain
            .dispatch(
                &p,
                &[xb.whole(), yb.whole(), ctrl.whole()],
                &Push::new().u32(n as u32).u32(0),
                groups,
            )
            .unwrap();
        runs.push((chain, x, c[0], yb, ctrl, xb));
    }
    for run in &mut runs {
        run.0.submit().unwrap();
    }
    for (q, (chain, x, c, yb, _, _)) in runs.iter_mut().enumerate() {
        chain.wait().unwrap();
        let mut y = vec![0f32; n];
        ctx.download(yb, 0, &mut y).unwrap();
        for (i, (&yi, &xi)) in y.iter().zip(x.iter()).enumerate() {
            let want = xi + *c;
            let ok = (yi - want).abs() <= 1e-6 * want.abs().max(1.0);
            assert!(ok, "queue {q} element {i}: {yi} vs {want} (seed {seed})");
        }
    }
    ctx.wait_idle().unwrap();
    assert_no_validation_errors(&ctx);
}
