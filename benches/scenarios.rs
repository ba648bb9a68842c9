//! The seeds' failure modes, replayed through the routers people use today and through
//! agent-reach. Each scenario runs a fresh fleet of four mock agents on loopback, drives
//! `code-review` calls from 16 workers through one router, and breaks one agent (or two) a
//! quarter of the way in. Per scenario and router it prints the task failure rate, mean and p95
//! latency, how long the broken agent kept getting calls, and (retry storm) the fallback's peak
//! against its fair share. Never asserts on time.
//!
//! Routers: **agent-reach** (a sidecar per agent with a business probe, default policy);
//! **baseline** (round-robin, `/healthz` every 10 s, one immediate retry: what the seeds started
//! from); **haproxy** (`/healthz` checks, `observe layer7`, `retry-on` with redispatch);
//! **envoy** (active `/healthz` checks, outlier detection, retries on another host with a retry
//! budget, slow start).
//!
//! Run: `cargo bench --bench scenarios` (`-- --seconds 30`, `-- --only fake-online`, `-- --smoke`).
//! Not yet here: `half-open`, `cold-start`, and the restart half of `crash-restart`. Read
//! *bad out after* with care in `slow-dependency`: callers stuck on a slow agent send it few new
//! calls under any router, so p95 is the figure that tells routers apart there.

#[path = "common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach::config::{ConfigPaths, ConfigStore, Policy};
use agent_reach::mock_agent::{Latency, MockAgent, MockConfig, Mode};
use agent_reach::{Bootstrap, Sidecar};
use bytes::Bytes;
use common::{free_port, write, Tools};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const AGENTS: usize = 4;
const WORKERS: usize = 16;
const CAP: &str = "code-review";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    Healthy,
    FakeOnline,
    SlowDependency,
    LockHeld,
    Crash,
    RetryStorm,
}

