//! An agent with a small listen backlog (Python's default 5) that accepts slowly: a burst of
//! calls through its sidecar is load, not an outage. The sidecar keeps its connections to the
//! agent within admission (`max_concurrency` plus the pool's idle set), and a connect that times
//! out while the agent is serving other connections (its accept queue is full) is waited out, never
//! answered `upstream_connect_failed` nor counted against the agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_reach::config::{ConfigPaths, Policy, PositiveCount};
use agent_reach::reach::State;
use agent_reach::Bootstrap;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use support::*;

/// The agent's listen backlog: Python's `socketserver` default.
const BACKLOG: u32 = 5;
/// Requests it works on at once; the rest wait inside it.
const WORKERS: usize = 4;
/// How long each request takes.
const SERVE: Duration = Duration::from_millis(50);
/// Its event loop is busy: one accept at a time, this long apart.
const ACCEPT_GAP: Duration = Duration::from_millis(5);
/// The callee's `agent.max_concurrency`.
const MAX_CONCURRENCY: usize = 16;
/// The callee's `pool.max_idle_per_host`.
const MAX_IDLE: usize = 4;
const BURST: usize = 64;

/// Connections the agent holds open now, the most it ever held, and requests it answered.
#[derive(Default)]
struct Seen {
    open: AtomicUsize,
    peak: AtomicUsize,
    served: AtomicUsize,
}

/// Counts a connection open for as long as it lives.
struct Open(Arc<Seen>);

impl Open {
    fn new(seen: &Arc<Seen>) -> Self {
        let now = seen.open.fetch_add(1, Ordering::SeqCst) + 1;
        seen.peak.fetch_max(now, Ordering::SeqCst);
        Self(seen.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A tiny HTTP/1.1 agent (keep-alive) on a listener with a backlog of [`BACKLOG`].
async fn slow_agent() -> (SocketAddr, Arc<Seen>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(any_port()).unwrap();
    let listener = socket.listen(BACKLOG).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let workers = Arc::new(tokio::sync::Semaphore::new(WORKERS));
    let counts = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let open = Open::new(&counts);
            let (workers, counts) = (workers.clone(), counts.clone());
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (workers, counts) = (workers.clone(), counts.clone());
                        async move {
                            let _ = req.into_body().collect().await;
                            let _worker = workers.acquire().await.unwrap();
                            tokio::time::sleep(SERVE).await;
                            counts.served.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                bytes::Bytes::from_static(b"ok"),
                            )))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                drop(open);
            });
            tokio::time::sleep(ACCEPT_GAP).await;
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_at_an_agent_with_a_small_backlog_is_load_not_an_outage() {
    let (addr, seen) = slow_agent().await;
    let mut bootstrap = Bootstrap::local("slow-agent", addr, &[CAP]).unwrap();
    bootstrap.agent.max_concurrency = PositiveCount::new(MAX_CONCURRENCY).unwrap();
    // Room for the whole burst to wait its turn: nothing here is shed by admission.
    bootstrap.agent.queue.capacity = BURST;
    bootstrap.agent.queue.max_wait = agent_reach::config::HumanDuration::from_secs(10);
    let mut policy = Policy::default();
    policy.pool.max_idle_per_host = MAX_IDLE;
    let callee = sidecar_with(bootstrap, policy, ConfigPaths::default()).await;
    let caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer("slow-agent", callee.addrs.inbound, &[CAP])
        .unwrap();
    let caller = sidecar(caller).await;

    let url = format!("http://{}/review", caller.addrs.outbound);
    let burst = spawn_posts(BURST, &url, &[("reach-capability", CAP)], "x");
    let (mut served, mut shed, mut other) = (0, 0, Vec::new());
    for reply in burst {
        let reply = reply.await.unwrap();
        match (reply.status.as_u16(), reply.header("reach-reason")) {
            (200, _) => served += 1,
            // What admission documents: every slot busy and the queue full (or waited out).
            (503, "saturated") => shed += 1,
            (status, reason) => other.push(format!("{status} {reason}: {}", reply.body)),
        }
    }
    let peak = seen.peak.load(Ordering::SeqCst);
    let status = callee.status();
    let ejections: Vec<_> = status
        .transitions
        .iter()
        .filter(|t| t.view == "self" && matches!(t.to, State::Ejected | State::Probation))
        .map(|t| format!("{:?} -> {:?} ({})", t.from, t.to, t.reason))
        .collect();
    eprintln!(
        "burst of {BURST}: {served} served, {shed} shed, {} other {other:?}; agent served {}, \
         peak connections {peak}; self state {:?}; transitions {ejections:?}",
        other.len(),
        seen.served.load(Ordering::SeqCst),
        status.self_view.state,
    );
    assert!(
        other.is_empty(),
        "the agent was up and would have served them: {other:?}"
    );
    assert_eq!(served + shed, BURST);
    assert!(served >= MAX_CONCURRENCY, "only {served} served");
    assert!(
        ejections.is_empty(),
        "a full accept queue is not a failing agent: {ejections:?}"
    );
    assert!(
        !matches!(status.self_view.state, State::Ejected | State::Probation),
        "{:?}",
        status.self_view.state
    );
    assert!(
        peak <= MAX_CONCURRENCY + MAX_IDLE,
        "the agent saw {peak} connections at once, more than admission's {MAX_CONCURRENCY} \
         plus {MAX_IDLE} idle"
    );
    // And the burst leaves nothing behind: the next calls are served.
    eventually(
        Duration::from_secs(5),
        "calls served after the burst",
        || async { call(&client(), caller.addrs.outbound).await.status == 200 },
    )
    .await;
}
