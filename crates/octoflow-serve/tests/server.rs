//! The server end to end on the CPU batch engine and a real model: OpenAI's request and response
//! shapes, greedy outputs equal to one CPU session alone, concurrency, bad input, disconnects,
//! the bounded queue, shutdown. Token counts are small: the CPU reference is slow.

mod common;

use std::time::Duration;

use common::{start, streamed_text, Shape, ADAPTER, MODEL};
use futures_util::StreamExt;
use serde_json::{json, Value};

const PROMPT: &str = "The capital of France is";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_match_a_single_session_streamed_or_not() {
    let Some(s) = start(Shape::default()).await else {
        return;
    };
    let want = s.reference(&s.prompt(PROMPT), 6);
    let body = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0});
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want.as_str(), "{v}");
    let n_prompt = s.prompt(PROMPT).len();
    assert_eq!(v["usage"]["prompt_tokens"], n_prompt);
    assert_eq!(v["usage"]["total_tokens"], n_prompt + 6);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let mut body = body;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = s.stream("/v1/completions", &body).await;
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(streamed_text(&chunks), want);
    let usage: Value = serde_json::from_str(&chunks[chunks.len() - 2]).expect("usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 6, "{usage}");
    assert_eq!(usage["choices"], json!([]));
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_renders_the_template_streamed_or_not() {
    let Some(s) = start(Shape::default()).await else {
        return;
    };
    let user = "What is the capital of France?";
    let want = s.reference(&s.chat_prompt(user), 5);
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": 5,
        "temperature": 0,
    });
    let (status, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());

    let mut body = body;
    body["stream"] = json!(true);
    let chunks = s.stream("/v1/chat/completions", &body).await;
    let first: Value = serde_json::from_str(&chunks[0]).expect("json");
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed_text(&chunks), want);
    let last: Value = serde_json::from_str(&chunks[chunks.len() - 2]).expect("json");
    assert!(last["choices"][0]["finish_reason"].is_string(), "{last}");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_prefill_in_chunks_beside_decode_rows() {
    let Some(s) = start(Shape {
        max_rows: 4,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let prompt = "The quick brown fox jumps over the lazy dog because";
    let ids = s.prompt(prompt);
    assert!(ids.len() > 8, "the prompt spans several 4-row steps");
    let want = s.reference_chunked(&ids, 3, 4);
    let body = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0});
    let (status, v) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], want.as_str());
    // Two at once: one decodes while the other's prompt goes in, 4 rows a step.
    let steps0 = s.metric("octoflow_steps_total").await;
    let other = json!({"prompt": PROMPT, "max_tokens": 3, "temperature": 0});
    let (a, b) = tokio::join!(
        s.post("/v1/completions", &body),
        s.post("/v1/completions", &other)
    );
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    assert_eq!(a.1["usage"]["completion_tokens"], 3);
    assert_eq!(b.1["usage"]["completion_tokens"], 3);
    let rows = s.metric("octoflow_step_rows_total").await;
    let steps = s.metric("octoflow_steps_total").await - steps0;
    assert!(steps >= 4.0 && rows > 0.0, "{steps} steps");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_clients_get_their_own_outputs() {
    let Some(s) = start(Shape {
        instances: 8,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let prompts = [
        "The capital of France is",
        "One, two, three,",
        "def fibonacci(n):",
        "The color of the sky is",
    ];
    let wants: Vec<String> = prompts
        .iter()
        .map(|p| s.reference(&s.prompt(p), 4))
        .collect();
    let t0 = std::time::Instant::now();
    let requests = (0..32).map(|i| {
        let body = json!({"prompt": prompts[i % 4], "max_tokens": 4, "temperature": 0});
        let s = &s;
        async move { (i, s.post("/v1/completions", &body).await) }
    });
    let results = futures_util::future::join_all(requests).await;
    for (i, (status, v)) in results {
        assert_eq!(status, 200, "client {i}: {v}");
        assert_eq!(v["choices"][0]["text"], wants[i % 4].as_str(), "client {i}");
    }
    eprintln!("32 clients x 4 tokens: {:.1} s", t0.elapsed().as_secs_f64());
    assert!(s.metric("octoflow_requests_total").await >= 32.0);
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_gpu_engine_32_concurrent_clients_get_what_each_gets_alone() {
    if octoflow_vk::testing::gpu_or_skip("serve_gpu_32_clients").is_none() {
        return;
    }
    let Some(s) = start(Shape {
        instances: 8,
        max_rows: 64,
        gpu: true,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let prompts = [
        "The capital of France is",
        "One, two, three,",
        "def fibonacci(n):",
        "The color of the sky is",
    ];
    let body = |p: &str| json!({"prompt": p, "max_tokens": 4, "temperature": 0});
    // each prompt alone first: the same engine, one sequence at a time
    let mut wants = Vec::new();
    for p in prompts {
        let (status, v) = s.post("/v1/completions", &body(p)).await;
        assert_eq!(status, 200, "{v}");
        wants.push(
            v["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let t0 = std::time::Instant::now();
    let requests = (0..32).map(|i| {
        let b = body(prompts[i % 4]);
        let s = &s;
        async move { (i, s.post("/v1/completions", &b).await) }
    });
    let results = futures_util::future::join_all(requests).await;
    for (i, (status, v)) in results {
        assert_eq!(status, 200, "client {i}: {v}");
        assert_eq!(v["choices"][0]["text"], wants[i % 4].as_str(), "client {i}");
    }
    eprintln!(
        "GPU engine: 32 clients x 4 tokens: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn base_and_adapter_requests_share_batches_and_each_gets_what_it_gets_alone() {
    if octoflow_vk::testing::gpu_or_skip("serve_lora").is_none() {
        return;
    }
    let Some(s) = start(Shape {
        instances: 4,
        max_rows: 64,
        gpu: true,
        adapter: true,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let r = s
        .client
        .get(s.url("/v1/models"))
        .send()
        .await
        .expect("models");
    let v: Value = r.json().await.expect("models JSON");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [MODEL, ADAPTER], "{v}");
    let prompts = ["The capital of France is", "One, two, three,"];
    let body =
        |p: &str, m: &str| json!({"prompt": p, "max_tokens": 6, "temperature": 0, "model": m});
    let cases: Vec<(&str, &str)> = prompts
        .iter()
        .flat_map(|&p| [(p, MODEL), (p, ADAPTER)])
        .collect();
    // each alone first
    let mut wants = Vec::new();
    for &(p, m) in &cases {
        let (status, v) = s.post("/v1/completions", &body(p, m)).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["model"], m, "{v}");
        wants.push(
            v["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    assert!(
        wants[0] != wants[1] || wants[2] != wants[3],
        "the adapter changes nothing: {wants:?}"
    );
    // then all at once, twice over: base and adapter rows share the batched steps
    let requests = (0..2 * cases.len()).map(|i| {
        let (p, m) = cases[i % cases.len()];
        let b = body(p, m);
        let s = &s;
        async move { (i, s.post("/v1/completions", &b).await) }
    });
    for (i, (status, v)) in futures_util::future::join_all(requests).await {
        assert_eq!(status, 200, "client {i}: {v}");
        let want = wants[i % cases.len()].as_str();
        assert_eq!(
            v["choices"][0]["text"],
            want,
            "client {i} ({:?})",
            cases[i % cases.len()]
        );
    }
    // an unknown model is a 404 in OpenAI's shape
    let (status, v) = s.post("/v1/completions", &body("x", "nope")).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let Some(s) = start(Shape {
        n_ctx: 64,
        body_limit: 64 << 10,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let check = |(status, v): (u16, Value), want: u16, code: Option<&str>| {
        assert_eq!(status, want, "{v}");
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        if let Some(code) = code {
            assert_eq!(e["code"], code, "{v}");
        }
    };
    let chat = "/v1/chat/completions";
    let cmpl = "/v1/completions";
    check(
        s.post_raw(chat, b"{\"messages\": [".to_vec()).await,
        400,
        None,
    );
    check(s.post_raw(cmpl, b"not json".to_vec()).await, 400, None);
    check(s.post(chat, &json!({"messages": 3})).await, 400, None);
    check(s.post(cmpl, &json!({"max_tokens": 3})).await, 400, None);
    check(
        s.post(cmpl, &json!({"model": "gpt-4", "prompt": "hi"}))
            .await,
        404,
        Some("model_not_found"),
    );
    let long = "word ".repeat(200);
    check(
        s.post(cmpl, &json!({"prompt": long})).await,
        400,
        Some("context_length_exceeded"),
    );
    check(
        s.post(
            chat,
            &json!({"messages": [{"role": "user", "content": long}]}),
        )
        .await,
        400,
        Some("context_length_exceeded"),
    );
    let huge = format!("{{\"prompt\": \"{}\"}}", "a".repeat(100 << 10));
    check(s.post_raw(cmpl, huge.into_bytes()).await, 413, None);
    for bad in [
        json!({"prompt": "hi", "temperature": 5}),
        json!({"prompt": "hi", "top_p": 2}),
        json!({"prompt": "hi", "n": 0}),
        json!({"prompt": "hi", "n": 99}),
        json!({"prompt": "hi", "max_tokens": -1}),
        json!({"prompt": "hi", "logprobs": 50}),
        json!({"prompt": "hi", "frequency_penalty": 3}),
        json!({"prompt": [999999]}),
    ] {
        let (status, v) = s.post(cmpl, &bad).await;
        assert_eq!(status, 400, "{bad} -> {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    check(s.post(chat, &json!({"messages": []})).await, 400, None);
    check(
        s.post("/v1/nothing", &json!({})).await,
        404,
        Some("not_found"),
    );
    let r = s
        .client
        .get(s.url("/v1/completions"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 405);

    // Still serving.
    let (status, v) = s
        .post(
            cmpl,
            &json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(s.metric("octoflow_requests_refused_total").await >= 10.0);
    assert_eq!(s.metric("octoflow_requests_failed_total").await, 0.0);
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_context_shift_a_long_prompt_keeps_its_start_and_newest_tokens() {
    let shape = Shape {
        n_ctx: 64,
        context_shift: Some(1),
        ..Default::default()
    };
    let Some(s) = start(shape).await else {
        return;
    };
    let long = "word ".repeat(200) + "The capital of France is";
    let ids = s.text.tokenizer.encode(&long, true, true);
    assert!(ids.len() > 64);
    // what the server should have kept: the first token and the newest, half the context free
    let kept = octoflow_generate::ContextShift::new(1).fit(&ids, 64, 32);
    assert!(kept.len() <= 32 && kept[0] == ids[0] && ids.ends_with(&kept[1..]));
    let ask = |prompt: Value| json!({"prompt": prompt, "max_tokens": 8, "temperature": 0});
    let (status, shifted) = s.post("/v1/completions", &ask(json!(long))).await;
    assert_eq!(status, 200, "{shifted}");
    let (status, direct) = s.post("/v1/completions", &ask(json!(kept))).await;
    assert_eq!(status, 200, "{direct}");
    assert_eq!(shifted["usage"]["prompt_tokens"], kept.len(), "{shifted}");
    assert_eq!(
        shifted["choices"][0]["text"], direct["choices"][0]["text"],
        "the shifted prompt answers as its kept tokens sent whole"
    );
    let (status, chat) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, 200, "{chat}");
    assert_eq!(s.metric("octoflow_prompts_shifted_total").await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_its_instance() {
    let Some(s) = start(Shape {
        instances: 1,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let body = json!({"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": true,
                      "ignore_eos": true});
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    let mut bytes = r.bytes_stream();
    let first = bytes.next().await.expect("a chunk").expect("bytes");
    assert!(String::from_utf8_lossy(&first).contains("data:"));
    assert_eq!(s.metric("octoflow_active_instances").await, 1.0);
    drop(bytes);
    assert!(
        s.wait_metric("octoflow_active_instances", 0.0, 20).await,
        "the instance was not freed"
    );
    assert_eq!(s.metric("octoflow_requests_cancelled_total").await, 1.0);
    let generated = s.metric("octoflow_generation_tokens_total").await;
    assert!(generated < 150.0, "generation went on: {generated} tokens");
    // The freed instance serves the next request.
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429() {
    let Some(s) = start(Shape {
        instances: 1,
        queue: 1,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    // A holds the only instance, B waits in the queue, C is refused.
    let long = json!({"prompt": PROMPT, "max_tokens": 200, "stream": true, "ignore_eos": true});
    let a = s
        .client
        .post(s.url("/v1/completions"))
        .json(&long)
        .send()
        .await
        .expect("A sent");
    assert!(s.wait_metric("octoflow_active_instances", 1.0, 20).await);
    let b_body = json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0});
    let b = {
        let client = s.client.clone();
        let url = s.url("/v1/completions");
        tokio::spawn(async move { client.post(url).json(&b_body).send().await })
    };
    assert!(s.wait_metric("octoflow_queue_depth", 1.0, 20).await);
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    drop(a);
    let b = b.await.expect("B task").expect("B answered");
    assert_eq!(b.status(), 200);
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_penalties_choices_and_stop_strings() {
    let Some(s) = start(Shape::default()).await else {
        return;
    };
    let want = s.reference(&s.prompt(PROMPT), 4);
    // Log-probabilities (sampled on the CPU from logits): greedy picks the top alternative.
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                    "temperature": 0, "logprobs": true, "top_logprobs": 3}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs");
    assert_eq!(content.len(), 3, "{v}");
    for t in content {
        let top = t["top_logprobs"].as_array().expect("top");
        assert_eq!(top.len(), 3);
        assert_eq!(t["logprob"], top[0]["logprob"], "{t}");
        assert!(t["logprob"].as_f64().is_some_and(|l| l <= 0.0));
    }
    // Completions' logprobs shape.
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "logprobs": 2}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(lp["top_logprobs"][0].as_object().map(|o| o.len()), Some(2));
    // n = 2 greedy choices are equal; a zero penalty (CPU path) changes nothing.
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "n": 2,
                    "presence_penalty": 0.0, "frequency_penalty": 0.0}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], want.as_str());
    assert_eq!(v["choices"][1]["text"], want.as_str());
    assert_eq!(v["usage"]["completion_tokens"], 8);
    // A stop string cuts the text before it.
    let cut = want
        .char_indices()
        .nth(want.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let stop = want[cut..].chars().take(2).collect::<String>();
    if !stop.trim().is_empty() {
        let (status, v) = s
            .post(
                "/v1/completions",
                &json!({"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stop": [stop]}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        let text = v["choices"][0]["text"].as_str().expect("text");
        assert!(
            want.starts_with(text) && !text.contains(&stop),
            "{text:?} / {want:?}"
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    // A seed makes sampling reproducible.
    let seeded = json!({"prompt": PROMPT, "max_tokens": 4, "temperature": 1.0, "seed": 7});
    let (_, a) = s.post("/v1/completions", &seeded).await;
    let (_, b) = s.post("/v1/completions", &seeded).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_tokenize_detokenize() {
    let Some(s) = start(Shape::default()).await else {
        return;
    };
    let v: Value = s
        .client
        .get(s.url("/v1/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(v["data"][0]["id"], MODEL);
    let h = s.client.get(s.url("/health")).send().await.expect("health");
    assert_eq!(h.status(), 200);
    let (status, v) = s
        .post("/tokenize", &json!({"content": "Hello world"}))
        .await;
    assert_eq!(status, 200);
    let tokens = v["tokens"].clone();
    assert!(tokens.as_array().is_some_and(|t| !t.is_empty()));
    let (status, v) = s.post("/detokenize", &json!({"tokens": tokens})).await;
    assert_eq!(status, 200);
    assert_eq!(v["content"], "Hello world");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_running_requests_after_the_grace_period() {
    let Some(mut s) = start(Shape {
        instances: 1,
        grace: Duration::from_millis(200),
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let body = json!({"prompt": PROMPT, "max_tokens": 200, "stream": true, "ignore_eos": true});
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert!(s.wait_metric("octoflow_active_instances", 1.0, 20).await);
    let task = s.begin_stop().expect("running");
    let text = tokio::time::timeout(Duration::from_secs(20), r.text())
        .await
        .expect("the stream ends")
        .expect("body");
    let lines = common::data_lines(&text);
    assert_eq!(lines.last().map(String::as_str), Some("[DONE]"), "{text}");
    assert!(text.contains("shut"), "{text}");
    tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the server stops")
        .expect("task")
        .expect("clean stop");
}
