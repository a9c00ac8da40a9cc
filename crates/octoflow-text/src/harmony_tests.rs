use super::*;

/// Every message of a stream fed in `chunks`: (index, header, whole text).
fn messages(chunks: &[&str]) -> Vec<(usize, Header, String)> {
    let mut parser = HarmonyParser::new();
    let mut deltas = Vec::new();
    for c in chunks {
        deltas.extend(parser.push(c));
    }
    deltas.extend(parser.finish());
    let mut out: Vec<(usize, Header, String)> = Vec::new();
    for d in deltas {
        match out.last_mut() {
            Some((i, h, t)) if *i == d.index => {
                assert_eq!(*h, d.header, "one message, one header");
                t.push_str(&d.text);
            }
            _ => {
                assert!(
                    out.iter().all(|(i, _, _)| *i != d.index),
                    "message {} released after another began",
                    d.index
                );
                out.push((d.index, d.header, d.text));
            }
        }
    }
    out
}

fn header(channel: &str, recipient: Option<&str>, content_type: Option<&str>) -> Header {
    Header {
        role: "assistant".into(),
        channel: Some(channel.into()),
        recipient: recipient.map(Into::into),
        content_type: content_type.map(Into::into),
    }
}

const REASONED: &str = "<|channel|>analysis<|message|>User asks 2+2. Easy: 4.<|end|>\
<|start|>assistant<|channel|>final<|message|>2 + 2 = **4** — <b>sure</b> <|x|> ü.";

/// Every way of cutting `text` in three at character boundaries gives the same messages as
/// feeding it whole.
fn same_at_every_split(text: &str) {
    let whole = messages(&[text]);
    let cuts: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for &a in &cuts {
        assert_eq!(
            messages(&[&text[..a], &text[a..]]),
            whole,
            "split at byte {a} of {text:?}"
        );
        for &b in cuts.iter().filter(|&&b| b >= a).step_by(7) {
            assert_eq!(
                messages(&[&text[..a], &text[a..b], &text[b..]]),
                whole,
                "split at bytes {a} and {b} of {text:?}"
            );
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(messages(&refs), whole, "one character at a time: {text:?}");
}

#[test]
fn analysis_then_final_are_two_messages() {
    assert_eq!(
        messages(&[REASONED]),
        vec![
            (
                0,
                header("analysis", None, None),
                "User asks 2+2. Easy: 4.".into()
            ),
            (
                1,
                header("final", None, None),
                "2 + 2 = **4** — <b>sure</b> <|x|> ü.".into()
            ),
        ]
    );
    let reply = Reply::parse(REASONED);
    assert_eq!(reply.reasoning, "User asks 2+2. Easy: 4.");
    assert_eq!(reply.content, "2 + 2 = **4** — <b>sure</b> <|x|> ü.");
    assert!(reply.tool_calls.is_empty());
}

#[test]
fn tool_calls_name_their_function_and_content_type() {
    // The recipient after the channel, as gpt-oss writes it, and in the role, as the
    // template renders past calls.
    for text in [
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}",
    ] {
        let m = messages(&[text]);
        assert_eq!(m.len(), 2, "{text}");
        assert_eq!(
            m[1].1,
            header("commentary", Some("functions.get_weather"), Some("json"))
        );
        assert_eq!(m[1].1.part(), Part::ToolCall("get_weather"));
        let reply = Reply::parse(text);
        assert_eq!(reply.reasoning, "Need weather.");
        assert_eq!(reply.content, "");
        assert_eq!(
            reply.tool_calls,
            vec![ToolCall {
                index: 1,
                name: "get_weather".into(),
                arguments: "{\"city\":\"Paris\"}".into()
            }]
        );
    }
}

#[test]
fn parts_follow_channel_and_recipient() {
    let h = |c: &str, r: Option<&str>| header(c, r, None);
    assert_eq!(h("final", None).part(), Part::Content);
    assert_eq!(h("commentary", None).part(), Part::Content);
    assert_eq!(h("analysis", None).part(), Part::Reasoning);
    assert_eq!(h("analysis", Some("python")).part(), Part::Reasoning);
    assert_eq!(
        h("commentary", Some("functions.f")).part(),
        Part::ToolCall("f")
    );
    assert_eq!(Header::unstructured().part(), Part::Content);
}

#[test]
fn splitting_the_stream_anywhere_changes_nothing() {
    for text in [
        REASONED,
        "<|channel|>analysis<|message|>a<b|c<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":\"<|\"}",
        "plain answer without headers <|end|> and <| things",
        "<|channel|>final<|message|>no end",
        "<|channel|>analysis<|message|>x<|channel|>final<|message|>y",
        "<|channel|>analysis",
        " to=functions.f<|channel|>commentary json<|message|>[1]<|call|>",
        "<|start|>assistant<|channel|>final<|message|>after a start<|return|>",
        "<|channel|>final<|message|>日本語😀<|end|><|start|>",
        "<",
        "<|",
        "<|cha",
    ] {
        same_at_every_split(text);
    }
}

#[test]
fn markers_never_reach_the_content() {
    let text = "<|channel|>analysis<|message|>t<|message|>u<|constrain|>v<|end|><|start|>assistant<|channel|>final<|message|>w";
    let m = messages(&[text]);
    assert_eq!(m.len(), 2);
    assert_eq!(m[0].2, "tuv");
    assert_eq!(m[1].2, "w");
}

#[test]
fn text_outside_the_format_is_released_as_it_was() {
    // A model answering without a header streams at once, unstructured.
    let mut parser = HarmonyParser::new();
    let d = parser.push("Hello");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].text, "Hello");
    assert_eq!(d[0].header.channel, None);
    assert_eq!(Reply::parse("Hello <|there").content, "Hello <|there");
    // A header that never closes is released at the end, markers and all.
    assert_eq!(
        Reply::parse("<|channel|>analysis").content,
        "<|channel|>analysis"
    );
    assert_eq!(Reply::parse("<|cha").content, "<|cha");
    assert_eq!(Reply::parse("<").content, "<");
    // So is one that runs past any real header's length.
    let long = format!("<|channel|>{}", "x".repeat(MAX_HEADER * 2));
    assert_eq!(Reply::parse(&long).content, long);
    // Text after an ended message starts an unstructured one.
    let r = Reply::parse("<|channel|>final<|message|>a<|end|>b");
    assert_eq!(r.content, "ab");
}

