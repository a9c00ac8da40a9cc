#![allow(dead_code)]
//! A server on port 0 with the CPU batch engine over the smallest real model
//! (`smollm2-135m-instruct-q4_1` from `$OCTOFLOW_HOME/models`, default
//! `~/.cache/octoflow/models`; tests skip when it is absent), a client, and the single-session
//! CPU reference the server's greedy output is compared with.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use octoflow_model::{CpuBatch, Logits, Model};
use octoflow_serve::{EngineInfo, ModelInfo, ServeOptions, Server};
use octoflow_text::stream::StreamDecoder;
use octoflow_text::{ChatTemplate, Message, Tokenizer};
use serde_json::Value;

pub const MODEL: &str = "smollm2-135m-instruct-q4_1";

/// The model file, or `None` (with a note) when it is not in the cache.
pub fn model_path() -> Option<PathBuf> {
    let root = std::env::var_os("OCTOFLOW_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/octoflow")))?;
    let path = root.join("models").join(format!("{MODEL}.gguf"));
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "skipped: {} is absent (octoflow pull {MODEL})",
            path.display()
        );
        None
    }
}

/// The tokenizer and template of the test model.
pub struct Text {
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    pub path: PathBuf,
}

pub fn text() -> Option<Text> {
    let path = model_path()?;
    let gguf = octoflow_gguf::GgufFile::open(&path).expect("model opens");
    Some(Text {
        tokenizer: Arc::new(Tokenizer::from_gguf(&gguf).expect("tokenizer")),
        template: Arc::new(ChatTemplate::from_gguf(&gguf).expect("template")),
        path,
    })
}

/// A running server.
pub struct Running {
    pub base: String,
    pub client: reqwest::Client,
    pub text: Text,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

/// Server shape for a test.
#[derive(Clone, Copy)]
pub struct Shape {
    pub instances: usize,
    pub n_ctx: usize,
    pub queue: usize,
    pub grace: Duration,
    pub body_limit: usize,
    /// Rows per step (prompt chunks are at most this long).
    pub max_rows: usize,
    /// The batched GPU engine (`GpuBatch`, lavapipe in CI) instead of `CpuBatch`.
    pub gpu: bool,
    /// Serve a random LoRA adapter named [`ADAPTER`] beside the base (GPU engine only).
    pub adapter: bool,
    /// Connection cap and deadlines.
    pub limits: octoflow_serve::Limits,
    /// The server's cap on tokens per completion.
    pub max_tokens: usize,
    /// Reuse what instances' caches hold of new prompts.
    pub prefix_cache: bool,
    /// Tokens a too-long prompt keeps at its start when shifted (`None`: refused).
    pub context_shift: Option<usize>,
    /// KV pool positions of the GPU engine (`None`: a context per instance).
    pub kv_positions: Option<usize>,
}

/// The served adapter's name (with `Shape::adapter`).
pub const ADAPTER: &str = "tuned";

/// A random rank-4 adapter on every projection of every layer (seed printed), big enough to
/// change greedy continuations.
pub fn random_adapter(c: &octoflow_model::ModelConfig) -> octoflow_model::Adapter {
    use octoflow_model::testing::{random_adapter, rng};
    let mut rng = rng("serve_random_adapter");
    random_adapter(
        ADAPTER,
        c,
        4,
        4.0,
        &octoflow_model::Target::ALL,
        &[],
        1.0,
        &mut rng,
    )
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            instances: 4,
            n_ctx: 256,
            queue: 64,
            grace: Duration::from_secs(30),
            body_limit: 1 << 20,
            max_rows: 512,
            gpu: false,
            adapter: false,
            limits: octoflow_serve::Limits::default(),
            max_tokens: 4096,
            prefix_cache: true,
            context_shift: None,
            kv_positions: None,
        }
    }
}

