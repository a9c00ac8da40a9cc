//! `load_jsonl`: record kinds, training masks, and errors that name the line.

mod common;

use common::{chatml, jsonl, tiny_tokenizer};
use octoflow_text::{ChatTemplate, Tokenizer};
use octoflow_train::{load_jsonl, Example, TrainError};

/// The ids an example trains (the first id never is: nothing precedes it).
fn trained_ids(ex: &Example) -> Vec<u32> {
    assert_eq!(ex.ids.len(), ex.train.len());
    ex.ids
        .iter()
        .zip(&ex.train)
        .skip(1)
        .filter(|(_, &t)| t)
        .map(|(&id, _)| id)
        .collect()
}

fn untrained_ids(ex: &Example) -> Vec<u32> {
    ex.ids
        .iter()
        .zip(&ex.train)
        .filter(|(_, &t)| !t)
        .map(|(&id, _)| id)
        .collect()
}

/// Checks every record kind's mask with `tok` and `template`, whose end-of-turn text is `eot`.
fn check_masks(tok: &Tokenizer, template: &ChatTemplate, eot: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = jsonl(
        &dir,
        "d.jsonl",
        &[
            r#"{"text": "Arr! Ye be a pirate, matey."}"#,
            "",
            r#"{"prompt": "What be the sea? ", "completion": "Arr! Wet, matey."}"#,
            r#"{"messages": [{"role": "system", "content": "Talk like a pirate."}, {"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "Arr! 2 plus 3 be 5, matey."}]}"#,
            "   ",
            r#"{"id": 7, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Arr! Ahoy, matey."}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Arr! Fair winds, matey."}]}"#,
        ],
    );
    let ex = load_jsonl(&path, tok, Some(template)).expect("valid data loads");
    assert_eq!(ex.len(), 4, "blank lines are skipped");
    let sp = tok.special();
    let eos = sp.eos.expect("an EOS token");
    let eos_text = tok.decode_with_special(&[eos]);
    for e in &ex {
        if sp.add_bos {
            assert_eq!(e.ids.first(), sp.bos.as_ref(), "BOS added per metadata");
        }
    }
    if !sp.add_bos {
        assert_ne!(ex[0].ids.first(), sp.bos.as_ref(), "no BOS added");
    }
    // text: everything trained, EOS appended
    assert!(ex[0].train.iter().all(|&t| t));
    assert_eq!(ex[0].ids.last(), Some(&eos));
    assert_eq!(trained_ids(&ex[0]), ex[0].ids[1..]);
    let bos_len = usize::from(sp.add_bos);
    assert_eq!(
        tok.decode_with_special(&ex[0].ids[bos_len..]),
        format!("Arr! Ye be a pirate, matey.{eos_text}")
    );
    // prompt/completion: completion + EOS trained
    assert_eq!(
        tok.decode_with_special(&trained_ids(&ex[1])),
        format!("Arr! Wet, matey.{eos_text}")
    );
    let bos_text = match sp.bos.filter(|_| sp.add_bos) {
        Some(b) => tok.decode_with_special(&[b]),
        None => String::new(),
    };
    assert_eq!(
        tok.decode_with_special(&untrained_ids(&ex[1])),
        format!("{bos_text}What be the sea? ")
    );
    // messages: assistant content + end-of-turn marker trained, nothing else
    assert_eq!(
        tok.decode_with_special(&trained_ids(&ex[2])),
        format!("Arr! 2 plus 3 be 5, matey.{eot}")
    );
    assert_eq!(
        tok.decode_with_special(&trained_ids(&ex[3])),
        format!("Arr! Ahoy, matey.{eot}Arr! Fair winds, matey.{eot}")
    );
    // the untrained part is exactly the prompt side: all ids decode back to the rendered text
    let msgs = [
        octoflow_text::Message::system("Talk like a pirate."),
        octoflow_text::Message::user("What is 2+3?"),
        octoflow_text::Message::assistant("Arr! 2 plus 3 be 5, matey."),
    ];
    let rendered = template.render(&msgs, false).expect("renders");
    assert_eq!(
        tok.decode_with_special(&ex[2].ids),
        format!("{bos_text}{rendered}")
    );
    let gen_prompt = template.render(&msgs[..2], true).expect("renders");
    let n_untrained_head = ex[2].train.iter().take_while(|&&t| !t).count();
    assert_eq!(
        tok.decode_with_special(&ex[2].ids[..n_untrained_head]),
        format!("{bos_text}{gen_prompt}"),
        "the generation-prompt header is not trained"
    );
}

