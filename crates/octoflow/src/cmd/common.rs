//! What several commands share: turning `-m MODEL` into a local file.

use std::path::PathBuf;

use anyhow::Context;

/// Resolves a `-m` argument (path, known model name or URL; `None` = the default model) to a local
/// `.gguf`, downloading it into the cache when needed.
pub fn model_path(spec: Option<&str>) -> anyhow::Result<PathBuf> {
    let spec = spec.unwrap_or_else(|| octoflow_hub::default_model());
    let opts = octoflow_hub::PullOptions::from_env()?;
    octoflow_hub::resolve_model(spec, &opts).with_context(|| format!("model {spec:?}"))
}

/// Opens a model's GGUF file.
pub fn open_gguf(spec: Option<&str>) -> anyhow::Result<(PathBuf, octoflow_gguf::GgufFile)> {
    let path = model_path(spec)?;
    let file = octoflow_gguf::GgufFile::open(&path)?;
    Ok((path, file))
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
}

/// A model on the device chosen by [`DeviceArgs`]: the CPU reference needs nothing more, the
/// GPU path uploads the weights.
pub enum Loaded {
    Cpu,
    Gpu(octoflow_model::gpu::GpuModel),
}

/// One sequence on either path.
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

impl Loaded {
    /// Loads `model` where `args` say; prints the device and memory to stderr.
    pub fn new(model: &octoflow_model::Model, args: &DeviceArgs) -> anyhow::Result<Self> {
        if args.device == Device::Cpu {
            eprintln!("octoflow: device: CPU reference");
            return Ok(Loaded::Cpu);
        }
        let choice = args.gpu.map_or(
            octoflow_vk::DeviceChoice::Auto,
            octoflow_vk::DeviceChoice::Index,
        );
        let ctx = octoflow_vk::Context::new(choice)
            .context("opening a Vulkan device (use --device cpu for the CPU reference)")?;
        let gpu = octoflow_model::gpu::GpuModel::load(&ctx, model)
            .context("loading the model onto the GPU")?;
        let caps = ctx.caps();
        eprintln!(
            "octoflow: device: {} ({}, {}) | weights {:.1} MiB",
            caps.name,
            caps.driver_name,
            caps.driver_info,
            gpu.weight_bytes() as f64 / (1 << 20) as f64
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