impl Scenario {
    const ALL: [Scenario; 6] = [
        Scenario::Healthy,
        Scenario::FakeOnline,
        Scenario::SlowDependency,
        Scenario::LockHeld,
        Scenario::Crash,
        Scenario::RetryStorm,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Healthy => "healthy",
            Scenario::FakeOnline => "fake-online",
            Scenario::SlowDependency => "slow-dependency",
            Scenario::LockHeld => "lock-held",
            Scenario::Crash => "crash",
            Scenario::RetryStorm => "retry-storm",
        }
    }

    /// The agents it breaks.
    fn broken(self) -> &'static [usize] {
        match self {
            Scenario::Healthy => &[],
            Scenario::RetryStorm => &[0, 1],
            _ => &[1],
        }
    }

    fn breaks(self, agent: &MockAgent) {
        match self {
            Scenario::Healthy => {}
            Scenario::FakeOnline | Scenario::RetryStorm => agent.set_mode(Mode::RateLimited),
            Scenario::SlowDependency => agent.set_mode(Mode::Slow),
            Scenario::LockHeld => agent.set_mode(Mode::Locked),
            Scenario::Crash => agent.kill(),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke") || !args.iter().any(|a| a == "--bench");
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let seconds: u64 = arg("--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 4 } else { 20 });
    let only = arg("--only");
    let tools = Tools::find();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("cannot start a runtime: {err}");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("agent-reach-scenarios-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let routers: Vec<&str> = ["agent-reach", "baseline", "haproxy", "envoy"]
        .into_iter()
        .filter(|r| match *r {
            "haproxy" => tools.haproxy.is_some(),
            "envoy" => tools.envoy.is_some(),
            _ => true,
        })
        .collect();
    println!(
        "failure scenarios: {AGENTS} mock agents (20–60 ms), {WORKERS} concurrent callers, {seconds} s per run, fault at 25 %\n"
    );
    println!(
        "{:<16} {:<12} {:>7} {:>9} {:>9} {:>9} {:>12} {:>10}",
        "scenario",
        "router",
        "calls",
        "failed %",
        "mean ms",
        "p95 ms",
        "bad out after",
        "peak/fair"
    );
    let mut reach_failed = false;
    for scenario in Scenario::ALL {
        if only.as_deref().is_some_and(|o| o != scenario.name()) {
            continue;
        }
        if smoke && !matches!(scenario, Scenario::Healthy | Scenario::FakeOnline) {
            continue;
        }
        for router in &routers {
            let result = runtime.block_on(run(
                scenario,
                router,
                &tools,
                &dir,
                Duration::from_secs(seconds),
            ));
            match result {
                Ok(r) => println!(
                    "{:<16} {:<12} {:>7} {:>8.2}% {:>9.1} {:>9.1} {:>12} {:>10}",
                    scenario.name(),
                    router,
                    r.calls,
                    r.failed_pct,
                    r.mean_ms,
                    r.p95_ms,
                    r.out_after.map_or_else(
                        || if scenario.broken().is_empty() {
                            "-".into()
                        } else {
                            "never".into()
                        },
                        |d| format!("{:.1} s", d.as_secs_f64())
                    ),
                    r.peak_ratio.map_or("-".into(), |p| format!("{p:.2}x")),
                ),
                Err(err) => {
                    println!("{:<16} {:<12} cannot run: {err}", scenario.name(), router);
                    reach_failed |= *router == "agent-reach";
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "\nreproduce: cargo bench --bench scenarios{}",
        if smoke { " -- --smoke" } else { "" }
    );
    if smoke && reach_failed {
        std::process::exit(1);
    }
}

struct Outcome {
    calls: usize,
    failed_pct: f64,
    mean_ms: f64,
    p95_ms: f64,
    out_after: Option<Duration>,
    peak_ratio: Option<f64>,
}

/// One call as the caller saw it: when it ended, whether it succeeded, how long it took.
type Call = (Duration, bool, f64);

async fn run(
    scenario: Scenario,
    router: &str,
    tools: &Tools,
    dir: &Path,
    duration: Duration,
) -> Result<Outcome, String> {
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        let mut config = MockConfig::new(&format!("agent-{}", i + 1));
        config.latency = Latency {
            min: Duration::from_millis(20),
            max: Duration::from_millis(60),
        };
        config.slow_latency = Duration::from_secs(2);
        agents.push(
            MockAgent::start(SocketAddr::from(([127, 0, 0, 1], 0)), config)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let addrs: Vec<SocketAddr> = agents.iter().map(|a| a.addr).collect();
    let front = Front::start(router, &addrs, tools, dir).await?;
    let url = front.url();

    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let (client, calls, url, stop) = (client.clone(), calls.clone(), url.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let request = hyper::Request::post(&url)
                    .header("reach-capability", CAP)
                    .body(Full::new(Bytes::from_static(b"def f(): pass")));
                let ok = match request {
                    Ok(r) => match tokio::time::timeout(Duration::from_secs(10), client.request(r))
                        .await
                    {
                        Ok(Ok(response)) => {
                            let status = response.status();
                            response.into_body().collect().await.is_ok() && status == 200
                        }
                        _ => false,
                    },
                    Err(_) => false,
                };
                let ms = sent.elapsed().as_secs_f64() * 1000.0;
                calls
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((started.elapsed(), ok, ms));
            }
        }));
    }
    // Watch what reaches each agent, every 100 ms.
    let fault_at = duration / 4;
    let mut samples: Vec<(Duration, Vec<u64>, usize)> = Vec::new();
    let mut faulted = false;
    while started.elapsed() < duration {
        if !faulted && started.elapsed() >= fault_at {
            for i in scenario.broken() {
                scenario.breaks(&agents[*i]);
            }
            faulted = true;
        }
        let reached = agents.iter().map(|a| a.stats().business).collect();
        let n = calls.lock().unwrap_or_else(|p| p.into_inner()).len();
        samples.push((started.elapsed(), reached, n));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    drop(front);
    let calls = calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(outcome(scenario, &calls, &samples, fault_at))
}

fn outcome(
    scenario: Scenario,
    calls: &[Call],
    samples: &[(Duration, Vec<u64>, usize)],
    fault_at: Duration,
) -> Outcome {
    let mut ms: Vec<f64> = calls.iter().map(|c| c.2).collect();
    ms.sort_by(f64::total_cmp);
    let failed = calls.iter().filter(|c| !c.1).count();
    let p95 = ms
        .get(((ms.len() as f64 * 0.95) as usize).min(ms.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let mean = if ms.is_empty() {
        0.0
    } else {
        ms.iter().sum::<f64>() / ms.len() as f64
    };
    // How long the broken agent kept getting calls: from the fault to the end of the first
    // 500 ms in which it got under 5 % of its fair share (calls to it / calls made).
    let bad = scenario.broken();
    let fair = 1.0 / AGENTS as f64;
    let out_after = (!bad.is_empty() && scenario != Scenario::Crash)
        .then(|| {
            samples
                .windows(6)
                .filter(|w| w[0].0 >= fault_at)
                .find(|w| {
                    let (first, last) = (&w[0], &w[w.len() - 1]);
                    let made = last.2.saturating_sub(first.2).max(1) as f64;
                    let reached: u64 = bad
                        .iter()
                        .map(|i| last.1[*i].saturating_sub(first.1[*i]))
                        .sum();
                    reached as f64 / made / bad.len() as f64 <= 0.05 * fair
                })
                .map(|w| w[w.len() - 1].0.saturating_sub(fault_at))
        })
        .flatten();
    // Retry storm: the busiest 500 ms of the busiest survivor against its fair share of the
    // calls made (they are two: a half each).
    let peak_ratio = (scenario == Scenario::RetryStorm).then(|| {
        samples
            .windows(6)
            .filter(|w| w[0].0 >= fault_at)
            .map(|w| {
                let (first, last) = (&w[0], &w[w.len() - 1]);
                let made = last.2.saturating_sub(first.2).max(1) as f64;
                (2..AGENTS)
                    .map(|i| last.1[i].saturating_sub(first.1[i]) as f64 / (made / 2.0))
                    .fold(0.0, f64::max)
            })
            .fold(0.0, f64::max)
    });
    Outcome {
        calls: calls.len(),
        failed_pct: 100.0 * failed as f64 / calls.len().max(1) as f64,
        mean_ms: mean,
        p95_ms: p95,
        out_after,
        peak_ratio,
    }
}

/// The router under test, in front of the agents.
enum Front {
    Reach {
        caller: Option<Box<Sidecar>>,
        sidecars: Vec<Sidecar>,
    },
    Baseline {
        port: u16,
        task: tokio::task::JoinHandle<()>,
    },
    Process {
        port: u16,
        child: Child,
    },
}

impl Front {
    async fn start(
        router: &str,
        agents: &[SocketAddr],
        tools: &Tools,
        dir: &Path,
    ) -> Result<Self, String> {
        let front = match router {
            "agent-reach" => {
                let start = |b: Bootstrap| async move {
                    let store = Arc::new(ConfigStore::new(
                        b,
                        Policy::default(),
                        ConfigPaths::default(),
                    ));
                    Sidecar::start(store).await.map_err(|e| e.to_string())
                };
                let mut sidecars = Vec::new();
                let mut caller =
                    Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])?;
                for (i, addr) in agents.iter().enumerate() {
                    let name = format!("agent-{}", i + 1);
                    let mut b = Bootstrap::local(&name, *addr, &[CAP])?;
                    b.agent.max_concurrency =
                        serde_yaml::from_str("8").map_err(|e| e.to_string())?;
                    for c in &mut b.agent.capabilities {
                        c.probe = Some(agent_reach::demo::probe_spec());
                    }
                    let sidecar = start(b).await?;
                    caller = caller.with_peer(&name, sidecar.addrs.inbound, &[CAP])?;
                    sidecars.push(sidecar);
                }
                Front::Reach {
                    caller: Some(Box::new(start(caller).await?)),
                    sidecars,
                }
            }
            "baseline" => {
                let (port, task) = baseline(agents.to_vec()).await?;
                Front::Baseline { port, task }
            }
            "haproxy" => {
                let binary = tools.haproxy.clone().ok_or("haproxy not found")?;
                let port = free_port()?;
                let servers: String = agents
                    .iter()
                    .enumerate()
                    .map(|(i, a)| format!("  server a{i} {a} check\n"))
                    .collect();
                let cfg = write(dir, "haproxy.cfg", &format!(
                    "global\n  nbthread 1\n  maxconn 4096\n\
                     defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 30s\n  option http-keep-alive\n\
                     \x20 retries 1\n  option redispatch 1\n  retry-on conn-failure empty-response response-timeout 500 502 503 504\n\
                     frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
                     backend b\n  balance roundrobin\n  option httpchk GET /healthz\n  http-check expect status 200\n\
                     \x20 default-server inter 10s fall 3 rise 2 observe layer7 error-limit 10 on-error mark-down\n{servers}"))?;
                let child = common::spawn_quiet(common::haproxy(&binary, &cfg))?;
                Front::Process { port, child }
            }
            "envoy" => {
                let binary = tools.envoy.clone().ok_or("envoy not found")?;
                let port = free_port()?;
                let endpoints: String = agents
                    .iter()
                    .map(|a| format!("        - endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}\n", a.ip(), a.port()))
                    .collect();
                let cfg = write(
                    dir,
                    "envoy.yaml",
                    &format!(
                        r#"
static_resources:
  listeners:
  - address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: scenario
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: agents
                  timeout: 10s
                  retry_policy:
                    retry_on: "5xx,reset,connect-failure,retriable-status-codes"
                    retriable_status_codes: [429]
                    num_retries: 1
                    retry_host_predicate: [ {{ name: envoy.retry_host_predicates.previous_hosts, typed_config: {{ "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate }} }} ]
                    host_selection_retry_max_attempts: 3
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
  clusters:
  - name: agents
    type: STATIC
    connect_timeout: 1s
    lb_policy: ROUND_ROBIN
    round_robin_lb_config: {{ slow_start_config: {{ slow_start_window: 30s }} }}
    circuit_breakers: {{ thresholds: [ {{ retry_budget: {{ budget_percent: {{ value: 20 }}, min_retry_concurrency: 3 }} }} ] }}
    health_checks:
    - timeout: 2s
      interval: 10s
      unhealthy_threshold: 3
      healthy_threshold: 2
      http_health_check: {{ path: /healthz }}
    outlier_detection:
      consecutive_5xx: 5
      consecutive_gateway_failure: 5
      interval: 1s
      base_ejection_time: 30s
      max_ejection_percent: 50
    load_assignment:
      cluster_name: agents
      endpoints:
      - lb_endpoints:
{endpoints}"#
                    ),
                )?;
                let child = common::spawn_quiet(common::envoy(&binary, &cfg, port))?;
                Front::Process { port, child }
            }
            other => return Err(format!("unknown router {other}")),
        };
        // Ready when a call goes through.
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let request = hyper::Request::post(front.url())
                .header("reach-capability", CAP)
                .body(Full::new(Bytes::from_static(b"x")))
                .map_err(|e| e.to_string())?;
            if let Ok(Ok(r)) =
                tokio::time::timeout(Duration::from_secs(2), client.request(request)).await
            {
                if r.status() == 200 {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err("the router did not answer within 20 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(front)
    }

    fn url(&self) -> String {
        let port = match self {
            Front::Reach { caller, .. } => caller.as_ref().map_or(0, |c| c.addrs.outbound.port()),
            Front::Baseline { port, .. } | Front::Process { port, .. } => *port,
        };
        format!("http://127.0.0.1:{port}/review")
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        match self {
            Front::Reach { caller, sidecars } => {
                // Sidecars stop with their runtime's tasks; killing them here keeps runs apart.
                let all: Vec<Sidecar> = caller
                    .take()
                    .map(|c| *c)
                    .into_iter()
                    .chain(sidecars.drain(..))
                    .collect();
                tokio::spawn(async move {
                    for s in all {
                        s.kill().await;
                    }
                });
            }
            Front::Baseline { task, .. } => task.abort(),
            Front::Process { child, .. } => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// What the seeds started from: round-robin over agents whose `/healthz` answered 200 at the
/// last check (every 10 s), and one immediate retry on the next agent after an error, a 5xx
/// or a 429.
async fn baseline(agents: Vec<SocketAddr>) -> Result<(u16, tokio::task::JoinHandle<()>), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let healthy: Arc<Vec<AtomicBool>> =
        Arc::new(agents.iter().map(|_| AtomicBool::new(true)).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let checker = {
        let (agents, healthy, client) = (agents.clone(), healthy.clone(), client.clone());
        tokio::spawn(async move {
            loop {
                for (i, a) in agents.iter().enumerate() {
                    let request = hyper::Request::get(format!("http://{a}/healthz"))
                        .body(Full::new(Bytes::new()));
                    let up = match request {
                        Ok(r) => {
                            matches!(tokio::time::timeout(Duration::from_secs(2), client.request(r)).await, Ok(Ok(resp)) if resp.status() == 200)
                        }
                        Err(_) => false,
                    };
                    healthy[i].store(up, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
    };
    let task = tokio::spawn(async move {
        let _checker = AbortOnDrop(checker);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (agents, healthy, next, client) = (
                agents.clone(),
                healthy.clone(),
                next.clone(),
                client.clone(),
            );
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (agents, healthy, next, client) = (
                            agents.clone(),
                            healthy.clone(),
                            next.clone(),
                            client.clone(),
                        );
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let mut last = hyper::Response::builder()
                                .status(502)
                                .body(Full::new(Bytes::new()));
                            for _attempt in 0..2 {
                                let pick = (0..agents.len())
                                    .map(|_| next.fetch_add(1, Ordering::Relaxed) % agents.len())
                                    .find(|i| healthy[*i].load(Ordering::Relaxed))
                                    .unwrap_or(0);
                                let request = hyper::Request::builder()
                                    .method(parts.method.clone())
                                    .uri(format!("http://{}{}", agents[pick], parts.uri.path()))
                                    .body(Full::new(body.clone()));
                                let Ok(request) = request else { break };
                                match client.request(request).await {
                                    Ok(resp) => {
                                        let status = resp.status();
                                        let bytes = resp
                                            .into_body()
                                            .collect()
                                            .await
                                            .map(|b| b.to_bytes())
                                            .unwrap_or_default();
                                        last = hyper::Response::builder()
                                            .status(status)
                                            .body(Full::new(bytes));
                                        if status.is_server_error() || status == 429 {
                                            continue;
                                        }
                                        break;
                                    }
                                    Err(_) => continue,
                                }
                            }
                            Ok::<_, std::convert::Infallible>(last.unwrap_or_default())
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((port, task))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
