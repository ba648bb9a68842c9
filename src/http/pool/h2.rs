//! HTTP/2 to peer sidecars (`pool.peer_protocol: http2`) and to `https://` targets whose server
//! picks `h2` by ALPN: one multiplexed connection per address and identity, another only while
//! one has [`MAX_STREAMS`] requests in flight.
//!
//! Unlike the HTTP/1.1 connections of the parent module, an HTTP/2 connection is shared by
//! requests on many tasks at once, so it runs in a task of its own (hyper's `http2` client
//! connection) and requests reach it through `SendRequest`, a cheap clone. Plaintext peers get
//! prior knowledge (the connection preface at once); over TLS (mutual to a peer, to a target's
//! server) the client offers ALPN `h2` then `http/1.1`, and a server that picked `http/1.1` gets
//! the HTTP/1.1 pool for that address (re-asked after [`H1_RECHECK`]: the callee may be upgraded
//! meanwhile). A plain `http://` target never comes here (`Pool::via_h2`).
//!
//! Failures keep the parent's meaning: a connection that could not be made, a request the peer
//! refused before running it (`REFUSED_STREAM`, or a stream above a graceful `GOAWAY`'s last),
//! and a request given back unsent by a connection that closed are `connect` failures —
//! retried on another peer; a stream that broke after it may have run is not.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme};
use http::{header, HeaderMap, Request, Response, Uri, Version};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::{client, Failure, Live, Map, Pool, Slot, UpstreamBody};
use crate::http::{headers, ReachBody};
use crate::transport::Expected;

/// Requests in flight on one connection before the pool opens another to the same peer: below
/// the streams a sidecar's inbound allows (hyper's default, 200), so a request never waits in
/// the connection for a stream to free up.
pub(super) const MAX_STREAMS: usize = 100;

/// An address whose TLS server picked `http/1.1` is asked again after this long.
const H1_RECHECK: Duration = Duration::from_secs(60);

/// The HTTP/2 side of a pool.
pub(super) struct H2 {
    builder: http2::Builder<TokioExecutor>,
    conns: Mutex<Map<Vec<Arc<Conn>>>>,
    /// One connect at a time per address: concurrent first calls share the connection it makes.
    gates: Mutex<Map<Arc<tokio::sync::Mutex<()>>>>,
    /// Addresses whose server picked `http/1.1`, and since when.
    h1: Mutex<Map<Instant>>,
}

/// One HTTP/2 connection and the requests in flight on it.
pub(super) struct Conn {
    /// The identity the peer proved in the TLS handshake; `None` in plaintext.
    identity: Option<Expected>,
    tx: http2::SendRequest<ReachBody>,
    streams: AtomicUsize,
    /// When the last stream ended (idle expiry).
    quiet_since: Mutex<Instant>,
    _live: Arc<Live>,
}

impl Conn {
    /// A stream on it ended (its `Slot` was dropped).
    pub(super) fn stream_ended(&self) {
        if self.streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.quiet_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        }
    }
}

