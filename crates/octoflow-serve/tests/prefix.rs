//! Prompt reuse: requests whose prompt starts with what an instance's cache holds (a shared
//! system prompt, a chat's earlier turns) prefill only the rest, and answer exactly what a
//! server that runs every prompt whole answers (greedy), on the CPU engine and the GPU one.

mod common;

use common::{start, Shape};
use serde_json::{json, Value};

const SYSTEM: &str = "You are a terse assistant. Answer every question in one short sentence, \
                      without greetings, lists or explanations, and never ask a question back.";

/// The conversation: two questions under one system prompt, then a second turn of the first.
async fn converse(s: &common::Running) -> Vec<String> {
    let ask = |messages: Value| json!({"messages": messages, "max_tokens": 8, "temperature": 0});
    let mut answers = Vec::new();
    let q1 = json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France?"}]);
    let q2 = json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What color is the sky?"}]);
    for messages in [q1.clone(), q2] {
        let (status, v) = s.post("/v1/chat/completions", &ask(messages)).await;
        assert_eq!(status, 200, "{v}");
        answers.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    let mut turn2 = q1.as_array().cloned().unwrap_or_default();
    turn2.push(json!({"role": "assistant", "content": answers[0]}));
    turn2.push(json!({"role": "user", "content": "And of Italy?"}));
    let (status, v) = s
        .post("/v1/chat/completions", &ask(Value::Array(turn2)))
        .await;
    assert_eq!(status, 200, "{v}");
    answers.push(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    );
    answers
}

async fn reuse_matches_whole_prompts(gpu: bool) {
    let shape = Shape {
        instances: 2,
        n_ctx: 512,
        max_rows: 64,
        gpu,
        ..Shape::default()
    };
    let Some(whole) = start(Shape {
        prefix_cache: false,
        ..shape
    })
    .await
    else {
        return;
    };
    let want = converse(&whole).await;
    assert_eq!(whole.metric("octoflow_prefix_cache_hits_total").await, 0.0);
    whole.stop().await.expect("clean stop");

    let Some(s) = start(shape).await else {
        return;
    };
    let got = converse(&s).await;
    assert_eq!(
        got, want,
        "answers with prompt reuse differ from whole prompts"
    );
    // the second question reuses the system prompt, the second turn the whole first exchange
    let hits = s.metric("octoflow_prefix_cache_hits_total").await;
    let cached = s.metric("octoflow_prefix_cache_tokens_total").await;
    let system_tokens = s.text.tokenizer.encode(SYSTEM, false, false).len() as f64;
    assert!(hits >= 2.0, "hits {hits}");
    assert!(
        cached >= 2.0 * system_tokens,
        "cached {cached}, system prompt {system_tokens} tokens"
    );
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_engine_reuses_prompts_and_answers_the_same() {
    reuse_matches_whole_prompts(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_engine_reuses_prompts_and_answers_the_same() {
    reuse_matches_whole_prompts(true).await;
}

/// A KV pool of one context shared by four instances: requests that fit together run
/// together, the others wait for memory and then answer as a server with room to spare does;
/// a request the pool could never hold is refused (400 `kv_cache_exceeded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_kv_pool_makes_requests_wait_and_refuses_what_never_fits() {
    let shape = Shape {
        instances: 4,
        n_ctx: 256,
        max_rows: 64,
        gpu: true,
        ..Shape::default()
    };
    let Some(roomy) = start(shape).await else {
        return;
    };
    let want = four_answers(&roomy).await;
    roomy.stop().await.expect("clean stop");

    let Some(s) = start(Shape {
        kv_positions: Some(256),
        ..shape
    })
    .await
    else {
        return;
    };
    assert_eq!(
        four_answers(&s).await,
        want,
        "a small pool changed the answers"
    );
    // the pool's size gauge: one context of positions
    assert_eq!(s.metric("octoflow_kv_cache_positions").await, 256.0);
    // two choices of a whole context each: more than the pool holds
    let (status, v) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 250}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "kv_cache_exceeded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("--kv-size"),
        "{v}"
    );
    s.stop().await.expect("clean stop");
}

/// Four questions under the system prompt at once, each with room for 100 tokens: their
/// answers in order.
async fn four_answers(s: &common::Running) -> Vec<String> {
    let questions = [
        "What is the capital of France?",
        "What color is the sky?",
        "Name a large animal.",
        "What is two plus two?",
    ];
    let reqs = questions.iter().map(|q| {
        let body = json!({
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            "max_tokens": 100,
            "temperature": 0,
        });
        async move { s.post("/v1/chat/completions", &body).await }
    });
    let mut out = Vec::new();
    for (status, v) in futures_util::future::join_all(reqs).await {
        assert_eq!(status, 200, "{v}");
        out.push(
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    out
}