#[test]
fn masks_with_the_tiny_tokenizer() {
    check_masks(&tiny_tokenizer(), &chatml(), "<|im_end|>");
}

#[test]
fn masks_with_real_models() {
    for name in common::MODELS {
        let Some(file) = common::cached_model(name) else {
            continue;
        };
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        let template = ChatTemplate::from_gguf(&file).expect("template");
        check_masks(&tok, &template, "<|im_end|>");
    }
}

/// Loads one bad line after two good ones and returns the error text.
fn error_of(bad: &str, template: bool) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = jsonl(
        &dir,
        "bad.jsonl",
        &[r#"{"text": "Arr!"}"#, "", bad, r#"{"text": "Arr!"}"#],
    );
    let tmpl = chatml();
    let e = load_jsonl(&path, &tiny_tokenizer(), template.then_some(&tmpl))
        .expect_err("bad data is an error");
    match &e {
        TrainError::Data { line, .. } => assert_eq!(*line, 3, "{e}"),
        other => panic!("expected a data error, got {other}"),
    }
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("{}:3: ", path.display())),
        "names path:line: {text}"
    );
    text
}

#[test]
fn bad_records_name_their_line() {
    let cases = [
        (r#"{"text": "unterminated"#, "malformed JSON", true),
        (r#"["text"]"#, "JSON object", true),
        (r#"{"title": "x"}"#, "a record needs", true),
        (r#"{"text": ""}"#, "empty", true),
        (r#"{"text": 5}"#, "must be a string", true),
        (r#"{"prompt": "Q"}"#, "missing \"completion\"", true),
        (r#"{"prompt": "Q", "completion": ""}"#, "empty", true),
        (r#"{"text": "a", "messages": []}"#, "mixes", true),
        (r#"{"messages": []}"#, "empty", true),
        (
            r#"{"messages": [{"role": "user", "content": "Q"}]}"#,
            "no assistant",
            true,
        ),
        (
            r#"{"messages": [{"role": "pirate", "content": "Q"}, {"role": "assistant", "content": "A"}]}"#,
            "unknown role \"pirate\"",
            true,
        ),
        (
            r#"{"messages": [{"role": "user"}, {"role": "assistant", "content": "A"}]}"#,
            "messages[0]: missing \"content\"",
            true,
        ),
        (
            r#"{"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}"#,
            "needs a chat template",
            false,
        ),
    ];
    for (bad, want, template) in cases {
        let text = error_of(bad, template);
        assert!(text.contains(want), "{bad}: {text:?} lacks {want:?}");
    }
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nope.jsonl");
    let e = load_jsonl(&path, &tiny_tokenizer(), None).expect_err("no file");
    assert!(e.to_string().contains("nope.jsonl"), "{e}");
}

/// The shipped teaching dataset loads with a real model and trains only the pirate answers.
#[test]
fn pirate_dataset_loads() {
    let Some(file) = common::cached_model(common::MODELS[0]) else {
        return;
    };
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let template = ChatTemplate::from_gguf(&file).expect("template");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/pirate");
    for name in ["train.jsonl", "eval.jsonl"] {
        let ex = load_jsonl(&dir.join(name), &tok, Some(&template)).expect("dataset loads");
        assert!(ex.len() >= 40, "{name}: {} records", ex.len());
        for e in &ex {
            let answer = tok.decode_with_special(&trained_ids(e));
            assert!(
                answer.starts_with("Arr! ") && answer.ends_with(", matey.<|im_end|>"),
                "{name}: {answer:?}"
            );
        }
    }
}
