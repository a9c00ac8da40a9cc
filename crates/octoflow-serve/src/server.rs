//! Starting and stopping: the scheduler thread (built by the caller's engine factory), the
//! listener, graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::response::IntoResponse;
use octoflow_text::{ChatTemplate, Tokenizer};

use crate::auth::Access;
use crate::guard::Guard;
use crate::job::Queue;
use crate::listen::Limits;
use crate::metrics::Metrics;
use crate::routes::{router, AppState};
use crate::scheduler::{Driver, Ready, SchedOptions};

/// The model as the HTTP layer sees it.
pub struct ModelInfo {
    /// Its name in `/v1/models` and in requests' `model` field.
    pub id: String,
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template; `None` refuses chat completions.
    pub template: Option<Arc<ChatTemplate>>,
    /// Names of the LoRA adapters served beside the base, in the engine's adapter order.
    pub adapters: Vec<String>,
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Requests that may wait for a free instance; more get 429.
    pub queue: usize,
    /// Largest request body in bytes; larger get 413.
    pub body_limit: usize,
    /// Most prompt tokens of one sequence per step.
    pub prefill_chunk: usize,
    /// On shutdown, how long running requests may go on before they are cancelled.
    pub grace: Duration,
    /// API key and CORS origins.
    pub access: Access,
    /// Most tokens one completion may generate.
    pub max_tokens: usize,
    /// Connections at once and the deadlines of slow or idle clients.
    pub limits: Limits,
    /// Host names besides the loopback ones a loopback-bound server answers to.
    pub allowed_hosts: Vec<String>,
    /// Reuse what instances' caches hold of a new prompt ([`crate::prefix`]).
    pub prefix_cache: bool,
    /// A prompt longer than the context keeps this many tokens at its start and its newest
    /// tokens (context shift, [`octoflow_generate::ContextShift`]) instead of being refused.
    pub context_shift: Option<usize>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            queue: 64,
            body_limit: 4 << 20,
            prefill_chunk: 512,
            grace: Duration::from_secs(30),
            access: Access::default(),
            max_tokens: 4096,
            limits: Limits::default(),
            allowed_hosts: Vec::new(),
            prefix_cache: true,
            context_shift: None,
        }
    }
}

/// A server whose engine is running and whose port is bound, not yet serving.
pub struct Server {
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    scheduler: std::thread::JoinHandle<anyhow::Result<()>>,
    ready: Ready,
    access: Access,
    guard: Guard,
    limits: Limits,
}

