//! `POST /v1/agents/runs` end to end on the CPU batch engine and a real model: a run's outputs
//! are the host interpreter's over an engine of its own while an ordinary completion shares
//! the steps and still gets its own answer; a debate over HTTP; bad requests are 400s in
//! OpenAI's shape; a program that deadlocks fails in-stream; a client that goes away frees its
//! instances. Token counts are small: the CPU reference is slow.

mod common;

use common::{data_lines, start, Running, Shape};
use futures_util::StreamExt;
use octoflow_agents::{Pattern, Run, RunConfig};
use octoflow_model::{CpuBatch, Model};
use octoflow_serve::agents::lines::Lines;
use octoflow_serve::agents::source::Source;
use serde_json::{json, Value};

const PROMPT: &str = "The capital of France is";

/// Posts a run and returns every `data:` payload, `[DONE]` included.
async fn run_stream(s: &Running, body: &Value) -> Vec<String> {
    let r = s
        .client
        .post(s.url("/v1/agents/runs"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let mut bytes = r.bytes_stream();
    let mut buf = String::new();
    while let Some(chunk) = bytes.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    data_lines(&buf)
}

/// The output lines of a stream (not the summary, errors or `[DONE]`).
fn outputs(events: &[String]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).expect("each event is JSON"))
        .filter(|v| v.get("text").is_some())
        .collect()
}

/// What a line says apart from the instance that produced it (which instance takes which task
/// depends on when the run's steps happen; the text does not).
fn key(v: &Value) -> (String, u64, String, u64, String) {
    (
        v["id"].to_string(),
        v["round"].as_u64().unwrap_or(u64::MAX),
        v["text"].as_str().unwrap_or_default().to_string(),
        v["tokens"].as_u64().unwrap_or(u64::MAX),
        v["finish"].to_string(),
    )
}

/// The lines `Run` gives stepped directly over a `CpuBatch` of its own, greedy.
fn reference(
    s: &Running,
    pattern: Pattern,
    tasks: &[&str],
    instances: usize,
    rounds: u32,
    n: u32,
) -> Vec<Value> {
    let tok = &s.text.tokenizer;
    let program = Source::Pattern(pattern).assemble(tok).expect("assembles");
    let model = Model::open(&s.text.path).expect("model");
    let mut engine = CpuBatch::new(&model, instances, 256, 512);
    let config = RunConfig {
        instances,
        max_tokens: n,
        rounds,
        temperature: 0.0,
        eog: octoflow_generate::device_eog(tok, false),
        chunk: 512,
        device_sampling: true,
        ..RunConfig::default()
    };
    let prompts = tasks.iter().map(|t| s.prompt(t)).collect();
    let mut run = Run::new(program, config, prompts, &engine).expect("starts");
    let mut lines = Lines::new((0..tasks.len()).map(|i| json!(format!("t{i}"))).collect());
    let mut out = Vec::new();
    while !run.finished() {
        run.step(&mut engine).expect("steps");
        out.extend(run.events().into_iter().map(|e| lines.line(e, tok)));
    }
    out
}

