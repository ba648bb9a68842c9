//! Delegation chains, first-event deadlines and hedging, over real sockets: agents that
//! delegate through their own sidecars, passing `reach-chain` on like trace context.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use agent_reach::config::{parse_policy, Policy, TasksConfig};
use agent_reach::http::body;
use agent_reach::{Bootstrap, Sidecar};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use support::*;
use tokio::net::TcpListener;

use testkit::{Latency, MockConfig, Mode};

/// What a delegating agent does with the chain it was handed when it calls on.
#[derive(Clone, Copy, PartialEq)]
enum Pass {
    /// Passes it on unchanged, as an agent passes `traceparent`.
    Chain,
    /// Sends a chain of its own making instead: shorter, and not sealed by its sidecar.
    Forged,
    /// Passes it on, as an async task (`prefer: respond-async`).
    Async,
    /// Passes nothing on: most agent frameworks drop headers they do not know.
    Drop,
    /// Passes on the first chain it was ever handed, however old.
    Replay,
}

/// An agent that serves a call by calling `next` through its own sidecar while the call's
/// `x-depth` is above 0, and answers with what came back; at depth 0 it answers itself.
struct Delegator {
    addr: SocketAddr,
    outbound: Arc<OnceLock<SocketAddr>>,
    /// The `reach-chain` of every call it got.
    chains: Arc<Mutex<Vec<String>>>,
}

