//! Tests of `choice.rs` over the tiny SentencePiece tokenizer of `octoflow_model::testing`:
//! ids 5 + b are the bytes b, 262 "Arr", 263 "!", 264 "▁matey", 2 `</s>` (end of generation).

use octoflow_text::Tokenizer;

use super::*;

const EOS: u32 = 2;
const ARR: u32 = 262;
const BANG: u32 = 263;
const MATEY: u32 = 264;

fn tokenizer() -> Tokenizer {
    let mut w = octoflow_gguf::GgufWriter::new();
    octoflow_model::testing::add_tiny_tokenizer(&mut w, None);
    let file = octoflow_model::testing::open(&w).expect("tiny tokenizer parses");
    Tokenizer::from_gguf(&file).expect("tiny tokenizer builds")
}

fn limits(max_tokens: Option<usize>, stops: &[&str]) -> Limits {
    Limits {
        max_tokens,
        stops: stops.iter().map(|s| s.to_string()).collect(),
        ignore_eos: false,
    }
}

fn go(text: &str) -> Release {
    Release {
        text: text.into(),
        finish: None,
    }
}

fn end(text: &str, finish: Finish) -> Release {
    Release {
        text: text.into(),
        finish: Some(finish),
    }
}

#[test]
fn a_stop_string_split_across_tokens_ends_the_choice_unreleased() {
    let tok = tokenizer();
    let mut c = Choice::new(&tok, &limits(None, &["Arr!"]), 0, 100);
    assert_eq!(c.push(MATEY), go(" matey"));
    assert_eq!(
        c.push(ARR),
        go(""),
        "a possible start of the stop string is held"
    );
    assert_eq!(c.push(BANG), end("", Finish::Stop));
    // A held prefix that turns out not to be the stop string is released.
    let mut c = Choice::new(&tok, &limits(None, &["Arr?"]), 0, 100);
    assert_eq!(c.push(ARR), go(""));
    assert_eq!(c.push(BANG), go("Arr!"));
}

#[test]
fn a_stop_string_split_inside_a_character_is_found() {
    let tok = tokenizer();
    let mut c = Choice::new(&tok, &limits(None, &["é"]), 0, 100);
    assert_eq!(c.push(5 + 0xC3), go(""));
    assert_eq!(c.push(5 + 0xA9), end("", Finish::Stop));
}

#[test]
fn end_of_generation_releases_what_was_held() {
    let tok = tokenizer();
    let mut c = Choice::new(&tok, &limits(None, &["Arr!"]), 0, 100);
    assert_eq!(c.push(ARR), go(""));
    assert_eq!(c.push(EOS), end("Arr", Finish::Eog));
    assert_eq!(c.generated(), 2);
    let ignoring = Limits {
        ignore_eos: true,
        ..limits(None, &[])
    };
    let mut c = Choice::new(&tok, &ignoring, 0, 100);
    assert_eq!(c.push(EOS).finish, None);
    // `</s>` and `<|im_end|>` (end of turn), the end of sequence first.
    assert_eq!(device_eog(&tok, false), vec![EOS, 4]);
    assert_eq!(device_eog(&tok, true), Vec::<u32>::new());
}

#[test]
fn the_token_limit_ends_with_the_held_text() {
    let tok = tokenizer();
    let mut c = Choice::new(&tok, &limits(Some(2), &["Arr!"]), 0, 100);
    assert_eq!(c.push(MATEY), go(" matey"));
    assert_eq!(c.push(ARR), end("Arr", Finish::Length));
}

#[test]
fn a_full_context_ends_where_the_device_would() {
    let tok = tokenizer();
    // Tokens are fed at 6, 7: the second leaves no position for the token after it.
    let mut c = Choice::new(&tok, &limits(None, &[]), 6, 8);
    assert_eq!(c.push(MATEY), go(" matey"));
    assert_eq!(c.push(ARR), end("Arr", Finish::Context));
    // The limit is named first when both hold.
    let mut c = Choice::new(&tok, &limits(Some(1), &[]), 7, 8);
    assert_eq!(c.push(ARR).finish, Some(Finish::Length));
}

#[test]
fn an_end_decided_elsewhere_flushes_the_choice() {
    let tok = tokenizer();
    let mut c = Choice::new(&tok, &limits(None, &["Arr!"]), 0, 100);
    assert_eq!(c.push(ARR), go(""));
    assert_eq!(c.end(Finish::Context), end("Arr", Finish::Context));
}
