//! A small HTTP/1.1 client pool that drives each connection inside the task of the request using
//! it (see docs/perf-levers.md), dialing through the transport seam (`transport::Connect`).
//!
//! hyper-util's legacy `Client` spawns a task per connection and hands every request to it over
//! an mpsc channel, answering over a oneshot: per request two wakeups of another task (three
//! polls of it), a pool `Mutex` keyed by a SipHashed `(Scheme, Authority)`, the request future
//! boxed and moved (a large `memcpy` per hop), and an absolute URI built and
//! parsed again. Here a connection is owned by whoever uses it: the request's own future polls it
//! until the response head arrives, then the response body (`UpstreamBody`) polls it while the
//! server connection task streams that body out. The connection's socket wakes the request's
//! own task; no other task runs. When the body ends the connection goes back to the pool, idle
//! and unpolled, for the next request on any task.
//!
//! Kept from the legacy client: connect timeout, TCP keepalive (time, 5 s interval, 3 probes),
//! `TCP_NODELAY`, the 64 KiB read-buffer cap, idle expiry and a maximum of idle connections per
//! authority, a pooled connection found closed before the request was written is retried on
//! another (the request never left: hyper gives it back), and the `connect`/`refused`
//! classification routing relies on (the request never reached the upstream).
//!
//! The pool opens a connection only when it has no idle one, for a request in hand, so the
//! connections it holds to an upstream are those in use plus at most `max_idle_per_host` idle:
//! to the local agent, admission's `max_concurrency` plus the idle set. A connect that times out
//! while the upstream holds others open is its listen backlog being full, not the upstream
//! gone: [`Backlog::Wait`] connects again, within the call's time, instead of failing.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::uri::PathAndQuery;
use http::{header, Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tower::ServiceExt;

use super::client::{self, Failure};
use super::{headers, ReachBody};
use crate::config::{PeerProtocol, Policy};
use crate::error::ReachError;
use crate::transport::ConnectMesh;
use crate::transport::Expected;

mod body;
mod h2;
mod wakes;

use body::Lease;
pub(crate) use body::UpstreamBody;
use wakes::Wakes;

/// The largest read buffer of one upstream connection (as the legacy client).
const READ_BUFFER_MAX: usize = 64 * 1024;

type Conn = Connection<Io, ReachBody>;

/// An open connection from the transport, whatever it is (plain TCP now, TLS later): boxed once
/// per connection, so the pool and the bodies it hands out name no transport.
type Io = Box<dyn Transported>;

/// What the pool needs of a transport's connection.
trait Transported: hyper::rt::Read + hyper::rt::Write + Unpin + Send {}
impl<T: hyper::rt::Read + hyper::rt::Write + Unpin + Send> Transported for T {}

/// Dials an authority through a transport, erasing its type: in plaintext, or with mutual TLS
/// to a peer that must present the identity given, or TLS to an external target's server. True
/// with the connection when it speaks HTTP/2: to a plaintext peer of an HTTP/2 pool (prior
/// knowledge), when the server picked ALPN `h2` over TLS; never to a plain external target.
type Dial = Arc<
    dyn Fn(
            Uri,
            Option<Expected>,
        ) -> Pin<Box<dyn Future<Output = Result<(Io, bool), Failure>> + Send>>
        + Send
        + Sync,
>;

fn dialer<C: crate::transport::Connect>(connect: C, mesh: Option<ConnectMesh>, h2: bool) -> Dial {
    let mesh = mesh.map(|mesh| if h2 { mesh.offering_h2() } else { mesh });
    Arc::new(move |uri: Uri, identity: Option<Expected>| {
        let (connect, mesh) = (connect.clone(), mesh.clone());
        Box::pin(async move {
            match (&identity, mesh) {
                (None | Some(Expected::Plain), _) => {
                    let prior_knowledge = h2 && identity.is_none();
                    match connect.oneshot(uri).await {
                        Ok(io) => Ok((Box::new(io) as Io, prior_knowledge)),
                        Err(err) => Err(connect_failure(&*err.into())),
                    }
                }
                // An external target's `https://` endpoint: HTTP/2 if its server picks it.
                (Some(Expected::Server(tls)), _) => {
                    let io = connect
                        .oneshot(uri)
                        .await
                        .map_err(|err| connect_failure(&*err.into()))?;
                    match tls.connect(TokioIo::new(io)).await {
                        Ok(stream) => {
                            let speaks_h2 = crate::transport::target_tls::negotiated_h2(&stream);
                            Ok((Box::new(TokioIo::new(stream)) as Io, speaks_h2))
                        }
                        Err(err) => Err(connect_failure(&err)),
                    }
                }
                (Some(identity), Some(mesh)) => match mesh.connect(uri, identity).await {
                    Ok(io) => {
                        let speaks_h2 = h2 && crate::transport::negotiated_h2(&io);
                        Ok((Box::new(io) as Io, speaks_h2))
                    }
                    Err(err) => Err(connect_failure(&err)),
                },
                (Some(identity), None) => Err(Failure::connect(format!(
                        "the peer is `{identity}` but this sidecar has no certificate (bootstrap `tls`)"
                    ))),
            }
        })
    })
}
type Map<V> = crate::fast_hash::FastMap<Box<str>, V>;

/// What the pool needs from the policy.
#[derive(Clone, Debug)]
pub(crate) struct PoolConfig {
    pub(crate) idle_timeout: Duration,
    pub(crate) max_idle_per_host: usize,
    /// What it speaks: HTTP/1.1, or HTTP/2 where the upstream does (`h2`).
    pub(crate) protocol: PeerProtocol,
}

impl PoolConfig {
    /// An HTTP/1.1 pool (the local agent).
    pub(crate) fn from_policy(policy: &Policy) -> Self {
        Self {
            idle_timeout: policy.pool.idle_timeout.get(),
            max_idle_per_host: policy.pool.max_idle_per_host,
            protocol: PeerProtocol::Http1,
        }
    }

    /// The peer pool: `pool.peer_protocol` to peer sidecars (external targets: HTTP/1.1 in
    /// plaintext, by ALPN over TLS).
    pub(crate) fn for_peers(policy: &Policy) -> Self {
        Self {
            protocol: policy.pool.peer_protocol,
            ..Self::from_policy(policy)
        }
    }
}

/// A pool of HTTP/1.1 connections per authority (`host:port`), and of HTTP/2 ones (`h2.rs`) to
/// peers under [`PeerProtocol::Http2`] and to `https://` targets whose server picks `h2`. Cheap
/// to clone.
#[derive(Clone)]
pub(crate) struct Pool {
    inner: Arc<Inner>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

struct Inner {
    config: PoolConfig,
    builder: http1::Builder,
    dial: Dial,
    scheme: http::uri::Scheme,
    /// Idle connections per authority.
    idle: Mutex<Map<Vec<Idle>>>,
    /// What shows each authority is accepting connections (locked per new connection only).
    live: Mutex<Map<Arc<Live>>>,
    sweeping: AtomicBool,
    /// The HTTP/2 connections (empty until one is opened).
    h2: h2::H2,
}

/// An authority's open connections and its last accepted one: each open connection holds a
/// clone, so the count is the `Arc`'s, less the map's own.
#[derive(Default)]
struct Live {
    connected: Mutex<Option<Instant>>,
}

/// A connection established this recently shows the upstream was accepting (one that closes
/// after each answer holds none open between calls).
const ACCEPTING_WINDOW: Duration = Duration::from_secs(5);

/// Connect attempts to a backlogged upstream are at least this far apart (a tiny
/// `timeouts.connect` must not turn the wait into a storm of SYNs).
const BACKLOG_RETRY_SPACING: Duration = Duration::from_millis(20);

/// What `send` does when a connect times out while the upstream is accepting other connections
/// (it holds some open, or accepted one within the last seconds): its listen backlog is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Backlog {
    /// Fail the connect: the caller moves to another upstream (peers).
    #[default]
    Fail,
    /// Connect again (or take a connection freed meanwhile) until the call's time runs out, then
    /// answer [`ReachError::Backlogged`]: the local agent, which has no other to move to.
    Wait,
}

/// A connection and the handle that sends requests on it.
struct Pooled {
    /// The identity the peer proved in the TLS handshake; `None` in plaintext.
    identity: Option<Expected>,
    tx: SendRequest<ReachBody>,
    /// Dropped (`None`) as soon as it has closed: that fails the request it was carrying.
    conn: Option<Pin<Box<Conn>>>,
    /// What every poll of `conn` is woken through.
    wakes: Wakes,
    /// The deadline of the exchange on it (see [`exchange`]): one timer for every request the
    /// connection carries, moved on by each.
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Counts this connection open to its authority until it is dropped.
    _live: Arc<Live>,
}

struct Idle {
    pooled: Pooled,
    since: Instant,
}

// === impl Inner ===

impl Inner {
    fn live(&self) -> std::sync::MutexGuard<'_, Map<Arc<Live>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection to `authority` was just established: what it holds while open.
    fn connected(&self, authority: &str) -> Arc<Live> {
        let live = self.live().entry(authority.into()).or_default().clone();
        *live.connected.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        live
    }

    /// Whether `authority` is accepting connections: some are open, or one was established
    /// within [`ACCEPTING_WINDOW`].
    fn accepting(&self, authority: &str) -> bool {
        let Some(live) = self.live().get(authority).cloned() else {
            return false;
        };
        // Less the map's clone and this one.
        let open = Arc::strong_count(&live).saturating_sub(2);
        let recent = live
            .connected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at.elapsed() < ACCEPTING_WINDOW);
        open > 0 || recent
    }

    /// Forgets authorities with nothing open and no recent connection (peers come and go).
    fn forget_quiet(&self) {
        self.live().retain(|_, live| {
            Arc::strong_count(live) > 1
                || live
                    .connected
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_some_and(|at| at.elapsed() < ACCEPTING_WINDOW)
        });
    }
}

