//! Embedding lookup on a GGUF-encoded table: `out[i, :] = dequant(table[ids[i]]) * scale`
//! (shader `get_rows.comp`, weight decoding in `quant.glsl`).
//!
//! A table larger than one binding is split by rows into pieces; each piece is recorded with
//! its `row_begin..row_end` and writes only the rows of the ids it holds.

use octoflow_gguf::quant::QuantError;
use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::{KernelError, Result};
use crate::qweight::{check_words, row_bytes, type_index, word_slice, QOp, TYPES};

const OP: &str = "get_rows";

/// One lookup into one piece of an embedding table.
pub struct GetRowsArgs<'a> {
    /// Element type of the table's encoding.
    pub ty: GgmlType,
    /// Rows `row_begin..row_end` of the full table, GGUF encoding, `n_cols` per row.
    pub table: &'a BufferSlice,
    /// Elements per row (a multiple of the type's block size).
    pub n_cols: u32,
    /// First row of the full table held by `table`.
    pub row_begin: u32,
    /// One past the last row held; ids outside `[row_begin, row_end)` are skipped (another
    /// piece holds them) and their output rows left as they are.
    pub row_end: u32,
    /// u32 token ids; reads `ids[ids_offset .. ids_offset + n_ids]`.
    pub ids: &'a BufferSlice,
    /// First id read, in elements.
    pub ids_offset: u32,
    /// Ids to look up.
    pub n_ids: u32,
    /// `[n_ids, n_cols]` f32.
    pub out: &'a BufferSlice,
    /// Factor applied to every value (gemma scales embeddings by sqrt(n_embd)).
    pub scale: f32,
}

/// The embedding-lookup kernel, one pipeline per table type, built once.
pub struct GetRows {
    pipelines: Vec<Pipeline>,
}

