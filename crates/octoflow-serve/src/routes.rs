//! The HTTP routes: OpenAI's `/v1/chat/completions`, `/v1/completions` and `/v1/models`, plus
//! `/health`, `/metrics`, `/tokenize` and `/detokenize`; agent runs' `/v1/agents/runs` is in
//! [`crate::agents::route`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use octoflow_generate::{Constraint, Grammar, GrammarEnv, PromptError};
use octoflow_text::{harmony, ChatTemplate, Tokenizer};
use serde_json::json;

use crate::api::{self, ChatRequest, CompletionRequest, Prompt};
use crate::auth::{require_key, Access};
use crate::error::ApiError;
use crate::guard::Guard;
use crate::job::{Job, Queue, Refused, Work};
use crate::metrics::Metrics;
use crate::respond::{self, Kind, Meta};
use crate::tools::{self, ToolSyntax};

/// What every handler reads.
pub struct AppState {
    /// The served model's name (`/v1/models`, the `model` field).
    pub model_id: String,
    /// The LoRA adapters served beside it, by name (a request's `model` picks one).
    pub adapters: Vec<String>,
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template (`None`: chat completions are refused).
    pub template: Option<Arc<ChatTemplate>>,
    pub queue: Arc<Queue>,
    pub metrics: Arc<Metrics>,
    /// Positions per instance.
    pub n_ctx: usize,
    /// Instances.
    pub n_slots: usize,
    /// Most waiting requests.
    pub queue_cap: usize,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Server start (Unix seconds), the models' `created`.
    pub created: u64,
    /// Most tokens one completion may generate (also when the request names no limit).
    pub max_tokens: usize,
    /// Tokens a too-long prompt keeps at its start when it is shifted to fit (`None`: refused).
    pub context_shift: Option<usize>,
    /// The grammar compiler over the tokenizer, built at the first constrained request.
    pub grammars: OnceLock<Result<GrammarEnv, String>>,
}

impl AppState {
    /// Compiles `grammar` for one request; a grammar that does not compile is a 400 on
    /// `param`.
    fn constraint(&self, grammar: &Grammar, param: &str) -> Result<Constraint, ApiError> {
        let env = self.grammars.get_or_init(|| {
            // Building the token trie takes a moment once; keep the async workers serving.
            tokio::task::block_in_place(|| {
                GrammarEnv::new(self.tokenizer.clone()).map_err(|e| e.to_string())
            })
        });
        let env = env
            .as_ref()
            .map_err(|e| ApiError::invalid(param.to_string(), e.clone()))?;
        env.constraint(grammar).map_err(|e| {
            ApiError::invalid(
                param.to_string(),
                format!("the {param} does not compile: {e}"),
            )
        })
    }
}

/// The router over `state`, behind the API key and CORS of `access`.
pub fn router(state: Arc<AppState>, access: &Access, guard: Guard) -> Result<Router, String> {
    let limit = state.body_limit;
    let mut app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/agents/runs", post(crate::agents::route::runs))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(fallback)
        .method_not_allowed_fallback(crate::guard::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state);
    if let Some(key) = &access.api_key {
        let key: Arc<str> = key.as_str().into();
        app = app.layer(axum::middleware::from_fn_with_state(key, require_key));
    }
    // Outside the key check, so refused hosts and bodies are refused before anything else
    // and every answer is logged.
    app = app.layer(axum::middleware::from_fn_with_state(
        Arc::new(guard),
        crate::guard::guard,
    ));
    // Outermost, so preflights and 401s carry the CORS headers a browser needs to read them.
    if let Some(cors) = access.cors_layer()? {
        app = app.layer(cors);
    }
    Ok(app)
}

async fn fallback(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The served models: the base and its adapters.
fn model_list(st: &AppState) -> Vec<serde_json::Value> {
    let mut data = vec![json!({
        "id": st.model_id,
        "object": "model",
        "created": st.created,
        "owned_by": "octoflow",
        "max_model_len": st.n_ctx,
    })];
    data.extend(st.adapters.iter().map(|a| {
        json!({
            "id": a,
            "object": "model",
            "created": st.created,
            "owned_by": "octoflow",
            "max_model_len": st.n_ctx,
            "parent": st.model_id,
        })
    }));
    data
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": model_list(&st)})).into_response()
}

/// `GET /v1/models/{id}`: one model, or 404 `model_not_found`.
async fn model(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    match model_list(&st).into_iter().find(|m| m["id"] == id.as_str()) {
        Some(m) => Json(m).into_response(),
        None => ApiError::model_not_found(&id).into_response(),
    }
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.queue.is_closed() {
        return ApiError::shutting_down().into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    st.metrics
        .queue_depth
        .store(st.queue.len() as u64, Ordering::Relaxed);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

/// The body, or 413 when it is over the limit.
pub(crate) fn body(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(st.body_limit)
        } else {
            ApiError::invalid(None, format!("could not read the request body: {e}"))
        }
    })
}

async fn tokenize(
    State(st): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: api::TokenizeRequest = api::parse(&body(&st, b)?)?;
    let tokens = st.tokenizer.encode(&req.content, req.add_special, true);
    Ok(Json(json!({"tokens": tokens})).into_response())
}

