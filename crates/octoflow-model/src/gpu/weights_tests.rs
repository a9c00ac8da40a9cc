//! The GPU path takes every weight type its kernels read — a tiny model whose matrices are all
//! of one such type gives the CPU reference's logits — and refuses any other type with an
//! error that names the tensor and the type.

use std::sync::Arc;

use octoflow_gguf::{quant, GgmlType, GgufWriter};
use octoflow_vk::testing::gpu_or_skip;
use rand::rngs::StdRng;
use rand::Rng;

use crate::error::ModelError;
use crate::gpu::weights::GpuWeights;
use crate::gpu::GpuModel;
use crate::testing::{open, rel_err, rng, tiny_writer, TinyShape};
use crate::{Forward, Logits, Model};

/// Tiny, but every matrix's rows are whole 256-element super-blocks (K-quants, IQ4_XS).
const SHAPE: TinyShape = TinyShape {
    n_layer: 1,
    n_embd: 256,
    n_ff: 256,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 64,
    n_vocab: 40,
};

/// `w` with every matrix (the tied embedding too) re-encoded in `ty`: its F32 values through
/// the CPU quantizer, or for types without one random blocks whose f16 `d` (the first two
/// bytes of each block) keeps values within about ±0.5.
fn with_matrices_in(
    mut w: GgufWriter<'static>,
    ty: GgmlType,
    rng: &mut StdRng,
) -> GgufWriter<'static> {
    for t in w.tensors_mut().iter_mut().filter(|t| t.dims.len() == 2) {
        let values: Vec<f32> = t
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut q = vec![0u8; quant::quantized_size(ty, values.len()).expect("whole blocks")];
        if quant::can_quantize(ty) {
            quant::quantize(ty, &values, &mut q).expect("quantize");
        } else {
            // IQ4_NL / IQ4_XS: code books reach ±127, IQ4_XS sub-block scales ±32 more
            let d_max = if ty.block_size() == 32 {
                0.5 / 127.0
            } else {
                0.5 / 4064.0
            };
            rng.fill(&mut q[..]);
            for b in q.chunks_exact_mut(ty.type_size()) {
                let d = half::f16::from_f32(rng.gen_range(-d_max..d_max));
                b[..2].copy_from_slice(&d.to_bits().to_le_bytes());
            }
        }
        t.ty = ty;
        t.data = q.into();
    }
    w
}

#[test]
fn gpu_runs_models_of_every_weight_type_it_reads() {
    let Some(ctx) = gpu_or_skip("gpu_weight_types") else {
        return;
    };
    // One GpuModel whose weights are swapped per type: its pipelines cover every type and
    // building them is what costs on lavapipe (~2 s a load), not the forward passes.
    let mut gpu: Option<GpuModel> = None;
    for &ty in octoflow_kernels::Linear::weight_types() {
        let mut rng = rng(&format!("gpu_weight_types_{ty}"));
        let w = with_matrices_in(tiny_writer("llama", SHAPE, &mut rng), ty, &mut rng);
        let model = Model::from_gguf(Arc::new(open(&w).expect("parses"))).expect("binds");
        let gm = match gpu.as_mut() {
            Some(gm) => {
                gm.weights =
                    GpuWeights::upload(&ctx, &model).unwrap_or_else(|e| panic!("{ty}: {e}"));
                gm
            }
            None => {
                gpu.insert(GpuModel::load(&ctx, &model).unwrap_or_else(|e| panic!("{ty}: {e}")))
            }
        };
        let tokens: Vec<u32> = (0..5)
            .map(|_| rng.gen_range(0..SHAPE.n_vocab as u32))
            .collect();
        // a 4-token prompt (get_rows; the matvec or linear_cpu), then one decode-shaped step:
        // f32 on both sides in another summation order (~1e-6 per product), 1e-4. The
        // cooperative-matrix variants of every type are held to their own reference (operands
        // rounded to f16, as the kernel multiplies them) in octoflow-kernels' tests: against
        // this f32 reference their error grows through a random model's layers by more than a
        // bound could promise (7.4e-3 seen for F16 on an H100).
        let mut s = gm.session(16, 1).expect("session");
        assert!(!gm.kernels().linear.uses_coop(4), "4 rows take the matvec");
        let mut got = s.forward(&tokens[..4], 0, Logits::All).expect("forward");
        got.extend(s.forward(&tokens[4..], 4, Logits::All).expect("step"));
        let want = model
            .session(16)
            .forward(&tokens, 0, Logits::All)
            .expect("cpu");
        let bound = 1e-4;
        let e = rel_err(&got, &want);
        println!("{ty}: GPU vs CPU logits within {e:.2e} of the largest");
        assert!(
            e < bound,
            "{ty}: GPU vs CPU logits differ by {e:.2e} (bound {bound:.0e})"
        );
    }
}

