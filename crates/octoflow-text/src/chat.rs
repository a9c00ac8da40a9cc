//! Chat templates: turning a conversation into the prompt text a model was trained on.
//!
//! A model's own template (`tokenizer.chat_template`, a Jinja template written for Hugging Face
//! transformers) is rendered with minijinja, set up as transformers sets up Jinja2: blocks trim
//! their trailing newline and strip leading blanks (`trim_blocks`, `lstrip_blocks`), Python's
//! string and dict methods work (`.strip()`, `.startswith()`, `.items()`, via minijinja-contrib's
//! pycompat), and `raise_exception`, `strftime_now` and a Python-style `tojson` are defined. The
//! variables are `messages` (list of `{role, content}`), `add_generation_prompt`, `bos_token` and
//! `eos_token`, and whatever the caller adds ([`ChatTemplate::render_with`]: gpt-oss's
//! `reasoning_effort`, `tools`).
//!
//! Models whose file has no template get a built-in format for their family ([`BuiltinFormat`]).

use std::path::Path;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use octoflow_gguf::GgufFile;

use crate::error::TextError;
use crate::pyfunc::{python_json, strftime_utc};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant` (templates may accept others, such as `tool`).
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Built-in prompt formats for models whose GGUF file carries no template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinFormat {
    /// Gemma: `<start_of_turn>user\n{content}<end_of_turn>\n` per turn, `assistant` written as
    /// `model`, contents trimmed; system messages have no turn of their own and go, followed by a
    /// blank line, at the start of the next user turn; the generation prompt is
    /// `<start_of_turn>model\n`. No `<bos>`: the tokenizer adds it (as llama.cpp's built-in).
    Gemma,
    /// ChatML: `<|im_start|>{role}\n{content}<|im_end|>\n` per message, generation prompt
    /// `<|im_start|>assistant\n`. The fallback for other families, as in llama.cpp.
    ChatMl,
}

impl BuiltinFormat {
    /// The format for a `general.architecture` value: Gemma for `gemma*`, else ChatML.
    pub fn for_architecture(arch: &str) -> Self {
        if arch.starts_with("gemma") {
            Self::Gemma
        } else {
            Self::ChatMl
        }
    }

    fn render(self, messages: &[Message], add_generation_prompt: bool) -> String {
        let mut out = String::new();
        match self {
            Self::Gemma => {
                let mut system = String::new();
                for m in messages {
                    if m.role == "system" {
                        system.push_str(m.content.trim());
                        continue;
                    }
                    let role = if m.role == "assistant" {
                        "model"
                    } else {
                        m.role.as_str()
                    };
                    out.push_str(&format!("<start_of_turn>{role}\n"));
                    if !system.is_empty() && role != "model" {
                        out.push_str(&system);
                        out.push_str("\n\n");
                        system.clear();
                    }
                    out.push_str(m.content.trim());
                    out.push_str("<end_of_turn>\n");
                }
                if add_generation_prompt {
                    out.push_str("<start_of_turn>model\n");
                }
            }
            Self::ChatMl => {
                for m in messages {
                    out.push_str(&format!(
                        "<|im_start|>{}\n{}<|im_end|>\n",
                        m.role, m.content
                    ));
                }
                if add_generation_prompt {
                    out.push_str("<|im_start|>assistant\n");
                }
            }
        }
        out
    }
}

enum Kind {
    Jinja(Box<Environment<'static>>),
    Builtin(BuiltinFormat),
}

/// A chat template, ready to render conversations.
pub struct ChatTemplate {
    kind: Kind,
    /// Where the template came from, for error messages.
    origin: String,
    bos_token: String,
    eos_token: String,
    /// The Jinja source (`None`: a built-in format).
    source: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .finish()
    }
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    /// The model's template (`tokenizer.chat_template`), or the built-in format of its family
    /// (`general.architecture`) when it has none. `bos_token`/`eos_token` are the texts of the
    /// tokenizer's BOS and EOS tokens.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TextError> {
        let (bos, eos) = special_texts(file)?;
        match file.get("tokenizer.chat_template") {
            Some(v) => {
                let source = v.as_str().ok_or_else(|| {
                    TextError::metadata(
                        "tokenizer.chat_template",
                        format!("is {}, expected a string", v.type_description()),
                    )
                })?;
                Self::from_source(source, "tokenizer.chat_template", &bos, &eos)
            }
            None => {
                let arch = file
                    .get("general.architecture")
                    .and_then(|v| v.as_str())
                    .unwrap_or("");
                Ok(Self::builtin(
                    BuiltinFormat::for_architecture(arch),
                    &bos,
                    &eos,
                ))
            }
        }
    }

    /// A template read from a file (`--chat-template FILE`); `bos_token`/`eos_token` are the
    /// texts the template sees for those variables.
    pub fn from_file(
        path: impl AsRef<Path>,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, TextError> {
        let path = path.as_ref();
        let source = std::fs::read_to_string(path).map_err(|source| TextError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_source(&source, &path.display().to_string(), bos_token, eos_token)
    }

    /// A template read from a file for the model in `file`, whose BOS and EOS texts fill
    /// `bos_token` and `eos_token`.
    pub fn from_file_for_model(path: impl AsRef<Path>, file: &GgufFile) -> Result<Self, TextError> {
        let (bos, eos) = special_texts(file)?;
        Self::from_file(path, &bos, &eos)
    }

    /// A template from Jinja source; compile errors are reported here, naming `origin`.
    pub fn from_source(
        source: &str,
        origin: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, TextError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| TextError::template(origin, &e))?;
        Ok(Self {
            kind: Kind::Jinja(Box::new(env)),
            origin: origin.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            source: Some(source.to_string()),
        })
    }

    /// A built-in format.
    pub fn builtin(format: BuiltinFormat, bos_token: &str, eos_token: &str) -> Self {
        Self {
            kind: Kind::Builtin(format),
            origin: format!("built-in {format:?} format"),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            source: None,
        }
    }

    /// Where the template came from (`tokenizer.chat_template`, a path, or a built-in format).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TextError> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Renders a conversation with more variables for the template, as transformers'
    /// `apply_chat_template(**kwargs)` passes them (`reasoning_effort` for gpt-oss, `tools`,
    /// `enable_thinking`, ...); they cannot replace `messages`, `add_generation_prompt`,
    /// `bos_token` or `eos_token`. Built-in formats ignore them.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TextError> {
        let env = match &self.kind {
            Kind::Builtin(format) => return Ok(format.render(messages, add_generation_prompt)),
            Kind::Jinja(env) => env,
        };
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| minijinja::context! { role => m.role.clone(), content => m.content.clone() })
            .collect();
        self.render_jinja(env, Value::from(messages), add_generation_prompt, vars)
    }

    /// The template rendered over `messages` with the variables every render passes.
    fn render_jinja(
        &self,
        env: &minijinja::Environment<'static>,
        messages: Value,
        add_generation_prompt: bool,
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TextError> {
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
            ..Value::from_serialize(vars)
        };
        let template = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TextError::template(&self.origin, &e))?;
        template
            .render(ctx)
            .map_err(|e| TextError::template(&self.origin, &e))
    }
}

impl ChatTemplate {
    /// The Jinja source (`None` for a built-in format): callers read which conventions a
    /// template follows (how it writes tool calls).
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// Renders OpenAI-style messages given as JSON (`role`, `content`, and whatever else a
    /// template reads: an assistant's `tool_calls`, a tool result's `tool_call_id` and `name`),
    /// with more variables as [`Self::render_with`] takes them (`tools`, OpenAI's list of tool
    /// definitions, the way transformers' `apply_chat_template(messages, tools=...)` passes it).
    /// Built-in formats see each message's role and text content only.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TextError> {
        let env = match &self.kind {
            Kind::Builtin(_) => {
                let plain: Vec<Message> = messages
                    .iter()
                    .map(|m| {
                        let field = |k: &str| m.get(k).and_then(|v| v.as_str()).unwrap_or("");
                        Message::new(field("role"), field("content"))
                    })
                    .collect();
                return self.render(&plain, add_generation_prompt);
            }
            Kind::Jinja(env) => env,
        };
        self.render_jinja(
            env,
            Value::from_serialize(messages),
            add_generation_prompt,
            vars,
        )
    }
}

/// The texts of the BOS and EOS tokens (empty where the file names none).
fn special_texts(file: &GgufFile) -> Result<(String, String), TextError> {
    let token = |key: &str| -> Result<String, TextError> {
        let Some(id) = file.get(key).and_then(|v| v.as_int()) else {
            return Ok(String::new());
        };
        let tokens = file.get_array("tokenizer.ggml.tokens")?;
        Ok(usize::try_from(id)
            .ok()
            .and_then(|i| tokens.get(i))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string())
    };
    Ok((
        token("tokenizer.ggml.bos_token_id")?,
        token("tokenizer.ggml.eos_token_id")?,
    ))
}

/// `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC date/time, for the `%d %b %Y`-style formats templates
/// use (`%Y %m %d %H %M %S %b %B %y %%`).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime_utc(&format, secs)
}