impl Pool {
    /// A pool whose connections `connect` opens (plaintext only).
    pub(crate) fn new<C: crate::transport::Connect>(config: PoolConfig, connect: C) -> Self {
        Self::with_mesh(config, connect, None)
    }

    /// A pool whose plaintext connections `connect` opens, and its TLS ones (to a request that
    /// names a peer identity) `mesh`.
    pub(crate) fn with_mesh<C: crate::transport::Connect>(
        config: PoolConfig,
        connect: C,
        mesh: Option<ConnectMesh>,
    ) -> Self {
        let scheme = connect.scheme().clone();
        let peers_h2 = config.protocol == PeerProtocol::Http2;
        let mut builder = http1::Builder::new();
        // Each pooled connection keeps its read buffer; bodies stream in 64 KiB reads.
        builder.max_buf_size(READ_BUFFER_MAX);
        // One buffer for the head and body, written at once (see `http::server`'s builder).
        builder.writev(false);
        Self {
            inner: Arc::new(Inner {
                config,
                builder,
                dial: dialer(connect, mesh, peers_h2),
                scheme,
                idle: Mutex::new(Map::default()),
                live: Mutex::new(Map::default()),
                sweeping: AtomicBool::new(false),
                h2: h2::H2::new(),
            }),
        }
    }

