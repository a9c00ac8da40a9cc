//! Tokenizing a megabyte takes well under a second per model, for ordinary text and for inputs
//! that make naive implementations quadratic (one huge word, a long run of spaces or newlines).
//! The bounds are loose (a shared, busy machine); the timings are printed for the record.

mod common;

use std::time::{Duration, Instant};

const MB: usize = 1 << 20;

fn megabyte_of(unit: &str) -> String {
    let mut s = String::with_capacity(MB + unit.len());
    while s.len() < MB {
        s.push_str(unit);
    }
    s
}

fn time_encode(model: &str, what: &str, text: &str, limit: Duration) {
    let tok = common::tokenizer(model);
    let start = Instant::now();
    let ids = tok.encode(text, true, true);
    let took = start.elapsed();
    eprintln!(
        "{model}: {what}: {} bytes -> {} tokens in {:.3} s ({:.1} MB/s)",
        text.len(),
        ids.len(),
        took.as_secs_f64(),
        text.len() as f64 / MB as f64 / took.as_secs_f64()
    );
    assert!(
        took < limit,
        "{model}: {what} took {took:?}, over {limit:?}"
    );
    assert_eq!(
        tok.decode(&ids),
        text,
        "{model}: {what} does not round-trip"
    );
}

#[test]
fn a_megabyte_of_prose_tokenizes_quickly_on_every_model() {
    let golden = common::golden("smollm2-135m-instruct-q4_1");
    let prose = common::str_of(&golden["nll"][0], "text").to_string();
    let mixed = format!("{prose}\n日本語のテキストです。한국어 텍스트 🚀🔥 naïve café 3.14159\n");
    let text = megabyte_of(&mixed);
    for model in common::MODELS {
        time_encode(model, "prose", &text, Duration::from_secs(3));
    }
}

#[test]
fn pathological_megabytes_stay_linear_on_every_model() {
    let cases = [
        ("one 1 MB word", megabyte_of("abcdefghij")),
        ("1 MB of spaces then a word", megabyte_of(" ") + "x"),
        ("1 MB of newlines", megabyte_of("\n")),
        ("1 MB of digits", megabyte_of("0123456789")),
        ("1 MB of one emoji", megabyte_of("🚀")),
    ];
    for model in common::MODELS {
        for (what, text) in &cases {
            time_encode(model, what, text, Duration::from_secs(5));
        }
    }
}
