//! Plain HTTP(S) GET into a file: resumable (Range requests), verified, placed atomically.
//!
//! Bytes go to `<dest>.partial`. A later call resumes from its length with `Range: bytes=N-`; a
//! server that answers 200 instead of 206 gets a clean restart. Only a complete, verified file is
//! renamed to `dest`, so an interrupted download never leaves a file that looks finished.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use crate::cache::{commit, create_dir_all, len_or_zero, partial_path, remove_file_if_exists};
use crate::error::{io_err, HubError};
use crate::progress::{pump, Progress, PumpError};
use crate::sha::sha256_file;

/// The HTTP client used for every request: rustls (see `tls`), generous read timeout.
pub(crate) fn agent() -> ureq::Agent {
    let builder = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(30))
        .timeout_read(Duration::from_secs(120))
        .user_agent(concat!("octoflow/", env!("CARGO_PKG_VERSION")));
    match crate::tls::client_config() {
        Some(config) => builder.tls_config(config),
        None => builder,
    }
    .build()
}

/// Maps a failed request to our error: the HTTP status, or what went wrong on the way.
pub(crate) fn request_error(url: &str, error: ureq::Error) -> HubError {
    match error {
        ureq::Error::Status(status, r) => HubError::HttpStatus {
            url: url.into(),
            status,
            reason: r.status_text().into(),
        },
        ureq::Error::Transport(t) => {
            // ureq's Display repeats the URL; keep the kind, message and underlying cause.
            let mut message = t.kind().to_string();
            if let Some(detail) = t.message() {
                message.push_str(&format!(": {detail}"));
            }
            if let Some(cause) = std::error::Error::source(&t) {
                message.push_str(&format!(": {cause}"));
            }
            HubError::Transport {
                url: url.into(),
                message,
            }
        }
    }
}

/// One file to fetch and what it must look like.
pub(crate) struct Fetch<'a> {
    pub url: &'a str,
    pub dest: &'a Path,
    /// Expected sha256 (lowercase hex), checked before the file is placed.
    pub sha256: Option<&'a str>,
    /// Expected size in bytes, when known in advance.
    pub size: Option<u64>,
    /// Shown in progress output.
    pub label: &'a str,
    pub progress: bool,
    /// What the file must start with (a model's `GGUF`): an error page served with status 200
    /// never lands in the cache.
    pub magic: Option<&'a [u8]>,
}

/// Downloads `fetch.url` to `fetch.dest`, resuming `<dest>.partial` if present.
pub(crate) fn download(agent: &ureq::Agent, fetch: &Fetch) -> Result<(), HubError> {
    if let Some(dir) = fetch.dest.parent() {
        create_dir_all(dir)?;
    }
    let partial = partial_path(fetch.dest);
    let have = len_or_zero(&partial)?;
    let total = fetch_into(agent, fetch, &partial, have)?;
    verify_and_commit(fetch, &partial, total)
}

/// GETs the body into `partial` (appending after `have` bytes when the server honours Range);
/// returns the full file length the server announced, if it did.
fn fetch_into(
    agent: &ureq::Agent,
    fetch: &Fetch,
    partial: &Path,
    have: u64,
) -> Result<Option<u64>, HubError> {
    let url = fetch.url;
    let mut request = agent.get(url);
    if have > 0 {
        request = request.set("Range", &format!("bytes={have}-"));
    }
    let response = match request.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(416, r)) if have > 0 => {
            // Nothing left to send: either the partial is already complete or it is not ours.
            if parse_content_range(r.header("Content-Range")).and_then(|(_, total)| total)
                == Some(have)
            {
                return Ok(Some(have));
            }
            remove_file_if_exists(partial)?;
            return fetch_into(agent, fetch, partial, 0);
        }
        Err(e) => return Err(request_error(url, e)),
    };
    let (append, total) = match response.status() {
        206 if have > 0 => match parse_content_range(response.header("Content-Range")) {
            Some((start, total)) if start == have => (true, total),
            _ => {
                tracing::warn!(
                    "{url}: unusable Content-Range in a 206 answer; restarting the download"
                );
                remove_file_if_exists(partial)?;
                return fetch_into(agent, fetch, partial, 0);
            }
        },
        200 => {
            if have > 0 {
                tracing::info!(
                    "{url}: server ignored the Range request; downloading from the start"
                );
            }
            (
                false,
                response
                    .header("Content-Length")
                    .and_then(|v| v.trim().parse().ok()),
            )
        }
        status => {
            let reason = format!(
                "{} (expected 200, or 206 for a resumed download)",
                response.status_text()
            );
            return Err(HubError::HttpStatus {
                url: url.into(),
                status,
                reason,
            });
        }
    };
    let start = if append { have } else { 0 };
    let file = if append {
        OpenOptions::new().append(true).open(partial)
    } else {
        OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(partial)
    }
    .map_err(io_err("open for writing", partial))?;

    let mut progress = Progress::start(fetch.progress, fetch.label, total.or(fetch.size), start);
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    let copied = pump(&mut response.into_reader(), &mut writer, &mut progress);
    // Flush whatever arrived, even on a read failure: it is what the next run resumes from.
    writer.flush().map_err(io_err("write", partial))?;
    match copied {
        Ok(_) => {
            progress.finish();
            Ok(total)
        }
        Err(PumpError::Write(e)) => Err(io_err("write", partial)(e)),
        Err(PumpError::Read { error, copied }) => Err(match total {
            Some(expected) => HubError::Truncated {
                url: url.into(),
                expected,
                received: start + copied,
            },
            None => HubError::Transport {
                url: url.into(),
                message: format!(
                    "reading the body failed after {} bytes: {error}",
                    start + copied
                ),
            },
        }),
    }
}

