//! LoRA adapters on the device, applied on the fly by the forward chains (kernel `lora`).
//!
//! Every adapter of one projection is stacked ([`LoraStack`]): A rows one adapter after the
//! other (`[r_total, n_in]`), B columns likewise (`[n_out, r_total]`, each adapter's
//! `alpha / rank` folded in), and the rank offsets. Which adapters a token uses, at which
//! scale, is a *mix*: a row of the `scales` table `[n_mix, n_adapters]`, chosen per token by an
//! id the chain reads on the GPU, so one recording serves any choice:
//!
//! - mix 0: no adapter (the base model);
//! - mix `1 + i`: adapter `i` alone at its scale (a served request naming adapter `i`);
//! - mix `n_adapters + 1`: every adapter at its scale (`octoflow run --lora a --lora b`).
//!
//! A token whose scale for an adapter is 0 reads none of that adapter's weights.

use octoflow_kernels::{LoraMix, LoraStack};
use octoflow_vk::{Buffer, BufferSlice, Context, MemoryKind};

use crate::adapter::{Adapter, Target};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gpu::weights::Uploader;

/// One projection's stacked adapters on the device.
pub struct GpuStack {
    /// `[r_total, n_in]` f32.
    pub a: BufferSlice,
    /// `[n_out, r_total]` f32 (scaled by each adapter's `alpha / rank`).
    pub b: BufferSlice,
    /// `[n_adapters + 1]` u32 rank offsets.
    pub offsets: BufferSlice,
    pub r_total: u32,
    pub n_in: u32,
    pub n_out: u32,
}

/// Every loaded adapter, stacked per (layer, projection).
pub struct GpuAdapters {
    /// The adapters' names, in load order (adapter `i` is mix `1 + i`).
    pub names: Vec<String>,
    /// Per layer, per [`Target::ALL`] entry.
    stacks: Vec<[Option<GpuStack>; 7]>,
    /// The largest `r_total` of any projection.
    pub r_max: u32,
    /// `[n_mix, n_adapters]` f32, host-written.
    scales: Buffer,
    /// One u32: the every-adapter mix (what a single-sequence session uses).
    all: Buffer,
    user: Vec<f32>,
    /// Device bytes (weights and tables).
    pub bytes: u64,
}

impl GpuAdapters {
    /// Uploads `adapters` for a model of config `c`, at user `scales` (one per adapter).
    pub fn upload(
        ctx: &Context,
        c: &ModelConfig,
        adapters: &[Adapter],
        scales: &[f32],
    ) -> Result<Self> {
        if adapters.is_empty() || scales.len() != adapters.len() {
            return Err(ModelError::Lora(format!(
                "{} adapters with {} scales",
                adapters.len(),
                scales.len()
            )));
        }
        let n = adapters.len();
        // the stacked arrays, per (layer, target) that any adapter touches
        struct Planned {
            layer: usize,
            target: Target,
            a: Vec<f32>,
            b: Vec<f32>,
            offsets: Vec<u32>,
            n_in: usize,
            n_out: usize,
        }
        let mut planned = Vec::new();
        for layer in 0..c.n_layer {
            for target in Target::ALL {
                let parts: Vec<_> = adapters.iter().map(|ad| ad.get(layer, target)).collect();
                if parts.iter().all(Option::is_none) {
                    continue;
                }
                let (n_in, n_out) = target.dims(c);
                let mut offsets = vec![0u32];
                for p in &parts {
                    let r = p.map_or(0, |t| t.rank) as u32;
                    offsets.push(offsets[offsets.len() - 1] + r);
                }
                let r_total = offsets[n] as usize;
                if r_total > crate::adapter::MAX_RANK {
                    return Err(ModelError::Lora(format!(
                        "blk.{layer}.{}: the adapters' ranks add up to {r_total}, at most {} can be applied together",
                        target.gguf_stem(),
                        crate::adapter::MAX_RANK
                    )));
                }
                let mut a = Vec::with_capacity(r_total * n_in);
                let mut b = vec![0f32; n_out * r_total];
                for (i, (ad, p)) in adapters.iter().zip(&parts).enumerate() {
                    let Some(t) = p else { continue };
                    a.extend_from_slice(&t.a);
                    let s = ad.scale(t);
                    let off = offsets[i] as usize;
                    for j in 0..n_out {
                        for r in 0..t.rank {
                            b[j * r_total + off + r] = s * t.b[j * t.rank + r];
                        }
                    }
                }
                planned.push(Planned {
                    layer,
                    target,
                    a,
                    b,
                    offsets,
                    n_in,
                    n_out,
                });
            }
        }
        let mut up = Uploader::new(ctx);
        let slots: Vec<_> = planned
            .iter()
            .map(|p| {
                (
                    up.vector(&p.a),
                    up.vector(&p.b),
                    up.add(octoflow_vk::as_bytes(&p.offsets)),
                )
            })
            .collect();
        let (slices, mut bytes) = up.upload(ctx)?;
        let mut stacks: Vec<[Option<GpuStack>; 7]> =
            (0..c.n_layer).map(|_| Default::default()).collect();
        let mut r_max = 0;
        for (p, (sa, sb, so)) in planned.iter().zip(slots) {
            let r_total = p.offsets[n];
            r_max = r_max.max(r_total);
            stacks[p.layer][p.target.index()] = Some(GpuStack {
                a: slices[sa.0].clone(),
                b: slices[sb.0].clone(),
                offsets: slices[so.0].clone(),
                r_total,
                n_in: p.n_in as u32,
                n_out: p.n_out as u32,
            });
        }
        let scales_buf = Buffer::new(
            ctx,
            "lora_scales",
            4 * ((n + 2) * n) as u64,
            MemoryKind::Upload,
        )?;
        let all = Buffer::new(ctx, "lora_mix_all", 16, MemoryKind::Upload)?;
        all.write(0, &[n as u32 + 1])?;
        bytes += scales_buf.size() + all.size();
        let mut me = GpuAdapters {
            names: adapters.iter().map(|a| a.name.clone()).collect(),
            stacks,
            r_max,
            scales: scales_buf,
            all,
            user: Vec::new(),
            bytes,
        };
        me.set_scales(scales)?;
        Ok(me)
    }

