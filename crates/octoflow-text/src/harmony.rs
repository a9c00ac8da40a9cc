//! The harmony response format (gpt-oss): a reply is a sequence of messages, each a header and
//! a content, `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`,
//! ended by `<|return|>` (the reply is done) or `<|call|>` (a tool call waits for its result).
//! The header names the channel (`analysis`: chain of thought, `commentary`: tool calls and
//! preambles, `final`: the answer), and may name a recipient (`to=functions.NAME`) and a content
//! type (`<|constrain|>json`).
//!
//! [`HarmonyParser`] splits the generated text stream into messages as it arrives. It reads the
//! text the streaming decoder releases, in which gpt-oss's `<|start|>`, `<|channel|>`,
//! `<|message|>`, `<|constrain|>` and `<|end|>` are written out (llama.cpp marks them
//! user-defined so they render, see `special.rs`) while `<|return|>` and `<|call|>` end
//! generation and never reach it. Text is released per message as soon as no marker can begin
//! in it, so markers never leak into a message's content whatever the chunking; a header is held
//! until its `<|message|>`. Text outside the format (a model that answers without a header, a
//! header that never closes) is released as it was, as an unstructured message, never dropped.

/// Whether a vocabulary speaks harmony (gpt-oss's o200k_harmony: it has `<|start|>`,
/// `<|channel|>` and `<|message|>`), so its replies are split by [`HarmonyParser`].
pub fn uses_harmony(vocab: &crate::Vocab) -> bool {
    ["<|start|>", "<|channel|>", "<|message|>"]
        .iter()
        .all(|t| vocab.id(t).is_some())
}

/// Where the markers' texts begin; a stream holding none of them is plain text.
const MARKER_START: &str = "<|";

/// The harmony markers the parser acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    Start,
    Channel,
    Constrain,
    Message,
    End,
    Return,
    Call,
}

const MARKERS: &[(&str, Marker)] = &[
    ("<|start|>", Marker::Start),
    ("<|channel|>", Marker::Channel),
    ("<|constrain|>", Marker::Constrain),
    ("<|message|>", Marker::Message),
    ("<|end|>", Marker::End),
    ("<|return|>", Marker::Return),
    ("<|call|>", Marker::Call),
];

/// A header longer than this without its `<|message|>` is not a header: its text is released as
/// it was (real headers are a role, a channel, a recipient and a content type: a few words).
const MAX_HEADER: usize = 256;

/// A message's header: who wrote it, on which channel, to whom.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    /// `assistant` for generated messages.
    pub role: String,
    /// `analysis`, `commentary`, `final`; `None` for text outside the format.
    pub channel: Option<String>,
    /// The recipient (`functions.get_weather`, `python`, `browser.search`), where named.
    pub recipient: Option<String>,
    /// The content type (`json`), where named.
    pub content_type: Option<String>,
}

/// What a message is for an OpenAI-style reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part<'a> {
    /// The answer (`message.content`): the final channel, commentary addressed to nobody
    /// (preambles), and text outside the format.
    Content,
    /// Chain of thought (`message.reasoning_content`): the analysis channel, and messages to
    /// built-in tools (`python`, `browser.*`) that run inside it.
    Reasoning,
    /// A function call: the recipient's function name; the content is its JSON arguments.
    ToolCall(&'a str),
}

impl Header {
    /// The header of text outside the format.
    fn unstructured() -> Self {
        Self {
            role: "assistant".into(),
            ..Self::default()
        }
    }

    /// Parses the text between `<|start|>` and `<|message|>` (markers included); `role` is the
    /// role already given by the prompt (`<|start|>assistant`), if any. Never fails: unknown
    /// words are ignored.
    fn parse(text: &str, role: Option<&str>) -> Self {
        let (role_part, channel_part) = match text.split_once("<|channel|>") {
            Some((r, c)) => (r, Some(c)),
            None => (text, None),
        };
        let mut header = Self {
            role: role.unwrap_or_default().to_string(),
            ..Self::default()
        };
        let mut words = role_part.split_whitespace();
        if role.is_none() {
            header.role = words.next().unwrap_or_default().to_string();
        }
        for w in words {
            if let Some(to) = w.strip_prefix("to=") {
                header.recipient = Some(to.to_string());
            }
        }
        if let Some(c) = channel_part {
            let c = c.replace("<|constrain|>", " ");
            let mut words = c.split_whitespace();
            header.channel = words.next().map(str::to_string);
            for w in words {
                match w.strip_prefix("to=") {
                    Some(to) => header.recipient = Some(to.to_string()),
                    None => header.content_type = Some(w.to_string()),
                }
            }
        }
        header
    }

