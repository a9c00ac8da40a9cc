use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

impl KvPool {
    /// Every block is in exactly one place: named by tables (`refs` of them), parked, or free.
    fn check(&self) {
        let mut refs = vec![0u32; self.blocks.len()];
        for t in &self.tables {
            for &b in t {
                refs[b as usize] += 1;
            }
        }
        for (b, blk) in self.blocks.iter().enumerate() {
            assert_eq!(blk.refs, refs[b], "block {b}: refs");
            let parked = self
                .evictable
                .values()
                .filter(|&&x| x as usize == b)
                .count();
            let free = self.free.iter().filter(|&&x| x as usize == b).count();
            if blk.refs > 0 {
                assert_eq!((parked, free), (0, 0), "block {b} is used and unused");
            } else {
                assert_eq!(parked + free, 1, "block {b} is lost or listed twice");
                assert_eq!(
                    parked == 1,
                    blk.key.is_some(),
                    "block {b}: parked iff registered"
                );
            }
            if let Some((h, _)) = &blk.key {
                assert_eq!(self.index.get(h), Some(&(b as u32)), "block {b}: index");
            }
        }
        assert_eq!(self.reserved.iter().sum::<usize>(), self.reserved_total);
        assert!(
            self.reserved_total <= self.unused(),
            "promised more than exists"
        );
    }
}

fn toks(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i * 7 + salt).collect()
}

#[test]
fn tables_grow_by_blocks_and_release_returns_them() {
    let mut p = KvPool::new(10, 3, true);
    p.grow(&[(0, 1), (1, 17)]).unwrap();
    assert_eq!(p.table(0).len(), 1);
    assert_eq!(p.table(1).len(), 2);
    assert_eq!(p.unused(), 7);
    p.grow(&[(0, 16)]).unwrap(); // still one block
    assert_eq!(p.table(0).len(), 1);
    let err = p.grow(&[(2, 8 * PAGE + 1)]).unwrap_err();
    assert_eq!((err.need, err.available, err.total), (9, 7, 10));
    assert!(p.table(2).is_empty(), "a refused growth takes nothing");
    p.release(1);
    assert_eq!(p.unused(), 9);
    p.check();
}

#[test]
fn reservations_are_kept_from_everyone_else() {
    let mut p = KvPool::new(8, 3, true);
    p.reserve(0, 5 * PAGE).unwrap();
    assert_eq!(p.available(), 3);
    assert!(p.reserve(1, 4 * PAGE).is_err());
    assert!(p.grow(&[(1, 4 * PAGE)]).is_err());
    p.grow(&[(1, 3 * PAGE)]).unwrap();
    // slot 0 still gets its five, all of them
    p.grow(&[(0, 5 * PAGE)]).unwrap();
    assert_eq!(p.reserved_total, 0);
    assert_eq!(p.unused(), 0);
    // a smaller reservation replaces a larger one
    p.release(0);
    p.reserve(2, 5 * PAGE).unwrap();
    p.reserve(2, PAGE).unwrap();
    assert_eq!(p.available(), 4);
    p.check();
}

#[test]
fn registered_prefixes_are_adopted_whole_blocks_short_of_the_last_token() {
    let mut p = KvPool::new(16, 3, true);
    let prompt = toks(3 * PAGE + 5, 1);
    p.grow(&[(0, prompt.len())]).unwrap();
    p.register(0, &prompt, None);
    assert_eq!(p.cached(), 3);
    // the same prompt: three blocks (the last token runs anyway)
    assert_eq!(p.lookup(&prompt, None), 3 * PAGE);
    // exactly three blocks long: only two, so the last token still runs
    assert_eq!(p.lookup(&prompt[..3 * PAGE], None), 2 * PAGE);
    // another adapter, or a different first block: nothing
    assert_eq!(p.lookup(&prompt, Some(0)), 0);
    let mut other = prompt.clone();
    other[0] += 1;
    assert_eq!(p.lookup(&other, None), 0);
    // a different second block: the first only
    let mut other = prompt.clone();
    other[PAGE + 3] += 1;
    assert_eq!(p.lookup(&other, None), PAGE);
    // slot 1 adopts while slot 0 still runs: shared blocks
    assert_eq!(p.adopt(1, &prompt, None), 3 * PAGE);
    assert_eq!(&p.table(1)[..3], &p.table(0)[..3]);
    p.check();
    // both end: the registered blocks stay cached and adoptable; the partial one is free
    p.release(0);
    p.release(1);
    p.check();
    assert_eq!(p.unused(), 16);
    assert_eq!(p.adopt(2, &prompt, None), 3 * PAGE);
    p.check();
}

#[test]
fn the_least_recently_released_cached_block_is_evicted_first() {
    let mut p = KvPool::new(4, 2, true);
    let (a, b) = (toks(2 * PAGE + 1, 1), toks(2 * PAGE + 1, 2));
    p.grow(&[(0, 2 * PAGE)]).unwrap();
    p.register(0, &a, None);
    p.release(0);
    p.grow(&[(0, 2 * PAGE)]).unwrap();
    p.register(0, &b, None);
    p.release(0);
    assert_eq!(p.cached(), 4);
    // a new sequence needing two blocks evicts a's, released first
    p.grow(&[(1, 2 * PAGE)]).unwrap();
    assert_eq!(p.stats().evicted, 2);
    assert_eq!(p.lookup(&a, None), 0);
    assert_eq!(p.lookup(&b, None), 2 * PAGE);
    p.check();
}

