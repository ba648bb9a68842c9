//! The kubelet's probes of an agent under interception (`src/admin/app_probe.rs`): answered by
//! the agent through the sidecar's admin port, under strict and permissive mTLS, while the agent
//! is busy, never admitted as work nor counted as capability traffic. (The whole injected pod,
//! `init-net` and all, in network namespaces: `tests/it/intercept.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::config::{AppProbe, ConfigPaths, MtlsMode, Policy, PositiveCount};
use agent_reach::Bootstrap;
use support::*;
use testkit::{MockConfig, Mode};

/// A slow agent with one slot and no queue, behind a sidecar under `mode` whose admin port
/// runs the agent's liveness (`/healthz`) and readiness (its port) for the kubelet.
async fn busy_agent(mode: MtlsMode, tag: &str) -> (testkit::MockAgent, agent_reach::Sidecar) {
    let mut config = MockConfig::new("coder-1");
    config.mode = Mode::Slow;
    config.slow_latency = Duration::from_secs(3);
    let agent = mock(config).await;
    let mut b = Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap();
    b.agent.max_concurrency = PositiveCount::new(1).unwrap();
    b.agent.queue.capacity = 0;
    let port = agent.addr.port();
    b.app_probes.insert(
        "agent/livez".into(),
        AppProbe::Http {
            port,
            path: "/healthz".into(),
            headers: Default::default(),
            timeout_ms: None,
        },
    );
    b.app_probes.insert(
        "agent/readyz".into(),
        AppProbe::Tcp {
            port,
            timeout_ms: None,
        },
    );
    let dir = std::env::temp_dir().join(format!("reach-probes-{}-{tag}", std::process::id()));
    let ca = agent_reach::pki::DevCa::new("probe test CA").unwrap();
    b.tls = Some(
        ca.write_files(&dir, "spiffe://test.example/ns/agents/sa/coder")
            .unwrap(),
    );
    let mut policy = Policy::default();
    policy.mtls.mode = Some(mode);
    let side = sidecar_with(b, policy, ConfigPaths::default()).await;
    (agent, side)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_agents_probes_are_answered_by_the_agent_under_strict_and_permissive() {
    for (mode, tag) in [
        (MtlsMode::Strict, "strict"),
        (MtlsMode::Permissive, "permissive"),
    ] {
        let (agent, side) = busy_agent(mode, tag).await;
        let admin = side.addrs.admin;
        let probe = |kind: &'static str| async move {
            get(
                &client(),
                &format!("http://{admin}/app-health/agent/{kind}"),
            )
            .await
        };
        // Idle.
        assert_eq!(probe("livez").await.status, 200, "{tag}");
        assert_eq!(probe("readyz").await.status, 200, "{tag}");
        // Busy: its one slot taken (a peer's call, here a plaintext one the permissive sidecar
        // admits; under strict it is the admin port alone that matters).
        let url = format!("http://{}/review", side.addrs.inbound);
        let held = tokio::spawn(async move {
            send(&client(), "POST", &url, &[("reach-capability", CAP)], "x").await
        });
        if mode == MtlsMode::Permissive {
            eventually(Duration::from_secs(5), "the agent to be busy", || async {
                agent.stats().in_flight == 1
            })
            .await;
            // The agent's own port, as the kubelet would have probed it: judged as work.
            let direct = send(
                &client(),
                "GET",
                &format!("http://{}/healthz", side.addrs.inbound),
                &[],
                "",
            )
            .await;
            assert_eq!(direct.status, 503, "{}", direct.body);
        }
        for _ in 0..5 {
            let live = probe("livez").await;
            assert_eq!(live.status, 200, "{tag}: {}", live.body);
            assert_eq!(probe("readyz").await.status, 200, "{tag}");
        }
        assert_eq!(
            get(&client(), &format!("http://{admin}/app-health/agent/nope"))
                .await
                .status,
            404
        );
        // Never capability traffic.
        let metrics = get(&client(), &format!("http://{admin}/metrics"))
            .await
            .body;
        let counted = sum(&metrics, "reach_requests_total{", "direction=\"inbound\"");
        assert!(counted <= 2.0, "{tag}: probes counted as calls: {counted}");
        held.abort();
    }
}