    /// What the message is for an OpenAI-style reply.
    pub fn part(&self) -> Part<'_> {
        if let Some(name) = self
            .recipient
            .as_deref()
            .and_then(|r| r.strip_prefix("functions."))
        {
            return Part::ToolCall(name);
        }
        match self.channel.as_deref() {
            Some("analysis") => Part::Reasoning,
            _ if self.recipient.is_some() => Part::Reasoning,
            _ => Part::Content,
        }
    }
}

/// Text released for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    /// The message's index in the reply (0, 1, ...): deltas of one message share it.
    pub index: usize,
    /// The message's header.
    pub header: Header,
    /// Content text, never holding a marker.
    pub text: String,
}

#[derive(Debug)]
enum State {
    /// Reading a header; `role` is set when the prompt already gave it.
    Header { text: String, role: Option<String> },
    /// Reading a message's content.
    Content { index: usize, header: Header },
    /// After `<|end|>`, `<|return|>` or `<|call|>`: a `<|start|>` is expected.
    Between,
}

/// Splits a generated harmony stream into messages, incrementally.
#[derive(Debug)]
pub struct HarmonyParser {
    state: State,
    /// Received text that may be the beginning of a marker.
    pending: String,
    messages: usize,
    /// Whether the reply ended on `<|call|>` as text (with `ignore_eos` it can reach us).
    called: bool,
}

impl Default for HarmonyParser {
    fn default() -> Self {
        Self::new()
    }
}

impl HarmonyParser {
    /// A parser for a reply whose prompt ends with the generation prompt `<|start|>assistant`,
    /// as gpt-oss's template renders it: the stream begins inside the assistant's header.
    pub fn new() -> Self {
        Self::with_role(Some("assistant"))
    }

    /// A parser for a stream that begins inside a header of `role` (`None`: the stream begins
    /// with the role itself, or with `<|start|>`).
    pub fn with_role(role: Option<&str>) -> Self {
        Self {
            state: State::Header {
                text: String::new(),
                role: role.map(str::to_string),
            },
            pending: String::new(),
            messages: 0,
            called: false,
        }
    }

