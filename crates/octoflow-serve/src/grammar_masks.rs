//! The scheduler's grammar masks: one per constrained device draw of a step, computed on the
//! host's cores before the step is submitted (see the scheduler's "Pipelining").

use octoflow_core::TokenMask;
use octoflow_model::{BatchRow, RowOutput};

use super::{Loop, RowMeta};
use crate::seq::Seq;

impl<'t> Loop<'_, 't> {
    /// The grammars' masks of the step's device draws (one per row; `None`: unconstrained),
    /// computed on up to one thread per core, each taking at least `MASKS_PER_THREAD` (a mask
    /// of a JSON schema over qwen2.5's 151,936 tokens takes tens of microseconds, about what
    /// starting a thread does).
    pub(super) fn masks(
        &mut self,
        rows: &[BatchRow],
        meta: &mut [RowMeta],
    ) -> Vec<Option<TokenMask>> {
        let mut out: Vec<Option<TokenMask>> = vec![None; rows.len()];
        let row_of: std::collections::HashMap<usize, usize> = meta
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                matches!(
                    rows.get(m.row).map(|r| r.output),
                    Some(RowOutput::Sample(_))
                )
            })
            .map(|(i, m)| (m.slot, i))
            .collect();
        let mut work: Vec<(usize, &mut Seq<'t>)> = self
            .slots
            .iter_mut()
            .enumerate()
            .filter_map(|(slot, s)| Some((*row_of.get(&slot)?, s.as_mut()?)))
            .filter(|(_, seq)| seq.constrained())
            .collect();
        if work.is_empty() {
            return out;
        }
        const MASKS_PER_THREAD: usize = 4;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(work.len().div_ceil(MASKS_PER_THREAD));
        let per = work.len().div_ceil(threads);
        let mut got: Vec<(usize, Result<TokenMask, String>)> = Vec::with_capacity(work.len());
        if threads <= 1 {
            for (i, seq) in &mut work {
                if let Some(m) = seq.next_mask() {
                    got.push((*i, m.map_err(|e| e.to_string())));
                }
            }
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = work
                    .chunks_mut(per)
                    .map(|chunk| {
                        scope.spawn(move || {
                            chunk
                                .iter_mut()
                                .filter_map(|(i, seq)| {
                                    Some((*i, seq.next_mask()?.map_err(|e| e.to_string())))
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                for h in handles {
                    match h.join() {
                        Ok(v) => got.extend(v),
                        Err(_) => tracing::error!("a grammar mask thread panicked"),
                    }
                }
            });
        }
        for (i, m) in got {
            let row = meta[i].row;
            match m {
                Ok(mask) => out[row] = Some(mask),
                Err(e) => meta[i].mask_error = Some(e),
            }
        }
        out
    }
}
