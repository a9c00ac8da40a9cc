//! Training data: JSONL records tokenized into [`Example`]s with per-token training masks,
//! packed into fixed-length [`Sequence`]s of rows, in a seeded order per epoch.

use std::path::Path;

use octoflow_text::{ChatTemplate, Message, Tokenizer};
use serde_json::{Map, Value};

use crate::error::{Result, TrainError};

/// The label of a row whose next token is not trained (cross-entropy skips it).
pub const IGNORE: u32 = u32::MAX;

/// One tokenized record: ids, and per id whether the model is trained to predict it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Token ids, BOS first where the tokenizer adds one.
    pub ids: Vec<u32>,
    /// `train[k]`: the model is trained to predict `ids[k]` from `ids[..k]` (same length as `ids`).
    pub train: Vec<bool>,
}

impl Example {
    /// Number of ids the model is trained to predict (a first id has nothing before it, so it
    /// never counts).
    pub fn trained(&self) -> usize {
        self.train.iter().skip(1).filter(|&&t| t).count()
    }
}

/// The roles a `messages` record may use.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// Reads a JSONL file of records `{"text": ...}` (every token trained), `{"prompt": ...,
/// "completion": ...}` (only the completion tokens and the EOS after them trained) or
/// `{"messages": [{"role", "content"}, ...]}` (rendered with `template`; only assistant message
/// tokens + the end-of-turn token(s) that close them trained; the generation-prompt header not
/// trained). Other keys of a record are ignored.
///
/// Tokenization follows `octoflow run`: BOS per the tokenizer's metadata (`encode(.., true,
/// true)`), special-token text parsed. Each part is tokenized as inference sees it: the prompt
/// (or the conversation up to an assistant turn's generation prompt) on its own, then the
/// trained text on its own, so training targets are the tokens the model generates. EOS is
/// appended to text and completion records. In a messages record, an assistant turn's tokens
/// are trained up to and including the first end-of-generation token (the template's
/// end-of-turn marker); what follows it (such as a newline) is not. Blank lines are skipped.
///
/// Malformed JSON, a record of none (or several) of the 3 kinds, an empty record, an unknown
/// role, a messages record without an assistant message or without a template → a
/// [`TrainError::Data`] naming `path:line`. Limitation: SentencePiece tokenizers that add a
/// space prefix may tokenize an assistant turn's first word differently than inside the
/// whole text (inference generates it the same way, so this matches what the model sees).
pub fn load_jsonl(
    path: &Path,
    tok: &Tokenizer,
    template: Option<&ChatTemplate>,
) -> Result<Vec<Example>> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let data_err = |message: String| TrainError::Data {
            path: path.to_path_buf(),
            line: i + 1,
            message,
        };
        let value: Value =
            serde_json::from_str(line).map_err(|e| data_err(format!("malformed JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| data_err("a record must be a JSON object".to_string()))?;
        out.push(record(obj, tok, template).map_err(data_err)?);
    }
    Ok(out)
}

/// Tokenizes one record (errors are messages; the caller adds path:line).
fn record(
    obj: &Map<String, Value>,
    tok: &Tokenizer,
    template: Option<&ChatTemplate>,
) -> std::result::Result<Example, String> {
    let has = |k: &str| obj.contains_key(k);
    let kinds = [
        has("text"),
        has("prompt") || has("completion"),
        has("messages"),
    ];
    match kinds.iter().filter(|&&k| k).count() {
        0 => {
            return Err(
                "a record needs \"text\", \"prompt\" + \"completion\", or \"messages\"".to_string(),
            )
        }
        1 => {}
        _ => {
            return Err(
                "a record mixes \"text\", \"prompt\"/\"completion\" and \"messages\"; use one kind"
                    .to_string(),
            )
        }
    }
    let eos = || {
        tok.special()
            .eos
            .ok_or_else(|| "the tokenizer has no EOS token to end the record with".to_string())
    };
    if kinds[0] {
        let text = string(obj, "text")?;
        if text.is_empty() {
            return Err("empty record: \"text\" is empty".to_string());
        }
        let mut ids = tok.encode(text, true, true);
        ids.push(eos()?);
        let train = vec![true; ids.len()];
        return Ok(Example { ids, train });
    }
    if kinds[1] {
        let prompt = string(obj, "prompt")?;
        let completion = string(obj, "completion")?;
        if completion.is_empty() {
            return Err("empty record: \"completion\" is empty".to_string());
        }
        let mut ids = tok.encode(prompt, true, true);
        let n_prompt = ids.len();
        ids.extend(tok.encode(completion, false, true));
        ids.push(eos()?);
        let mut train = vec![false; n_prompt];
        train.resize(ids.len(), true);
        return Ok(Example { ids, train });
    }
    let template =
        template.ok_or_else(|| "a \"messages\" record needs a chat template".to_string())?;
    conversation(&messages(obj)?, tok, template)
}

/// A string field of a record.
fn string<'a>(obj: &'a Map<String, Value>, key: &str) -> std::result::Result<&'a str, String> {
    match obj.get(key) {
        None => Err(format!("missing \"{key}\"")),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("\"{key}\" must be a string, not {}", kind(other))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `messages` array of a record, checked.
fn messages(obj: &Map<String, Value>) -> std::result::Result<Vec<Message>, String> {
    let list = match obj.get("messages") {
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(format!(
                "\"messages\" must be an array, not {}",
                kind(other)
            ))
        }
        None => return Err("missing \"messages\"".to_string()),
    };
    if list.is_empty() {
        return Err("empty record: \"messages\" is empty".to_string());
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let m = m
            .as_object()
            .ok_or_else(|| format!("messages[{i}] must be an object, not {}", kind(m)))?;
        let field = |k: &str| string(m, k).map_err(|e| format!("messages[{i}]: {e}"));
        let role = field("role")?;
        if !ROLES.contains(&role) {
            return Err(format!(
                "messages[{i}]: unknown role {role:?} (expected one of {})",
                ROLES.join(", ")
            ));
        }
        out.push(Message::new(role, field("content")?));
    }
    if !out.iter().any(|m| m.role == "assistant") {
        return Err("empty record: no assistant message to train on".to_string());
    }
    Ok(out)
}

