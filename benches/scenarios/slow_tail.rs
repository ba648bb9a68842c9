//! **slow-tail**: three agents (20–60 ms); one of them takes 400 ms (10× the mean)
//! on 5 % of its calls, at random (the mock agent's `long-tasks` mode with a 5 % share; seeded).
//! No errors: only the tail grows. Eight callers in a closed loop, each call with its own
//! `idempotency-key` (safe to repeat: what hedging asks for).
//!
//! Runs: **healthy** (agent-reach, no hedge, no slow agent: the reference p99);
//! **agent-reach** without hedging; **agent-reach/hedge-p95** (`hedge: {after: p95}`);
//! **agent-reach/hedge-70ms** (`hedge: {after: 70ms}`, just past the healthy maximum);
//! **envoy** (`hedge_policy: {hedge_on_per_try_timeout: true}` with a 70 ms `per_try_timeout`,
//! one retry on another host, least-request balancing); **haproxy** (no hedging: `timeout
//! server 70ms` with `retry-on response-timeout` and `redispatch`, least-connection balancing:
//! the slow attempt is abandoned and the call sent again). HAProxy and Envoy run when found.
//!
//! Measures: p50, p99 and p99.9 of the calls, p99 against the healthy run's (goal ≤ 1.3×),
//! attempts per call (the calls that reached any agent ÷ the calls made: a hedge that ran counts,
//! won or lost; goal ≤ 1.1), failed calls.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use agent_reach::config::{parse_policy, Policy};

use crate::support::fleet::{quantile, Done, Load, Proxy, ReachFleet};
use crate::support::proxies::{envoy_bootstrap, envoy_endpoints};
use crate::{MockAgent, MockConfig, Mode, Workload, LATENCY, SEED};
use testkit::bench::Tools;

const AGENTS: usize = 3;
const WORKERS: usize = 8;
/// The slow agent's share of slow calls, and how slow they are (10× the mean of 40 ms).
const SLOW_SHARE: f64 = 0.05;
const SLOW: Duration = Duration::from_millis(400);
/// The fixed hedge (and Envoy's per-try timeout, HAProxy's server timeout).
const AFTER: Duration = Duration::from_millis(70);

pub(crate) struct Row {
    name: String,
    calls: usize,
    failed: usize,
    p50: f64,
    p99: f64,
    p999: f64,
    attempts: f64,
}

/// Runs every router wanted (`routers`: agent-reach, haproxy, envoy) and prints the table.
pub(crate) async fn run_all(tools: &Tools, dir: &Path, seconds: u64, routers: &[&str]) {
    let duration = Duration::from_secs(seconds);
    println!(
        "\nslow-tail: {AGENTS} agents ({}–{} ms), one takes {} ms on {:.0} % of its calls; {WORKERS} callers, {seconds} s per run",
        LATENCY.min.as_millis(),
        LATENCY.max.as_millis(),
        SLOW.as_millis(),
        SLOW_SHARE * 100.0
    );
    println!(
        "{:<24} {:>6} {:>7} {:>7} {:>8} {:>7} {:>9} {:>7}",
        "router", "calls", "p50 ms", "p99 ms", "p99.9 ms", "p99/hl", "att/call", "failed"
    );
    let wanted = |r: &str| routers.contains(&r);
    let mut runs: Vec<(&str, Router)> = Vec::new();
    if wanted("agent-reach") {
        runs.push(("healthy", Router::Reach(None)));
        runs.push(("agent-reach", Router::Reach(None)));
        runs.push(("agent-reach/hedge-p95", Router::Reach(Some("p95".into()))));
        runs.push((
            "agent-reach/hedge-70ms",
            Router::Reach(Some(format!("{}ms", AFTER.as_millis()))),
        ));
    }
    if wanted("envoy") {
        if let Some(b) = &tools.envoy {
            runs.push(("envoy", Router::Envoy(b.clone())));
        }
    }
    if wanted("haproxy") {
        if let Some(b) = &tools.haproxy {
            runs.push(("haproxy", Router::Haproxy(b.clone())));
        }
    }
    let mut healthy_p99 = None;
    for (name, router) in runs {
        let slow = name != "healthy";
        match run(&router, slow, dir, duration).await {
            Ok((calls, attempts)) => {
                let row = Row {
                    name: name.to_owned(),
                    calls: calls.len(),
                    failed: calls.iter().filter(|c| !c.ok()).count(),
                    p50: quantile(&calls, 0.5),
                    p99: quantile(&calls, 0.99),
                    p999: quantile(&calls, 0.999),
                    attempts,
                };
                if !slow {
                    healthy_p99 = Some(row.p99);
                }
                print_row(&row, healthy_p99);
            }
            Err(err) => println!("{name:<24} cannot run: {err}"),
        }
    }
    println!(
        "p99/hl: p99 ÷ the healthy run's p99 (agent-reach, no slow calls; goal ≤ 1.3×); att/call: calls that reached an agent ÷ calls \
         made (goal ≤ 1.1); failed: calls without a 200.\nhaproxy cannot hedge: it abandons an attempt \
         at its {} ms server timeout and retries on another agent.",
        AFTER.as_millis()
    );
}

