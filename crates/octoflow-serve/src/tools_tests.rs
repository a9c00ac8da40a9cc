use super::*;

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

#[test]
fn hermes_calls_are_parsed_and_the_rest_is_content() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let (content, calls) = parse(text, ToolSyntax::Hermes);
    assert_eq!(content, "Let me check.");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[1].arguments, r#"{"city":"Oslo"}"#);
}

#[test]
fn a_broken_call_stays_content() {
    let text = "<tool_call>\n{not json}\n</tool_call> and <tool_call> unterminated";
    let (content, calls) = parse(text, ToolSyntax::Hermes);
    assert!(calls.is_empty());
    assert_eq!(content, text);
}

#[test]
fn llama3_calls_are_the_whole_reply() {
    let (c, calls) = parse(
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
        ToolSyntax::Llama3Json,
    );
    assert_eq!(c, "");
    assert_eq!(calls[0].arguments, r#"{"city":"Rome"}"#);
    let (c, calls) = parse("It is sunny.", ToolSyntax::Llama3Json);
    assert_eq!((c.as_str(), calls.len()), ("It is sunny.", 0));
}

#[test]
fn streaming_holds_back_from_a_possible_call_start() {
    let mut s = ToolStream::new(ToolSyntax::Hermes);
    assert_eq!(s.push("Sure. <tool"), "Sure. ");
    assert_eq!(s.push("_call>\n{\"name\": \"get_weather\", "), "");
    assert_eq!(s.push("\"arguments\": {}}\n</tool_call>"), "");
    let (content, calls) = s.finish();
    assert_eq!(content, "");
    assert_eq!(calls[0].name, "get_weather");
    // A "<" that turns out not to start a call is released.
    let mut s = ToolStream::new(ToolSyntax::Hermes);
    assert_eq!(s.push("a <"), "a ");
    assert_eq!(s.push("b"), "<b");
    assert_eq!(s.finish(), (String::new(), Vec::new()));
}

#[test]
fn llama3_streaming_releases_plain_text_and_holds_json() {
    let mut s = ToolStream::new(ToolSyntax::Llama3Json);
    assert_eq!(s.push(" {\"name\": \"get_weather\","), "");
    assert_eq!(s.push(" \"parameters\": {}}"), "");
    assert_eq!(s.finish().1.len(), 1);
    let mut s = ToolStream::new(ToolSyntax::Llama3Json);
    assert_eq!(s.push("Hello"), "Hello");
    assert_eq!(s.push(" {x"), " {x");
}

#[test]
fn tool_choice_is_checked_against_the_tools() {
    let names = vec!["get_weather".to_string()];
    assert_eq!(Choice::parse(None, &names), Ok(Choice::Auto));
    assert_eq!(Choice::parse(None, &[]), Ok(Choice::None));
    assert_eq!(
        Choice::parse(Some(&json!("required")), &names),
        Ok(Choice::Required)
    );
    assert_eq!(
        Choice::parse(
            Some(&json!({"type": "function", "function": {"name": "get_weather"}})),
            &names
        ),
        Ok(Choice::Named("get_weather".into()))
    );
    assert!(Choice::parse(
        Some(&json!({"type": "function", "function": {"name": "nope"}})),
        &names
    )
    .is_err());
    assert!(Choice::parse(Some(&json!("required")), &[]).is_err());
    assert!(Choice::parse(Some(&json!("sometimes")), &names).is_err());
    assert!(tool_names(&[json!({"type": "function", "function": {}})]).is_err());
    assert_eq!(tool_names(&[weather()]), Ok(names));
}

#[test]
fn the_template_names_the_syntax() {
    assert_eq!(
        ToolSyntax::of_template(Some("{{ '<tool_call>' }}")),
        ToolSyntax::Hermes
    );
    assert_eq!(
        ToolSyntax::of_template(Some("<|python_tag|> ipython")),
        ToolSyntax::Llama3Json
    );
    assert_eq!(
        ToolSyntax::of_template(Some("<|call|>")),
        ToolSyntax::Harmony
    );
    assert_eq!(ToolSyntax::of_template(None), ToolSyntax::Hermes);
}

#[test]
fn the_call_grammar_names_only_the_chosen_function() {
    let other = json!({"type": "function", "function": {"name": "other"}});
    let Some(Grammar::Lark(g)) = call_grammar(
        &[weather(), other.clone()],
        Some("get_weather"),
        ToolSyntax::Hermes,
    ) else {
        panic!("a lark grammar")
    };
    assert!(g.contains("get_weather") && !g.contains("\"other\""), "{g}");
    let Some(Grammar::JsonSchema(s)) =
        call_grammar(&[weather(), other], None, ToolSyntax::Llama3Json)
    else {
        panic!("a schema")
    };
    assert_eq!(s["anyOf"].as_array().map(Vec::len), Some(2));
    assert!(call_grammar(&[weather()], None, ToolSyntax::Harmony).is_none());
}
