//! gpt-oss's harmony chat format end to end, on a tiny gpt-oss model that carries gpt-oss's real
//! chat template (llama.cpp's copy, fetched once by scripts/check/gpt_oss_template.py; see
//! scripts/test-deps.sh) and the harmony markers as control tokens.
//!
//! - The vocabulary, the special tokens and the template agree with llama.cpp itself
//!   (llama-cpp-python): tokenization and detokenization of text full of markers, which ids end
//!   generation (`<|return|>`, `<|call|>`, not `<|end|>`), and the template rendered by Jinja2
//!   for conversations with system and developer messages, history, tools and each reasoning
//!   effort.
//! - `run` and `serve` split a reply into channels. A random model would not write the
//!   harmony structure, so the tiny model is made to: its blocks add nothing to the residual
//!   stream (zero output projections and expert down products), so the next token depends on
//!   the current one only, and its embedding and output matrices chain a scripted reply
//!   (`<|channel|>analysis<|message|>Thinking<|end|><|start|>assistant<|channel|>final
//!   <|message|>Answer<|return|>`), each step's successor the only non-zero logit. The reply's
//!   words are normal tokens of the vocabulary; the second header is one normal token whose
//!   text spells `<|channel|>final<|message|>`, since a bigram chain cannot follow one marker
//!   token by two different words.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use octoflow_gguf::value::{Value, ValueType};
use octoflow_gguf::GgmlType;
use octoflow_model::testing::{rng, tiny_writer, TinyShape, TINY};
use serde_json::{json, Value as Json};

const MARKERS: [&str; 7] = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
];

/// Normal tokens the scripted reply uses.
const WORDS: [&str; 5] = [
    "analysis",
    "Thinking",
    "assistant",
    "<|channel|>final<|message|>",
    "Answer",
];

/// The reply the model is made to write after the generation prompt's last token (`t` of
/// `assistant`), ending on `<|return|>`.
const SCRIPT: [&str; 10] = [
    "<|channel|>",
    "analysis",
    "<|message|>",
    "Thinking",
    "<|end|>",
    "<|start|>",
    "assistant",
    "<|channel|>final<|message|>",
    "Answer",
    "<|return|>",
];

/// gpt-oss's chat template as llama.cpp ships it.
fn real_template() -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/check/gpt_oss_template.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "gpt_oss_template.py (scripts/test-deps.sh fetches the template): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("the template is UTF-8")
}

/// Token texts: `<unk> <s>`, the 256 bytes, the markers, the words. (No `</s>`: llama.cpp
/// takes it for an end of generation by its text, which is not what this test is about.)
fn vocabulary() -> (Vec<String>, Vec<i32>) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into()];
    // 2 = unknown, 3 = control, 6 = byte, 1 = normal (llama.cpp's llama_token_type)
    let mut types = vec![2, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for m in MARKERS {
        tokens.push(m.into());
        types.push(3);
    }
    for w in WORDS {
        tokens.push(w.into());
        types.push(1);
    }
    (tokens, types)
}

fn id(tokens: &[String], text: &str) -> usize {
    tokens
        .iter()
        .position(|t| t == text)
        .unwrap_or_else(|| panic!("{text} is in the vocabulary"))
}

/// Writes the tiny gpt-oss model to `dir`; with `scripted`, its weights write [`SCRIPT`].
fn tiny_gpt_oss(dir: &Path, scripted: bool) -> PathBuf {
    let (tokens, types) = vocabulary();
    let n_vocab = tokens.len();
    let shape = TinyShape { n_vocab, ..TINY };
    let mut w = tiny_writer("gpt-oss", shape, &mut rng("harmony"));
    // Room for the template's system message, byte by byte.
    w.set("gpt-oss.context_length", Value::U32(1024));
    if scripted {
        script_weights(&mut w, &tokens, shape.n_embd);
    }
    w.set("tokenizer.ggml.model", Value::String("llama".into()));
    let n = tokens.len();
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(
            ValueType::String,
            tokens.iter().cloned().map(Value::String).collect(),
        ),
    );
    w.set(
        "tokenizer.ggml.scores",
        Value::Array(ValueType::F32, (0..n).map(|_| Value::F32(0.0)).collect()),
    );
    w.set(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
    );
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.set(
        "tokenizer.ggml.eos_token_id",
        Value::U32(id(&tokens, "<|return|>") as u32),
    );
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.set("tokenizer.ggml.add_space_prefix", Value::Bool(false));
    w.set("tokenizer.chat_template", Value::String(real_template()));
    let path = dir.join(if scripted {
        "scripted.gguf"
    } else {
        "random.gguf"
    });
    w.write_file(&path).expect("write the tiny model");
    path
}

