//! The gossip layer on its own, over the in-memory network: membership, dissemination, failure
//! detection, replay and forgery, with no sidecar around it. The fleet is
//! `support::gossip_fleet`, which the unit tests and the benchmark share.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::gossip::{self, wire, ClusterKey, Rejected};
use agent_reach::reach::State;

use crate::support::wire_capability;
use testkit::gossip_fleet::{addr, eventually, live, profile, Fleet, Node};

#[tokio::test]
async fn a_fleet_finds_itself_from_one_seed_and_forgets_a_dead_member() {
    let fleet = Fleet::quick();
    let nodes: Vec<Node> = (0..6).map(|i| fleet.start(i)).collect();
    eventually("everyone to see everyone", Duration::from_secs(10), || {
        nodes.iter().all(|n| n.seen.count() == 5)
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
    fleet.net.cut(nodes[5].addr);
    nodes[5].stop();
    eventually("the dead node to leave", Duration::from_secs(10), || {
        nodes[..5].iter().all(|n| !n.seen.routes_to("agent-5"))
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
    let fleet = Fleet::quick();
    let a = fleet.start(0);
    let b = fleet.start(1);
    eventually("the pair to meet", Duration::from_secs(10), || {
        a.seen.count() == 1 && b.seen.count() == 1
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
        body: wire::Body::Live(live(State::Draining, 0).into()),
    };
    let body = wire::encode_items([&forged_item]).unwrap_or_default();
    let now = gossip::envelope::unix_us();
    let forged = forger.seal(gossip::envelope::Kind::Items, now, &body);
    fleet.net.inject(addr(99), addr(0), forged);
    fleet
        .net
        .inject(addr(99), addr(0), b"not even an envelope".to_vec());

    // A genuine packet recorded and played back later.
    let genuine = fleet.key.seal(gossip::envelope::Kind::Want, now, &[]);
    fleet.net.inject(addr(1), addr(0), genuine.clone());
    fleet.net.inject(addr(1), addr(0), genuine);
    let stale = fleet
        .key
        .seal(gossip::envelope::Kind::Want, now - 120_000_000, &[]);
    fleet.net.inject(addr(1), addr(0), stale);

    let stats = a.handle.stats().clone();
    eventually("the rejects to be counted", Duration::from_secs(5), || {
        stats.rejected(Rejected::BadMac) == 1
            && stats.rejected(Rejected::Malformed) == 1
            && stats.rejected(Rejected::Replayed) == 1
            && stats.rejected(Rejected::Expired) == 1
    })
    .await;
    assert_eq!(a.seen.names(), vec!["agent-1".to_owned()]);
    let state = a.seen.live_of("agent-1").map(|l| l.state);
    assert_eq!(
        state,
        Some(State::Healthy),
        "the forged state was not trusted"
    );
}

#[tokio::test]
async fn an_agent_restarted_at_the_same_address_is_routable_again_at_once() {
    let fleet = Fleet::quick();
    let mut nodes: Vec<Node> = (0..4).map(|i| fleet.start(i)).collect();
    eventually("everyone to see everyone", Duration::from_secs(10), || {
        nodes.iter().all(|n| n.seen.count() == 3)
    })
    .await;
    // agent-3's container restarts in place: same address, new incarnation, before anyone
    // noticed it was gone (SWIM reports a rename, not a join).
    fleet.net.cut(addr(3));
    nodes[3].stop();
    let restarted = fleet.start(3);
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
        || nodes[3].seen.count() == 3,
    )
    .await;
}

#[tokio::test]
async fn a_want_with_a_forged_source_is_not_answered() {
    let fleet = Fleet::quick();
    let a = fleet.start(0);
    let b = fleet.start(1);
    eventually("the pair to meet", Duration::from_secs(10), || {
        a.seen.count() == 1 && b.seen.count() == 1
    })
    .await;
    // A victim that never joined, and a want (as B would send it) played back with the
    // victim's address as its source.
    let victim = addr(50);
    let (_victim_transport, mut victim_inbox) = fleet.net.join(victim);
    let asker = wire::encode_want(&wire::NodeId {
        addr: addr(1),
        epoch: 1,
    })
    .unwrap_or_default();
    let want = fleet.key.seal(
        gossip::envelope::Kind::Want,
        gossip::envelope::unix_us(),
        &asker,
    );
    fleet.net.inject(victim, addr(0), want);
    // The same want from the address it names is answered.
    let honest = fleet.key.seal(
        gossip::envelope::Kind::Want,
        gossip::envelope::unix_us(),
        &wire::encode_want(&wire::NodeId {
            addr: victim,
            epoch: 1,
        })
        .unwrap_or_default(),
    );
    fleet.net.inject(victim, addr(0), honest);
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
    let fleet = Fleet::quick();
    let a = fleet.start(0);
    let mut big = profile(0);
    for i in 0..40 {
        big.capabilities.push(gossip::Capability {
            tags: [("python".to_owned(), 900u16)].into_iter().collect(),
            ..wire_capability(&format!("capability-number-{i}"))
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

/// A sidecar restarted at its old address after a long run. The old incarnation's
/// items reached a high `seq` (and its last view said `draining`); the new one counts from 1
/// again, and must be judged as a new incarnation, not as a very late copy of the old one.
#[tokio::test(start_paused = true)]
async fn a_long_running_agent_restarted_at_the_same_address_is_routable_at_once() {
    let fleet = Fleet::quick();
    let mut nodes: Vec<Node> = (0..3).map(|i| fleet.start(i)).collect();
    eventually("everyone to see everyone", Duration::from_secs(10), || {
        nodes.iter().all(|n| n.seen.count() == 2)
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
    nodes[2].stop();
    nodes[2] = fleet.start(2);
    eventually(
        "the new incarnation to be routable and healthy everywhere",
        Duration::from_secs(3),
        || {
            nodes[..2].iter().all(|n| {
                n.seen.routes_to("agent-2")
                    && n.seen.live_of("agent-2").map(|l| l.state) == Some(State::Healthy)
            })
        },
    )
    .await;
}

/// A pod IP reused: agent-a leaves, another agent (agent-b) gets its address and gossip port at
/// once (SWIM reports a rename, not a join), and agent-a comes back at a new address. Both must
/// be routable: agent-b must not have inherited agent-a's name.
#[tokio::test(start_paused = true)]
async fn an_agent_at_a_reused_address_does_not_lock_the_one_before_out_of_its_name() {
    let fleet = Fleet::quick();
    // agent-a at node 2's address, then agent-b there; agent-a comes back at node 3's.
    let y = addr(3);
    let mut nodes: Vec<Node> = (0..2).map(|i| fleet.start(i)).collect();
    nodes.push(fleet.start_as("agent-a", 2, vec![addr(0)]));
    eventually("everyone to see everyone", Duration::from_secs(10), || {
        nodes.iter().all(|n| n.seen.count() == 2)
    })
    .await;
    let a = nodes.remove(2);
    a.handle.leave().await;
    a.stop();
    nodes.push(fleet.start_as("agent-b", 2, vec![addr(0)]));
    eventually(
        "agent-b in agent-a's place everywhere",
        Duration::from_secs(5),
        || {
            nodes[..2].iter().all(|n| {
                let members = n.seen.names();
                members.contains(&"agent-b".to_owned()) && !members.contains(&"agent-a".to_owned())
            })
        },
    )
    .await;
    nodes.push(fleet.start_as("agent-a", 3, vec![addr(0)]));
    eventually(
        "agent-a (back at another address) and agent-b both routable everywhere",
        Duration::from_secs(10),
        || {
            nodes.iter().all(|n| {
                let members = n.seen.names();
                ["agent-0", "agent-1", "agent-a", "agent-b"]
                    .iter()
                    .all(|m| *m == n.name || members.iter().any(|s| s == m))
            })
        },
    )
    .await;
    for n in &nodes[..2] {
        assert_eq!(
            n.handle.stats().rejected(Rejected::NameTaken),
            0,
            "{}",
            n.name
        );
        let status = n.handle.status();
        let a = status.members.iter().find(|m| m.name == "agent-a");
        assert_eq!(a.map(|m| m.gossip), Some(y), "{status:?}");
    }
}

/// Everything logged while installed on this thread (a current-thread runtime runs the nodes'
/// tasks on the test's thread).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let logs = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || logs.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }
    fn lines_with(&self, needles: &[&str]) -> usize {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .count()
    }
}

/// A multi-homed sidecar: reached at the address it advertises, its datagrams leave from
/// another. Others refuse its items (it is not routable), and say so in their log, once a
/// minute, naming both addresses and the rule.
#[tokio::test(start_paused = true)]
async fn a_sidecar_whose_datagrams_leave_from_another_address_is_refused_loudly() {
    let logs = Logs::default();
    let _guard = logs.install();
    let fleet = Fleet::quick();
    let seed = fleet.start(0);
    let (advertised, source) = (addr(1), addr(7));
    let (_, inbox) = fleet.net.join(advertised);
    let (transport, _source_inbox) = fleet.net.join(source);
    let odd = fleet.spawn("agent-1", 1, (transport, inbox), vec![addr(0)]);

    let (from, adv) = (
        format!("source={source}"),
        format!("advertised={advertised}"),
    );
    let warning = [from.as_str(), adv.as_str(), "WARN", "rule="];
    let stats = seed.handle.stats().clone();
    eventually(
        "its items refused and a warning logged",
        Duration::from_secs(5),
        || stats.rejected(Rejected::NotSender) >= 1 && logs.lines_with(&warning) == 1,
    )
    .await;
    let first = tokio::time::Instant::now();
    assert!(seed.seen.count() == 0, "it is not routable");
    // More refused items within the minute: no more warnings.
    let refused = stats.rejected(Rejected::NotSender);
    let mut changed = profile(1);
    changed.max_concurrency += 1;
    odd.handle.publish_profile(changed);
    eventually("its new items refused", Duration::from_secs(5), || {
        stats.rejected(Rejected::NotSender) > refused
    })
    .await;
    assert_eq!(logs.lines_with(&warning), 1, "warned once a minute at most");
    // Its datagrams keep coming (SWIM): a minute on, it is warned about again.
    eventually("a second warning", Duration::from_secs(70), || {
        logs.lines_with(&warning) == 2
    })
    .await;
    assert!(
        first.elapsed() >= Duration::from_secs(59),
        "{:?}",
        first.elapsed()
    );
    assert!(seed.seen.count() == 0);
    odd.handle.abort();
}

/// Items sent directly from another address than their node's: refused as `not_sender`, and
/// the source is named in the log once, however many come.
#[tokio::test(start_paused = true)]
async fn items_from_another_address_than_their_node_are_refused_with_one_warning() {
    let logs = Logs::default();
    let _guard = logs.install();
    let fleet = Fleet::quick();
    let a = fleet.start(0);
    let (source, advertised) = (addr(8), addr(9));
    for seq in 1..=5u64 {
        let item = wire::Item {
            name: "agent-9".into(),
            node: wire::NodeId {
                addr: advertised,
                epoch: gossip::envelope::unix_us(),
            },
            seq,
            body: wire::Body::Profile((&profile(9)).into()),
        };
        let body = wire::encode_items([&item]).unwrap_or_default();
        let sent_at = gossip::envelope::unix_us() + seq;
        let packet = fleet
            .key
            .seal(gossip::envelope::Kind::Items, sent_at, &body);
        fleet.net.inject(source, addr(0), packet);
    }
    let stats = a.handle.stats().clone();
    eventually("the items to be refused", Duration::from_secs(5), || {
        stats.rejected(Rejected::NotSender) == 5
    })
    .await;
    let (from, adv) = (
        format!("source={source}"),
        format!("advertised={advertised}"),
    );
    assert_eq!(
        logs.lines_with(&[from.as_str(), adv.as_str(), "WARN", "rule=\"not_sender\""]),
        1
    );
    assert!(a.seen.count() == 0);
}
