//! `octoflow serve`: the OpenAI-compatible HTTP server (see the octoflow-serve crate). Banner and
//! logs go to stderr; SIGTERM or ctrl-c stops it gracefully.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use octoflow_model::{CpuBatch, Model};
use octoflow_serve::{Access, Driver, EngineInfo, Limits, ModelInfo, ServeOptions, Server};
use octoflow_text::ChatTemplate;

use super::common::{Device, DeviceArgs, Loaded};

/// Arguments of `octoflow serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a .gguf path, a Hugging Face folder, a known name or a URL (default: the default model).
    #[arg(short = 'm', long)]
    model: Option<String>,
    #[command(flatten)]
    load: super::common::LoadArgs,
    /// Sequences served at once (each with its own KV cache over one copy of the weights).
    #[arg(long, default_value_t = 8)]
    instances: usize,
    /// Context size of each instance in tokens (0: the model's training context, capped at 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    ctx_size: usize,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, shown in the banner).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests that may wait when every instance is busy; more are refused with 429.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Most token rows per batched step (decode tokens plus prompt chunks).
    #[arg(long, default_value_t = 512)]
    max_rows: usize,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// The model's name in the API (default: the file name without .gguf).
    #[arg(long)]
    alias: Option<String>,
    /// A Jinja chat template file overriding the model's.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// On SIGTERM, seconds running requests may go on before they are cancelled.
    #[arg(long, default_value_t = 30)]
    grace: u64,
    /// Serve a LoRA adapter beside the base (repeatable): NAME=PATH (an adapter GGUF or an
    /// `octoflow train` run directory), or PATH (named after the file). A request's `model`
    /// field picks it; requests for different adapters share the batched steps. GPU only.
    #[arg(long = "lora", value_name = "NAME=PATH")]
    lora: Vec<String>,
    /// Require `Authorization: Bearer KEY` on every route but /health (401 without it).
    #[arg(long, env = "OCTOFLOW_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Send CORS headers for these browser origins (comma-separated; `*` for any). Without it
    /// there are none.
    #[arg(long, value_name = "ORIGINS", value_delimiter = ',')]
    cors: Vec<String>,
    /// Most tokens one completion may generate, also when a request names no limit.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: u32,
    /// Connections open at once; more wait to be accepted.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Seconds a client may take to send a request's headers, and an idle connection stays open.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout: u64,
    /// Seconds a request's body may take to arrive (408 beyond).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout: u64,
    /// Host names a server on a loopback address also answers to (repeatable; `*` for any).
    /// Others are refused (403): a web page cannot reach the server through DNS rebinding.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// KV cache memory shared by the instances (GPU): a number of token positions (e.g.
    /// 65536), or a fraction of the device memory the weights leave (e.g. 0.8). A request
    /// waits until its prompt and max_tokens fit (and is refused if they never can). Default:
    /// a whole context for every instance.
    #[arg(long, value_name = "POSITIONS|FRACTION", value_parser = parse_kv_size)]
    kv_size: Option<KvSize>,
    /// Run every prompt whole, even where the KV cache holds its start (a chat's earlier
    /// turns, a shared system prompt).
    #[arg(long)]
    no_prefix_cache: bool,
    /// A prompt longer than the context keeps its first `--keep` tokens and its newest, half
    /// the context left for the completion (llama-server's context shift), instead of being
    /// refused with 400 context_length_exceeded.
    #[arg(long)]
    context_shift: bool,
    /// Tokens at the start of a prompt that a context shift keeps (default: the BOS, where the
    /// model adds one).
    #[arg(long, requires = "context_shift")]
    keep: Option<usize>,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    homeo: super::homeo::HomeoArgs,
}

