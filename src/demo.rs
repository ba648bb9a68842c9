//! `agent-reach demo`: a local fleet of mock agents, each behind its own sidecar, and a caller
//! driving capability calls through its sidecar's outbound port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde::Serialize;

use crate::config::{Bootstrap, ConfigPaths, ConfigStore, Policy};
use crate::http::{body, client, headers};
use crate::inbound::percentile;
use crate::mock_agent::{Latency, MockAgent, MockConfig};
use crate::Sidecar;

const CAPABILITY: &str = "code-review";
const AGENTS: [&str; 3] = ["coder-1", "coder-2", "coder-3"];

#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub duration: Duration,
    /// Calls in flight at once from the caller.
    pub concurrency: usize,
}

/// The fleet could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot start a mock agent: {0}")]
    Agent(#[from] std::io::Error),
    #[error("cannot start a sidecar: {0}")]
    Sidecar(#[from] crate::StartError),
    #[error("bad demo config: {0}")]
    Config(String),
}

/// What the demo prints, as a table or as JSON.
#[derive(Clone, Debug, Serialize)]
pub struct DemoSummary {
    pub duration_s: f64,
    pub capability: &'static str,
    pub concurrency: usize,
    /// Per agent, as its own sidecar measured it.
    pub agents: Vec<AgentSummary>,
    /// What the caller saw.
    pub total: Totals,
}

#[derive(Clone, Debug, Serialize)]
pub struct AgentSummary {
    pub name: String,
    pub requests: u64,
    pub successes: u64,
    pub failures: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub in_flight: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    pub requests: u64,
    pub successes: u64,
    pub failures: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub requests_per_s: f64,
}

/// A running local fleet: agents with their sidecars, and the caller's sidecar.
#[derive(Debug)]
pub struct Fleet {
    pub agents: Vec<(MockAgent, Sidecar)>,
    pub caller: Sidecar,
}

impl Fleet {
    pub async fn start() -> Result<Self, DemoError> {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut agents = Vec::new();
        let mut caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .map_err(DemoError::Config)?;
        for name in AGENTS {
            let mut config = MockConfig::new(name);
            config.latency = Latency {
                min: Duration::from_millis(20),
                max: Duration::from_millis(60),
            };
            let agent = MockAgent::start(any, config).await?;
            let bootstrap =
                Bootstrap::local(name, agent.addr, &[CAPABILITY]).map_err(DemoError::Config)?;
            let sidecar = start_sidecar(bootstrap).await?;
            caller = caller
                .with_peer(name, sidecar.addrs.inbound, &[CAPABILITY])
                .map_err(DemoError::Config)?;
            agents.push((agent, sidecar));
        }
        let caller = start_sidecar(caller).await?;
        Ok(Self { agents, caller })
    }

    pub async fn shutdown(self) {
        self.caller.shutdown().await;
        for (agent, sidecar) in self.agents {
            sidecar.shutdown().await;
            agent.stop().await;
        }
    }
}

async fn start_sidecar(bootstrap: Bootstrap) -> Result<Sidecar, DemoError> {
    let store = Arc::new(ConfigStore::new(
        bootstrap,
        Policy::default(),
        ConfigPaths::default(),
    ));
    Ok(Sidecar::start(store).await?)
}

/// Runs the demo and returns its summary.
pub async fn run(options: DemoOptions) -> Result<DemoSummary, DemoError> {
    let fleet = Fleet::start().await?;
    let started = Instant::now();
    let outcomes = drive(
        fleet.caller.addrs.outbound,
        options.duration,
        options.concurrency,
    )
    .await;
    let elapsed = started.elapsed();
    let agents = fleet
        .agents
        .iter()
        .map(|(agent, sidecar)| {
            let status = sidecar.status();
            AgentSummary {
                name: agent.name().to_owned(),
                requests: status.inbound.requests,
                successes: status.inbound.successes,
                failures: status.inbound.requests - status.inbound.successes,
                p50_ms: round(status.inbound.p50_ms),
                p95_ms: round(status.inbound.p95_ms),
                in_flight: status.load.in_flight,
            }
        })
        .collect();
    fleet.shutdown().await;
    Ok(DemoSummary {
        duration_s: round(elapsed.as_secs_f64()),
        capability: CAPABILITY,
        concurrency: options.concurrency,
        agents,
        total: totals(&outcomes, elapsed),
    })
}

/// One call as the caller saw it.
#[derive(Clone, Copy, Debug)]
struct Call {
    ok: bool,
    ms: f64,
}

/// Sends calls to `code-review` through the caller's outbound port from `concurrency` workers.
async fn drive(outbound: SocketAddr, duration: Duration, concurrency: usize) -> Vec<Call> {
    let client = client::build(&Policy::default());
    let deadline = Instant::now() + duration;
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut calls = Vec::new();
                while Instant::now() < deadline {
                    let started = Instant::now();
                    let request = Request::post(format!("http://{outbound}/review"))
                        .header(headers::CAPABILITY, CAPABILITY)
                        .body(body::full("def f(): pass"));
                    let ok = match request {
                        Ok(request) => match client.request(request).await {
                            Ok(response) => {
                                let status = response.status();
                                response.into_body().collect().await.is_ok()
                                    && status == StatusCode::OK
                            }
                            Err(_) => false,
                        },
                        Err(_) => false,
                    };
                    calls.push(Call {
                        ok,
                        ms: started.elapsed().as_secs_f64() * 1000.0,
                    });
                }
                calls
            })
        })
        .collect();
    let mut calls = Vec::new();
    for worker in workers {
        calls.extend(worker.await.unwrap_or_default());
    }
    calls
}

fn totals(calls: &[Call], elapsed: Duration) -> Totals {
    let mut ms: Vec<f64> = calls.iter().map(|c| c.ms).collect();
    ms.sort_by(f64::total_cmp);
    let successes = calls.iter().filter(|c| c.ok).count() as u64;
    Totals {
        requests: calls.len() as u64,
        successes,
        failures: calls.len() as u64 - successes,
        p50_ms: round(percentile(&ms, 0.50)),
        p95_ms: round(percentile(&ms, 0.95)),
        requests_per_s: round(calls.len() as f64 / elapsed.as_secs_f64().max(1e-9)),
    }
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The human-readable report.
pub fn render_table(s: &DemoSummary) -> String {
    let mut out = format!(
        "agent-reach demo: {} agents behind sidecars, {:.1}s of `{}` calls from a caller ({} at once)\n\n",
        s.agents.len(),
        s.duration_s,
        s.capability,
        s.concurrency
    );
    out.push_str(&format!(
        "{:<10} {:>9} {:>9} {:>8} {:>8} {:>10}\n",
        "agent", "requests", "success", "p50 ms", "p95 ms", "in-flight"
    ));
    for a in &s.agents {
        out.push_str(&format!(
            "{:<10} {:>9} {:>8.1}% {:>8.1} {:>8.1} {:>10}\n",
            a.name,
            a.requests,
            pct(a.successes, a.requests),
            a.p50_ms,
            a.p95_ms,
            a.in_flight
        ));
    }
    let t = &s.total;
    out.push_str(&format!(
        "\ncaller saw {} calls: {} ok ({:.2}%), {} failed; p50 {:.1} ms, p95 {:.1} ms; {:.0} calls/s\n",
        t.requests,
        t.successes,
        pct(t.successes, t.requests),
        t.failures,
        t.p50_ms,
        t.p95_ms,
        t.requests_per_s
    ));
    out
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}
