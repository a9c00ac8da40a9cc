//! The folder's tokenizer as llama.cpp's `tokenizer.ggml.*` metadata: the byte-level BPE of
//! `tokenizer.json` (vocabulary, merges, added tokens) with the pre-tokenizer named from its
//! regex, or SentencePiece-style BPE (byte fallback over "▁"-escaped text: Llama 2, Mistral,
//! Gemma) as llama.cpp's `llama` tokenizer with scores from the merge ranks; BOS/EOS from
//! `tokenizer_config.json` and `generation_config.json`, and the chat template from
//! `tokenizer_config.json` or `chat_template.jinja`.

use std::path::Path;

use octoflow_gguf::{Value, ValueType};
use serde_json::Value as Json;

use crate::error::{HfError, Result};
use crate::json::Obj;

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// Builds the tokenizer metadata; `n_vocab` (config.json's `vocab_size`) pads the vocabulary with
/// unused `[PAD{id}]` tokens when the embedding has more rows than the tokenizer has tokens, as
/// llama.cpp's converter does.
pub fn metadata(dir: &Path, n_vocab: u64) -> Result<Vec<(String, Value)>> {
    let path = dir.join("tokenizer.json");
    let json = crate::json::read(&path)?;
    let t = Obj {
        path: &path,
        value: &json,
    };
    let model = t.get("model").ok_or_else(|| t.error("model", "missing"))?;
    let m = Obj {
        path: &path,
        value: model,
    };
    let kind = m.str_opt("type")?.unwrap_or("");
    let spm = m.bool_opt("byte_fallback")?.unwrap_or(false);
    if kind != "BPE" {
        return Err(HfError::Unsupported {
            path: path.clone(),
            what: format!("tokenizer model {kind:?}"),
            supported: "BPE: byte-level, or SentencePiece-style with byte fallback".into(),
        });
    }
    // byte-level: llama.cpp's pre-tokenizer name; SentencePiece-style: whether "▁" is
    // prefixed to the text
    let (pre, space_prefix) = if spm {
        ("default", Some(spm_space_prefix(&t)?))
    } else {
        (pre_name(&t)?, None)
    };

    // Vocabulary by id: the model's, then added tokens (which may also restate model tokens).
    let vocab = m
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| m.error("model.vocab", "missing or not an object"))?;
    let mut tokens: Vec<Option<(String, i32)>> = Vec::new();
    let mut place = |id: u64, text: &str, ty: i32| -> Result<()> {
        let id = usize::try_from(id)
            .ok()
            .filter(|&i| i < 1 << 24)
            .ok_or_else(|| t.error("model.vocab", format!("token id {id} out of range")))?;
        if tokens.len() <= id {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some((text.to_string(), ty));
        Ok(())
    };
    for (text, id) in vocab {
        let id = id.as_u64().ok_or_else(|| {
            m.error(
                "model.vocab",
                format!("{text:?} has id {id}, not an integer"),
            )
        })?;
        place(id, text, NORMAL)?;
    }
    if let Some(added) = t.get("added_tokens").and_then(Json::as_array) {
        for a in added {
            let a = Obj {
                path: &path,
                value: a,
            };
            let id = a.u64("id")?;
            let content = a
                .str_opt("content")?
                .ok_or_else(|| a.error("added_tokens.content", "missing"))?;
            let special = a.bool_opt("special")?.unwrap_or(false);
            place(id, content, if special { CONTROL } else { USER_DEFINED })?;
        }
    }
    let n = tokens.len().max(n_vocab as usize);
    let mut texts = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for id in 0..n {
        let (text, mut ty) = tokens
            .get(id)
            .cloned()
            .flatten()
            .unwrap_or_else(|| (format!("[PAD{id}]"), UNUSED));
        if spm && ty == NORMAL && is_byte_token(&text) {
            ty = BYTE;
        }
        texts.push(Value::String(text));
        types.push(Value::I32(ty));
    }

    let merges = m
        .get("merges")
        .and_then(Json::as_array)
        .ok_or_else(|| m.error("model.merges", "missing or not an array"))?;
    let merges = merges
        .iter()
        .map(|mg| match mg {
            // Older files write "a b", newer ones ["a", "b"].
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Array(pair) => match pair.as_slice() {
                [Json::String(a), Json::String(b)] => Ok(Value::String(format!("{a} {b}"))),
                _ => Err(m.error("model.merges", format!("{mg} is not a pair of strings"))),
            },
            _ => Err(m.error("model.merges", format!("{mg} is not a merge"))),
        })
        .collect::<Result<Vec<_>>>()?;

    let mut out = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String(if spm { "llama" } else { "gpt2" }.into()),
        ),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(ValueType::String, texts.clone()),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(ValueType::I32, types),
        ),
    ];
    match space_prefix {
        // llama.cpp's SentencePiece tokenizer merges the adjacent pair whose joined text has
        // the highest score: a token's score is minus the rank of the first merge making it,
        // which replays the merge list (tokens no merge makes come after every merge)
        Some(prefix) => {
            let scores = merge_scores(&texts, &merges);
            out.push((
                "tokenizer.ggml.scores".into(),
                Value::Array(ValueType::F32, scores.into_iter().map(Value::F32).collect()),
            ));
            out.push((
                "tokenizer.ggml.add_space_prefix".into(),
                Value::Bool(prefix),
            ));
        }
        None => out.push((
            "tokenizer.ggml.merges".to_string(),
            Value::Array(ValueType::String, merges),
        )),
    }
    let id_of = |text: &str| {
        texts
            .iter()
            .position(|v| v.as_str() == Some(text))
            .map(|i| i as u32)
    };
    special_tokens(dir, &id_of, post_processor_adds(&json), &mut out)?;
    Ok(out)
}

