//! [`Linear::record_glu`]: an FFN's gate and up products and the activation in one dispatch
//! (the `GLU` variants of `matvec.comp`, `linear_cpu.comp` and `matmul_coop.comp`).

use octoflow_vk::Chain;

use super::args::{check_pending, glu_cost, Checked};
use super::plan::MatvecPlan;
use super::qweight::{check_words, row_bytes, word_slice};
use super::{check_args, check_blocks, Linear, LinearArgs, LinearGluArgs, MATVEC_MAX_TOKENS, OP};
use crate::error::{KernelError, Result};

impl Linear {
    /// Records `y[t, r] = act(dot(gate row r, x[t])) * dot(up row r, x[t])` (see
    /// [`LinearGluArgs`]) as one dispatch: the matvec kernel's GLU variant. Errors unless
    /// [`Linear::fuses_glu`] holds and gate and up have the same shape, and on any operand's
    /// size (as [`Linear::record`]).
    pub fn record_glu(&self, chain: &mut Chain, a: &LinearGluArgs) -> Result<()> {
        self.record_glu_with(chain, a, None, false)
    }

    /// [`Linear::record_glu`] in the work layout `plan` where given (as
    /// [`Linear::record_with`]), for a step of `decode` rows ([`Linear::step`]).
    pub(crate) fn record_glu_with(
        &self,
        chain: &mut Chain,
        a: &LinearGluArgs,
        plan: Option<MatvecPlan>,
        decode: bool,
    ) -> Result<()> {
        let shape = |detail: String| KernelError::Shape { op: OP, detail };
        let (g, u) = (&a.gate, &a.up);
        if g.ty != u.ty {
            return Err(shape(format!(
                "fused GLU: gate is {} and up {}: both must have one type",
                g.ty, u.ty
            )));
        }
        if (g.n_rows, g.n_cols) != (u.n_rows, u.n_cols) {
            return Err(shape(format!(
                "fused GLU: gate is {}x{} and up {}x{}: both must have one shape",
                g.n_rows, g.n_cols, u.n_rows, u.n_cols
            )));
        }
        // type, shapes, x and y (as one product of the gate)
        let Checked { ti, push, bindings } = check_args(&LinearArgs {
            w: *g,
            x: a.x,
            y: a.y,
            n_tokens: a.n_tokens,
            y_stride: g.n_rows,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: None,
            pending: None,
        })?;
        if !self.step(decode).fuses_glu(a.n_tokens, g.ty, u.ty) {
            return Err(shape(format!(
                "fused GLU: {} tokens; it takes 1..={MATVEC_MAX_TOKENS} (the matvec kernel) or, \
                 with cooperative matrices, any batch ({} or more on them)",
                a.n_tokens, self.tuning.coop_min_tokens
            )));
        }
        let rb = row_bytes(OP, u.ty, u.n_cols)?;
        let up = word_slice(
            OP,
            "up weights",
            u.data,
            u64::from(u.n_rows) * u64::from(rb),
        )?;
        let [wb, x, y, bias] = bindings;
        if a.pending.is_some() && a.norm.is_none() {
            return Err(shape("a pending post-norm needs the fused norm".into()));
        }
        let forced = self.forces_matvec(plan, a.n_tokens);
        let norm = match a.norm {
            Some((nw, eps)) => {
                self.check_norm_path(a.n_tokens, forced, decode)?;
                check_words(OP, "norm", nw, u64::from(g.n_cols), "floats")?;
                Some((nw.clone(), eps))
            }
            None => None,
        };
        if let Some(dot) = self.dot_for(
            g.ty,
            true,
            [g.n_rows, g.n_cols],
            a.n_tokens,
            a.pending.is_some(),
            &[g.data, u.data],
            forced || plan.is_some(),
            decode,
        ) {
            let once = self.tuning.quantize_once;
            return dot.record_glu(chain, a, [wb, x, y, bias], up, push, once);
        }
        if let Some(coop) = self
            .coop
            .as_ref()
            .filter(|_| self.coop_glu(a.n_tokens, decode) && !forced)
        {
            // a norm was refused above: only the matvec kernel fuses one
            return coop.dispatch_glu(chain, None, ti, a, &wb, &up, rb);
        }
        let plan = plan.unwrap_or_else(|| {
            let (r, c, t) = (g.n_rows, g.n_cols, a.n_tokens);
            if a.pending.is_some() {
                MatvecPlan::choose_glu_direct(r, c, t)
            } else {
                MatvecPlan::choose_glu(r, c, t)
            }
        });
        let (pend, pb) = check_pending(a.pending, g, a.x, a.y, a.n_tokens, plan)?;
        if !self.cpu {
            check_blocks(plan, g, a.n_tokens, &[g.data, u.data])?;
        }
        let mut push = push
            .f32(norm.as_ref().map_or(0.0, |n| n.1))
            .u32(u32::from(norm.is_some()))
            .u32(a.op.code());
        if !self.cpu {
            push = push.u32(pend);
        }
        // no norm: x stands in for its binding (never read)
        let nw = norm.map_or_else(|| x.clone(), |n| n.0);
        let (pipeline, groups) =
            self.matvec_glu[ti].layout(chain, g.n_rows, a.n_tokens, plan, pb.is_some())?;
        let mut bind = vec![wb, x.clone(), y.clone(), bias, nw, up];
        if !self.cpu {
            bind.extend(pb.unwrap_or_else(|| [x.clone(), x, y]));
        }
        chain.dispatch(&pipeline, &bind, &push, groups)?;
        let (bytes, flops) = glu_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }
}
