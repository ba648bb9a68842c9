//! The gossip layer on its own, over the in-memory network: membership, dissemination, failure
//! detection, replay and forgery, with no sidecar around it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::gossip::{
    self, wire, ClusterKey, GossipHandle, Live, MemNetwork, Member, Membership, NodeOptions,
    Profile, Rejected,
};
use agent_reach::reach::State;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Seen {
    members: Mutex<Vec<String>>,
    lives: Mutex<HashMap<String, Live>>,
}

impl Membership for Seen {
    fn members(&self, members: &[Member]) {
        *self.members.lock().unwrap_or_else(|p| p.into_inner()) =
            members.iter().map(|m| m.name.clone()).collect();
    }
    fn live(&self, member: &Member, live: &Live) {
        self.lives
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(member.name.clone(), *live);
    }
}

impl Seen {
    fn members(&self) -> Vec<String> {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
    fn live_of(&self, name: &str) -> Option<Live> {
        self.lives
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .copied()
    }
}

struct Node {
    name: String,
    addr: SocketAddr,
    handle: GossipHandle,
    seen: Arc<Seen>,
    stop: CancellationToken,
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 4190))
}

fn profile(i: usize) -> Profile {
    Profile {
        // On the node's own IP, as a sidecar publishes it (others refuse any other).
        inbound: format!("{}:4143", addr(i).ip()),
        zone: String::new(),
        region: String::new(),
        max_concurrency: 4,
        capabilities: vec![],
        version: "test".into(),
    }
}

fn live(state: State, in_flight: u32) -> Live {
    Live {
        profile_seq: 0,
        state,
        state_age_s: 0,
        cap: 1000,
        availability: 1000,
        saturation: 0,
        latency_ms: Some(10),
        p50_ms: None,
        p95_ms: None,
        busy: false,
        cooling_down: false,
        in_flight,
        queued: 0,
    }
}

fn options(i: usize, key: &ClusterKey) -> NodeOptions {
    let mut o = NodeOptions::new(format!("agent-{i}"), addr(i), key.clone());
    o.probe_interval = Duration::from_millis(200);
    o.probe_timeout = Duration::from_millis(60);
    o.suspect_timeout = Duration::from_millis(600);
    o.refresh_interval = Duration::from_millis(500);
    o.min_publish_interval = Duration::from_millis(50);
    o
}

fn start(net: &Arc<MemNetwork>, i: usize, key: &ClusterKey) -> Node {
    let (transport, inbox) = net.join(addr(i));
    let seen = Arc::new(Seen::default());
    let stop = CancellationToken::new();
    let handle = gossip::spawn(
        options(i, key),
        transport,
        inbox,
        seen.clone(),
        stop.clone(),
    );
    handle.publish_profile(profile(i));
    handle.publish_live(live(State::Healthy, 0));
    if i != 0 {
        handle.announce(vec![addr(0)]);
    }
    Node {
        name: format!("agent-{i}"),
        addr: addr(i),
        handle,
        seen,
        stop,
    }
}

