//! Merging adapters into the base: the merged model without adapters computes the same loss
//! as the base with them (CPU reference, tiny random models).

use std::sync::Arc;

use octoflow_gguf::GgufFile;
use octoflow_kernels::IGNORE;
use octoflow_model::testing::{open, rng, tiny_writer, TINY};
use octoflow_model::Model;
use octoflow_train::merge::merged_file;
use octoflow_train::reference::RefModel;
use octoflow_train::{LoraConfig, LoraLayout, Rows, Target};
use rand::Rng;

#[test]
fn merged_model_equals_base_plus_adapters() {
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        let mut rng = rng(&format!("merge_{arch}"));
        let base = Arc::new(open(&tiny_writer(arch, TINY, &mut rng)).unwrap());
        let model = Model::from_gguf(base.clone()).unwrap();
        let cfg = LoraConfig {
            rank: 3,
            alpha: 6.0,
            dropout: 0.0,
            targets: vec![Target::Q, Target::V, Target::O, Target::Down],
        };
        let layout = LoraLayout::new(&cfg, &model.config);
        let p: Vec<f32> = (0..layout.n_params)
            .map(|_| rng.gen_range(-0.5..0.5))
            .collect();
        let adapter = layout.adapter(&p, cfg.alpha, "t").unwrap();
        let merged: GgufFile = merged_file(&base, &[(&adapter, 1.0)]).unwrap();
        let merged = Model::from_gguf(Arc::new(merged)).unwrap();
        let n = 12;
        let rows = Rows {
            ids: (0..n)
                .map(|_| rng.gen_range(0..TINY.n_vocab as u32))
                .collect(),
            labels: (0..n)
                .map(|i| {
                    if i == 5 {
                        IGNORE
                    } else {
                        rng.gen_range(0..TINY.n_vocab as u32)
                    }
                })
                .collect(),
            weights: vec![1.0; n],
            pos: (0..n as u32).map(|i| i % 6).collect(),
        };
        let p64: Vec<f64> = p.iter().map(|&v| f64::from(v)).collect();
        let with = RefModel::new(&model).unwrap().loss(&layout, &p64, &rows, 6);
        let zeros = vec![0.0; layout.n_params];
        let without = RefModel::new(&merged)
            .unwrap()
            .loss(&layout, &zeros, &rows, 6);
        let rel = (with - without).abs() / with.abs();
        // the merged weights are W + s·BA rounded to f32 once: ~1e-7 relative per weight
        assert!(
            rel < 1e-5,
            "{arch}: base+adapters {with} vs merged {without} ({rel:.2e})"
        );
        // an adapter of the wrong size is an error, not a panic
        assert!(layout.adapter(&p[1..], cfg.alpha, "t").is_err());
    }
}
