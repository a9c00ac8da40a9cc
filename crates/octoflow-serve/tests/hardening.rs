//! What the server does with clients that are not well-behaved API clients: browsers driven by
//! other pages (Host, Content-Type), slow or idle connections, too many connections, fields it
//! does not implement, a full queue; and what an idle server with no queue does.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{start, Shape};
use serde_json::{json, Value};

/// Sends raw bytes on a fresh connection and reads the answer until the server closes it or
/// `wait` passes; returns the answer and whether the server closed the connection.
fn raw(addr: &str, bytes: &[u8], wait: Duration) -> (String, bool) {
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(wait)).expect("timeout");
    c.write_all(bytes).expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match c.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_pages_cannot_drive_a_loopback_server() {
    let Some(s) = start(Shape::default()).await else {
        return;
    };
    let addr = s.base.trim_start_matches("http://").to_string();
    let body = r#"{"prompt": "Hi", "max_tokens": 1}"#;
    // text/plain: what a page can POST cross-origin without a preflight
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .header("content-type", "text/plain")
        .body(body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 415);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "unsupported_media_type", "{v}");
    // a rebound DNS name in Host
    let evil = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: evil.example:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        addr.rsplit(':').next().unwrap_or_default(),
        body.len()
    );
    let a =
        tokio::task::spawn_blocking(move || raw(&addr, evil.as_bytes(), Duration::from_secs(20)))
            .await
            .expect("joined");
    assert_eq!(status_of(&a.0), 403, "{}", a.0);
    assert!(a.0.contains("host_not_allowed"), "{}", a.0);
    // its own name is served
    let (status, v) = s
        .post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}))
        .await;
    assert_eq!(status, 200, "{v}");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_cut_and_connections_are_capped() {
    let Some(s) = start(Shape {
        limits: octoflow_serve::Limits {
            max_connections: 2,
            header_timeout: Duration::from_secs(1),
            body_timeout: Duration::from_secs(1),
        },
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let addr = s.base.trim_start_matches("http://").to_string();
    let a = addr.clone();
    tokio::task::spawn_blocking(move || {
        // headers that never end: closed after the header deadline
        let t = Instant::now();
        let (_, closed) = raw(&a, b"GET /health HTTP/1.1\r\nHost: localhost\r\n", Duration::from_secs(10));
        assert!(closed && t.elapsed() < Duration::from_secs(8), "slow headers kept {:?}", t.elapsed());
        // an idle keep-alive connection after an answer: closed too
        let t = Instant::now();
        let (answer, closed) = raw(&a, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n", Duration::from_secs(10));
        assert_eq!(status_of(&answer), 200, "{answer}");
        assert!(closed && t.elapsed() < Duration::from_secs(8), "idle kept {:?}", t.elapsed());
        // a body that stops arriving: 408
        let (answer, _) = raw(
            &a,
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\"",
            Duration::from_secs(10),
        );
        assert_eq!(status_of(&answer), 408, "{answer}");
        // two idle connections hold the cap: a third is not answered until one closes
        let hold: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&a).expect("connect")).collect();
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let (answer, _) = raw(&a, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", Duration::from_secs(10));
        assert_eq!(status_of(&answer), 200, "{answer}");
        assert!(t.elapsed() >= Duration::from_millis(500), "answered past the cap after {:?}", t.elapsed());
        drop(hold);
    })
    .await
    .expect("joined");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_queue_serves_while_idle_and_429s_say_when_to_retry() {
    let Some(s) = start(Shape {
        instances: 1,
        queue: 0,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    // one long request holds the only instance: the next is refused with Retry-After. The
    // long one streams, so its 200 arrives once it holds the instance (polling beside it raced:
    // a probe holding the instance got the long request refused instead).
    let long = s
        .client
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .expect("sent");
    assert_eq!(long.status(), 200);
    let r = s
        .client
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": "Hi", "max_tokens": 1}))
        .send()
        .await
        .expect("sent");
    let refused = (r.status() == 429).then(|| {
        r.headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap_or_default().to_string())
    });
    assert_eq!(
        refused.flatten().as_deref(),
        Some("1"),
        "a busy server with no queue answers 429 with Retry-After"
    );
    let body = long.text().await.expect("the long stream ends");
    assert!(body.contains("[DONE]"), "{body}");
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_edges_answer_like_openai() {
    let Some(s) = start(Shape {
        max_tokens: 3,
        ..Shape::default()
    })
    .await
    else {
        return;
    };
    // one model by id, and an unknown one
    let v: Value = s
        .client
        .get(s.url(&format!("/v1/models/{}", common::MODEL)))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(v["id"], common::MODEL, "{v}");
    let r = s
        .client
        .get(s.url("/v1/models/gpt-4"))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 404);
    // 405 with a body
    let r = s
        .client
        .delete(s.url("/v1/completions"))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 405);
    let v: Value = r.json().await.expect("json body");
    assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
    // unimplemented fields are refused by name
    let (status, v) = s
        .post(
            "/v1/completions",
            &json!({"prompt": "Hi", "logit_bias": {"1": 5}}),
        )
        .await;
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("logit_bias")),
        "{v}"
    );
    // the server's cap holds with and without max_tokens, and ids differ
    let mut ids = Vec::new();
    for body in [
        json!({"prompt": "Once upon a time", "temperature": 0, "ignore_eos": true}),
        json!({"prompt": "Once upon a time", "temperature": 0, "ignore_eos": true, "max_tokens": 50}),
    ] {
        let (status, v) = s.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 3, "{v}");
        ids.push(v["id"].as_str().unwrap_or_default().to_string());
    }
    assert_ne!(ids[0], ids[1]);
    s.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_port_answers_loading_until_the_model_is_ready() {
    use octoflow_model::{CpuBatch, Model};
    use octoflow_serve::{EngineInfo, ModelInfo, ServeOptions, Server};
    let Some(text) = common::text() else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    let info = ModelInfo {
        id: common::MODEL.into(),
        tokenizer: text.tokenizer.clone(),
        template: Some(text.template.clone()),
        adapters: Vec::new(),
    };
    let path = text.path.clone();
    let starting = tokio::spawn(Server::start(
        addr,
        info,
        ServeOptions::default(),
        move |driver| {
            // a slow load
            std::thread::sleep(Duration::from_millis(1500));
            let model = Model::open(&path)?;
            let mut engine = CpuBatch::new(&model, 1, 64, 16);
            let info = EngineInfo {
                device: "CPU".into(),
                memory: None,
            };
            driver.run(&mut engine, info)
        },
    ));
    let client = reqwest::Client::new();
    let base = format!("http://{addr}");
    let mut loading = None;
    for _ in 0..200 {
        if let Ok(r) = client.get(format!("{base}/health")).send().await {
            loading = Some((r.status().as_u16(), r.json::<Value>().await.expect("JSON")));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = loading.expect("the port answers while the model loads");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "loading", "{body}");
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .expect("answered");
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let server = starting.await.expect("joined").expect("the server starts");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    // the loading answers end with the load; new connections reach the model
    let deadline = Instant::now() + Duration::from_secs(10);
    let ok = loop {
        let r = reqwest::Client::new()
            .get(format!("{base}/health"))
            .send()
            .await;
        if let Ok(r) = r {
            if r.status().as_u16() == 200 {
                break true;
            }
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(ok, "/health became ok after the load");
    let _ = stop.send(());
    running.await.expect("joined").expect("stopped cleanly");
}