async fn eventually(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_fleet_finds_itself_from_one_seed_and_forgets_a_dead_member() {
    let net = MemNetwork::new();
    let key = ClusterKey::random();
    let nodes: Vec<Node> = (0..6).map(|i| start(&net, i, &key)).collect();
    eventually("everyone to see everyone", Duration::from_secs(10), || {
        nodes.iter().all(|n| n.seen.members().len() == 5)
    })
    .await;

    // A change reaches everyone.
    nodes[3].handle.publish_live(live(State::Draining, 7));
    eventually(
        "the draining state to spread",
        Duration::from_secs(5),
        || {
            nodes
                .iter()
                .filter(|n| n.name != "agent-3")
                .all(|n| n.seen.live_of("agent-3").map(|l| l.state) == Some(State::Draining))
        },
    )
    .await;

    // A node that vanishes leaves every table.
    net.cut(nodes[5].addr);
    nodes[5].stop.cancel();
    eventually("the dead node to leave", Duration::from_secs(10), || {
        nodes[..5]
            .iter()
            .all(|n| !n.seen.members().contains(&"agent-5".to_owned()))
    })
    .await;
    let status = nodes[0].handle.status();
    let dead = status.members.iter().find(|m| m.name == "agent-5");
    assert!(
        matches!(dead.map(|m| m.liveness), Some("down")),
        "{status:?}"
    );
}

#[tokio::test]
async fn forged_and_replayed_packets_are_dropped_and_counted() {
    let net = MemNetwork::new();
    let key = ClusterKey::random();
    let a = start(&net, 0, &key);
    let b = start(&net, 1, &key);
    eventually("the pair to meet", Duration::from_secs(10), || {
        a.seen.members().len() == 1 && b.seen.members().len() == 1
    })
    .await;

    // Someone without the key claims agent-1 moved to their address and is draining.
    let forger = ClusterKey::random();
    let forged_item = wire::Item {
        name: "agent-1".into(),
        node: wire::NodeId {
            addr: addr(99),
            epoch: u64::MAX,
        },
        seq: u64::MAX,
        body: wire::Body::Live(live(State::Draining, 0)),
    };
    let body = wire::encode(&vec![forged_item]).unwrap_or_default();
    let now = gossip::envelope::unix_us();
    let forged = forger.seal(gossip::envelope::Kind::Items, now, &body);
    net.inject(addr(99), addr(0), forged);
    net.inject(addr(99), addr(0), b"not even an envelope".to_vec());

    // A genuine packet recorded and played back later.
    let genuine = key.seal(gossip::envelope::Kind::Want, now, &[]);
    net.inject(addr(1), addr(0), genuine.clone());
    net.inject(addr(1), addr(0), genuine);
    let stale = key.seal(gossip::envelope::Kind::Want, now - 120_000_000, &[]);
    net.inject(addr(1), addr(0), stale);

    let stats = a.handle.stats().clone();
    eventually("the rejects to be counted", Duration::from_secs(5), || {
        stats.rejected(Rejected::BadMac) == 1
            && stats.rejected(Rejected::Malformed) == 1
            && stats.rejected(Rejected::Replayed) == 1
            && stats.rejected(Rejected::Expired) == 1
    })
    .await;
    assert_eq!(a.seen.members(), vec!["agent-1".to_owned()]);
    let state = a.seen.live_of("agent-1").map(|l| l.state);
    assert_eq!(
        state,
        Some(State::Healthy),
        "the forged state was not trusted"
    );
}

#[tokio::test]
async fn an_agent_restarted_at_the_same_address_is_routable_again_at_once() {
    let net = MemNetwork::new();
    let key = ClusterKey::random();
    let mut nodes: Vec<Node> = (0..4).map(|i| start(&net, i, &key)).collect();
    eventually("everyone to see everyone", Duration::from_secs(10), || {
        nodes.iter().all(|n| n.seen.members().len() == 3)
    })
    .await;
    // agent-3's container restarts in place: same address, new incarnation, before anyone
    // noticed it was gone (SWIM reports a rename, not a join).
    net.cut(addr(3));
    nodes[3].stop.cancel();
    let restarted = start(&net, 3, &key);
    restarted.handle.publish_live(live(State::Healthy, 42));
    nodes[3] = restarted;
    eventually(
        "the restarted agent's new view everywhere",
        Duration::from_secs(2),
        || {
            nodes[..3]
                .iter()
                .all(|n| n.seen.live_of("agent-3").is_some_and(|l| l.in_flight == 42))
        },
    )
    .await;
    eventually(
        "the restarted agent to know everyone",
        Duration::from_secs(2),
        || nodes[3].seen.members().len() == 3,
    )
    .await;
}

#[tokio::test]
async fn a_want_with_a_forged_source_is_not_answered() {
    let net = MemNetwork::new();
    let key = ClusterKey::random();
    let a = start(&net, 0, &key);
    let b = start(&net, 1, &key);
    eventually("the pair to meet", Duration::from_secs(10), || {
        a.seen.members().len() == 1 && b.seen.members().len() == 1
    })
    .await;
    // A victim that never joined, and a want (as B would send it) played back with the
    // victim's address as its source.
    let victim = addr(50);
    let (_victim_transport, mut victim_inbox) = net.join(victim);
    let asker = wire::encode(&wire::NodeId {
        addr: addr(1),
        epoch: 1,
    })
    .unwrap_or_default();
    let want = key.seal(
        gossip::envelope::Kind::Want,
        gossip::envelope::unix_us(),
        &asker,
    );
    net.inject(victim, addr(0), want);
    // The same want from the address it names is answered.
    let honest = key.seal(
        gossip::envelope::Kind::Want,
        gossip::envelope::unix_us(),
        &wire::encode(&wire::NodeId {
            addr: victim,
            epoch: 1,
        })
        .unwrap_or_default(),
    );
    net.inject(victim, addr(0), honest);
    let first = tokio::time::timeout(Duration::from_secs(2), victim_inbox.recv()).await;
    assert!(
        matches!(first, Ok(Some((from, _))) if from == addr(0)),
        "the honest want is answered"
    );
    let second = tokio::time::timeout(Duration::from_millis(500), victim_inbox.recv()).await;
    assert!(
        second.is_err(),
        "the forged want got an answer too: {second:?}"
    );
}

#[tokio::test]
async fn a_profile_too_large_to_gossip_is_refused_loudly() {
    let net = MemNetwork::new();
    let key = ClusterKey::random();
    let a = start(&net, 0, &key);
    let mut big = profile(0);
    for i in 0..40 {
        big.capabilities.push(gossip::wire::WireCapability {
            name: format!("capability-number-{i}"),
            tags: [("python".to_owned(), 900u16)].into_iter().collect(),
            timeout_ms: 30_000,
            mode: agent_reach::config::RouteMode::Sync,
            cost_milli: 0,
            idempotent: false,
        });
    }
    a.handle.publish_profile(big);
    let stats = a.handle.stats().clone();
    eventually(
        "the oversized profile to be counted",
        Duration::from_secs(2),
        || {
            stats
                .oversized_items
                .load(std::sync::atomic::Ordering::Relaxed)
                == 1
        },
    )
    .await;
}

/// Issue 12 (4): a sidecar restarted at its old address after a long run. The old incarnation's
/// items reached a high `seq` (and its last view said `draining`); the new one counts from 1
/// again, and must be judged as a new incarnation, not as a very late copy of the old one.
#[tokio::test(start_paused = true)]
async fn a_long_running_agent_restarted_at_the_same_address_is_routable_at_once() {
    let net = MemNetwork::new();
    let key = ClusterKey::random();
    let mut nodes: Vec<Node> = (0..3).map(|i| start(&net, i, &key)).collect();
    eventually("everyone to see everyone", Duration::from_secs(10), || {
        nodes.iter().all(|n| n.seen.members().len() == 2)
    })
    .await;
    // Hundreds of updates (virtual time: each waits out the urgent-publish gap).
    for n in 0..400u32 {
        let mut view = live(State::Healthy, n);
        view.busy = n % 2 == 0;
        nodes[2].handle.publish_live(view);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    nodes[2].handle.publish_live(live(State::Draining, 0));
    eventually(
        "the old incarnation's high seq and draining state everywhere",
        Duration::from_secs(5),
        || {
            nodes[..2].iter().all(|n| {
                n.seen.live_of("agent-2").map(|l| l.state) == Some(State::Draining)
                    && n.handle
                        .status()
                        .members
                        .iter()
                        .any(|m| m.name == "agent-2" && m.live_seq.is_some_and(|s| s > 300))
            })
        },
    )
    .await;
    // It shuts down and its container comes back at the same address.
    nodes[2].handle.leave().await;
    nodes[2].stop.cancel();
    nodes[2] = start(&net, 2, &key);
    eventually(
        "the new incarnation to be routable and healthy everywhere",
        Duration::from_secs(3),
        || {
            nodes[..2].iter().all(|n| {
                n.seen.members().contains(&"agent-2".to_owned())
                    && n.seen.live_of("agent-2").map(|l| l.state) == Some(State::Healthy)
            })
        },
    )
    .await;
}
