//! The hedging act (`docs/chains.md`): its own fleet of three agents (20–60 ms), one
//! of them ten times slower on 30 % of its calls (the mock agent's `long-tasks` mode, seeded, as
//! in the bench's slow-tail scenario). Callers send reads (`GET`), safe to run twice — a call
//! with an `idempotency-key` is never hedged to a second agent (`docs/chains.md`): ~2 s without
//! hedging, then ~2 s with `hedge: {after: 120ms, max: 1}`
//! on the capability. The slow calls make the first run's tail; hedged, a second attempt to
//! another agent answers them.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Request;
use http_body_util::BodyExt;
use serde::Serialize;

use super::{DemoError, CAPABILITY};
use agent_reach::config::{parse_policy, Bootstrap, ConfigPaths, ConfigStore, Policy};
use agent_reach::http::{body, client, headers};
use agent_reach::Sidecar;
use testkit::{Latency, MockAgent, MockConfig, Mode, Workload};

const AGENTS: [&str; 3] = ["reviewer-1", "reviewer-2", "reviewer-3"];
/// The slow agent's share of slow calls, and how slow they are (10× the mean of 40 ms). The
/// caller's sidecar soon sends it few calls, so 30 % of its own makes about 2 % of the fleet's:
/// with 5 % (the bench's, over longer runs) a 2-second run's p99 did not show the tail.
const SLOW_SHARE: f64 = 0.3;
const SLOW: Duration = Duration::from_millis(400);
/// Twice the slowest normal call (60 ms): past the normal answers even with the sidecars' hops
/// on a busy machine, far below the slow ones.
const AFTER: Duration = Duration::from_millis(120);
const RUN: Duration = Duration::from_secs(2);
/// Callers in a closed loop: enough calls in 2 s for a p99 over the slow agent's share.
const WORKERS: usize = 8;

#[derive(Clone, Debug, Serialize)]
pub struct HedgeSummary {
    pub agents: Vec<String>,
    /// The agent that is slow on a share of its calls, that share, and how slow.
    pub slow_agent: String,
    pub slow_share: f64,
    pub slow_ms: f64,
    /// The hedge's threshold in the second run.
    pub after_ms: f64,
    /// Callers in a closed loop, and how long each run lasts.
    pub callers: usize,
    pub run_s: f64,
    pub unhedged: HedgeRun,
    pub hedged: HedgeRun,
}

/// One run as the callers saw it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HedgeRun {
    pub calls: u64,
    pub failed: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Calls that took the slow agent's slow latency or longer: the tail hedging is for.
    pub slow_calls: u64,
    /// Calls that reached any agent ÷ calls made: a hedge that ran counts, won or lost.
    pub attempts_per_call: f64,
}

pub(super) async fn run() -> Result<HedgeSummary, DemoError> {
    let mut agents = Vec::new();
    let mut sidecars = Vec::new();
    let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
    let mut caller = Bootstrap::local("hedge-caller", nowhere, &[]).map_err(DemoError::Config)?;
    for (i, name) in AGENTS.iter().enumerate() {
        let agent = start_agent(name, i).await?;
        let bootstrap =
            Bootstrap::local(name, agent.addr, &[CAPABILITY]).map_err(DemoError::Config)?;
        let sidecar = start(bootstrap, Policy::default()).await?;
        caller = caller
            .with_peer(name, sidecar.addrs.inbound, &[CAPABILITY])
            .map_err(DemoError::Config)?;
        agents.push(agent);
        sidecars.push(sidecar);
    }
    let caller = start(caller, Policy::default()).await?;
    let url = format!("http://{}/review", caller.addrs.outbound);
    ready(&url).await;
    // The slow calls begin with the load, after the readiness calls.
    agents[0].set_mode(Mode::LongTasks);
    let unhedged = measure(&url, &agents).await;
    let snapshot = caller.store().snapshot();
    caller
        .store()
        .replace(snapshot.bootstrap.clone(), hedge_policy()?);
    let hedged = measure(&url, &agents).await;
    caller.kill().await;
    for sidecar in sidecars {
        sidecar.kill().await;
    }
    for agent in agents {
        agent.stop().await;
    }
    Ok(HedgeSummary {
        agents: AGENTS.iter().map(|a| (*a).to_owned()).collect(),
        slow_agent: AGENTS[0].to_owned(),
        slow_share: SLOW_SHARE,
        slow_ms: SLOW.as_secs_f64() * 1000.0,
        after_ms: AFTER.as_secs_f64() * 1000.0,
        callers: WORKERS,
        run_s: RUN.as_secs_f64(),
        unhedged,
        hedged,
    })
}

