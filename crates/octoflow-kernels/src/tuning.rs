//! The kernels' tuning: how products and attention split their work on this device, and the
//! measurement switches that turn fusions off. Read once, when the kernels are built.

use octoflow_vk::DeviceCaps;

use crate::linear::{COOP_MIN_TOKENS, MATVEC_MAX_TOKENS};

/// Compute units assumed where the driver reports none (only NVIDIA's
/// `VK_NV_shader_sm_builtins` and AMD's `VK_AMD_shader_core_properties` do): the order of
/// today's large discrete GPUs. Only split-K depends on it, and a wrong guess costs a second
/// round of workgroups (too many pieces) or idle units (too few), not a wrong result.
pub const FALLBACK_COMPUTE_UNITS: u32 = 128;

/// [`Tuning::dot_min_weights`]' default where 4x8-bit dots are accelerated: the gpt-oss
/// attention projections (1.5M–12M weights) and output matrix take the dot products, qwen2.5's
/// 0.8M-weight projections keep the f32 matvec (docs/PERFORMANCE.md).
pub const DOT_MIN_WEIGHTS: u64 = 1_000_000;

/// [`Tuning::moe_coop_wide_min`]'s default: batches whose pairs average 56 or more an expert
/// (gpt-oss: prompts of 448 tokens or more, whose largest groups pass one tile of 64 pairs)
/// take the tiles of 128 (docs/PERFORMANCE.md: gpt-oss-20b's pp512 on the H100, groups of ~64
/// pairs, faster with them; 128 tokens, groups of up to 25, slower).
pub const MOE_COOP_WIDE_MIN: u32 = 56;

/// [`Tuning::moe_coop_narrow_max`]'s default: none (0), until the tiles of 16 pairs for steps
/// of a few tokens an expert (several streams' decode rows) have run on a device with
/// cooperative matrices (`OCTOFLOW_MOE_COOP_NARROW_MAX=64` takes them up to 64 tokens).
pub const MOE_COOP_NARROW_MAX: u32 = 0;

