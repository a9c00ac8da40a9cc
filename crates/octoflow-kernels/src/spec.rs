//! One shader's pipelines, specialized per set of constants on first use: the attention kernels
//! specialize on the head shape and work layout, the matvec kernels on the work layout chosen
//! for each matrix shape.

use std::collections::HashMap;
use std::sync::Mutex;

use octoflow_vk::{Context, Pipeline, PipelineDesc, Shader};

use crate::error::Result;

/// Pipelines of one shader keyed by their specialization constants (`constant_id = i` gets
/// `key[i]`; ids the shader does not declare are ignored).
pub(crate) struct SpecPipelines {
    shader: Shader,
    bindings: u32,
    push_bytes: u32,
    label: &'static str,
    subgroup_size: Option<u32>,
    /// Cooperative-matrix layout: full subgroups of this size (requested where the device's
    /// size varies).
    full_subgroups: Option<u32>,
    cache: Mutex<HashMap<[u32; 7], Pipeline>>,
}

impl SpecPipelines {
    pub(crate) fn new(shader: Shader, bindings: u32, push_bytes: u32, label: &'static str) -> Self {
        Self {
            shader,
            bindings,
            push_bytes,
            label,
            subgroup_size: None,
            full_subgroups: None,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Every pipeline is built with this required subgroup size (`None`: the device's choice).
    pub(crate) fn subgroup_size(mut self, size: Option<u32>) -> Self {
        self.subgroup_size = size;
        self
    }

    /// The subgroup size every pipeline is built with, where one is required.
    #[cfg(all(test, feature = "bench"))]
    pub(crate) fn required_subgroup(&self) -> Option<u32> {
        self.subgroup_size
    }

    /// Every pipeline is built with full subgroups of `size` (the cooperative-matrix kernels'
    /// layout), the size requested only where the device's varies or differs.
    pub(crate) fn full_subgroups(mut self, size: u32) -> Self {
        self.full_subgroups = Some(size);
        self
    }

    /// The pipeline specialized with `spec`, built on first use.
    pub(crate) fn get(&self, ctx: &Context, spec: [u32; 7]) -> Result<Pipeline> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pl) = cache.get(&spec) {
            return Ok(pl.clone());
        }
        let mut desc = PipelineDesc::new(self.shader, self.bindings, self.push_bytes)
            .spec(&spec)
            .label(self.label);
        if let Some(size) = self.subgroup_size {
            desc = desc.subgroup_size(size);
        }
        if let Some(size) = self.full_subgroups {
            let sg = &ctx.caps().subgroup;
            if sg.size != size || sg.min_size != sg.max_size {
                desc = desc.subgroup_size(size);
            }
            desc.full_subgroups = true;
        }
        let pl = Pipeline::new(ctx, &desc)?;
        cache.insert(spec, pl.clone());
        Ok(pl)
    }
}
