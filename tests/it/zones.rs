//! Zone tiers: calls stay in the caller's zone while it can serve, and spill to the region, then
//! anywhere, when it cannot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::reach::State;
use agent_reach::{Bootstrap, Sidecar};
use demo::demo_policy;
use support::*;
use testkit::{MockAgent, MockConfig, Mode};

struct ZonedFleet {
    agents: Vec<(MockAgent, Sidecar)>,
    caller: Sidecar,
}

/// coder-a in the caller's zone, coder-b in its region, coder-c in another region.
async fn zoned_fleet() -> ZonedFleet {
    let placement = [
        ("coder-a", "zone-a", "region-1"),
        ("coder-b", "zone-b", "region-1"),
        ("coder-c", "zone-c", "region-2"),
    ];
    let mut caller =
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    caller.agent.zone = "zone-a".into();
    caller.agent.region = "region-1".into();
    let mut agents = Vec::new();
    for (name, zone, region) in placement {
        let agent = mock(MockConfig::new(name)).await;
        let mut b = Bootstrap::local(name, agent.addr, &[CAP]).unwrap();
        b.agent.zone = zone.into();
        b.agent.region = region.into();
        let sidecar = sidecar_with(b, demo_policy(), Default::default()).await;
        caller = caller
            .with_peer(name, sidecar.addrs.inbound, &[CAP])
            .unwrap();
        let peer = caller.peers.last_mut().unwrap();
        peer.zone = zone.into();
        peer.region = region.into();
        agents.push((agent, sidecar));
    }
    let caller = sidecar_with(caller, demo_policy(), Default::default()).await;
    ZonedFleet { agents, caller }
}

async fn served_by(fleet: &ZonedFleet, n: usize) -> Vec<String> {
    let c = client();
    let mut out = Vec::new();
    for _ in 0..n {
        let reply = call(&c, fleet.caller.addrs.outbound).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        out.push(reply.header("reach-agent").to_owned());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_stay_in_the_zone_and_spill_when_it_is_out() {
    let fleet = zoned_fleet().await;
    eventually(Duration::from_secs(15), "every peer healthy", || async {
        let v = fleet.caller.status().peer_views;
        v.len() == 3 && v.iter().all(|p| p.effective_state == State::Healthy)
    })
    .await;
    let served = served_by(&fleet, 30).await;
    assert!(
        served.iter().all(|a| a == "coder-a"),
        "the zone serves while it can: {served:?}"
    );

    fleet.agents[0].0.set_mode(Mode::RateLimited);
    eventually(
        Duration::from_secs(15),
        "coder-a out of rotation",
        || async {
            served_by(&fleet, 3).await;
            fleet
                .caller
                .status()
                .peer_views
                .iter()
                .any(|p| p.name == "coder-a" && p.effective_cap == 0.0)
        },
    )
    .await;
    let served = served_by(&fleet, 30).await;
    assert!(
        served.iter().all(|a| a == "coder-b"),
        "the region is next: {served:?}"
    );
    let metrics = get(
        &client(),
        &format!("http://{}/metrics", fleet.caller.addrs.admin),
    )
    .await
    .body;
    assert!(
        metrics.contains("reach_tier_picks_total{tier=\"zone\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("reach_tier_picks_total{tier=\"region\"}"),
        "{metrics}"
    );
    for (agent, sidecar) in fleet.agents {
        sidecar.shutdown().await;
        agent.stop().await;
    }
}
