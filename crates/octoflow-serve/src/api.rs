//! OpenAI's request bodies (the fields this server reads) and their validation into
//! [`GenParams`].
//!
//! Defaults where a field is absent follow llama.cpp's server (temperature 0.8, top_k 40,
//! top_p 0.95, min_p 0.05), so that a request without sampling fields samples on the device;
//! `seed` absent means a random seed per request.

use octoflow_generate::Grammar;
use serde::Deserialize;
use serde_json::{json, Value};

use octoflow_core::SamplingParams;

use crate::error::ApiError;
use crate::job::GenParams;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices).
    #[serde(default)]
    pub include_usage: bool,
}

/// Fields shared by `/v1/completions` and `/v1/chat/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub ignore_eos: bool,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
    /// "strict"}}`.
    pub response_format: Option<Value>,
    /// A grammar the output must match, in llguidance's Lark dialect (our extension).
    pub grammar: Option<String>,
    /// A regular expression the output must match (our extension).
    pub regex: Option<String>,
}

/// A chat message's content: a string, or a list of parts of which the text ones are used.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// One message of `messages`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant message's calls (`[{"id", "type": "function", "function": {"name",
    /// "arguments"}}]`).
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

impl ChatMessage {
    /// The text of the content (text parts joined by newlines; none: empty).
    pub fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => parts
                .iter()
                .filter(|p| p.kind == "text")
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// The message as a chat template reads it: role, text content, and the tool fields where
    /// present, each call's `arguments` parsed from OpenAI's JSON string into an object (what
    /// transformers' templates expect and `tojson` writes back).
    pub fn to_template(&self) -> Value {
        let mut m = json!({"role": self.role, "content": self.text()});
        if let Some(calls) = &self.tool_calls {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    if let Some(args) = c.pointer_mut("/function/arguments") {
                        if let Some(parsed) = args
                            .as_str()
                            .and_then(|a| serde_json::from_str::<Value>(a).ok())
                        {
                            *args = parsed;
                        }
                    }
                    c
                })
                .collect();
            m["tool_calls"] = Value::Array(calls);
        }
        if let Some(id) = &self.tool_call_id {
            m["tool_call_id"] = json!(id);
        }
        if let Some(n) = &self.name {
            m["name"] = json!(n);
        }
        m
    }
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub common: Common,
    /// Newer name of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    /// Function tools the model may call.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<Value>,
    /// Accepted; a Hermes-style model may make several calls either way.
    pub parallel_tool_calls: Option<bool>,
    /// `low`, `medium` or `high` (OpenAI's field; the template's `reasoning_effort`, gpt-oss).
    pub reasoning_effort: Option<String>,
    /// More variables for the chat template (vLLM's and llama-server's field).
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `prompt` of `/v1/completions`: text, one text in a list, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub common: Common,
    /// Return this many most likely alternatives per token (0..=20).
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
}

/// `POST /tokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default)]
    pub add_special: bool,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

/// Parses a JSON body; errors are 400s naming what is wrong.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "We could not parse the JSON body of your request"
        } else {
            "The JSON body does not match the expected request"
        };
        ApiError::invalid(
            None,
            format!("{what}: {}", plain_serde_message(&e.to_string())),
        )
    })
}

/// serde's message with the Rust type names it mentions in JSON's words.
fn plain_serde_message(m: &str) -> String {
    const WORDS: [(&str, &str); 14] = [
        (
            "untagged enum Content",
            "a string or a list of content parts",
        ),
        (
            "untagged enum Prompt",
            "a string, a list of one string, or a list of token ids",
        ),
        ("untagged enum Stop", "a string or a list of strings"),
        ("struct ChatMessage", "a message object"),
        ("struct StreamOptions", "an object"),
        ("struct Part", "a content part object"),
        ("expected i64", "expected an integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected usize", "expected a non-negative integer"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
        ("expected struct", "expected an object"),
    ];
    let mut out = m.to_string();
    for (rust, json) in WORDS {
        out = out.replace(rust, json);
    }
    out
}

/// Request fields (top level) of each endpoint: those this server reads, and OpenAI's that
/// change nothing here (`user`, `metadata`, `store`, `service_tier`).
const COMMON_FIELDS: [&str; 25] = [
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "stream",
    "stream_options",
    "ignore_eos",
    "response_format",
    "grammar",
    "regex",
    "user",
    "metadata",
    "store",
    "service_tier",
    "logit_bias",
    "best_of",
    "suffix",
];
const CHAT_FIELDS: [&str; 9] = [
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "chat_template_kwargs",
];
const COMPLETION_FIELDS: [&str; 3] = ["prompt", "logprobs", "echo"];

/// OpenAI parameters that are refused rather than ignored: answering without them would be
/// answering another request. `None` where an empty or neutral value is accepted.
fn refuse_field(key: &str, v: &Value) -> Option<&'static str> {
    let neutral = v.is_null()
        || v.as_object().is_some_and(|o| o.is_empty())
        || v.as_str().is_some_and(str::is_empty)
        || v.as_array().is_some_and(|a| a.is_empty());
    match key {
        "logit_bias" if !neutral => Some("token biases are not implemented"),
        "suffix" if !neutral => Some("insertion (fill-in-the-middle) is not implemented"),
        "best_of" if !(neutral || v.as_i64() == Some(1)) => {
            Some("only best_of 1 is implemented (use n for several choices)")
        }
        "functions" | "function_call" => Some("use tools and tool_choice"),
        "audio" | "modalities" | "prediction" | "web_search_options" => {
            Some("this server generates text only")
        }
        _ => None,
    }
}

