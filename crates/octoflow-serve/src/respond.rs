//! Turning a job's [`Event`]s into OpenAI's response bodies: one JSON object
//! (`chat.completion`, `text_completion`) or a server-sent-event stream of chunks ending with
//! `data: [DONE]`.
//!
//! Chat replies of models that answer in channels (gpt-oss's harmony format) are split as
//! llama-server and vLLM split them: the final channel is `content`, the analysis channel
//! `reasoning_content` (in streamed deltas too). Its function calls (messages to
//! `functions.NAME`) become `tool_calls` when the request has `tools`. Other models' calls are
//! parsed out of the text in their template's syntax ([`crate::tools`]).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream};
use octoflow_core::Finish;
use octoflow_text::harmony::{
    Delta as HarmonyDelta, HarmonyParser, Part, Reply, ToolCall as HarmonyCall,
};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::job::{Event, TokenLogprob};
use crate::metrics::Metrics;
use crate::tools::{self, ToolCall, ToolStream, ToolSyntax};

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
    /// Parse tool calls out of the text in this syntax (chat requests with tools).
    pub tools: Option<ToolSyntax>,
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

    /// The id of call `k` of choice `index`.
    fn call_id(&self, index: usize, k: usize) -> String {
        let tail = self.id.rsplit('-').next().unwrap_or(&self.id);
        format!("call_{tail}_{index}_{k}")
    }

    /// Puts `calls` into `message` (content null when it is empty, as OpenAI sends it) and
    /// gives the finish reason: `tool_calls` when there are any.
    fn attach_calls<'a>(
        &self,
        index: usize,
        message: &mut Value,
        calls: &[ToolCall],
        finish: Option<&'a str>,
    ) -> Option<&'a str> {
        if calls.is_empty() {
            return finish;
        }
        if message["content"].as_str().is_some_and(str::is_empty) {
            message["content"] = Value::Null;
        }
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(k, c)| c.to_json(&self.call_id(index, k)))
            .collect();
        message["tool_calls"] = Value::Array(calls);
        finish.map(|_| "tool_calls")
    }

    fn choice(&self, index: usize, text: &str, lp: Value, finish: Option<&str>) -> Value {
        if self.kind == Kind::Completion {
            return json!({
                "index": index,
                "text": text,
                "logprobs": lp,
                "finish_reason": finish,
            });
        }
        let (message, finish) = self.message(index, text, finish);
        json!({
            "index": index,
            "message": message,
            "logprobs": lp,
            "finish_reason": finish,
        })
    }

    /// A chat choice's message and finish reason: harmony's channels split, tool calls parsed
    /// out where the request has tools.
    fn message<'a>(
        &self,
        index: usize,
        text: &str,
        finish: Option<&'a str>,
    ) -> (Value, Option<&'a str>) {
        let (mut message, calls) = if self.harmony {
            let reply = Reply::parse(text);
            let mut message = json!({"role": "assistant", "content": reply.content});
            if !reply.reasoning.is_empty() {
                message["reasoning_content"] = reply.reasoning.into();
            }
            let calls = match self.tools {
                Some(_) => reply.tool_calls.iter().map(harmony_call).collect(),
                None => Vec::new(),
            };
            (message, calls)
        } else if let Some(syntax) = self.tools {
            let (content, calls) = tools::parse(text, syntax);
            (json!({"role": "assistant", "content": content}), calls)
        } else {
            (json!({"role": "assistant", "content": text}), Vec::new())
        };
        let finish = self.attach_calls(index, &mut message, &calls, finish);
        (message, finish)
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
    /// Per choice, the text held back while it may be a tool call (requests with tools).
    calls: Vec<Option<ToolStream>>,
    done: bool,
    metrics: Arc<Metrics>,
    /// Per choice, the split of a harmony reply into channels (empty for other replies).
    parsers: Vec<HarmonyParser>,
    /// Per choice, a harmony reply's function calls so far (requests with tools).
    replies: Vec<Reply>,
}

/// A harmony function call as a tool call.
fn harmony_call(c: &HarmonyCall) -> ToolCall {
    ToolCall {
        name: c.name.clone(),
        arguments: c.arguments.clone(),
    }
}

/// A streamed delta for a piece of a harmony reply (`None` for function calls: they are sent
/// whole as `tool_calls` at the end).
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
                let text = match self.calls.get_mut(index).and_then(Option::as_mut) {
                    Some(held) => held.push(&text),
                    None => text,
                };
                if text.is_empty() && logprob.is_none() {
                    return;
                }
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
                let ds = parser.push(&text);
                if let Some(reply) = self.replies.get_mut(index) {
                    reply.add(&ds);
                }
                let mut deltas: Vec<Value> = ds.iter().filter_map(harmony_delta).collect();
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
                let mut calls = Vec::new();
                if let Some(held) = self.calls.get_mut(index).and_then(Option::take) {
                    let (content, held_calls) = held.finish();
                    if !content.is_empty() {
                        let c =
                            m.chunk_choice(index, json!({"content": content}), Value::Null, None);
                        self.out.push_back(data(&m.chunk(vec![c], None)));
                    }
                    calls = held_calls;
                }
                if let Some(parser) = self.parsers.get_mut(index) {
                    let ds = parser.finish();
                    for d in ds.iter().filter_map(harmony_delta) {
                        let c = m.chunk_choice(index, d, Value::Null, None);
                        self.out.push_back(data(&m.chunk(vec![c], None)));
                    }
                    if let Some(reply) = self.replies.get_mut(index) {
                        reply.add(&ds);
                        calls = reply.tool_calls.iter().map(harmony_call).collect();
                    }
                }
                for (k, call) in calls.iter().enumerate() {
                    for delta in call_deltas(m, index, k, call) {
                        let c = m.chunk_choice(index, delta, Value::Null, None);
                        self.out.push_back(data(&m.chunk(vec![c], None)));
                    }
                }
                let reason = match calls.is_empty() {
                    true => finish_reason(finish),
                    false => "tool_calls",
                };
                let c = m.chunk_choice(index, json!({}), Value::Null, Some(reason));
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

/// The deltas of call `k` as OpenAI streams one: the first names it (id, type, function name,
/// empty arguments), the next carries the arguments.
fn call_deltas(m: &Meta, index: usize, k: usize, call: &ToolCall) -> [Value; 2] {
    [
        json!({"tool_calls": [{
            "index": k,
            "id": m.call_id(index, k),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]}),
        json!({"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]}),
    ]
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
    // harmony splits its own calls out (its commentary channel); other replies hold back
    // what may be a call in the template's syntax
    let calls = (0..meta.n)
        .map(|_| match meta.harmony {
            true => None,
            false => meta.tools.map(ToolStream::new),
        })
        .collect();
    let (parsers, replies) = match meta.harmony {
        true => (
            (0..meta.n).map(|_| HarmonyParser::new()).collect(),
            // the calls of each choice, where the request has tools
            match meta.tools {
                Some(_) => (0..meta.n).map(|_| Reply::default()).collect(),
                None => Vec::new(),
            },
        ),
        false => (Vec::new(), Vec::new()),
    };
    let state = StreamState {
        calls,
        parsers,
        replies,
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