/// How the kernels split their work and which fusions a recording uses. Built once per device
/// by [`Tuning::for_device`] (defaults from the device's reported limits, then the measurement
/// switches of the environment) and held by [`crate::Linear`] ([`crate::Linear::tuning`]);
/// recordings read it, never the environment. Tests and benchmarks set fields directly and
/// build with [`crate::Linear::with_tuning`].
///
/// | variable | field | effect |
/// |---|---|---|
/// | `OCTOFLOW_COOP_MIN_TOKENS=N` (2 ..= 9) | [`Tuning::coop_min_tokens`] | where products move from the matvec to the cooperative-matrix kernel |
/// | `OCTOFLOW_MATMUL_TARGET_GROUPS=N` (≥ 1) | [`Tuning::matmul_target_groups`] | the workgroups split-K aims at; 1 never splits |
/// | `OCTOFLOW_UNFUSED_ROPE=1` | [`Tuning::unfused_rope`] | decode steps record head norms, RoPE, the KV write and attention as separate stages |
/// | `OCTOFLOW_UNFUSED_GLU=1` | [`Tuning::unfused_glu`] | cooperative-matrix batches record gate and up as two products, a barrier and the GLU kernel |
/// | `OCTOFLOW_UNFUSED_POST=1` | [`Tuning::unfused_post`] | single-token steps of post-norm models (gemma3) record each post-norm and its add as a stage |
/// | `OCTOFLOW_UNFUSED_MOE=1` | [`Tuning::unfused_moe`] | steps of a few tokens record a mixture of experts' norm, router, routing, down products and combine as separate stages |
/// | `OCTOFLOW_MOE_COOP=0` or `1` | [`Tuning::moe_coop`] | batches' expert products on cooperative matrices (the MOE variants of `matmul_coop.comp`) off or on |
/// | `OCTOFLOW_MOE_COOP_WIDE_MIN=N` or `none` | [`Tuning::moe_coop_wide_min`] | grouped expert products on cooperative matrices take the tiles of 128 pairs where the batch's pairs average at least N an expert (0: always), or never |
/// | `OCTOFLOW_MOE_COOP_NARROW_MAX=N` | [`Tuning::moe_coop_narrow_max`] | grouped expert products on cooperative matrices take the tiles of 16 pairs where no group can have more than N pairs (0: never) |
/// | `OCTOFLOW_MATVEC_DOT=0` or `1` | [`Tuning::matvec_dot`] | one-token Q4_K, Q5_K and Q6_K products on 8-bit dot products of a quantized x (`matvec_dot.comp`), off or on |
/// | `OCTOFLOW_DOT_MIN_WEIGHTS=N` or `none` | [`Tuning::dot_min_weights`] | one-token products of the blocks of 32 (Q4_0 … Q8_0) with at least N weights on 8-bit dot products (with [`Tuning::matvec_dot`]), or none |
/// | `OCTOFLOW_QUANTIZE_ONCE=0` or `1` | [`Tuning::quantize_once`] | the 8-bit dot products' x quantized once per product (`quantize_q8.comp`, then `matvec_dot.comp`'s XQ variants) instead of in every workgroup, off or on |
/// | `OCTOFLOW_MOE_DOT=0` or `1` | [`Tuning::moe_dot`] | a few tokens' expert products (MXFP4, Q4_0 … Q8_0, the K-quants) on 8-bit dot products of a quantized x (`moe_dot.comp`), off or on |
/// | `OCTOFLOW_MOE_XQ=0` or `1` | [`Tuning::moe_xq`] | the fused router writes its normed output quantized for the experts' 8-bit GLU products (`moe_dot.comp`'s XQ variants), which then copy it instead of quantizing it in every workgroup, off or on |
/// | `OCTOFLOW_MOE_DOT_GROUPS=N` | [`Tuning::moe_dot_groups`] | the grouped expert products of batches of at most N tokens on 8-bit dot products (`moe_dot.comp`'s GROUPED variants, with [`Tuning::moe_dot`]) instead of the grouped matmuls |
/// | `OCTOFLOW_DOT_BATCHES=0`, `decode` or `1` | [`Tuning::dot_batches`] | products of 2 ..= 8 tokens on 8-bit dot products (`matvec_dot.comp`, every type it reads) instead of the cooperative-matrix kernel: never, for steps whose every row samples ([`DotBatches::Decode`]), or always |
///
/// The switches exist to measure what each fusion gains; results are the same either way
/// (within each path's rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Batches of at least this many tokens take the cooperative-matrix product where the
    /// device has it; default [`COOP_MIN_TOKENS`].
    pub coop_min_tokens: u32,
    /// The cooperative-matrix matmul splits along the columns (split-K) until its workgroups
    /// reach this many: one per compute unit, since its tiles' registers hold one workgroup per
    /// unit (below it the workgroups run their column steps one after another; above it, a
    /// second round of workgroups).
    pub matmul_target_groups: u32,
    /// The cooperative-matrix prefill attention splits its keys until its workgroups reach this
    /// many: four per compute unit (its workgroups are smaller).
    pub attention_target_groups: u32,
    /// Record decode steps without the fused head norms / RoPE / KV write of the attention.
    pub unfused_rope: bool,
    /// Record cooperative-matrix batches without the fused gate/up/activation.
    pub unfused_glu: bool,
    /// Record single-token steps without leaving post-norms to the next block's input.
    pub unfused_post: bool,
    /// Record steps of a few tokens without the fused mixture-of-experts front (`moe_router`)
    /// and the down products' fused combine.
    pub unfused_moe: bool,
    /// Run batches' mixture-of-experts products on cooperative matrices where the device has
    /// them (by default; the kernel tests exercise them there whatever this says, lavapipe has
    /// none).
    pub moe_coop: bool,
    /// With [`Tuning::moe_coop`], batches whose (token, expert) pairs average at least this
    /// many an expert take the grouped products' tiles of 128 pairs instead of 64
    /// ([`crate::moe::MoeExperts::with_coop_wide`]); default [`MOE_COOP_WIDE_MIN`].
    pub moe_coop_wide_min: u32,
    /// With [`Tuning::moe_coop`], batches whose largest possible expert group (their tokens)
    /// has at most this many pairs take the tiles of 16 pairs
    /// ([`crate::moe::MoeExperts::with_coop_narrow`]); default [`MOE_COOP_NARROW_MAX`].
    pub moe_coop_narrow_max: u32,
    /// One-token Q4_K, Q5_K and Q6_K products take `matvec_dot.comp` (x quantized to 8 bits per block of 32,
    /// integer dot products) where the shape fits it. On by default where the device
    /// accelerates 4x8-bit dot products: elsewhere they are emulated and the f32 matvec stays.
    pub matvec_dot: bool,
    /// With [`Tuning::matvec_dot`], one-token products of the blocks of 32 (Q4_0, Q4_1, Q5_0,
    /// Q5_1, Q8_0) of at least this many weights take `matvec_dot.comp` too (smaller ones were
    /// slower there than on the f32 matvec: docs/PERFORMANCE.md). Default [`DOT_MIN_WEIGHTS`]
    /// where [`Tuning::matvec_dot`] is, else `u64::MAX` (none; `OCTOFLOW_DOT_MIN_WEIGHTS=none`).
    pub dot_min_weights: u64,
    /// Products on `matvec_dot.comp` quantize their x once (`quantize_q8.comp`, a dispatch and
    /// two barriers before the product; one for a block's Q, K and V) instead of in each of
    /// their workgroups. On by default where the device accelerates 4x8-bit dot products
    /// (docs/PERFORMANCE.md: eight streams' decode gains, one stream's is unchanged).
    pub quantize_once: bool,
    /// Which products of 2 ..= [`MATVEC_MAX_TOKENS`] tokens take `matvec_dot.comp` (where the
    /// type and shape fit it), leaving the cooperative-matrix kernel (their norms fuse into the
    /// products, as one token's do). [`DotBatches::Decode`] by default where the device
    /// accelerates 4x8-bit dot products (else [`DotBatches::Off`]).
    pub dot_batches: DotBatches,
    /// A few tokens' expert products of the types `moe_dot.comp` reads (MXFP4, the legacy
    /// blocks of 32 and the K-quants) take it: each pair's input quantized to 8 bits per block of 32, integer
    /// dot products. On by default where the device accelerates 4x8-bit dot products
    /// (docs/PERFORMANCE.md: gpt-oss-20b's decode).
    pub moe_dot: bool,
    /// With [`Tuning::moe_dot`], the fused router (`moe_router.comp`) also writes its normed
    /// output quantized per block of 32, and a few tokens' GLU expert products copy it
    /// (`moe_dot.comp`'s XQ variants) instead of quantizing it in each of their workgroups:
    /// no extra dispatch, the router computes those values anyway. On with [`Tuning::moe_dot`].
    pub moe_xq: bool,
    /// With [`Tuning::moe_dot`], the grouped expert products of batches of at most this many
    /// tokens (several sequences' decode rows) take `moe_dot.comp`'s GROUPED variants instead
    /// of the grouped matmuls. 0 (none) by default: measured slower while each of their
    /// workgroups quantized its pairs' inputs (docs/PERFORMANCE.md); their x is now quantized
    /// once per product, which no GPU has measured yet (`OCTOFLOW_MOE_DOT_GROUPS=N`).
    pub moe_dot_groups: u32,
}