/// Makes the next token a function of the current one that follows [`SCRIPT`]: the blocks'
/// contributions are zeroed, each predecessor's embedding is its own unit axis, and the
/// successor's output row reads that axis (every other output row is zero).
fn script_weights(w: &mut octoflow_gguf::GgufWriter<'static>, tokens: &[String], n_embd: usize) {
    let mut chain = vec![id(tokens, "<0x74>")]; // `t`, the generation prompt's last byte
    chain.extend(SCRIPT.iter().map(|s| id(tokens, s)));
    assert!(chain.len() - 1 <= n_embd, "one axis per predecessor");
    for t in w.tensors_mut().iter_mut() {
        assert_eq!(t.ty, GgmlType::F32, "{}", t.name);
        let mut v = vec![0f32; t.data.len() / 4];
        match t.name.as_str() {
            "output_norm.weight" => v.fill(1.0),
            "token_embd.weight" | "output.weight" => {
                for (axis, pair) in chain.windows(2).enumerate() {
                    let (pred, succ) = (pair[0], pair[1]);
                    if t.name == "token_embd.weight" {
                        v[pred * n_embd + axis] = 1.0;
                    } else {
                        v[succ * n_embd + axis] = 10.0;
                    }
                }
            }
            n if n.ends_with("attn_output.weight")
                || n.ends_with("attn_output.bias")
                || n.ends_with("ffn_down_exps.weight")
                || n.ends_with("ffn_down_exps.bias") => {}
            _ => continue,
        }
        t.data = v
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>()
            .into();
    }
}

/// llama.cpp's answers (scripts/check/llama_text.py).
fn llama_cpp(model: &Path, request: &Json) -> Json {
    common::llama_cpp_script("llama_text.py", model, request)
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn tool() -> Json {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "days": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        }, "required": ["city"]},
    }})
}

#[test]
fn tokenizer_special_tokens_and_template_agree_with_llama_cpp() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = tiny_gpt_oss(dir.path(), false);
    let file = octoflow_gguf::GgufFile::open(&path).expect("tiny model opens");
    let tok = octoflow_text::Tokenizer::from_gguf(&file).expect("tokenizer");
    let template = octoflow_text::ChatTemplate::from_gguf(&file).expect("template compiles");
    let texts = [
        "<|start|>assistant<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
        "plain text with <|channel and |> pieces",
        "analysis Thinking Answer",
    ];
    let (vocab, _) = vocabulary();
    let marker_ids: Vec<u32> = MARKERS.iter().map(|m| id(&vocab, m) as u32).collect();
    let word_ids: Vec<u32> = WORDS.iter().map(|w| id(&vocab, w) as u32).collect();
    let sequences = vec![
        marker_ids.clone(),
        [
            marker_ids[3],
            word_ids[0],
            marker_ids[2],
            100,
            101,
            marker_ids[1],
        ]
        .to_vec(),
        word_ids.clone(),
        [1, 2, 0, marker_ids[0]].to_vec(),
    ];
    let user = |c: &str| json!({"role": "user", "content": c});
    let assistant = |c: &str| json!({"role": "assistant", "content": c});
    let conversations = vec![
        json!({"messages": [user("Hi")], "add_generation_prompt": true}),
        json!({"messages": [{"role": "system", "content": "Be brief."}, user("2+2?")],
               "add_generation_prompt": true, "kwargs": {"reasoning_effort": "low"}}),
        json!({"messages": [{"role": "developer", "content": "Answer in French."}, user("Hi"),
                            assistant("Salut"), user("Weather?")],
               "add_generation_prompt": true, "kwargs": {"reasoning_effort": "high", "tools": [tool()]}}),
        json!({"messages": [user("Hi"), assistant("Hello")], "add_generation_prompt": false}),
        json!({"messages": [user("Hi")], "add_generation_prompt": true,
               "kwargs": {"model_identity": "You are a tiny test model.", "builtin_tools": ["python"]}}),
    ];
    let answer = llama_cpp(
        &path,
        &json!({"texts": texts, "ids": sequences, "conversations": conversations, "eog": true}),
    );
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(
            tok.encode(text, false, true),
            ids(&answer["special"][i]),
            "{text}"
        );
        assert_eq!(
            tok.encode(text, true, false),
            ids(&answer["bos_plain"][i]),
            "{text}"
        );
    }
    for (i, seq) in sequences.iter().enumerate() {
        assert_eq!(
            answer["decoded"][i].as_str(),
            Some(tok.decode(seq).as_str()),
            "{seq:?}"
        );
    }
    let eog: Vec<u32> = (0..tok.n_vocab() as u32)
        .filter(|&i| tok.is_eog(i))
        .collect();
    assert_eq!(eog, ids(&answer["eog"]), "end-of-generation ids");
    assert!(eog.contains(&marker_ids[4]) && eog.contains(&marker_ids[5]));
    assert!(
        !eog.contains(&marker_ids[1]),
        "<|end|> ends a message, not the reply"
    );
    for (conv, want) in conversations
        .iter()
        .zip(answer["rendered"].as_array().expect("rendered"))
    {
        let messages: Vec<octoflow_text::Message> = conv["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| {
                octoflow_text::Message::new(
                    m["role"].as_str().expect("role"),
                    m["content"].as_str().expect("content"),
                )
            })
            .collect();
        let vars = conv["kwargs"].as_object().cloned().unwrap_or_default();
        let agp = conv["add_generation_prompt"] == true;
        let got = template
            .render_with(&messages, agp, &vars)
            .expect("renders");
        assert_eq!(Some(got.as_str()), want.as_str(), "{conv}");
    }
}