#[test]
fn content_is_released_as_soon_as_no_marker_can_begin() {
    let mut parser = HarmonyParser::new();
    assert!(
        parser.push("<|channel|>final").is_empty(),
        "a header is held"
    );
    let d = parser.push("<|message|>Hi <");
    assert_eq!(d[0].text, "Hi ", "a '<' may begin a marker");
    let d = parser.push("3 and <|e");
    assert_eq!(d[0].text, "<3 and ");
    let d = parser.push("nd|>");
    assert!(d.is_empty());
    assert!(parser.finish().is_empty());
}

#[test]
fn call_is_seen_where_it_reaches_the_parser() {
    let mut p = HarmonyParser::new();
    p.push("<|channel|>commentary to=functions.f json<|message|>{}<|call|>");
    assert!(p.called());
}

#[test]
fn random_streams_never_panic_nor_leak_markers_into_messages() {
    // Random mixtures of markers, marker fragments and text: the same messages whole or a
    // character at a time, and no marker inside a message that has a channel.
    let pieces = [
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|constrain|>",
        "<|call|>",
        "<|return|>",
        "<|",
        "<",
        "|>",
        "assistant",
        "analysis",
        "final",
        " to=functions.f",
        " json",
        "hello",
        " ",
        "\n",
        "ü",
        "😀",
    ];
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("OCTOFLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..300 {
        let mut text = String::new();
        for _ in 0..rng.gen_range(0..24) {
            text.push_str(pieces[rng.gen_range(0..pieces.len())]);
        }
        let whole = messages(&[&text]);
        let by_char: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = by_char.iter().map(String::as_str).collect();
        assert_eq!(messages(&refs), whole, "seed {seed}: {text:?}");
        for (_, h, t) in &whole {
            if h.channel.is_some() {
                for (m, _) in MARKERS {
                    assert!(
                        !t.contains(m),
                        "seed {seed}: {m} in a message's content: {text:?}"
                    );
                }
            }
        }
    }
}
