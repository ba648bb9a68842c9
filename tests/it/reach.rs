//! The reachability model end to end: fake-online agents leave rotation, busy agents get no new
//! work, recovered agents ramp back in, probes report why they failed and stay out of the way.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_reach::config::{HumanDuration, Policy, PositiveCount};
use agent_reach::peers::PeerStatus;
use agent_reach::reach::State;
use agent_reach::Sidecar;
use demo::{demo_policy, Fleet};
use support::*;
use testkit::{MockConfig, Mode};

fn peer(caller: &Sidecar, name: &str) -> Option<PeerStatus> {
    caller
        .status()
        .peer_views
        .into_iter()
        .find(|p| p.name == name)
}

/// Calls through the caller until `n` have completed; returns how many failed.
/// Waits until the caller routes to every agent as healthy (a cold fleet starts on parole).
async fn all_healthy(fleet: &Fleet) {
    eventually(
        Duration::from_secs(15),
        "every peer is healthy for the caller",
        || async {
            let views = fleet.caller.status().peer_views;
            views.len() == fleet.agents.len()
                && views.iter().all(|p| p.effective_state == State::Healthy)
        },
    )
    .await;
}

async fn calls(fleet: &Fleet, n: usize) -> usize {
    let c = client();
    let mut failed = 0;
    for _ in 0..n {
        if call(&c, fleet.caller.addrs.outbound).await.status != 200 {
            failed += 1;
        }
    }
    failed
}

