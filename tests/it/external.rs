//! External targets: plain services with no sidecar, measured by the caller itself and held to
//! their rate limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use crate::mock_agent::MockConfig;
use agent_reach::config::{ExternalTarget, Name, Policy, RateLimit, TargetEndpoint};
use agent_reach::Bootstrap;
use support::*;

fn target(addr: SocketAddr, rate_limit: Option<RateLimit>) -> ExternalTarget {
    ExternalTarget {
        name: Name::parse("inventory").unwrap(),
        capability: Name::parse("inventory").unwrap(),
        endpoints: vec![TargetEndpoint::parse(&addr.to_string()).unwrap()],
        ca_file: None,
        timeout: None,
        max_concurrency: Some(8),
        rate_limit,
        budget_group: None,
    }
}

async fn caller_with(policy: Policy) -> agent_reach::Sidecar {
    let bootstrap = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    sidecar_with(bootstrap, policy, Default::default()).await
}

#[tokio::test]
async fn an_external_target_is_routed_to_and_measured() {
    let service = mock(MockConfig::new("inventory-svc")).await;
    let mut policy = Policy::default();
    policy.targets.push(target(service.addr, None));
    let caller = caller_with(policy).await;
    let url = format!("http://{}/stock", caller.addrs.outbound);
    let reply = send(
        &client(),
        "GET",
        &url,
        &[("reach-capability", "inventory")],
        "",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["agent"], "inventory-svc");
    let status = caller.status();
    assert_eq!(
        status
            .peers
            .iter()
            .find(|p| p.name == "inventory-1")
            .map(|p| p.source),
        Some("external")
    );
    let view = status
        .peer_views
        .into_iter()
        .find(|p| p.name == "inventory-1")
        .unwrap();
    assert!(
        view.view.estimates.latency_ms.is_some(),
        "the caller measured it: {view:?}"
    );
    assert!(view.self_view.is_none(), "a plain service has no self-view");
}

#[tokio::test]
async fn an_external_target_over_its_rate_limit_is_refused_at_once() {
    let service = mock(MockConfig::new("inventory-svc")).await;
    let mut policy = Policy::default();
    policy.targets.push(target(
        service.addr,
        Some(RateLimit {
            per_second: 0.1,
            burst: 2,
        }),
    ));
    let caller = caller_with(policy).await;
    let url = format!("http://{}/stock", caller.addrs.outbound);
    let c = client();
    for _ in 0..2 {
        assert_eq!(
            send(&c, "GET", &url, &[("reach-capability", "inventory")], "")
                .await
                .status,
            200
        );
    }
    let reply = tokio::time::timeout(
        Duration::from_secs(2),
        send(&c, "GET", &url, &[("reach-capability", "inventory")], ""),
    )
    .await
    .expect("refused at once, not queued");
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "rate_limited");
    assert!(!reply.header("retry-after").is_empty());
    assert_eq!(
        service.stats().business,
        2,
        "the third call never reached the service"
    );
}