/// What a new connection turned out to speak.
enum Opened {
    H2(Slot),
    /// The TLS server picked `http/1.1`: the connection is in the HTTP/1.1 idle pool.
    H1,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl H2 {
    pub(super) fn new() -> Self {
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            // A peer that vanished without closing is noticed (TCP keepalive also runs).
            .keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(false)
            .initial_max_send_streams(MAX_STREAMS);
        Self {
            builder,
            conns: Mutex::new(Map::default()),
            gates: Mutex::new(Map::default()),
            h1: Mutex::new(Map::default()),
        }
    }

    /// A stream on an open connection to `authority` that proved `identity`, if one has room.
    fn checkout(&self, authority: &str, identity: Option<&Expected>) -> Option<Slot> {
        let mut map = lock(&self.conns);
        let list = map.get_mut(authority)?;
        if list.iter().any(|c| c.tx.is_closed()) {
            list.retain(|c| !c.tx.is_closed());
        }
        let conn = list.iter().find(|c| {
            c.identity.as_ref() == identity && c.streams.load(Ordering::Acquire) < MAX_STREAMS
        })?;
        conn.streams.fetch_add(1, Ordering::AcqRel);
        Some(Slot(conn.clone()))
    }

    /// Whether `authority`'s TLS server picked `http/1.1` recently.
    fn speaks_h1(&self, authority: &str) -> bool {
        let h1 = lock(&self.h1);
        if h1.is_empty() {
            return false;
        }
        h1.get(authority)
            .is_some_and(|at| at.elapsed() < H1_RECHECK)
    }

    fn gate(&self, authority: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = lock(&self.gates);
        match gates.get(authority) {
            Some(gate) => gate.clone(),
            None => gates.entry(authority.into()).or_default().clone(),
        }
    }

    /// Closes connections with no stream for `idle_timeout` and forgets closed ones (the
    /// parent's sweeper).
    pub(super) fn sweep(&self, idle_timeout: Duration) {
        let mut map = lock(&self.conns);
        for list in map.values_mut() {
            list.retain(|c| {
                !c.tx.is_closed()
                    && (c.streams.load(Ordering::Acquire) > 0
                        || lock(&c.quiet_since).elapsed() < idle_timeout)
            });
        }
        map.retain(|_, list| !list.is_empty());
        let authorities: Vec<Box<str>> = lock(&self.gates)
            .keys()
            .filter(|a| !map.contains_key(*a))
            .cloned()
            .collect();
        drop(map);
        let mut gates = lock(&self.gates);
        for authority in authorities {
            // Held only by a connect under way.
            if gates
                .get(&authority)
                .is_some_and(|g| Arc::strong_count(g) == 1)
            {
                gates.remove(&authority);
            }
        }
        drop(gates);
        lock(&self.h1).retain(|_, at| at.elapsed() < H1_RECHECK);
    }
    /// Open HTTP/2 connections (all addresses).
    #[cfg(test)]
    pub(super) fn open_count(&self) -> usize {
        lock(&self.conns).values().map(Vec::len).sum()
    }
}

impl Pool {
    /// [`Pool::send_within`] over HTTP/2: on a stream of a connection to `authority`, opened if none
    /// has room. `req` comes as [`super::forward_with`] made it (origin-form, `Host`, HTTP/1.1).
    pub(super) async fn send_h2(
        &self,
        mut req: Request<ReachBody>,
        authority: &str,
        identity: Option<&Expected>,
    ) -> Result<Response<UpstreamBody>, Failure> {
        let h2 = &self.inner.h2;
        if h2.speaks_h1(authority) {
            return self.send_h1(req, authority, identity).await;
        }
        match identity {
            // `:scheme` and `:authority` as the target's server knows itself (as its `Host`).
            Some(Expected::Server(tls)) => {
                let shown = tls.host_header().to_str().unwrap_or(authority);
                h2_form(&mut req, &Scheme::HTTPS, shown)?;
            }
            _ => h2_form(&mut req, self.scheme(), authority)?,
        }
        loop {
            let (slot, reused) = match h2.checkout(authority, identity) {
                Some(slot) => (slot, true),
                None => match self.open_h2(authority, identity).await? {
                    (Opened::H2(slot), reused) => (slot, reused),
                    (Opened::H1, _) => {
                        h1_form(&mut req, authority, identity);
                        return self.send_h1(req, authority, identity).await;
                    }
                },
            };
            let mut tx = slot.0.tx.clone();
            match tx.try_send_request(req).await {
                Ok(response) => {
                    return Ok(
                        response.map(|incoming| UpstreamBody::new(incoming, None, Some(slot)))
                    )
                }
                Err(mut err) => match err.take_message() {
                    // The connection had closed: the request never left. Try the next.
                    Some(back) if reused => req = back,
                    Some(_) => return Err(Failure::connect(super::CLOSED_UNSENT.to_owned())),
                    None => return Err(sent_failure(&err.into_error())),
                },
            }
        }
    }

    /// The HTTP/1.1 pool's send, for an address whose server did not pick `h2`. Its deadline is
    /// the caller's, around the whole h2 send.
    async fn send_h1(
        &self,
        req: Request<ReachBody>,
        authority: &str,
        identity: Option<&Expected>,
    ) -> Result<Response<UpstreamBody>, Failure> {
        let mut waiting = false;
        let send = self.send_within(
            req,
            authority,
            identity,
            super::Backlog::Fail,
            &mut waiting,
            None,
        );
        match Box::pin(send).await {
            Ok(sent) => sent,
            // Only with a deadline, which this has not.
            Err(super::Expired) => Err(Failure {
                connect: false,
                refused: false,
                timed_out: true,
                message: "timed out".to_owned(),
            }),
        }
    }

