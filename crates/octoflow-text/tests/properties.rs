//! Properties on random input, for every real model: decoding an encoding gives the text back,
//! and streaming decode emits exactly what whole decode returns. Each run draws a fresh seed
//! (or takes `OCTOFLOW_TEST_SEED`) and prints it on failure.

mod common;

use common::{random_char, seed};
use octoflow_text::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_text(rng: &mut StdRng, tok: &Tokenizer) -> String {
    let len = rng.gen_range(0..80);
    (0..len)
        .map(|_| random_char(rng))
        // SentencePiece writes spaces as U+2581, so U+2581 itself cannot come back as written
        // (in llama.cpp neither).
        .filter(|&c| !(tok.model_name() == "llama" && c == '\u{2581}'))
        // Characters with a byte the vocabulary cannot spell are dropped (as by llama.cpp).
        .filter(|&c| {
            c.encode_utf8(&mut [0; 4])
                .bytes()
                .all(|b| tok.encodes_byte(b))
        })
        .collect()
}

fn stream_decode(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut stream = tok.stream_decoder();
    let mut out: String = ids.iter().map(|&id| stream.push(id)).collect();
    out.push_str(&stream.finish());
    out
}

#[test]
fn decode_of_encode_is_the_text_on_every_model() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    for model in common::MODELS {
        let tok = common::tokenizer(model);
        for _ in 0..300 {
            let text = random_text(&mut rng, &tok);
            for add_special in [false, true] {
                let ids = tok.encode(&text, add_special, false);
                let back = tok.decode(&ids);
                assert_eq!(
                    back, text,
                    "{model}, seed {seed}, add_special {add_special}, ids {ids:?}"
                );
            }
        }
    }
}

#[test]
fn streaming_decode_equals_whole_decode_on_every_model() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    for model in common::MODELS {
        let tok = common::tokenizer(model);
        for _ in 0..200 {
            // Tokens of real text (characters split across byte tokens) ...
            let ids = tok.encode(&random_text(&mut rng, &tok), true, false);
            assert_eq!(
                stream_decode(&tok, &ids),
                tok.decode(&ids),
                "{model}, seed {seed}, ids {ids:?}"
            );
            // ... and arbitrary token sequences, including invalid UTF-8 and control tokens.
            let n = tok.n_vocab() as u32;
            let ids: Vec<u32> = (0..rng.gen_range(0..40))
                .map(|_| rng.gen_range(0..n))
                .collect();
            assert_eq!(
                stream_decode(&tok, &ids),
                tok.decode(&ids),
                "{model}, seed {seed}, ids {ids:?}"
            );
        }
    }
}

#[test]
fn streaming_emits_a_split_character_whole_once_complete() {
    let tok = common::tokenizer("smollm2-135m-instruct-q4_1");
    // SmolLM2 spells most CJK characters as several byte-level tokens.
    let ids = tok.encode("日本", false, false);
    assert!(ids.len() > 2, "expected byte pieces, got {ids:?}");
    let mut stream = tok.stream_decoder();
    let emitted: Vec<String> = ids.iter().map(|&id| stream.push(id)).collect();
    let non_empty: Vec<&String> = emitted.iter().filter(|s| !s.is_empty()).collect();
    assert!(non_empty
        .iter()
        .all(|s| s.chars().count() >= 1 && !s.contains('\u{FFFD}')));
    assert_eq!(emitted.concat(), "日本");
    assert!(
        emitted.iter().any(String::is_empty),
        "some token should have completed no character"
    );
    assert_eq!(stream.finish(), "");
}

#[test]
fn control_tokens_are_text_unless_special_parsing_is_on() {
    let tok = common::tokenizer("qwen2.5-coder-0.5b-instruct-q4_k_m");
    let im_start = tok.vocab().id("<|im_start|>").expect("<|im_start|>");
    assert_eq!(tok.encode("<|im_start|>user", false, true)[0], im_start);
    let as_text = tok.encode("<|im_start|>user", false, false);
    assert!(!as_text.contains(&im_start), "{as_text:?}");
    assert_eq!(tok.decode(&as_text), "<|im_start|>user");
    // User-defined tokens are matched whole either way.
    let tool_call = tok.vocab().id("<tool_call>").expect("<tool_call>");
    assert_eq!(tok.encode("<tool_call>", false, false), [tool_call]);
    // Control tokens render as nothing in decode, as their text with decode_with_special.
    let ids = tok.encode("<|im_start|>hi<|im_end|>", false, true);
    assert_eq!(tok.decode(&ids), "hi");
    assert_eq!(tok.decode_with_special(&ids), "<|im_start|>hi<|im_end|>");
}

#[test]
fn bytes_missing_from_a_byte_level_vocabulary_are_reported() {
    let smollm = common::tokenizer("smollm2-135m-instruct-q4_1");
    assert!(!smollm.encodes_byte(0xF1) && smollm.encodes_byte(b'a') && smollm.encodes_byte(0xF0));
    let qwen = common::tokenizer("qwen2.5-coder-0.5b-instruct-q4_k_m");
    assert!((0..=255u8).all(|b| qwen.encodes_byte(b)));
}

#[test]
fn out_of_range_ids_decode_as_a_replacement_character() {
    let tok = common::tokenizer("smollm2-135m-instruct-q4_1");
    assert_eq!(tok.decode(&[u32::MAX]), "\u{FFFD}");
}
