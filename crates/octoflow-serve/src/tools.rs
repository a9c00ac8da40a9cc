//! Tool calling: which syntax a model writes its calls in (read off its chat template), the
//! grammar that forces a call (`tool_choice: "required"` or a named function), and parsing
//! calls out of the generated text — whole, or while it streams.
//!
//! Families:
//! - **Hermes** (Qwen2.5, Hermes, SmolLM3 and templates that fall back to it): each call is
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, text around calls is
//!   content.
//! - **Llama 3.x JSON**: the reply is one JSON object `{"name": ..., "parameters": {...}}`,
//!   optionally after `<|python_tag|>`.
//! - **Harmony** (gpt-oss: `<|start|>assistant to=functions.NAME ... <|call|>`) is recognised
//!   and refused for now: its channel parser lives on another branch; the hook is
//!   [`ToolSyntax::Harmony`].

use serde_json::{json, Value};

use octoflow_generate::Grammar;

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    Hermes,
    Llama3Json,
    Harmony,
}

impl ToolSyntax {
    /// The syntax a template's source implies: harmony's `<|call|>`, Llama 3's
    /// `<|python_tag|>`/`ipython` role, else Hermes' `<tool_call>` (the common default).
    pub fn of_template(source: Option<&str>) -> Self {
        let s = source.unwrap_or("");
        if s.contains("<|call|>") {
            Self::Harmony
        } else if !s.contains("<tool_call>")
            && (s.contains("<|python_tag|>") || s.contains("ipython"))
        {
            Self::Llama3Json
        } else {
            Self::Hermes
        }
    }
}

/// A function call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

impl ToolCall {
    /// OpenAI's `tool_calls[i]` object, with id `id`.
    pub fn to_json(&self, id: &str) -> Value {
        json!({
            "id": id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// `tool_choice`, validated against `tools`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// No tools: the template does not see them and nothing is parsed.
    None,
    /// The model decides; calls are parsed out when it makes them.
    Auto,
    /// The reply is one or more calls (forced by a grammar).
    Required,
    /// The reply is a call of this function (forced by a grammar).
    Named(String),
}

impl Choice {
    /// Reads `tool_choice` (absent: `auto` with tools, `none` without), checking a named
    /// function is one of `names`.
    pub fn parse(v: Option<&Value>, names: &[String]) -> Result<Self, String> {
        let choice = match v {
            None | Some(Value::Null) => {
                return Ok(if names.is_empty() { Self::None } else { Self::Auto })
            }
            Some(Value::String(s)) => match s.as_str() {
                "none" => Self::None,
                "auto" => Self::Auto,
                "required" => Self::Required,
                other => {
                    return Err(format!(
                        "tool_choice must be none, auto, required or a function, got {other:?}"
                    ))
                }
            },
            Some(obj) => match obj.pointer("/function/name").and_then(Value::as_str) {
                Some(n) => Self::Named(n.to_string()),
                None => {
                    return Err(
                        "tool_choice as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}"
                            .into(),
                    )
                }
            },
        };
        match &choice {
            Self::Required | Self::Named(_) if names.is_empty() => {
                Err("tool_choice asks for a tool call but tools is empty".into())
            }
            Self::Named(n) if !names.contains(n) => {
                Err(format!("tool_choice names {n:?}, which is not in tools"))
            }
            _ => Ok(choice),
        }
    }
}

/// Checks `tools` (OpenAI's list of `{"type": "function", "function": {name, parameters}}`)
/// and returns the names, in order.
pub fn tool_names(tools: &[Value]) -> Result<Vec<String>, String> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(format!("tools[{i}].type must be \"function\""));
            }
            let name = t
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| format!("tools[{i}].function.name is missing"))?;
            if let Some(p) = t.pointer("/function/parameters") {
                if !p.is_object() {
                    return Err(format!(
                        "tools[{i}].function.parameters must be a JSON schema object"
                    ));
                }
            }
            Ok(name.to_string())
        })
        .collect()
}

/// The JSON schema of one call of `tool` in `syntax` (`arguments` or Llama's `parameters`).
fn call_schema(tool: &Value, syntax: ToolSyntax) -> Value {
    let name = tool
        .pointer("/function/name")
        .cloned()
        .unwrap_or(Value::Null);
    let params = tool
        .pointer("/function/parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    let key = match syntax {
        ToolSyntax::Llama3Json => "parameters",
        _ => "arguments",
    };
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, key: params},
        "required": ["name", key],
        "additionalProperties": false,
    })
}