impl GetRows {
    /// Builds every type's pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        let pipelines = (0..TYPES.len())
            .map(|i| Pipeline::new(ctx, &PipelineDesc::new(QOp::GetRows.variant(i), 3, 28)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(GetRows { pipelines })
    }

    /// Records the lookup of `a.n_ids` ids in one table piece. Checks the type, the row range
    /// and every operand's size.
    pub fn record(&self, chain: &mut Chain, a: &GetRowsArgs) -> Result<()> {
        let shape = |detail: String| KernelError::Shape { op: OP, detail };
        let ti = type_index(OP, a.ty)?;
        let rb = row_bytes(OP, a.ty, a.n_cols)?;
        if a.row_end <= a.row_begin {
            return Err(shape(format!(
                "empty row range {}..{}",
                a.row_begin, a.row_end
            )));
        }
        if a.n_ids == 0 {
            return Err(shape("n_ids is 0".into()));
        }
        let rows = u64::from(a.row_end - a.row_begin);
        let table = word_slice(OP, "table", a.table, rows * u64::from(rb))?;
        check_words(
            OP,
            "ids",
            a.ids,
            u64::from(a.ids_offset) + u64::from(a.n_ids),
            "u32s",
        )?;
        check_words(
            OP,
            "out",
            a.out,
            u64::from(a.n_ids) * u64::from(a.n_cols),
            "floats",
        )?;
        let push = Push::new()
            .u32(a.n_cols)
            .u32(rb)
            .u32(a.row_begin)
            .u32(a.row_end)
            .u32(a.ids_offset)
            .u32(a.n_ids)
            .f32(a.scale);
        let groups = chain.context().groups_1d(u64::from(a.n_ids), 1)?;
        chain.dispatch(
            &self.pipelines[ti],
            &[table, a.ids.clone(), a.out.clone()],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: for each `i`, if `row_begin <= ids[i] < row_end`,
/// `out[i * n_cols ..][..n_cols] = dequantize(row ids[i] - row_begin of table) * scale` (f32);
/// other rows of `out` are left alone. `table` holds rows `row_begin..row_end`,
/// `quantized_size(ty, n_cols)` bytes each.
#[allow(clippy::too_many_arguments)]
pub fn get_rows_ref(
    ty: GgmlType,
    table: &[u8],
    n_cols: usize,
    row_begin: u32,
    row_end: u32,
    ids: &[u32],
    out: &mut [f32],
    scale: f32,
) -> Result<(), QuantError> {
    let rb = octoflow_gguf::quant::quantized_size(ty, n_cols)?;
    for (i, &id) in ids.iter().enumerate() {
        if id < row_begin || id >= row_end {
            continue;
        }
        let r = (id - row_begin) as usize;
        let o = &mut out[i * n_cols..(i + 1) * n_cols];
        octoflow_gguf::quant::dequantize(ty, &table[r * rb..(r + 1) * rb], o)?;
        for v in o.iter_mut() {
            *v *= scale;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::{as_bytes, Buffer, MemoryKind};
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{buffer_with, random_cols, random_weights};

    /// Decoding matches the CPU codec up to a fused multiply-add in `d*q + m` (one rounding),
    /// and the scale is one f32 multiply in both: 1e-5 relative (with check_close's floor).
    const REL: f32 = 1e-5;

    #[test]
    fn gpu_get_rows_matches_the_reference_for_every_type_on_a_split_table() {
        let Some(ctx) = gpu_or_skip("get_rows_split_table") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let gr = GetRows::new(&ctx).unwrap();
        for ty in TYPES {
            let n_rows = rng.gen_range(2..60u32);
            let n_cols = random_cols(&mut rng, ty);
            let table = random_weights(&mut rng, ty, n_rows as usize, n_cols);
            let rb = table.len() / n_rows as usize;
            let split = rng.gen_range(1..n_rows);
            let piece_a = buffer_with(&ctx, "table_a", &table[..split as usize * rb]);
            let piece_b = buffer_with(&ctx, "table_b", &table[split as usize * rb..]);
            let n_ids = rng.gen_range(2..40u32);
            let ids_offset = rng.gen_range(0..5u32);
            // Junk before the ids; the last id is in neither piece and must stay untouched.
            let mut ids: Vec<u32> = (0..ids_offset + n_ids)
                .map(|_| rng.gen_range(0..n_rows))
                .collect();
            let skipped = (ids_offset + n_ids - 1) as usize;
            ids[skipped] = n_rows + 7;
            let idb = buffer_with(&ctx, "ids", as_bytes(&ids));
            let out_len = n_ids as usize * n_cols;
            let ob = Buffer::new(&ctx, "out", 4 * out_len as u64, MemoryKind::DeviceLocal).unwrap();
            ctx.fill(&ob, 0, ob.size(), f32::NAN.to_bits()).unwrap();
            let scale = rng.gen_range(0.5..3.0f32);
            let mut chain = Chain::new(&ctx).unwrap();
            for (piece, begin, end) in [(&piece_a, 0, split), (&piece_b, split, n_rows)] {
                let args = GetRowsArgs {
                    ty,
                    table: &piece.whole(),
                    n_cols: n_cols as u32,
                    row_begin: begin,
                    row_end: end,
                    ids: &idb.whole(),
                    ids_offset,
                    n_ids,
                    out: &ob.whole(),
                    scale,
                };
                gr.record(&mut chain, &args).unwrap();
            }
            chain.run().unwrap();
            let mut got = vec![0f32; out_len];
            ctx.download(&ob, 0, &mut got).unwrap();
            let mut want = vec![f32::NAN; out_len];
            let my_ids = &ids[ids_offset as usize..];
            get_rows_ref(
                ty,
                &table[..split as usize * rb],
                n_cols,
                0,
                split,
                my_ids,
                &mut want,
                scale,
            )
            .unwrap();
            get_rows_ref(
                ty,
                &table[split as usize * rb..],
                n_cols,
                split,
                n_rows,
                my_ids,
                &mut want,
                scale,
            )
            .unwrap();
            let what = format!(
                "{ty}: {n_rows} rows x {n_cols}, split at {split}, {n_ids} ids, seed {seed}"
            );
            let kept = (n_ids as usize - 1) * n_cols;
            if let Err(e) = check_close(&got[..kept], &want[..kept], REL) {
                panic!("{what}: {e}");
            }
            assert!(
                got[kept..].iter().all(|v| v.is_nan()),
                "{what}: the skipped id's row was written"
            );
        }
        assert_no_validation_errors(&ctx);
    }

    /// MXFP4 decodes every scale byte and every code as the CPU does: blocks at each of the
    /// four byte offsets (17-byte blocks), scales 0 ..= 255 and random codes (the shaders build
    /// the codes as f16 bit patterns, zero, 0.5 and negative zero by a correction). Equal values
    /// (the two zeros alike); where the CPU's value is an f32 subnormal (scales 0 and 1) the
    /// device may flush it to zero.
    #[test]
    fn gpu_get_rows_decodes_every_mxfp4_scale_exactly() {
        let Some(ctx) = gpu_or_skip("get_rows_mxfp4_scales") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let gr = GetRows::new(&ctx).unwrap();
        let ty = GgmlType::MXFP4;
        // 4 rows of 64 blocks: block b of row r has scale 64r + b
        let (n_rows, n_cols) = (4u32, 64 * 32);
        let mut table = vec![0u8; n_rows as usize * 64 * 17];
        rng.fill(&mut table[..]);
        for (i, b) in table.chunks_exact_mut(17).enumerate() {
            b[0] = i as u8;
        }
        let tb = buffer_with(&ctx, "table", &table);
        let ids: Vec<u32> = (0..n_rows).collect();
        let idb = buffer_with(&ctx, "ids", as_bytes(&ids));
        let out_len = (n_rows * n_cols) as usize;
        let ob = Buffer::new(&ctx, "out", 4 * out_len as u64, MemoryKind::DeviceLocal).unwrap();
        ctx.fill(&ob, 0, ob.size(), f32::NAN.to_bits()).unwrap();
        let args = GetRowsArgs {
            ty,
            table: &tb.whole(),
            n_cols,
            row_begin: 0,
            row_end: n_rows,
            ids: &idb.whole(),
            ids_offset: 0,
            n_ids: n_rows,
            out: &ob.whole(),
            scale: 1.0,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        gr.record(&mut chain, &args).unwrap();
        chain.run().unwrap();
        let mut got = vec![0f32; out_len];
        ctx.download(&ob, 0, &mut got).unwrap();
        let mut want = vec![f32::NAN; out_len];
        get_rows_ref(ty, &table, n_cols as usize, 0, n_rows, &ids, &mut want, 1.0).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let flushed = w.is_subnormal() && *g == 0.0;
            assert!(
                g == w || flushed,
                "element {i} (scale byte {}): {g:e}, the CPU {w:e}, seed {seed}",
                i / 32
            );
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn bad_lookups_are_clear_errors() {
        let Some(ctx) = gpu_or_skip("get_rows_bad_lookups") else {
            return;
        };
        let gr = GetRows::new(&ctx).unwrap();
        let big = Buffer::new(&ctx, "big", 1 << 16, MemoryKind::DeviceLocal).unwrap();
        let small = Buffer::new(&ctx, "small", 36, MemoryKind::DeviceLocal).unwrap();
        let (bw, sw) = (big.whole(), small.whole());
        let run = |ty, table: &BufferSlice, row_end, ids: &BufferSlice| {
            let a = GetRowsArgs {
                ty,
                table,
                n_cols: 64,
                row_begin: 0,
                row_end,
                ids,
                ids_offset: 0,
                n_ids: 10,
                out: &bw,
                scale: 1.0,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            gr.record(&mut chain, &a).unwrap_err().to_string()
        };
        let e = run(GgmlType::Q4_0, &sw, 2, &bw);
        assert!(
            e.contains("table (small) holds 36 bytes") && e.contains("72"),
            "{e}"
        );
        let e = run(GgmlType::Q8_0, &bw, 2, &sw);
        assert!(e.contains("ids (small)") && e.contains("10 u32s"), "{e}");
        let e = run(GgmlType::Q4_K, &bw, 2, &bw);
        assert!(e.contains("not a multiple of the block size 256"), "{e}");
        let e = run(GgmlType::F32, &bw, 0, &bw);
        assert!(e.contains("empty row range 0..0"), "{e}");
    }
}
