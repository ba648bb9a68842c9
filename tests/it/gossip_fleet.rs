//! Small fleets on the in-memory network, under simulated time (the harness is
//! `testkit::gossip_fleet`).
//!
//! An old and a new encoding in one fleet: nodes of this version beside one that
//! writes as the next version would — every item a version newer with fields appended, and a
//! kind of item this version does not know, both sent directly and riding on SWIM. The fleet
//! still converges: everyone routes to everyone, with the right profiles and live views, and
//! the old nodes count what they skipped instead of dropping what came with it.
//!
//! A member that refutes a suspicion in time stays the member it was (no false death).
//!
//! A node restarted in place (same name, same address, a new identity) is met at once, whether
//! the others saw the old one leave or still probe it.
//!
//! A node's MCP tool pins reach every member, in a mixed fleet too, and a member joining later
//! gets them directly; the same pins offered again publish nothing.

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::gossip::{ClusterKey, MemNetwork, NodeId, Pin, Rejected};
use agent_reach::reach::State;
use testkit::gossip_fleet::{addr, eventually, live, name, profile, quick_timings, Fleet, Node};

/// Long beside the probes (200 ms), so a suspicion is seen in `/status` before it runs out.
const SUSPECT: Duration = Duration::from_secs(2);

/// The node that writes as the next version.
const NEWER: usize = 1;

fn fleet() -> Fleet {
    Fleet::new(MemNetwork::new(), ClusterKey::random(), |i, o| {
        quick_timings(o);
        o.suspect_timeout = SUSPECT;
        // Four nodes gossiping five times a second would pass a rumour on its 10 times within
        // the second: the suspicion would be spent before the member it is about is back to
        // hear it.
        o.max_transmissions = 40;
        o.newer_wire = i == NEWER;
    })
}

/// Whether `node` routes to every other with its profile and the live view it published.
fn sees_everyone(nodes: &[Node], me: usize, state_of: impl Fn(usize) -> State) -> bool {
    (0..nodes.len()).filter(|j| *j != me).all(|j| {
        let member = nodes[me].seen.member(&name(j));
        let live = nodes[me].seen.live_of(&name(j));
        member.is_some_and(|m| *m.profile == profile(j))
            && live.is_some_and(|l| l.state == state_of(j) && l.in_flight == j as u32)
    })
}

#[tokio::test(start_paused = true)]
async fn an_old_and_a_new_encoding_in_one_fleet_converge() {
    let fleet = fleet();
    // The seed and the third node are this version; the second writes as the next one.
    let nodes: Vec<Node> = (0..3).map(|i| fleet.start(i)).collect();
    eventually(
        "everyone to route to everyone",
        Duration::from_secs(10),
        || (0..3).all(|i| sees_everyone(&nodes, i, |_| State::Healthy)),
    )
    .await;

    // Changes spread both ways: the newer node's (a version-2 live view riding on SWIM, beside
    // an item of the new kind) to the old ones, an old node's to the newer one.
    nodes[NEWER]
        .handle
        .publish_live(live(State::Draining, NEWER as u32));
    nodes[2].handle.publish_live(live(State::Probation, 2));
    let states = |j| match j {
        NEWER => State::Draining,
        2 => State::Probation,
        _ => State::Healthy,
    };
    eventually("the changes to spread", Duration::from_secs(5), || {
        (0..3).all(|i| sees_everyone(&nodes, i, states))
    })
    .await;

    for (i, node) in nodes.iter().enumerate() {
        let stats = node.handle.stats();
        assert_eq!(stats.rejected(Rejected::Undecodable), 0, "node {i}");
        if i != NEWER {
            // The new kind, sent directly and on SWIM, skipped and counted.
            assert!(stats.rejected(Rejected::UnknownKind) > 0, "node {i}");
        }
        let status = node.handle.status();
        assert_eq!(status.alive, 2, "node {i}: {status:?}");
    }
}

