//! HTTP/2 between sidecars (`pool.peer_protocol: http2`): a caller speaking HTTP/2 reaches
//! callees in plaintext (prior knowledge) and over mutual TLS (ALPN), shares one connection per
//! peer between concurrent calls, falls back to HTTP/1.1 on a TLS server that does not pick
//! `h2`, retries a stream the peer refused (or never took before going away) on another peer,
//! and streams SSE. The callee keeps serving HTTP/1.1 callers alongside.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_reach::config::{ConfigPaths, MtlsMode, PeerProtocol, Policy, TlsFiles};
use agent_reach::identity::SpiffeId;
use agent_reach::pki::DevCa;
use agent_reach::transport::mtls::MeshTls;
use agent_reach::{Bootstrap, Sidecar};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use support::*;

use testkit::MockConfig;

const TRUST_DOMAIN: &str = "spiffe://test.example";

fn id(sa: &str) -> String {
    format!("{TRUST_DOMAIN}/ns/agents/sa/{sa}")
}

fn policy(protocol: PeerProtocol, mode: Option<MtlsMode>) -> Policy {
    let mut p = Policy::default();
    p.pool.peer_protocol = protocol;
    p.mtls.mode = mode;
    p
}

async fn start(bootstrap: Bootstrap, policy: Policy) -> Sidecar {
    sidecar_with(bootstrap, policy, ConfigPaths::default()).await
}

/// A caller that knows each `(name, inbound)` as a peer serving the test capability.
fn caller_bootstrap(peers: &[(&str, SocketAddr)]) -> Bootstrap {
    let mut b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    for (name, inbound) in peers {
        b = b.with_peer(name, *inbound, &[CAP]).unwrap();
    }
    b
}

async fn metrics(s: &Sidecar) -> String {
    get(&client(), &format!("http://{}/metrics", s.addrs.admin))
        .await
        .body
}

/// Connections the callee's inbound listener accepted so far.
async fn inbound_connections(callee: &Sidecar) -> f64 {
    sum(
        &metrics(callee).await,
        "reach_connections_total{",
        "listener=\"inbound\"",
    )
}

/// A CA and a scratch directory for this test's certificate files.
struct Pki {
    ca: DevCa,
    dir: PathBuf,
}

impl Pki {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("agent-reach-h2-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self {
            ca: DevCa::new(&format!("test CA {tag}")).unwrap(),
            dir,
        }
    }

    fn files(&self, who: &str, spiffe_id: &str) -> TlsFiles {
        self.ca.write_files(&self.dir.join(who), spiffe_id).unwrap()
    }
}