/// Which batches of a few rows take the 8-bit dot products ([`Tuning::dot_batches`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotBatches {
    /// None: the f32 matvec below [`Tuning::coop_min_tokens`], cooperative matrices from it.
    Off,
    /// Those of steps whose every row samples a token — several sequences' decode rows, the
    /// step that batched serving repeats and whose time the dot products nearly halve
    /// (docs/PERFORMANCE.md). Prompts and chunks keep the f32 and f16 products: with every
    /// product of a short prompt on 8-bit codes of x, gemma3's greedy tokens part from
    /// llama.cpp's at near-ties on more golden prompts than the agreement tests allow.
    Decode,
    /// Every batch of a few rows (`OCTOFLOW_DOT_BATCHES=1`; tests of the path).
    All,
}

impl DotBatches {
    /// Whether a batch takes the dot products (`decode`: its step's every row samples).
    pub fn takes(self, decode: bool) -> bool {
        match self {
            DotBatches::Off => false,
            DotBatches::Decode => decode,
            DotBatches::All => true,
        }
    }
}

impl Tuning {
    /// The defaults for `caps`: every fusion on, split targets from the device's compute units
    /// ([`DeviceCaps::compute_units`], else [`FALLBACK_COMPUTE_UNITS`]).
    pub fn from_caps(caps: &DeviceCaps) -> Self {
        let base = Self::from_compute_units(caps.compute_units);
        if !(caps.integer_dot_product && caps.int8_dot_accelerated) {
            return Tuning {
                moe_coop: true,
                ..base
            };
        }
        Tuning {
            moe_coop: true,
            matvec_dot: true,
            dot_batches: DotBatches::Decode,
            dot_min_weights: DOT_MIN_WEIGHTS,
            quantize_once: true,
            moe_dot: true,
            moe_xq: true,
            ..base
        }
    }