async fn detokenize(
    State(st): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: api::DetokenizeRequest = api::parse(&body(&st, b)?)?;
    let n_vocab = st.tokenizer.n_vocab();
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::invalid(
            "tokens".to_string(),
            format!("token id {bad} is outside the vocabulary (n_vocab = {n_vocab})"),
        ));
    }
    Ok(Json(json!({"content": st.tokenizer.decode(&req.tokens)})).into_response())
}

/// What a request's `model` field picks: the base model (`None`, also when absent) or adapter
/// `i`, and the name answered back.
fn check_model(st: &AppState, model: &Option<String>) -> Result<(Option<u32>, String), ApiError> {
    match model {
        None => Ok((None, st.model_id.clone())),
        Some(m) if m == &st.model_id => Ok((None, m.clone())),
        Some(m) => st
            .adapters
            .iter()
            .position(|a| a == m)
            .map(|i| (Some(i as u32), m.clone()))
            .ok_or_else(|| ApiError::model_not_found(m)),
    }
}

/// `prompt` checked against the context and the vocabulary; with a context shift, a prompt that
/// does not fit keeps its first tokens and its newest, half the context left for the completion
/// (as llama-server truncates a prompt).
fn fit_prompt(st: &AppState, prompt: Vec<u32>, param: &str) -> Result<Vec<u32>, ApiError> {
    let prompt = match st.context_shift {
        Some(keep) if prompt.len() >= st.n_ctx => {
            Metrics::inc(&st.metrics.prompts_shifted);
            octoflow_generate::ContextShift::new(keep).fit(&prompt, st.n_ctx, st.n_ctx / 2)
        }
        _ => prompt,
    };
    check_prompt(st, &prompt, param)?;
    Ok(prompt)
}

fn check_prompt(st: &AppState, prompt: &[u32], param: &str) -> Result<(), ApiError> {
    let n_vocab = st.tokenizer.n_vocab();
    octoflow_generate::check_prompt(prompt, 0, st.n_ctx, n_vocab).map_err(|e| match e {
        PromptError::TooLong { prompt, .. } => ApiError::invalid(
            param.to_string(),
            format!(
                "This model's maximum context length is {} tokens. However, your prompt has \
                 {prompt} tokens, which leaves no room for a completion. Please reduce the length \
                 of the prompt.",
                st.n_ctx,
            ),
        )
        .with_code("context_length_exceeded"),
        e => ApiError::invalid(param.to_string(), e.to_string()),
    })
}

/// The answer to work the queue refused.
pub(crate) fn refused(r: Refused) -> ApiError {
    match r {
        Refused::Full(cap) => ApiError::queue_full(cap),
        Refused::Closed => ApiError::shutting_down(),
    }
}

/// Queues the job and answers: a stream of chunks, or one body once every choice ended.
async fn dispatch(
    st: &AppState,
    kind: Kind,
    prompt: Vec<u32>,
    params: crate::job::GenParams,
    (adapter, model): (Option<u32>, String),
    (stream, include_usage): (bool, bool),
    tools: Option<ToolSyntax>,
) -> Result<Response, ApiError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let n = params.n;
    let logprobs = params.logprobs.is_some();
    let prompt_tokens = prompt.len();
    let job = Job {
        prompt: prompt.into(),
        params,
        adapter,
        events: tx,
        enqueued: Instant::now(),
    };
    st.queue.push(Work::Generate(job)).map_err(refused)?;
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    let meta = Meta {
        kind,
        // random: ids neither repeat across restarts nor tell how many requests came before
        id: format!("{prefix}-{:016x}", octoflow_core::random_seed()),
        created: unix_now(),
        model,
        n,
        prompt_tokens,
        logprobs,
        include_usage,
        tools,
        harmony: kind == Kind::Chat && harmony::uses_harmony(st.tokenizer.vocab()),
    };
    if stream {
        Ok(respond::stream(meta, rx, st.metrics.clone()).into_response())
    } else {
        respond::complete(meta, rx, st.metrics.clone()).await
    }
}

async fn chat(State(st): State<Arc<AppState>>, b: Result<Bytes, BytesRejection>) -> Response {
    let r = chat_inner(&st, b).await;
    finish(&st, r)
}

async fn completions(
    State(st): State<Arc<AppState>>,
    b: Result<Bytes, BytesRejection>,
) -> Response {
    let r = completions_inner(&st, b).await;
    finish(&st, r)
}

pub(crate) fn finish(st: &AppState, r: Result<Response, ApiError>) -> Response {
    match r {
        Ok(resp) => resp,
        Err(e) => {
            if e.status.is_client_error() {
                Metrics::inc(&st.metrics.requests_refused);
            } else {
                Metrics::inc(&st.metrics.requests_failed);
            }
            e.into_response()
        }
    }
}