/// The grammar forcing a call: of `only` when named, else of any of `tools` (`required`, where
/// Hermes may make several calls in a row). `None` for syntaxes without one yet.
pub fn call_grammar(tools: &[Value], only: Option<&str>, syntax: ToolSyntax) -> Option<Grammar> {
    let schemas: Vec<Value> = tools
        .iter()
        .filter(|t| {
            only.is_none_or(|n| t.pointer("/function/name").and_then(Value::as_str) == Some(n))
        })
        .map(|t| call_schema(t, syntax))
        .collect();
    let schema = json!({"anyOf": schemas});
    match syntax {
        ToolSyntax::Llama3Json => Some(Grammar::JsonSchema(schema)),
        ToolSyntax::Hermes => {
            let calls = if only.is_some() {
                "call"
            } else {
                "call (\"\\n\" call)*"
            };
            Some(Grammar::Lark(format!(
                "start: {calls}\ncall: \"<tool_call>\\n\" obj \"\\n</tool_call>\"\nobj: %json {schema}\n"
            )))
        }
        ToolSyntax::Harmony => None,
    }
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// One call object's JSON (`{"name", "arguments"|"parameters"}`) as a [`ToolCall`].
fn call_from_json(text: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match args {
        // Some models write the arguments already as a JSON string.
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// Splits a whole reply into its content and its calls. Text that only looks like a call but
/// does not parse stays content.
pub fn parse(text: &str, syntax: ToolSyntax) -> (String, Vec<ToolCall>) {
    match syntax {
        ToolSyntax::Hermes => {
            let (mut content, mut calls) = (String::new(), Vec::new());
            let mut rest = text;
            while let Some(start) = rest.find(OPEN) {
                let after = &rest[start + OPEN.len()..];
                let Some(end) = after.find(CLOSE) else { break };
                match call_from_json(&after[..end]) {
                    Some(call) => {
                        content.push_str(&rest[..start]);
                        calls.push(call);
                    }
                    None => content.push_str(&rest[..start + OPEN.len() + end + CLOSE.len()]),
                }
                rest = &after[end + CLOSE.len()..];
            }
            content.push_str(rest);
            let content = if calls.is_empty() {
                content
            } else {
                content.trim().to_string()
            };
            (content, calls)
        }
        ToolSyntax::Llama3Json => {
            let body = text.trim_start();
            let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body);
            match call_from_json(body) {
                Some(call) => (String::new(), vec![call]),
                None => (text.to_string(), Vec::new()),
            }
        }
        ToolSyntax::Harmony => (text.to_string(), Vec::new()),
    }
}

/// Streaming: releases content as it comes, but holds back from where a call may begin, so a
/// client never sees call syntax as content; [`ToolStream::finish`] parses what was held.
#[derive(Debug)]
pub struct ToolStream {
    syntax: ToolSyntax,
    /// Text not yet released (from a possible call's start on).
    held: String,
    /// Whether anything but whitespace was released (Llama's call must be the whole reply).
    released_text: bool,
}

impl ToolStream {
    pub fn new(syntax: ToolSyntax) -> Self {
        Self {
            syntax,
            held: String::new(),
            released_text: false,
        }
    }

    /// Takes new text; returns the content that is safe to send now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        let keep_from = match self.syntax {
            ToolSyntax::Hermes => match self.held.find(OPEN) {
                Some(i) => i,
                None => partial_suffix(&self.held, OPEN),
            },
            ToolSyntax::Llama3Json => {
                let t = self.held.trim_start();
                let could_be_call = !self.released_text
                    && (t.is_empty()
                        || t.starts_with('{')
                        || t.starts_with(PYTHON_TAG)
                        || PYTHON_TAG.starts_with(t));
                if could_be_call {
                    0
                } else {
                    self.held.len()
                }
            }
            ToolSyntax::Harmony => self.held.len(),
        };
        let out: String = self.held.drain(..keep_from).collect();
        if !out.trim().is_empty() {
            self.released_text = true;
        }
        out
    }

    /// The end of the reply: the content still held and the calls.
    pub fn finish(self) -> (String, Vec<ToolCall>) {
        parse(&self.held, self.syntax)
    }
}

/// Where the longest suffix of `text` that is a proper prefix of `marker` begins
/// (`text.len()` when none).
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .filter(|&n| n <= text.len())
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .map_or(text.len(), |n| text.len() - n)
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