    /// The defaults for a device of `units` compute units (unknown: `None`).
    fn from_compute_units(units: Option<u32>) -> Self {
        let units = units.unwrap_or(FALLBACK_COMPUTE_UNITS).max(1);
        Tuning {
            coop_min_tokens: COOP_MIN_TOKENS,
            matmul_target_groups: units,
            attention_target_groups: 4 * units,
            unfused_rope: false,
            unfused_glu: false,
            unfused_post: false,
            unfused_moe: false,
            moe_coop: false,
            moe_coop_wide_min: MOE_COOP_WIDE_MIN,
            moe_coop_narrow_max: MOE_COOP_NARROW_MAX,
            matvec_dot: false,
            dot_batches: DotBatches::Off,
            moe_dot: false,
            moe_xq: false,
            moe_dot_groups: 0,
            dot_min_weights: u64::MAX,
            quantize_once: false,
        }
    }

    /// [`Tuning::from_caps`] with the environment's measurement switches (see [`Tuning`]) applied;
    /// a value out of range is ignored (the default stays).
    pub fn for_device(caps: &DeviceCaps) -> Self {
        Self::from_caps(caps).with_switches(|name| std::env::var(name).ok())
    }

    /// Applies the switches `var` returns (a variable's value by name).
    fn with_switches(mut self, var: impl Fn(&str) -> Option<String>) -> Self {
        if let Some(n) = var("OCTOFLOW_COOP_MIN_TOKENS")
            .and_then(|v| v.parse().ok())
            .filter(|n| (2..=MATVEC_MAX_TOKENS + 1).contains(n))
        {
            self.coop_min_tokens = n;
        }
        if let Some(n) = var("OCTOFLOW_MATMUL_TARGET_GROUPS")
            .and_then(|v| v.parse().ok())
            .filter(|&n: &u32| n >= 1)
        {
            self.matmul_target_groups = n;
        }
        if let Some(n) = at_least(var("OCTOFLOW_MOE_COOP_WIDE_MIN"), u32::MAX) {
            self.moe_coop_wide_min = n;
        }
        if let Some(n) = var("OCTOFLOW_MOE_COOP_NARROW_MAX").and_then(|v| v.parse().ok()) {
            self.moe_coop_narrow_max = n;
        }
        if let Some(n) = var("OCTOFLOW_MOE_DOT_GROUPS").and_then(|v| v.parse().ok()) {
            self.moe_dot_groups = n;
        }
        if let Some(n) = at_least(var("OCTOFLOW_DOT_MIN_WEIGHTS"), u64::MAX) {
            self.dot_min_weights = n;
        }
        let on = |name| var(name).is_some_and(|v| v == "1");
        self.unfused_rope = on("OCTOFLOW_UNFUSED_ROPE");
        self.unfused_glu = on("OCTOFLOW_UNFUSED_GLU");
        self.unfused_post = on("OCTOFLOW_UNFUSED_POST");
        self.unfused_moe = on("OCTOFLOW_UNFUSED_MOE");
        // switches with a device-dependent default: "0" off, "1" on, anything else the default
        let either = |name: &str, v: &mut bool| match var(name).as_deref() {
            Some("0") => *v = false,
            Some("1") => *v = true,
            _ => {}
        };
        either("OCTOFLOW_MOE_COOP", &mut self.moe_coop);
        either("OCTOFLOW_MATVEC_DOT", &mut self.matvec_dot);
        either("OCTOFLOW_MOE_DOT", &mut self.moe_dot);
        either("OCTOFLOW_QUANTIZE_ONCE", &mut self.quantize_once);
        either("OCTOFLOW_MOE_XQ", &mut self.moe_xq);
        match var("OCTOFLOW_DOT_BATCHES").as_deref() {
            Some("0") => self.dot_batches = DotBatches::Off,
            Some("decode") => self.dot_batches = DotBatches::Decode,
            Some("1") => self.dot_batches = DotBatches::All,
            _ => {}
        }
        self
    }
}

