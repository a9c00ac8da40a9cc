//! `resolve_model` / `pull_url` for plain HTTP URLs, against a scripted server on 127.0.0.1.

mod common;

use std::fs;
use std::path::Path;

use common::{body, sha_hex, Mode, Request, Server};
use octoflow_hub::{parse_sha256, pull_url, resolve_model, Cache, HubError, PullOptions};

const SIZE: usize = 300_000;

fn opts(dir: &Path) -> PullOptions {
    PullOptions::with_cache(Cache::new(dir))
}

/// Where `url`'s file is cached.
fn dest(dir: &Path, url: &str) -> std::path::PathBuf {
    Cache::new(dir).url_model_path(url).unwrap()
}

fn partial(dir: &Path, url: &str) -> std::path::PathBuf {
    let d = dest(dir, url);
    d.with_file_name(format!(
        "{}.partial",
        d.file_name().unwrap().to_string_lossy()
    ))
}

fn write_partial(dir: &Path, url: &str, data: &[u8]) {
    let p = partial(dir, url);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

#[test]
fn full_download_lands_under_the_url_file_name() {
    let server = Server::start();
    let data = body(SIZE, 1);
    server.serve("/repo/resolve/main/m.gguf", data.clone(), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/repo/resolve/main/m.gguf?download=true");
    let path = resolve_model(&url, &opts(dir.path())).unwrap();
    assert_eq!(path, dest(dir.path(), &url));
    assert!(path.ends_with("m.gguf"), "{}", path.display());
    assert_eq!(fs::read(&path).unwrap(), data);
    assert!(!partial(dir.path(), &url).exists());
    assert_eq!(
        server.requests(),
        [Request {
            path: "/repo/resolve/main/m.gguf?download=true".into(),
            range: None
        }]
    );
}

#[test]
fn partial_download_is_resumed_with_a_range_request() {
    let server = Server::start();
    let data = body(SIZE, 2);
    server.serve("/m.gguf", data.clone(), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/m.gguf");
    write_partial(dir.path(), &url, &data[..123_456]);
    let path = pull_url(&url, &opts(dir.path())).unwrap();
    assert_eq!(fs::read(&path).unwrap(), data);
    assert_eq!(server.requests()[0].range.as_deref(), Some("bytes=123456-"));
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn server_ignoring_range_restarts_the_download_cleanly() {
    let server = Server::start();
    let data = body(SIZE, 3);
    server.serve("/m.gguf", data.clone(), Mode::IgnoreRange);
    let dir = tempfile::tempdir().unwrap();
    // Not a prefix of the body: appending the 200 answer to it would corrupt the file.
    let url = server.url("/m.gguf");
    write_partial(dir.path(), &url, &[0xAA; 5000]);
    let path = pull_url(&url, &opts(dir.path())).unwrap();
    assert_eq!(fs::read(&path).unwrap(), data);
    assert_eq!(server.requests()[0].range.as_deref(), Some("bytes=5000-"));
}

#[test]
fn complete_partial_file_is_placed_after_a_416_answer() {
    let server = Server::start();
    let data = body(SIZE, 4);
    server.serve("/m.gguf", data.clone(), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/m.gguf");
    write_partial(dir.path(), &url, &data);
    let path = pull_url(&url, &opts(dir.path())).unwrap();
    assert_eq!(fs::read(&path).unwrap(), data);
    assert_eq!(
        server.requests()[0].range.as_deref(),
        Some(&*format!("bytes={SIZE}-"))
    );
}

#[test]
fn sha_mismatch_is_an_error_and_leaves_no_file() {
    let server = Server::start();
    let data = body(SIZE, 5);
    server.serve("/m.gguf", data.clone(), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let wrong = "0".repeat(64);
    let options = PullOptions {
        sha256: Some(wrong.clone()),
        ..opts(dir.path())
    };
    let err = pull_url(&server.url("/m.gguf"), &options).unwrap_err();
    match &err {
        HubError::ShaMismatch {
            expected,
            found,
            deleted,
            ..
        } => {
            assert_eq!((expected, found, deleted), (&wrong, &sha_hex(&data), &true));
        }
        other => panic!("expected a sha mismatch, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("expected {wrong}, found {}", sha_hex(&data))),
        "{msg}"
    );
    let url = server.url("/m.gguf");
    assert!(!dest(dir.path(), &url).exists());
    assert!(!partial(dir.path(), &url).exists());
}

#[test]
fn matching_sha_is_accepted_in_any_case() {
    let server = Server::start();
    let data = body(SIZE, 6);
    server.serve("/m.gguf", data.clone(), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let sha = parse_sha256(&sha_hex(&data).to_uppercase()).unwrap();
    let options = PullOptions {
        sha256: Some(sha),
        ..opts(dir.path())
    };
    let path = pull_url(&server.url("/m.gguf"), &options).unwrap();
    assert_eq!(fs::read(path).unwrap(), data);
}

#[test]
fn http_404_is_a_clear_error_naming_the_url() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/missing.gguf");
    let err = pull_url(&url, &opts(dir.path())).unwrap_err();
    assert!(
        matches!(err, HubError::HttpStatus { status: 404, .. }),
        "{err:?}"
    );
    assert_eq!(err.to_string(), format!("GET {url}: HTTP 404 Not Found"));
    assert!(!dest(dir.path(), &url).exists());
}

#[test]
fn interrupted_download_leaves_no_final_file_and_the_next_run_resumes() {
    let server = Server::start();
    let data = body(SIZE, 7);
    server.serve("/m.gguf", data.clone(), Mode::CutAfter(100_000));
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/m.gguf");
    let err = pull_url(&url, &opts(dir.path())).unwrap_err();
    match err {
        HubError::Truncated {
            expected, received, ..
        } => assert_eq!((expected, received), (SIZE as u64, 100_000)),
        other => panic!("expected a truncated download, got {other:?}"),
    }
    assert!(!dest(dir.path(), &url).exists());
    assert_eq!(
        fs::metadata(partial(dir.path(), &url)).unwrap().len(),
        100_000
    );

    server.set_mode("/m.gguf", Mode::HonourRange);
    let path = pull_url(&url, &opts(dir.path())).unwrap();
    assert_eq!(fs::read(path).unwrap(), data);
    assert_eq!(server.requests()[1].range.as_deref(), Some("bytes=100000-"));
}

#[test]
fn cached_url_is_not_fetched_again_unless_forced() {
    let server = Server::start();
    server.serve("/m.gguf", body(1000, 8), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/m.gguf");
    pull_url(&url, &opts(dir.path())).unwrap();
    pull_url(&url, &opts(dir.path())).unwrap();
    assert_eq!(server.requests().len(), 1);

    let newer = body(2000, 9);
    server.serve("/m.gguf", newer.clone(), Mode::HonourRange);
    let path = pull_url(
        &url,
        &PullOptions {
            force: true,
            ..opts(dir.path())
        },
    )
    .unwrap();
    assert_eq!(server.requests().len(), 2);
    assert_eq!(fs::read(path).unwrap(), newer);
}

#[test]
fn without_download_permission_an_uncached_url_is_reported() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let err = pull_url(
        &server.url("/m.gguf"),
        &PullOptions {
            download: false,
            ..opts(dir.path())
        },
    )
    .unwrap_err();
    assert!(matches!(err, HubError::NotCached { .. }), "{err:?}");
    assert!(server.requests().is_empty());
}

#[test]
fn unreachable_server_is_a_transport_error_naming_the_url() {
    // Bind then drop a listener: its port is free, so the connection is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{port}/m.gguf");
    let err = pull_url(&url, &opts(dir.path())).unwrap_err();
    assert!(matches!(err, HubError::Transport { .. }), "{err:?}");
    assert!(
        err.to_string().starts_with(&format!("GET {url}: ")),
        "{err}"
    );
}

#[test]
fn concurrent_pulls_of_one_url_take_turns_and_download_it_once() {
    let server = Server::start();
    let data = body(2_000_000, 10);
    server.serve("/m.gguf", data.clone(), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/m.gguf");
    let paths: Vec<_> = std::thread::scope(|s| {
        let pulls: Vec<_> = (0..4)
            .map(|_| s.spawn(|| pull_url(&url, &opts(dir.path()))))
            .collect();
        pulls
            .into_iter()
            .map(|p| p.join().unwrap().unwrap())
            .collect()
    });
    assert!(paths.iter().all(|p| *p == dest(dir.path(), &url)));
    assert_eq!(fs::read(&paths[0]).unwrap(), data);
    assert_eq!(
        server.requests().len(),
        1,
        "the later pulls found the file in place"
    );
}

#[test]
fn two_urls_ending_in_one_file_name_are_cached_apart() {
    let server = Server::start();
    let (a, b) = (body(1000, 10), body(2000, 11));
    server.serve("/one/m.gguf", a.clone(), Mode::HonourRange);
    server.serve("/two/m.gguf", b.clone(), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let pa = pull_url(&server.url("/one/m.gguf"), &opts(dir.path())).unwrap();
    let pb = pull_url(&server.url("/two/m.gguf"), &opts(dir.path())).unwrap();
    assert_ne!(pa, pb);
    assert_eq!((fs::read(&pa).unwrap(), fs::read(&pb).unwrap()), (a, b));
    // the bare name is now ambiguous, and says so
    let err = resolve_model("m.gguf", &opts(dir.path())).unwrap_err();
    assert!(matches!(err, HubError::Ambiguous { .. }), "{err:?}");
}

#[test]
fn a_url_download_is_found_by_its_bare_name() {
    let server = Server::start();
    let data = body(1000, 12);
    server.serve("/x/tiny.gguf", data.clone(), Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let path = pull_url(&server.url("/x/tiny.gguf"), &opts(dir.path())).unwrap();
    assert_eq!(resolve_model("tiny", &opts(dir.path())).unwrap(), path);
}

#[test]
fn an_error_page_served_with_200_is_not_cached() {
    let server = Server::start();
    let page = b"<!DOCTYPE html><html><body>Sign in to download</body></html>".to_vec();
    server.serve("/m.gguf", page, Mode::HonourRange);
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("/m.gguf");
    let err = pull_url(&url, &opts(dir.path())).unwrap_err();
    assert!(matches!(err, HubError::NotAModel { .. }), "{err:?}");
    assert!(err.to_string().contains("DOCTYPE"), "{err}");
    assert!(!dest(dir.path(), &url).exists());
    assert!(!partial(dir.path(), &url).exists());
}