#[test]
fn adopting_parked_blocks_never_takes_what_is_reserved() {
    let mut p = KvPool::new(4, 3, true);
    let a = toks(2 * PAGE + 1, 1);
    p.grow(&[(0, 2 * PAGE)]).unwrap();
    p.register(0, &a, None);
    p.release(0);
    // slot 1 reserves everything: the parked blocks are its to evict
    p.reserve(1, 4 * PAGE).unwrap();
    assert_eq!(p.adopt(2, &a, None), 0);
    p.grow(&[(1, 4 * PAGE)]).unwrap();
    p.check();
}

#[test]
fn rewinding_into_a_shared_block_copies_it_and_into_an_own_one_unregisters_it() {
    let mut p = KvPool::new(8, 2, true);
    let prompt = toks(2 * PAGE + 3, 5);
    p.grow(&[(0, prompt.len())]).unwrap();
    p.register(0, &prompt, None);
    assert_eq!(p.adopt(1, &prompt, None), 2 * PAGE);
    let shared = p.table(1)[1];
    // slot 1 rewinds to the middle of its second block, which slot 0 also uses: a copy
    let (from, to, rows) = p.truncate(1, PAGE + 4).unwrap().unwrap();
    assert_eq!((from, rows), (shared, 4));
    assert_ne!(to, shared);
    assert_eq!(p.table(1), &[p.table(0)[0], to]);
    assert_eq!(p.stats().copies, 1);
    p.check();
    // slot 0 rewinds into its own second block, now its alone: no copy, and it is no longer
    // a cached prefix (its rows are about to change)
    assert_eq!(p.truncate(0, PAGE + 1).unwrap(), None);
    assert_eq!(p.lookup(&prompt, None), PAGE);
    // a rewind to a block boundary drops the block
    assert_eq!(p.truncate(0, PAGE).unwrap(), None);
    assert_eq!(p.table(0).len(), 1);
    p.check();
}

#[test]
fn without_caching_nothing_is_registered() {
    let mut p = KvPool::new(4, 1, false);
    let a = toks(2 * PAGE + 1, 1);
    p.grow(&[(0, a.len())]).unwrap();
    p.register(0, &a, None);
    assert_eq!(p.cached(), 0);
    assert_eq!(p.lookup(&a, None), 0);
}

#[test]
fn contiguous_tables_give_each_slot_its_own_run_of_blocks() {
    let mut p = KvPool::new(7, 3, true);
    p.take_contiguous(2).unwrap();
    assert_eq!(p.table(0), &[0, 1]);
    assert_eq!(p.table(2), &[4, 5]);
    assert_eq!(p.unused(), 1);
    p.check();
    let mut q = KvPool::new(5, 3, true);
    assert!(q.take_contiguous(2).is_err());
}

/// Random sequences of every operation: the books always balance, adopted blocks always hold
/// the tokens the adopter's prompt has there, and no block is written while another table
/// names it.
#[test]
fn random_operations_keep_the_books() {
    let seed: u64 = rand::random();
    println!("kv_pool random operations: seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    for _round in 0..40 {
        let n_slots = rng.gen_range(1..6);
        let mut p = KvPool::new(rng.gen_range(1..40), n_slots, rng.gen_bool(0.9));
        // what each slot's positions hold (the model: tokens written at each position)
        let mut held: Vec<Vec<u32>> = vec![Vec::new(); n_slots];
        // what each block holds, as written
        let mut content: Vec<Vec<u32>> = vec![vec![u32::MAX; PAGE]; p.n_blocks()];
        for _ in 0..300 {
            let s = rng.gen_range(0..n_slots);
            match rng.gen_range(0..6) {
                0 => {
                    // write some positions (a few prompt families, so prefixes repeat)
                    let len = held[s].len();
                    let add = rng.gen_range(1..40);
                    if p.grow(&[(s, len + add)]).is_ok() {
                        let fam = rng.gen_range(0..3u32);
                        for j in len..len + add {
                            let t = fam * 1000 + (j as u32 % 50);
                            let b = p.table(s)[j / PAGE];
                            let others = (0..n_slots)
                                .filter(|&o| o != s && p.table(o).contains(&b))
                                .count();
                            assert_eq!(others, 0, "seed {seed}: block {b} written while shared");
                            content[b as usize][j % PAGE] = t;
                            held[s].push(t);
                        }
                    }
                }
                1 => p.register(s, &held[s], None),
                2 => {
                    p.release(s);
                    held[s].clear();
                }
                3 => {
                    if p.table(s).is_empty() {
                        let fam = rng.gen_range(0..3u32);
                        let n = rng.gen_range(1..120);
                        let prompt: Vec<u32> = (0..n as u32).map(|j| fam * 1000 + j % 50).collect();
                        let got = p.adopt(s, &prompt, None);
                        assert!(got < prompt.len().max(1));
                        for j in 0..got {
                            let b = p.table(s)[j / PAGE];
                            assert_eq!(
                                content[b as usize][j % PAGE],
                                prompt[j],
                                "seed {seed}: adopted block {b} holds other tokens"
                            );
                        }
                        held[s] = prompt[..got].to_vec();
                    }
                }
                4 => {
                    let len = rng.gen_range(0..=held[s].len());
                    match p.truncate(s, len) {
                        Ok(Some((from, to, rows))) => {
                            let kept: Vec<u32> = content[from as usize][..rows].to_vec();
                            content[to as usize][..rows].copy_from_slice(&kept);
                            held[s].truncate(len);
                        }
                        Ok(None) => held[s].truncate(len),
                        Err(_) => {
                            // the slot forgot what lies past len in any case
                            held[s].truncate(len);
                            let keep = blocks_for(len);
                            assert!(p.table(s).len() <= keep);
                            held[s].truncate(p.table(s).len() * PAGE);
                        }
                    }
                }
                _ => {
                    let _ = p.reserve(s, held[s].len() + rng.gen_range(0..64));
                }
            }
            p.check();
        }
    }
}