#[test]
fn an_unsupported_matrix_type_names_the_tensor_and_type() {
    let Some(ctx) = gpu_or_skip("gpu_unsupported_weight_type") else {
        return;
    };
    let mut rng = rng("gpu_unsupported_weight_type");
    let mut w = tiny_writer("llama", crate::testing::TINY, &mut rng);
    // Q8_1 has a CPU codec (the CPU reference loads it) but no GPU kernel.
    let t = w
        .tensors_mut()
        .iter_mut()
        .find(|t| t.name == "blk.1.ffn_down.weight")
        .expect("ffn_down");
    let values: Vec<f32> = t
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut q = vec![0u8; quant::quantized_size(GgmlType::Q8_1, values.len()).unwrap()];
    quant::quantize(GgmlType::Q8_1, &values, &mut q).unwrap();
    t.ty = GgmlType::Q8_1;
    t.data = q.into();
    let model = Model::from_gguf(Arc::new(open(&w).expect("parses"))).expect("CPU loads Q8_1");
    let e = GpuModel::load(&ctx, &model)
        .err()
        .expect("the GPU refuses Q8_1");
    assert!(
        matches!(&e, ModelError::UnsupportedGpuTensorType { name, ty: GgmlType::Q8_1, .. }
            if name == "blk.1.ffn_down.weight"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("blk.1.ffn_down.weight") && msg.contains("Q8_1") && msg.contains("IQ4_XS"),
        "{msg}"
    );
}

/// `w` with its 3-D expert tensors re-encoded in `ty` too (as [`with_matrices_in`] does the
/// matrices).
fn with_experts_in(w: GgufWriter<'static>, ty: GgmlType, rng: &mut StdRng) -> GgufWriter<'static> {
    let mut w = with_matrices_in(w, ty, rng);
    for t in w.tensors_mut().iter_mut().filter(|t| t.dims.len() == 3) {
        let values: Vec<f32> = t
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut q = vec![0u8; quant::quantized_size(ty, values.len()).expect("whole blocks")];
        quant::quantize(ty, &values, &mut q).expect("quantize");
        t.ty = ty;
        t.data = q.into();
    }
    w
}

/// A mixture of experts on the GPU: quantized experts (the types real qwen3moe and gpt-oss
/// files use), and stacked tensors bound in pieces of whole experts as a device with small
/// bindings binds them, give the CPU reference's logits for a prompt batch (the grouped expert
/// products) and a decode step (the expert matvec).
#[test]
fn gpu_runs_quantized_and_split_experts_as_the_cpu_reference() {
    let Some(ctx) = gpu_or_skip("gpu_moe_weights") else {
        return;
    };
    let mut gpu: Option<GpuModel> = None;
    // (type, binding limit): whole tensors, then a limit that splits each 4-expert tensor in
    // pieces of one expert (an expert of F32 256 x 256 is 256 KiB)
    for (ty, limit) in [
        (GgmlType::Q4_K, u64::MAX),
        (GgmlType::MXFP4, u64::MAX),
        (GgmlType::Q8_0, u64::MAX),
        (GgmlType::F32, 300 << 10),
    ] {
        let mut rng = rng(&format!("gpu_moe_weights_{ty}"));
        let mut w = tiny_writer("qwen3moe", SHAPE, &mut rng);
        if ty != GgmlType::F32 {
            w = with_experts_in(w, ty, &mut rng);
        }
        let model = Model::from_gguf(Arc::new(open(&w).expect("parses"))).expect("binds");
        let weights =
            GpuWeights::upload_within(&ctx, &model, limit).unwrap_or_else(|e| panic!("{ty}: {e}"));
        if limit != u64::MAX {
            let crate::gpu::weights::GpuFfn::Moe(m) = &weights.blk[0].ffn else {
                panic!("a MoE block");
            };
            assert_eq!(m.gate.pieces.len(), 4, "one expert per piece");
        }
        let gm = match gpu.as_mut() {
            Some(gm) => gm,
            None => {
                gpu.insert(GpuModel::load(&ctx, &model).unwrap_or_else(|e| panic!("{ty}: {e}")))
            }
        };
        gm.weights = weights;
        let tokens: Vec<u32> = (0..11)
            .map(|_| rng.gen_range(0..SHAPE.n_vocab as u32))
            .collect();
        let mut s = gm.session(16, 1).expect("session");
        let mut got = s.forward(&tokens[..10], 0, Logits::All).expect("forward");
        got.extend(s.forward(&tokens[10..], 10, Logits::All).expect("step"));
        let want = model
            .session(16)
            .forward(&tokens, 0, Logits::All)
            .expect("cpu");
        let bound = if gm.kernels().linear.uses_coop(10) {
            5e-3
        } else {
            1e-4
        };
        let e = rel_err(&got, &want);
        let pieces = if limit == u64::MAX { "whole" } else { "split" };
        println!("qwen3moe {ty}, {pieces} expert tensors: within {e:.2e}");
        assert!(
            e < bound,
            "{ty}: GPU vs CPU logits differ by {e:.2e} (bound {bound:.0e})"
        );
    }
}