/// Whether `text` is a byte-fallback token, `<0xNN>`.
fn is_byte_token(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 6
        && text.starts_with("<0x")
        && text.ends_with('>')
        && b[3..5].iter().all(u8::is_ascii_hexdigit)
}

/// Per token, minus the rank of the first merge whose two halves join into it; tokens no merge
/// makes score below every merge.
fn merge_scores(texts: &[Value], merges: &[Value]) -> Vec<f32> {
    let mut rank = std::collections::HashMap::new();
    for (i, m) in merges.iter().enumerate() {
        if let Some((a, b)) = m.as_str().and_then(|m| m.split_once(' ')) {
            rank.entry(format!("{a}{b}")).or_insert(i);
        }
    }
    let last = merges.len();
    texts
        .iter()
        .enumerate()
        .map(|(id, t)| {
            let r = t.as_str().and_then(|t| rank.get(t)).copied();
            -(r.unwrap_or(last + id) as f32)
        })
        .collect()
}

/// Whether a SentencePiece-style `tokenizer.json` prefixes "▁" to the text: a `Prepend("▁")`
/// normalizer (Llama 2), or a `Metaspace` pre-tokenizer that prepends (Mistral; llama.cpp
/// prefixes every piece of text that follows a special token or starts the input, as Prepend
/// does — Metaspace's `first` prefixes only the input's start, so texts after a special token
/// or already starting with a space tokenize as llama.cpp does, not as `tokenizers` does).
/// The text must be "▁"-escaped one way or the other.
fn spm_space_prefix(t: &Obj) -> Result<bool> {
    let mut prepend = false;
    let mut escaped = false;
    let mut walk: Vec<&Json> = [t.get("normalizer"), t.get("pre_tokenizer")]
        .into_iter()
        .flatten()
        .collect();
    while let Some(p) = walk.pop() {
        let field = |k: &str| p.get(k).and_then(Json::as_str);
        match field("type") {
            Some("Sequence") => walk.extend(
                ["normalizers", "pretokenizers"]
                    .iter()
                    .filter_map(|k| p.get(*k).and_then(Json::as_array))
                    .flatten(),
            ),
            Some("Prepend") => prepend |= field("prepend") == Some("\u{2581}"),
            Some("Replace") => {
                escaped |= p
                    .get("pattern")
                    .and_then(|x| x.get("String"))
                    .and_then(Json::as_str)
                    == Some(" ")
                    && field("content") == Some("\u{2581}")
            }
            Some("Metaspace") => {
                escaped = true;
                prepend |= match field("prepend_scheme") {
                    Some(scheme) => scheme != "never",
                    None => p
                        .get("add_prefix_space")
                        .and_then(Json::as_bool)
                        .unwrap_or(true),
                };
            }
            _ => {}
        }
    }
    if !escaped {
        return Err(HfError::Unsupported {
            path: t.path.to_path_buf(),
            what: "a byte-fallback BPE that does not escape spaces as \"\u{2581}\"".into(),
            supported: "SentencePiece-style normalizers (Replace \" \" with \"\u{2581}\") or \
                        a Metaspace pre-tokenizer"
                .into(),
        });
    }
    Ok(prepend)
}

/// llama.cpp's `tokenizer.ggml.pre` for the pre-tokenizer `tokenizer.json` describes. llama.cpp
/// itself names it from a hash of sample tokenizations; here the regex is recognized directly.
fn pre_name(t: &Obj) -> Result<&'static str> {
    let pre = t.get("pre_tokenizer");
    let mut patterns = Vec::new();
    let mut byte_level_regex = false;
    let mut digits = false;
    let mut walk = vec![pre];
    while let Some(Some(p)) = walk.pop() {
        match p.get("type").and_then(Json::as_str) {
            Some("Sequence") => walk.extend(
                p.get("pretokenizers")
                    .and_then(Json::as_array)
                    .into_iter()
                    .flatten()
                    .map(Some),
            ),
            Some("Split") => {
                if let Some(r) = p
                    .get("pattern")
                    .and_then(|x| x.get("Regex"))
                    .and_then(Json::as_str)
                {
                    patterns.push(r.to_string());
                }
            }
            Some("ByteLevel") => {
                byte_level_regex |= p.get("use_regex").and_then(Json::as_bool).unwrap_or(true)
            }
            Some("Digits") => digits = true,
            _ => {}
        }
    }
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    match (patterns.as_slice(), byte_level_regex, digits) {
        ([p], false, false) if p == LLAMA3 => Ok("llama-bpe"),
        ([p], false, false) if p == GPT4O => Ok("gpt-4o"),
        ([p], false, false) if p == QWEN2 => Ok("qwen2"),
        ([], true, false) => Ok("gpt2"),
        ([], true, true) => Ok("smollm"),
        _ => Err(HfError::Unsupported {
            path: t.path.to_path_buf(),
            what: format!(
                "pre_tokenizer {}",
                pre.map(|p| p.to_string()).unwrap_or_default()
            ),
            supported: "llama3's, qwen2's and GPT-4o's (o200k) split regex, GPT-2's byte-level \
                        regex"
                .into(),
        }),
    }
}

