//! What several commands share: turning `-m MODEL` into a local file.

use std::path::PathBuf;

use anyhow::Context;

/// Resolves a `-m` argument (path, known model name or URL; `None` = the default model) to a local
/// `.gguf`, downloading it into the cache when needed.
pub fn model_path(spec: Option<&str>) -> anyhow::Result<PathBuf> {
    let spec = spec.unwrap_or_else(|| octoflow_hub::default_model());
    if octoflow_hf::is_folder(std::path::Path::new(spec)) {
        return Ok(PathBuf::from(spec));
    }
    let opts = octoflow_hub::PullOptions::from_env()?;
    octoflow_hub::resolve_model(spec, &opts).with_context(|| format!("model {spec:?}"))
}

/// Opens a model's GGUF file.
pub fn open_gguf(spec: Option<&str>) -> anyhow::Result<(PathBuf, octoflow_gguf::GgufFile)> {
    let path = model_path(spec)?;
    let file = open_model(&path)?;
    Ok((path, file))
}

/// Opens a resolved model: a `.gguf` file, or a Hugging Face folder read as the GGUF llama.cpp's
/// converter would write (octoflow-hf), so every command taking one takes the other.
pub fn open_model(path: &std::path::Path) -> anyhow::Result<octoflow_gguf::GgufFile> {
    Ok(octoflow_hf::open_model(path)?)
}

/// The tokenizer of a resolved model, from its metadata; for a Hugging Face folder encoding
/// through the folder's own `tokenizer.json` (the `tokenizers` crate), as transformers does.
pub fn tokenizer(
    path: &std::path::Path,
    gguf: &octoflow_gguf::GgufFile,
) -> anyhow::Result<octoflow_text::Tokenizer> {
    let tokenizer = octoflow_text::Tokenizer::from_gguf(gguf).context("building the tokenizer")?;
    if !octoflow_hf::is_folder(path) {
        return Ok(tokenizer);
    }
    Ok(tokenizer.with_tokenizer_json(&path.join("tokenizer.json"))?)
}

/// `--quant`: a Hugging Face folder's matrices quantized as it is loaded.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoadArgs {
    /// With a Hugging Face folder: store its matrices as this type when loading (Q8_0, Q4_K,
    /// Q5_K, Q6_K, F16, F32; the codecs of `convert` and `export`), instead of as saved (F32,
    /// F16 or BF16). A .gguf is already in its types: convert the folder instead.
    #[arg(long, value_name = "TYPE")]
    pub quant: Option<String>,
}

impl LoadArgs {
    /// [`open_model`] with the matrices quantized per `--quant`.
    pub fn open(&self, path: &std::path::Path) -> anyhow::Result<octoflow_gguf::GgufFile> {
        let Some(q) = &self.quant else {
            return open_model(path);
        };
        let ty = match q.parse::<octoflow_train::export::MergeQuant>()? {
            octoflow_train::export::MergeQuant::To(ty) => ty,
            octoflow_train::export::MergeQuant::Same => return open_model(path),
        };
        if !octoflow_hf::is_folder(path) {
            anyhow::bail!(
                "--quant {q}: {} is a GGUF file, already stored in its own types; --quant \
                 quantizes a Hugging Face folder as it loads",
                path.display()
            );
        }
        let started = std::time::Instant::now();
        let gguf = octoflow_hf::HfFolder::open(path)?.to_gguf(Some(ty))?;
        eprintln!(
            "octoflow: {} quantized to {ty} at load in {:.1} s",
            path.display(),
            started.elapsed().as_secs_f64()
        );
        Ok(gguf)
    }
}

/// Where the forward pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Device {
    /// The Vulkan GPU path (the best device, or `--gpu N`; lavapipe on a machine without a GPU).
    Gpu,
    /// The CPU reference path (f32 math over the quantized weights).
    Cpu,
}

/// Device flags shared by the commands that run a model.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to run.
    #[arg(long, value_enum, default_value_t = Device::Gpu)]
    pub device: Device,
    /// Vulkan device index (see `octoflow devices`); overrides OCTOFLOW_GPU.
    #[arg(long)]
    pub gpu: Option<usize>,
    /// What the GPU's KV cache holds, keys and values alike (llama.cpp's `-ctk`/`-ctv`):
    /// f16 (half the memory, llama.cpp's default), q8_0 (llama.cpp's blocks of 32 int8s and a
    /// scale: 0.56× f16's memory; heads of a multiple of 32 values) or f32. The CPU reference
    /// keeps f32.
    #[arg(long, value_name = "TYPE", default_value = "f16", value_parser = parse_kv_type)]
    pub cache_type: octoflow_model::gpu::KvType,
}