/// `octoflow ARGS` on the CPU: (stdout, stderr).
fn octoflow(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args(args)
        .output()
        .expect("octoflow runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "octoflow {args:?}: {stderr}");
    (stdout, stderr)
}

/// The prompt's token count from `run`'s report line.
fn prompt_tokens(stderr: &str) -> usize {
    stderr
        .split("prompt: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a report line in {stderr}"))
}

#[test]
fn run_prints_the_final_channel_and_shows_reasoning_when_asked() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = tiny_gpt_oss(dir.path(), true);
    let model = path.to_str().expect("UTF-8 path");
    let base = [
        "run", "-m", model, "--device", "cpu", "-c", "1024", "--temp", "0",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(&["--chat-prompt", "-p", "Hi", "-n", "32"]);
        args.extend_from_slice(extra);
        octoflow(&args)
    };
    let (out, err) = run(&[]);
    assert_eq!(out, "Answer\n");
    assert!(!err.contains("Thinking"), "{err}");
    assert!(err.contains("stop: Eog"), "ends on <|return|>: {err}");
    let (out, err) = run(&["--reasoning"]);
    assert_eq!(out, "Answer\n");
    assert!(err.contains("[reasoning] Thinking\n"), "{err}");
    // The effort reaches the template: `Reasoning: medium` (the default), `low`, `high`, one
    // byte token per letter.
    let medium = prompt_tokens(&err);
    let (_, err) = run(&["--reasoning-effort", "low"]);
    assert_eq!(prompt_tokens(&err), medium - 3);
    let (_, err) = run(&["--reasoning-effort", "high"]);
    assert_eq!(prompt_tokens(&err), medium - 2);
    // Without the chat template the same model's raw text shows every marker it wrote.
    let (out, _) = octoflow(&[&base[..], &["-p", "assistant", "-n", "32"]].concat());
    assert_eq!(
        out,
        "<|channel|>analysis<|message|>Thinking<|end|><|start|>assistant<|channel|>final<|message|>Answer\n"
    );
}

/// A running `octoflow serve`, killed on drop.
struct Served(std::process::Child, String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(model: &str) -> Served {
    use std::io::BufRead;
    let child = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args([
            "serve", "-m", model, "--device", "cpu", "--port", "0", "-c", "1024",
        ])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("octoflow serve starts");
    // Owned by `Served` from here, so a failed start still kills and waits for it.
    let mut served = Served(child, String::new());
    let mut stderr = std::io::BufReader::new(served.0.stderr.take().expect("stderr"));
    let mut line = String::new();
    loop {
        line.clear();
        let n = stderr.read_line(&mut line).expect("stderr line");
        assert!(n > 0, "octoflow serve exited before its banner");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            served.1 = rest.trim().to_string();
            // Keep draining stderr so the server never blocks on a full pipe.
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
            return served;
        }
    }
}

/// POSTs `body` to `path`; returns the response body.
fn post(addr: &str, path: &str, body: &Json) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut response = String::new();
    s.read_to_string(&mut response).expect("read");
    let (head, rest) = response.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{rest}");
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

#[test]
fn serve_splits_content_and_reasoning_whole_and_streamed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = tiny_gpt_oss(dir.path(), true);
    let server = serve(path.to_str().expect("UTF-8 path"));
    let request = json!({
        "messages": [{"role": "user", "content": "Hi"}],
        "temperature": 0,
        "max_tokens": 32,
        "reasoning_effort": "low",
    });
    let body: Json =
        serde_json::from_str(&post(&server.1, "/v1/chat/completions", &request)).expect("JSON");
    let message = &body["choices"][0]["message"];
    assert_eq!(message["content"], "Answer", "{body}");
    assert_eq!(message["reasoning_content"], "Thinking", "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let events = post(&server.1, "/v1/chat/completions", &streamed);
    let (mut content, mut reasoning) = (String::new(), String::new());
    for line in events.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Json = serde_json::from_str(data).expect("chunk JSON");
        let delta = &chunk["choices"][0]["delta"];
        content.push_str(delta["content"].as_str().unwrap_or_default());
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
    }
    assert_eq!(
        (content.as_str(), reasoning.as_str()),
        ("Answer", "Thinking"),
        "{events}"
    );

    // Completions are raw text: the channels' markers stay.
    let body: Json = serde_json::from_str(&post(
        &server.1,
        "/v1/completions",
        &json!({"prompt": "assistant", "temperature": 0, "max_tokens": 32}),
    ))
    .expect("JSON");
    assert_eq!(
        body["choices"][0]["text"],
        "<|channel|>analysis<|message|>Thinking<|end|><|start|>assistant<|channel|>final<|message|>Answer"
    );
}
