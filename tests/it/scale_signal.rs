//! The signal to scale on: a local fleet found by gossip over UDP on loopback, slow agents so
//! calls stay in flight, callers added in steps. Every sidecar's `/metrics` shows the fleet's
//! demand ratio rise with the callers and fall when they stop, the capacity is the sum of the
//! agents' `max_concurrency`, and the series go when no member serves the capability.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_reach::config::{HumanDuration, PositiveCount};
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::{Latency, MockAgent, MockConfig};
use tokio_util::sync::CancellationToken;

const AGENTS: usize = 3;
const SLOTS: usize = 4;
/// Long enough that a caller's call is almost always in flight.
const CALL: Duration = Duration::from_millis(800);

fn key_file() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agent-reach-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gossip.key");
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, hex).unwrap();
    path
}

/// A sidecar in the fleet: fast gossip and a short refresh tick, so the test runs in seconds.
async fn fleet_sidecar(bootstrap: Bootstrap, seeds: &[SocketAddr], key: &Path) -> Sidecar {
    let mut bootstrap = bootstrap.with_gossip(seeds, key.to_path_buf());
    if let Some(g) = bootstrap.gossip.as_mut() {
        g.probe_interval = HumanDuration::from_millis(200);
        g.probe_timeout = HumanDuration::from_millis(100);
        g.refresh_interval = HumanDuration::from_millis(300);
        g.suspect_timeout = HumanDuration::from_secs(1);
    }
    let mut policy = agent_reach::config::Policy::default();
    policy.peer_views.poll_interval = HumanDuration::from_millis(100);
    sidecar_with(bootstrap, policy, Default::default()).await
}

/// The value of `series` on `sidecar`'s `/metrics`, if it has one.
async fn gauge(sidecar: &Sidecar, series: &str) -> Option<f64> {
    let text = get(
        &client(),
        &format!("http://{}/metrics", sidecar.addrs.admin),
    )
    .await
    .body;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

const RATIO: &str = r#"reach_capability_demand_ratio{capability="code-review"}"#;
const CAPACITY: &str = r#"reach_capability_capacity{capability="code-review"}"#;

/// Whether every sidecar reports `series` = `value` now.
async fn all_report(sidecars: &[&Sidecar], series: &str, value: f64) -> bool {
    for s in sidecars {
        match gauge(s, series).await {
            Some(v) if (v - value).abs() < 1e-9 => {}
            _ => return false,
        }
    }
    true
}

/// `n` callers, each keeping one call in flight through `outbound` until stopped.
fn callers(
    outbound: SocketAddr,
    n: usize,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    call(&client(), outbound).await;
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demand_ratio_follows_the_callers_and_every_sidecar_reports_the_same() {
    let key = key_file();
    let caller = fleet_sidecar(
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap(),
        &[],
        &key,
    )
    .await;
    let seed = [caller.addrs.gossip.unwrap()];
    let mut agents: Vec<(MockAgent, Sidecar)> = Vec::new();
    for i in 0..AGENTS {
        let name = format!("agent-{i}");
        let mut config = MockConfig::new(&name);
        config.latency = Latency::fixed(CALL);
        let agent = mock(config).await;
        let mut bootstrap = Bootstrap::local(&name, agent.addr, &[CAP]).unwrap();
        bootstrap.agent.max_concurrency = PositiveCount::new(SLOTS).unwrap();
        // Room for a caller's call that lands on a full agent: queued, still demand.
        bootstrap.agent.queue.capacity = 8;
        let sidecar = fleet_sidecar(bootstrap, &seed, &key).await;
        agents.push((agent, sidecar));
    }
    let sidecars: Vec<&Sidecar> = agents
        .iter()
        .map(|(_, s)| s)
        .chain(std::iter::once(&caller))
        .collect();
    let capacity = (AGENTS * SLOTS) as f64;

    // Idle: every sidecar knows the whole fleet's slots, and no demand.
    eventually(
        Duration::from_secs(10),
        "the fleet's capacity everywhere",
        || all_report(&sidecars, CAPACITY, capacity),
    )
    .await;
    eventually(Duration::from_secs(5), "no demand while idle", || {
        all_report(&sidecars, RATIO, 0.0)
    })
    .await;
    let status = caller.status();
    let review = status
        .capabilities
        .iter()
        .find(|c| c.name == CAP)
        .expect("code-review in /status");
    assert_eq!((review.members, review.capacity), (AGENTS, capacity as u64));

    // Callers in steps: the ratio follows, and every sidecar shows the same figure.
    let stop = CancellationToken::new();
    let mut running = Vec::new();
    for total in [3, 9] {
        running.extend(callers(caller.addrs.outbound, total - running.len(), &stop));
        let expected = total as f64 / capacity;
        eventually(
            Duration::from_secs(10),
            &format!("every sidecar reporting {total} calls over {capacity} slots"),
            || all_report(&sidecars, RATIO, expected),
        )
        .await;
    }

    stop.cancel();
    for c in running {
        c.await.unwrap();
    }
    eventually(
        Duration::from_secs(5),
        "the ratio back to 0 after the callers stop",
        || all_report(&sidecars, RATIO, 0.0),
    )
    .await;
    assert!(all_report(&sidecars, CAPACITY, capacity).await);

    // No member serves the capability any longer: its series go.
    for (agent, sidecar) in agents {
        sidecar.kill().await;
        agent.stop().await;
    }
    eventually(
        Duration::from_secs(10),
        "the series gone with the last member",
        || async {
            gauge(&caller, RATIO).await.is_none() && gauge(&caller, CAPACITY).await.is_none()
        },
    )
    .await;
    assert!(caller.status().capabilities.is_empty());
    caller.kill().await;
}