fn print_row(r: &Row, healthy_p99: Option<f64>) {
    let ratio = healthy_p99
        .filter(|h| *h > 0.0)
        .map_or("-".to_owned(), |h| format!("{:.2}x", r.p99 / h));
    println!(
        "{:<24} {:>6} {:>7.1} {:>7.1} {:>8.1} {:>7} {:>9.2} {:>7}",
        r.name, r.calls, r.p50, r.p99, r.p999, ratio, r.attempts, r.failed
    );
}

enum Router {
    /// agent-reach, with `hedge.after` when hedging.
    Reach(Option<String>),
    Envoy(std::path::PathBuf),
    Haproxy(std::path::PathBuf),
}

/// One run: the calls, and the attempts per call.
async fn run(
    router: &Router,
    slow: bool,
    dir: &Path,
    duration: Duration,
) -> Result<(Vec<Done>, f64), String> {
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        let mut config = MockConfig::new(&format!("agent-{}", i + 1));
        config.latency = LATENCY;
        let workload = Workload {
            seed: Some(SEED + 37 + i as u64),
            long_share: SLOW_SHARE,
            long_latency: SLOW,
            ..Workload::default()
        };
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let agent = MockAgent::start_with(any, config, workload)
            .await
            .map_err(|e| format!("agent {}: {e}", i + 1))?;
        agents.push(agent);
    }
    let result = drive(router, slow, &agents, dir, duration).await;
    for a in agents {
        a.stop().await;
    }
    result
}

async fn drive(
    router: &Router,
    slow: bool,
    agents: &[MockAgent],
    dir: &Path,
    duration: Duration,
) -> Result<(Vec<Done>, f64), String> {
    let addrs: Vec<SocketAddr> = agents.iter().map(|a| a.addr).collect();
    enum Front {
        Reach(Box<ReachFleet>),
        Proxy(Proxy),
    }
    let front = match router {
        Router::Reach(hedge) => {
            let policy = policy(hedge.as_deref())?;
            let named: Vec<(String, SocketAddr)> = agents
                .iter()
                .map(|a| (a.name().to_owned(), a.addr))
                .collect();
            Front::Reach(Box::new(
                ReachFleet::start(&named, policy.clone(), |_| policy.clone()).await?,
            ))
        }
        Router::Envoy(binary) => {
            Front::Proxy(Proxy::envoy(binary, dir, |port| envoy_config(port, &addrs)).await?)
        }
        Router::Haproxy(binary) => {
            Front::Proxy(Proxy::haproxy(binary, dir, |port| haproxy_config(port, &addrs)).await?)
        }
    };
    let url = match &front {
        Front::Reach(f) => f.url(),
        Front::Proxy(p) => p.url(),
    };
    // The slow calls begin with the load, after the readiness calls.
    if slow {
        agents[0].set_mode(Mode::LongTasks);
    }
    let reached = || agents.iter().map(|a| a.stats().business).sum::<u64>();
    let before = reached();
    let load = Load::start(&url, WORKERS, Duration::ZERO);
    let until = Instant::now() + duration;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while Instant::now() < until {
        tick.tick().await;
    }
    let calls = load.finish().await;
    let attempts = reached().saturating_sub(before) as f64 / calls.len().max(1) as f64;
    match front {
        Front::Reach(f) => f.stop().await,
        Front::Proxy(p) => p.stop(),
    }
    Ok((calls, attempts))
}

fn policy(hedge: Option<&str>) -> Result<Policy, String> {
    let text = match hedge {
        Some(after) => {
            format!("capabilities: {{ code-review: {{ hedge: {{ after: {after}, max: 1 }} }} }}")
        }
        None => "{}".to_owned(),
    };
    parse_policy(Path::new("slow-tail.yaml"), &text).map_err(|e| e.to_string())
}

fn haproxy_config(port: u16, agents: &[SocketAddr]) -> String {
    let servers: String = agents
        .iter()
        .enumerate()
        .map(|(i, a)| format!("  server a{i} {a}\n"))
        .collect();
    format!(
        "global\n  nbthread 1\n  maxconn 4096\n\
         defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server {}ms\n  option http-keep-alive\n  option http-buffer-request\n\
         \x20 retries 1\n  option redispatch 1\n  retry-on conn-failure empty-response response-timeout 500 502 503 504\n\
         frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
         backend b\n  balance leastconn\n{servers}",
        AFTER.as_millis()
    )
}

fn envoy_config(port: u16, agents: &[SocketAddr]) -> String {
    let hedge = "              hedge_policy: { hedge_on_per_try_timeout: true }\n";
    let retry = format!(
        r#"                    retry_on: "5xx,reset,connect-failure"
                    num_retries: 1
                    per_try_timeout: {after}s
"#,
        after = AFTER.as_secs_f64()
    );
    let cluster = format!(
        r#"    lb_policy: LEAST_REQUEST
    circuit_breakers: {{ thresholds: [ {{ max_retries: 1000 }} ] }}
    load_assignment:
      cluster_name: agents
      endpoints:
      - lb_endpoints:
{}"#,
        envoy_endpoints(agents, "        ")
    );
    envoy_bootstrap("slow-tail", port, hedge, &retry, &cluster)
}
