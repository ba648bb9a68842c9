//! The accept loop every listener runs: HTTP/1.1 and h2c, connection and header limits, graceful drain.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::activity::{Activity, Tracked};
use super::body::{self, ReachBody};
use crate::config::Limits;
use crate::metrics::Metrics;

/// Serves `handler` on `listener` until `stop` is cancelled, then lets open requests finish for up
/// to `drain` before returning.
pub async fn serve<H, F>(
    name: &'static str,
    listener: TcpListener,
    handler: H,
    limits: Limits,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    drain: Duration,
) where
    H: Fn(Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ReachBody>> + Send + 'static,
{
    let builder = Arc::new(builder(&limits));
    // Every connection's task, so the ones still open when the drain runs out can be closed.
    let mut connections = tokio::task::JoinSet::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let first_byte_timeout = limits.header_read_timeout.get();
    let idle_timeout = limits.idle_timeout.get();
    while let Some((permit, stream, remote)) = next_connection(name, &listener, &slots, &stop).await
    {
        let activity = Activity::new();
        let service = {
            let (handler, activity) = (handler.clone(), activity.clone());
            hyper::service::service_fn(move |req| {
                let busy = activity.begin();
                let response = handler(req, remote);
                async move { Ok::<_, Infallible>(response.await.map(|b| Tracked::new(b, busy))) }
            })
        };
        let builder = builder.clone();
        let stop = stop.clone();
        let metrics = metrics.clone();
        metrics.connection_opened(name);
        while connections.try_join_next().is_some() {}
        connections.spawn(async move {
            // hyper's header-read timeout starts only once the protocol is known; a client that
            // connects and sends nothing must not hold a connection slot either.
            if wait_first_byte(&stream, first_byte_timeout).await {
                let conn = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                let mut conn = std::pin::pin!(conn);
                let close = until_closing(&stop, &activity, idle_timeout);
                let mut close = std::pin::pin!(close);
                let mut closing = false;
                let ended = loop {
                    tokio::select! {
                        ended = conn.as_mut() => break ended,
                        () = close.as_mut(), if !closing => {
                            conn.as_mut().graceful_shutdown();
                            closing = true;
                        }
                    }
                };
                if let Err(err) = ended {
                    tracing::debug!(listener = name, %remote, err = %err, "connection ended with an error");
                }
            }
            metrics.connection_closed(name);
            drop(permit);
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    });
    if drained.await.is_err() {
        tracing::warn!(
            listener = name,
            "drain timeout reached; closing remaining connections"
        );
    }
    connections.abort_all();
}

/// The next connection, with its slot: past the connection limit we stop accepting and clients
/// wait in the kernel backlog. `None` once the listener stops.
async fn next_connection(
    name: &'static str,
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    stop: &CancellationToken,
) -> Option<(OwnedSemaphorePermit, TcpStream, SocketAddr)> {
    let permit = tokio::select! {
        _ = stop.cancelled() => return None,
        permit = slots.clone().acquire_owned() => permit.ok()?,
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    let _ = stream.set_nodelay(true);
                    return Some((permit, stream, remote));
                }
                Err(err) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(listener = name, %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
        }
    }
}

/// When a connection should finish gracefully (open requests complete, h2 gets GOAWAY): the
/// listener stops, or it has carried no request for `idle_timeout` — an idle h2 connection
/// answers PINGs forever otherwise, holding memory.
async fn until_closing(stop: &CancellationToken, activity: &Activity, idle_timeout: Duration) {
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = activity.idle_for(idle_timeout) => {}
    }
}

fn builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout.get())
        .max_buf_size(limits.max_header_bytes.get())
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes.get() as u32)
        .keep_alive_interval(Some(Duration::from_secs(20)));
    builder
}

async fn wait_first_byte(stream: &TcpStream, timeout: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(timeout, stream.peek(&mut byte)).await, Ok(Ok(n)) if n > 0)
}

/// A plain-text response, for the admin endpoints.
pub fn text(
    status: StatusCode,
    content_type: &'static str,
    text: impl Into<bytes::Bytes>,
) -> Response<ReachBody> {
    let mut response = Response::new(body::full(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}
