//! An admitted agent run's answer: a server-sent-event stream with one `data:` JSON per output
//! or error line (the lines `octoflow agents` writes), then a summary
//! (`{"summary": {"outputs", "errors", "tokens_generated", "steps", "seconds"}}`) or, when the
//! run fails as a whole, an error in OpenAI's shape, then `data: [DONE]`.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::job::AgentMsg;
use crate::error::ApiError;

/// The error a run's failure is reported as: the program's fault (a deadlock) is the request's,
/// shutdown and engine failures are the server's.
pub fn failure(message: String, code: &'static str) -> ApiError {
    match code {
        "deadlock" | "agent_run_failed" => ApiError::invalid(None, message).with_code(code),
        "shutting_down" => ApiError {
            message,
            ..ApiError::shutting_down()
        },
        _ => ApiError::internal(message),
    }
}

/// The SSE data of one message, and whether it was the last.
fn data(msg: Option<AgentMsg>) -> (Option<String>, bool) {
    match msg {
        Some(AgentMsg::Line(v)) => (Some(v.to_string()), false),
        Some(AgentMsg::Done(s)) => {
            let v = json!({"summary": {
                "outputs": s.outputs,
                "errors": s.errors,
                "tokens_generated": s.generated,
                "steps": s.steps,
                "seconds": s.seconds,
            }});
            (Some(v.to_string()), true)
        }
        Some(AgentMsg::Failed { message, code }) => {
            (Some(failure(message, code).body().to_string()), true)
        }
        // Only the first message is `Started` or `Refused`; the handler took it.
        Some(AgentMsg::Started | AgentMsg::Refused(_)) => (None, false),
        None => {
            let e = ApiError::internal("the scheduler stopped");
            (Some(e.body().to_string()), true)
        }
    }
}

/// Streams the run's messages. Dropping the stream (the client went away) drops the receiver,
/// which the scheduler notices before its next step: the run is cancelled and its instances
/// freed.
pub fn stream(
    rx: UnboundedReceiver<AgentMsg>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    // (receiver, done sent, [DONE] sent)
    let s = stream::unfold((rx, false, false), |(mut rx, last, done)| async move {
        if done {
            return None;
        }
        if last {
            let ev = SseEvent::default().data("[DONE]");
            return Some((Ok(ev), (rx, true, true)));
        }
        loop {
            let (d, last) = data(rx.recv().await);
            if let Some(d) = d {
                return Some((Ok(SseEvent::default().data(d)), (rx, last, false)));
            }
        }
    });
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(5)))
}