/// The shipped defaults with `hedge: {after: AFTER, max: 1}` on the capability.
fn hedge_policy() -> Result<Policy, DemoError> {
    let text = format!(
        "capabilities: {{ {CAPABILITY}: {{ hedge: {{ after: {}ms, max: 1 }} }} }}",
        AFTER.as_millis()
    );
    parse_policy(Path::new("demo-hedge.yaml"), &text).map_err(|e| DemoError::Config(e.to_string()))
}

/// Agent `i`, seeded; the first one is put in `long-tasks` mode once the fleet is ready.
async fn start_agent(name: &str, i: usize) -> Result<MockAgent, DemoError> {
    let mut config = MockConfig::new(name);
    config.latency = Latency {
        min: Duration::from_millis(20),
        max: Duration::from_millis(60),
    };
    let workload = Workload {
        seed: Some(3700 + i as u64),
        long_share: SLOW_SHARE,
        long_latency: SLOW,
        ..Workload::default()
    };
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    Ok(MockAgent::start_with(any, config, workload).await?)
}

async fn start(bootstrap: Bootstrap, policy: Policy) -> Result<Sidecar, DemoError> {
    let store = ConfigStore::new(bootstrap, policy, ConfigPaths::default());
    Ok(Sidecar::start(Arc::new(store)).await?)
}

/// Until a call succeeds (at most 5 s): the caller's sidecar routes to its static peers.
async fn ready(url: &str) {
    let client = client::build(&Policy::default());
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if read_call(&client, url).await == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `WORKERS` callers in a closed loop for `RUN`, each sending reads.
async fn measure(url: &str, agents: &[MockAgent]) -> HedgeRun {
    let reached = || agents.iter().map(|a| a.stats().business).sum::<u64>();
    let before = reached();
    let client = client::build(&Policy::default());
    let calls: Arc<Mutex<Vec<(u16, f64)>>> = Arc::default();
    let deadline = Instant::now() + RUN;
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (client, calls, url) = (client.clone(), calls.clone(), url.to_owned());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let status = read_call(&client, &url).await;
                    let ms = sent.elapsed().as_secs_f64() * 1000.0;
                    calls
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((status, ms));
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
    // A lost hedge's agent may still be finishing its call: let it count.
    tokio::time::sleep(SLOW).await;
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    summarise(&calls, reached().saturating_sub(before))
}

fn summarise(calls: &[(u16, f64)], reached: u64) -> HedgeRun {
    let mut ms: Vec<f64> = calls.iter().map(|(_, ms)| *ms).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((ms.len() as f64 * q).ceil() as usize).saturating_sub(1);
        ms.get(i.min(ms.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    let made = calls.len() as u64;
    HedgeRun {
        calls: made,
        failed: calls.iter().filter(|(status, _)| *status != 200).count() as u64,
        p50_ms: super::round(at(0.5)),
        p99_ms: super::round(at(0.99)),
        max_ms: super::round(ms.last().copied().unwrap_or(0.0)),
        slow_calls: ms
            .iter()
            .filter(|ms| **ms >= SLOW.as_secs_f64() * 1000.0)
            .count() as u64,
        attempts_per_call: (reached as f64 / made.max(1) as f64 * 100.0).round() / 100.0,
    }
}

/// One read: its status once the body has ended, 0 without one.
async fn read_call(client: &client::UpstreamClient, url: &str) -> u16 {
    let Ok(request) = Request::get(url)
        .header(headers::CAPABILITY, CAPABILITY)
        .body(body::empty())
    else {
        return 0;
    };
    let Ok(response) = client.request(request).await else {
        return 0;
    };
    let status = response.status().as_u16();
    match response.into_body().collect().await {
        Ok(_) => status,
        Err(_) => 0,
    }
}
