//! The delegation-loop act: three agents that delegate in a circle (`planner` asks `coder` to
//! review, `coder` asks `tester` to test, `tester` asks `planner` to plan again), each passing on
//! the `reach-chain` its sidecar handed it. Without chains the circle would turn until a timeout,
//! each turn a model call; with them, the sidecar of the agent about to close the circle refuses
//! it with `508 loop_detected` at its first turn, naming the chain (`docs/chains.md`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::{Request, Response};
use http_body_util::BodyExt;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::DemoError;
use agent_reach::config::{Bootstrap, ConfigPaths, ConfigStore, Policy};
use agent_reach::http::{body, client, ReachBody};
use agent_reach::Sidecar;

/// The circle: each agent, the capability it serves, and the one it asks for.
const CIRCLE: [(&str, &str, &str); 3] = [
    ("planner", "plan", "review"),
    ("coder", "review", "test"),
    ("tester", "test", "plan"),
];

#[derive(Clone, Debug, Serialize)]
pub struct LoopSummary {
    /// The agents of the circle, in delegation order.
    pub agents: Vec<String>,
    /// What the user's call came back with.
    pub status: u16,
    pub reason: String,
    /// The chain the refusal named, and its hops.
    pub chain: String,
    pub hops: u64,
    /// The agent whose sidecar refused to close the circle.
    pub refused_by: String,
    /// Business calls the agents ran in all: one each, the circle stopped at its first turn.
    pub agent_calls: u64,
    pub answered_after_ms: f64,
}

/// One delegating agent: what it counts and where its sidecar's outbound port is.
struct Delegator {
    addr: SocketAddr,
    outbound: Arc<OnceLock<SocketAddr>>,
}

pub(super) async fn run() -> Result<LoopSummary, DemoError> {
    let stop = CancellationToken::new();
    let calls = Arc::new(AtomicU64::new(0));
    let mut sidecars = Vec::new();
    let mut agents = Vec::new();
    for (name, serves, asks) in CIRCLE {
        let agent = delegator(asks, calls.clone(), stop.clone()).await?;
        let bootstrap = Bootstrap::local(name, agent.addr, &[serves]).map_err(DemoError::Config)?;
        sidecars.push(start(bootstrap).await?);
        agents.push(agent);
    }
    let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
    let user = start(Bootstrap::local("user", nowhere, &[]).map_err(DemoError::Config)?).await?;
    // Each sidecar learns the next agent in the circle (static peers, reloaded once ports are
    // known) and its caller, the one before (the planner's: the user), so it can vouch for it.
    for (i, sidecar) in sidecars.iter().enumerate() {
        let next = (i + 1) % CIRCLE.len();
        let (name, serves, _) = CIRCLE[next];
        let mut peers = vec![(name, sidecars[next].addrs.inbound, vec![serves])];
        let before = (i + CIRCLE.len() - 1) % CIRCLE.len();
        match i {
            0 => peers.push(("user", user.addrs.inbound, vec![])),
            _ => peers.push((CIRCLE[before].0, sidecars[before].addrs.inbound, vec![])),
        }
        add_peers(sidecar, &peers)?;
        let _ = agents[i].outbound.set(sidecar.addrs.outbound);
    }
    add_peers(
        &user,
        &[("planner", sidecars[0].addrs.inbound, vec!["plan"])],
    )?;

    let began = Instant::now();
    let url = format!("http://{}/work", user.addrs.outbound);
    let (status, reason, text) = call(&url, "plan", None).await;
    let answered_after_ms = began.elapsed().as_secs_f64() * 1000.0;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let mut refused_by = "-".to_owned();
    for (i, sidecar) in sidecars.iter().enumerate() {
        if sidecar.status().chains.loops_refused > 0 {
            refused_by = CIRCLE[i].0.to_owned();
        }
    }
    stop.cancel();
    for sidecar in sidecars.into_iter().chain([user]) {
        sidecar.kill().await;
    }
    Ok(LoopSummary {
        agents: CIRCLE.iter().map(|(n, ..)| (*n).to_owned()).collect(),
        status,
        reason,
        chain: answer["chain"].as_str().unwrap_or("-").to_owned(),
        hops: answer["hops"].as_u64().unwrap_or(0),
        refused_by,
        agent_calls: calls.load(Ordering::Relaxed),
        answered_after_ms: super::round(answered_after_ms),
    })
}

async fn start(bootstrap: Bootstrap) -> Result<Sidecar, DemoError> {
    let store = ConfigStore::new(bootstrap, Policy::default(), ConfigPaths::default());
    Ok(Sidecar::start(Arc::new(store)).await?)
}

fn add_peers(sidecar: &Sidecar, peers: &[(&str, SocketAddr, Vec<&str>)]) -> Result<(), DemoError> {
    let snapshot = sidecar.store().snapshot();
    let mut bootstrap = snapshot.bootstrap.clone();
    for (name, inbound, serves) in peers {
        bootstrap = bootstrap
            .with_peer(name, *inbound, serves)
            .map_err(DemoError::Config)?;
    }
    sidecar.store().replace(bootstrap, snapshot.policy.clone());
    Ok(())
}

/// A capability call through a sidecar's outbound port: status, `reach-reason`, body.
async fn call(url: &str, capability: &str, chain: Option<&str>) -> (u16, String, String) {
    let mut request = Request::post(url).header("reach-capability", capability);
    if let Some(chain) = chain {
        request = request.header("reach-chain", chain);
    }
    let Ok(request) = request.body(body::full("{}")) else {
        return (0, "-".to_owned(), String::new());
    };
    let client = client::build(&Policy::default());
    match client.request(request).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let reason = response
                .headers()
                .get("reach-reason")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned();
            let bytes = response.into_body().collect().await.map(|b| b.to_bytes());
            let text = bytes.map_or(String::new(), |b| String::from_utf8_lossy(&b).into_owned());
            (status, reason, text)
        }
        Err(err) => (0, "-".to_owned(), err.to_string()),
    }
}

/// An agent that serves every call by asking for `asks` through its sidecar, passing on the
/// chain it was handed, and answers with what came back.
async fn delegator(
    asks: &'static str,
    calls: Arc<AtomicU64>,
    stop: CancellationToken,
) -> Result<Delegator, DemoError> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let outbound: Arc<OnceLock<SocketAddr>> = Arc::default();
    let out = outbound.clone();
    let handle = move |req: Request<hyper::body::Incoming>| {
        let (out, calls) = (out.clone(), calls.clone());
        async move { delegate(asks, &out, &calls, req).await }
    };
    tokio::spawn(testkit::serve_until(listener, stop, handle));
    Ok(Delegator { addr, outbound })
}

async fn delegate(
    asks: &str,
    outbound: &OnceLock<SocketAddr>,
    calls: &AtomicU64,
    req: Request<hyper::body::Incoming>,
) -> Response<ReachBody> {
    calls.fetch_add(1, Ordering::Relaxed);
    let chain = req
        .headers()
        .get("reach-chain")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let _ = req.into_body().collect().await;
    let Some(outbound) = outbound.get() else {
        return Response::new(body::full("{}"));
    };
    let url = format!("http://{outbound}/work");
    let (status, reason, text) = call(&url, asks, chain.as_deref()).await;
    let mut answer = Response::new(body::full(text));
    *answer.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    if let Ok(reason) = http::HeaderValue::from_str(&reason) {
        answer.headers_mut().insert("reach-reason", reason);
    }
    answer
}
