//! The table's rules, one by one: what moves an entry forward and what is refused.

use super::*;
use crate::gossip::envelope;
use wire::AgentState as State;
use Origin::{FirstHand, Relayed};

fn node(port: u16, epoch: u64) -> NodeId {
    NodeId {
        addr: SocketAddr::from(([10, 0, 0, 1], port)),
        epoch,
    }
}

fn table() -> Table {
    Table::new(
        "me".into(),
        node(1, 1),
        Arc::new(Stats::default()),
        Duration::from_secs(30),
        Clock::Wall,
    )
}

fn live(profile_seq: u64, state: State) -> Body {
    Body::Live(Live {
        profile_seq,
        state,
        state_age_s: 0,
        cap: 1000,
        availability: 1000,
        saturation: 0,
        latency_ms: None,
        p50_ms: None,
        p95_ms: None,
        busy: false,
        cooling_down: false,
        in_flight: 0,
        queued: 0,
        saturation_predicted: 0,
        quality_milli: None,
        degraded: false,
        budget: Vec::new(),
    })
}

fn profile(inbound: &str) -> Body {
    Body::Profile(Profile {
        inbound: inbound.into(),
        zone: String::new(),
        region: String::new(),
        max_concurrency: 1,
        capabilities: vec![],
        version: "test".into(),
        identity: String::new(),
    })
}

fn item(name: &str, node: NodeId, seq: u64, body: Body) -> Item {
    Item {
        name: name.into(),
        node,
        seq,
        body,
    }
}

fn inbound_of(t: &Table, name: &str) -> Option<String> {
    t.routable()
        .into_iter()
        .find(|m| m.name == name)
        .map(|m| m.profile.inbound.clone())
}

fn state_of(t: &Table, name: &str) -> Option<State> {
    t.get(name)
        .and_then(|e| e.live.as_ref().map(|(_, l)| l.state))
}

#[test]
fn an_old_item_played_back_does_not_roll_state_back() {
    let now = Instant::now();
    let mut t = table();
    let n = node(2, 5);
    let a = |seq, body| item("a", n.clone(), seq, body);
    assert_eq!(
        t.apply(&a(1, profile("10.0.0.1:3")), FirstHand, now),
        Applied::New
    );
    assert_eq!(
        t.apply(&a(3, live(1, State::Draining)), Relayed, now),
        Applied::New
    );
    assert_eq!(
        t.apply(&a(2, live(1, State::Healthy)), Relayed, now),
        Applied::Stale
    );
    assert_eq!(state_of(&t, "a"), Some(State::Draining));
}

#[test]
fn an_agent_restarted_elsewhere_takes_its_name_once_the_old_one_is_down() {
    let now = Instant::now();
    let mut t = table();
    let (old, new) = (node(2, 5), node(3, 9));
    t.member_up(&old);
    t.member_up(&new);
    t.apply(
        &item("a", old.clone(), 7, profile("10.0.0.1:20")),
        FirstHand,
        now,
    );
    assert_eq!(inbound_of(&t, "a"), Some("10.0.0.1:20".into()));
    // While the old one is alive, the name is its own.
    let claim = item("a", new.clone(), 1, profile("10.0.0.1:30"));
    assert_eq!(t.apply(&claim, FirstHand, now), Applied::Refused);
    assert_eq!(t.stats.rejected(Rejected::NameTaken), 1);
    assert_eq!(inbound_of(&t, "a"), Some("10.0.0.1:20".into()));
    t.member_down(&old, now);
    assert_eq!(t.apply(&claim, FirstHand, now), Applied::New);
    assert_eq!(inbound_of(&t, "a"), Some("10.0.0.1:30".into()));
    // The old incarnation's items, however late, change nothing.
    let late = item("a", old, 99, profile("10.0.0.1:20"));
    assert_eq!(t.apply(&late, FirstHand, now), Applied::Stale);
    assert_eq!(inbound_of(&t, "a"), Some("10.0.0.1:30".into()));
}

#[test]
fn a_rename_starts_the_entry_afresh_so_a_low_seq_counts_again() {
    let now = Instant::now();
    let mut t = table();
    let (old, new) = (node(2, 5), node(2, 9));
    t.member_up(&old);
    t.newcomers.clear();
    t.apply(
        &item("a", old.clone(), 1, profile("10.0.0.1:20")),
        FirstHand,
        now,
    );
    let draining = item("a", old.clone(), 5000, live(1, State::Draining));
    assert_eq!(t.apply(&draining, FirstHand, now), Applied::New);
    t.renamed(&old, &new, now);
    assert_eq!(t.newcomers, vec![new.clone()]);
    assert!(t.routable().is_empty(), "the old incarnation is gone");
    let back = |seq, body| item("a", new.clone(), seq, body);
    // Relayed, the new identity's name is not yet vouched for: it is asked directly.
    assert_eq!(
        t.apply(&back(2, live(1, State::Healthy)), Relayed, now),
        Applied::Stale
    );
    assert_eq!(t.wants, vec![new.clone()]);
    assert_eq!(
        t.apply(&back(1, profile("10.0.0.1:20")), FirstHand, now),
        Applied::New
    );
    assert_eq!(
        t.apply(&back(2, live(1, State::Healthy)), FirstHand, now),
        Applied::New
    );
    assert_eq!(state_of(&t, "a"), Some(State::Healthy));
    assert_eq!(inbound_of(&t, "a"), Some("10.0.0.1:20".into()));
}