#[tokio::test]
async fn a_caller_learns_its_peers_self_view() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    eventually(
        Duration::from_secs(10),
        "the caller has the peer's self-view",
        || async { peer(&pair.caller, "coder-1").is_some_and(|p| p.self_view.is_some()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_online_agent_leaves_rotation_under_traffic_and_callers_barely_notice() {
    let fleet = Fleet::start(demo_policy()).await.unwrap();
    all_healthy(&fleet).await;
    assert_eq!(calls(&fleet, 60).await, 0);
    let broken = &fleet.agents[1].0;
    let before = broken.stats().business;
    // Routing weighs latency among healthy peers, so a busy machine may skew the early split;
    // what matters is that the agent was in rotation before the fault.
    assert!(
        before > 0,
        "the agent was in rotation before the fault: {before}"
    );

    broken.set_mode(Mode::RateLimited);
    // Its /healthz still says 200: only business calls show the fault.
    let health = get(&client(), &format!("http://{}/healthz", broken.addr)).await;
    assert_eq!(health.status, 200);

    let failed = calls(&fleet, 100).await;
    eventually(
        Duration::from_secs(10),
        "the agent is out of rotation",
        || async { peer(&fleet.caller, "coder-2").is_some_and(|p| p.effective_cap == 0.0) },
    )
    .await;
    let reached = broken.stats().business;
    let failed_after = calls(&fleet, 200).await;
    let reached_after = broken.stats().business - reached;
    assert_eq!(reached_after, 0, "an ejected agent gets no new work");
    assert!(
        failed + failed_after <= 3,
        "callers saw {} of 300 calls fail",
        failed + failed_after
    );
    let status = fleet.agents[1].1.status();
    assert_eq!(status.self_view.state, State::Ejected);
    assert_eq!(
        status.last_probe.and_then(|p| p.reason).as_deref(),
        Some("status 429")
    );
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_traffic_a_fake_online_agent_leaves_rotation_after_its_next_probe() {
    let mut policy = demo_policy();
    policy.probes.interval = HumanDuration::from_secs(1);
    let fleet = Fleet::start(policy).await.unwrap();
    // Let every agent graduate from parole on probes alone.
    eventually(Duration::from_secs(15), "coder-2 is healthy", || async {
        fleet.agents[1].1.status().self_view.state == State::Healthy
    })
    .await;
    fleet.agents[1].0.set_mode(Mode::RateLimited);
    let broke = tokio::time::Instant::now();
    eventually(
        Duration::from_secs(10),
        "coder-2 is out of rotation for the caller",
        || async { peer(&fleet.caller, "coder-2").is_some_and(|p| p.effective_cap == 0.0) },
    )
    .await;
    // One probe interval (1 s), a confirming probe (0.5 s) and a self-view poll (0.25 s).
    let took = broke.elapsed();
    assert!(took < Duration::from_secs(4), "took {took:?}");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_agent_ramps_back_in() {
    let fleet = Fleet::start(demo_policy()).await.unwrap();
    calls(&fleet, 30).await;
    fleet.agents[1].0.set_mode(Mode::RateLimited);
    calls(&fleet, 30).await;
    eventually(Duration::from_secs(10), "ejected", || async {
        peer(&fleet.caller, "coder-2").is_some_and(|p| p.effective_state == State::Ejected)
    })
    .await;
    fleet.agents[1].0.set_mode(Mode::Normal);
    let caps = Arc::new(std::sync::Mutex::new(Vec::new()));
    eventually(Duration::from_secs(20), "healthy again", || async {
        let p = peer(&fleet.caller, "coder-2").unwrap();
        caps.lock()
            .unwrap()
            .push((p.effective_state, p.effective_cap));
        p.effective_state == State::Healthy
    })
    .await;
    let seen = caps.lock().unwrap().clone();
    let ramp: Vec<f64> = seen
        .iter()
        .filter(|(s, _)| *s == State::Recovering)
        .map(|(_, c)| *c)
        .collect();
    assert!(ramp.len() >= 3, "recovering was seen ramping: {seen:?}");
    assert!(
        ramp.windows(2).all(|w| w[1] >= w[0]),
        "the cap only grows while recovering: {ramp:?}"
    );
    assert!(
        ramp[0] < 0.5 && ramp.iter().any(|c| *c > ramp[0]),
        "{ramp:?}"
    );
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reporting_busy_gets_no_new_work_while_busy() {
    let fleet = Fleet::start(demo_policy()).await.unwrap();
    all_healthy(&fleet).await;
    // coder-1's agent holds its workspace lock and says so through its own sidecar.
    let busy_sidecar = &fleet.agents[0].1;
    let url = format!("http://{}/reach/v1/busy", busy_sidecar.addrs.outbound);
    let reply = send(
        &client(),
        "PUT",
        &url,
        &[],
        r#"{"busy": true, "in_flight": 1}"#,
    )
    .await;
    assert_eq!(reply.status, 204, "{}", reply.body);
    eventually(
        Duration::from_secs(10),
        "the caller sees coder-1 saturated",
        || async {
            peer(&fleet.caller, "coder-1")
                .and_then(|p| p.self_view)
                .is_some_and(|s| s.view.estimates.busy && s.view.estimates.saturation == 1.0)
        },
    )
    .await;
    let before = fleet.agents[0].0.stats().business;
    assert_eq!(calls(&fleet, 100).await, 0);
    assert_eq!(
        fleet.agents[0].0.stats().business,
        before,
        "a busy agent got new work"
    );

    let reply = send(&client(), "PUT", &url, &[], r#"{"busy": false}"#).await;
    assert_eq!(reply.status, 204);
    eventually(
        Duration::from_secs(10),
        "coder-1 takes work again",
        || async {
            calls(&fleet, 20).await;
            fleet.agents[0].0.stats().business > before
        },
    )
    .await;
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_bad_busy_report_is_a_clear_400() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let url = format!("http://{}/reach/v1/busy", pair.callee.addrs.outbound);
    let reply = send(&client(), "PUT", &url, &[], r#"{"busy": "very"}"#).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"], "bad_request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_skipped_while_the_agent_is_saturated() {
    let mut config = MockConfig::new("coder-1");
    config.mode = Mode::Hang;
    let agent = mock(config).await;
    let mut bootstrap = agent_reach::Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap();
    bootstrap.agent.max_concurrency = PositiveCount::new(2).unwrap();
    bootstrap.agent.capabilities[0].probe = Some(agent_reach::config::ProbeSpec {
        method: "POST".into(),
        path: "/review".into(),
        body: None,
        headers: Default::default(),
        expect_status: 200,
        expect_body: None,
        expect_json: None,
        interval: Some(HumanDuration::from_millis(200)),
        timeout: Some(HumanDuration::from_millis(100)),
    });
    let mut policy = Policy::default();
    policy.probes.fast_interval = HumanDuration::from_millis(200);
    let sidecar = sidecar_with(bootstrap, policy, Default::default()).await;
    let inbound = sidecar.addrs.inbound;
    // Two hanging calls fill both slots.
    let _busy: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move { get(&client(), &format!("http://{inbound}/review")).await })
        })
        .collect();
    eventually(Duration::from_secs(10), "both slots taken", || async {
        sidecar.status().load.in_flight == 2
    })
    .await;
    let probes_at_full = agent.stats().probes;
    let admin = sidecar.addrs.admin;
    eventually(
        Duration::from_secs(10),
        "a skipped probe is counted",
        || async move {
            get(&client(), &format!("http://{admin}/metrics"))
                .await
                .body
                .contains(
                    r#"reach_probes_total{capability="code-review",result="skipped_saturated"}"#,
                )
        },
    )
    .await;
    assert_eq!(
        agent.stats().probes,
        probes_at_full,
        "no probe took the agent's last slot"
    );
    agent.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_failure_reason_shows_in_status() {
    let fleet = Fleet::start(demo_policy()).await.unwrap();
    fleet.agents[2].0.set_mode(Mode::Hang);
    let admin = fleet.agents[2].1.addrs.admin;
    eventually(
        Duration::from_secs(15),
        "the probe timed out",
        || async move {
            let status = get(&client(), &format!("http://{admin}/status"))
                .await
                .json();
            status["last_probe"]["reason"] == "timeout" && status["last_probe"]["ok"] == false
        },
    )
    .await;
    fleet.agents[2].0.kill();
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_peer_available_answers_at_once_with_the_candidate_snapshot() {
    let fleet = Fleet::start(demo_policy()).await.unwrap();
    for (agent, _) in &fleet.agents {
        agent.set_mode(Mode::RateLimited);
    }
    let done = AtomicU64::new(0);
    eventually(
        Duration::from_secs(15),
        "every peer is out of rotation",
        || async {
            calls(&fleet, 3).await;
            done.fetch_add(1, Ordering::Relaxed);
            fleet
                .caller
                .status()
                .peer_views
                .iter()
                .all(|p| p.effective_cap == 0.0)
        },
    )
    .await;
    let reply = tokio::time::timeout(
        Duration::from_secs(2),
        call(&client(), fleet.caller.addrs.outbound),
    )
    .await
    .expect("answered at once, never a hang");
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "no_available_instance");
    let body = reply.json();
    let candidates = body["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 3);
    assert!(
        candidates.iter().all(|c| c["passed_over"]
            .as_str()
            .is_some_and(|r| r.contains("ejected"))),
        "{body}"
    );
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_budget_stops_retries_under_a_sustained_failure() {
    let mut policy = demo_policy();
    policy.retry.budget.ratio = 0.0;
    policy.retry.budget.min_per_second = 0;
    policy.retry.budget.ttl = HumanDuration::from_secs(10);
    // Long cool-offs and no probes out of trouble: the fleet stays broken for the whole test.
    policy.states.refusals_as_failure = 1000;
    let fleet = Fleet::start(policy).await.unwrap();
    all_healthy(&fleet).await;
    for (agent, _) in &fleet.agents {
        agent.set_mode(Mode::RateLimited);
    }
    let c = client();
    let mut attempts = 0;
    for _ in 0..30 {
        let reply = call(&c, fleet.caller.addrs.outbound).await;
        attempts += reply.header("reach-attempts").parse::<u32>().unwrap_or(0);
    }
    // Without a budget 30 calls would make up to 90 attempts; this one allows no retry at all.
    assert!(attempts <= 30, "{attempts} attempts for 30 calls");
    let admin = fleet.caller.addrs.admin;
    let metrics = get(&client(), &format!("http://{admin}/metrics"))
        .await
        .body;
    assert!(
        counter(
            &metrics,
            "reach_retry_budget_exhausted_total{capability=\"code-review\"}"
        ) > 0,
        "{metrics}"
    );
    fleet.shutdown().await;
}