/// Runs `octoflow serve`.
pub fn run(args: Args) -> anyhow::Result<()> {
    // main() restores SIGPIPE's default so that a command piped into `head` ends quietly; a
    // server must instead survive its log pipe closing (the access log writes per request)
    #[cfg(unix)]
    // SAFETY: sets a signal's disposition; no handler is installed
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    if args.instances == 0 {
        bail!("--instances must be at least 1");
    }
    let path = super::common::model_path(args.model.as_deref())?;
    let gguf = Arc::new(args.load.open(&path)?);
    let tokenizer = Arc::new(super::common::tokenizer(&path, &gguf)?);
    let template = match &args.chat_template {
        Some(file) => ChatTemplate::from_file_for_model(file, &gguf)?,
        None => ChatTemplate::from_gguf(&gguf)?,
    };
    let model = Model::from_gguf(gguf.clone()).context("loading the model")?;
    let mut adapters = Vec::new();
    for spec in &args.lora {
        let (name, file) = match spec.split_once('=') {
            Some((n, p)) if !n.is_empty() => (Some(n.to_string()), PathBuf::from(p)),
            _ => (None, PathBuf::from(spec)),
        };
        let mut ad = super::common::load_adapter(&file, &model.config)?;
        if let Some(n) = name {
            ad.name = n;
        }
        if adapters
            .iter()
            .any(|a: &octoflow_model::Adapter| a.name == ad.name)
        {
            bail!("--lora: two adapters are named {}", ad.name);
        }
        adapters.push(ad);
    }
    if !adapters.is_empty() && args.device.device == Device::Cpu {
        bail!("--lora: serving adapters needs the GPU path (the CPU reference merges adapters at load: use `run --device cpu --lora`)");
    }
    let n_ctx = if args.ctx_size > 0 {
        args.ctx_size
    } else {
        model.config.n_ctx_train.min(4096)
    };
    let id = args.alias.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .or_else(|_| {
            use std::net::ToSocketAddrs;
            (args.host.as_str(), args.port)
                .to_socket_addrs()?
                .next()
                .context("the host resolves to no address")
        })
        .with_context(|| format!("--host {} --port {}", args.host, args.port))?;
    if adapters.iter().any(|a| a.name == id) {
        bail!("--lora: an adapter is named like the model ({id})");
    }
    let info = ModelInfo {
        adapters: adapters.iter().map(|a| a.name.clone()).collect(),
        id,
        tokenizer,
        template: Some(Arc::new(template)),
    };
    let opts = ServeOptions {
        queue: args.queue,
        body_limit: args.max_body,
        prefill_chunk: args.max_rows,
        grace: Duration::from_secs(args.grace),
        access: Access {
            api_key: args.api_key.clone().filter(|k| !k.is_empty()),
            cors: args.cors.clone(),
        },
        max_tokens: args.max_tokens as usize,
        limits: Limits {
            max_connections: args.max_connections as usize,
            header_timeout: Duration::from_secs(args.header_timeout),
            body_timeout: Duration::from_secs(args.body_timeout),
        },
        allowed_hosts: args.allowed_hosts.clone(),
        prefix_cache: !args.no_prefix_cache,
        context_shift: args.context_shift.then(|| {
            let bos = info.tokenizer.special();
            args.keep
                .unwrap_or(usize::from(bos.add_bos && bos.bos.is_some()))
        }),
    };
    let warning = opts.access.exposure_warning(&addr);
    let shape = Shape {
        instances: args.instances,
        n_ctx,
        max_rows: args.max_rows,
        kv_size: args.kv_size,
    };
    if args.kv_size.is_some() && args.device.device == Device::Cpu {
        bail!("--kv-size: the CPU reference gives every instance its own cache (no shared pool)");
    }
    let device = args.device.clone();
    args.homeo.targets()?;
    let homeo = args.homeo.clone();
    let factory =
        move |driver: Driver| run_engine(driver, model, &adapters, &device, &homeo, shape);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let server = Server::start(addr, info, opts, factory).await?;
        note(&server.banner());
        if let Some(w) = warning {
            note(&w);
        }
        server.run(shutdown_then_force()).await?;
        note("octoflow serve: stopped");
        Ok(())
    })
}

/// A line on stderr that may go nowhere: a server outlives the terminal or pipe that started
/// it, so a closed stderr must neither kill it (SIGPIPE) nor panic it (`eprintln!`).
fn note(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Resolves at the first SIGTERM or Ctrl-C (graceful shutdown); a second Ctrl-C exits at once.
async fn shutdown_then_force() {
    octoflow_serve::shutdown_signal().await;
    note("octoflow serve: stopping (Ctrl-C again to exit now)");
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            note("octoflow serve: exiting now");
            std::process::exit(130);
        }
    });
}

/// The engine's shape.
#[derive(Clone, Copy)]
struct Shape {
    instances: usize,
    n_ctx: usize,
    max_rows: usize,
    kv_size: Option<KvSize>,
}

/// `--kv-size`: positions, or a fraction of the memory left after the weights.
#[derive(Clone, Copy, Debug, PartialEq)]
enum KvSize {
    Positions(usize),
    Fraction(f64),
}

fn parse_kv_size(s: &str) -> Result<KvSize, String> {
    if s.contains('.') {
        match s.parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(KvSize::Fraction(f)),
            _ => Err(format!("{s:?} is not a fraction in (0, 1]")),
        }
    } else {
        match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(KvSize::Positions(n)),
            _ => Err(format!(
                "{s:?} is neither a number of positions nor a fraction like 0.8"
            )),
        }
    }
}

