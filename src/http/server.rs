//! The accept loop every listener runs, the injector's too: a transport acceptor (plain TCP or
//! TLS), HTTP/1.1 and h2, connection and header limits, idle close and graceful drain. Each
//! connection serves the listener's tower service made for it from what its accept learnt
//! ([`Accepted`]: the client's address, TLS identity, interception), wrapped per request by
//! `hyper_util::service::TowerToHyperService`. The connection's facts are the service's, not put
//! in each request's extensions: a request's extensions are a map allocated per request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tower::Service;

use super::activity::{Activity, Tracked, TrackedFuture};
use super::body::{self, BoxError, ReachBody};
use super::layers;
use crate::config::Limits;
use crate::metrics::Metrics;
use crate::transport::{Accept, Accepted, ClientAddr};

/// How a listener serves its connections.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    /// Open connections; past it the listener stops accepting and clients wait in the backlog.
    pub(crate) max_connections: usize,
    /// Largest request head (HTTP/1.1) or header list (h2), in bytes.
    pub(crate) max_header_bytes: usize,
    /// A client must finish sending its request head within this time (slowloris guard).
    pub(crate) header_read_timeout: Duration,
    /// A connection with no request in flight is closed gracefully after this.
    pub(crate) idle_timeout: Duration,
    /// How long open requests may finish once the listener stops.
    pub(crate) drain: Duration,
    /// Streams one h2 connection may carry at once; hyper's default when `None`.
    pub(crate) h2_max_streams: Option<u32>,
    pub(crate) h2_keep_alive_interval: Duration,
    /// An h2 PING unanswered this long closes the connection.
    pub(crate) h2_keep_alive_timeout: Duration,
}

/// One connection's service: each request keeps the connection busy until its response body is
/// done.
#[derive(Clone, Debug)]
struct PerConnection<S> {
    inner: S,
    activity: Activity,
}

/// A connection accepted, before its handshake: its socket, its client, its slot.
struct Arrived {
    stream: TcpStream,
    client: ClientAddr,
    open: Open,
}

/// A connection counted open until dropped: also when its task panics, or is aborted when the
/// drain runs out. Holds the connection's slot.
struct Open {
    name: &'static str,
    metrics: Arc<Metrics>,
    _slot: OwnedSemaphorePermit,
}

/// Serves `listener` through `acceptor` until `stop` is cancelled, then lets open requests
/// finish for up to `settings.drain` before returning. Each connection is served by the service
/// `for_connection` (cloned for it) makes from what its accept learnt.
pub async fn serve<A, M, S, B>(
    name: &'static str,
    listener: TcpListener,
    acceptor: A,
    for_connection: M,
    settings: ServerSettings,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) where
    A: Accept,
    M: FnOnce(Arc<Accepted>) -> S + Clone + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let builder = Arc::new(builder(&settings));
    // Every connection's task, so the ones still open when the drain runs out can be closed.
    let mut connections = JoinSet::new();
    let slots = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    while let Some((slot, stream, remote)) = next_connection(name, &listener, &slots, &stop).await {
        metrics.connection_opened(name);
        let open = Open {
            name,
            metrics: metrics.clone(),
            _slot: slot,
        };
        while let Some(ended) = connections.try_join_next() {
            reap(name, &metrics, ended);
        }
        let arrived = Arrived {
            stream,
            client: client_addr(remote),
            open,
        };
        connections.spawn(serve_connection(
            arrived,
            acceptor.clone(),
            for_connection.clone(),
            builder.clone(),
            (settings.header_read_timeout, settings.idle_timeout),
            stop.clone(),
        ));
    }
    drop(listener);
    let drained = tokio::time::timeout(settings.drain, async {
        while let Some(ended) = connections.join_next().await {
            reap(name, &metrics, ended);
        }
    });
    if drained.await.is_err() {
        tracing::warn!(
            listener = name,
            "drain timeout reached; closing remaining connections"
        );
    }
    connections.abort_all();
}