/// Parses a completion or chat request: unknown fields and OpenAI features this server does
/// not implement are 400 `unsupported_parameter` naming the field, not silently ignored.
pub fn parse_request<T: serde::de::DeserializeOwned>(
    body: &[u8],
    kind: crate::respond::Kind,
) -> Result<T, ApiError> {
    let v: Value = parse(body)?;
    let Some(fields) = v.as_object() else {
        return Err(ApiError::invalid(
            None,
            "The request body must be a JSON object",
        ));
    };
    let own: &[&str] = match kind {
        crate::respond::Kind::Chat => &CHAT_FIELDS,
        crate::respond::Kind::Completion => &COMPLETION_FIELDS,
    };
    for (key, value) in fields {
        if let Some(why) = refuse_field(key, value) {
            return Err(ApiError::unsupported(key, why));
        }
        if !COMMON_FIELDS.contains(&key.as_str()) && !own.contains(&key.as_str()) {
            return Err(ApiError::unsupported(
                key,
                "this server does not know this parameter",
            ));
        }
    }
    serde_json::from_value(v).map_err(|e| {
        ApiError::invalid(
            None,
            format!(
                "The JSON body does not match the expected request: {}",
                plain_serde_message(&e.to_string())
            ),
        )
    })
}

/// The roles a chat message may have.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Checks roles and content parts: an unknown role or a part that is not text (images,
/// audio, files) is a 400 naming the message.
pub fn check_messages(messages: &[ChatMessage]) -> Result<(), ApiError> {
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                format!("messages[{i}].role"),
                format!(
                    "unknown role `{}`: a message's role is one of {}",
                    m.role,
                    ROLES.join(", ")
                ),
            )
            .with_code("invalid_value"));
        }
        if let Some(Content::Parts(parts)) = &m.content {
            if let Some((j, p)) = parts.iter().enumerate().find(|(_, p)| p.kind != "text") {
                return Err(ApiError::unsupported(
                    &format!("messages[{i}].content[{j}]"),
                    format!(
                        "content parts of type `{}`: this model reads text only",
                        p.kind
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn range(
    param: &str,
    v: Option<f32>,
    lo: f32,
    hi: f32,
) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !x.is_finite() || x < lo || x > hi => Err(ApiError::invalid(
            param.to_string(),
            format!("{param} must be in [{lo}, {hi}], got {x}"),
        )
        .with_code("invalid_value")),
        _ => Ok(v),
    }
}

/// The grammar the common fields ask for (`response_format`, `grammar`, `regex`), if any.
pub fn grammar(c: &Common) -> Result<Option<Grammar>, ApiError> {
    let bad = |param: &str, m: String| ApiError::invalid(param.to_string(), m);
    let from_format = match &c.response_format {
        None | Some(Value::Null) => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Grammar::JsonObject),
            Some("json_schema") => {
                let schema = f.pointer("/json_schema/schema").ok_or_else(|| {
                    bad(
                        "response_format",
                        "response_format.json_schema.schema is missing".into(),
                    )
                })?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(bad(
                        "response_format",
                        "response_format.json_schema.schema must be a JSON schema object".into(),
                    ));
                }
                Some(Grammar::JsonSchema(schema.clone()))
            }
            other => {
                return Err(bad(
                    "response_format",
                    format!(
                        "response_format.type must be text, json_object or json_schema, got {}",
                        other.map_or_else(|| "nothing".to_string(), |t| format!("{t:?}"))
                    ),
                ))
            }
        },
    };
    let from_grammar =
        match (&c.grammar, &c.regex) {
            (Some(_), Some(_)) => {
                return Err(bad("grammar", "give grammar or regex, not both".into()));
            }
            (Some(g), None) if g.contains("::=") => return Err(bad(
                "grammar",
                "GBNF grammars are not supported: write the grammar in llguidance's Lark dialect \
                 (rules as `name: ...`)"
                    .into(),
            )),
            (Some(g), None) => Some(Grammar::Lark(g.clone())),
            (None, Some(r)) => Some(Grammar::Regex(r.clone())),
            (None, None) => None,
        };
    match (from_format, from_grammar) {
        (Some(_), Some(_)) => Err(bad(
            "grammar",
            "give response_format or grammar/regex, not both".into(),
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// Validates the common fields; `logprobs` is the number of alternatives asked for, if any.
/// `max_tokens` is clamped so prompt and completion fit in `n_ctx` and to the server's `cap`
/// (also when the request names no limit: a client cannot hold an instance for a whole
/// context unasked); `n` must fit in `n_slots`.
pub fn gen_params(
    c: &Common,
    max_tokens: Option<i64>,
    logprobs: Option<i64>,
    prompt_len: usize,
    (n_ctx, cap): (usize, usize),
    n_slots: usize,
) -> Result<GenParams, ApiError> {
    let def = SamplingParams::default();
    let temperature = range("temperature", c.temperature, 0.0, 2.0)?.unwrap_or(def.temperature);
    let top_p = range("top_p", c.top_p, 0.0, 1.0)?.unwrap_or(def.top_p);
    let min_p = range("min_p", c.min_p, 0.0, 1.0)?.unwrap_or(def.min_p);
    let presence = range("presence_penalty", c.presence_penalty, -2.0, 2.0)?.unwrap_or(0.0);
    let frequency = range("frequency_penalty", c.frequency_penalty, -2.0, 2.0)?.unwrap_or(0.0);
    let repeat = range("repeat_penalty", c.repeat_penalty, 0.01, 10.0)?.unwrap_or(1.0);
    let top_k = match c.top_k {
        None => def.top_k,
        Some(k) if k <= 0 => 0,
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
    };
    let n = match c.n {
        None => 1,
        Some(n) if n >= 1 && n as u64 <= n_slots as u64 => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "n".to_string(),
                format!("n must be between 1 and {n_slots} (the server's instances), got {n}"),
            )
            .with_code("invalid_value"))
        }
    };
    let room = n_ctx.saturating_sub(prompt_len).min(cap.max(1));
    let max_tokens = match max_tokens.or(c.max_tokens) {
        None => room,
        Some(m) if m >= 1 => usize::try_from(m).unwrap_or(usize::MAX).min(room),
        Some(m) => {
            return Err(ApiError::invalid(
                "max_tokens".to_string(),
                format!("max_tokens must be at least 1, got {m}"),
            )
            .with_code("invalid_value"))
        }
    };
    let stops = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) if v.len() <= 4 => v.clone(),
        Some(Stop::Many(v)) => {
            return Err(ApiError::invalid(
                "stop".to_string(),
                format!("stop takes at most 4 sequences, got {}", v.len()),
            ))
        }
    };
    let logprobs = match logprobs {
        None => None,
        Some(k) if (0..=20).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_logprobs".to_string(),
                format!("the number of log-probabilities must be in [0, 20], got {k}"),
            ))
        }
    };
    let seed = c.seed.map_or_else(octoflow_core::random_seed, |s| s as u64);
    let sampling = SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repeat_penalty: repeat,
        presence_penalty: presence,
        frequency_penalty: frequency,
        seed,
        ..def
    };
    sampling
        .validate()
        .map_err(|m| ApiError::invalid(None, m))?;
    Ok(GenParams {
        sampling,
        max_tokens,
        stops,
        n,
        logprobs,
        ignore_eos: c.ignore_eos,
        constraint: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(json: &str) -> Common {
        parse(json.as_bytes()).expect("valid")
    }

    #[test]
    fn defaults_and_clamping() {
        let p = gen_params(&common("{}"), None, None, 10, (64, 1000), 4).expect("valid");
        assert_eq!(p.max_tokens, 54);
        assert_eq!(p.n, 1);
        let p = gen_params(
            &common(r#"{"max_tokens": 500}"#),
            None,
            None,
            10,
            (64, 1000),
            4,
        )
        .expect("valid");
        assert_eq!(p.max_tokens, 54);
        // the server's cap, with and without a limit in the request
        let p = gen_params(&common("{}"), None, None, 10, (64, 20), 4).expect("valid");
        assert_eq!(p.max_tokens, 20);
        let p = gen_params(
            &common(r#"{"max_tokens": 30}"#),
            None,
            None,
            10,
            (64, 20),
            4,
        )
        .expect("valid");
        assert_eq!(p.max_tokens, 20);
    }

    #[test]
    fn unknown_and_unimplemented_parameters_are_refused_by_name() {
        use crate::respond::Kind;
        let chat = |j: &str| parse_request::<ChatRequest>(j.as_bytes(), Kind::Chat);
        let m = r#""messages": [{"role": "user", "content": "hi"}]"#;
        for (extra, param) in [
            (r#""logit_bias": {"50256": -100}"#, "logit_bias"),
            (r#""best_of": 3"#, "best_of"),
            (r#""functions": []"#, "functions"),
            (r#""typical_p": 0.5"#, "typical_p"),
            (r#""suffix": "end""#, "suffix"),
        ] {
            let e = chat(&format!("{{{m}, {extra}}}")).expect_err(extra);
            assert_eq!(e.code, Some("unsupported_parameter"), "{extra}");
            assert_eq!(e.param.as_deref(), Some(param), "{extra}");
        }
        // neutral values and harmless OpenAI fields pass
        for extra in [
            r#""logit_bias": {}"#,
            r#""best_of": 1"#,
            r#""user": "u1""#,
            r#""store": false"#,
            r#""suffix": null"#,
        ] {
            chat(&format!("{{{m}, {extra}}}")).expect(extra);
        }
        // a chat field on the completions route is unknown there
        let e = parse_request::<CompletionRequest>(
            br#"{"prompt": "a", "tools": []}"#,
            Kind::Completion,
        )
        .expect_err("tools");
        assert_eq!(e.param.as_deref(), Some("tools"));
        let e = chat("[1]").expect_err("array");
        assert_eq!(e.status, 400);
    }

    #[test]
    fn unknown_roles_and_non_text_parts_are_refused() {
        let msgs = |j: &str| -> Vec<ChatMessage> { serde_json::from_str(j).expect("messages") };
        check_messages(&msgs(r#"[{"role": "developer", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}]}]"#)).expect("valid");
        let e = check_messages(&msgs(
            r#"[{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]"#,
        ))
        .expect_err("role");
        assert_eq!(e.param.as_deref(), Some("messages[1].role"));
        let e = check_messages(&msgs(r#"[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}]"#)).expect_err("image");
        assert_eq!(e.param.as_deref(), Some("messages[0].content[1]"));
        assert_eq!(e.code, Some("unsupported_parameter"));
    }

    #[test]
    fn type_errors_speak_json_not_rust() {
        let e = parse::<Common>(br#"{"n": "two"}"#).expect_err("type");
        assert!(e.message.contains("expected an integer"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"messages": [{"role": "user", "content": 3}]}"#)
            .expect_err("content");
        assert!(!e.message.contains("enum"), "{}", e.message);
    }

    #[test]
    fn out_of_range_parameters_name_the_parameter() {
        for (json, param) in [
            (r#"{"temperature": 3}"#, "temperature"),
            (r#"{"top_p": -0.5}"#, "top_p"),
            (r#"{"n": 5}"#, "n"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"presence_penalty": 9}"#, "presence_penalty"),
            (r#"{"stop": ["a","b","c","d","e"]}"#, "stop"),
        ] {
            let e = gen_params(&common(json), None, None, 1, (64, 1000), 4).expect_err(json);
            assert_eq!(e.param.as_deref(), Some(param), "{json}");
            assert_eq!(e.status, 400);
        }
        let e = gen_params(&common("{}"), None, Some(21), 1, (64, 1000), 4).expect_err("logprobs");
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
    }

    #[test]
    fn response_formats_become_grammars() {
        let g = |json: &str| grammar(&common(json));
        assert_eq!(g("{}").expect("none"), None);
        assert_eq!(
            g(r#"{"response_format": {"type": "text"}}"#).expect("text"),
            None
        );
        assert_eq!(
            g(r#"{"response_format": {"type": "json_object"}}"#).expect("object"),
            Some(Grammar::JsonObject)
        );
        assert_eq!(
            g(r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "integer"}}}}"#).expect("schema"),
            Some(Grammar::JsonSchema(json!({"type": "integer"})))
        );
        assert_eq!(
            g(r#"{"grammar": "start: \"yes\" | \"no\""}"#).expect("lark"),
            Some(Grammar::Lark("start: \"yes\" | \"no\"".into()))
        );
        for bad in [
            r#"{"response_format": {"type": "xml"}}"#,
            r#"{"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#,
            r#"{"response_format": {"type": "json_object"}, "grammar": "start: \"a\""}"#,
            r#"{"grammar": "root ::= \"a\""}"#,
        ] {
            let e = g(bad).expect_err(bad);
            assert_eq!(e.status, 400, "{bad}");
            assert!(e.param.is_some(), "{bad}");
        }
    }

    #[test]
    fn bad_json_is_a_400() {
        let e = parse::<Common>(b"{not json").expect_err("syntax");
        assert!(e.message.contains("parse"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"messages": 3}"#).expect_err("type");
        assert!(e.message.contains("expected"), "{}", e.message);
    }
}
