//! Predicted saturation, end to end: an agent whose queue climbs steadily publishes a saturation
//! above its current one, exports it as a metric, and a caller scores it with the prediction, so
//! its share drops before it refuses anything (docs/reach-model.md, "Predicted saturation").
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::config::{HumanDuration, Policy, PositiveCount};
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::{MockConfig, Mode};

const WEAK: &str = "weak-1";
const STRONG: &str = "strong-1";

/// Polled self-views go stale fast enough to follow a climb second by second.
fn policy() -> Policy {
    let mut policy = Policy::default();
    policy.peer_views.poll_interval = HumanDuration::from_millis(100);
    policy
}

async fn agent_sidecar(name: &str, mode: Mode) -> (testkit::MockAgent, Sidecar) {
    let mut config = MockConfig::new(name);
    config.mode = mode;
    let agent = mock(config).await;
    let mut bootstrap = Bootstrap::local(name, agent.addr, &[CAP]).unwrap();
    bootstrap.agent.max_concurrency = PositiveCount::new(60).unwrap();
    bootstrap.agent.queue.capacity = 10;
    bootstrap.agent.queue.max_wait = HumanDuration::from_secs(60);
    let sidecar = sidecar_with(bootstrap, policy(), Default::default()).await;
    (agent, sidecar)
}

/// One more request the weak agent never answers, sent straight to its sidecar (not through the
/// caller, so the caller's own attempts do not blur what it reads).
fn hang_one(inbound: SocketAddr) {
    tokio::spawn(async move {
        let url = format!("http://{inbound}/review");
        send(&client(), "POST", &url, &[], "x = 1").await
    });
}

#[tokio::test]
async fn a_climbing_queue_is_predicted_and_scored_before_it_refuses() {
    let (weak_agent, weak) = agent_sidecar(WEAK, Mode::Hang).await;
    let (_strong_agent, strong) = agent_sidecar(STRONG, Mode::Normal).await;
    let caller_bootstrap = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer(WEAK, weak.addrs.inbound, &[CAP])
        .unwrap()
        .with_peer(STRONG, strong.addrs.inbound, &[CAP])
        .unwrap();
    let caller = sidecar_with(caller_bootstrap, policy(), Default::default()).await;

    // Five more requests a second on 60 slots: a steady climb, far from full for a while.
    let climbing = {
        let inbound = weak.addrs.inbound;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            for _ in 0..100 {
                tick.tick().await;
                hang_one(inbound);
            }
        })
    };
    eventually(
        Duration::from_secs(10),
        "the weak agent predicts a saturation above its current one",
        || async {
            let e = weak.status().self_view.estimates;
            e.saturation < 0.8 && e.saturation_predicted > e.saturation + 0.1
        },
    )
    .await;

    let metrics = get(&client(), &format!("http://{}/metrics", weak.addrs.admin))
        .await
        .body;
    let gauge = metrics
        .lines()
        .find(|l| l.starts_with("reach_self_saturation_predicted_ratio"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(gauge.is_some_and(|g| g > 0.0), "{gauge:?}\n{metrics}");

    // The caller scores both: calls it routes go to the strong agent's quick answers (or hang
    // on the weak one, which adds to its climb); either way each is a scoring.
    let mut scored = false;
    let mut last = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !scored && tokio::time::Instant::now() < deadline {
        let outbound = caller.addrs.outbound;
        let _ = tokio::time::timeout(Duration::from_millis(300), call(&client(), outbound)).await;
        let status = caller.status();
        let view = |name: &str| status.peer_views.iter().find(|p| p.name == name).cloned();
        let (Some(weak_view), Some(strong_view)) = (view(WEAK), view(STRONG)) else {
            continue;
        };
        let (Some(weak_factors), Some(strong_factors), Some(own)) = (
            weak_view.last_factors,
            strong_view.last_factors,
            weak_view.self_view.as_ref().map(|s| s.view.estimates),
        ) else {
            continue;
        };
        // Scored with the peer's prediction, not just its load now: it is not full yet, and
        // already scores below the strong agent by more than its current load explains.
        // The scoring may have read an older view than `own` (the caller's hung calls time out
        // and leave, so the load can dip): look again until one scoring shows it.
        scored = own.saturation < 0.8
            && own.saturation_predicted > own.saturation + 0.1
            && weak_factors.saturation > own.saturation + 0.05
            && weak_factors.score < strong_factors.score;
        last = format!("{weak_factors:?} vs {own:?}; strong {strong_factors:?}");
    }
    assert!(
        scored,
        "the caller never scored the weak agent by its prediction while it climbed: {last}"
    );
    assert_eq!(weak.status().inbound.rejected, 0, "nothing refused yet");
    climbing.abort();
    weak_agent.kill();
}