/// Renders and tokenizes a conversation, marking the assistant turns as trained.
fn conversation(
    msgs: &[Message],
    tok: &Tokenizer,
    template: &ChatTemplate,
) -> std::result::Result<Example, String> {
    let render = |m: &[Message], gen: bool| template.render(m, gen).map_err(|e| e.to_string());
    let full = render(msgs, false)?;
    // Byte ranges of the full text that are assistant turns: from the end of the generation
    // prompt that precedes the turn to the end of the conversation rendered up to the turn.
    let mut spans = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        if m.role != "assistant" {
            continue;
        }
        let prefix = render(&msgs[..i], true)?;
        let upto = render(&msgs[..=i], false)?;
        let prev_end = spans.last().map_or(0, |&(_, end)| end);
        let ok = full.starts_with(&prefix)
            && full.starts_with(&upto)
            && prev_end <= prefix.len()
            && prefix.len() <= upto.len();
        if !ok {
            return Err(format!(
                "the chat template ({}) does not render messages[{i}] (assistant) as a \
                 continuation of the conversation before it, so its tokens cannot be marked",
                template.origin()
            ));
        }
        spans.push((prefix.len(), upto.len()));
    }
    let mut ids = Vec::new();
    let mut train = Vec::new();
    let mut push = |text: &str, trained: bool, first: bool| {
        let part = tok.encode(text, first, true);
        let mut on = trained;
        for id in part {
            ids.push(id);
            train.push(on);
            if on && tok.is_eog(id) {
                on = false; // the end-of-turn marker is trained, what follows it is not
            }
        }
    };
    let mut at = 0;
    for (k, &(start, end)) in spans.iter().enumerate() {
        push(&full[at..start], false, k == 0);
        push(&full[start..end], true, false);
        at = end;
    }
    push(&full[at..], false, false);
    Ok(Example { ids, train })
}