/// One connection, from the acceptor to its last response: closed gracefully (open requests
/// complete, h2 gets GOAWAY) when the listener stops or the connection idles.
async fn serve_connection<A, M, S, B>(
    arrived: Arrived,
    acceptor: A,
    for_connection: M,
    builder: Arc<auto::Builder<TokioExecutor>>,
    quiet: (Duration, Duration),
    stop: CancellationToken,
) where
    A: Accept,
    M: FnOnce(Arc<Accepted>) -> S + Clone + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let Arrived {
        stream,
        client,
        open,
    } = arrived;
    let (name, remote) = (open.name, client.0);
    let io = match acceptor.accept(stream).await {
        Ok(io) => io,
        Err(err) => {
            tracing::debug!(listener = name, %remote, %err, "connection not established");
            return;
        }
    };
    let accepted = Accepted {
        client,
        identity: A::identity(&io),
        tls: A::tls(&io),
        intercepted: A::intercepted(&io),
    };
    let service = PerConnection {
        inner: for_connection(Arc::new(accepted)),
        activity: Activity::new(),
    };
    let activity = service.activity.clone();
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    let mut conn = std::pin::pin!(conn);
    let close = until_closing(&stop, &activity, quiet);
    let mut close = std::pin::pin!(close);
    let mut closing = false;
    let ended = loop {
        tokio::select! {
            ended = conn.as_mut() => break ended,
            () = close.as_mut(), if !closing => {
                // Nothing asked yet (a silent client, or a first head still coming in): closed
                // now. hyper's graceful close would wait for a head it has begun to read.
                if activity.never_asked() {
                    break Ok(());
                }
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    };
    if let Err(err) = ended {
        tracing::debug!(listener = name, %remote, err = %err, "connection ended with an error");
    }
    drop(open);
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
                    // A dual-stack listener sees an IPv4 client as `::ffff:a.b.c.d`: named
                    // as the IPv4 address it is, everywhere the client's address is read.
                    let remote = SocketAddr::new(remote.ip().to_canonical(), remote.port());
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

/// When a connection should finish gracefully: the listener stops, or it has carried no request
/// for `idle_timeout` — an idle h2 connection answers PINGs forever otherwise, holding memory —
/// or, HTTP/1, no head has come within `header_read_timeout` (`(header_read, idle)`). An HTTP/1
/// connection closed so is between requests, and hyper closes it at once.
async fn until_closing(
    stop: &CancellationToken,
    activity: &Activity,
    (header_read, idle): (Duration, Duration),
) {
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = activity.quiet_for(header_read, idle) => {}
    }
}

/// A finished connection task: one that panicked (outside a request handler, which
/// `layers::edge` guards) is counted and logged; its connection was closed with it.
fn reap(name: &'static str, metrics: &Metrics, ended: Result<(), JoinError>) {
    if let Err(err) = ended {
        if err.is_panic() {
            let panic = err.into_panic();
            metrics.panicked(name);
            tracing::error!(
                listener = name,
                panic = layers::panic_message(panic.as_ref()),
                "a connection task panicked; its connection was closed"
            );
        }
    }
}

fn builder(settings: &ServerSettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // The header-read deadline is the connection's own (`Activity::quiet_for`): hyper's
        // armed a timer per request.
        .header_read_timeout(None)
        .max_buf_size(settings.max_header_bytes)
        // A head and its body copied into one buffer and written at once: cheaper than
        // queueing them for `writev` (`docs/perf-levers.md`). The buffer
        // keeps its size for the connection: at most `max_buf_size` plus one body frame.
        .writev(false)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(settings.h2_max_streams)
        .keep_alive_interval(Some(settings.h2_keep_alive_interval))
        .keep_alive_timeout(settings.h2_keep_alive_timeout);
    builder
}

/// The client's address, with its IP as `x-forwarded-for` carries it: written once per
/// connection.
fn client_addr(remote: SocketAddr) -> ClientAddr {
    ClientAddr(
        remote,
        super::headers::value(&super::headers::ip_text(remote.ip())),
    )
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

// === impl ServerSettings ===

impl ServerSettings {
    /// A sidecar listener's settings, from the bootstrap's limits.
    pub fn from_limits(limits: &Limits, drain: Duration) -> Self {
        Self {
            max_connections: limits.max_connections,
            max_header_bytes: limits.max_header_bytes.get(),
            header_read_timeout: limits.header_read_timeout.get(),
            idle_timeout: limits.idle_timeout.get(),
            drain,
            h2_max_streams: None,
            h2_keep_alive_interval: Duration::from_secs(20),
            h2_keep_alive_timeout: Duration::from_secs(20),
        }
    }
}

// === impl PerConnection ===

impl<S, B> Service<Request<Incoming>> for PerConnection<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<Tracked<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        if req.version() == http::Version::HTTP_2 {
            self.activity.multiplexed();
        }
        let busy = self.activity.begin();
        TrackedFuture::new(self.inner.call(req), busy)
    }
}

// === impl Open ===

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.connection_closed(self.name);
    }
}
