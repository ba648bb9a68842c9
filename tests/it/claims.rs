//! What other members claim about themselves, held to what this sidecar can afford: a member
//! whose profile names ever new capabilities (as an A2A card rotating its skills would) grows
//! no caller's `/metrics` past `metrics.max_capabilities`, and what it stopped claiming is
//! forgotten with its series after `metrics.idle_timeout`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_reach::gossip::{self, NodeOptions, Profile};
use agent_reach::Bootstrap;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_claiming_ever_new_capabilities_grows_no_callers_metrics_past_the_cap() {
    let dir = std::env::temp_dir().join(format!("reach-claims-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("gossip.key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    let mut b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_gossip(&[], key.clone());
    if let Some(g) = b.gossip.as_mut() {
        g.probe_interval = agent_reach::config::HumanDuration::from_millis(200);
        g.refresh_interval = agent_reach::config::HumanDuration::from_millis(200);
    }
    let mut policy = agent_reach::config::Policy::default();
    policy.metrics.max_capabilities = 8;
    // A claim gone this long is forgotten with its series.
    policy.metrics.idle_timeout = agent_reach::config::HumanDuration::from_secs(1);
    let caller = sidecar_with(b, policy, Default::default()).await;
    let seed = caller.addrs.gossip.unwrap();
    let metrics = || async {
        get(&client(), &format!("http://{}/metrics", caller.addrs.admin))
            .await
            .body
    };

    let stop = tokio_util::sync::CancellationToken::new();
    let (transport, inbox, bound) = gossip::transport::udp(any_port(), stop.clone())
        .await
        .unwrap();
    let mut options = NodeOptions::new(
        "churner",
        bound,
        gossip::ClusterKey::from_file(&key).unwrap(),
    );
    options.probe_interval = Duration::from_millis(200);
    options.refresh_interval = Duration::from_millis(200);
    let node = gossip::spawn(options, transport, inbox, Arc::new(Quiet), stop.clone());
    node.announce(vec![seed]);
    // 16 new skill ids every 50 ms, 40 rounds: 640 names.
    let mut first_round = String::new();
    for round in 0..40 {
        node.publish_profile(Profile {
            inbound: "127.0.0.1:9".into(),
            zone: String::new(),
            region: String::new(),
            max_concurrency: 4,
            capabilities: (0..16)
                .map(|i| wire_capability(&format!("skill-{round}-{i}")))
                .collect(),
            version: "churn".into(),
            identity: None,
        });
        if round == 0 {
            eventually(
                Duration::from_secs(10),
                "the caller hears the churner",
                || async {
                    // As a sidecar does until it has members: announce again.
                    node.announce(vec![seed]);
                    caller.status().peers.iter().any(|p| p.name == "churner")
                },
            )
            .await;
            // The first 16 names already pass the cap of 8.
            first_round = metrics().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eventually(
        Duration::from_secs(10),
        "the last round is heard",
        || async {
            caller
                .status()
                .peers
                .iter()
                .any(|p| p.capabilities.iter().any(|c| c == "skill-39-0"))
        },
    )
    .await;
    let during = metrics().await;
    let named = |text: &str| {
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split("capability=\"").nth(1)?.split('"').next())
            .filter(|n| n.starts_with("skill-"))
            .collect();
        names.sort_unstable();
        names.dedup();
        names.len()
    };
    assert!(
        named(&during) <= 8,
        "{} claimed names have series",
        named(&during)
    );
    assert!(during.contains("capability=\"other\""));
    // Flat: 624 names more claimed since the first round, and the exposition is as large.
    assert!(
        during.len() <= first_round.len() + 2_000,
        "/metrics grew from {} to {} bytes",
        first_round.len(),
        during.len()
    );
    // The churn stops: the member claims one capability now. Every churned name is forgotten
    // with its series, and the steady one gets a label of its own.
    node.publish_profile(Profile {
        inbound: "127.0.0.1:9".into(),
        zone: String::new(),
        region: String::new(),
        max_concurrency: 4,
        capabilities: vec![wire_capability("steady")],
        version: "churn".into(),
        identity: None,
    });
    eventually(
        Duration::from_secs(10),
        "the churned claims are forgotten",
        || async {
            let text = metrics().await;
            named(&text) == 0 && text.contains("capability=\"steady\"")
        },
    )
    .await;
    let after = metrics().await;
    assert!(
        after.len() <= first_round.len() + 2_000,
        "/metrics is {} bytes after the churn, {} before",
        after.len(),
        first_round.len()
    );
    stop.cancel();
    let _ = std::fs::remove_dir_all(&dir);
}
