//! The admin port: metrics after traffic (valid for promtool), liveness, readiness, status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use agent_reach::config::{ConfigPaths, HumanDuration, MetricsPolicy, Policy};
use agent_reach::Bootstrap;
use support::*;
use testkit::MockConfig;

#[tokio::test]
async fn metrics_count_requests_after_traffic() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(call(&c, pair.outbound()).await.status, 200);
    }
    let unknown = send(
        &c,
        "GET",
        &format!("http://{}/", pair.outbound()),
        &[("reach-capability", "nope")],
        "",
    )
    .await;
    assert_eq!(unknown.status, 404);

    let caller = get(&c, &format!("http://{}/metrics", pair.caller.addrs.admin)).await;
    assert_eq!(caller.status, 200);
    let text = &caller.body;
    assert!(
        text.contains(r#"reach_requests_total{direction="outbound",capability="code-review",outcome="success"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"reach_peer_requests_total{peer="coder-1",outcome="success"} 3"#),
        "{text}"
    );
    assert!(
        // A name nobody serves is labelled `unknown`: typed names must not grow the series.
        text.contains(r#"reach_no_candidate_total{capability="unknown"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("# TYPE reach_request_duration_seconds histogram"),
        "{text}"
    );

    let callee = get(&c, &format!("http://{}/metrics", pair.callee.addrs.admin))
        .await
        .body;
    assert!(
        callee.contains(r#"reach_requests_total{direction="inbound",capability="code-review",outcome="success"} 3"#),
        "{callee}"
    );
    assert!(callee.contains("reach_inbound_in_flight 0"), "{callee}");
    assert!(
        callee.contains("reach_inbound_time_to_first_byte_seconds_bucket"),
        "{callee}"
    );
    promtool_accepts(&callee);
    promtool_accepts(text);
}

/// A caller with many peers: every peer is counted in `reach_peers{state}` and every call in
/// the per-capability aggregates, but at most `metrics.max_peer_series` peers with traffic get
/// series of their own, and they expire once idle for `metrics.idle_timeout`.
#[tokio::test]
async fn per_peer_series_are_bounded_and_expire() {
    let mut agents = Vec::new();
    let mut callees = Vec::new();
    let mut caller =
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    for i in 0..5 {
        let (name, cap) = (format!("peer-{i}"), format!("cap-{i}"));
        let agent = mock(MockConfig::new(&name)).await;
        let callee = sidecar(Bootstrap::local(&name, agent.addr, &[cap.as_str()]).unwrap()).await;
        caller = caller
            .with_peer(&name, callee.addrs.inbound, &[cap.as_str()])
            .unwrap();
        agents.push(agent);
        callees.push(callee);
    }
    let policy = Policy {
        metrics: MetricsPolicy {
            max_peer_series: 2,
            idle_timeout: HumanDuration::from_secs(1),
            ..MetricsPolicy::default()
        },
        ..Policy::default()
    };
    let caller = sidecar_with(caller, policy, ConfigPaths::default()).await;
    let c = client();
    let metrics = || {
        let c = c.clone();
        let url = format!("http://{}/metrics", caller.addrs.admin);
        async move { get(&c, &url).await.body }
    };
    let call_cap = |i: usize| {
        let c = c.clone();
        let url = format!("http://{}/review", caller.addrs.outbound);
        async move {
            let cap = format!("cap-{i}");
            send(&c, "POST", &url, &[("reach-capability", cap.as_str())], "x").await
        }
    };
    for i in 0..4 {
        assert_eq!(call_cap(i).await.status, 200, "cap-{i}");
    }

    let text = metrics().await;
    promtool_accepts(&text);
    let tracked = |text: &str| {
        let mut peers: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("reach_peer_requests_total{"))
            .filter_map(|l| l.split('"').nth(1).map(str::to_owned))
            .collect();
        peers.dedup();
        peers
    };
    assert_eq!(tracked(&text), ["peer-0", "peer-1"], "{text}");
    for i in 0..4 {
        let line = format!(
            r#"reach_requests_total{{direction="outbound",capability="cap-{i}",outcome="success"}} 1"#
        );
        assert!(text.contains(&line), "{line}\n{text}");
    }
    assert!(!text.contains(r#"peer="peer-2""#), "{text}");
    // Every known peer is counted by state, whether or not it has series of its own.
    eventually(Duration::from_secs(5), "reach_peers sums to 5", || async {
        let text = metrics().await;
        let total: f64 = text
            .lines()
            .filter(|l| l.starts_with("reach_peers{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        total == 5.0
    })
    .await;

    // Idle for a second: the tracked peers' series go, and their slots are free again.
    eventually(
        Duration::from_secs(10),
        "idle peers' series expire",
        || async { tracked(&metrics().await).is_empty() },
    )
    .await;
    assert_eq!(call_cap(3).await.status, 200);
    let text = metrics().await;
    assert_eq!(tracked(&text), ["peer-3"], "{text}");
    assert!(
        text.contains(
            r#"reach_requests_total{direction="outbound",capability="cap-3",outcome="success"} 2"#
        ),
        "the aggregates never expire: {text}"
    );
    promtool_accepts(&text);
}

/// `promtool check metrics` when promtool is installed (`.ci/run` installs it).
fn promtool_accepts(text: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        support::skip::skip(
            "the exposition-format check (tests/it/admin.rs)",
            "promtool not installed (Debian's prometheus package)",
            support::skip::InCi::Fails,
        );
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}\n{text}"
    );
}

#[tokio::test]
async fn live_ready_and_status() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let c = client();
    let admin = pair.caller.addrs.admin;
    assert_eq!(get(&c, &format!("http://{admin}/live")).await.status, 200);
    assert_eq!(get(&c, &format!("http://{admin}/ready")).await.status, 200);
    assert_eq!(get(&c, &format!("http://{admin}/nope")).await.status, 404);

    assert_eq!(call(&c, pair.outbound()).await.status, 200);
    let status = get(&c, &format!("http://{}/status", pair.callee.addrs.admin))
        .await
        .json();
    assert_eq!(status["agent"]["name"], "coder-1");
    assert_eq!(status["agent"]["capabilities"][0]["name"], CAP);
    assert_eq!(status["inbound"]["requests"], 1);
    assert_eq!(status["inbound"]["successes"], 1);
    assert_eq!(status["load"]["in_flight"], 0);
    assert_eq!(status["ready"], true);

    let caller = get(&c, &format!("http://{admin}/status")).await.json();
    assert_eq!(caller["peers"][0]["name"], "coder-1");
    assert_eq!(caller["peers"][0]["capabilities"][0], CAP);
}

// The admin port shows state, not secrets: a webhook URL's token and password never appear, and
// a reader off the pod's loopback sees no allow list, target, callback host or webhook at all.
#[tokio::test]
async fn status_shows_no_secret_and_the_policys_lists_only_on_loopback() {
    let agent = mock(MockConfig::new("payee")).await;
    let mut policy = Policy::default();
    policy.escalation.webhook =
        Some("https://ops:hunter2@hooks.example/escalate?token=s3cret".to_owned());
    policy.authorization.capabilities.insert(
        CAP.to_owned(),
        agent_reach::config::CapabilityAuthorization {
            allow: Some(vec![agent_reach::identity::IdentityPattern::parse(
                "spiffe://t.example/ns/billing/sa/*",
            )
            .unwrap()]),
            served_by: None,
        },
    );
    let side = sidecar_with(
        Bootstrap::local("payee", agent.addr, &[CAP]).unwrap(),
        policy,
        ConfigPaths::default(),
    )
    .await;
    let local = get(&client(), &format!("http://{}/status", side.addrs.admin)).await;
    assert_eq!(local.status, 200);
    for secret in ["hunter2", "s3cret"] {
        assert!(
            !local.body.contains(secret),
            "{secret} shown: {}",
            local.body
        );
    }
    let json = local.json();
    assert!(json["policy"]["escalation"]["webhook"]
        .as_str()
        .is_some_and(|u| u.contains("hooks.example/escalate")));
    assert!(json["policy"]["authorization"]["capabilities"][CAP]["allow"].is_array());
    assert!(json.get("hidden").is_none());
    // Off loopback (the pod network), as the admin handler shows it to such a reader.
    let remote = serde_json::to_value(side.status().shown_to(false)).unwrap();
    let text = remote.to_string();
    assert!(!text.contains("billing"), "{text}");
    assert!(!text.contains("hooks.example"), "{text}");
    assert!(remote["hidden"]
        .as_str()
        .is_some_and(|h| h.contains("loopback")));
    assert_eq!(remote["agent"]["name"], "payee", "state is still shown");
}