/// A pod IP reused: agent a's address (and gossip port) goes to another agent b, and SWIM
/// reports a rename. b must not inherit a's name, or a could not take it back elsewhere.
#[test]
fn another_agent_at_a_reused_address_does_not_take_the_name_of_the_one_before() {
    let now = Instant::now();
    for a_left_first in [true, false] {
        let mut t = table();
        let (a_at_x, b_at_x, a_at_y) = (node(2, 5), node(2, 9), node(3, 12));
        t.member_up(&a_at_x);
        t.apply(
            &item("a", a_at_x.clone(), 1, profile("10.0.0.1:20")),
            FirstHand,
            now,
        );
        if a_left_first {
            // Then foca reports the rename and b up.
            t.member_down(&a_at_x, now);
            t.renamed(&a_at_x, &b_at_x, now);
            t.member_up(&b_at_x);
        } else {
            // Replaced before anyone saw it die: a rename alone.
            t.renamed(&a_at_x, &b_at_x, now);
        }
        assert_eq!(inbound_of(&t, "a"), None, "a is gone");
        let b = item("b", b_at_x.clone(), 1, profile("10.0.0.1:21"));
        assert_eq!(t.apply(&b, FirstHand, now), Applied::New);
        // a restarts at another address.
        t.member_up(&a_at_y);
        let a = item("a", a_at_y.clone(), 1, profile("10.0.0.1:30"));
        assert_eq!(t.apply(&a, FirstHand, now), Applied::New, "{a_left_first}");
        assert_eq!(inbound_of(&t, "a"), Some("10.0.0.1:30".into()));
        assert_eq!(inbound_of(&t, "b"), Some("10.0.0.1:21".into()));
        assert_eq!(t.stats.rejected(Rejected::NameTaken), 0);
    }
}

#[test]
fn an_agent_whose_address_went_to_another_is_pruned_if_it_never_comes_back() {
    let now = Instant::now();
    let mut t = table();
    let (a_at_x, b_at_x) = (node(2, 5), node(2, 9));
    t.member_up(&a_at_x);
    t.apply(
        &item("a", a_at_x.clone(), 1, profile("10.0.0.1:20")),
        FirstHand,
        now,
    );
    t.renamed(&a_at_x, &b_at_x, now);
    t.apply(
        &item("b", b_at_x, 1, profile("10.0.0.1:21")),
        FirstHand,
        now,
    );
    t.prune(now + DOWN_LISTED_FOR);
    assert!(t.get("a").is_none(), "a is no longer listed");
    assert!(t.get("b").is_some());
}

#[test]
fn a_dead_member_is_not_routable_and_a_live_view_without_profile_asks_for_it() {
    let now = Instant::now();
    let mut t = table();
    let n = node(2, 5);
    t.member_up(&n);
    t.apply(
        &item("a", n.clone(), 2, live(1, State::Healthy)),
        FirstHand,
        now,
    );
    assert!(t.routable().is_empty(), "no profile yet");
    assert_eq!(t.wants, vec![n.clone()]);
    t.apply(
        &item("a", n.clone(), 1, profile("10.0.0.1:3")),
        FirstHand,
        now,
    );
    assert_eq!(t.routable().len(), 1);
    t.member_down(&n, now);
    assert!(t.routable().is_empty());
}

#[test]
fn items_about_this_node_are_not_taken_from_others() {
    let mut t = table();
    let claim = item("me", node(9, 9), 1, profile("10.0.0.1:3"));
    assert_eq!(t.apply(&claim, FirstHand, Instant::now()), Applied::Mine);
    assert_eq!(t.name_conflicts, 1);
    assert!(t.routable().is_empty());
}