    /// A plain-TCP pool with the policy's connect and pool settings.
    #[cfg(test)]
    pub(crate) fn build(policy: &Policy) -> Self {
        let tcp = crate::transport::TcpSettings::from_policy(policy);
        Self::new(
            PoolConfig::from_policy(policy),
            crate::transport::ConnectTcp::new(tcp),
        )
    }

    /// The scheme its transport speaks.
    pub(crate) fn scheme(&self) -> &http::uri::Scheme {
        &self.inner.scheme
    }

    /// Idle connections now pooled (all authorities).
    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    /// Open HTTP/2 connections (all authorities).
    #[cfg(test)]
    pub(crate) fn h2_count(&self) -> usize {
        self.inner.h2.open_count()
    }

    /// Whether a request to an upstream that must prove `identity` goes the HTTP/2 way: to an
    /// `https://` target, where its server's ALPN answer decides; to a peer sidecar, by
    /// `peer_protocol`; never to a plain external target.
    fn via_h2(&self, identity: Option<&Expected>) -> bool {
        match identity {
            Some(Expected::Server(_)) => true,
            Some(Expected::Plain) => false,
            // Plaintext and mutual-TLS peers, by `peer_protocol`.
            _ => self.inner.config.protocol == PeerProtocol::Http2,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map<Vec<Idle>>> {
        self.inner.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently idle live connection to `authority` that proved `identity` (or is
    /// plaintext, for none), if any.
    fn checkout(&self, authority: &str, identity: Option<&Expected>) -> Option<Pooled> {
        let now = Instant::now();
        let idle_timeout = self.inner.config.idle_timeout;
        loop {
            let idle = {
                let mut map = self.lock();
                let list = map.get_mut(authority)?;
                // Usually the last one; two identities at one address only while a member lies
                // about its address or a mode changes. An empty list keeps its key (and
                // allocation) for the next release.
                let at = list
                    .iter()
                    .rposition(|i| i.pooled.identity.as_ref() == identity)?;
                list.remove(at)
            };
            if now.saturating_duration_since(idle.since) >= idle_timeout {
                // Older ones sit below it: let them go (the sweeper takes any left).
                if let Some(list) = self.lock().get_mut(authority) {
                    list.retain(|i| now.saturating_duration_since(i.since) < idle_timeout);
                }
                return None;
            }
            // Not polled here: a close that arrived while it sat idle is read by the exchange's
            // first poll, before the request is written, and hyper gives the request back
            // (`Unsent`), which `send` retries on the next connection.
            if idle.pooled.tx.is_closed() {
                continue;
            }
            return Some(idle.pooled);
        }
    }

    /// Puts a connection whose exchange is over back, if it can take another request.
    fn release(&self, authority: &str, mut pooled: Pooled) {
        // Usually the poll that delivered the body's end already left the connection idle and
        // asking for the next request; otherwise one poll (waking nobody) gets it there.
        if !pooled.tx.is_ready() && pooled.poll_noop().is_ready() || !pooled.tx.is_ready() {
            // Closed, or still busy (the upstream answered before reading the whole request
            // body): dropping it closes it.
            return;
        }
        let max = self.inner.config.max_idle_per_host;
        if max == 0 {
            return;
        }
        {
            let mut map = self.lock();
            let list = match map.get_mut(authority) {
                Some(list) => list,
                None => map.entry(authority.into()).or_default(),
            };
            if list.len() >= max {
                return;
            }
            pooled.wakes.idle();
            list.push(Idle {
                pooled,
                since: Instant::now(),
            });
        }
        self.sweep_later();
    }

    /// Starts the sweeper that closes connections idle past the timeout (once per pool).
    fn sweep_later(&self) {
        if self.inner.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.sweeping.store(false, Ordering::Relaxed);
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let every = (self.inner.config.idle_timeout / 2).max(Duration::from_millis(50));
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                let expired = Instant::now().checked_sub(inner.config.idle_timeout);
                {
                    let mut map = inner.idle.lock().unwrap_or_else(|p| p.into_inner());
                    for list in map.values_mut() {
                        list.retain(|idle| expired.is_none_or(|t| idle.since > t));
                    }
                    map.retain(|_, list| !list.is_empty());
                }
                inner.h2.sweep(inner.config.idle_timeout);
                inner.forget_quiet();
            }
        });
    }

    async fn connect(
        &self,
        authority: &str,
        identity: Option<&Expected>,
    ) -> Result<Pooled, Failure> {
        // An HTTP/2 pool comes here only for an address that did not pick `h2`.
        let (io, _) = self.dial(authority, identity).await?;
        self.handshake_h1(io, authority, identity).await
    }

    /// A connection to `authority` from the transport, and whether it speaks HTTP/2.
    async fn dial(
        &self,
        authority: &str,
        identity: Option<&Expected>,
    ) -> Result<(Io, bool), Failure> {
        let uri = Uri::builder()
            .scheme(self.inner.scheme.clone())
            .authority(authority)
            .path_and_query("/")
            .build()
            .map_err(|err| {
                Failure::connect(format!("bad upstream address `{authority}`: {err}"))
            })?;
        (self.inner.dial)(uri, identity.cloned()).await
    }

    /// An HTTP/1.1 connection on `io`.
    async fn handshake_h1(
        &self,
        io: Io,
        authority: &str,
        identity: Option<&Expected>,
    ) -> Result<Pooled, Failure> {
        let (tx, conn) = self
            .inner
            .builder
            .handshake(io)
            .await
            .map_err(|err| Failure::connect(client::chain(&err)))?;
        Ok(Pooled {
            identity: identity.cloned(),
            tx,
            conn: Some(Box::pin(conn)),
            wakes: Wakes::new(),
            // Not in the timer wheel until an exchange with a deadline sets it.
            timer: Box::pin(tokio::time::sleep_until(tokio::time::Instant::now())),
            _live: self.inner.connected(authority),
        })
    }

    /// A new connection for a request to `authority`, for which a checkout found no idle one.
    /// With [`Backlog::Wait`], a connect that timed out while the upstream is accepting others is
    /// tried again (an idle connection freed meanwhile taken first); `waiting` is true while it
    /// is, so `forward` can tell a backlogged upstream from a silent one when time runs out.
    async fn connection(
        &self,
        authority: &str,
        identity: Option<&Expected>,
        backlog: Backlog,
        waiting: &mut bool,
    ) -> Result<(Pooled, bool), Failure> {
        loop {
            let started = tokio::time::Instant::now();
            match self.connect(authority, identity).await {
                Ok(pooled) => {
                    *waiting = false;
                    return Ok((pooled, false));
                }
                Err(failure)
                    if backlog == Backlog::Wait
                        && failure.timed_out
                        && self.inner.accepting(authority) =>
                {
                    *waiting = true;
                    tracing::debug!(%authority, "connect timed out while the upstream serves others: its backlog is full, connecting again");
                    tokio::time::sleep_until(started + BACKLOG_RETRY_SPACING).await;
                }
                Err(failure) => return Err(failure),
            }
            if let Some(pooled) = self.checkout(authority, identity) {
                *waiting = false;
                return Ok((pooled, true));
            }
        }
    }

    /// Sends `req` (origin-form URI, `Host` set) to `authority` — over mutual TLS to a peer that
    /// must prove `identity`, when one is given — on an idle connection if one is pooled (one
    /// found closed before the request left is skipped), treating a backlogged upstream as
    /// `backlog` says (see [`Pool::connection`] for `waiting`). Given up at `deadline`, the
    /// response head not in: [`Expired`]. A warm connection's exchange keeps the deadline on the
    /// connection's own timer, which each request moves on — an atomic store while the
    /// deadlines only get later — rather than putting a new timer in the runtime's wheel and
    /// taking it out again for every request (`docs/perf-levers.md`).
    async fn send_within(
        &self,
        mut req: Request<ReachBody>,
        authority: &str,
        identity: Option<&Expected>,
        backlog: Backlog,
        waiting: &mut bool,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Result<Response<UpstreamBody>, Failure>, Expired> {
        loop {
            let found = match self.checkout(authority, identity) {
                Some(pooled) => {
                    *waiting = false;
                    Ok((pooled, true))
                }
                // Boxed: dialling (TCP, TLS, the handshake) is rare on a warm pool, and its
                // future would otherwise add its size to every request's.
                None => {
                    let connecting =
                        Box::pin(self.connection(authority, identity, backlog, waiting));
                    match deadline {
                        Some(at) => tokio::time::timeout_at(at, connecting)
                            .await
                            .map_err(|_| Expired)?,
                        None => connecting.await,
                    }
                }
            };
            let (pooled, reused) = match found {
                Ok(found) => found,
                Err(failure) => return Ok(Err(failure)),
            };
            let mut pooled = Some(pooled);
            let failure = match exchange(&mut pooled, req, deadline).await {
                Ok(response) => {
                    let lease = pooled.take().map(|pooled| Lease {
                        pool: self.clone(),
                        authority: authority.into(),
                        pooled,
                    });
                    return Ok(Ok(
                        response.map(|incoming| UpstreamBody::new(incoming, lease, None))
                    ));
                }
                Err(Unsent(back)) if reused => {
                    // A stale pooled connection: the request never left. Try the next.
                    req = back;
                    continue;
                }
                Err(Unsent(_)) => Failure::connect(CLOSED_UNSENT.to_owned()),
                Err(Sent(err)) => Failure {
                    connect: false,
                    refused: false,
                    timed_out: false,
                    message: client::chain(&err),
                },
                Err(TimedOut) => return Err(Expired),
            };
            return Ok(Err(failure));
        }
    }
}

/// The call's deadline passed before its response head was in.
#[derive(Debug)]
struct Expired;

/// A request that failed: given back unsent, or lost after it was written.
#[allow(clippy::large_enum_variant)] // moved once, on a failure; boxing would allocate to retry
enum SendFailure {
    Unsent(Request<ReachBody>),
    Sent(hyper::Error),
    /// The deadline passed first: the connection, mid-exchange, is dropped with the call.
    TimedOut,
}
use SendFailure::{Sent, TimedOut, Unsent};

/// One request on one connection, up to the response head or `deadline`: polls the connection
/// and the response promise in the caller's task. The connection is dropped (`None`) once it has
/// closed.
async fn exchange(
    pooled: &mut Option<Pooled>,
    req: Request<ReachBody>,
    deadline: Option<tokio::time::Instant>,
) -> Result<Response<Incoming>, SendFailure> {
    let Some(conn) = pooled.as_mut() else {
        return Err(Unsent(req));
    };
    if let Some(at) = deadline {
        conn.timer.as_mut().reset(at);
    }
    let mut sending = std::pin::pin!(conn.tx.try_send_request(req));
    let Pooled {
        wakes,
        conn: io,
        timer,
        ..
    } = conn;
    // Kept here, not passed out through the loop: a response or a request given back is ~250
    // bytes, and each hop out would copy it.
    let mut answer = None;
    std::future::poll_fn(|cx| {
        // The connection first: it writes the request, reads the response and fulfils the
        // promise, all in this poll.
        let polled = wakes.drive(cx, |inner| {
            if io
                .as_mut()
                .is_some_and(|c| c.as_mut().poll(inner).is_ready())
            {
                // Closed (or failed): dropped, which fulfils the promise with the error.
                *io = None;
            }
            sending
                .as_mut()
                .poll(inner)
                .map(|result| answer = Some(result))
        });
        // The deadline's timer, while the connection lives: one that closed mid-exchange has
        // already fulfilled the promise with its error.
        if polled.is_pending() && io.is_some() && deadline.is_some() {
            return timer.as_mut().poll(cx);
        }
        polled
    })
    .await;
    if pooled.as_ref().is_some_and(|p| p.conn.is_none()) {
        *pooled = None;
    }
    match answer {
        Some(Ok(response)) => Ok(response),
        Some(Err(mut err)) => Err(match err.take_message() {
            Some(req) => Unsent(req),
            None => Sent(err.into_error()),
        }),
        None => Err(TimedOut),
    }
}

/// An HTTP/2 stream's claim on its connection, held by the response body (or the request until
/// the response head): the count of requests in flight falls when it is dropped. Here, not in
/// `h2`, which makes the bodies that hold it.
struct Slot(Arc<h2::Conn>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.stream_ended();
    }
}

impl Pooled {
    /// Polls the connection with a waker that wakes nobody; ready when it has closed.
    fn poll_noop(&mut self) -> Poll<()> {
        let mut cx = Context::from_waker(Waker::noop());
        match self.conn.as_mut() {
            Some(conn) => conn.as_mut().poll(&mut cx).map(|_| ()),
            None => Poll::Ready(()),
        }
    }
}

/// Rewrites `req` for `authority` and sends it (over mutual TLS to a peer that must prove
/// `identity`, when one is given); gives up on the response headers after `timeout`. `target`
/// names the upstream in errors (formatted only on failure).
pub(crate) fn forward<'a>(
    pool: &'a Pool,
    req: Request<ReachBody>,
    authority: &'a str,
    identity: Option<&'a Expected>,
    target: &'a (dyn fmt::Display + Sync),
    timeout: Duration,
) -> impl std::future::Future<Output = Result<Response<UpstreamBody>, ReachError>> + Send + 'a {
    // Not an `async fn`: a level that only awaits another keeps a second copy of its arguments.
    forward_with(
        pool,
        req,
        authority,
        identity,
        target,
        timeout,
        Backlog::Fail,
    )
}

