//! Who may call the API, and from which web origins.
//!
//! With an API key, every route but `/health` wants `Authorization: Bearer KEY` and answers
//! 401 in OpenAI's error shape without it (OpenAI's own `invalid_api_key`), so the `openai`
//! client's `AuthenticationError` is what a caller sees. `/health` stays open: load balancers
//! probe it without credentials. Browsers get CORS headers only for the origins `--cors`
//! names; without it no CORS layer exists, so a web page elsewhere cannot read answers.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

use crate::error::ApiError;

/// Access settings of the server.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The key requests must bear (`None`: every request is served).
    pub api_key: Option<String>,
    /// Origins allowed to read answers from a browser (`*` for any); empty: no CORS headers.
    pub cors: Vec<String>,
}

impl Access {
    /// The warning to print when the server listens beyond this machine without a key.
    pub fn exposure_warning(&self, addr: &std::net::SocketAddr) -> Option<String> {
        (self.api_key.is_none() && !addr.ip().is_loopback()).then(|| {
            format!(
                "octoflow serve: warning: listening on {addr} without an API key: anyone who \
                 can reach this address can use the model (set --api-key or OCTOFLOW_API_KEY)"
            )
        })
    }

    /// The CORS layer for the configured origins, or `None` when none were asked for. An
    /// origin that is not a valid header value is an error naming it.
    pub fn cors_layer(&self) -> Result<Option<CorsLayer>, String> {
        if self.cors.is_empty() {
            return Ok(None);
        }
        let origin = if self.cors.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            let list = self
                .cors
                .iter()
                .map(|o| {
                    HeaderValue::from_str(o).map_err(|_| format!("--cors: {o:?} is not an origin"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            AllowOrigin::list(list)
        };
        Ok(Some(
            CorsLayer::new()
                .allow_origin(origin)
                .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
                .allow_headers(Any),
        ))
    }
}

/// Whether `value` (an `Authorization` header) bears `key`. The comparison takes the same time
/// wherever the first difference is, so response times do not reveal a key's prefix.
fn bears(value: Option<&HeaderValue>, key: &str) -> bool {
    let Some(given) = value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), key.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The middleware: passes `/health`, CORS preflights and requests bearing the key; answers
/// 401 to the rest.
pub async fn require_key(State(key): State<Arc<str>>, req: Request, next: Next) -> Response {
    let open = req.uri().path() == "/health" || req.method() == Method::OPTIONS;
    if open || bears(req.headers().get(header::AUTHORIZATION), &key) {
        return next.run(req).await;
    }
    let missing = !req.headers().contains_key(header::AUTHORIZATION);
    ApiError::unauthorized(missing).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_key_passes() {
        let h = |s: &str| HeaderValue::from_str(s).expect("ascii");
        assert!(bears(Some(&h("Bearer sk-1")), "sk-1"));
        assert!(!bears(Some(&h("Bearer sk-12")), "sk-1"));
        assert!(!bears(Some(&h("Bearer sk-2")), "sk-1"));
        assert!(!bears(Some(&h("sk-1")), "sk-1"));
        assert!(!bears(Some(&h("Basic sk-1")), "sk-1"));
        assert!(!bears(None, "sk-1"));
    }

    #[test]
    fn a_public_address_without_a_key_warns() {
        let open = Access::default();
        let keyed = Access {
            api_key: Some("k".into()),
            ..Access::default()
        };
        let public = "0.0.0.0:8080".parse().expect("addr");
        let local = "127.0.0.1:8080".parse().expect("addr");
        assert!(open.exposure_warning(&public).is_some());
        assert!(open.exposure_warning(&local).is_none());
        assert!(keyed.exposure_warning(&public).is_none());
    }

    #[test]
    fn cors_only_when_asked() {
        assert!(Access::default().cors_layer().expect("ok").is_none());
        let a = Access {
            cors: vec!["https://example.com".into()],
            ..Access::default()
        };
        assert!(a.cors_layer().expect("ok").is_some());
        let bad = Access {
            cors: vec!["bad\norigin".into()],
            ..Access::default()
        };
        assert!(bad.cors_layer().is_err());
    }
}