    /// Adapters loaded.
    pub fn n_adapters(&self) -> usize {
        self.names.len()
    }

    /// Rows of the scales table.
    pub fn n_mix(&self) -> u32 {
        self.names.len() as u32 + 2
    }

    /// The mix of adapter `i` alone (`None`: the base model, mix 0).
    pub fn mix_of(&self, adapter: Option<usize>) -> u32 {
        adapter.map_or(0, |i| 1 + i as u32)
    }

    /// The mix of every adapter together.
    pub fn mix_all(&self) -> u32 {
        self.names.len() as u32 + 1
    }

    /// The user scales, one per adapter.
    pub fn scales(&self) -> &[f32] {
        &self.user
    }

    /// Sets the user scale of every adapter (no chain may be running).
    pub fn set_scales(&mut self, scales: &[f32]) -> Result<()> {
        let n = self.names.len();
        if scales.len() != n {
            return Err(ModelError::Lora(format!(
                "{} scales for {n} adapters",
                scales.len()
            )));
        }
        if let Some(s) = scales.iter().find(|s| !s.is_finite()) {
            return Err(ModelError::Lora(format!("adapter scale {s}")));
        }
        let mut table = vec![0f32; (n + 2) * n];
        for (i, &s) in scales.iter().enumerate() {
            table[(1 + i) * n + i] = s;
            table[(n + 1) * n + i] = s;
        }
        self.scales.write(0, &table)?;
        self.user = scales.to_vec();
        Ok(())
    }

    /// The adapters of `target` in `layer`, if any.
    pub fn stack(&self, layer: usize, target: Target) -> Option<&GpuStack> {
        self.stacks.get(layer)?[target.index()].as_ref()
    }

    /// The kernel's view of a stack.
    pub(crate) fn kernel_stack<'a>(&self, s: &'a GpuStack) -> LoraStack<'a> {
        LoraStack {
            a: &s.a,
            b: &s.b,
            offsets: &s.offsets,
            n_adapters: self.names.len() as u32,
            r_total: s.r_total,
            n_in: s.n_in,
            n_out: s.n_out,
        }
    }

    /// The scales table (for [`LoraMix::scales`]).
    pub(crate) fn scales_slice(&self) -> BufferSlice {
        self.scales.whole()
    }

    /// A one-word buffer holding [`Self::mix_all`].
    pub(crate) fn all_slice(&self) -> BufferSlice {
        self.all.whole()
    }
}

/// Where a chain reads each token's mix from.
#[derive(Clone)]
pub struct MixSource {
    /// u32 mix ids.
    pub ids: BufferSlice,
    /// Index of the first token's id.
    pub offset: u32,
    /// Words between tokens' ids (0: one id for every token).
    pub stride: u32,
}

impl MixSource {
    /// The kernel's view, over `ad`'s scales table.
    pub(crate) fn kernel_mix<'a>(
        &'a self,
        ad: &GpuAdapters,
        scales: &'a BufferSlice,
    ) -> LoraMix<'a> {
        LoraMix {
            scales,
            n_mix: ad.n_mix(),
            mix: &self.ids,
            mix_offset: self.offset,
            mix_stride: self.stride,
        }
    }
}

#[cfg(test)]
#[path = "adapters_tests.rs"]
mod tests;