/// Checks length and hash of the finished `partial`, then renames it to `fetch.dest`.
fn verify_and_commit(fetch: &Fetch, partial: &Path, total: Option<u64>) -> Result<(), HubError> {
    let url = fetch.url;
    let len = len_or_zero(partial)?;
    if let Some(expected) = total.or(fetch.size).filter(|&e| len < e) {
        return Err(HubError::Truncated {
            url: url.into(),
            expected,
            received: len,
        });
    }
    if let Some(expected) = [total, fetch.size]
        .into_iter()
        .flatten()
        .find(|&e| e != len)
    {
        remove_file_if_exists(partial)?;
        return Err(HubError::SizeMismatch {
            what: url.into(),
            expected,
            found: len,
            deleted: true,
        });
    }
    if let Some(magic) = fetch.magic {
        let mut head = vec![0u8; magic.len()];
        let read = std::fs::File::open(partial)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head));
        if read.is_err() || head != magic {
            let start = std::fs::read(partial).unwrap_or_default();
            remove_file_if_exists(partial)?;
            return Err(HubError::NotAModel {
                url: url.into(),
                expected: String::from_utf8_lossy(magic).into_owned(),
                start: preview(&start),
            });
        }
    }
    if let Some(expected) = fetch.sha256 {
        let found = sha256_file(partial)?;
        if found != expected {
            remove_file_if_exists(partial)?;
            return Err(HubError::ShaMismatch {
                what: url.into(),
                expected: expected.into(),
                found,
                deleted: true,
            });
        }
    }
    commit(partial, fetch.dest)
}

/// The start of a file as text for an error message (an HTML or JSON error page reads).
fn preview(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(80)];
    let text: String = String::from_utf8_lossy(head)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("{:?}", text.trim())
}

/// Parses `Content-Range: bytes START-END/TOTAL` (or `bytes */TOTAL`, START then 0) into
/// (START, TOTAL), TOTAL being `None` for `*`.
fn parse_content_range(value: Option<&str>) -> Option<(u64, Option<u64>)> {
    let rest = value?.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    let start = match range.trim() {
        "*" => 0,
        r => r.split_once('-')?.0.trim().parse().ok()?,
    };
    Some((start, total))
}

/// The name a URL's file is cached under: its last path segment, without query or fragment.
pub(crate) fn url_file_name(url: &str) -> Result<&str, HubError> {
    let bad = |reason: &str| HubError::BadUrl {
        url: url.into(),
        reason: reason.into(),
    };
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| bad("only http:// and https:// URLs can be downloaded"))?;
    let path = rest.split(['?', '#']).next().unwrap_or_default();
    let (_host, path) = path
        .split_once('/')
        .ok_or_else(|| bad("it has no file path"))?;
    let name = path.rsplit('/').next().unwrap_or_default();
    if name.is_empty() || name == "." || name == ".." || name.contains('\\') {
        return Err(bad("its path does not end in a file name"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_forms_are_parsed() {
        assert_eq!(
            parse_content_range(Some("bytes 100-199/200")),
            Some((100, Some(200)))
        );
        assert_eq!(parse_content_range(Some("bytes 5-9/*")), Some((5, None)));
        assert_eq!(
            parse_content_range(Some("bytes */200")),
            Some((0, Some(200)))
        );
        assert_eq!(parse_content_range(Some("items 1-2/3")), None);
        assert_eq!(parse_content_range(Some("bytes x-1/2")), None);
        assert_eq!(parse_content_range(None), None);
    }

    #[test]
    fn url_file_name_is_the_last_path_segment() {
        let name = |u| url_file_name(u).map_err(|e| e.to_string());
        assert_eq!(
            name("https://h.example/a/b/model.Q4_0.gguf?download=true").unwrap(),
            "model.Q4_0.gguf"
        );
        assert_eq!(name("http://127.0.0.1:8080/x.gguf#frag").unwrap(), "x.gguf");
        assert!(name("ftp://h/x.gguf")
            .unwrap_err()
            .contains("only http:// and https://"));
        assert!(name("https://h.example")
            .unwrap_err()
            .contains("no file path"));
        assert!(name("https://h.example/dir/")
            .unwrap_err()
            .contains("file name"));
        assert!(name("https://h.example/..")
            .unwrap_err()
            .contains("file name"));
    }
}