/// A threshold switch's value: a number, or `none` (the threshold never reached: `never`);
/// `None` where the variable is absent or not a number.
fn at_least<T: std::str::FromStr>(value: Option<String>, never: T) -> Option<T> {
    match value.as_deref() {
        Some("none") => Some(never),
        Some(v) => v.parse().ok(),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_targets_follow_the_reported_compute_units() {
        let t = Tuning::from_compute_units(Some(132));
        assert_eq!(
            (t.matmul_target_groups, t.attention_target_groups),
            (132, 528)
        );
        let t = Tuning::from_compute_units(None);
        assert_eq!(t.matmul_target_groups, FALLBACK_COMPUTE_UNITS);
        assert_eq!(t.coop_min_tokens, COOP_MIN_TOKENS);
        assert!(!(t.unfused_rope || t.unfused_glu || t.unfused_post || t.unfused_moe));
    }

    #[test]
    fn the_8bit_dot_products_are_the_default_only_where_the_device_accelerates_them() {
        let caps = octoflow_vk::testing::recorded_caps();
        let (lavapipe, h100) = (Tuning::from_caps(&caps[0]), Tuning::from_caps(&caps[1]));
        assert!(
            !(lavapipe.matvec_dot || lavapipe.moe_dot || lavapipe.quantize_once || lavapipe.moe_xq)
        );
        assert_eq!(lavapipe.dot_batches, DotBatches::Off);
        assert_eq!(lavapipe.dot_min_weights, u64::MAX);
        assert!(h100.matvec_dot && h100.moe_dot && h100.quantize_once && h100.moe_xq);
        assert_eq!(h100.dot_batches, DotBatches::Decode);
        assert_eq!(h100.dot_min_weights, DOT_MIN_WEIGHTS);
        assert!(lavapipe.moe_coop && h100.moe_coop);
    }

    #[test]
    fn switches_apply_and_out_of_range_values_keep_the_default() {
        let base = Tuning::from_compute_units(Some(8));
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let t = base.with_switches(env(&[
            ("OCTOFLOW_COOP_MIN_TOKENS", "9"),
            ("OCTOFLOW_UNFUSED_GLU", "1"),
            ("OCTOFLOW_UNFUSED_ROPE", "0"),
            ("OCTOFLOW_MATMUL_TARGET_GROUPS", "1"),
            ("OCTOFLOW_MATVEC_DOT", "1"),
            ("OCTOFLOW_DOT_BATCHES", "1"),
            ("OCTOFLOW_UNFUSED_MOE", "1"),
            ("OCTOFLOW_MOE_DOT", "1"),
            ("OCTOFLOW_DOT_MIN_WEIGHTS", "4096"),
            ("OCTOFLOW_MOE_DOT_GROUPS", "64"),
            ("OCTOFLOW_MOE_XQ", "1"),
            ("OCTOFLOW_MOE_COOP_WIDE_MIN", "200"),
            ("OCTOFLOW_MOE_COOP_NARROW_MAX", "48"),
        ]));
        assert_eq!(
            (t.moe_coop_narrow_max, base.moe_coop_narrow_max),
            (48, MOE_COOP_NARROW_MAX)
        );
        assert_eq!(
            (t.moe_coop_wide_min, base.moe_coop_wide_min),
            (200, MOE_COOP_WIDE_MIN)
        );
        let never = t.with_switches(env(&[("OCTOFLOW_MOE_COOP_WIDE_MIN", "none")]));
        assert_eq!(never.moe_coop_wide_min, u32::MAX);
        assert_eq!((t.moe_dot_groups, base.moe_dot_groups), (64, 0));
        assert!(t.moe_xq && !base.moe_xq);
        assert!(t.moe_dot && !base.moe_dot);
        assert_eq!((t.dot_min_weights, base.dot_min_weights), (4096, u64::MAX));
        let none = t.with_switches(env(&[("OCTOFLOW_DOT_MIN_WEIGHTS", "none")]));
        assert_eq!(none.dot_min_weights, u64::MAX);
        let kept = t.with_switches(env(&[("OCTOFLOW_DOT_MIN_WEIGHTS", "x")]));
        assert_eq!(kept.dot_min_weights, 4096);
        assert!(t.matvec_dot && !base.matvec_dot);
        assert_eq!(
            (t.dot_batches, base.dot_batches),
            (DotBatches::All, DotBatches::Off)
        );
        let decode = base.with_switches(env(&[("OCTOFLOW_DOT_BATCHES", "decode")]));
        assert_eq!(decode.dot_batches, DotBatches::Decode);
        assert!(decode.dot_batches.takes(true) && !decode.dot_batches.takes(false));
        assert!(DotBatches::All.takes(false) && !DotBatches::Off.takes(true));
        let on = Tuning {
            matvec_dot: true,
            ..base
        };
        assert!(
            !on.with_switches(env(&[("OCTOFLOW_MATVEC_DOT", "0")]))
                .matvec_dot
        );
        assert!(
            on.with_switches(env(&[("OCTOFLOW_MATVEC_DOT", "x")]))
                .matvec_dot
        );
        assert_eq!(t.coop_min_tokens, 9);
        assert_eq!(t.matmul_target_groups, 1);
        for bad in ["0", "x"] {
            let t = base.with_switches(env(if bad == "0" {
                &[("OCTOFLOW_MATMUL_TARGET_GROUPS", "0")]
            } else {
                &[("OCTOFLOW_MATMUL_TARGET_GROUPS", "x")]
            }));
            assert_eq!(t.matmul_target_groups, base.matmul_target_groups);
        }
        assert!(t.unfused_glu && t.unfused_moe && !t.unfused_rope && !t.unfused_post);
        let bad: [&'static [(&str, &str)]; 3] = [
            &[("OCTOFLOW_COOP_MIN_TOKENS", "1")],
            &[("OCTOFLOW_COOP_MIN_TOKENS", "10")],
            &[("OCTOFLOW_COOP_MIN_TOKENS", "x")],
        ];
        for pairs in bad {
            assert_eq!(
                base.with_switches(env(pairs)).coop_min_tokens,
                COOP_MIN_TOKENS
            );
        }
    }
}
