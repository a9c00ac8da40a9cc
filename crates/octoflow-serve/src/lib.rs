//! `octoflow serve`: an OpenAI-compatible HTTP server over a batched engine.
//!
//! - [`api`]: request bodies and their validation; [`error`]: OpenAI's error shape and status
//!   codes; [`respond`]: response bodies and SSE streams; [`routes`]: the axum router.
//! - [`scheduler`]: the thread that owns the engine ([`octoflow_model::BatchForward`]) and runs
//!   continuous batching; [`seq`]: one sequence's state; [`job`]: the request queue and events;
//!   [`prefix`]: placing requests where an instance's cache holds the start of their prompt.
//! - [`auth`]: the API key and CORS; [`guard`]: Host and Content-Type checks, body deadline,
//!   access log; [`listen`]: the accept loop (connection cap, header and idle deadlines);
//! - [`tools`]: tool-call syntaxes, the grammar forcing a call, parsing calls out of text.
//! - [`metrics`]: Prometheus counters; [`server`]: start, banner, graceful shutdown.
//! - [`agents`]: agent runs over HTTP (`POST /v1/agents/runs`), stepped in the scheduler's
//!   shared steps, and the task, program and output-line code `octoflow agents` shares.
//!
//! The engine borrows the model, so the caller passes a factory that runs on the scheduler
//! thread, builds the engine there and hands it to [`Driver::run`]:
//!
//! ```no_run
//! # async fn demo(model_info: octoflow_serve::ModelInfo, path: std::path::PathBuf) -> anyhow::Result<()> {
//! use octoflow_serve::{EngineInfo, ServeOptions, Server};
//! let server = Server::start("127.0.0.1:8080".parse()?, model_info, ServeOptions::default(), move |driver| {
//!     let model = octoflow_model::Model::open(&path)?;
//!     let mut engine = octoflow_model::CpuBatch::new(&model, 8, 2048, 512);
//!     driver.run(&mut engine, EngineInfo { device: "CPU".into(), memory: None })
//! })
//! .await?;
//! eprintln!("{}", server.banner());
//! server.run(octoflow_serve::shutdown_signal()).await
//! # }
//! ```

pub mod agents;
pub mod api;
pub mod auth;
pub mod error;
pub mod guard;
pub mod job;
pub mod listen;
pub mod metrics;
pub mod respond;
pub mod routes;
pub mod scheduler;
pub mod seq;
pub mod server;
pub mod tools;

pub use auth::Access;
pub use error::ApiError;
pub use listen::Limits;
pub use scheduler::{Driver, EngineInfo, Ready, SchedOptions};
pub use server::{shutdown_signal, ModelInfo, ServeOptions, Server};
