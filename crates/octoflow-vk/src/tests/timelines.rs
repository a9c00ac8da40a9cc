use super::{random_f32, rng};
use crate::test_shaders::CONTROL_ADD;
use crate::testing::{assert_no_validation_errors, gpu_or_skip};
use crate::{Buffer, Chain, Context, MemoryKind, Pipeline, PipelineDesc, Push, Timeline};

/// `dst = src + ctrl[at]` over `n` floats.
fn add_chain(
    ctx: &Context,
    p: &Pipeline,
    (src, dst, ctrl): (&Buffer, &Buffer, &Buffer),
    n: usize,
    at: u32,
    host_written: bool,
) -> Chain {
    let mut chain = Chain::new(ctx).unwrap();
    if host_written {
        chain.host_barrier().unwrap();
    } else {
        chain.barrier().unwrap();
    }
    let groups = ctx.groups_1d(n as u64, 64).unwrap();
    chain
        .dispatch(
            p,
            &[src.whole(), dst.whole(), ctrl.whole()],
            &Push::new().u32(n as u32).u32(at),
            groups,
        )
        .unwrap();
    chain.finish().unwrap();
    chain
}

#[test]
fn a_chain_held_for_a_host_signal_runs_once_given_it_and_sees_what_the_host_wrote_meanwhile() {
    let Some(ctx) = gpu_or_skip("timeline_host_signal") else {
        return;
    };
    let (seed, mut r) = rng();
    let n = 1000;
    let x = random_f32(&mut r, n);
    let xb = Buffer::new(&ctx, "x", 4 * n as u64, MemoryKind::DeviceLocal).unwrap();
    let yb = Buffer::new(&ctx, "y", 4 * n as u64, MemoryKind::DeviceLocal).unwrap();
    let zb = Buffer::new(&ctx, "z", 4 * n as u64, MemoryKind::Readback).unwrap();
    let ctrl = Buffer::new(&ctx, "ctrl", 8, MemoryKind::Upload).unwrap();
    ctx.upload(&xb, 0, &x).unwrap();
    let p = Pipeline::new(&ctx, &PipelineDesc::new(CONTROL_ADD, 3, 8)).unwrap();
    let mut head = add_chain(&ctx, &p, (&xb, &yb, &ctrl), n, 0, false);
    let mut tail = add_chain(&ctx, &p, (&yb, &zb, &ctrl), n, 1, true);
    let t = Timeline::new(&ctx).unwrap();
    for round in 1..=3u64 {
        let c = random_f32(&mut r, 2);
        ctrl.write(0, &[c[0], f32::NAN]).unwrap();
        zb.write(0, &vec![f32::NAN; n]).unwrap();
        head.submit().unwrap();
        tail.submit_after(&t, round).unwrap();
        // waited on in the driver, or asleep between checks of the fence
        let nap = std::time::Duration::from_micros(50);
        if round % 2 == 1 {
            head.wait_sleeping(nap).unwrap();
        } else {
            head.wait().unwrap();
        }
        // the tail has not run: its output is still the poison, and waiting for it is an
        // error rather than a hang
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut z = vec![0f32; n];
        zb.read(0, &mut z).unwrap();
        assert!(
            z.iter().all(|v| v.is_nan()),
            "round {round}: ran before the signal"
        );
        let err = tail.wait().unwrap_err().to_string();
        assert!(err.contains("host signal"), "{err}");
        let err = tail.wait_sleeping(nap).unwrap_err().to_string();
        assert!(err.contains("host signal"), "{err}");
        // written after the submit, before the signal
        ctrl.write(4, &[c[1]]).unwrap();
        t.signal(round).unwrap();
        if round % 2 == 0 {
            tail.wait_sleeping(nap).unwrap();
        } else {
            tail.wait().unwrap();
        }
        zb.read(0, &mut z).unwrap();
        for (i, (&zi, &xi)) in z.iter().zip(&x).enumerate() {
            let want = (xi + c[0]) + c[1];
            let ok = (zi - want).abs() <= 1e-6 * want.abs().max(1.0);
            assert!(
                ok,
                "round {round} element {i}: {zi} vs {want} (seed {seed})"
            );
        }
    }
    assert_eq!(t.value().unwrap(), 3);
    let err = t.signal(3).unwrap_err().to_string();
    assert!(err.contains("does not exceed"), "{err}");
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_chain_dropped_while_held_for_a_host_signal_releases_itself() {
    let Some(ctx) = gpu_or_skip("timeline_drop") else {
        return;
    };
    let n = 64;
    let xb = Buffer::new(&ctx, "x", 4 * n as u64, MemoryKind::DeviceLocal).unwrap();
    let yb = Buffer::new(&ctx, "y", 4 * n as u64, MemoryKind::DeviceLocal).unwrap();
    let ctrl = Buffer::new(&ctx, "ctrl", 8, MemoryKind::Upload).unwrap();
    let p = Pipeline::new(&ctx, &PipelineDesc::new(CONTROL_ADD, 3, 8)).unwrap();
    let t = Timeline::new(&ctx).unwrap();
    let mut held = add_chain(&ctx, &p, (&xb, &yb, &ctrl), n, 0, true);
    held.submit_after(&t, 7).unwrap();
    drop(held);
    assert_eq!(t.value().unwrap(), 7);
    // the queue drained: later work runs
    let mut after = add_chain(&ctx, &p, (&xb, &yb, &ctrl), n, 0, false);
    after.run().unwrap();
    assert_no_validation_errors(&ctx);
}