fn sorted(lines: &[Value]) -> Vec<(String, u64, String, u64, String)> {
    let mut k: Vec<_> = lines.iter().map(key).collect();
    k.sort();
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_run_answers_as_run_does_while_a_completion_shares_the_steps() {
    let Some(s) = start(Shape::default()).await else {
        return;
    };
    let tasks = ["One, two, three,", "def add(a, b):", PROMPT];
    let want = reference(&s, Pattern::Queue, &tasks, 2, 1, 5);
    let want_completion = s.reference(&s.prompt(PROMPT), 6);
    let body = json!({
        "pattern": "queue",
        "tasks": tasks.iter().enumerate().map(|(i, p)| json!({"id": format!("t{i}"), "prompt": p})).collect::<Vec<_>>(),
        "instances": 2,
        "max_tokens": 5,
        "temperature": 0,
    });
    let completion = json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0});
    let steps0 = s.metric("octoflow_steps_total").await;
    let (events, (status, v)) = tokio::join!(
        run_stream(&s, &body),
        s.post("/v1/completions", &completion)
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], want_completion.as_str(), "{v}");
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let got = outputs(&events);
    assert_eq!(got.len(), tasks.len(), "{events:?}");
    assert_eq!(sorted(&got), sorted(&want), "{events:?}");
    for line in &got {
        assert!(line["instance"].as_u64().is_some_and(|i| i < 2), "{line}");
        // device-sampled spans carry the sampler's mean log-probability
        assert!(
            line["score"]
                .as_f64()
                .is_some_and(|v| v.is_finite() && v <= 0.0),
            "a span's score is a mean log-probability: {line}"
        );
    }
    let summary: Value = serde_json::from_str(&events[events.len() - 2]).expect("summary");
    assert_eq!(summary["summary"]["outputs"], 3, "{summary}");
    assert_eq!(summary["summary"]["errors"], 0, "{summary}");
    assert!(
        summary["summary"]["steps"].as_u64().is_some_and(|n| n >= 5),
        "{summary}"
    );
    assert!(
        summary["summary"]["tokens_generated"]
            .as_u64()
            .is_some_and(|n| n >= 3),
        "{summary}"
    );
    // Both ran in the same server's steps (fewer than the two would take one after the other
    // is not asserted: the CPU engine's timing decides how they overlap).
    assert!(s.metric("octoflow_steps_total").await > steps0);
    assert!(s.wait_metric("octoflow_active_instances", 0.0, 20).await);
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debate_over_http_runs_every_round() {
    let Some(s) = start(Shape::default()).await else {
        return;
    };
    let question = "Is 17 prime? Answer in one word.";
    // The reference renders the conversation as the server does.
    let rendered = s
        .text
        .template
        .render(&[octoflow_text::Message::user(question)], true)
        .expect("renders");
    let want = reference(&s, Pattern::Debate, &[&rendered], 2, 2, 4);
    let body = json!({
        "pattern": "debate",
        "tasks": [{"id": "t0", "messages": [{"role": "user", "content": question}]}],
        "instances": 2,
        "rounds": 2,
        "max_tokens": 4,
        "temperature": 0,
        "seed": 5,
    });
    let events = run_stream(&s, &body).await;
    let got = outputs(&events);
    assert_eq!(got.len(), 4, "two instances, two rounds: {events:?}");
    let rounds: Vec<u64> = got.iter().filter_map(|l| l["round"].as_u64()).collect();
    assert_eq!(rounds.iter().filter(|&&r| r == 1).count(), 2, "{rounds:?}");
    assert_eq!(sorted(&got), sorted(&want), "{events:?}");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_runs_are_400s_naming_what_is_wrong_and_deadlocks_fail_in_stream() {
    let Some(s) = start(Shape::default()).await else {
        return;
    };
    let task = json!([{"prompt": PROMPT}]);
    for (body, param, needle) in [
        (
            json!({"program": "    halt\n    bogus r1\n", "tasks": task}),
            "program",
            "line 2",
        ),
        (
            json!({"pattern": "committee", "tasks": task}),
            "pattern",
            "unknown pattern `committee`",
        ),
        (
            json!({"pattern": "queue", "tasks": task, "instances": 5}),
            "instances",
            "between 1 and 4",
        ),
        (
            json!({"pattern": "queue", "program": "halt", "tasks": task}),
            "program",
            "not both",
        ),
        (json!({"tasks": task}), "pattern", "give `pattern`"),
        (
            json!({"pattern": "queue", "tasks": []}),
            "tasks",
            "at least one",
        ),
        (
            json!({"pattern": "queue", "tasks": [{"prompt": "a"}, {"id": 1}]}),
            "tasks",
            "tasks[1]",
        ),
        (
            json!({"pattern": "queue", "tasks": task, "temperature": 9}),
            "temperature",
            "temperature",
        ),
        (
            json!({"pattern": "queue", "tasks": task, "rounds": 0}),
            "rounds",
            "rounds",
        ),
    ] {
        let (status, v) = s.post("/v1/agents/runs", &body).await;
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    for raw in [
        &br#"{"pattern": "queue", "tasks": [{"prompt": "a"}], "instance": 2}"#[..],
        b"{not json",
        br#"{"pattern": "queue"}"#,
    ] {
        let (status, v) = s.post_raw("/v1/agents/runs", raw.to_vec()).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    let (_, v) = s
        .post_raw(
            "/v1/agents/runs",
            br#"{"pattern": "queue", "tasks": [{"prompt": "a"}], "instance": 2}"#.to_vec(),
        )
        .await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("unknown field `instance`"),
        "{v}"
    );
    // A program that waits for a message nobody sends: the run starts, then fails in-stream.
    let deadlock = ".mailbox box 1\n    wait box, 1\n    halt\n";
    let events = run_stream(
        &s,
        &json!({"program": deadlock, "tasks": task, "instances": 2}),
    )
    .await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&events[events.len() - 2]).expect("error event");
    assert_eq!(err["error"]["code"], "deadlock", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("mailbox `box`"),
        "{err}"
    );
    // The server serves on, its instances free.
    assert!(s.wait_metric("octoflow_active_instances", 0.0, 20).await);
    let (status, _) = s
        .post(
            "/v1/completions",
            &json!({"prompt": PROMPT, "max_tokens": 1, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200);
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_its_run_and_frees_the_instances() {
    let Some(s) = start(Shape {
        instances: 2,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    // Generates until the context is full, again and again: only a cancel ends it soon.
    let endless = ".const c \"Once upon a time\"\nloop:\n    append.const c\n    gen %max, -\n    emit 0\n    jmp loop\n";
    let body = json!({"program": endless, "tasks": [{"prompt": "x"}], "instances": 2,
                      "max_tokens": 200, "temperature": 0});
    let r = s
        .client
        .post(s.url("/v1/agents/runs"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    assert!(
        s.wait_metric("octoflow_active_instances", 2.0, 20).await,
        "the run holds both instances"
    );
    drop(r);
    assert!(
        s.wait_metric("octoflow_active_instances", 0.0, 20).await,
        "the instances were not freed"
    );
    assert_eq!(s.metric("octoflow_requests_cancelled_total").await, 1.0);
    // A later run gets both instances.
    let events = run_stream(
        &s,
        &json!({"pattern": "queue", "tasks": [{"prompt": PROMPT}], "instances": 2,
                "max_tokens": 2, "temperature": 0}),
    )
    .await;
    assert_eq!(outputs(&events).len(), 1, "{events:?}");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_gpu_engine_a_run_and_completions_sharing_steps_get_what_each_gets_alone() {
    if octoflow_vk::testing::gpu_or_skip("serve_agents_gpu").is_none() {
        return;
    }
    let Some(s) = start(Shape {
        instances: 4,
        max_rows: 64,
        gpu: true,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let run = json!({
        "pattern": "queue",
        "tasks": [{"id": "a", "prompt": "One, two, three,"}, {"id": "b", "prompt": PROMPT},
                  {"id": "c", "prompt": "def add(a, b):"}],
        "instances": 2,
        "max_tokens": 6,
        "temperature": 0,
    });
    let completion = json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0});
    // Each alone first: the same engine, nothing beside it.
    let alone = outputs(&run_stream(&s, &run).await);
    assert_eq!(alone.len(), 3, "{alone:?}");
    let (status, v) = s.post("/v1/completions", &completion).await;
    assert_eq!(status, 200, "{v}");
    let want = v["choices"][0]["text"].clone();
    // Together: the run's device-sampled rows and the completions' rows in the same steps.
    let (events, a, b) = tokio::join!(
        run_stream(&s, &run),
        s.post("/v1/completions", &completion),
        s.post("/v1/completions", &completion)
    );
    for (status, v) in [a, b] {
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], want, "{v}");
    }
    assert_eq!(sorted(&outputs(&events)), sorted(&alone), "{events:?}");
    s.stop().await.expect("clean stop");
}
