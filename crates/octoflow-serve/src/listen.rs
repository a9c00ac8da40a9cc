//! The accept loop: HTTP/1.1 connections with a cap on how many are open at once and deadlines
//! for clients that hold a connection without using it, then graceful shutdown.
//!
//! axum's own `serve` sets no deadline (a client sending headers at a byte a second, or an idle
//! keep-alive socket, is kept forever) and no cap, so this loop drives hyper directly:
//! - `header_read_timeout` (hyper's timer) closes a connection whose next request's headers do
//!   not arrive in time, from the moment the connection waits for them: slow headers and idle
//!   keep-alive sockets alike. A response being generated is not cut: hyper does not wait for
//!   headers then.
//! - a body that does not arrive in time is refused by [`crate::guard`]'s body deadline (408).
//! - at the connection cap, accepting pauses: further clients wait in the kernel's backlog until
//!   a connection closes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers, counted from when it
    /// waits for them (so also how long an idle keep-alive connection stays open).
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
        }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open connections finish
/// their requests (new requests on them are refused by the router's own shutdown state).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let builder = connections(&limits, true);
    tokio::pin!(shutdown);
    while let Some((permit, stream, remote)) = accept(&listener, &permits, &mut shutdown).await {
        let _ = stream.set_nodelay(true);
        let svc = app
            .clone()
            .map_request(move |mut r: hyper::Request<hyper::body::Incoming>| {
                r.extensions_mut().insert(ConnectInfo(remote));
                r.map(axum::body::Body::new)
            });
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection from {remote}: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Answers every connection on `listener` with `app`, one request each (no keep-alive), until
/// `stop` resolves; returns as soon as it stops accepting, leaving the connections it accepted
/// to finish their one answer. What the port says while the model loads: a connection that
/// arrives after `stop` is left in the backlog for the real server.
pub async fn answer_until(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl std::future::Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let builder = connections(&limits, false);
    tokio::pin!(stop);
    while let Some((permit, stream, remote)) = accept(&listener, &permits, &mut stop).await {
        let svc = app
            .clone()
            .map_request(|r: hyper::Request<hyper::body::Incoming>| r.map(axum::body::Body::new));
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection from {remote}: {e}");
            }
            drop(permit);
        });
    }
}

/// How connections are served: headers within `limits`' deadline (an idle kept-alive
/// connection waits for its next request's headers under the same deadline).
fn connections(limits: &Limits, keep_alive: bool) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(keep_alive);
    builder
}

/// The next connection with its permit, or `None` once `stop` has resolved (checked first, so
/// nothing is accepted after it) or the permits are closed. Accept errors (out of file
/// descriptors and the like) wait a little and try again.
async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    stop: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Option<(
    tokio::sync::OwnedSemaphorePermit,
    tokio::net::TcpStream,
    SocketAddr,
)> {
    let permit = tokio::select! {
        biased;
        () = stop.as_mut() => return None,
        p = permits.clone().acquire_owned() => p.ok()?,
    };
    loop {
        tokio::select! {
            biased;
            () = stop.as_mut() => return None,
            r = listener.accept() => match r {
                Ok((stream, remote)) => return Some((permit, stream, remote)),
                Err(e) => {
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}