/// [`forward`], treating an upstream whose listen backlog is full as `backlog` says: with
/// [`Backlog::Wait`], time that runs out still waiting for it to accept is
/// [`ReachError::Backlogged`] (load), not a timeout.
pub(crate) async fn forward_with(
    pool: &Pool,
    mut req: Request<ReachBody>,
    authority: &str,
    identity: Option<&Expected>,
    target: &(dyn fmt::Display + Sync),
    timeout: Duration,
    backlog: Backlog,
) -> Result<Response<UpstreamBody>, ReachError> {
    // Origin-form: inbound intake already refused anything that is not a path; an absolute-form
    // request keeps only its path (the authority is ours to choose, never the caller's).
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        *req.uri_mut() = Uri::from(path_of(req.uri()));
    }
    if !req.uri().path().starts_with('/') {
        return Err(ReachError::BadRequest(format!(
            "request target `{}` is not a path",
            req.uri()
        )));
    }
    *req.version_mut() = Version::HTTP_11;
    req.headers_mut()
        .insert(header::HOST, host_header(authority, identity));
    let mut waiting = false;
    // None: so far off that it never comes.
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    let sent = if pool.via_h2(identity) {
        // Boxed: an HTTP/1 pool's requests should not carry the HTTP/2 path's future.
        let send = Box::pin(pool.send_h2(req, authority, identity));
        match deadline {
            Some(at) => tokio::time::timeout_at(at, send).await.map_err(|_| Expired),
            None => Ok(send.await),
        }
    } else {
        pool.send_within(req, authority, identity, backlog, &mut waiting, deadline)
            .await
    };
    match sent {
        Ok(Ok(mut response)) => {
            headers::strip_hop_by_hop(response.headers_mut());
            Ok(response)
        }
        Ok(Err(failure)) => {
            let (target, message) = (target.to_string(), failure.message);
            Err(if failure.connect {
                ReachError::UpstreamConnect {
                    target,
                    message,
                    refused: failure.refused,
                }
            } else {
                ReachError::Upstream { target, message }
            })
        }
        Err(_) if waiting => Err(ReachError::Backlogged {
            target: target.to_string(),
            after: timeout,
        }),
        Err(_) => Err(ReachError::Timeout {
            target: target.to_string(),
            after: timeout,
        }),
    }
}

/// The `Host` of a request to `authority`: an `https://` target's is its endpoint's, without
/// the default port.
fn host_header(authority: &str, identity: Option<&Expected>) -> http::HeaderValue {
    match identity {
        Some(Expected::Server(tls)) => tls.host_header().clone(),
        _ => headers::value(authority),
    }
}

/// Names an upstream in errors, formatted only when one happens.
pub(crate) struct Named<F>(pub(crate) F);

impl<F> fmt::Debug for Named<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Named")
    }
}

impl<F: Fn(&mut fmt::Formatter<'_>) -> fmt::Result> fmt::Display for Named<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.0)(f)
    }
}

/// A request target's path and query, `/` when it has none.
fn path_of(uri: &Uri) -> PathAndQuery {
    uri.path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"))
}

/// Why a request a new connection gave back unsent failed.
const CLOSED_UNSENT: &str = "the new connection closed before the request was sent";

/// A transport that could not connect: refused when nothing listens there.
fn connect_failure(err: &(dyn std::error::Error + 'static)) -> Failure {
    Failure {
        connect: true,
        refused: client::refused(err),
        timed_out: client::timed_out(err),
        message: format!("connect error: {}", client::chain(err)),
    }
}

#[cfg(test)]
mod tests;
