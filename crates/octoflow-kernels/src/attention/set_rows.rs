//! Row scatter into a cache (shader `set_rows.comp`): `dst[pos[pos_offset] + t] = src[t]`.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need, Positions};
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `set_rows.comp`).
const LOCAL_SIZE: u32 = 256;

/// The row-scatter kernel (K/V cache writes), built once per device.
pub struct SetRows {
    pipeline: Pipeline,
}

impl SetRows {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(SetRows {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::SET_ROWS, 3, 20))?,
        })
    }

    /// dst[pos[pos_offset] + t] = src[t] for t < n_rows (with [`Positions::Table`]: the row of
    /// position `pos[pos_offset + 2t]` in the paged cache whose block table starts at
    /// `pos[pos_offset + 2t + 1]`, [`crate::page`]); rows landing at or past dst_rows are
    /// skipped (never out of bounds). src [n_rows, width] f32, dst [dst_rows, width] f32, pos u32
    /// (read on the GPU, so a GPU-written position works).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        chain: &mut Chain,
        src: &BufferSlice,
        dst: &BufferSlice,
        n_rows: u32,
        width: u32,
        dst_rows: u32,
        pos: &BufferSlice,
        pos_offset: u32,
        positions: Positions,
    ) -> Result<()> {
        const OP: &str = "set_rows";
        let total = u64::from(n_rows) * u64::from(width);
        if total == 0 || dst_rows == 0 || total > u64::from(u32::MAX) {
            return Err(bad(
                OP,
                format!("bad shape: {n_rows} rows of {width} into {dst_rows}"),
            ));
        }
        need(OP, "src", src, u128::from(total))?;
        need(OP, "dst", dst, u128::from(dst_rows) * u128::from(width))?;
        need(
            OP,
            "pos",
            pos,
            u128::from(pos_offset) + positions.words(n_rows),
        )?;
        let groups = chain.context().groups_1d(total, LOCAL_SIZE)?;
        chain.dispatch(
            &self.pipeline,
            &[src.clone(), dst.clone(), pos.clone()],
            &Push::new()
                .u32(n_rows)
                .u32(width)
                .u32(dst_rows)
                .u32(pos_offset)
                .u32(positions.flag()),
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: copies row `t` of `src` (`[n_rows, width]`) to row `start + t` of `dst`
/// (`[dst_rows, width]`), skipping rows past the end.
pub fn set_rows_ref(src: &[f32], dst: &mut [f32], width: usize, start: usize) {
    for (t, row) in src.chunks_exact(width).enumerate() {
        if let Some(d) = dst.chunks_exact_mut(width).nth(start + t) {
            d.copy_from_slice(row);
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{read, with};

    #[test]
    fn gpu_set_rows_matches_the_reference_and_skips_rows_past_the_end() {
        let Some(ctx) = gpu_or_skip("gpu_set_rows_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = SetRows::new(&ctx).unwrap();
        // (n_rows, width, dst_rows, start): the last two run past the end / start past it
        for (n_rows, width, dst_rows, start) in [
            (1, 576, 40, 17),
            (37, 192, 64, 5),
            (3, 1, 5, 0),
            (10, 130, 12, 7),
            (4, 64, 8, 9),
        ] {
            let src: Vec<f32> = (0..n_rows * width).map(|_| rng.gen()).collect();
            let old: Vec<f32> = (0..dst_rows * width).map(|_| rng.gen()).collect();
            let (sb, db) = (with(&ctx, "src", &src), with(&ctx, "dst", &old));
            // position at index 2 of a control buffer
            let pb = with(&ctx, "pos", &[99u32, 98, start as u32, 97]);
            let mut chain = Chain::new(&ctx).unwrap();
            let (r, w, d) = (n_rows as u32, width as u32, dst_rows as u32);
            k.record(
                &mut chain,
                &sb.whole(),
                &db.whole(),
                r,
                w,
                d,
                &pb.whole(),
                2,
                Positions::Run,
            )
            .unwrap();
            chain.run().unwrap();
            let mut want = old.clone();
            set_rows_ref(&src, &mut want, width, start);
            // a copy is exact
            if let Err(e) = check_close(&read(&ctx, &db, dst_rows * width), &want, 0.0) {
                panic!("set_rows {n_rows}x{width} into {dst_rows} at {start}, seed {seed}: {e}");
            }
        }
    }

    #[test]
    fn position_table_writes_each_row_into_its_sequence() {
        let Some(ctx) = gpu_or_skip("set_rows_position_table") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = SetRows::new(&ctx).unwrap();
        let (n_rows, width, n_seq, per_seq) = (13usize, 130usize, 4usize, 40usize);
        let paged = crate::page::Paged::random(&mut rng, n_seq, per_seq);
        let dst_rows = paged.pool_rows;
        let src: Vec<f32> = (0..n_rows * width).map(|_| rng.gen()).collect();
        let old: Vec<f32> = (0..dst_rows * width).map(|_| rng.gen()).collect();
        // distinct (sequence, position) targets; the last one's block lies past the buffer's
        // end (a table of its own)
        let mut targets: Vec<(usize, usize)> = Vec::new();
        while targets.len() < n_rows - 1 {
            let t = (rng.gen_range(0..n_seq), rng.gen_range(0..per_seq));
            if !targets.contains(&t) {
                targets.push(t);
            }
        }
        let mut words = vec![7u32, 7, 7];
        words.resize(3 + 2 * n_rows, 0);
        let at = paged.append_to(&mut words);
        let beyond = words.len() as u32;
        words.push((dst_rows / 16) as u32 + 2);
        for (t, &(seq, p)) in targets.iter().enumerate() {
            words[3 + 2 * t] = p as u32;
            words[4 + 2 * t] = at[seq];
        }
        words[3 + 2 * (n_rows - 1)] = 3;
        words[4 + 2 * (n_rows - 1)] = beyond;
        let (sb, db, pb) = (
            with(&ctx, "src", &src),
            with(&ctx, "dst", &old),
            with(&ctx, "pos", &words),
        );
        let mut chain = Chain::new(&ctx).unwrap();
        k.record(
            &mut chain,
            &sb.whole(),
            &db.whole(),
            n_rows as u32,
            width as u32,
            dst_rows as u32,
            &pb.whole(),
            3,
            Positions::Table,
        )
        .unwrap();
        chain.run().unwrap();
        let mut want = old.clone();
        for (t, &(seq, p)) in targets.iter().enumerate() {
            let row = &src[t * width..(t + 1) * width];
            set_rows_ref(row, &mut want, width, paged.row(seq, p));
        }
        if let Err(e) = check_close(&read(&ctx, &db, dst_rows * width), &want, 0.0) {
            panic!("set_rows position table, seed {seed}: {e}");
        }
    }

    #[test]
    fn short_pos_is_a_shape_error() {
        let Some(ctx) = gpu_or_skip("set_rows_short_pos") else {
            return;
        };
        let s = with(&ctx, "s", &[0f32; 8]);
        let p = with(&ctx, "ctl", &[0u32; 2]);
        let k = SetRows::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let err = k
            .record(
                &mut chain,
                &s.whole(),
                &s.whole(),
                2,
                4,
                2,
                &p.whole(),
                2,
                Positions::Run,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("pos") && err.contains("ctl"), "{err}");
    }
}
