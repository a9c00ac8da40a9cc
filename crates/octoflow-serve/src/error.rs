//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.
//!
//! Status codes, as OpenAI's API uses them:
//! - 400 `invalid_request_error`: malformed JSON, a missing or mistyped field, a parameter out of
//!   range, a prompt longer than the context (`code: "context_length_exceeded"`). OpenAI answers
//!   400 (not 422) for bodies that parse but do not fit the schema, and so do we.
//! - 401 `invalid_request_error`, `code: "invalid_api_key"`: the server has an API key and the
//!   request does not bear it.
//! - 404 `invalid_request_error`, `code: "model_not_found"`: a model other than the one served;
//!   also unknown routes (`code: "not_found"`).
//! - 403 `invalid_request_error`, `code: "host_not_allowed"`: a loopback server asked for by
//!   another host name (a browser page's request through DNS rebinding).
//! - 405 `code: "method_not_allowed"`: a known route with the wrong method.
//! - 408 `code: "request_timeout"`: the body did not arrive in time.
//! - 413 `invalid_request_error`, `code: "request_too_large"`: a body over the limit.
//! - 415 `code: "unsupported_media_type"`: a POST body that is not `application/json`.
//! - 400 `code: "unsupported_parameter"`: an OpenAI parameter this server does not implement.
//! - 429 `server_overloaded`, `code: "queue_full"`: every instance is busy and the queue is full.
//! - 503 `server_error`, `code: "shutting_down"`: the server is stopping.
//!
//! 429 and 503 carry `Retry-After`.
//! - 500 `server_error`: the engine failed.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable explanation.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(param: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.into(),
            code: None,
        }
    }

    /// The same error with a code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 401: the request does not bear the server's API key (`missing`: no `Authorization`).
    pub fn unauthorized(missing: bool) -> Self {
        let message = if missing {
            "You didn't provide an API key. You need to provide your API key in an \
             Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        } else {
            "Incorrect API key provided."
        };
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 404 for a model that is not served.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404 for an unknown route.
    pub fn not_found(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("Unknown request URL: {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
        }
    }

    /// 413 for a body over `limit` bytes.
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("The request body is larger than the limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 400 for a parameter OpenAI defines that this server does not implement.
    pub fn unsupported(param: &str, why: impl std::fmt::Display) -> Self {
        Self {
            code: Some("unsupported_parameter"),
            ..Self::invalid(
                param.to_string(),
                format!("`{param}` is not supported: {why}"),
            )
        }
    }

    /// 403 for a `Host` a loopback server does not answer to.
    pub fn host_not_allowed(host: &str) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            message: format!(
                "Host `{host}` is not allowed: this server answers to its loopback names \
                 (add others with --allowed-host)"
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("host_not_allowed"),
        }
    }

    /// 415 for a POST body that is not JSON.
    pub fn unsupported_media_type(content_type: Option<&str>) -> Self {
        Self {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: format!(
                "Request bodies must be JSON (Content-Type: application/json), got {}",
                content_type.map_or("no Content-Type".to_string(), |c| format!("`{c}`"))
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("unsupported_media_type"),
        }
    }

    /// 408 for a body that did not arrive within `limit`.
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "The request body did not arrive within {} s",
                limit.as_secs_f64()
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
        }
    }

    /// 429: all instances busy and the queue full.
    pub fn queue_full(queue: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "The server is overloaded: every instance is busy and {queue} requests are \
                 already waiting; retry later"
            ),
            kind: "server_overloaded",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// 503: the model is still loading (every route, `/health` included, until it is ready).
    pub fn loading() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "Loading model".into(),
            kind: "unavailable_error",
            param: None,
            code: Some("loading"),
        }
    }

    /// 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "The server is shutting down".into(),
            kind: "server_error",
            param: None,
            code: Some("shutting_down"),
        }
    }

    /// The error for a scheduler's `Error` event: 503 while shutting down, 400
    /// `kv_cache_exceeded` for a request the KV cache can never hold, 503 `kv_cache_full`
    /// when it could not get its memory just now, else 500.
    pub fn from_scheduler(message: String) -> Self {
        if message.contains("shut") {
            Self {
                message,
                ..Self::shutting_down()
            }
        } else if message.contains("KV cache positions") {
            Self::invalid(None, message).with_code("kv_cache_exceeded")
        } else if message.contains("KV cache is full") {
            Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message,
                kind: "server_error",
                param: None,
                code: Some("kv_cache_full"),
            }
        } else {
            Self::internal(message)
        }
    }

    /// 500 with a message.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body (`{"error": {...}}`).
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or(serde_json::Value::Null)
    }
}

/// Seconds a client is told to wait before retrying a 429 or 503 (`Retry-After`).
const RETRY_AFTER_S: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_S),
            );
        }
        r
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}
