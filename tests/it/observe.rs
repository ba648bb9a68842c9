//! Observe-only mode over real sockets: a fleet with one fake-online agent, the caller routing as
//! a plain proxy (round robin, nothing excluded) while counting what the model would have
//! avoided; switched off live, the next calls route around the broken agent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;

use agent_reach::config::{CapabilityPolicy, Policy};
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::{MockAgent, MockConfig, Mode};

async fn fleet(policy: Policy) -> (Vec<(MockAgent, Sidecar)>, Sidecar) {
    let mut caller =
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    let mut agents = Vec::new();
    for name in ["coder-1", "coder-2", "coder-3"] {
        let mut config = MockConfig::new(name);
        if name == "coder-2" {
            config.mode = Mode::RateLimited;
        }
        let agent = mock(config).await;
        // The fleet shares one policy: the callees observe too.
        let callee = sidecar_with(
            Bootstrap::local(name, agent.addr, &[CAP]).unwrap(),
            policy.clone(),
            Default::default(),
        )
        .await;
        caller = caller
            .with_peer(name, callee.addrs.inbound, &[CAP])
            .unwrap();
        agents.push((agent, callee));
    }
    let caller = sidecar_with(caller, policy, Default::default()).await;
    (agents, caller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_only_routes_round_robin_and_counts_what_the_model_would_have_avoided() {
    let mut policy = Policy::default();
    policy.capabilities.insert(
        CAP.to_owned(),
        CapabilityPolicy {
            observe_only: Some(true),
            ..CapabilityPolicy::default()
        },
    );
    let (agents, caller) = fleet(policy.clone()).await;
    let c = client();
    let mut failed = 0;
    for _ in 0..60 {
        let reply = call(&c, caller.addrs.outbound).await;
        if reply.status != 200 {
            assert_eq!(reply.status, 429, "{}", reply.body);
            assert_eq!(reply.header("reach-attempts"), "1", "no retry on a refusal");
            failed += 1;
        }
    }
    // A plain proxy: every agent a third of the calls, the broken one's failing.
    for (agent, _) in &agents {
        let n = agent.stats().business;
        assert!((19..=21).contains(&n), "{}: {n} of 60", agent.name());
    }
    assert!((19..=21).contains(&failed), "{failed} failed");

    let metrics = get(&client(), &format!("http://{}/metrics", caller.addrs.admin))
        .await
        .body;
    let same = counter(
        &metrics,
        &format!("reach_observe_calls_total{{capability=\"{CAP}\",agreement=\"same\"}}"),
    );
    let different = counter(
        &metrics,
        &format!("reach_observe_calls_total{{capability=\"{CAP}\",agreement=\"different\"}}"),
    );
    assert_eq!(same + different, 60, "{metrics}");
    let avoidable = counter(
        &metrics,
        &format!("reach_observe_avoidable_failures_total{{capability=\"{CAP}\"}}"),
    );
    // Once the model has seen coder-2 refuse, it would have sent those calls elsewhere.
    assert!(
        avoidable >= 10,
        "{avoidable} of {failed} failures avoidable:\n{metrics}"
    );
    assert!(avoidable <= failed);
    let status = get(&client(), &format!("http://{}/status", caller.addrs.admin))
        .await
        .json();
    let in_status = &status["observe"][CAP];
    assert_eq!(in_status["calls"], 60, "{status}");
    assert_eq!(in_status["avoidable_failures"], avoidable, "{status}");
    assert!(
        in_status["avoidable_latency_ms"].as_f64().is_some(),
        "{status}"
    );
    let page = send(
        &client(),
        "GET",
        &format!("http://{}/?format=html", caller.addrs.admin),
        &[],
        "",
    )
    .await
    .body;
    assert!(
        page.contains("Observe-only"),
        "the page shows the comparison"
    );
    let observed = caller.observed();
    assert_eq!(observed.len(), 1);
    assert_eq!(observed[0].1.calls, 60);
    assert_eq!(observed[0].1.avoidable_failures, avoidable);

    // Off, live: the next calls are the model's, around the broken agent.
    policy.capabilities.clear();
    for sidecar in agents.iter().map(|(_, s)| s).chain([&caller]) {
        let snapshot = sidecar.store().snapshot();
        assert!(sidecar
            .store()
            .replace(snapshot.bootstrap.clone(), policy.clone()));
    }
    let broken_before = agents[1].0.stats().business;
    for _ in 0..30 {
        let reply = call(&c, caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    assert!(
        agents[1].0.stats().business <= broken_before + 1,
        "the model still sent calls to the agent it ejected"
    );
}
