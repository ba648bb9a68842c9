//! `idempotency-key`: no task runs twice because of us — not when a peer retries, not when the
//! agent itself resends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use agent_reach::config::HumanDuration;
use support::*;
use testkit::{Latency, MockConfig};

/// An agent slower (1.2 s) than its declared timeout (1 s).
async fn slow_pair() -> Pair {
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(Duration::from_millis(1200));
    let pair = Pair::start_with(config, |mut b| {
        b.agent.capabilities[0].timeout = Some(HumanDuration::from_secs(1));
        b
    })
    .await;
    // The caller learns the peer's 1 s timeout from its self-view.
    eventually(
        Duration::from_secs(10),
        "the caller knows the peer",
        || async {
            pair.caller
                .status()
                .peer_views
                .first()
                .is_some_and(|p| p.self_view.is_some())
        },
    )
    .await;
    pair
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_that_timed_out_is_not_retried() {
    let pair = slow_pair().await;
    let url = format!("http://{}/review", pair.outbound());
    let reply = send(
        &client(),
        "POST",
        &url,
        &[("reach-capability", CAP)],
        "charge the card",
    )
    .await;
    assert_eq!(reply.status, 504, "{}", reply.body);
    assert_eq!(reply.header("reach-attempts"), "1");
    eventually(Duration::from_secs(5), "the agent saw the call", || async {
        pair.agent.stats().business == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pair.agent.stats().business, 1, "never run twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_that_timed_out_is_retried_and_runs_exactly_once() {
    let pair = slow_pair().await;
    let url = format!("http://{}/review", pair.outbound());
    let headers = [("reach-capability", CAP), ("idempotency-key", "order-42")];
    let reply = send(&client(), "POST", &url, &headers, "charge the card").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        reply.header("reach-attempts"),
        "2",
        "retried on the same agent"
    );
    assert_eq!(
        reply.header("reach-replayed"),
        "true",
        "answered from the original's outcome"
    );
    assert_eq!(pair.agent.stats().business, 1, "the agent ran it once");
}

#[tokio::test]
async fn the_same_key_sent_twice_by_the_agent_runs_once() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let url = format!("http://{}/review", pair.outbound());
    let headers = [("reach-capability", CAP), ("idempotency-key", "task-7")];
    let first = send(&client(), "POST", &url, &headers, "x").await;
    let second = send(&client(), "POST", &url, &headers, "x").await;
    assert_eq!((first.status.as_u16(), second.status.as_u16()), (200, 200));
    assert_eq!(first.header("reach-replayed"), "");
    assert_eq!(second.header("reach-replayed"), "true");
    assert_eq!(first.body, second.body);
    assert_eq!(pair.agent.stats().business, 1);
}

#[tokio::test]
async fn concurrent_duplicates_at_the_callee_join_the_original() {
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(Duration::from_millis(300));
    let pair = Pair::start(config).await;
    let url = format!("http://{}/review", pair.callee.addrs.inbound);
    let calls = spawn_posts(
        5,
        &url,
        &[("reach-capability", CAP), ("idempotency-key", "k")],
        "x",
    );
    for call in calls {
        assert_eq!(call.await.unwrap().status, 200);
    }
    assert_eq!(
        pair.agent.stats().business,
        1,
        "five duplicates, one execution"
    );
}
