//! Agreement with llama.cpp on the three real models: every `tokenize` case, every greedy
//! prompt (raw prompts, and chat prompts rendered by our templates), and the perplexity text.
//! Each test reports all mismatching cases at once.

mod common;

use common::{golden, ids, str_of, tokenizer};
use octoflow_text::{ChatTemplate, Message, Tokenizer};

fn check(failures: &mut Vec<String>, what: &str, got: &[u32], want: &[u32], tok: &Tokenizer) {
    if got != want {
        failures.push(format!(
            "{what}\n   got  {got:?}\n   want {want:?}\n   got pieces {:?}",
            got.iter()
                .map(|&id| tok.vocab().text(id).unwrap_or("?"))
                .collect::<Vec<_>>()
        ));
    }
}

fn report(model: &str, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{model}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn tokenize_cases_match(model: &str) {
    let tok = tokenizer(model);
    let g = golden(model);
    let cases = g["tokenize"].as_array().expect("tokenize cases");
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for case in cases {
        let text = str_of(case, "text");
        let plain = tok.encode(text, false, true);
        check(
            &mut failures,
            &format!("{text:?} (no BOS)"),
            &plain,
            &ids(&case["ids"]),
            &tok,
        );
        let with_bos = tok.encode(text, true, true);
        check(
            &mut failures,
            &format!("{text:?} (BOS if the model adds it)"),
            &with_bos,
            &ids(&case["ids_with_bos_if_model_adds"]),
            &tok,
        );
    }
    report(model, failures);
}

fn raw_prompts_match(model: &str) {
    let tok = tokenizer(model);
    let g = golden(model);
    let mut failures = Vec::new();
    let mut n = 0;
    for case in g["greedy"].as_array().expect("greedy cases") {
        if case["kind"] == "raw" {
            n += 1;
            let prompt = str_of(case, "prompt");
            check(
                &mut failures,
                prompt,
                &tok.encode(prompt, true, true),
                &ids(&case["prompt_ids"]),
                &tok,
            );
        }
    }
    assert!(n > 0, "{model}: no raw prompts in the golden file");
    report(model, failures);
}

fn perplexity_text_matches(model: &str) {
    let tok = tokenizer(model);
    let g = golden(model);
    let nll = &g["nll"][0];
    let want = ids(&nll["token_ids"]);
    let got = tok.encode(str_of(nll, "text"), true, true);
    assert!(
        got.len() >= want.len(),
        "{model}: only {} tokens",
        got.len()
    );
    let mut failures = Vec::new();
    check(
        &mut failures,
        "perplexity text, first tokens",
        &got[..want.len()],
        &want,
        &tok,
    );
    report(model, failures);
}

/// The conversations behind the golden chat prompts (the files keep only the rendered text):
/// the first relies on the template's default system prompt, the second sets its own.
fn golden_conversations() -> [Vec<Message>; 2] {
    [
        vec![Message::user("What is 2 + 2? Answer with one number.")],
        vec![
            Message::system("You are a helpful assistant."),
            Message::user("Write a Python function that reverses a string."),
        ],
    ]
}

fn chat_prompts_match(model: &str) {
    let file = common::open_model(model);
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let template = ChatTemplate::from_gguf(&file).expect("chat template");
    let g = golden(model);
    let chats: Vec<_> = g["greedy"]
        .as_array()
        .expect("greedy cases")
        .iter()
        .filter(|c| c["kind"] == "chat")
        .collect();
    assert_eq!(
        chats.len(),
        2,
        "{model}: expected the two golden conversations"
    );
    let mut failures = Vec::new();
    for (case, messages) in chats.iter().zip(golden_conversations()) {
        let rendered = template.render(&messages, true).expect("render");
        let want = str_of(case, "prompt");
        if rendered != want {
            failures.push(format!(
                "rendered prompt differs:\n   got  {rendered:?}\n   want {want:?}"
            ));
        }
        check(
            &mut failures,
            want,
            &tok.encode(&rendered, true, true),
            &ids(&case["prompt_ids"]),
            &tok,
        );
    }
    report(model, failures);
}

/// llama.cpp's generated text is the detokenization of its generated ids.
fn generated_text_decodes_like_llama_cpp(model: &str) {
    let tok = tokenizer(model);
    let g = golden(model);
    let mut failures = Vec::new();
    for case in g["greedy"].as_array().expect("greedy cases") {
        let got = tok.decode(&ids(&case["greedy_ids"]));
        let want = str_of(case, "greedy_text");
        if got != want {
            failures.push(format!(
                "decode differs:\n   got  {got:?}\n   want {want:?}"
            ));
        }
    }
    report(model, failures);
}

#[test]
fn generated_ids_decode_to_llama_cpps_text_on_every_model() {
    for model in common::MODELS {
        generated_text_decodes_like_llama_cpp(model);
    }
}

#[test]
fn smollm2_tokenize_cases_match_llama_cpp() {
    tokenize_cases_match("smollm2-135m-instruct-q4_1");
}

#[test]
fn qwen25_tokenize_cases_match_llama_cpp() {
    tokenize_cases_match("qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn gemma3_tokenize_cases_match_llama_cpp() {
    tokenize_cases_match("gemma-3-270m-q4_k_m");
}

#[test]
fn raw_prompts_match_llama_cpp_on_every_model() {
    for model in common::MODELS {
        raw_prompts_match(model);
    }
}

#[test]
fn perplexity_text_tokens_match_llama_cpp_on_every_model() {
    for model in common::MODELS {
        perplexity_text_matches(model);
    }
}

#[test]
fn smollm2_chat_prompts_render_and_tokenize_like_the_golden_file() {
    chat_prompts_match("smollm2-135m-instruct-q4_1");
}

#[test]
fn qwen25_chat_prompts_render_and_tokenize_like_the_golden_file() {
    chat_prompts_match("qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn gemma3_without_a_template_uses_the_gemma_turn_format() {
    let file = common::open_model("gemma-3-270m-q4_k_m");
    assert!(file.get("tokenizer.chat_template").is_none());
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let template = ChatTemplate::from_gguf(&file).expect("chat template");
    let prompt = template
        .render(&[Message::user("Hi")], true)
        .expect("render");
    assert_eq!(
        prompt,
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    let ids = tok.encode(&prompt, true, true);
    let start = tok
        .vocab()
        .id("<start_of_turn>")
        .expect("<start_of_turn> token");
    let end = tok
        .vocab()
        .id("<end_of_turn>")
        .expect("<end_of_turn> token");
    assert_eq!(ids[0], tok.special().bos.expect("gemma has BOS"));
    assert_eq!(ids[1], start);
    assert!(ids.contains(&end));
    assert!(tok.is_eog(end), "<end_of_turn> ends generation");
}

#[test]
fn end_of_generation_tokens_are_the_models_turn_and_text_ends() {
    let tok = tokenizer("qwen2.5-coder-0.5b-instruct-q4_k_m");
    for text in ["<|im_end|>", "<|endoftext|>"] {
        assert!(tok.is_eog(tok.vocab().id(text).expect(text)), "{text}");
    }
    assert!(!tok.is_eog(tok.vocab().id("<|im_start|>").expect("im_start")));
    let tok = tokenizer("smollm2-135m-instruct-q4_1");
    assert!(tok.is_eog(2) && tok.is_eog(0) && !tok.is_eog(1));
}
