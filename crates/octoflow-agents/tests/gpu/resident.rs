//! A run whose state stays on the GPU from its first step to its last: each step records
//! `vm_interpret` and `vm_plan` in one chain, the host's engine runs the rows `vm_plan` wrote
//! (read back as `BatchRow`s), and `vm_advance` takes the sampled tokens. The host only writes
//! the step number and resets the event ring between steps, and reads the state to collect
//! the events — what a GPU-driven agent loop does around a batched forward.

use octoflow_agents::gpu_state::{pack, unpack, VmImage};
use octoflow_agents::{Event, Run};
use octoflow_core::Draw;
use octoflow_kernels::agents::layout::*;
use octoflow_kernels::agents::vm_plan::RowShape;
use octoflow_kernels::agents::{step_words, VmRows};
use octoflow_kernels::SamplerState;
use octoflow_model::{BatchForward, BatchRow, RowOutput, RowResult, TokenIn};
use octoflow_vk::{Buffer, Chain};

use super::compare::EVENT_CAP;
use super::{buffer, dims, poisoned, read, Gpu, State};

/// The state and row tables of a run, resident on the device.
pub struct Resident<'g> {
    gpu: &'g Gpu,
    img: VmImage,
    state: State,
    tables: Vec<Buffer>,
    sizes: [usize; 7],
    tokens: Buffer,
    shape: RowShape,
    template: Run,
}

impl<'g> Resident<'g> {
    /// `run`'s state uploaded once, with row tables for `shape`.
    pub fn new(gpu: &'g Gpu, run: &Run, shape: RowShape) -> Self {
        let img = pack(run, EVENT_CAP).expect("pack");
        let state = State::new(&gpu.ctx, &img);
        let (r, o) = (shape.max_rows as usize, shape.max_out as usize);
        let n = dims(&img).instances;
        let sizes = [
            2 * r,
            r,
            o,
            r,
            o * SAMPLER_WORDS as usize,
            step_words(n) as usize,
            r,
        ];
        let tables = sizes
            .iter()
            .map(|&words| poisoned(&gpu.ctx, "rows", words))
            .collect();
        Resident {
            gpu,
            state,
            tables,
            sizes,
            tokens: buffer(&gpu.ctx, "tokens", &vec![0; 2 * o]),
            shape,
            template: run.clone(),
            img,
        }
    }

    fn rows(&self) -> VmRows {
        let t = |i: usize| self.tables[i].whole();
        VmRows {
            table: t(0),
            ids: t(1),
            out_rows: t(2),
            mix: t(3),
            states: t(4),
            step: t(5),
            owners: t(6),
        }
    }

    /// Step `step`: the events it made and the run's state after it (read back), or `None`
    /// when every live instance waits for something that cannot come.
    pub fn step(&mut self, step: u64, engine: &mut dyn BatchForward) -> Option<(Vec<Event>, Run)> {
        let ctx = &self.gpu.ctx;
        let hdr = &self.state.bufs[0];
        let stamp = [step as u32, (step >> 32) as u32];
        ctx.upload(hdr, 4 * u64::from(H_STEP_LO), &stamp)
            .expect("step");
        ctx.upload(hdr, 4 * u64::from(H_EV_HEAD), &[0u32, 0])
            .expect("ring");
        let dims = dims(&self.img);
        let mut chain = Chain::new(ctx).expect("chain");
        let (state, rows) = (self.state.slices(), self.rows());
        self.gpu
            .interpret
            .record(&mut chain, &state, dims)
            .expect("interpret");
        chain.compute_barrier().expect("barrier");
        self.gpu
            .plan
            .record(&mut chain, &state, dims.instances, &rows, self.shape)
            .expect("plan");
        chain.run().expect("interpret and plan");

        let now = self.state.image(ctx, &self.img);
        let mut run = self.template.clone();
        let events = unpack(&mut run, &now).expect("unpack");
        let t: Vec<Vec<u32>> = (0..7)
            .map(|i| read(ctx, &self.tables[i], self.sizes[i]))
            .collect();
        let (n_rows, n_out) = (
            t[5][P_ROWS as usize] as usize,
            t[5][P_OUTS as usize] as usize,
        );
        assert!(n_out <= self.shape.max_out as usize, "{n_out} outputs");
        if n_rows == 0 {
            let live = run.instances().iter().any(|i| i.status.is_live());
            if live && !now.changed() {
                return None;
            }
            return Some((events, run));
        }

        // The forward reads the tables as the batch does: a row's block table offset names
        // its slot's (2 max_rows + slot * slot_blocks, vm_plan.comp).
        let (tables_at, slot_blocks) = (2 * self.shape.max_rows, self.shape.slot_blocks.max(1));
        let mut out_of_row = vec![None; n_rows];
        for (o, &r) in t[2][..n_out].iter().enumerate() {
            out_of_row[r as usize] = Some(o);
        }
        let batch: Vec<BatchRow> = (0..n_rows)
            .map(|r| BatchRow {
                slot: (t[0][2 * r + 1] - tables_at) / slot_blocks,
                pos: t[0][2 * r],
                token: TokenIn::Id(t[1][r]),
                output: match out_of_row[r] {
                    Some(o) => {
                        let w: [u32; 8] = t[4][o * 8..o * 8 + 8].try_into().expect("8 words");
                        let s = SamplerState::from_words(w);
                        RowOutput::Sample(Draw {
                            temperature: s.temperature,
                            top_k: s.top_k,
                            top_p: s.top_p,
                            min_p: s.min_p,
                            seed: s.seed(),
                            step: s.step(),
                        })
                    }
                    None => RowOutput::None,
                },
                adapter: None,
            })
            .collect();
        let results = engine.step(&batch).expect("forward");
        // The sampler's layout: tokens, then their log-probabilities' bits.
        let max_out = self.shape.max_out as usize;
        let mut tokens = vec![0u32; 2 * max_out];
        for (o, &r) in t[2][..n_out].iter().enumerate() {
            (tokens[o], tokens[max_out + o]) = match results[r as usize] {
                RowResult::Token { token, logprob } => (token, logprob.to_bits()),
                ref other => panic!("row {r}: {other:?}"),
            };
        }
        ctx.upload(&self.tokens, 0, &tokens).expect("tokens");
        let mut chain = Chain::new(ctx).expect("chain");
        self.gpu
            .advance
            .record(
                &mut chain,
                &state,
                dims.instances,
                &rows.step,
                &self.tokens.whole(),
                self.shape.max_out,
            )
            .expect("advance");
        chain.run().expect("advance");
        Some((events, run))
    }
}
