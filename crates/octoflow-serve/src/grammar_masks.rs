//! The scheduler's grammar masks: one per constrained device draw of a step, computed on the
//! host's cores before the step is submitted, or after it for late rows (see the scheduler's
//! "Pipelining").

use octoflow_core::TokenMask;
use rayon::prelude::*;

use super::{Loop, RowMeta};
use crate::seq::Seq;

impl<'t> Loop<'_, 't> {
    /// The grammars' masks of a step's device draws: one entry per row of its `n_rows`
    /// (`None`: unconstrained or not `wanted`), computed on the host's cores (a mask of a JSON
    /// schema over qwen2.5's 151,936 tokens takes tens of microseconds). A grammar that gives
    /// no mask leaves its error on the row's meta.
    pub(super) fn masks(
        &mut self,
        n_rows: usize,
        meta: &mut [RowMeta],
        wanted: impl Fn(&RowMeta) -> bool,
    ) -> Vec<Option<TokenMask>> {
        let mut out: Vec<Option<TokenMask>> = vec![None; n_rows];
        let row_of: std::collections::HashMap<usize, usize> = meta
            .iter()
            .enumerate()
            .filter(|(_, m)| m.row < n_rows && wanted(m))
            .map(|(i, m)| (m.slot, i))
            .collect();
        let mut work: Vec<(usize, &mut Seq<'t>)> = self
            .slots
            .iter_mut()
            .enumerate()
            .filter_map(|(slot, s)| Some((*row_of.get(&slot)?, s.as_mut()?)))
            .filter(|(i, seq)| seq.constrained() && seq.id == meta[*i].seq)
            .collect();
        if work.is_empty() {
            return out;
        }
        // Rayon's pool, not threads of our own: starting threads every step put their start-up
        // on the path between a step's read-back and its late masks' signal. A grammar that
        // panics fails its row, as one that gives no mask does.
        let one = |(i, seq): &mut (usize, &mut Seq<'t>)| {
            let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| seq.next_mask()));
            match got {
                Ok(m) => Some((*i, m?.map_err(|e| e.to_string()))),
                Err(_) => {
                    tracing::error!("a grammar's mask panicked");
                    Some((
                        *i,
                        Err("the grammar failed while computing its mask".to_string()),
                    ))
                }
            }
        };
        let got: Vec<(usize, Result<TokenMask, String>)> = if work.len() == 1 {
            work.iter_mut().filter_map(one).collect()
        } else {
            work.par_iter_mut().filter_map(one).collect()
        };
        for (i, m) in got {
            let row = meta[i].row;
            match m {
                Ok(mask) => out[row] = Some(mask),
                Err(e) => meta[i].mask_error = Some(e),
            }
        }
        out
    }

    /// Once the step before it is collected, the oldest step in flight gets its late rows'
    /// masks (their grammars have now seen the tokens those rows took on the device). A row
    /// whose sequence ended or whose grammar gave no mask draws unconstrained; its result is
    /// dropped, or fails the sequence, when the step returns.
    pub(super) fn give_late_masks(&mut self) {
        let Some(step) = self.inflight.front_mut().filter(|s| s.owes) else {
            return;
        };
        step.owes = false;
        let n_rows = step.n_rows;
        let mut meta = std::mem::take(&mut step.rows);
        let masks = self.masks(n_rows, &mut meta, |m| m.late);
        let mut late: Vec<usize> = meta.iter().filter(|m| m.late).map(|m| m.row).collect();
        late.sort_unstable();
        if let Some(step) = self.inflight.front_mut() {
            step.rows = meta;
        }
        let given: Vec<Option<&TokenMask>> = late
            .iter()
            .map(|&r| masks.get(r).and_then(Option::as_ref))
            .collect();
        if let Err(e) = self.engine.give_masks(&given) {
            self.engine_failed(&format!("giving a step's grammar masks: {e}"));
        }
    }
}