    /// Takes the next piece of text; returns the content released by it (deltas of one message
    /// merged).
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        self.drain(false, &mut out);
        out
    }

    /// Ends the stream: releases what is held (a header that never closed, as it was).
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        self.drain(true, &mut out);
        if let State::Header { text, .. } = std::mem::replace(&mut self.state, State::Between) {
            self.release_header(&text, &mut out);
        }
        out
    }

    fn next_index(&mut self) -> usize {
        self.messages += 1;
        self.messages - 1
    }

    /// Processes `pending` up to where a marker might still begin (all of it at the end).
    fn drain(&mut self, at_end: bool, out: &mut Vec<Delta>) {
        let buf = std::mem::take(&mut self.pending);
        let mut rest = buf.as_str();
        loop {
            let Some(at) = rest.find(MARKER_START) else {
                // A lone '<' at the end may be the first byte of a marker.
                let keep = usize::from(!at_end && rest.ends_with('<'));
                self.text(&rest[..rest.len() - keep], out);
                self.pending = rest[rest.len() - keep..].to_string();
                return;
            };
            self.text(&rest[..at], out);
            rest = &rest[at..];
            if let Some(&(s, m)) = MARKERS.iter().find(|(s, _)| rest.starts_with(s)) {
                self.marker(m, s, out);
                rest = &rest[s.len()..];
            } else if !at_end && MARKERS.iter().any(|(s, _)| s.starts_with(rest)) {
                self.pending = rest.to_string();
                return;
            } else {
                self.text(MARKER_START, out);
                rest = &rest[MARKER_START.len()..];
            }
        }
    }

    /// Plain text (no marker) in the current state.
    fn text(&mut self, s: &str, out: &mut Vec<Delta>) {
        if s.is_empty() {
            return;
        }
        match &mut self.state {
            State::Content { index, header } => emit(out, *index, header, s.to_string()),
            State::Header { text, role } => {
                text.push_str(s);
                // Where the prompt gave the role, only ` to=RECIPIENT` may come before the
                // channel; anything else is a model answering outside the format.
                let plain = role.is_some() && !text.contains(MARKER_START) && !role_tail(text);
                if plain || text.len() > MAX_HEADER {
                    let raw = text.clone();
                    self.begin_unstructured(raw, out);
                }
            }
            State::Between => self.begin_unstructured(s.to_string(), out),
        }
    }

    /// Starts an unstructured message with `raw` as its first text.
    fn begin_unstructured(&mut self, raw: String, out: &mut Vec<Delta>) {
        let index = self.next_index();
        let header = Header::unstructured();
        emit(out, index, &header, raw);
        self.state = State::Content { index, header };
    }

    fn marker(&mut self, m: Marker, s: &str, out: &mut Vec<Delta>) {
        let state = std::mem::replace(&mut self.state, State::Between);
        self.state = match (m, state) {
            (Marker::Start, State::Header { text, .. }) => {
                self.release_header(&text, out);
                State::Header {
                    text: String::new(),
                    role: None,
                }
            }
            (Marker::Start, _) => State::Header {
                text: String::new(),
                role: None,
            },
            (Marker::Channel | Marker::Constrain, State::Header { mut text, role }) => {
                text.push_str(s);
                State::Header { text, role }
            }
            (Marker::Message, State::Header { text, role }) => State::Content {
                index: self.next_index(),
                header: Header::parse(&text, role.as_deref()),
            },
            // A new channel without `<|end|><|start|>` (seen from small quantized models):
            // a new message of the same role.
            (Marker::Channel, State::Content { header, .. }) => State::Header {
                text: s.to_string(),
                role: Some(header.role),
            },
            (Marker::Channel, State::Between) => State::Header {
                text: s.to_string(),
                role: Some("assistant".into()),
            },
            (Marker::End | Marker::Return | Marker::Call, State::Header { text, .. }) => {
                self.release_header(&text, out);
                self.called |= m == Marker::Call;
                State::Between
            }
            (Marker::End | Marker::Return | Marker::Call, _) => {
                self.called |= m == Marker::Call;
                State::Between
            }
            // A stray `<|message|>` or `<|constrain|>` outside a header carries nothing.
            (Marker::Message | Marker::Constrain, state) => state,
        };
    }

    /// A header cut short by another marker: its text is released as it was.
    fn release_header(&mut self, text: &str, out: &mut Vec<Delta>) {
        let raw = text.to_string();
        if !raw.is_empty() {
            let index = self.next_index();
            emit(out, index, &Header::unstructured(), raw);
        }
    }

    /// Whether the stream held `<|call|>` (only where end-of-generation tokens are ignored;
    /// normally `<|call|>` ends generation before it reaches the parser).
    pub fn called(&self) -> bool {
        self.called
    }
}

/// Whether `text` (what follows a role the prompt gave, before any marker) can still be
/// ` to=RECIPIENT`.
fn role_tail(text: &str) -> bool {
    let t = text.trim_start();
    if t.is_empty() {
        return true;
    }
    text.starts_with(char::is_whitespace)
        && ("to=".starts_with(t) || (t.starts_with("to=") && t.split_whitespace().count() == 1))
}

/// Appends text to the last delta when it is of the same message.
fn emit(out: &mut Vec<Delta>, index: usize, header: &Header, text: String) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(d) if d.index == index => d.text.push_str(&text),
        _ => out.push(Delta {
            index,
            header: header.clone(),
            text,
        }),
    }
}

/// A function call the model made (a message to `functions.NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The message's index in the reply.
    pub index: usize,
    /// The function's name.
    pub name: String,
    /// Its arguments as the model wrote them (JSON where the header says `json`).
    pub arguments: String,
}

/// A reply split by part: what a non-streamed OpenAI-style response carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    /// The final channel (and text outside the format).
    pub content: String,
    /// The analysis channel.
    pub reasoning: String,
    /// Function calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

impl Reply {
    /// Splits a whole generated text (generation prompt `<|start|>assistant`).
    pub fn parse(text: &str) -> Self {
        let mut parser = HarmonyParser::new();
        let mut reply = Self::default();
        reply.add(&parser.push(text));
        reply.add(&parser.finish());
        reply
    }

    /// Adds released deltas (of one push or many).
    pub fn add(&mut self, deltas: &[Delta]) {
        for d in deltas {
            match d.header.part() {
                Part::Content => self.content.push_str(&d.text),
                Part::Reasoning => self.reasoning.push_str(&d.text),
                Part::ToolCall(name) => match self.tool_calls.last_mut() {
                    Some(c) if c.index == d.index => c.arguments.push_str(&d.text),
                    _ => self.tool_calls.push(ToolCall {
                        index: d.index,
                        name: name.to_string(),
                        arguments: d.text.clone(),
                    }),
                },
            }
        }
    }
}

#[cfg(test)]
#[path = "harmony_tests.rs"]
mod tests;