#[test]
fn relayed_items_neither_introduce_nor_move_a_node_nor_set_its_address() {
    let now = Instant::now();
    let mut t = table();
    let n = node(2, 5);
    t.member_up(&n);
    let unknown = item("a", n.clone(), 1, live(0, State::Healthy));
    assert_eq!(t.apply(&unknown, Relayed, now), Applied::Stale);
    assert!(t.get("a").is_none());
    t.apply(
        &item("a", n.clone(), 1, profile("10.0.0.1:3")),
        FirstHand,
        now,
    );
    let moved = item("a", n.clone(), 2, profile("10.0.0.1:4"));
    assert_eq!(t.apply(&moved, Relayed, now), Applied::Refused);
    assert_eq!(t.stats.rejected(Rejected::NotSender), 1);
    assert_eq!(
        t.wants,
        vec![n.clone()],
        "the node is asked for its new profile"
    );
    let renewed = item("a", node(2, 6), 3, live(1, State::Healthy));
    assert_eq!(t.apply(&renewed, Relayed, now), Applied::Stale);
    assert_eq!(inbound_of(&t, "a"), Some("10.0.0.1:3".into()));
}

#[test]
fn a_relayed_seq_far_ahead_is_refused_and_the_nodes_own_word_wins() {
    let now = Instant::now();
    let mut t = table();
    let n = node(2, 5);
    t.member_up(&n);
    t.apply(
        &item("a", n.clone(), 10, profile("10.0.0.1:3")),
        FirstHand,
        now,
    );
    let far = item(
        "a",
        n.clone(),
        10 + MAX_RELAYED_LEAD + 1,
        live(10, State::Draining),
    );
    assert_eq!(t.apply(&far, Relayed, now), Applied::Refused);
    assert_eq!(t.stats.rejected(Rejected::OutOfRange), 1);
    let ahead = item(
        "a",
        n.clone(),
        10 + MAX_RELAYED_LEAD,
        live(10, State::Draining),
    );
    assert_eq!(t.apply(&ahead, Relayed, now), Applied::New);
    // The node's next item first-hand overrides the forged one despite its lower seq.
    let own = item("a", n.clone(), 11, live(10, State::Healthy));
    assert_eq!(t.apply(&own, FirstHand, now), Applied::New);
    assert_eq!(state_of(&t, "a"), Some(State::Healthy));
}

#[test]
fn implausible_items_are_refused() {
    let now_us = envelope::unix_us();
    let window = 30_000_000;
    let at = |port, epoch| node(port, epoch);
    let future = item("a", at(2, now_us + 2 * window), 1, live(0, State::Healthy));
    assert_eq!(
        plausible(&future, now_us, window),
        Err(Rejected::OutOfRange)
    );
    let young = at(2, now_us - 10_000_000);
    let max_seq = SEQ_SLACK + MAX_ITEM_RATE * 40;
    let ok = item("a", young.clone(), max_seq, live(0, State::Healthy));
    assert_eq!(plausible(&ok, now_us, window), Ok(()));
    let too_far = item("a", young.clone(), max_seq + 1, live(0, State::Healthy));
    assert_eq!(
        plausible(&too_far, now_us, window),
        Err(Rejected::OutOfRange)
    );
    for inbound in [
        "10.0.0.9:4143",
        "10.0.0.1:0",
        "localhost:4143",
        "",
        "10.0.0.1",
    ] {
        let bad = item("a", young.clone(), 1, profile(inbound));
        assert_eq!(
            plausible(&bad, now_us, window),
            Err(Rejected::BadAddress),
            "{inbound}"
        );
    }
    let good = item("a", young, 1, profile("10.0.0.1:4143"));
    assert_eq!(plausible(&good, now_us, window), Ok(()));
}

#[test]
fn an_item_of_a_kind_this_sidecar_does_not_know_is_skipped_and_counted() {
    use foca::BroadcastHandler;
    let mut h = Handler {
        table: Arc::new(Mutex::new(table())),
    };
    let n = node(2, envelope::unix_us());
    h.lock().member_up(&n);
    let head = item("a", n.clone(), 1, profile("10.0.0.1:3"));
    let unknown = wire::future::new_kind_item(&head).unwrap_or_default();
    assert!(matches!(h.receive_item(&unknown, Some(&n)), Ok(None)));
    assert_eq!(h.lock().stats.rejected(Rejected::UnknownKind), 1);
    assert!(h.lock().get("a").is_none(), "it changed nothing");
    // This node's own are passed on (a newer sidecar publishing its new kind).
    assert!(matches!(h.receive_item(&unknown, None), Ok(Some(_))));
    // A newer version of a kind it knows is read, as far as it knows it.
    h.lock().from = Some(n.addr);
    let newer = wire::future::encode_item(&head).unwrap_or_default();
    assert!(matches!(h.receive_item(&newer, Some(&n)), Ok(Some(_))));
    assert_eq!(inbound_of(&h.lock(), "a"), Some("10.0.0.1:3".into()));
    // Garbage is dropped alone and counted; this node's own would be an error.
    assert!(matches!(
        h.receive_item(&[2, 1, 1, 0xff], Some(&n)),
        Ok(None)
    ));
    assert_eq!(h.lock().stats.rejected(Rejected::Undecodable), 1);
    assert!(h.receive_item(&[2, 1, 1, 0xff], None).is_err());
}