// An agent that is down answers its probe 503 through the sidecar, saying why.
#[tokio::test]
async fn a_dead_agents_probe_fails() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let mut b = Bootstrap::local("gone", SocketAddr::from(([127, 0, 0, 1], port)), &[CAP]).unwrap();
    b.app_probes.insert(
        "agent/livez".into(),
        AppProbe::Http {
            port,
            path: "/healthz".into(),
            headers: Default::default(),
            timeout_ms: Some(500),
        },
    );
    let side = sidecar(b).await;
    let reply = get(
        &client(),
        &format!("http://{}/app-health/agent/livez", side.addrs.admin),
    )
    .await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains(&port.to_string()), "{}", reply.body);
}

// The pod is terminating: the agent container's preStop hook (`GET /drain` with the pod's
// token) makes its sidecar take no new call from that moment while the call in flight finishes,
// and the caller's calls go to the other agent; the hook answers once it has. Without the token,
// nobody drains an agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_agent_gets_no_new_call_and_finishes_the_one_in_flight() {
    let mut slow = MockConfig::new("stopping");
    slow.mode = Mode::Slow;
    slow.slow_latency = Duration::from_millis(1500);
    let stopping = mock(slow).await;
    let other = mock(MockConfig::new("other")).await;
    let mut b = Bootstrap::local("stopping", stopping.addr, &[CAP]).unwrap();
    b.drain_token = Some("s3cret-token".into());
    let stopping_side = sidecar(b).await;
    let other_side = sidecar(Bootstrap::local("other", other.addr, &[CAP]).unwrap()).await;
    let caller = sidecar(
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap()
            .with_peer("stopping", stopping_side.addrs.inbound, &[CAP])
            .unwrap()
            .with_peer("other", other_side.addrs.inbound, &[CAP])
            .unwrap(),
    )
    .await;
    let drain_url = format!("http://{}/drain", stopping_side.addrs.admin);
    let refused = send(
        &client(),
        "GET",
        &drain_url,
        &[("x-agent-reach-drain", "guess")],
        "",
    )
    .await;
    assert_eq!(refused.status, 403);
    let refused = get(&client(), &drain_url).await;
    assert_eq!(refused.status, 403);

    // One call in flight on the stopping agent.
    let url = format!("http://{}/review", stopping_side.addrs.inbound);
    let in_flight = tokio::spawn(async move {
        send(&client(), "POST", &url, &[("reach-capability", CAP)], "x").await
    });
    eventually(
        Duration::from_secs(5),
        "the call to be in flight",
        || async { stopping.stats().in_flight == 1 },
    )
    .await;
    let hook = tokio::spawn(async move {
        let began = std::time::Instant::now();
        let reply = send(
            &client(),
            "GET",
            &drain_url,
            &[("x-agent-reach-drain", "s3cret-token")],
            "",
        )
        .await;
        (reply, began.elapsed())
    });
    eventually(Duration::from_secs(5), "the sidecar to drain", || async {
        stopping_side.status().self_view.state == agent_reach::reach::State::Draining
    })
    .await;
    let before = stopping.stats().business;
    for _ in 0..20 {
        let reply = call(&client(), caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.json()["agent"], "other");
    }
    assert_eq!(
        stopping.stats().business,
        before,
        "a new call reached the stopping agent"
    );
    let (reply, took) = hook.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        took >= Duration::from_millis(300),
        "answered before the call finished: {took:?}"
    );
    assert_eq!(
        in_flight.await.unwrap().status,
        200,
        "the call in flight finished"
    );
}