/// `x | tojson` (optionally `indent=N`) written as Python's `json.dumps` writes it, as
/// transformers' templates expect.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let text = python_json(&value, indent)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jinja(source: &str) -> ChatTemplate {
        ChatTemplate::from_source(source, "test", "<s>", "</s>").unwrap()
    }

    #[test]
    fn json_messages_and_tools_reach_the_template() {
        let t = jinja("{% if tools %}T:{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{{ m.tool_calls[0].function.name }}{% else %}{{ m.content }}{% endif %}|{% endfor %}");
        let messages = vec![
            serde_json::json!({"role": "user", "content": "hi"}),
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
            serde_json::json!({"role": "tool", "tool_call_id": "c1", "content": "42"}),
        ];
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let mut vars = serde_json::Map::new();
        vars.insert("tools".into(), tools);
        assert_eq!(
            t.render_json(&messages, false, &vars).unwrap(),
            "T:f;user:hi|assistant:f|tool:42|"
        );
        assert_eq!(
            t.render_json(&messages[..1], false, &serde_json::Map::new())
                .unwrap(),
            "user:hi|"
        );
        assert!(t.source().is_some_and(|s| s.contains("tool_calls")));
    }

    #[test]
    fn blocks_trim_their_newline_like_transformers() {
        // Jinja2 with trim_blocks and lstrip_blocks renders this as "user:hi".
        let t = jinja("{% for m in messages %}\n  {% if m %}{{ m.role }}:{{ m.content }}{% endif %}\n{% endfor %}\n");
        assert_eq!(t.render(&[Message::user("hi")], false).unwrap(), "user:hi");
    }

    #[test]
    fn python_string_methods_work() {
        let t = jinja("{{ messages[0].content.strip().upper() }}{% if messages[0].content.startswith(' a') %}!{% endif %}");
        assert_eq!(t.render(&[Message::user(" ab ")], false).unwrap(), "AB!");
    }

    #[test]
    fn raise_exception_is_a_render_error_with_its_message() {
        let t = jinja("{{ raise_exception('no system role') }}");
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(
            err.contains("no system role") && err.contains("test"),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_name_the_template() {
        let err = ChatTemplate::from_source("{% if %}", "my.jinja", "", "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("my.jinja"), "{err}");
    }

    #[test]
    fn special_tokens_and_generation_prompt_are_variables() {
        let t = jinja("{{ bos_token }}{% if add_generation_prompt %}go{% endif %}{{ eos_token }}");
        assert_eq!(t.render(&[], true).unwrap(), "<s>go</s>");
        assert_eq!(t.render(&[], false).unwrap(), "<s></s>");
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let t = jinja("{{ {'a': [1, 'x'], 'b': none} | tojson }}");
        assert_eq!(
            t.render(&[], false).unwrap(),
            r#"{"a": [1, "x"], "b": null}"#
        );
    }

    #[test]
    fn gemma_builtin_merges_system_into_the_first_user_turn() {
        let t = ChatTemplate::builtin(BuiltinFormat::Gemma, "<bos>", "<eos>");
        let msgs = [
            Message::system(" Be brief. "),
            Message::user("Hi"),
            Message::assistant("Hello!"),
            Message::user("2+2?"),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn chatml_builtin_ends_with_the_assistant_prompt() {
        let t = ChatTemplate::builtin(BuiltinFormat::ChatMl, "", "");
        assert_eq!(
            t.render(&[Message::user("hi")], true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
