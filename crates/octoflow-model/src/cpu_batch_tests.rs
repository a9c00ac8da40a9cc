use rand::Rng;

use super::*;
use crate::testing::{rng, tiny_model, TINY};

const N_CTX: usize = 32;

fn row(slot: u32, pos: u32, token: TokenIn, output: RowOutput) -> BatchRow {
    BatchRow {
        slot,
        pos,
        token,
        output,
        adapter: None,
    }
}

#[test]
fn interleaved_steps_equal_each_slot_alone() {
    let mut r = rng("interleaved_steps_equal_each_slot_alone");
    let model = tiny_model("llama", TINY, &mut r);
    let n = TINY.n_vocab as u32;
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| (0..5 + 3 * i).map(|_| r.gen_range(0..n)).collect())
        .collect();
    let follow: Vec<Vec<u32>> = (0..3)
        .map(|_| (0..4).map(|_| r.gen_range(0..n)).collect())
        .collect();

    let mut want: Vec<Vec<Vec<f32>>> = Vec::new();
    // Alone: each prompt in the same chunks as below (slot 1: 3 tokens, then the rest; chunk
    // boundaries change the float summation order), then one follow-up token at a time.
    for (slot, (p, f)) in prompts.iter().zip(&follow).enumerate() {
        let mut s = model.session(N_CTX);
        let from = if slot == 1 {
            s.forward(&p[..3], 0, Logits::None).expect("chunk");
            3
        } else {
            0
        };
        let mut rows = vec![s.forward(&p[from..], from, Logits::Last).expect("prefill")];
        for &t in f {
            rows.push(s.decode_token(t));
        }
        want.push(rows);
    }

    // Batched: slot 0 prefills in one step, slot 1 in two chunks, slot 2 a step later; then
    // decode steps mixing all three.
    let mut b = CpuBatch::new(&model, 3, N_CTX, 64);
    let prefill = |slot: u32, p: &[u32], from: usize, to: usize| -> Vec<BatchRow> {
        (from..to)
            .map(|k| {
                let out = if k + 1 == p.len() {
                    RowOutput::Logits
                } else {
                    RowOutput::None
                };
                row(slot, k as u32, TokenIn::Id(p[k]), out)
            })
            .collect()
    };
    let mut step1 = prefill(0, &prompts[0], 0, prompts[0].len());
    step1.extend(prefill(1, &prompts[1], 0, 3));
    let res1 = b.step(&step1).expect("step 1");
    let mut step2 = prefill(1, &prompts[1], 3, prompts[1].len());
    step2.extend(prefill(2, &prompts[2], 0, prompts[2].len()));
    let res2 = b.step(&step2).expect("step 2");
    let last = |res: &[RowResult]| -> Vec<Vec<f32>> {
        res.iter()
            .filter_map(|r| match r {
                RowResult::Logits(l) => Some(l.clone()),
                _ => None,
            })
            .collect()
    };
    let got_prefill = [last(&res1), last(&res2)].concat();
    for (slot, got) in got_prefill.iter().enumerate() {
        assert_eq!(got, &want[slot][0], "slot {slot} prompt logits");
    }
    for k in 0..4 {
        let rows: Vec<BatchRow> = (0..3)
            .map(|s| {
                let pos = (prompts[s].len() + k) as u32;
                row(s as u32, pos, TokenIn::Id(follow[s][k]), RowOutput::Logits)
            })
            .collect();
        let res = b.step(&rows).expect("decode step");
        for (s, got) in last(&res).iter().enumerate() {
            assert_eq!(got, &want[s][k + 1], "slot {s} decode {k}");
        }
    }
}

trait DecodeToken {
    fn decode_token(&mut self, t: u32) -> Vec<f32>;
}

impl DecodeToken for Session<'_> {
    fn decode_token(&mut self, t: u32) -> Vec<f32> {
        let pos = self.n_past();
        self.forward(&[t], pos, Logits::Last).expect("decode")
    }
}

