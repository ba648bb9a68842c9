//! **provider-budget**: three agents (20 ms), each with its own mock model provider
//! (its own account) that it calls once for every task; agent-1's account allows far fewer
//! requests than the others' (a window longer than the run: it does not reset in it). A task
//! whose model call is refused answers 429 (`retry-after: 1`). Six callers in a closed loop.
//!
//! Runs: **agent-reach** (each agent calls its provider through its own sidecar, where the
//! provider is an external target: the sidecar reads the rate-limit headers and publishes the
//! agent's model headroom, which the callers' sidecar scores by; the caller reads the peers'
//! views every 100 ms); **agent-reach/no-steer** (the same, with `model_budgets: { steer: false }`
//! in every sidecar's policy: the headroom is learned and published but not scored by; the
//! caller's sidecar still retries a 429 on another agent); **haproxy** and
//! **envoy** (agents call their providers directly; Envoy retries `retriable_status_codes:
//! [429]` on other hosts, two retries; HAProxy's `retry-on` takes no 429 (2.6: 401, 403, 404,
//! 408, 425 and 5xx only), so it has `retry-on` 5xx with `redispatch`, two retries, and its
//! callers get the agents' 429s).
//!
//! Measures: the 429s the agents got from their providers, the 429s the callers got, failed
//! calls (any answer but 200; goal 0), p95; the drained agent's share of the tasks: from the
//! start of the load to the end of the first half second in which it was under 5 % of them
//! (*low at*), and when its budget was gone (*gone at*: its provider's first 429, or its last
//! request served). Goal: low before gone.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use agent_reach::config::{ExternalTarget, HumanDuration, Name, Policy, TargetEndpoint};

use crate::support::fleet::{quantile, Done, Load, Proxy, ReachFleet};
use crate::support::proxies::{envoy_bootstrap, envoy_endpoints};
use crate::{Latency, MockAgent, MockConfig};
use testkit::bench::Tools;
use testkit::{ModelCall, ProviderBudget, ProviderHeaders};

const AGENTS: usize = 3;
const WORKERS: usize = 6;
/// The agent whose account is small.
const DRAINED: usize = 0;
/// Its budget: requests per second of the run (a third of what a fair share would spend).
const SMALL_PER_SECOND: u64 = 25;
/// The others' budget, per window: never spent.
const LARGE: u64 = 1_000_000;
/// The capability the agents' sidecars name their provider by.
const LLM: &str = "llm";
/// After a failed call a caller pauses this long.
const FAIL_PAUSE: Duration = Duration::from_millis(20);

struct Row {
    name: &'static str,
    calls: usize,
    agent_429: u64,
    caller_429: usize,
    failed: usize,
    p95: f64,
    low_at: Option<Duration>,
    gone_at: Option<Duration>,
    used: u64,
}

