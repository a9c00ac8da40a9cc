//! What every request passes before a route sees it, and the access log after:
//! - the `Host` header, for servers bound to a loopback address: a web page the user visits can
//!   make the browser send requests to `localhost`, and with DNS rebinding read the answers; the
//!   browser then sends the attacker's host name, which is refused (403) unless allowed;
//! - `Content-Type: application/json` on POST bodies (415 otherwise): a browser sends
//!   `text/plain` cross-origin without a preflight, JSON it does not;
//! - the body read whole within a deadline (408) and under the size limit (413);
//! - one log line per request (target `octoflow_access`): method, path, status, latency,
//!   client address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The guard's settings.
#[derive(Debug, Clone)]
pub struct Guard {
    /// Host names (without port) requests may name; `None`: any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Largest body in bytes.
    pub body_limit: usize,
    /// How long a body may take to arrive.
    pub body_timeout: Duration,
}

impl Guard {
    /// The hosts a server bound to `addr` answers to: for a loopback address the loopback
    /// names and `extra`; otherwise any (a public server is reached by names it cannot know,
    /// and is protected by its API key instead).
    pub fn hosts_for(addr: &SocketAddr, extra: &[String]) -> Option<Vec<String>> {
        if !addr.ip().is_loopback() {
            return None;
        }
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .map(|h| h.to_string())
            .collect();
        hosts.extend(extra.iter().map(|h| h.to_ascii_lowercase()));
        Some(hosts)
    }

    /// Whether a `Host` header value names an allowed host (any port).
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(allowed) = &self.allowed_hosts else {
            return true;
        };
        // HTTP/1.1 requires Host; a request without one did not come from a browser.
        let Some(host) = host else {
            return true;
        };
        let host = host.trim().to_ascii_lowercase();
        let name = match host.strip_prefix('[') {
            // [v6]:port
            Some(rest) => match rest.find(']') {
                Some(end) => format!("[{}]", &rest[..end]),
                None => return false,
            },
            None => host.split(':').next().unwrap_or_default().to_string(),
        };
        allowed.iter().any(|a| *a == name || a == "*")
    }
}

/// Whether a `Content-Type` value is JSON (`application/json`, any parameters).
pub fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// The middleware (`axum::middleware::from_fn_with_state`).
pub async fn guard(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let remote = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_default();
    let response = match check(&g, req).await {
        Ok(req) => next.run(req).await,
        Err(e) => e.into_response(),
    };
    tracing::info!(
        target: "octoflow_access",
        "{remote} {method} {path} {} {:.1} ms",
        response.status().as_u16(),
        start.elapsed().as_secs_f64() * 1e3,
    );
    response
}

async fn check(g: &Guard, req: Request) -> Result<Request, ApiError> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    if !g.host_allowed(host) {
        return Err(ApiError::host_not_allowed(host.unwrap_or_default()));
    }
    if req.method() != Method::POST {
        return Ok(req);
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if !is_json(content_type) {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    let (parts, body) = req.into_parts();
    let read = axum::body::to_bytes(body, g.body_limit);
    let bytes = match tokio::time::timeout(g.body_timeout, read).await {
        Err(_) => return Err(ApiError::body_timeout(g.body_timeout)),
        Ok(Err(e)) => return Err(body_error(&e, g.body_limit)),
        Ok(Ok(b)) => b,
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// A body read's failure: over the limit (413) or cut off (400).
fn body_error(e: &axum::Error, limit: usize) -> ApiError {
    let over = std::error::Error::source(e)
        .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
        || e.to_string().contains("length limit");
    if over {
        ApiError::too_large(limit)
    } else {
        ApiError::invalid(None, format!("could not read the request body: {e}"))
    }
}

/// 405 in OpenAI's error shape for a known route with another method.
pub async fn method_not_allowed(req: Request) -> Response {
    let mut r = ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{} is not allowed on {}", req.method(), req.uri().path()),
        kind: "invalid_request_error",
        param: None,
        code: Some("method_not_allowed"),
    }
    .into_response();
    r.headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("GET, POST"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(hosts: Option<Vec<String>>) -> Guard {
        Guard {
            allowed_hosts: hosts,
            body_limit: 10,
            body_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn loopback_servers_answer_loopback_names_and_the_extra_ones_only() {
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let g = guard(Guard::hosts_for(&local, &["Box.lan".into()]));
        for ok in [
            "localhost:8080",
            "127.0.0.1",
            "[::1]:9",
            "LOCALHOST",
            "box.lan:1",
        ] {
            assert!(g.host_allowed(Some(ok)), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil",
            "[::2]",
            "[::1",
        ] {
            assert!(!g.host_allowed(Some(bad)), "{bad}");
        }
        let public: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(Guard::hosts_for(&public, &[]).is_none());
        assert!(guard(None).host_allowed(Some("anything")));
    }

    #[test]
    fn only_json_content_types_pass() {
        assert!(is_json(Some("application/json")));
        assert!(is_json(Some("Application/JSON; charset=utf-8")));
        for bad in [
            None,
            Some("text/plain"),
            Some("application/jsonx"),
            Some(""),
        ] {
            assert!(!is_json(bad), "{bad:?}");
        }
    }
}