    /// A stream on a connection to `authority` opened now, or on one another call opened
    /// meanwhile (then `true`).
    async fn open_h2(
        &self,
        authority: &str,
        identity: Option<&Expected>,
    ) -> Result<(Opened, bool), Failure> {
        let h2 = &self.inner.h2;
        let gate = h2.gate(authority);
        let _connecting = gate.lock().await;
        if let Some(slot) = h2.checkout(authority, identity) {
            return Ok((Opened::H2(slot), true));
        }
        // The call that held the gate found a server that picked `http/1.1`.
        if h2.speaks_h1(authority) {
            return Ok((Opened::H1, false));
        }
        let (io, speaks_h2) = self.dial(authority, identity).await?;
        if !speaks_h2 {
            let pooled = self.handshake_h1(io, authority, identity).await?;
            lock(&h2.h1).insert(authority.into(), Instant::now());
            self.release(authority, pooled);
            return Ok((Opened::H1, false));
        }
        let (tx, conn) = h2
            .builder
            .handshake(io)
            .await
            .map_err(|err| Failure::connect(client::chain(&err)))?;
        let target: Box<str> = authority.into();
        tokio::spawn(async move {
            if let Err(err) = conn.await {
                tracing::debug!(upstream = %target, %err, "HTTP/2 connection ended");
            }
        });
        let conn = Arc::new(Conn {
            identity: identity.cloned(),
            tx,
            streams: AtomicUsize::new(1),
            quiet_since: Mutex::new(Instant::now()),
            _live: self.inner.connected(authority),
        });
        {
            let mut map = lock(&h2.conns);
            match map.get_mut(authority) {
                Some(list) => list.push(conn.clone()),
                None => {
                    map.insert(authority.into(), vec![conn.clone()]);
                }
            }
        }
        self.sweep_later();
        Ok((Opened::H2(Slot(conn)), false))
    }
}

/// A request as HTTP/2 sends it: the authority in the URI (`:authority`, `:scheme`) instead of
/// `Host`, and no connection-specific header (RFC 9113 §8.2.2; hyper would drop them with a
/// warning each).
fn h2_form(req: &mut Request<ReachBody>, scheme: &Scheme, authority: &str) -> Result<(), Failure> {
    let path = super::path_of(req.uri());
    let authority = Authority::try_from(authority)
        .map_err(|err| Failure::connect(format!("bad upstream address `{authority}`: {err}")))?;
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(scheme.clone());
    parts.authority = Some(authority);
    parts.path_and_query = Some(path);
    *req.uri_mut() = Uri::from_parts(parts).map_err(|err| Failure::connect(err.to_string()))?;
    *req.version_mut() = Version::HTTP_2;
    strip_connection_specific(req.headers_mut());
    Ok(())
}

/// Removes what HTTP/2 forbids in a request: `Host` (the URI carries it), the hop-by-hop
/// headers, and `te` other than exactly `trailers` (`strip_hop_by_hop` keeps any case of it).
fn strip_connection_specific(headers: &mut HeaderMap) {
    headers.remove(header::HOST);
    headers::strip_hop_by_hop(headers);
    if headers.get(header::TE).is_some_and(|te| te != "trailers") {
        headers.remove(header::TE);
    }
}

/// Back from [`h2_form`] to what the HTTP/1.1 pool sends.
fn h1_form(req: &mut Request<ReachBody>, authority: &str, identity: Option<&Expected>) {
    *req.uri_mut() = Uri::from(super::path_of(req.uri()));
    *req.version_mut() = Version::HTTP_11;
    req.headers_mut()
        .insert(header::HOST, super::host_header(authority, identity));
}

/// What a stream error after the request left means: a peer that refused the stream before
/// running it (`REFUSED_STREAM`, RFC 9113 §8.7) or that is going away and never took it (a
/// graceful `GOAWAY` whose last stream is below it) is retried elsewhere like a refused
/// connection; anything else may have run.
fn sent_failure(err: &hyper::Error) -> Failure {
    let unprocessed = find_h2(err).is_some_and(|h2| {
        h2.reason() == Some(::h2::Reason::REFUSED_STREAM)
            || (h2.is_go_away() && h2.is_remote() && h2.reason() == Some(::h2::Reason::NO_ERROR))
    });
    Failure {
        connect: unprocessed,
        refused: false,
        timed_out: false,
        message: client::chain(err),
    }
}

fn find_h2<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a ::h2::Error> {
    let mut source = Some(err);
    while let Some(err) = source {
        if let Some(h2) = err.downcast_ref::<::h2::Error>() {
            return Some(h2);
        }
        source = err.source();
    }
    None
}

/// Requests in flight on the pool's HTTP/2 connections (tests).
#[cfg(test)]
pub(super) fn streams_of(pool: &Pool) -> usize {
    lock(&pool.inner.h2.conns)
        .values()
        .flatten()
        .map(|c| c.streams.load(Ordering::Acquire))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PeerProtocol;
    use crate::http::body;
    use crate::http::pool::{forward, PoolConfig};
    use http_body_util::BodyExt;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use std::net::SocketAddr;

    /// An upstream serving HTTP/1.1 and HTTP/2 (as a sidecar's inbound), answering each request
    /// with its version after `hold`; counts connections.
    async fn upstream(hold: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req: Request<Incoming>| async move {
                            let answer = format!("{:?} {}", req.version(), req.uri().path());
                            let _ = req.into_body().collect().await;
                            tokio::time::sleep(hold).await;
                            Ok::<_, std::convert::Infallible>(Response::new(body::full(answer)))
                        });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    fn pool() -> Pool {
        let tcp = crate::transport::ConnectTcp::new(crate::transport::TcpSettings {
            connect_timeout: Duration::from_secs(2),
            keepalive: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(5),
            keepalive_retries: 3,
        });
        Pool::new(
            PoolConfig {
                idle_timeout: Duration::from_secs(5),
                max_idle_per_host: 4,
                protocol: PeerProtocol::Http2,
            },
            tcp,
        )
    }

    async fn get(pool: &Pool, addr: SocketAddr) -> Option<String> {
        let req = Request::get("/x")
            .header(header::CONNECTION, "keep-alive")
            .body(body::empty())
            .ok()?;
        let authority = addr.to_string();
        let response = forward(pool, req, &authority, None, &"test", Duration::from_secs(5))
            .await
            .ok()?;
        let bytes = response.into_body().collect().await.ok()?.to_bytes();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_connection_and_free_their_streams() {
        let (addr, accepted) = upstream(Duration::from_millis(50)).await;
        let pool = pool();
        let calls: Vec<_> = (0..32)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { get(&pool, addr).await })
            })
            .collect();
        for call in calls {
            let answer = call.await.ok().flatten();
            assert_eq!(answer.as_deref(), Some("HTTP/2.0 /x"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.h2_count(), 1);
        assert_eq!(streams_of(&pool), 0);
    }

    #[tokio::test]
    async fn past_the_stream_limit_another_connection_opens() {
        let (addr, accepted) = upstream(Duration::from_millis(300)).await;
        let pool = pool();
        let calls: Vec<_> = (0..MAX_STREAMS + 1)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { get(&pool, addr).await })
            })
            .collect();
        for call in calls {
            assert!(call.await.ok().flatten().is_some());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn connection_specific_headers_are_stripped() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::HOST,
            "a:1".parse().unwrap_or_else(|e| panic!("{e}")),
        );
        headers.insert(
            header::CONNECTION,
            "keep-alive, x-hop"
                .parse()
                .unwrap_or_else(|e| panic!("{e}")),
        );
        headers.insert("x-hop", "1".parse().unwrap_or_else(|e| panic!("{e}")));
        headers.insert(
            "keep-alive",
            "timeout=5".parse().unwrap_or_else(|e| panic!("{e}")),
        );
        headers.insert(header::TE, "gzip".parse().unwrap_or_else(|e| panic!("{e}")));
        headers.insert(
            "reach-capability",
            "c".parse().unwrap_or_else(|e| panic!("{e}")),
        );
        strip_connection_specific(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        let mut trailers = HeaderMap::new();
        trailers.insert(
            header::TE,
            "trailers".parse().unwrap_or_else(|e| panic!("{e}")),
        );
        strip_connection_specific(&mut trailers);
        assert_eq!(trailers.len(), 1);
    }
}