pub async fn start(shape: Shape) -> Option<Running> {
    let text = text()?;
    let path = text.path.clone();
    let info = ModelInfo {
        id: MODEL.into(),
        tokenizer: text.tokenizer.clone(),
        template: Some(text.template.clone()),
        adapters: if shape.adapter {
            vec![ADAPTER.to_string()]
        } else {
            Vec::new()
        },
    };
    let opts = ServeOptions {
        queue: shape.queue,
        body_limit: shape.body_limit,
        prefill_chunk: shape.max_rows,
        grace: shape.grace,
        limits: shape.limits,
        max_tokens: shape.max_tokens,
        prefix_cache: shape.prefix_cache,
        context_shift: shape.context_shift,
        ..Default::default()
    };
    let server = Server::start(
        "127.0.0.1:0".parse().expect("address"),
        info,
        opts,
        move |driver| {
            let model = Model::open(&path)?;
            if shape.gpu {
                let ctx = octoflow_vk::Context::new(octoflow_vk::DeviceChoice::Auto)?;
                let mut gpu = octoflow_model::gpu::GpuModel::load(&ctx, &model)?;
                if shape.adapter {
                    gpu.set_adapters(&[random_adapter(&model.config)], &[1.0])?;
                }
                let positions = shape.kv_positions.unwrap_or(shape.instances * shape.n_ctx);
                let mut engine =
                    gpu.batch_with(shape.instances, shape.n_ctx, shape.max_rows, positions)?;
                let info = EngineInfo {
                    device: ctx.caps().name.clone(),
                    memory: None,
                };
                return driver.run(&mut engine, info);
            }
            let mut engine = CpuBatch::new(&model, shape.instances, shape.n_ctx, shape.max_rows);
            driver.run(
                &mut engine,
                EngineInfo {
                    device: "CPU".into(),
                    memory: None,
                },
            )
        },
    )
    .await
    .expect("server starts");
    let base = format!("http://{}", server.local_addr().expect("bound"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    Some(Running {
        base,
        client: reqwest::Client::new(),
        text,
        stop: Some(tx),
        task: Some(task),
    })
}

impl Running {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs a JSON body; returns the status and the JSON answer.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request sent");
        let status = r.status().as_u16();
        let v = r.json().await.unwrap_or(Value::Null);
        (status, v)
    }

    /// POSTs raw bytes.
    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request sent");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// POSTs with `"stream": true` and returns every `data:` payload, `[DONE]` included.
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request sent");
        assert_eq!(r.status(), 200);
        let mut bytes = r.bytes_stream();
        let mut buf = String::new();
        while let Some(chunk) = bytes.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        }
        data_lines(&buf)
    }

    /// A metric's value from `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self
            .client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Waits up to `secs` for a metric to reach `want`.
    pub async fn wait_metric(&self, name: &str, want: f64, secs: u64) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            if self.metric(name).await == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Shuts down and waits for the server to stop.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(t) => t.await?,
            None => Ok(()),
        }
    }

    /// Sends the shutdown signal without waiting.
    pub fn begin_stop(&mut self) -> Option<tokio::task::JoinHandle<anyhow::Result<()>>> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.take()
    }

    /// The prompt ids of a chat (as the server renders it).
    pub fn chat_prompt(&self, user: &str) -> Vec<u32> {
        let text = self
            .text
            .template
            .render(&[Message::user(user)], true)
            .expect("template renders");
        self.text.tokenizer.encode(&text, true, true)
    }

    /// The completion prompt ids (as the server tokenizes it).
    pub fn prompt(&self, text: &str) -> Vec<u32> {
        self.text.tokenizer.encode(text, true, true)
    }

    /// Greedy text of `n` tokens (or up to end-of-generation) from one CPU session alone.
    pub fn reference(&self, prompt: &[u32], n: usize) -> String {
        self.reference_chunked(prompt, n, usize::MAX)
    }

    /// [`Running::reference`] with the prompt run in chunks of `chunk` tokens (chunk boundaries
    /// change the float summation order, so the server's chunking is mirrored).
    pub fn reference_chunked(&self, prompt: &[u32], n: usize, chunk: usize) -> String {
        let model = Model::open(&self.text.path).expect("model");
        let mut s = model.session(prompt.len() + n + 1);
        let mut logits = Vec::new();
        for (i, part) in prompt.chunks(chunk).enumerate() {
            logits = s.forward(part, i * chunk, Logits::Last).expect("prefill");
        }
        let tok = &self.text.tokenizer;
        let mut dec: StreamDecoder = tok.stream_decoder();
        let mut out = String::new();
        for i in 0..n {
            let t = octoflow_core::sampling::argmax(&logits);
            if tok.is_eog(t) {
                break;
            }
            out.push_str(&dec.push(t));
            if i + 1 < n {
                let pos = s.n_past();
                logits = s.forward(&[t], pos, Logits::Last).expect("decode");
            }
        }
        out.push_str(&dec.finish());
        out
    }
}

/// The payloads of `data:` lines of an SSE body.
pub fn data_lines(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_string)
        .collect()
}

/// The concatenated text of streamed chunks (chat `delta.content` or completion `text`).
pub fn streamed_text(chunks: &[String]) -> String {
    let mut out = String::new();
    for c in chunks.iter().filter(|c| c.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(c).expect("chunk is JSON");
        for ch in v["choices"].as_array().into_iter().flatten() {
            if let Some(t) = ch["delta"]["content"].as_str().or(ch["text"].as_str()) {
                out.push_str(t);
            }
        }
    }
    out
}