#[test]
fn an_ipv4_peer_seen_through_an_ipv6_socket_is_the_same_address() {
    let v4 = SocketAddr::from(([10, 0, 0, 1], 4190));
    let mapped: SocketAddr = "[::ffff:10.0.0.1]:4190".parse().unwrap_or(v4);
    assert!(same_addr(v4, mapped));
    assert!(!same_addr(v4, SocketAddr::from(([10, 0, 0, 1], 4191))));
}

#[test]
fn a_node_relayed_for_that_swim_does_not_count_alive_is_met_not_asked() {
    let now = Instant::now();
    let mut t = table();
    // Never seen by SWIM here: met (announced to), not asked (it would not be answered).
    let stranger = node(2, 5);
    let relayed = item("a", stranger.clone(), 1, live(0, State::Healthy));
    assert_eq!(t.apply(&relayed, Relayed, now), Applied::Stale);
    assert_eq!(t.strangers, vec![stranger.clone()]);
    assert!(t.wants.is_empty());
    // Once SWIM counts it alive, a relayed item asks it for its items instead.
    t.strangers.clear();
    t.member_up(&stranger);
    assert_eq!(t.apply(&relayed, Relayed, now), Applied::Stale);
    assert!(t.strangers.is_empty());
    assert_eq!(t.wants, vec![stranger.clone()]);
    // A member held as down that others still relay for (a healed partition) is met again,
    // and so is its new identity before SWIM here has heard of it.
    t.apply(
        &item("a", stranger.clone(), 2, profile("10.0.0.1:3")),
        FirstHand,
        now,
    );
    t.member_down(&stranger, now);
    let late = item("a", stranger.clone(), 3, live(2, State::Healthy));
    t.apply(&late, Relayed, now);
    assert_eq!(t.strangers, vec![stranger.clone()]);
    let renewed = node(2, 6);
    t.apply(
        &item("a", renewed.clone(), 1, live(0, State::Healthy)),
        Relayed,
        now,
    );
    assert_eq!(t.strangers, vec![stranger, renewed]);
    // A node's own first-hand word makes no stranger.
    t.strangers.clear();
    t.apply(
        &item("b", node(3, 5), 1, profile("10.0.0.1:4")),
        FirstHand,
        now,
    );
    assert!(t.strangers.is_empty());
}

fn pins(digest: u8) -> Body {
    Body::Pins(wire::Pins {
        pins: vec![wire::Pin {
            capability: "mcp".into(),
            tool: "search".into(),
            digest: [digest; 8],
        }],
    })
}

fn pins_of(t: &Table, name: &str) -> Option<Vec<String>> {
    t.routable()
        .into_iter()
        .find(|m| m.name == name)
        .map(|m| m.pins.iter().map(|p| p.digest.clone()).collect())
}

/// A member's pins ride on `Member`, relayed ones taken like a live view: the newest `seq`
/// wins, an older one played back changes nothing, and each new one marks the routable set
/// changed so that it is handed over again.
#[test]
fn a_members_pins_are_taken_first_hand_move_forward_and_mark_the_set_changed() {
    let now = Instant::now();
    let mut t = table();
    let n = node(2, 5);
    t.member_up(&n);
    let a = |seq, body| item("a", n.clone(), seq, body);
    t.apply(&a(1, profile("10.0.0.1:3")), FirstHand, now);
    assert_eq!(pins_of(&t, "a"), Some(Vec::new()), "none published yet");
    t.dirty = false;
    // Pins relayed in a's name could be anyone's: refused, and a is asked for its own.
    assert_eq!(t.apply(&a(2, pins(0x11)), Relayed, now), Applied::Refused);
    assert_eq!(pins_of(&t, "a"), Some(Vec::new()));
    assert!(!t.dirty);
    assert_eq!(t.apply(&a(2, pins(0x11)), FirstHand, now), Applied::New);
    assert!(t.dirty);
    assert_eq!(pins_of(&t, "a"), Some(vec!["1111111111111111".to_owned()]));
    t.dirty = false;
    assert_eq!(t.apply(&a(4, pins(0x22)), FirstHand, now), Applied::New);
    assert_eq!(t.apply(&a(3, pins(0x11)), FirstHand, now), Applied::Stale);
    assert!(t.dirty);
    assert_eq!(pins_of(&t, "a"), Some(vec!["2222222222222222".to_owned()]));
    // A live view in between does not touch them.
    assert_eq!(
        t.apply(&a(5, live(1, State::Healthy)), Relayed, now),
        Applied::New
    );
    assert_eq!(pins_of(&t, "a"), Some(vec!["2222222222222222".to_owned()]));
}
