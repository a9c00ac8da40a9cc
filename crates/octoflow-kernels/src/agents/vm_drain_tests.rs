use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
use octoflow_vk::{Buffer, Chain, MemoryKind};
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::agents::layout::*;

/// A random state for the drain: `(hdr, inst, arena, events)`. The ring's read cursor is near
/// u32's wrap-around, its unread count may exceed its capacity, spans may reach past the arena
/// (`bad`), and the generated counters carry into their high words when summed.
fn state(rng: &mut StdRng, bad: bool) -> (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) {
    let cap = [0u32, 1, 7, 64, 300][rng.gen_range(0..5)];
    let arena_len = rng.gen_range(1..2000u32);
    let arena: Vec<u32> = (0..arena_len).map(|_| rng.gen()).collect();
    let n = [0u32, 1, 9, 300, 700][rng.gen_range(0..5)];
    let mut hdr: Vec<u32> = (0..H_WORDS).map(|_| rng.gen()).collect();
    let read = u32::MAX - rng.gen_range(0..2 * cap.max(1));
    let pending = rng.gen_range(0..=cap + 3);
    hdr[H_N as usize] = n;
    hdr[H_EV_CAP as usize] = cap;
    hdr[H_EV_READ as usize] = read;
    hdr[H_EV_HEAD as usize] = read.wrapping_add(pending);
    hdr[H_ARENA_CAP as usize] = arena_len;
    let mut inst = vec![0u32; (n * INST_WORDS) as usize];
    for w in inst.iter_mut() {
        *w = rng.gen();
    }
    let mut events = vec![0u32; (cap.max(1) * EVENT_WORDS) as usize];
    for r in events.chunks_mut(EVENT_WORDS as usize) {
        for w in r.iter_mut() {
            *w = rng.gen();
        }
        if rng.gen_bool(0.7) {
            r[E_KIND as usize] = EV_OUTPUT;
            let len = rng.gen_range(0..=arena_len.min(40));
            r[E_LEN as usize] = len;
            r[E_OFFSET as usize] = rng.gen_range(0..=arena_len - len);
            if bad && rng.gen_bool(0.3) {
                r[E_OFFSET as usize] = arena_len - len + rng.gen_range(1..5);
            }
        } else {
            r[E_KIND as usize] = EV_ERROR;
        }
    }
    (hdr, inst, arena, events)
}

/// The outbox words the drain writes (the rest is left as it was).
fn written(out: &[u32], cap: u32) -> Vec<(usize, u32)> {
    let mut at: Vec<usize> = (0..H_WORDS as usize).collect();
    at.extend(O_EVENTS_N as usize..=O_BAD as usize);
    let n_ev = out[O_EVENTS_N as usize] as usize;
    let ew = EVENT_WORDS as usize;
    at.extend(O_EVENTS as usize..O_EVENTS as usize + n_ev * ew);
    // tokens are gathered unless they overflowed; a corrupt span's are not (its share stays
    // as it was), so with one the tokens are not compared
    if out[O_OVERFLOW as usize] == 0 && out[O_BAD as usize] == 0 {
        let t0 = O_EVENTS as usize + cap as usize * ew;
        at.extend(t0..t0 + out[O_TOKENS_N as usize] as usize);
    }
    at.into_iter().map(|i| (i, out[i])).collect()
}

#[test]
fn the_reference_gathers_outputs_and_empties_the_ring() {
    // two outputs and an error, read cursor at 1 of a ring of 4
    let arena: Vec<u32> = (100..120).collect();
    let mut hdr = vec![0u32; H_WORDS as usize];
    hdr[H_EV_CAP as usize] = 4;
    hdr[H_EV_READ as usize] = 1;
    hdr[H_EV_HEAD as usize] = 4;
    hdr[H_ARENA_CAP as usize] = 20;
    hdr[H_N as usize] = 2;
    let mut inst = vec![0u32; 2 * INST_WORDS as usize];
    inst[I_GENERATED_LO as usize] = u32::MAX;
    inst[(INST_WORDS + I_GENERATED_LO) as usize] = 2;
    let mut events = vec![0u32; 4 * EVENT_WORDS as usize];
    let ev = |k: usize| k * EVENT_WORDS as usize;
    events[ev(1) + E_KIND as usize] = EV_OUTPUT;
    events[ev(1) + E_OFFSET as usize] = 5;
    events[ev(1) + E_LEN as usize] = 3;
    events[ev(2) + E_KIND as usize] = EV_ERROR;
    events[ev(3) + E_KIND as usize] = EV_OUTPUT;
    events[ev(3) + E_OFFSET as usize] = 0;
    events[ev(3) + E_LEN as usize] = 2;
    let out = vm_drain_ref(&mut hdr, &inst, &arena, &events, 8);
    assert_eq!(out[O_EVENTS_N as usize], 3);
    assert_eq!(out[O_TOKENS_N as usize], 5);
    assert_eq!(out[O_OVERFLOW as usize], 0);
    assert_eq!((out[O_GEN_LO as usize], out[O_GEN_HI as usize]), (1, 1));
    let t0 = (O_EVENTS + 4 * EVENT_WORDS) as usize;
    assert_eq!(&out[t0..t0 + 5], &[105, 106, 107, 100, 101]);
    let o = |k: usize| O_EVENTS as usize + ev(k);
    assert_eq!(out[o(0) + E_OFFSET as usize], 0);
    assert_eq!(out[o(2) + E_OFFSET as usize], 3);
    assert_eq!(
        out[H_EV_HEAD as usize], 4,
        "the header as the steps left it"
    );
    assert_eq!(hdr[H_EV_HEAD as usize], 0, "the ring emptied");
    // too many tokens: nothing gathered, arena offsets kept
    hdr[H_EV_READ as usize] = 1;
    hdr[H_EV_HEAD as usize] = 4;
    let out = vm_drain_ref(&mut hdr, &inst, &arena, &events, 4);
    assert_eq!(out[O_OVERFLOW as usize], 1);
    assert_eq!(out[O_EVENTS as usize + E_OFFSET as usize], 5);
}