/// Whether `tokenizer.json`'s post-processor adds a special token before and after the text
/// (`TemplateProcessing`, alone or in a `Sequence`, as llama 3's adds BOS), read as llama.cpp's
/// converter reads it: a template of the text alone says nothing, and only a special token at
/// either end sets that end's flag.
fn post_processor_adds(tokenizer: &Json) -> (Option<bool>, Option<bool>) {
    let Some(p) = tokenizer.get("post_processor") else {
        return (None, None);
    };
    let list = match p.get("processors").and_then(Json::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![p],
    };
    let single = list
        .into_iter()
        .find(|p| p.get("type").and_then(Json::as_str) == Some("TemplateProcessing"))
        .and_then(|t| t.get("single"))
        .and_then(Json::as_array)
        .filter(|s| s.len() > 1);
    let special = |item: Option<&Json>| {
        item.and_then(|i| i.get("SpecialToken"))
            .is_some()
            .then_some(true)
    };
    match single {
        Some(s) => (special(s.first()), special(s.last())),
        None => (None, None),
    }
}

/// BOS/EOS/padding ids, whether to add BOS and EOS (tokenizer_config.json's flags, else what
/// the post-processor adds), and the chat template.
fn special_tokens(
    dir: &Path,
    id_of: &dyn Fn(&str) -> Option<u32>,
    adds: (Option<bool>, Option<bool>),
    out: &mut Vec<(String, Value)>,
) -> Result<()> {
    let path = dir.join("tokenizer_config.json");
    let config = crate::json::read_optional(&path)?.unwrap_or(Json::Null);
    let c = Obj {
        path: &path,
        value: &config,
    };
    // A special token is written as its text or as {"content": text, ...}.
    let token = |key: &str| -> Result<Option<u32>> {
        let text = match c.get(key) {
            None => return Ok(None),
            Some(Json::String(s)) => s.as_str(),
            Some(v) => v
                .get("content")
                .and_then(Json::as_str)
                .ok_or_else(|| c.error(key, format!("{v} is not a token")))?,
        };
        id_of(text).map(Some).ok_or_else(|| {
            c.error(
                key,
                format!("{text:?} is not in tokenizer.json's vocabulary"),
            )
        })
    };
    let gen_path = dir.join("generation_config.json");
    let gen = crate::json::read_optional(&gen_path)?.unwrap_or(Json::Null);
    let g = Obj {
        path: &gen_path,
        value: &gen,
    };
    let first_id = |key: &str| -> Result<Option<u32>> {
        match g.get(key) {
            None => Ok(None),
            Some(Json::Array(ids)) => Ok(ids.first().and_then(Json::as_u64).map(|i| i as u32)),
            Some(v) => v
                .as_u64()
                .map(|i| Some(i as u32))
                .ok_or_else(|| g.error(key, format!("{v} is not a token id"))),
        }
    };
    let bos = match token("bos_token")? {
        Some(id) => Some(id),
        None => first_id("bos_token_id")?,
    };
    let eos = match token("eos_token")? {
        Some(id) => Some(id),
        None => first_id("eos_token_id")?,
    };
    if let Some(id) = bos {
        out.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(id)));
    }
    if let Some(id) = eos {
        out.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(id)));
    }
    if let Some(id) = token("pad_token")? {
        out.push(("tokenizer.ggml.padding_token_id".into(), Value::U32(id)));
    }
    // llama.cpp's converter lets tokenizer_config.json's add_prefix_space decide
    if let Some(prefix) = c.bool_opt("add_prefix_space")? {
        for (k, v) in out.iter_mut() {
            if k == "tokenizer.ggml.add_space_prefix" {
                *v = Value::Bool(prefix);
            }
        }
    }
    let add_bos = c.bool_opt("add_bos_token")?.or(adds.0);
    let add_eos = c.bool_opt("add_eos_token")?.or(adds.1);
    if let Some(add) = add_bos {
        out.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(add)));
    }
    if let Some(add) = add_eos {
        out.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(add)));
    }
    if let Some(t) = chat_template(dir, &c)? {
        out.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(())
}

/// `chat_template.jinja` if present, else `tokenizer_config.json`'s `chat_template` (a string,
/// or a list of named templates of which `default` is taken).
fn chat_template(dir: &Path, c: &Obj) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|source| HfError::Io {
                path: jinja,
                source,
            });
    }
    match c.get("chat_template") {
        None => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(list)) => Ok(list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_string)),
        Some(v) => Err(c.error("chat_template", format!("{v} is not a template"))),
    }
}
