//! `--chat-template FILE`: a template from a file overrides the model's, with the model's BOS
//! and EOS texts as variables.

mod common;

use octoflow_text::{ChatTemplate, Message};

#[test]
fn a_template_file_overrides_the_models_own_and_sees_its_special_tokens() {
    let file = common::open_model("gemma-3-270m-q4_k_m");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.jinja");
    std::fs::write(&path, "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{{ eos_token }}")
        .expect("write template");
    let template = ChatTemplate::from_file_for_model(&path, &file).expect("template");
    assert_eq!(template.origin(), path.display().to_string());
    let text = template
        .render(&[Message::user("hi")], true)
        .expect("render");
    assert_eq!(text, "<bos>[user] hi\n<eos>");
}

#[test]
fn a_missing_template_file_is_an_error_naming_it() {
    let err = ChatTemplate::from_file("/nonexistent/t.jinja", "<s>", "</s>")
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/t.jinja"), "{err}");
}