#[test]
fn vm_drain_matches_the_reference_on_random_states() {
    let Some(ctx) = gpu_or_skip("vm_drain_matches_the_reference") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let drain = VmDrain::new(&ctx).unwrap();
    let up = |name: &str, w: &[u32]| {
        let b = Buffer::new(
            &ctx,
            name,
            4 * w.len().max(1) as u64,
            MemoryKind::DeviceLocal,
        )
        .unwrap();
        if !w.is_empty() {
            ctx.upload(&b, 0, w).unwrap();
        }
        b
    };
    for case in 0..12 {
        let (mut hdr, inst, arena, events) = state(&mut rng, case % 3 == 2);
        let cap = hdr[H_EV_CAP as usize];
        let token_cap = if case % 4 == 3 { 5 } else { 4000 };
        let (hb, ib, ab, eb) = (
            up("hdr", &hdr),
            up("inst", &inst),
            up("arena", &arena),
            up("events", &events),
        );
        let dummy = up("unused", &[0; 4]);
        let state = VmBuffers {
            hdr: hb.whole(),
            prog: dummy.whole(),
            inst: ib.whole(),
            arena: ab.whole(),
            tables: dummy.whole(),
            queues: dummy.whole(),
            boxes: dummy.whole(),
            events: eb.whole(),
        };
        let words = outbox_words(cap, token_cap) as usize;
        let outbox = Buffer::new(&ctx, "outbox", 4 * words as u64, MemoryKind::Readback).unwrap();
        ctx.fill(&outbox, 0, outbox.size(), 0xDEAD_BEEF).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let n = hdr[H_N as usize];
        drain
            .record(&mut chain, &state, n, cap, &outbox.whole(), token_cap)
            .unwrap();
        chain.run().unwrap();
        let mut got = vec![0u32; words];
        outbox.read(0, &mut got).unwrap();
        let mut got_hdr = vec![0u32; H_WORDS as usize];
        ctx.download(&hb, 0, &mut got_hdr).unwrap();
        let want = vm_drain_ref(&mut hdr, &inst, &arena, &events, token_cap);
        let ctx_msg = format!("seed {seed}, case {case}, cap {cap}, {n} instances");
        let (g, w) = (written(&got, cap), written(&want, cap));
        assert_eq!(g.len(), w.len(), "{ctx_msg}: words written");
        if let Some((a, b)) = g.iter().zip(&w).find(|(a, b)| a != b) {
            panic!(
                "{ctx_msg}: outbox word {} is {}, the reference's {}",
                a.0, a.1, b.1
            );
        }
        assert_eq!(got_hdr, hdr, "{ctx_msg}: the header after the drain");
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn a_small_outbox_is_a_shape_error() {
    let Some(ctx) = gpu_or_skip("vm_drain_small_outbox") else {
        return;
    };
    let drain = VmDrain::new(&ctx).unwrap();
    let b = Buffer::new(&ctx, "b", 4 * 4096, MemoryKind::DeviceLocal).unwrap();
    let small = Buffer::new(&ctx, "small", 64, MemoryKind::DeviceLocal).unwrap();
    let state = VmBuffers {
        hdr: b.whole(),
        prog: b.whole(),
        inst: b.whole(),
        arena: b.whole(),
        tables: b.whole(),
        queues: b.whole(),
        boxes: b.whole(),
        events: b.whole(),
    };
    let mut chain = Chain::new(&ctx).unwrap();
    let err = drain
        .record(&mut chain, &state, 1, 4, &small.whole(), 16)
        .unwrap_err();
    assert!(err.to_string().contains("outbox"), "{err}");
}