/// One training row sequence of exactly `seq_len` rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// `[seq_len]` input token ids (`pad_id` in padding rows).
    pub ids: Vec<u32>,
    /// `[seq_len]` the id row `t` is trained to predict, or [`IGNORE`].
    pub labels: Vec<u32>,
    /// `[seq_len]` position of row `t` within its own example (0 at each example's first row
    /// and in padding rows).
    pub pos: Vec<u32>,
}

/// What [`pack`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackStats {
    /// Sequences produced.
    pub sequences: usize,
    /// Examples longer than `seq_len`, cut to `seq_len` rows.
    pub truncated: usize,
    /// Rows whose label is not [`IGNORE`].
    pub trained_tokens: usize,
    /// Padding rows.
    pub padding: usize,
}

/// Packs `examples`, taken in `order` (indices into `examples`; each must be in range), into
/// sequences of exactly `seq_len` rows:
///
/// - `labels[t] = ids[t+1]` of the same example if that id is trained, else [`IGNORE`] (the
///   last row of an example: [`IGNORE`]);
/// - `pos[t]` = position of row `t` within its own example (0 at each example's first row).
///
/// Examples are packed greedily in `order`: an example that does not fit in what is left of the
/// current sequence starts a new one. Examples longer than `seq_len` are truncated to `seq_len`
/// rows (counted in [`PackStats::truncated`]); empty examples are skipped. Padding rows: id
/// `pad_id`, label [`IGNORE`], pos 0. `seq_len == 0` gives no sequences.
pub fn pack(
    examples: &[Example],
    order: &[usize],
    seq_len: usize,
    pad_id: u32,
) -> (Vec<Sequence>, PackStats) {
    let mut stats = PackStats::default();
    let mut out = Vec::new();
    if seq_len == 0 {
        return (out, stats);
    }
    let empty = || Sequence {
        ids: Vec::with_capacity(seq_len),
        labels: Vec::with_capacity(seq_len),
        pos: Vec::with_capacity(seq_len),
    };
    let mut cur = empty();
    for &i in order {
        let ex = &examples[i];
        let mut n = ex.ids.len();
        if n == 0 {
            continue;
        }
        if n > seq_len {
            stats.truncated += 1;
            n = seq_len;
        }
        if cur.ids.len() + n > seq_len {
            out.push(std::mem::replace(&mut cur, empty()));
        }
        for k in 0..n {
            let trained = k + 1 < n && ex.train.get(k + 1).copied().unwrap_or(false);
            cur.ids.push(ex.ids[k]);
            cur.labels
                .push(if trained { ex.ids[k + 1] } else { IGNORE });
            cur.pos.push(k as u32);
        }
    }
    if !cur.ids.is_empty() {
        out.push(cur);
    }
    for s in &mut out {
        stats.padding += seq_len - s.ids.len();
        s.ids.resize(seq_len, pad_id);
        s.labels.resize(seq_len, IGNORE);
        s.pos.resize(seq_len, 0);
        stats.trained_tokens += s.labels.iter().filter(|&&l| l != IGNORE).count();
    }
    stats.sequences = out.len();
    (out, stats)
}

/// A seeded permutation of `0..n` for `epoch`: the same `(n, seed, epoch)` always gives the same
/// order (on every platform and build: the generator is SplitMix64, written here), different
/// epochs give different orders.
pub fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut state = seed ^ splitmix(&mut epoch.wrapping_mul(0xA24B_AED4_963E_E407));
    let mut order: Vec<usize> = (0..n).collect();
    // Fisher-Yates, drawing j uniformly from 0..=i by rejection.
    for i in (1..n).rev() {
        let bound = i as u64 + 1;
        let zone = u64::MAX - u64::MAX % bound;
        let j = loop {
            let r = splitmix(&mut state);
            if r < zone {
                break r % bound;
            }
        };
        order.swap(i, j as usize);
    }
    order
}

/// One SplitMix64 step.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
