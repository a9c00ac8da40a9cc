//! The scheduler's row sharing: decode and prefill budgets, shared prompt rows.

use super::*;

#[test]
fn prompt_rows_are_shared_so_short_prompts_are_not_held_behind_long_ones() {
    // a long prompt first, then a 4-token chat: the chat is prefilled whole at once
    assert_eq!(share_rows(&[(0, 512), (1, 4)], 64), vec![(0, 60), (1, 4)]);
    // all wants met when they fit
    assert_eq!(share_rows(&[(3, 5), (1, 7)], 64), vec![(3, 5), (1, 7)]);
    // even shares, the odd row to the earliest
    assert_eq!(
        share_rows(&[(0, 100), (1, 100), (2, 100)], 10),
        vec![(0, 4), (1, 3), (2, 3)]
    );
    // fewer rows than sequences: the earliest get one each
    assert_eq!(
        share_rows(&[(5, 9), (2, 9), (7, 9)], 2),
        vec![(5, 1), (2, 1)]
    );
    assert!(share_rows(&[(0, 9)], 0).is_empty());
    assert!(share_rows(&[], 9).is_empty());
}

#[test]
fn shared_rows_never_exceed_the_room_or_a_want_and_fill_what_they_can() {
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |m: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % m as u64) as usize
    };
    for _ in 0..2000 {
        let n = next(8);
        let wants: Vec<(usize, usize)> = (0..n).map(|i| (i, 1 + next(300))).collect();
        let room = next(700);
        let takes = share_rows(&wants, room);
        let total: usize = takes.iter().map(|t| t.1).sum();
        let wanted: usize = wants.iter().map(|w| w.1).sum();
        assert_eq!(total, room.min(wanted), "{wants:?} {room}");
        for &(slot, t) in &takes {
            assert!(t <= wants[slot].1, "{wants:?} {room}");
        }
    }
}

#[test]
fn without_agent_runs_the_sequences_have_every_row() {
    assert_eq!(decode_cap(8, false), 8);
    assert_eq!(prefill_first_cap(8, 3, false), 8);
}

#[test]
fn a_ready_agent_run_always_keeps_room() {
    // Decode rows leave at least one row; prompt chunks at most half of the rest.
    assert_eq!(decode_cap(8, true), 7);
    assert_eq!(prefill_first_cap(8, 7, true), 7);
    assert_eq!(prefill_first_cap(8, 2, true), 5);
    assert_eq!(prefill_first_cap(8, 1, true), 4);
    assert_eq!(prefill_first_cap(512, 0, true), 256);
    for max_rows in 2..40 {
        for decode in 0..=decode_cap(max_rows, true) {
            let cap = prefill_first_cap(max_rows, decode, true);
            assert!(cap < max_rows, "{max_rows} rows, {decode} decode rows");
        }
    }
}

#[test]
fn a_one_row_step_goes_to_whoever_comes_first() {
    assert_eq!(decode_cap(1, true), 1);
    assert_eq!(prefill_first_cap(1, 0, true), 0);
}