/// KV positions for `--kv-size` on a device of `memory` bytes of which `used` hold the weights,
/// each position taking `per_position` bytes over all layers.
fn kv_positions(size: KvSize, memory: u64, used: u64, per_position: u64) -> usize {
    match size {
        KvSize::Positions(n) => n,
        KvSize::Fraction(f) => {
            let left = memory.saturating_sub(used) as f64 * f;
            (left / per_position.max(1) as f64) as usize
        }
    }
}

/// Runs on the scheduler thread: builds the batch engine on the chosen device (it borrows the
/// model, which this frame owns) and serves with it until shutdown.
fn run_engine(
    driver: Driver,
    model: Model,
    adapters: &[octoflow_model::Adapter],
    device: &DeviceArgs,
    homeo: &super::homeo::HomeoArgs,
    s: Shape,
) -> anyhow::Result<()> {
    match device.device {
        Device::Cpu => {
            if homeo.targets()?.any() {
                homeo.start(None, "octoflow serve")?;
            }
            let mut engine = CpuBatch::new(&model, s.instances, s.n_ctx, s.max_rows);
            let info = EngineInfo {
                device: "CPU reference".into(),
                memory: None,
            };
            driver.run(&mut engine, info)
        }
        Device::Gpu => {
            let Loaded::Gpu(mut gpu) = Loaded::new(&model, device)? else {
                bail!("the GPU was not opened");
            };
            if !adapters.is_empty() {
                gpu.set_adapters(adapters, &vec![1.0; adapters.len()])
                    .context("loading the adapters onto the GPU")?;
            }
            let positions = match s.kv_size {
                None => s.instances.saturating_mul(s.n_ctx),
                Some(size) => {
                    let c = &model.config;
                    let kv = gpu.kv_type();
                    let per_position = c.n_layer as u64
                        * (kv.bytes_for((c.n_head_kv * c.head_dim) as u64)
                            + kv.bytes_for((c.n_head_kv * c.head_dim_v) as u64));
                    let used = gpu.weight_bytes() + gpu.adapters().map_or(0, |a| a.bytes);
                    let memory = gpu.context().caps().device_local_bytes();
                    kv_positions(size, memory, used, per_position)
                }
            };
            let mut engine = gpu
                .batch_with(s.instances, s.n_ctx, s.max_rows, positions)
                .with_context(|| {
                    format!("allocating a KV cache of {positions} positions and the instances' buffers on the GPU")
                })?;
            // before the port is bound: the first requests find every chain recorded
            super::warm::warm_up("octoflow serve", gpu.context(), || Ok(engine.warm_up()?))?;
            let caps = gpu.context().caps();
            driver.set_pacer(homeo.start(Some(caps), "octoflow serve")?);
            let info = EngineInfo {
                device: format!("{} ({} {})", caps.name, caps.driver_name, caps.driver_info),
                memory: Some((
                    gpu.weight_bytes() + gpu.adapters().map_or(0, |a| a.bytes) + engine.bytes(),
                    caps.device_local_bytes(),
                )),
            };
            let warmed = gpu.context().pipelines_built();
            let served = driver.run(&mut engine, info);
            let late = gpu.context().pipelines_built() - warmed;
            if late > 0 {
                // a request waited for the driver's compiler: the warm-up missed a shape
                note(&format!("octoflow serve: {late} pipeline(s) were built after the warm-up (RUST_LOG=octoflow_vk=debug names them)"));
            }
            super::warm::save_pipelines(gpu.context());
            served
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_size_is_positions_or_a_fraction_of_what_the_weights_leave() {
        assert_eq!(parse_kv_size("65536"), Ok(KvSize::Positions(65536)));
        assert_eq!(parse_kv_size("0.5"), Ok(KvSize::Fraction(0.5)));
        assert_eq!(parse_kv_size("1.0"), Ok(KvSize::Fraction(1.0)));
        for bad in ["0", "-3", "1.5", "0.0", "x", "", "nan"] {
            assert!(parse_kv_size(bad).is_err(), "{bad:?}");
        }
        // 0.5 of the 600 bytes the weights leave, 10 bytes a position
        assert_eq!(kv_positions(KvSize::Fraction(0.5), 1000, 400, 10), 30);
        assert_eq!(kv_positions(KvSize::Fraction(0.5), 100, 400, 10), 0);
        assert_eq!(kv_positions(KvSize::Positions(77), 0, 0, 0), 77);
    }
}