/// Runs every router wanted (`routers`: agent-reach, haproxy, envoy) and prints the table.
pub(crate) async fn run_all(tools: &Tools, dir: &Path, seconds: u64, routers: &[&str]) {
    let duration = Duration::from_secs(seconds);
    let small = SMALL_PER_SECOND * seconds;
    println!(
        "\nprovider-budget: {AGENTS} agents (20 ms), one model call per task to each agent's own provider; \
         agent-1's allows {small} requests in {} s, the others' {LARGE}; {WORKERS} callers, {seconds} s per run",
        2 * seconds
    );
    println!(
        "{:<20} {:>6} {:>9} {:>10} {:>7} {:>7} {:>8} {:>8} {:>9}",
        "router",
        "calls",
        "429 agent",
        "429 caller",
        "failed",
        "p95 ms",
        "low at",
        "gone at",
        "used"
    );
    let wanted = |r: &str| routers.contains(&r);
    let mut runs: Vec<(&'static str, Router)> = Vec::new();
    if wanted("agent-reach") {
        runs.push(("agent-reach", Router::Reach { steer: true }));
        runs.push(("agent-reach/no-steer", Router::Reach { steer: false }));
    }
    if wanted("haproxy") {
        if let Some(b) = &tools.haproxy {
            runs.push(("haproxy", Router::Haproxy(b.clone())));
        }
    }
    if wanted("envoy") {
        if let Some(b) = &tools.envoy {
            runs.push(("envoy", Router::Envoy(b.clone())));
        }
    }
    for (name, router) in runs {
        match run(name, &router, dir, duration, small).await {
            Ok(row) => print_row(&row, small),
            Err(err) => println!("{name:<20} cannot run: {err}"),
        }
    }
    println!(
        "429 agent: the providers' 429s to the agents; 429 caller: the callers' (goal 0); failed: calls \
         without a 200 (goal 0).\nlow at: from the load's start to the end of the first half second in \
         which agent-1 got under 5 % of the tasks; gone at: when its budget was spent (goal: low before \
         gone); used: its requests served.\nagent-reach/no-steer: model_budgets.steer: false, the \
         headroom learned and published but not scored by.\nhaproxy: its \
         `retry-on` takes no 429, so an agent's 429 reaches the caller."
    );
}

fn print_row(r: &Row, small: u64) {
    let at =
        |d: Option<Duration>| d.map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    println!(
        "{:<20} {:>6} {:>9} {:>10} {:>7} {:>7.1} {:>8} {:>8} {:>9}",
        r.name,
        r.calls,
        r.agent_429,
        r.caller_429,
        r.failed,
        r.p95,
        at(r.low_at),
        at(r.gone_at),
        format!("{}/{small}", r.used)
    );
}

enum Router {
    /// `model_budgets.steer` in every sidecar's policy.
    Reach {
        steer: bool,
    },
    Envoy(std::path::PathBuf),
    Haproxy(std::path::PathBuf),
}

async fn run(
    name: &'static str,
    router: &Router,
    dir: &Path,
    duration: Duration,
    small: u64,
) -> Result<Row, String> {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut providers = Vec::new();
    let mut agents = Vec::new();
    let mut result = Ok(());
    for i in 0..AGENTS {
        let mut config = MockConfig::new(&format!("provider-{}", i + 1));
        config.provider = ProviderBudget {
            requests: Some(if i == DRAINED { small } else { LARGE }),
            window: duration * 2,
            headers: ProviderHeaders::Honest,
            ..ProviderBudget::default()
        };
        match MockAgent::start(any, config).await {
            Ok(p) => providers.push(p),
            Err(e) => {
                result = Err(format!("provider {}: {e}", i + 1));
                break;
            }
        }
        let mut config = MockConfig::new(&format!("agent-{}", i + 1));
        config.latency = Latency::fixed(Duration::from_millis(20));
        match MockAgent::start(any, config).await {
            Ok(a) => agents.push(a),
            Err(e) => {
                result = Err(format!("agent {}: {e}", i + 1));
                break;
            }
        }
    }
    let row = match result {
        Ok(()) => drive(name, router, &agents, &providers, dir, duration, small).await,
        Err(e) => Err(e),
    };
    for a in agents.into_iter().chain(providers) {
        a.stop().await;
    }
    row
}

async fn drive(
    name: &'static str,
    router: &Router,
    agents: &[MockAgent],
    providers: &[MockAgent],
    dir: &Path,
    duration: Duration,
    small: u64,
) -> Result<Row, String> {
    let addrs: Vec<SocketAddr> = agents.iter().map(|a| a.addr).collect();
    enum Front {
        Reach(Box<ReachFleet>),
        Proxy(Proxy),
    }
    let front = match router {
        Router::Reach { steer } => {
            let named: Vec<(String, SocketAddr)> = agents
                .iter()
                .map(|a| (a.name().to_owned(), a.addr))
                .collect();
            let mut caller = Policy::default();
            caller.peer_views.poll_interval = HumanDuration::from_millis(100);
            caller.model_budgets.steer = *steer;
            let targets: Vec<ExternalTarget> = providers
                .iter()
                .map(|p| llm_target(p.addr))
                .collect::<Result<_, String>>()?;
            let agent_policy = |i: usize| {
                let mut p = Policy::default();
                p.model_budgets.steer = *steer;
                p.targets.extend(targets.get(i).cloned());
                p
            };
            Front::Reach(Box::new(
                ReachFleet::start(&named, caller, agent_policy).await?,
            ))
        }
        Router::Envoy(binary) => {
            Front::Proxy(Proxy::envoy(binary, dir, |port| envoy_config(port, &addrs)).await?)
        }
        Router::Haproxy(binary) => {
            Front::Proxy(Proxy::haproxy(binary, dir, |port| haproxy_config(port, &addrs)).await?)
        }
    };
    // Each task calls the agent's model: through its sidecar under agent-reach, else straight
    // at the provider. From now on (the readiness calls spent nothing).
    for (i, agent) in agents.iter().enumerate() {
        let outbound = match &front {
            Front::Reach(f) => f.sidecars[i].addrs.outbound,
            Front::Proxy(_) => providers[i].addr,
        };
        agent.set_model(ModelCall {
            outbound,
            capability: LLM.to_owned(),
        });
    }
    let url = match &front {
        Front::Reach(f) => f.url(),
        Front::Proxy(p) => p.url(),
    };
    let load = Load::start(&url, WORKERS, FAIL_PAUSE);
    let started = load.started;
    let until = Instant::now() + duration;
    // Every 100 ms: what reached each agent and the drained provider's count.
    let mut samples: Vec<(Duration, Vec<u64>)> = Vec::new();
    let mut gone_at = None;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while Instant::now() < until {
        tick.tick().await;
        let p = providers[DRAINED].provider_stats();
        if gone_at.is_none() && (p.refused > 0 || p.served >= small) {
            gone_at = Some(started.elapsed());
        }
        samples.push((
            started.elapsed(),
            agents.iter().map(|a| a.stats().business).collect(),
        ));
    }
    let calls: Vec<Done> = load.finish().await;
    match front {
        Front::Reach(f) => f.stop().await,
        Front::Proxy(p) => p.stop(),
    }
    let low_at = samples.windows(6).find_map(|w| {
        let (first, last) = (&w[0].1, &w[w.len() - 1].1);
        let got = |i: usize| last[i].saturating_sub(first[i]);
        let all: u64 = (0..AGENTS).map(got).sum();
        (all > 0 && (got(DRAINED) as f64) < 0.05 * all as f64).then_some(w[w.len() - 1].0)
    });
    Ok(Row {
        name,
        calls: calls.len(),
        agent_429: providers.iter().map(|p| p.provider_stats().refused).sum(),
        caller_429: calls.iter().filter(|c| c.status == 429).count(),
        failed: calls.iter().filter(|c| !c.ok()).count(),
        p95: quantile(&calls, 0.95),
        low_at,
        gone_at,
        used: providers[DRAINED].provider_stats().served,
    })
}

fn llm_target(provider: SocketAddr) -> Result<ExternalTarget, String> {
    Ok(ExternalTarget {
        name: Name::parse(LLM).map_err(|e| e.to_string())?,
        capability: Name::parse(LLM).map_err(|e| e.to_string())?,
        endpoints: vec![TargetEndpoint::parse(&provider.to_string()).map_err(|e| e.to_string())?],
        timeout: None,
        max_concurrency: None,
        rate_limit: None,
        budget_group: None,
        model_provider: true,
        ca_file: None,
    })
}

fn haproxy_config(port: u16, agents: &[SocketAddr]) -> String {
    let servers: String = agents
        .iter()
        .enumerate()
        .map(|(i, a)| format!("  server a{i} {a}\n"))
        .collect();
    format!(
        "global\n  nbthread 1\n  maxconn 4096\n\
         defaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  timeout server 10s\n  option http-keep-alive\n  option http-buffer-request\n\
         \x20 retries 2\n  option redispatch 1\n  retry-on conn-failure empty-response 500 502 503 504\n\
         frontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n\
         backend b\n  balance roundrobin\n{servers}"
    )
}

fn envoy_config(port: u16, agents: &[SocketAddr]) -> String {
    let retry = r#"                    retry_on: "retriable-status-codes,5xx,reset,connect-failure"
                    retriable_status_codes: [429]
                    num_retries: 2
"#;
    let cluster = format!(
        r#"    lb_policy: ROUND_ROBIN
    circuit_breakers: {{ thresholds: [ {{ max_retries: 1000 }} ] }}
    load_assignment:
      cluster_name: agents
      endpoints:
      - lb_endpoints:
{}"#,
        envoy_endpoints(agents, "        ")
    );
    envoy_bootstrap("provider-budget", port, "", retry, &cluster)
}