impl Server {
    /// Binds `addr`, then starts the scheduler thread, which calls `engine(driver)`: the
    /// factory builds the engine (loading whatever it borrows) and calls [`Driver::run`]. Until
    /// the engine is ready every request, `/health` included, is answered 503 "Loading model"
    /// (a port that is taken fails at once, not after the load).
    pub async fn start<F>(
        addr: SocketAddr,
        model: ModelInfo,
        opts: ServeOptions,
        engine: F,
    ) -> anyhow::Result<Server>
    where
        F: FnOnce(Driver) -> anyhow::Result<()> + Send + 'static,
    {
        // A bad origin is refused before the engine loads.
        opts.access.cors_layer().map_err(anyhow::Error::msg)?;
        let queue = Arc::new(Queue::new(opts.queue));
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let driver = Driver {
            queue: queue.clone(),
            metrics: metrics.clone(),
            tokenizer: model.tokenizer.clone(),
            ready: Some(tx),
            opts: SchedOptions {
                prefill_chunk: opts.prefill_chunk,
                grace: opts.grace,
                prefix_cache: opts.prefix_cache,
            },
        };
        let bound = std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
        bound.set_nonblocking(true)?;
        let (loaded, loaded_rx) = tokio::sync::oneshot::channel::<()>();
        let loading = tokio::spawn(crate::listen::answer_until(
            tokio::net::TcpListener::from_std(bound.try_clone()?)?,
            loading_router(),
            opts.limits,
            async move {
                let _ = loaded_rx.await;
            },
        ));
        let scheduler = std::thread::Builder::new()
            .name("octoflow-scheduler".into())
            .spawn(move || engine(driver))
            .context("starting the scheduler thread")?;
        let ready = rx.await;
        // the loading answers stop accepting before the server does (connections they took
        // get their one answer)
        let _ = loaded.send(());
        let _ = loading.await;
        let ready = match ready {
            Ok(r) => r,
            Err(_) => {
                // The factory returned before the engine was ready: its error says why.
                let joined = tokio::task::spawn_blocking(move || scheduler.join()).await?;
                return match joined {
                    Ok(Err(e)) => Err(e.context("building the engine")),
                    Ok(Ok(())) => Err(anyhow::anyhow!("the engine factory did not run the engine")),
                    Err(_) => Err(anyhow::anyhow!("the scheduler thread panicked")),
                };
            }
        };
        let listener = tokio::net::TcpListener::from_std(bound)?;
        let bound = listener.local_addr()?;
        let guard = Guard {
            allowed_hosts: Guard::hosts_for(&bound, &opts.allowed_hosts),
            body_limit: opts.body_limit,
            body_timeout: opts.limits.body_timeout,
        };
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let state = Arc::new(AppState {
            model_id: model.id,
            adapters: model.adapters,
            tokenizer: model.tokenizer,
            template: model.template,
            queue,
            metrics,
            n_ctx: ready.n_ctx,
            n_slots: ready.n_slots,
            queue_cap: opts.queue,
            body_limit: opts.body_limit,
            created,
            max_tokens: opts.max_tokens,
            context_shift: opts.context_shift,
            grammars: std::sync::OnceLock::new(),
        });
        Ok(Server {
            listener,
            state,
            scheduler,
            ready,
            access: opts.access,
            guard,
            limits: opts.limits,
        })
    }

    /// The bound address (the port chosen when binding port 0).
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The engine's shape.
    pub fn ready(&self) -> &Ready {
        &self.ready
    }

    /// The startup banner: model, instances, device, memory, address.
    pub fn banner(&self) -> String {
        let r = &self.ready;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let memory = match r.info.memory {
            Some((used, total)) => format!("VRAM {:.0}/{:.0} MiB", mib(used), mib(total)),
            None => "VRAM n/a".into(),
        };
        let addr = self
            .listener
            .local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        let adapters = if self.state.adapters.is_empty() {
            String::new()
        } else {
            format!(" + LoRA {}", self.state.adapters.join(", "))
        };
        let pacing = match self.state.metrics.pacer.get().filter(|p| p.has_sensor()) {
            Some(p) if p.targets().any() => format!(" | pacing to {}", p.targets()),
            Some(_) => " | unpaced".to_string(),
            None => String::new(),
        };
        format!(
            "octoflow serve: model {}{adapters} | {} instances x {} positions, {} rows/step | device {}{pacing} | \
             {memory} | queue {} | listening on http://{addr}",
            self.state.model_id,
            r.n_slots,
            r.n_ctx,
            r.max_rows,
            r.info.device,
            self.state.queue_cap,
        )
    }

    /// Serves until `shutdown` resolves; then refuses new requests (503), lets running ones
    /// finish (cancelling them after the grace period), and waits for the scheduler to stop.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let queue = self.state.queue.clone();
        let app = router(self.state, &self.access, self.guard).map_err(anyhow::Error::msg)?;
        let served = crate::listen::serve(self.listener, app, self.limits, async move {
            shutdown.await;
            queue.close();
        })
        .await;
        let scheduler = self.scheduler;
        let joined = tokio::task::spawn_blocking(move || scheduler.join()).await?;
        served.context("serving HTTP")?;
        match joined {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!("the scheduler thread panicked")),
        }
    }
}

/// What answers while the engine loads: 503 "Loading model" (with `Retry-After`) everywhere.
fn loading_router() -> axum::Router {
    let loading = || async { crate::error::ApiError::loading().into_response() };
    axum::Router::new().fallback(loading)
}

/// Resolves on SIGTERM or ctrl-c.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