#[tokio::test]
async fn concurrent_calls_share_one_connection_and_the_callee_still_serves_http1_callers() {
    let agent = mock(MockConfig::new("coder-1")).await;
    // The callee runs with the defaults (an HTTP/1.1 peer pool of its own).
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let peers = [("coder-1", callee.addrs.inbound)];
    let h2 = start(caller_bootstrap(&peers), policy(PeerProtocol::Http2, None)).await;
    let url = format!("http://{}/review", h2.addrs.outbound);
    for call in spawn_posts(32, &url, &[("reach-capability", CAP)], "x = 1") {
        let reply = call.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.json()["agent"], "coder-1");
    }
    // The caller's reads of the callee's self-view share it too.
    assert_eq!(
        inbound_connections(&callee).await,
        1.0,
        "32 concurrent calls over HTTP/2 share one connection"
    );

    // An HTTP/1.1 caller (a sidecar not yet switched) is served by the same callee.
    let h1 = start(caller_bootstrap(&peers), Policy::default()).await;
    let url = format!("http://{}/review", h1.addrs.outbound);
    for call in spawn_posts(4, &url, &[("reach-capability", CAP)], "x = 1") {
        assert_eq!(call.await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn sse_events_stream_over_http2_before_the_stream_ends() {
    let mut config = MockConfig::new("coder-1");
    config.sse_events = 2;
    config.sse_interval = Duration::from_secs(30);
    let agent = mock(config).await;
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let caller = start(
        caller_bootstrap(&[("coder-1", callee.addrs.inbound)]),
        policy(PeerProtocol::Http2, None),
    )
    .await;
    let request = http::Request::get(format!("http://{}/sse", caller.addrs.outbound))
        .header("reach-capability", CAP)
        .body(agent_reach::http::body::empty())
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first event arrives long before the stream ends")
        .expect("a frame")
        .expect("no error");
    let text = String::from_utf8_lossy(first.data_ref().expect("data frame")).into_owned();
    assert!(text.contains("\"n\":0"), "{text}");
    assert_eq!(callee.status().load.in_flight, 1);

    // And a large upload streams the other way.
    let big = "x".repeat(3 * 1024 * 1024);
    let url = format!("http://{}/review", caller.addrs.outbound);
    let reply = send(&client(), "POST", &url, &[("reach-capability", CAP)], &big).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["received_bytes"], big.len());
}

#[tokio::test]
async fn over_mutual_tls_h2_is_negotiated_and_the_identity_is_checked() {
    let pki = Pki::new("alpn");
    let (agent, seen) = echo_agent().await;
    let coder = id("coder");
    let mut b = Bootstrap::local("coder-1", agent, &[CAP]).unwrap();
    b.tls = Some(pki.files("coder", &coder));
    let callee = start(b, policy(PeerProtocol::Http1, Some(MtlsMode::Strict))).await;

    let mut b = caller_bootstrap(&[("coder-1", callee.addrs.inbound)]);
    b.peers[0].identity = Some(SpiffeId::parse(&coder).unwrap());
    b.tls = Some(pki.files("caller", &id("caller")));
    let caller = start(b, policy(PeerProtocol::Http2, Some(MtlsMode::Strict))).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    for call in spawn_posts(16, &url, &[("reach-capability", CAP)], "x = 1") {
        let reply = call.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert_eq!(inbound_connections(&callee).await, 1.0);
    let headers = seen.lock().unwrap().pop().expect("the agent saw the calls");
    assert_eq!(headers["reach-caller-identity"], id("caller").as_str());
    assert_eq!(headers["reach-caller"], "caller");

    // A caller expecting another identity at that address never gets a stream to it.
    let mut b = caller_bootstrap(&[("coder-1", callee.addrs.inbound)]);
    b.peers[0].identity = Some(SpiffeId::parse(&id("someone-else")).unwrap());
    b.tls = Some(pki.files("wary", &id("wary")));
    let wary = start(b, policy(PeerProtocol::Http2, Some(MtlsMode::Strict))).await;
    let calls = seen.lock().unwrap().len();
    let reply = call(&client(), wary.addrs.outbound).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert_eq!(seen.lock().unwrap().len(), calls, "the agent never saw it");
}

/// A TLS server with `coder`'s certificate that offers only ALPN `http/1.1` (a callee from
/// before HTTP/2) and answers `h1` over HTTP/1.1; counts connections.
async fn http1_only_tls_peer(files: TlsFiles) -> (SocketAddr, Arc<AtomicUsize>) {
    let tls = MeshTls::load(files).unwrap();
    let mut config = (*tls.current().strict).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let version = format!("{:?}", req.version());
                        let _ = req.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            bytes::Bytes::from(version),
                        )))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_tls_peer_that_does_not_pick_h2_gets_http1() {
    let pki = Pki::new("fallback");
    let coder = id("coder");
    let (peer, accepted) = http1_only_tls_peer(pki.files("coder", &coder)).await;
    let mut b = caller_bootstrap(&[("coder-1", peer)]);
    b.peers[0].identity = Some(SpiffeId::parse(&coder).unwrap());
    b.tls = Some(pki.files("caller", &id("caller")));
    let caller = start(b, policy(PeerProtocol::Http2, Some(MtlsMode::Strict))).await;
    for _ in 0..3 {
        let reply = call(&client(), caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body, "HTTP/1.1");
    }
    // One after another: the fallback connection is pooled and reused (the caller's read of
    // the peer's self-view may have opened a second meanwhile).
    assert!(accepted.load(Ordering::SeqCst) <= 2);
}

/// How a fake HTTP/2 peer turns a request away.
#[derive(Clone, Copy)]
enum TurnAway {
    /// `RST_STREAM(REFUSED_STREAM)`: not processed (RFC 9113 §8.7).
    RefuseStream,
    /// `GOAWAY(NO_ERROR)` before taking any stream: a peer going away.
    GoAway,
}

/// An HTTP/2 peer that turns every request away as `how`; counts the requests it saw and the
/// connections it accepted.
async fn turning_away(how: TurnAway) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                match how {
                    TurnAway::GoAway => {
                        count.fetch_add(1, Ordering::SeqCst);
                        conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                        while conn.accept().await.is_some() {}
                        // The socket stays open (a peer draining, not one that crashed): the
                        // caller reads the GOAWAY rather than a reset.
                        std::future::pending::<()>().await;
                        drop(conn);
                    }
                    TurnAway::RefuseStream => {
                        while let Some(Ok((_req, mut respond))) = conn.accept().await {
                            count.fetch_add(1, Ordering::SeqCst);
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

async fn turned_away_calls_move_to_another_peer(how: TurnAway) {
    let agent = mock(MockConfig::new("coder-1")).await;
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let (bad, seen) = turning_away(how).await;
    let caller = start(
        caller_bootstrap(&[("bad", bad), ("coder-1", callee.addrs.inbound)]),
        policy(PeerProtocol::Http2, None),
    )
    .await;
    // Until a call tries the bad peer first (the caller's reads of the peers' self-views hit it
    // too): every call is answered by the good one, the turned-away one in a second attempt.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let reply = call(&client(), caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.json()["agent"], "coder-1");
        if reply.header("reach-attempts") == "2" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no call tried the bad peer"
        );
    }
    assert!(seen.load(Ordering::SeqCst) > 0);
}

#[tokio::test]
async fn a_refused_stream_is_retried_on_another_peer() {
    turned_away_calls_move_to_another_peer(TurnAway::RefuseStream).await;
}

#[tokio::test]
async fn a_peer_going_away_before_taking_the_stream_is_retried_on_another_peer() {
    turned_away_calls_move_to_another_peer(TurnAway::GoAway).await;
}
