//! `POST /v1/agents/runs`: checks the body (400s before anything runs), queues the run, waits
//! for the scheduler to admit it (a run that cannot start is still a 400), then streams it.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::job::{AgentJob, AgentMsg};
use super::request::{prepare, RunRequest};
use super::stream::{failure, stream};
use crate::api;
use crate::error::ApiError;
use crate::job::Work;
use crate::routes::{body, finish, refused, AppState};

/// The handler.
pub async fn runs(State(st): State<Arc<AppState>>, b: Result<Bytes, BytesRejection>) -> Response {
    let r = runs_inner(&st, b).await;
    finish(&st, r)
}

async fn runs_inner(st: &AppState, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: RunRequest = api::parse(&body(st, b)?)?;
    let p = prepare(&req, &st.tokenizer, st.template.as_deref(), st.n_slots)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let job = AgentJob {
        program: p.program,
        config: p.config,
        tasks: p.tasks,
        ids: p.ids,
        events: tx,
        enqueued: Instant::now(),
    };
    st.queue.push(Work::Agents(job)).map_err(refused)?;
    // Until admission nothing is streamed, so a run the engine refuses (a capacity past its
    // limits, a token outside the vocabulary) is still answered with a status. A client that
    // goes away meanwhile drops `rx`, and the scheduler skips the run.
    match rx.recv().await {
        Some(AgentMsg::Started) => Ok(stream(rx).into_response()),
        Some(AgentMsg::Refused(message)) => Err(ApiError::invalid(None, message)),
        Some(AgentMsg::Failed { message, code }) => Err(failure(message, code)),
        Some(_) | None => Err(ApiError::internal("the scheduler stopped")),
    }
}
