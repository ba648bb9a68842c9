//! Overload is not failure, and a refusal that proves the agent never saw a call moves the call
//! to another peer: a burst above the fleet's room sheds the excess without ejecting anyone; a
//! killed agent's calls go elsewhere; an agent that refuses connections is out at once and back
//! as soon as it listens again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::config::PositiveCount;
use agent_reach::reach::State;
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::{Latency, MockAgent, MockConfig};

/// `n` agents (20 ms, `max_concurrency` 2, no queue) behind their sidecars, and a caller that
/// knows them all as static peers.
async fn fleet(n: usize) -> (Vec<(MockAgent, Sidecar)>, Sidecar) {
    let mut agents = Vec::new();
    let mut caller =
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    for i in 0..n {
        let name = format!("coder-{}", i + 1);
        let mut config = MockConfig::new(&name);
        config.latency = Latency::fixed(Duration::from_millis(20));
        let agent = mock(config).await;
        let mut bootstrap = Bootstrap::local(&name, agent.addr, &[CAP]).unwrap();
        bootstrap.agent.max_concurrency = PositiveCount::new(2).unwrap();
        bootstrap.agent.queue.capacity = 0;
        let callee = sidecar(bootstrap).await;
        caller = caller
            .with_peer(&name, callee.addrs.inbound, &[CAP])
            .unwrap();
        agents.push((agent, callee));
    }
    (agents, sidecar(caller).await)
}

fn states(caller: &Sidecar) -> Vec<State> {
    caller
        .status()
        .peer_views
        .iter()
        .map(|p| p.view.state)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_above_the_fleets_room_sheds_the_excess_and_ejects_nobody() {
    let (_agents, caller) = fleet(3).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    // Every peer proves itself first, so a wrong count of refusals would move it to probation.
    for _ in 0..40 {
        assert_eq!(call(&client(), caller.addrs.outbound).await.status, 200);
    }
    // 60 calls at once against room for 6, three times over.
    for _ in 0..3 {
        let burst = spawn_posts(60, &url, &[("reach-capability", CAP)], "x");
        let mut served = 0;
        for reply in burst {
            let reply = reply.await.unwrap();
            match reply.status.as_u16() {
                200 => served += 1,
                503 => assert_eq!(reply.header("reach-reason"), "saturated", "{}", reply.body),
                other => panic!("{other}: {}", reply.body),
            }
        }
        assert!(served >= 6, "the fleet's room was used: {served} served");
    }
    let seen = states(&caller);
    assert!(
        seen.iter()
            .all(|s| matches!(s, State::Healthy | State::Parole)),
        "overload is load, not failure: {seen:?}"
    );
    // And the burst leaves nothing behind: the next calls are all served.
    for _ in 0..20 {
        let reply = call(&client(), caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_never_reached_a_killed_agent_go_to_another_peer() {
    let (agents, caller) = fleet(2).await;
    for _ in 0..20 {
        assert_eq!(call(&client(), caller.addrs.outbound).await.status, 200);
    }
    // The agent dies; its sidecar stays up and can only answer `502 upstream_connect_failed`.
    agents[0].0.kill();
    agents[0].0.crashed().await;
    for _ in 0..30 {
        // POSTs: not idempotent, yet safe to move, since the dead agent never saw them.
        let reply = call(&client(), caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.header("reach-agent"), "coder-2");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_refuses_connections_is_out_at_once_and_back_when_it_listens() {
    let config = MockConfig::new("coder-1");
    let pair = Pair::start(config).await;
    let addr = pair.agent.addr;
    for _ in 0..10 {
        assert_eq!(call(&client(), pair.outbound()).await.status, 200);
    }
    pair.agent.kill();
    pair.agent.crashed().await;
    // One call that finds nothing listening is enough: it is not noise.
    let url = format!("http://{}/review", pair.callee.addrs.inbound);
    let reply = send(&client(), "POST", &url, &[("reach-capability", CAP)], "x").await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert_eq!(pair.callee.status().self_view.state, State::Ejected);
    // Back on the same address: the sidecar's TCP check sees it within `fast_interval` (500 ms)
    // and it ramps up from recovering, with no cool-off.
    let back = MockAgent::start(addr, MockConfig::new("coder-1"))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(3),
        "recovering after its return",
        || async { pair.callee.status().self_view.state == State::Recovering },
    )
    .await;
    eventually(
        Duration::from_secs(3),
        "the caller sends it work again",
        || async { call(&client(), pair.outbound()).await.status == 200 },
    )
    .await;
    assert!(back.stats().business > 0);
}
