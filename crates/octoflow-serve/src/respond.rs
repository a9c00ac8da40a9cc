//! Turning a job's [`Event`]s into OpenAI's response bodies: one JSON object
//! (`chat.completion`, `text_completion`) or a server-sent-event stream of chunks ending with
//! `data: [DONE]`.
//!
//! Chat replies of models that answer in channels (gpt-oss's harmony format) are split as
//! llama-server and vLLM split them: the final channel is `content`, the analysis channel
//! `reasoning_content` (in streamed deltas too). Function calls (messages to `functions.NAME`)
//! are parsed ([`Part::ToolCall`], [`Reply::tool_calls`]) but not sent: that is the hook for
//! `tool_calls` once the server takes `tools`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use octoflow_core::Finish;
use octoflow_text::harmony::{Delta as HarmonyDelta, HarmonyParser, Part, Reply};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::job::{Event, TokenLogprob};
use crate::metrics::Metrics;

/// OpenAI's `finish_reason` for `finish`.
pub fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Eog | Finish::Stop => "stop",
        Finish::Length | Finish::Context => "length",
    }
}

/// Which endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What every response of one request shares.
#[derive(Debug, Clone)]
pub struct Meta {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub n: usize,
    pub prompt_tokens: usize,
    /// Whether log-probabilities were asked for (their field is then an object, else null).
    pub logprobs: bool,
    pub include_usage: bool,
    /// Whether the reply is in harmony's channels (chat with a gpt-oss vocabulary).
    pub harmony: bool,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn usage(&self, completion: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        })
    }

    /// The `logprobs` field of a choice holding these tokens (`offset`: text offset of the
    /// first, for completions).
    fn logprobs_value(&self, tokens: &[TokenLogprob], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.kind {
            Kind::Chat => json!({
                "content": tokens.iter().map(|t| json!({
                    "token": t.token,
                    "logprob": t.logprob,
                    "bytes": t.bytes,
                    "top_logprobs": t.top.iter().map(|(tok, bytes, lp)| json!({
                        "token": tok, "logprob": lp, "bytes": bytes,
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            }),
            Kind::Completion => {
                let mut offsets = Vec::new();
                let mut at = offset;
                for t in tokens {
                    offsets.push(at);
                    at += t.token.len();
                }
                json!({
                    "tokens": tokens.iter().map(|t| &t.token).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                    "top_logprobs": tokens.iter().map(|t| {
                        t.top.iter().map(|(tok, _, lp)| (tok.clone(), json!(lp)))
                            .collect::<serde_json::Map<String, Value>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    fn choice(&self, index: usize, text: &str, lp: Value, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Chat if self.harmony => {
                let reply = Reply::parse(text);
                let mut message = json!({"role": "assistant", "content": reply.content});
                if !reply.reasoning.is_empty() {
                    message["reasoning_content"] = reply.reasoning.into();
                }
                json!({
                    "index": index,
                    "message": message,
                    "logprobs": lp,
                    "finish_reason": finish,
                })
            }
            Kind::Chat => json!({
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": lp,
                "finish_reason": finish,
            }),
            Kind::Completion => json!({
                "index": index,
                "text": text,
                "logprobs": lp,
                "finish_reason": finish,
            }),
        }
    }

    fn chunk_choice(&self, index: usize, delta: Value, lp: Value, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Chat => json!({
                "index": index,
                "delta": delta,
                "logprobs": lp,
                "finish_reason": finish,
            }),
            Kind::Completion => json!({
                "index": index,
                "text": delta.get("content").and_then(Value::as_str).unwrap_or(""),
                "logprobs": lp,
                "finish_reason": finish,
            }),
        }
    }

    fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let (Some(u), Some(obj)) = (usage, v.as_object_mut()) {
            obj.insert("usage".into(), u);
        }
        v
    }
}

/// Waits for every choice and answers with one JSON body.
pub async fn complete(
    meta: Meta,
    mut rx: UnboundedReceiver<Event>,
    metrics: Arc<Metrics>,
) -> Result<Response, ApiError> {
    let mut texts = vec![String::new(); meta.n];
    let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); meta.n];
    let mut finish: Vec<Option<&'static str>> = vec![None; meta.n];
    let mut completion = 0;
    let mut open = meta.n;
    while open > 0 {
        match rx.recv().await {
            Some(Event::Delta {
                index,
                text,
                logprob,
            }) if index < meta.n => {
                texts[index].push_str(&text);
                lps[index].extend(logprob);
            }
            Some(Event::Done {
                index,
                finish: f,
                completion_tokens,
            }) if index < meta.n => {
                finish[index] = Some(finish_reason(f));
                completion += completion_tokens;
                open -= 1;
            }
            Some(Event::Error { message }) => {
                return Err(ApiError::from_scheduler(message));
            }
            Some(_) => {}
            None => return Err(ApiError::internal("the scheduler stopped")),
        }
    }
    let choices: Vec<Value> = (0..meta.n)
        .map(|i| meta.choice(i, &texts[i], meta.logprobs_value(&lps[i], 0), finish[i]))
        .collect();
    Metrics::inc(&metrics.requests_ok);
    Ok(Json(json!({
        "id": meta.id,
        "object": meta.object(false),
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": meta.usage(completion),
    }))
    .into_response())
}

struct StreamState {
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    out: VecDeque<SseEvent>,
    open: usize,
    completion: usize,
    /// Text bytes sent per choice (completion logprobs' `text_offset`).
    offsets: Vec<usize>,
    done: bool,
    metrics: Arc<Metrics>,
    /// Per choice, the split of a harmony reply into channels (empty for other replies).
    parsers: Vec<HarmonyParser>,
}

/// A streamed delta for a piece of a harmony reply (`None` for what is not sent: function
/// calls, until the server takes `tools`).
fn harmony_delta(d: &HarmonyDelta) -> Option<Value> {
    match d.header.part() {
        Part::Content => Some(json!({"content": d.text})),
        Part::Reasoning => Some(json!({"reasoning_content": d.text})),
        Part::ToolCall(_) => None,
    }
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

impl StreamState {
    fn on(&mut self, ev: Option<Event>) {
        let m = &self.meta;
        match ev {
            Some(Event::Delta {
                index,
                text,
                logprob,
            }) => {
                let offset = self.offsets.get(index).copied().unwrap_or(0);
                let lp = m.logprobs_value(logprob.as_slice(), offset);
                if let Some(o) = self.offsets.get_mut(index) {
                    *o += text.len();
                }
                let Some(parser) = self.parsers.get_mut(index) else {
                    let c = m.chunk_choice(index, json!({"content": text}), lp, None);
                    self.out.push_back(data(&m.chunk(vec![c], None)));
                    return;
                };
                let mut deltas: Vec<Value> = parser
                    .push(&text)
                    .iter()
                    .filter_map(harmony_delta)
                    .collect();
                // Log-probabilities ride on the first delta, or on an empty one.
                if deltas.is_empty() && !lp.is_null() {
                    deltas.push(json!({}));
                }
                let mut lp = Some(lp);
                for d in deltas {
                    let c = m.chunk_choice(index, d, lp.take().unwrap_or(Value::Null), None);
                    self.out.push_back(data(&m.chunk(vec![c], None)));
                }
            }
            Some(Event::Done {
                index,
                finish,
                completion_tokens,
            }) => {
                self.completion += completion_tokens;
                if let Some(parser) = self.parsers.get_mut(index) {
                    for d in parser.finish().iter().filter_map(harmony_delta) {
                        let c = m.chunk_choice(index, d, Value::Null, None);
                        self.out.push_back(data(&m.chunk(vec![c], None)));
                    }
                }
                let c = m.chunk_choice(index, json!({}), Value::Null, Some(finish_reason(finish)));
                self.out.push_back(data(&m.chunk(vec![c], None)));
                self.open = self.open.saturating_sub(1);
                if self.open == 0 {
                    if m.include_usage {
                        let usage = m.usage(self.completion);
                        self.out.push_back(data(&m.chunk(Vec::new(), Some(usage))));
                    }
                    Metrics::inc(&self.metrics.requests_ok);
                    self.end();
                }
            }
            Some(Event::Error { message }) => {
                let e = ApiError::from_scheduler(message);
                self.out.push_back(data(&e.body()));
                Metrics::inc(&self.metrics.requests_failed);
                self.end();
            }
            None => {
                let e = ApiError::internal("the scheduler stopped");
                self.out.push_back(data(&e.body()));
                Metrics::inc(&self.metrics.requests_failed);
                self.end();
            }
        }
    }

    fn end(&mut self) {
        self.out.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }
}

/// Streams the job's events as chunks. Dropping the stream (the client went away) drops the
/// receiver, which the scheduler notices before its next step.
pub fn stream(
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    metrics: Arc<Metrics>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let mut out = VecDeque::new();
    if meta.kind == Kind::Chat {
        let choices = (0..meta.n)
            .map(|i| {
                meta.chunk_choice(
                    i,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    None,
                )
            })
            .collect();
        out.push_back(data(&meta.chunk(choices, None)));
    }
    let parsers = if meta.harmony {
        (0..meta.n).map(|_| HarmonyParser::new()).collect()
    } else {
        Vec::new()
    };
    let state = StreamState {
        parsers,
        open: meta.n,
        offsets: vec![0; meta.n],
        meta,
        rx,
        out,
        completion: 0,
        done: false,
        metrics,
    };
    let s = stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.out.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            let ev = st.rx.recv().await;
            st.on(ev);
        }
    });
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
}