async fn chat_inner(st: &AppState, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let bytes = body(st, b)?;
    // Parsing, rendering and tokenizing a large body takes a while: off the async workers.
    let req: ChatRequest = tokio::task::block_in_place(|| api::parse_request(&bytes, Kind::Chat))?;
    api::check_messages(&req.messages)?;
    let picked = check_model(st, &req.common.model)?;
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages".to_string(),
            "messages must hold at least one message",
        ));
    }
    let template = st.template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages".to_string(),
            "this model has no chat template; use /v1/completions",
        )
    })?;
    let tool_list = req.tools.clone().unwrap_or_default();
    let names =
        tools::tool_names(&tool_list).map_err(|m| ApiError::invalid("tools".to_string(), m))?;
    let choice = tools::Choice::parse(req.tool_choice.as_ref(), &names)
        .map_err(|m| ApiError::invalid("tool_choice".to_string(), m))?;
    let syntax = ToolSyntax::of_template(template.source());
    let use_tools = choice != tools::Choice::None;
    if use_tools && syntax == ToolSyntax::Harmony && choice != tools::Choice::Auto {
        return Err(ApiError::invalid(
            "tool_choice".to_string(),
            "harmony models (gpt-oss) take tool_choice \"auto\" or \"none\": a forced call needs a grammar over its channels, which is not built yet",
        ));
    }
    let messages: Vec<serde_json::Value> = req
        .messages
        .iter()
        .map(api::ChatMessage::to_template)
        .collect();
    let mut vars = req.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(effort) = &req.reasoning_effort {
        vars.insert("reasoning_effort".into(), effort.clone().into());
    }
    if use_tools {
        vars.insert("tools".into(), serde_json::Value::Array(tool_list.clone()));
    }
    let prompt = tokio::task::block_in_place(|| {
        let text = template
            .render_json(&messages, true, &vars)
            .map_err(|e| ApiError::invalid("messages".to_string(), e.to_string()))?;
        Ok::<_, ApiError>(st.tokenizer.encode(&text, true, true))
    })?;
    let prompt = fit_prompt(st, prompt, "messages")?;
    let logprobs = if req.logprobs {
        Some(req.top_logprobs.unwrap_or(0))
    } else {
        None
    };
    let mut params = api::gen_params(
        &req.common,
        req.max_completion_tokens,
        logprobs,
        prompt.len(),
        (st.n_ctx, st.max_tokens),
        st.n_slots,
    )?;
    let forced = match &choice {
        tools::Choice::Required => tools::call_grammar(&tool_list, None, syntax),
        tools::Choice::Named(n) => tools::call_grammar(&tool_list, Some(n), syntax),
        _ => None,
    };
    let grammar = api::grammar(&req.common)?;
    if grammar.is_some() && syntax == ToolSyntax::Harmony {
        return Err(ApiError::invalid(
            grammar_param(&req.common).to_string(),
            "harmony models (gpt-oss) write channels before their answer; constraining only the final channel is not built yet",
        ));
    }
    params.constraint = match (forced, grammar) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "tool_choice".to_string(),
                "a forced tool call and response_format/grammar cannot be combined",
            ))
        }
        (Some(g), None) => Some(st.constraint(&g, "tools")?),
        (None, Some(g)) => Some(st.constraint(&g, grammar_param(&req.common))?),
        (None, None) => None,
    };
    let usage = req
        .common
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    dispatch(
        st,
        Kind::Chat,
        prompt,
        params,
        picked,
        (req.common.stream, usage),
        use_tools.then_some(syntax),
    )
    .await
}

/// The request field a grammar came from, for error messages.
fn grammar_param(c: &api::Common) -> &'static str {
    if c.grammar.is_some() {
        "grammar"
    } else if c.regex.is_some() {
        "regex"
    } else {
        "response_format"
    }
}

async fn completions_inner(
    st: &AppState,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body(st, b)?;
    let req: CompletionRequest =
        tokio::task::block_in_place(|| api::parse_request(&bytes, Kind::Completion))?;
    let picked = check_model(st, &req.common.model)?;
    if req.echo {
        return Err(ApiError::invalid(
            "echo".to_string(),
            "echo is not supported",
        ));
    }
    let encode = |t: &str| tokio::task::block_in_place(|| st.tokenizer.encode(t, true, true));
    let prompt = match &req.prompt {
        Prompt::Text(t) => encode(t),
        Prompt::Texts(v) if v.len() == 1 => encode(&v[0]),
        Prompt::Texts(v) => {
            return Err(ApiError::invalid(
                "prompt".to_string(),
                format!("one prompt per request is supported, got {}", v.len()),
            ))
        }
        Prompt::Tokens(ids) => ids.clone(),
    };
    let prompt = fit_prompt(st, prompt, "prompt")?;
    let mut params = api::gen_params(
        &req.common,
        None,
        req.logprobs,
        prompt.len(),
        (st.n_ctx, st.max_tokens),
        st.n_slots,
    )?;
    if let Some(g) = api::grammar(&req.common)? {
        params.constraint = Some(st.constraint(&g, grammar_param(&req.common))?);
    }
    let usage = req
        .common
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    dispatch(
        st,
        Kind::Completion,
        prompt,
        params,
        picked,
        (req.common.stream, usage),
        None,
    )
    .await
}