/// `--cache-type`'s parser (the error lists the accepted names).
fn parse_kv_type(s: &str) -> Result<octoflow_model::gpu::KvType, String> {
    s.parse()
        .map_err(|e: octoflow_model::gpu::UnknownKvType| e.to_string())
}

/// A model on the device chosen by [`DeviceArgs`]: the CPU reference needs nothing more, the
/// GPU path uploads the weights.
#[allow(clippy::large_enum_variant)] // one per process, never moved around in bulk
pub enum Loaded {
    Cpu,
    Gpu(octoflow_model::gpu::GpuModel),
}

/// One sequence on either path.
#[allow(clippy::large_enum_variant)] // one per command, never moved around in bulk
pub enum AnySession<'m> {
    Cpu(octoflow_model::Session<'m>),
    Gpu(octoflow_model::gpu::GpuSession<'m>),
}

impl AnySession<'_> {
    /// The session as the common forward interface.
    pub fn as_dyn(&mut self) -> &mut dyn octoflow_model::Forward {
        match self {
            AnySession::Cpu(s) => s,
            AnySession::Gpu(s) => s,
        }
    }
}

/// LoRA flags of `run` and `perplexity` (llama.cpp's `--lora`, `--lora-scaled`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoraArgs {
    /// A LoRA adapter applied at scale 1 (repeatable): a llama.cpp adapter GGUF or an
    /// `octoflow train` run directory. On the GPU adapters are applied on the fly; the CPU
    /// reference merges them into its weights at load.
    #[arg(long = "lora", value_name = "PATH")]
    pub lora: Vec<PathBuf>,
    /// A LoRA adapter with a user scale (repeatable).
    #[arg(long = "lora-scaled", num_args = 2, value_names = ["PATH", "SCALE"])]
    pub lora_scaled: Vec<String>,
}

impl LoraArgs {
    /// Reads every adapter named, for a model of config `c`, with its scale.
    pub fn load(
        &self,
        c: &octoflow_model::ModelConfig,
    ) -> anyhow::Result<Vec<(octoflow_model::Adapter, f32)>> {
        let mut specs: Vec<(PathBuf, f32)> = self.lora.iter().map(|p| (p.clone(), 1.0)).collect();
        for pair in self.lora_scaled.chunks(2) {
            let [path, scale] = pair else {
                anyhow::bail!("--lora-scaled takes a path and a scale");
            };
            let s: f32 = scale
                .parse()
                .ok()
                .filter(|s: &f32| s.is_finite())
                .with_context(|| format!("--lora-scaled {path} {scale}: bad scale"))?;
            specs.push((PathBuf::from(path), s));
        }
        specs
            .into_iter()
            .map(|(path, scale)| {
                let ad = load_adapter(&path, c)?;
                eprintln!(
                    "octoflow: LoRA {} ({} projections, alpha {}) at scale {scale}",
                    path.display(),
                    ad.tensors.len(),
                    ad.alpha
                );
                Ok((ad, scale))
            })
            .collect()
    }
}

/// An adapter GGUF, a PEFT adapter folder, or the adapters of a training run directory.
pub fn load_adapter(
    path: &std::path::Path,
    c: &octoflow_model::ModelConfig,
) -> anyhow::Result<octoflow_model::Adapter> {
    if octoflow_hf::peft::is_adapter(path) {
        let file = octoflow_hf::peft::read(path, &peft_base(c))?;
        let name = path
            .file_name()
            .map_or_else(|| "lora".into(), |s| s.to_string_lossy().into_owned());
        octoflow_model::Adapter::from_gguf(&file, &name, c)
            .with_context(|| format!("loading PEFT adapter {}", path.display()))
    } else if path.is_dir() {
        octoflow_train::run::load_adapter(path, c)
            .with_context(|| format!("loading the adapters of run {}", path.display()))
    } else {
        octoflow_model::Adapter::open(path, c)
            .with_context(|| format!("loading LoRA adapter {}", path.display()))
    }
}