async fn delegator(name: &'static str, next: &'static str, pass: Pass) -> Delegator {
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let outbound: Arc<OnceLock<SocketAddr>> = Arc::default();
    let chains: Arc<Mutex<Vec<String>>> = Arc::default();
    let (out, seen) = (outbound.clone(), chains.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (out, seen) = (out.clone(), seen.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<_>| {
                    let (out, seen) = (out.clone(), seen.clone());
                    async move {
                        let answer = delegate(name, next, pass, &out, &seen, req).await;
                        Ok::<_, std::convert::Infallible>(answer)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Delegator {
        addr,
        outbound,
        chains,
    }
}

async fn delegate(
    name: &str,
    next: &str,
    pass: Pass,
    outbound: &OnceLock<SocketAddr>,
    seen: &Mutex<Vec<String>>,
    req: Request<hyper::body::Incoming>,
) -> Response<agent_reach::http::ReachBody> {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (chain, depth) = (header("reach-chain"), header("x-depth"));
    seen.lock().unwrap().push(chain.clone());
    let _ = req.into_body().collect().await;
    let depth: u32 = depth.parse().unwrap_or(0);
    if depth == 0 {
        let text = serde_json::json!({ "agent": name, "chain": chain }).to_string();
        return Response::new(body::full(text));
    }
    let depth = (depth - 1).to_string();
    let sent = match pass {
        Pass::Forged => "1;nobody".to_owned(),
        Pass::Replay => seen.lock().unwrap()[0].clone(),
        _ => chain,
    };
    let mut headers = vec![("reach-capability", next), ("x-depth", depth.as_str())];
    if pass != Pass::Drop {
        headers.push(("reach-chain", sent.as_str()));
    }
    if pass == Pass::Async {
        headers.push(("prefer", "respond-async"));
    }
    let url = format!("http://{}/work", outbound.get().unwrap());
    let reply = send(&client(), "POST", &url, &headers, "{}").await;
    let mut answer = Response::new(body::full(reply.body.clone()));
    *answer.status_mut() = reply.status;
    if let Some(reason) = reply.headers.get("reach-reason") {
        answer.headers_mut().insert("reach-reason", reason.clone());
    }
    answer
}

/// `user` (a sidecar with no agent) → `r1` serving `plan`, which delegates to `review` → `r2`
/// serving `review`, which delegates to `plan` (back to `r1`): a delegation loop in waiting.
struct Fleet {
    user: Sidecar,
    r1: Delegator,
    r2: Delegator,
    sidecars: Vec<Sidecar>,
}

fn policy(yaml: &str) -> Policy {
    parse_policy(Path::new("policy.yaml"), yaml).unwrap()
}

async fn fleet(yaml: &str, r1_passes: Pass, r2_passes: Pass, tasks: Option<&Path>) -> Fleet {
    fleet_keyed(yaml, (r1_passes, r2_passes), tasks, None).await
}

/// [`fleet`], every sidecar holding the gossip key `key` when given (no seeds: each alone in
/// gossip, the others known as static peers): the chains they send each other are signed.
async fn fleet_keyed(
    yaml: &str,
    (r1_passes, r2_passes): (Pass, Pass),
    tasks: Option<&Path>,
    key: Option<&Path>,
) -> Fleet {
    let policy = policy(yaml);
    let r1 = delegator("r1", "review", r1_passes);
    let r2 = delegator("r2", "plan", r2_passes);
    let (r1, r2) = (r1.await, r2.await);
    let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
    let start = |b: Bootstrap| {
        let b = match key {
            Some(key) => b.with_gossip(&[], key.to_path_buf()),
            None => b,
        };
        sidecar_with(b, policy.clone(), Default::default())
    };
    let user = start(Bootstrap::local("user", nowhere, &[]).unwrap()).await;
    let mut b1 = Bootstrap::local("r1", r1.addr, &["plan"]).unwrap();
    b1.tasks = tasks.map(|dir| TasksConfig::file(dir.join("tasks.db")));
    let s1 = start(b1).await;
    let s2 = start(Bootstrap::local("r2", r2.addr, &["review"]).unwrap()).await;
    // Each knows the others now that their ports are known (a reload, as gossip would).
    let with = |s: &Sidecar, peers: &[(&str, &Sidecar, &[&str])]| {
        let snapshot = s.store().snapshot();
        let mut b = snapshot.bootstrap.clone();
        for (name, peer, caps) in peers {
            b = b.with_peer(name, peer.addrs.inbound, caps).unwrap();
        }
        assert!(s.store().replace(b, snapshot.policy.clone()));
    };
    with(&user, &[("r1", &s1, &["plan"])]);
    with(&s1, &[("r2", &s2, &["review"]), ("user", &user, &[])]);
    with(&s2, &[("r1", &s1, &["plan"])]);
    r1.outbound.set(s1.addrs.outbound).unwrap();
    r2.outbound.set(s2.addrs.outbound).unwrap();
    Fleet {
        user,
        r1,
        r2,
        sidecars: vec![s1, s2],
    }
}

impl Fleet {
    /// `user` calls `plan` on `r1`, to be delegated `depth` more times.
    async fn plan(&self, depth: u32) -> Reply {
        let url = format!("http://{}/work", self.user.addrs.outbound);
        let depth = depth.to_string();
        let headers = [("reach-capability", "plan"), ("x-depth", depth.as_str())];
        send(&client(), "POST", &url, &headers, "{}").await
    }

    fn metrics(&self, n: usize) -> SocketAddr {
        self.sidecars[n].addrs.admin
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_to_b_to_a_is_refused_at_its_first_turn_with_508_naming_the_chain() {
    let fleet = fleet("{}", Pass::Chain, Pass::Chain, None).await;
    let reply = fleet.plan(5).await;
    assert_eq!(reply.status, 508, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "loop_detected");
    let body = reply.json();
    assert_eq!(body["chain"], "user > r1/plan > r2/review", "{body}");
    assert_eq!(body["hops"], 2);
    assert_eq!(fleet.r1.chains.lock().unwrap().len(), 1, "r1 entered once");
    // r2's sidecar refused it, and counted it.
    let metrics = get(&client(), &format!("http://{}/metrics", fleet.metrics(1))).await;
    assert_eq!(
        counter(&metrics.body, "reach_loops_refused_total{why=\"loop\"}"),
        1,
        "{}",
        metrics.body
    );
    assert_eq!(fleet.sidecars[1].status().chains.loops_refused, 1);
}

// An agent whose framework drops `reach-chain` while it serves one call: its sidecar continues
// that call's chain, so the loop is refused at its first turn all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_drops_the_chain_still_cannot_loop() {
    let fleet = fleet("{}", Pass::Drop, Pass::Drop, None).await;
    let reply = fleet.plan(12).await;
    assert_eq!(reply.status, 508, "{}", reply.body);
    assert_eq!(reply.json()["chain"], "user > r1/plan > r2/review");
    assert_eq!(fleet.r1.chains.lock().unwrap().len(), 1, "r1 entered once");
    assert_eq!(fleet.r2.chains.lock().unwrap().len(), 1, "r2 entered once");
}

// An agent that passes on an older chain it was handed (its call long over) is refused and
// counted: the value was bound to that call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_replays_an_old_chain_is_refused() {
    let yaml = "capabilities: { plan: { reentrant: true }, review: { reentrant: true } }";
    let fleet = fleet(yaml, Pass::Chain, Pass::Replay, None).await;
    // r2's first call: served at depth 0, so its chain's call ends with it.
    assert_eq!(fleet.plan(1).await.status, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let (reply, entered) = loop {
        let before = fleet.r1.chains.lock().unwrap().len();
        let reply = fleet.plan(6).await;
        if reply.status == 400 {
            break (reply, fleet.r1.chains.lock().unwrap().len() - before);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never refused: {}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(reply.body.contains("call that has ended"), "{}", reply.body);
    let metrics = get(&client(), &format!("http://{}/metrics", fleet.metrics(1))).await;
    assert!(
        counter(&metrics.body, "reach_loops_refused_total{why=\"replayed\"}") >= 1,
        "{}",
        metrics.body
    );
    assert_eq!(entered, 1, "cut at r2's first delegation: r1 entered once");
}

// With the mesh's key, a plaintext process on a peer's host that names itself that peer cannot
// plant a chain: an unsigned one is not read, and the agent's chain starts afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_caller_cannot_plant_a_chain_in_a_keyed_mesh() {
    let dir = std::env::temp_dir().join(format!("reach-chains-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("gossip.key");
    std::fs::write(&key, "cd".repeat(32)).unwrap();
    let fleet = fleet_keyed("{}", (Pass::Chain, Pass::Chain), None, Some(&key)).await;
    // Signed chains still travel between the sidecars: the loop is refused.
    let reply = fleet.plan(5).await;
    assert_eq!(reply.status, 508, "{}", reply.body);
    // "r1" (same host) plants `r2/review` on a call to r1's agent.
    let url = format!("http://{}/work", fleet.sidecars[0].addrs.inbound);
    let headers = [
        ("reach-capability", "plan"),
        ("reach-caller", "r2"),
        ("reach-chain", "3;x>r2/review>r1/plan"),
    ];
    let reply = send(&client(), "POST", &url, &headers, "{}").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let seen = fleet.r1.chains.lock().unwrap().last().cloned().unwrap();
    assert!(seen.starts_with("1;r2>r1/plan;"), "planted: {seen}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_capabilities_may_loop_within_max_hops() {
    let yaml = "capabilities: { plan: { reentrant: true }, review: { reentrant: true } }";
    let fleet = fleet(yaml, Pass::Chain, Pass::Chain, None).await;
    let reply = fleet.plan(3).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // The agent at the end of the chain was handed all of it: four hops.
    let chain = reply.json()["chain"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        chain.starts_with("4;user>r1/plan>r2/review>r1/plan>r2/review;"),
        "{chain}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_nine_is_refused_with_max_hops_eight_and_one_of_eight_passes() {
    let yaml = "chains: { max_hops: 8 }\n\
                capabilities: { plan: { reentrant: true }, review: { reentrant: true } }";
    let fleet = fleet(yaml, Pass::Chain, Pass::Chain, None).await;
    let eight = fleet.plan(7).await;
    assert_eq!(eight.status, 200, "{}", eight.body);
    let nine = fleet.plan(8).await;
    assert_eq!(nine.status, 508, "{}", nine.body);
    let body = nine.json();
    assert_eq!(body["hops"], 8, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("past 8 hops"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_chain_cannot_shorten_the_chain() {
    // An agent that makes up a short chain of its own: its sidecar refuses to pass it on.
    let fleet = fleet("{}", Pass::Chain, Pass::Forged, None).await;
    let reply = fleet.plan(5).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.contains("reach-chain"), "{}", reply.body);
    assert_eq!(fleet.r1.chains.lock().unwrap().len(), 1, "never re-entered");
    // A caller with no sidecar behind it cannot write one at the edge: it is rewritten.
    let url = format!("http://{}/work", fleet.sidecars[0].addrs.inbound);
    let headers = [("reach-capability", "plan"), ("reach-chain", "0;")];
    let reply = send(&client(), "POST", &url, &headers, "{}").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let chain = reply.json()["chain"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(chain.starts_with("1;->r1/plan;"), "{chain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_task_keeps_its_chain_across_the_queue() {
    let dir = std::env::temp_dir().join(format!("reach-chains-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // r1 hands `review` to r2 as an async task: its sidecar stores the call, a runner routes it.
    let fleet = fleet("{}", Pass::Async, Pass::Chain, Some(&dir)).await;
    let reply = fleet.plan(1).await;
    assert_eq!(reply.status, 202, "{}", reply.body);
    eventually(Duration::from_secs(10), "r2 ran the task", || async {
        !fleet.r2.chains.lock().unwrap().is_empty()
    })
    .await;
    let chain = fleet.r2.chains.lock().unwrap()[0].clone();
    assert!(
        chain.starts_with("2;user>r1/plan>r2/review;"),
        "the task's hop carried the chain: {chain}"
    );
    // The task shows the chain it was submitted in.
    let tasks = get(
        &client(),
        &format!("http://{}/reach/v1/tasks", fleet.sidecars[0].addrs.outbound),
    )
    .await
    .json();
    let chain = &tasks["tasks"][0]["chain"];
    assert_eq!(chain["agents"], "user > r1/plan", "{tasks}");
    assert_eq!(chain["hops"], 1, "{tasks}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A caller that knows `agents` (mock agents behind their sidecars) serving `CAP`.
async fn callers(agents: &[&testkit::MockAgent], yaml: &str) -> (Sidecar, Vec<Sidecar>) {
    let policy = policy(yaml);
    let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
    let mut caller = Bootstrap::local("caller", nowhere, &[]).unwrap();
    let mut callees = Vec::new();
    for agent in agents {
        let b = Bootstrap::local(agent.name(), agent.addr, &[CAP]).unwrap();
        let callee = sidecar_with(b, policy.clone(), Default::default()).await;
        caller = caller
            .with_peer(agent.name(), callee.addrs.inbound, &[CAP])
            .unwrap();
        callees.push(callee);
    }
    let caller = sidecar_with(caller, policy, Default::default()).await;
    (caller, callees)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_sends_its_head_is_left_after_first_event_timeout() {
    let mut hung = MockConfig::new("hung");
    hung.mode = Mode::Hang;
    let (hung, fine) = (mock(hung).await, mock(MockConfig::new("fine")).await);
    let yaml = "capabilities: { code-review: { first_event_timeout: 500ms } }";
    let (caller, _callees) = callers(&[&hung, &fine], yaml).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    // Until the hung peer has been tried (each pick is a coin toss while both look alike). A
    // GET is safe to repeat: it moves (a keyed call does not, below).
    for _ in 0..20 {
        let headers = [("reach-capability", CAP)];
        let began = Instant::now();
        let reply = send(&client(), "GET", &url, &headers, "").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "{:?}",
            began.elapsed()
        );
        if hung.stats().business > 0 {
            assert_eq!(reply.header("reach-attempts"), "2");
            return;
        }
    }
    panic!("the hung peer was never picked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_wins_against_a_slow_peer() {
    let mut slow = MockConfig::new("slow");
    slow.mode = Mode::Slow;
    slow.slow_latency = Duration::from_secs(3);
    let mut quick = MockConfig::new("quick");
    quick.latency = Latency::fixed(Duration::from_millis(10));
    let (slow, quick) = (mock(slow).await, mock(quick).await);
    let yaml = "capabilities: { code-review: { hedge: { after: 100ms } } }";
    let (caller, _callees) = callers(&[&slow, &quick], yaml).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    for _ in 0..20 {
        let began = Instant::now();
        let reply = send(&client(), "GET", &url, &[("reach-capability", CAP)], "").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(reply.json()["agent"], "quick");
        if slow.stats().business > 0 {
            break;
        }
    }
    assert!(slow.stats().business > 0, "the slow peer was never picked");
    let metrics = get(&client(), &format!("http://{}/metrics", caller.addrs.admin)).await;
    assert!(
        counter(&metrics.body, "reach_hedges_total{result=\"won\"}") >= 1,
        "{}",
        metrics.body
    );
    assert!(caller.status().chains.hedges_won >= 1);
}

// A keyed call runs once: neither a hedge nor a first-event timeout sends a POST with an
// `idempotency-key` to a second agent, however slow the first — deduplication is per callee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_call_is_never_hedged_nor_moved_to_a_second_agent() {
    let slow = |name: &'static str| {
        let mut c = MockConfig::new(name);
        c.mode = Mode::Slow;
        c.slow_latency = Duration::from_millis(400);
        c
    };
    let (a, b) = (mock(slow("slow-a")).await, mock(slow("slow-b")).await);
    let yaml =
        "capabilities: { code-review: { hedge: { after: 50ms }, first_event_timeout: 200ms } }";
    let (caller, _callees) = callers(&[&a, &b], yaml).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    let mut answered = 0;
    for n in 0..8 {
        let key = format!("pay-{n}");
        let headers = [("reach-capability", CAP), ("idempotency-key", key.as_str())];
        let reply = send(&client(), "POST", &url, &headers, "{\"card\": 1}").await;
        if reply.status == 200 {
            answered += 1;
        }
        let ran = a.stats().business + b.stats().business;
        assert_eq!(ran, n + 1, "key {key} ran {} times", ran - n);
    }
    // The retry went back to the same agent, whose sidecar joined the original.
    assert!(answered >= 1, "no keyed call was answered");
    let metrics = get(&client(), &format!("http://{}/metrics", caller.addrs.admin)).await;
    assert_eq!(
        counter(&metrics.body, "reach_hedges_total{result=\"won\"}"),
        0,
        "{}",
        metrics.body
    );
}

/// An agent that answers a stream's head at once and never sends its first event.
async fn stalled_stream() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
    let seen = calls.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<_>| {
                    let seen = seen.clone();
                    async move {
                        // Health checks and probes are answered: only the stream stalls.
                        if req.uri().path() == "/healthz"
                            || req.headers().contains_key("reach-probe")
                        {
                            let ok = r#"{"ok":true}"#;
                            return Ok::<_, std::convert::Infallible>(Response::new(body::full(
                                ok,
                            )));
                        }
                        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let (tx, channel) = http_body_util::channel::Channel::<
                            bytes::Bytes,
                            std::convert::Infallible,
                        >::new(1);
                        // Held open, never written: the stream that never starts.
                        tokio::spawn(async move {
                            let _tx = tx;
                            std::future::pending::<()>().await;
                        });
                        let mut answer = Response::new(body::boxed(channel));
                        answer
                            .headers_mut()
                            .insert("content-type", "text/event-stream".parse().unwrap());
                        Ok::<_, std::convert::Infallible>(answer)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_first_event_never_comes_moves_before_a_byte_is_sent() {
    let (stalled, calls) = stalled_stream().await;
    let mut fine = MockConfig::new("fine");
    (fine.sse_events, fine.sse_interval) = (2, Duration::from_millis(10));
    let fine = mock(fine).await;
    let yaml = "capabilities: { code-review: { first_event_timeout: 500ms } }";
    let policy = policy(yaml);
    let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
    let b = Bootstrap::local("stalled", stalled, &[CAP]).unwrap();
    let stalled_sidecar = sidecar_with(b, policy.clone(), Default::default()).await;
    let b = Bootstrap::local("fine", fine.addr, &[CAP]).unwrap();
    let fine_sidecar = sidecar_with(b, policy.clone(), Default::default()).await;
    let caller = Bootstrap::local("caller", nowhere, &[])
        .unwrap()
        .with_peer("stalled", stalled_sidecar.addrs.inbound, &[CAP])
        .unwrap()
        .with_peer("fine", fine_sidecar.addrs.inbound, &[CAP])
        .unwrap();
    let caller = sidecar_with(caller, policy, Default::default()).await;
    let url = format!("http://{}/sse", caller.addrs.outbound);
    for _ in 0..60 {
        let began = Instant::now();
        let reply = send(&client(), "GET", &url, &[("reach-capability", CAP)], "").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(reply.body.starts_with("id: 0\n"), "{}", reply.body);
        assert!(
            began.elapsed() < Duration::from_secs(2),
            "{:?}",
            began.elapsed()
        );
        if calls.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            assert_eq!(reply.header("reach-attempts"), "2");
            return;
        }
    }
    panic!("the stalled peer was never picked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_delegation_loop_stops_at_its_first_turn() {
    let summary = demo::loop_act().await.unwrap();
    assert_eq!(summary.status, 508, "{summary:?}");
    assert_eq!(summary.reason, "loop_detected");
    assert_eq!(
        summary.chain,
        "user > planner/plan > coder/review > tester/test"
    );
    assert_eq!(summary.refused_by, "tester");
    assert_eq!(summary.agent_calls, 3, "one call each");
}
