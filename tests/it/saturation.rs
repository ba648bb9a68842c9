//! The inbound side admits at most max_concurrency requests plus a bounded queue, and refuses the
//! rest at once with 503 `saturated` and `retry-after`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use agent_reach::config::{HumanDuration, PositiveCount};
use support::*;
use testkit::{MockConfig, Mode};

#[tokio::test]
async fn answers_503_saturated_at_once_when_slots_and_queue_are_full() {
    let mut config = MockConfig::new("coder-1");
    config.mode = Mode::Hang;
    let pair = Pair::start_with(config, |mut b| {
        b.agent.max_concurrency = PositiveCount::new(1).unwrap();
        b.agent.queue.capacity = 1;
        b.agent.queue.max_wait = HumanDuration::from_secs(60);
        b
    })
    .await;
    let outbound = pair.outbound();
    // One request takes the only slot, one waits in the queue.
    let busy: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { call(&client(), outbound).await }))
        .collect();
    eventually(
        Duration::from_secs(10),
        "one in flight and one queued",
        || async {
            let load = pair.callee.status().load;
            load.in_flight == 1 && load.queued == 1
        },
    )
    .await;

    let reply = tokio::time::timeout(Duration::from_secs(5), call(&client(), outbound))
        .await
        .expect("refused at once, not after the 60 s queue wait");
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "saturated");
    assert!(!reply.header("retry-after").is_empty());
    assert_eq!(reply.json()["error"], "saturated");
    assert_eq!(pair.callee.status().inbound.rejected, 1);
    // The two admitted requests are still waiting on the hung agent.
    assert!(busy.iter().all(|b| !b.is_finished()));
    pair.agent.kill();
}

#[tokio::test]
async fn a_queued_request_runs_when_a_slot_frees() {
    let mut config = MockConfig::new("coder-1");
    config.mode = Mode::Locked;
    config.latency = testkit::Latency::fixed(Duration::from_millis(100));
    let pair = Pair::start_with(config, |mut b| {
        b.agent.max_concurrency = PositiveCount::new(1).unwrap();
        b.agent.queue.capacity = 4;
        b.agent.queue.max_wait = HumanDuration::from_secs(10);
        b
    })
    .await;
    let outbound = pair.outbound();
    let calls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { call(&client(), outbound).await }))
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().status, 200);
    }
    let stats = pair.callee.status().inbound;
    assert_eq!((stats.requests, stats.successes, stats.rejected), (3, 3, 0));
}

#[tokio::test]
async fn a_queue_wait_that_runs_out_is_refused() {
    let mut config = MockConfig::new("coder-1");
    config.mode = Mode::Hang;
    let pair = Pair::start_with(config, |mut b| {
        b.agent.max_concurrency = PositiveCount::new(1).unwrap();
        b.agent.queue.capacity = 4;
        b.agent.queue.max_wait = HumanDuration::from_millis(200);
        b
    })
    .await;
    let outbound = pair.outbound();
    let _hung = tokio::spawn(async move { call(&client(), outbound).await });
    eventually(Duration::from_secs(10), "the slot is taken", || async {
        pair.callee.status().load.in_flight == 1
    })
    .await;
    let reply = call(&client(), outbound).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("reach-reason"), "saturated");
    pair.agent.kill();
}

#[tokio::test]
async fn an_agent_over_its_own_rate_limit_answers_429_at_once() {
    let pair = Pair::start_with(MockConfig::new("coder-1"), |mut b| {
        b.agent.rate_limit = Some(agent_reach::config::RateLimit {
            per_second: 0.1,
            burst: 1,
        });
        b
    })
    .await;
    let url = format!("http://{}/review", pair.callee.addrs.inbound);
    assert_eq!(get(&client(), &url).await.status, 200);
    let reply = get(&client(), &url).await;
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "rate_limited");
    assert!(!reply.header("retry-after").is_empty());
    assert_eq!(pair.agent.stats().business, 1);
}