#[test]
fn sampled_tokens_feed_the_next_step_as_greedy_decoding_alone() {
    let mut r = rng("sampled_tokens_feed_the_next_step_as_greedy_decoding_alone");
    let model = tiny_model("qwen2", TINY, &mut r);
    let n = TINY.n_vocab as u32;
    let prompt: Vec<u32> = (0..6).map(|_| r.gen_range(0..n)).collect();

    let mut s = model.session(N_CTX);
    let mut logits = s.forward(&prompt, 0, Logits::Last).expect("prefill");
    let mut want = Vec::new();
    for _ in 0..6 {
        let t = crate::ops::argmax(&logits).map_or(0, |(i, _)| i as u32);
        want.push(t);
        logits = s.decode_token(t);
    }

    // Two steps in flight at a time: each decode row takes the previous step's sample.
    let mut b = CpuBatch::new(&model, 2, N_CTX, 16);
    let mut rows: Vec<BatchRow> = prompt
        .iter()
        .enumerate()
        .map(|(k, &t)| row(1, k as u32, TokenIn::Id(t), RowOutput::None))
        .collect();
    if let Some(last) = rows.last_mut() {
        last.output = RowOutput::Sample(Draw::greedy(0));
    }
    b.submit(&rows).expect("prefill");
    let mut got = Vec::new();
    for k in 0..5u32 {
        let pos = prompt.len() as u32 + k;
        b.submit(&[row(
            1,
            pos,
            TokenIn::Sampled,
            RowOutput::Sample(Draw::greedy(1 + u64::from(k))),
        )])
        .expect("decode submit");
        assert_eq!(b.pending(), 2);
        match b.collect().expect("collect").last() {
            Some(RowResult::Token { token, .. }) => got.push(*token),
            other => panic!("unexpected result {other:?}"),
        }
    }
    match b.collect().expect("collect").as_slice() {
        [RowResult::Token { token, .. }] => got.push(*token),
        other => panic!("unexpected results {other:?}"),
    }
    assert_eq!(got, want);
}

#[test]
fn invalid_steps_are_clear_errors() {
    let mut r = rng("invalid_steps_are_clear_errors");
    let model = tiny_model("llama", TINY, &mut r);
    let mut b = CpuBatch::new(&model, 2, 8, 4);
    let id = |t| TokenIn::Id(t);
    let none = RowOutput::None;
    let msg = |b: &mut CpuBatch, rows: &[BatchRow]| match b.submit(rows) {
        Err(e) => e.to_string(),
        Ok(()) => panic!("accepted {rows:?}"),
    };
    assert!(msg(&mut b, &[row(2, 0, id(1), none)]).contains("slot 2"));
    assert!(msg(&mut b, &[row(0, 8, id(1), none)]).contains("position 8"));
    assert!(msg(&mut b, &[row(0, 0, id(999), none)]).contains("vocabulary"));
    assert!(msg(&mut b, &[row(0, 3, id(1), none)]).contains("past the 0 positions"));
    assert!(msg(&mut b, &[row(0, 0, id(1), none), row(0, 2, id(1), none)]).contains("consecutive"));
    assert!(msg(&mut b, &[row(0, 0, TokenIn::Sampled, none)]).contains("Sampled"));
    assert!(msg(&mut b, &vec![row(0, 0, id(1), none); 5]).contains("at most 4"));
    let hot = Draw {
        temperature: 1.0,
        top_k: 0,
        ..Draw::greedy(0)
    };
    assert!(msg(&mut b, &[row(0, 0, id(1), RowOutput::Sample(hot))]).contains("top_k 0"));
    assert!(matches!(b.submit(&[]), Err(ModelError::EmptyBatch)));
    assert!(b.collect().is_err());
    // Two in flight, a third is refused; nothing was lost.
    b.submit(&[row(0, 0, id(1), none)]).expect("first");
    b.submit(&[row(0, 1, id(1), none)]).expect("second");
    assert!(msg(&mut b, &[row(0, 2, id(1), none)]).contains("in flight"));
    assert_eq!(b.pending(), 2);
}