/// A member cut off long enough to be suspected, then back before the suspicion runs out,
/// refutes it and keeps its identity: nobody drops it, and it does not rejoin as someone new
/// (foca alone would tell it "you are down" when the suspecter's timer ran out; see
/// `Node::refuted`).
#[tokio::test(start_paused = true)]
async fn a_refuted_suspicion_is_not_a_death() {
    let fleet = fleet();
    let n = 4;
    let nodes: Vec<Node> = (0..n).map(|i| fleet.start(i)).collect();
    eventually(
        "everyone to route to everyone",
        Duration::from_secs(10),
        || (0..n).all(|i| sees_everyone(&nodes, i, |_| State::Healthy)),
    )
    .await;
    let cut_off = n - 1;
    let identity = |i: usize| nodes[i].seen.member(&name(cut_off)).map(|m| m.node);
    let before = identity(0).expect("routed to before");

    let others: Vec<SocketAddr> = (0..cut_off).map(addr).collect();
    fleet.net.partition(&[addr(cut_off)], &others);
    eventually("someone to suspect the cut-off member", SUSPECT, || {
        (0..cut_off).any(|i| nodes[i].handle.status().suspect > 0)
    })
    .await;
    fleet.net.heal();

    // Past every suspecter's timer, with room for the rumour of a death to spread.
    let until = tokio::time::Instant::now() + SUSPECT * 2;
    while tokio::time::Instant::now() < until {
        for i in 0..cut_off {
            assert_eq!(
                identity(i).as_ref(),
                Some(&before),
                "node {i} dropped or renamed the member that refuted its suspicion"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, node) in nodes.iter().enumerate().take(cut_off) {
        let status = node.handle.status();
        assert_eq!(
            (status.alive, status.suspect, status.down),
            (n - 1, 0, 0),
            "node {i}"
        );
    }
}

/// The identity under which node `me` routes to node `of`, if it does.
fn routed_identity(nodes: &[Option<Node>], me: usize, of: usize) -> Option<NodeId> {
    nodes[me]
        .as_ref()
        .and_then(|n| n.seen.member(&name(of)))
        .map(|m| m.node)
}

/// The fleet's one seed leaves (SIGTERM) and comes back at its address 3 s later,
/// knowing nobody (its only seed is itself). The other node, left alone when it left, finds it
/// within a second: it asks a seed that was just alive whether it is back (before, it waited
/// for the seeds' next resolution, 30 s, since foca's announces stop on a node left alone).
#[tokio::test(start_paused = true)]
async fn a_seed_restarted_in_place_after_leaving_is_found_at_once() {
    let fleet = fleet();
    let mut nodes: Vec<Option<Node>> = (0..2).map(|i| Some(fleet.start(i))).collect();
    eventually(
        "the two to route to each other",
        Duration::from_secs(10),
        || routed_identity(&nodes, 0, 1).is_some() && routed_identity(&nodes, 1, 0).is_some(),
    )
    .await;
    let old = routed_identity(&nodes, 1, 0).expect("routed to before");

    if let Some(seed) = nodes[0].take() {
        seed.handle.leave().await;
    }
    eventually(
        "the seed to leave node 1's table",
        Duration::from_secs(2),
        || routed_identity(&nodes, 1, 0).is_none(),
    )
    .await;
    // The container's restart delay: scenario time.
    tokio::time::sleep(Duration::from_secs(3)).await;
    nodes[0] = Some(fleet.start_as(&name(0), 0, vec![addr(0)]));
    eventually(
        "node 1 to route to the new seed",
        Duration::from_secs(1),
        || {
            routed_identity(&nodes, 1, 0)
                .is_some_and(|id| id.addr == old.addr && id.epoch > old.epoch)
        },
    )
    .await;
    eventually(
        "the new seed to route to node 1",
        Duration::from_secs(1),
        || routed_identity(&nodes, 0, 1).is_some(),
    )
    .await;
}

/// A node crashes (SIGKILL: no word) and comes back at its address before anyone
/// has detected the death, with nobody to announce itself to. The others still probe its old
/// identity; the new one answers those by announcing itself, and is routed to within a few
/// probe periods, before the suspicion could even run out (before, foca dropped the probes
/// unread, and once the old identity was declared dead nobody asked).
#[tokio::test(start_paused = true)]
async fn a_node_restarted_in_place_answers_the_probes_of_its_old_identity() {
    let fleet = fleet();
    let mut nodes: Vec<Option<Node>> = (0..2).map(|i| Some(fleet.start(i))).collect();
    eventually(
        "the two to route to each other",
        Duration::from_secs(10),
        || routed_identity(&nodes, 0, 1).is_some() && routed_identity(&nodes, 1, 0).is_some(),
    )
    .await;
    let old = routed_identity(&nodes, 0, 1).expect("routed to before");

    drop(nodes[1].take());
    tokio::time::sleep(Duration::from_millis(100)).await;
    nodes[1] = Some(fleet.start_as(&name(1), 1, vec![]));
    eventually("node 0 to route to the new node 1", SUSPECT / 2, || {
        routed_identity(&nodes, 0, 1).is_some_and(|id| id.addr == old.addr && id.epoch > old.epoch)
    })
    .await;
    // …and stays with it: the old identity's death, when it is declared, changes nothing.
    let until = tokio::time::Instant::now() + SUSPECT * 2;
    while tokio::time::Instant::now() < until {
        assert!(
            routed_identity(&nodes, 0, 1).is_some_and(|id| id.epoch > old.epoch),
            "node 0 stopped routing to the new node 1"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pin(tool: &str) -> Pin {
    Pin {
        capability: "mcp".into(),
        tool: tool.into(),
        digest: "5c5c5c5c5c5c5c5c".into(),
    }
}

/// The tools of node 0's pins as node `me` routes with them.
fn pinned_by_0(nodes: &[Node], me: usize) -> Option<Vec<String>> {
    let member = nodes[me].seen.member(&name(0))?;
    Some(member.pins.iter().map(|p| p.tool.clone()).collect())
}

#[tokio::test(start_paused = true)]
async fn pins_reach_every_member_and_a_later_one_directly() {
    let fleet = fleet();
    let mut nodes: Vec<Node> = (0..3).map(|i| fleet.start(i)).collect();
    eventually(
        "everyone to route to everyone",
        Duration::from_secs(10),
        || (0..3).all(|i| sees_everyone(&nodes, i, |_| State::Healthy)),
    )
    .await;
    nodes[0]
        .handle
        .publish_pins(vec![pin("search"), pin("fetch")]);
    let both = Some(vec!["fetch".to_owned(), "search".to_owned()]);
    eventually("the pins to spread", Duration::from_secs(5), || {
        (1..3).all(|i| pinned_by_0(&nodes, i) == both)
    })
    .await;

    // Offered again (in another order): nothing new is published.
    let pins_seq = |node: &Node| {
        let status = node.handle.status();
        let member = status.members.iter().find(|m| m.name == name(0));
        member.and_then(|m| m.pins_seq)
    };
    let before = pins_seq(&nodes[1]);
    assert!(before.is_some());
    nodes[0]
        .handle
        .publish_pins(vec![pin("fetch"), pin("search")]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(pins_seq(&nodes[1]), before);

    // A node joining later hears them from node 0 directly, with its profile.
    nodes.push(fleet.start(3));
    eventually(
        "the newcomer to have the pins",
        Duration::from_secs(10),
        || pinned_by_0(&nodes, 3) == both,
    )
    .await;
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(
            node.handle.stats().rejected(Rejected::Undecodable),
            0,
            "node {i}"
        );
    }
}