/// What a PEFT adapter's layout depends on in a model of config `c`.
pub fn peft_base(c: &octoflow_model::ModelConfig) -> octoflow_hf::peft::Base<'_> {
    octoflow_hf::peft::Base {
        arch: c.arch.name(),
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
    }
}

/// Binds `gguf` as a model and loads it where `device` says, with `adapters` (each with its
/// scale): applied on the fly on the GPU, merged into F32 weights on the CPU reference.
pub fn load_model(
    gguf: std::sync::Arc<octoflow_gguf::GgufFile>,
    adapters: &[(octoflow_model::Adapter, f32)],
    device: &DeviceArgs,
) -> anyhow::Result<(octoflow_model::Model, Loaded)> {
    let base = octoflow_model::Model::from_gguf(gguf.clone()).context("loading the model")?;
    if adapters.is_empty() {
        let loaded = Loaded::new(&base, device)?;
        return Ok((base, loaded));
    }
    if device.device == Device::Cpu {
        let pairs: Vec<_> = adapters.iter().map(|(a, s)| (a, *s)).collect();
        let merged =
            octoflow_train::merge::merged_file(&gguf, &pairs).context("merging the adapters")?;
        let model = octoflow_model::Model::from_gguf(std::sync::Arc::new(merged))
            .context("loading the merged model")?;
        return Ok((model, Loaded::Cpu));
    }
    let mut loaded = Loaded::new(&base, device)?;
    if let Loaded::Gpu(g) = &mut loaded {
        let (ads, scales): (Vec<_>, Vec<_>) = adapters.iter().cloned().unzip();
        g.set_adapters(&ads, &scales)
            .context("loading the adapters onto the GPU")?;
    }
    Ok((base, loaded))
}

impl Loaded {
    /// Loads `model` where `args` say; prints the device and memory to stderr.
    pub fn new(model: &octoflow_model::Model, args: &DeviceArgs) -> anyhow::Result<Self> {
        if args.device == Device::Cpu {
            eprintln!("octoflow: device: CPU reference");
            return Ok(Loaded::Cpu);
        }
        let ctx = super::warm::open_device(args.gpu)?;
        let mut gpu = octoflow_model::gpu::GpuModel::load(&ctx, model)
            .context("loading the model onto the GPU")?;
        gpu.set_kv_type(args.cache_type).context("--cache-type")?;
        let caps = ctx.caps();
        eprintln!(
            "octoflow: device: {} ({}, {}) | weights {:.1} MiB | KV cache {}",
            caps.name,
            caps.driver_name,
            caps.driver_info,
            gpu.weight_bytes() as f64 / (1 << 20) as f64,
            args.cache_type
        );
        Ok(Loaded::Gpu(gpu))
    }

    /// A new session of `n_ctx` positions decoding `steps` tokens per submit on the GPU.
    pub fn session<'m>(
        &'m self,
        model: &'m octoflow_model::Model,
        n_ctx: usize,
        steps: usize,
    ) -> anyhow::Result<AnySession<'m>> {
        Ok(match self {
            Loaded::Cpu => AnySession::Cpu(model.session(n_ctx)),
            Loaded::Gpu(g) => AnySession::Gpu(
                g.session(n_ctx, steps)
                    .context("allocating the session's KV cache and buffers on the GPU")?,
            ),
        })
    }
}

/// `-n`: a number of tokens of at least 1, or -1 for "until the end of generation or a full
/// context" (llama.cpp's meaning). 0 and other negatives are refused rather than read as
/// something else.
pub fn parse_n_predict(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 || n == -1 => Ok(n),
        Ok(n) => Err(format!(
            "{n} is not a token count: give at least 1, or -1 for no limit"
        )),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

/// A sampling setting that must be a finite number of at least 0 (`--temp`: 0 is greedy).
pub fn parse_non_negative(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Ok(x) => Err(format!("{x} is out of range: give a number of at least 0")),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn token_counts_and_temperatures_refuse_what_would_be_misread() {
        assert_eq!(parse_n_predict("5"), Ok(5));
        assert_eq!(parse_n_predict("-1"), Ok(-1));
        for bad in ["0", "-5", "x", ""] {
            assert!(parse_n_predict(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_non_negative("0"), Ok(0.0));
        assert_eq!(parse_non_negative("0.7"), Ok(0.7));
        for bad in ["-1", "nan", "inf", "warm"] {
            assert!(parse_non_negative(bad).is_err(), "{bad}");
        }
    }
}
