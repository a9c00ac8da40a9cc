//! Tests of `constraint.rs` over the tiny SentencePiece tokenizer of `octoflow_model::testing`:
//! ids 5 + b are the bytes b, 2 `</s>` is the end of generation.

use std::sync::Arc;

use rand::{Rng, SeedableRng};

use super::*;

const EOS: u32 = 2;

fn byte(b: u8) -> u32 {
    5 + b as u32
}

fn env() -> (GrammarEnv, Arc<Tokenizer>) {
    let mut w = octoflow_gguf::GgufWriter::new();
    octoflow_model::testing::add_tiny_tokenizer(&mut w, None);
    let file = octoflow_model::testing::open(&w).expect("tiny tokenizer parses");
    let tok = Arc::new(Tokenizer::from_gguf(&file).expect("tiny tokenizer builds"));
    (GrammarEnv::new(tok.clone()).expect("grammar env"), tok)
}

fn schema() -> Grammar {
    Grammar::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tag": {"enum": ["red", "green"]},
        },
        "required": ["ok", "n", "tag"],
        "additionalProperties": false,
    }))
}

/// Follows the grammar with random allowed tokens (ending as soon as it may), returns the text.
fn random_walk(c: &mut Constraint, tok: &Tokenizer, seed: u64) -> String {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut ids = Vec::new();
    for _ in 0..400 {
        let mask = c.mask().expect("mask");
        if mask.allows(EOS) {
            return tok.decode(&ids);
        }
        let allowed: Vec<u32> = (0..mask.n_vocab() as u32)
            .filter(|&t| mask.allows(t))
            .collect();
        let t = allowed[rng.gen_range(0..allowed.len())];
        c.commit(t).expect("an allowed token commits");
        ids.push(t);
    }
    panic!(
        "seed {seed}: no end after 400 tokens: {:?}",
        tok.decode(&ids)
    );
}

#[test]
fn the_first_mask_of_a_json_schema_allows_only_an_opening_brace() {
    let (env, _) = env();
    let mut c = env.constraint(&schema()).expect("compiles");
    let mask = c.mask().expect("mask");
    assert!(mask.allows(byte(b'{')));
    for b in [b'A', b'[', b'"', b'1'] {
        assert!(!mask.allows(byte(b)), "{:?}", b as char);
    }
    assert!(!mask.allows(EOS), "an empty output is not a JSON object");
}

#[test]
fn a_valid_document_passes_token_by_token_and_then_may_end() {
    let (env, _) = env();
    let mut c = env.constraint(&schema()).expect("compiles");
    for &b in br#"{"ok": true, "n": 42, "tag": "red"}"# {
        let mask = c.mask().expect("mask");
        assert!(mask.allows(byte(b)), "{:?} refused", b as char);
        assert!(!mask.allows(EOS));
        c.commit(byte(b)).expect("commit");
    }
    assert!(c.is_accepting());
    assert!(c.mask().expect("mask").allows(EOS));
}

#[test]
fn an_invalid_value_is_masked_out() {
    let (env, _) = env();
    let mut c = env.constraint(&schema()).expect("compiles");
    for &b in br#"{"ok": "# {
        c.commit(byte(b)).expect("commit");
    }
    let mask = c.mask().expect("mask");
    assert!(mask.allows(byte(b't')) && mask.allows(byte(b'f')));
    assert!(!mask.allows(byte(b'1')) && !mask.allows(byte(b'"')));
}

#[test]
fn random_walks_under_a_schema_always_give_valid_json() {
    let (env, tok) = env();
    let base: u64 = rand::random();
    for k in 0..8 {
        let seed = base.wrapping_add(k);
        let mut c = env.constraint(&schema()).expect("compiles");
        let text = random_walk(&mut c, &tok, seed);
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: {text:?} is not JSON: {e}"));
        assert!(v["ok"].is_boolean(), "seed {seed}: {text}");
        assert!(
            v["n"].as_u64().is_some_and(|n| n <= 99),
            "seed {seed}: {text}"
        );
        assert!(
            ["red", "green"].contains(&v["tag"].as_str().unwrap_or("")),
            "seed {seed}: {text}"
        );
        assert_eq!(
            v.as_object().map(|o| o.len()),
            Some(3),
            "seed {seed}: {text}"
        );
    }
}

#[test]
fn lark_and_regex_grammars_constrain_too() {
    let (env, tok) = env();
    let seed: u64 = rand::random();
    let mut c = env
        .constraint(&Grammar::Lark(r#"start: "yes" | "no""#.into()))
        .expect("compiles");
    let text = random_walk(&mut c, &tok, seed);
    assert!(text == "yes" || text == "no", "seed {seed}: {text:?}");
    let mut c = env
        .constraint(&Grammar::Regex("[0-9]{3}-[a-c]".into()))
        .expect("compiles");
    let text = random_walk(&mut c, &tok, seed);
    assert!(
        text.len() == 5
            && text[..3].bytes().all(|b| b.is_ascii_digit())
            && text.ends_with(['a', 'b', 'c']),
        "seed {seed}: {text:?}"
    );
}

#[test]
fn bad_grammars_are_compile_errors() {
    let (env, _) = env();
    for g in [
        Grammar::Lark("start: (".into()),
        Grammar::JsonSchema(
            serde_json::json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
        ),
        Grammar::JsonSchema(serde_json::json!({"type": "frobnicate"})),
    ] {
        match env.constraint(&g) {
            Err(ConstraintError::Compile(m)) => assert!(!m.is_empty()),
            other => panic!("{g:?}: {other:?}"),
        }
    }
}
