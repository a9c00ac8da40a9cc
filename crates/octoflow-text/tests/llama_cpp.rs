//! Differential tests against llama.cpp itself (llama-cpp-python, installed by scripts/deps.sh)
//! on fresh random input for every real model: tokenization with and without special-token
//! parsing and BOS, detokenization of arbitrary token sequences, and the chat template rendered
//! by Jinja2 for random conversations. The golden files fix a few cases; these draw new ones on
//! every run (seed printed on failure, `OCTOFLOW_TEST_SEED` replays it).

mod common;
// the octoflow crate's tests ask llama.cpp through the same scripts
#[path = "../../octoflow/tests/common/mod.rs"]
mod llama;

use std::path::Path;

use common::{ids, random_char, seed};
use octoflow_text::{ChatTemplate, Message, TokenAttr, Tokenizer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const TEXTS: usize = 150;
const ID_SEQUENCES: usize = 100;
const CONVERSATIONS: usize = 60;

/// Pieces that exercise the pre-tokenizers' rules (contractions, digit runs, code, spaces before
/// words) beside the random characters.
const WORDS: &[&str] = &[
    "the",
    " the",
    "The",
    "don't",
    "I'm",
    "we'll",
    "they've",
    "'s",
    "'S",
    "'LL",
    " hello",
    "  ",
    "\n\n",
    "123456",
    "3.14159",
    "1,000,000",
    "fn main() {",
    "    return x",
    "x_1",
    "camelCase",
    "ALLCAPS",
    "http://example.com/a?b=c",
    "naïve",
    "…",
    "—",
    "€100",
    "١٢٣",
    "{{ x }}",
    "{% if %}",
    "\\n",
    " \u{a0} ",
    "\t\t",
    "...",
    "!!!",
    "===",
    "HelloWorld",
    "ÉCOLE d'été",
    "Straße",
    "e\u{301}",
    "path/to/file/\n",
    "Привет Мир",
    "日本語のテキスト",
    "😀👍",
    "I'LL",
];

/// Random text: words, random characters, and now and then one of the model's special or
/// user-defined tokens written out.
fn random_text(rng: &mut StdRng, specials: &[String]) -> String {
    let mut s = String::new();
    for _ in 0..rng.gen_range(0..40) {
        let r = rng.gen_range(0..20);
        if r < 7 {
            s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        } else if r == 7 && !specials.is_empty() {
            s.push_str(&specials[rng.gen_range(0..specials.len())]);
        } else {
            s.push(random_char(rng));
        }
    }
    s
}

/// Texts of the model's control and user-defined tokens (a sample, to keep the pool short).
fn special_texts(tok: &Tokenizer) -> Vec<String> {
    let vocab = tok.vocab();
    (0..vocab.len() as u32)
        .filter(|&id| {
            vocab
                .attr(id)
                .intersects(TokenAttr::CONTROL | TokenAttr::USER_DEFINED)
        })
        .filter_map(|id| vocab.text(id).map(str::to_owned))
        .step_by(7)
        .take(64)
        .collect()
}

fn random_conversation(rng: &mut StdRng, specials: &[String]) -> Value {
    let mut messages = Vec::new();
    if rng.gen_bool(0.5) {
        messages.push(json!({"role": "system", "content": random_text(rng, specials)}));
    }
    for _ in 0..rng.gen_range(1..4) {
        messages.push(json!({"role": "user", "content": random_text(rng, specials)}));
        if rng.gen_bool(0.7) {
            messages.push(json!({"role": "assistant", "content": random_text(rng, specials)}));
        }
    }
    json!({"messages": messages, "add_generation_prompt": rng.gen_bool(0.5)})
}

/// llama.cpp's answers to a request (see scripts/check/llama_text.py).
fn llama_cpp(model: &Path, request: &Value) -> Value {
    llama::llama_cpp_script("llama_text.py", model, request)
}

#[test]
fn tokenizer_and_chat_template_agree_with_llama_cpp_on_random_input() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut failures = Vec::new();
    for model in common::MODELS {
        let file = common::open_model(model);
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        let specials = special_texts(&tok);
        let texts: Vec<String> = (0..TEXTS)
            .map(|_| random_text(&mut rng, &specials))
            .collect();
        let n = tok.n_vocab() as u32;
        let sequences: Vec<Vec<u32>> = (0..ID_SEQUENCES)
            .map(|_| {
                (0..rng.gen_range(1..24))
                    .map(|_| rng.gen_range(0..n))
                    .collect()
            })
            .collect();
        let conversations: Vec<Value> = (0..CONVERSATIONS)
            .map(|_| random_conversation(&mut rng, &specials))
            .collect();
        let answer = llama_cpp(
            &common::model_path(model),
            &json!({"texts": texts, "ids": sequences, "conversations": conversations}),
        );
        let mut fail = |what: String| failures.push(format!("{model}: {what}"));
        for (i, text) in texts.iter().enumerate() {
            let (got, want) = (tok.encode(text, false, true), ids(&answer["special"][i]));
            if got != want {
                fail(format!(
                    "{text:?} (special parsed)\n  got  {got:?}\n  want {want:?}"
                ));
            }
            let (got, want) = (tok.encode(text, true, false), ids(&answer["bos_plain"][i]));
            if got != want {
                fail(format!(
                    "{text:?} (BOS, plain)\n  got  {got:?}\n  want {want:?}"
                ));
            }
        }
        for (i, seq) in sequences.iter().enumerate() {
            let (got, want) = (tok.decode(seq), &answer["decoded"][i]);
            if want.as_str() != Some(got.as_str()) {
                fail(format!("decode {seq:?}\n  got  {got:?}\n  want {want}"));
            }
        }
        match (
            ChatTemplate::from_gguf(&file),
            answer["rendered"].as_array(),
        ) {
            (Ok(template), Some(rendered)) if template.origin() == "tokenizer.chat_template" => {
                for (conv, want) in conversations.iter().zip(rendered) {
                    let messages: Vec<Message> = conv["messages"]
                        .as_array()
                        .expect("messages")
                        .iter()
                        .map(|m| {
                            Message::new(common::str_of(m, "role"), common::str_of(m, "content"))
                        })
                        .collect();
                    let agp = conv["add_generation_prompt"] == true;
                    match template.render(&messages, agp) {
                        Ok(got) if want.as_str() == Some(got.as_str()) => {}
                        got => fail(format!("chat {conv}\n  got  {got:?}\n  want {want}")),
                    }
                }
            }
            (_, None) => {} // no template in the file: nothing to render like llama.cpp
            (t, Some(_)) => fail(format!(
                "the file has a chat template, ours is {:?}",
                t.map(|t| t.origin().to_owned())
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "seed {seed}: {} disagreements with llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// GPT-4o's pre-tokenizer (`tokenizer.ggml.pre = "gpt-4o"`, GPT-OSS's) has no shipped model
/// here: qwen2.5's byte-level BPE vocabulary is relabelled with it, so llama.cpp splits with its
/// GPT-4o pattern and the same merges, and both tokenizers are compared on random text.
#[test]
fn gpt4o_pre_tokenizer_agrees_with_llama_cpp_on_random_input() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let base = common::open_model("qwen2.5-coder-0.5b-instruct-q4_k_m");
    let mut w = octoflow_gguf::GgufWriter::from_file(&base);
    w.tensors_mut().clear();
    w.set(
        "tokenizer.ggml.pre",
        octoflow_gguf::value::Value::String("gpt-4o".into()),
    );
    w.remove("tokenizer.chat_template");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gpt4o-vocab.gguf");
    w.write_file(&path).expect("vocabulary-only GGUF written");
    let file = octoflow_gguf::GgufFile::open(&path).expect("written GGUF parses");
    let tok = Tokenizer::from_gguf(&file).expect("gpt-4o tokenizer");
    let texts: Vec<String> = (0..TEXTS).map(|_| random_text(&mut rng, &[])).collect();
    let answer = llama_cpp(
        &path,
        &json!({"texts": texts, "ids": [], "conversations": []}),
    );
    let failures: Vec<String> = texts
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let (got, want) = (tok.encode(text, true, false), ids(&answer["bos_plain"][i]));
            (got != want).then(|| format!("{text:?}\n  got  {got:?}\n  want {want:?}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "seed {seed}: {} disagreements with llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
