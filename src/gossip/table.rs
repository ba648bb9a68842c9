//! Everything this node knows of the others, keyed by agent name: the newest incarnation of each
//! agent, its profile and live view, and whether SWIM counts it alive.
//!
//! Items only move an entry forward: an older incarnation (epoch) or an older `seq` of the same
//! kind changes nothing, so a replayed or late item cannot roll an agent's state back. A name is
//! bound to the node holding it: only that node, speaking first-hand, can move it (a new
//! incarnation, a new profile); a node that SWIM counts alive keeps its name.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::{Duration, Instant};

use super::clock::Clock;
use super::envelope::Rejected;
use super::model;
use super::stats::Stats;
use super::wire::{self, Body, Decoded, Item, Live, NodeId, Profile};

/// How long a dead member stays listed (as `down`) in `/status`.
const DOWN_LISTED_FOR: Duration = Duration::from_secs(60);
/// Items a node can publish per second, generously (a state change at most every 50 ms, a
/// profile at most every offer): a `seq` beyond this times its node's uptime is forged.
const MAX_ITEM_RATE: u64 = 64;
/// Headroom over that bound.
const SEQ_SLACK: u64 = 1024;
/// How far a relayed item may run ahead of the last `seq` heard from its node first-hand: a
/// key holder relaying a forged view can get at most this far ahead, and the node's next
/// first-hand item overrides it. Further is refused, and the node is asked directly.
const MAX_RELAYED_LEAD: u64 = 256;

/// How an item reached this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// In a datagram from the item's own gossip address.
    FirstHand,
    /// Passed on by another member.
    Relayed,
}

#[derive(Debug)]
pub(super) struct Entry {
    pub node: NodeId,
    pub profile: Option<(u64, Profile)>,
    /// The profile as the routing model takes it, converted once when it arrives rather than
    /// each time the routable set is handed over.
    routed_profile: Option<Arc<model::Profile>>,
    pub live: Option<(u64, Live)>,
    /// The highest `seq` heard from the node first-hand.
    pub vouched: u64,
    pub last_heard: Instant,
    pub down_since: Option<Instant>,
}

/// What applying one item did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Applied {
    /// Newer than anything known: keep it and pass it on.
    New,
    /// Already known, or older than what is known.
    Stale,
    /// About this node itself (relayed back to it), or claims its name from another address.
    Mine,
    /// Refused, and counted under its reason.
    Refused,
}

#[derive(Debug)]
pub(super) struct Table {
    me: String,
    my_node: NodeId,
    entries: HashMap<String, Entry>,
    /// The names bound to each identity (one, unless a node publishes under several): SWIM
    /// reports members one by one, and scanning every entry for each made a fleet's join
    /// storm quadratic per node.
    by_node: HashMap<NodeId, Vec<String>>,
    /// Identities SWIM counts alive.
    active: HashSet<NodeId>,
    stats: Arc<Stats>,
    /// The clock skew tolerated (the replay window), in µs.
    window_us: u64,
    clock: Clock,
    /// What SWIM last said of its members, for `/status`.
    pub swim: SwimView,
    /// The source of the datagram being handled, so foca's hook can tell first-hand items.
    pub from: Option<SocketAddr>,
    /// Set when the routable set or a profile changed.
    pub dirty: bool,
    /// Set when a member stopped being routable (dead, restarted, pruned): callers must hear
    /// of that at once, while additions may be batched.
    pub lost: bool,
    /// Agents whose live view changed since last drained.
    pub live_updates: Vec<String>,
    /// Members whose profile this node lacks or has an old one of.
    pub wants: Vec<NodeId>,
    /// Members SWIM just reported up for the first time: they get this node's state directly.
    pub newcomers: Vec<NodeId>,
    /// Another node claimed this node's name (two agents with one name).
    pub name_conflicts: u64,
}

impl Table {
    pub(super) fn new(
        me: String,
        my_node: NodeId,
        stats: Arc<Stats>,
        window: Duration,
        clock: Clock,
    ) -> Self {
        Self {
            me,
            my_node,
            entries: HashMap::new(),
            by_node: HashMap::new(),
            active: HashSet::new(),
            stats,
            window_us: u64::try_from(window.as_micros()).unwrap_or(u64::MAX),
            clock,
            swim: SwimView::default(),
            from: None,
            dirty: false,
            lost: false,
            live_updates: Vec::new(),
            wants: Vec::new(),
            newcomers: Vec::new(),
            name_conflicts: 0,
        }
    }

    pub(super) fn set_my_node(&mut self, node: NodeId) {
        self.my_node = node;
    }

    pub(super) fn my_node(&self) -> &NodeId {
        &self.my_node
    }

    /// How an item in the datagram being handled reached this node.
    pub(super) fn origin(&self, item: &Item) -> Origin {
        match self.from {
            Some(from) if same_addr(from, item.node.addr) => Origin::FirstHand,
            _ => Origin::Relayed,
        }
    }

    pub(super) fn apply(&mut self, item: &Item, origin: Origin, now: Instant) -> Applied {
        if item.name == self.me {
            if item.node.addr != self.my_node.addr {
                self.name_conflicts += 1;
            }
            return Applied::Mine;
        }
        if let Err(reason) = plausible(item, self.clock.unix_us(), self.window_us) {
            return self.refuse(reason);
        }
        if origin == Origin::Relayed && matches!(item.body, Body::Profile(_)) {
            // Where an agent is reached is taken from the agent only; ask it.
            self.want_if_newer_profile(item);
            return self.refuse(Rejected::NotSender);
        }
        match self.bind(item, origin, now) {
            Ok(()) => self.apply_body(item, origin, now),
            Err(applied) => applied,
        }
    }

    fn refuse(&self, reason: Rejected) -> Applied {
        self.stats.reject(reason);
        Applied::Refused
    }

    /// Makes sure the entry for `item.name` is bound to `item.node`: creates it or moves it to
    /// a new incarnation (first-hand only), or says why the item does not apply.
    fn bind(&mut self, item: &Item, origin: Origin, now: Instant) -> Result<(), Applied> {
        let Some(e) = self.entries.get(&item.name) else {
            if origin == Origin::Relayed {
                // Heard of second-hand only: it introduces itself when SWIM sees it. If SWIM
                // already counts it alive, its introduction was lost: ask it directly.
                self.want(&item.node);
                return Err(Applied::Stale);
            }
            self.bind_afresh(&item.name, &item.node, now);
            return Ok(());
        };
        if e.node == item.node {
            return Ok(());
        }
        if item.node.epoch <= e.node.epoch {
            // An older incarnation's item, late.
            return Err(Applied::Stale);
        }
        if !same_addr(e.node.addr, item.node.addr) && self.active.contains(&e.node) {
            // The name belongs to a live node elsewhere.
            return Err(self.refuse(Rejected::NameTaken));
        }
        if origin == Origin::Relayed {
            self.want(&item.node);
            return Err(Applied::Stale);
        }
        // A restarted agent (or one that rejoined): its old incarnation is gone for good.
        self.bind_afresh(&item.name, &item.node, now);
        Ok(())
    }

    /// A new entry for `name`, bound to `node`, replacing any older one.
    fn bind_afresh(&mut self, name: &str, node: &NodeId, now: Instant) {
        if let Some(old) = self
            .entries
            .insert(name.to_owned(), fresh(node.clone(), now))
        {
            unindex(&mut self.by_node, &old.node, name);
            self.lost = true;
        }
        self.by_node
            .entry(node.clone())
            .or_default()
            .push(name.to_owned());
        self.dirty = true;
    }

    fn apply_body(&mut self, item: &Item, origin: Origin, now: Instant) -> Applied {
        let Some(entry) = self.entries.get_mut(&item.name) else {
            return Applied::Stale;
        };
        let stored = match &item.body {
            Body::Profile(_) => entry.profile.as_ref().map(|(seq, _)| *seq),
            Body::Live(_) => entry.live.as_ref().map(|(seq, _)| *seq),
        };
        let newer = stored.is_none_or(|seq| item.seq > seq);
        let fresh_enough = match origin {
            // The node's own word overrides whatever was relayed in its name.
            Origin::FirstHand => newer || item.seq > entry.vouched,
            Origin::Relayed if newer && item.seq > entry.vouched + MAX_RELAYED_LEAD => {
                let node = entry.node.clone();
                self.want(&node);
                return self.refuse(Rejected::OutOfRange);
            }
            Origin::Relayed => newer,
        };
        if !fresh_enough {
            return Applied::Stale;
        }
        if origin == Origin::FirstHand {
            entry.vouched = entry.vouched.max(item.seq);
        }
        entry.last_heard = now;
        match &item.body {
            Body::Profile(p) => {
                entry.profile = Some((item.seq, p.clone()));
                entry.routed_profile = Some(Arc::new(model::Profile::from(p)));
                self.dirty = true;
            }
            Body::Live(l) => {
                entry.live = Some((item.seq, *l));
                let lacks_profile = entry
                    .profile
                    .as_ref()
                    .is_none_or(|(seq, _)| *seq < l.profile_seq);
                let node = entry.node.clone();
                if lacks_profile {
                    self.want(&node);
                }
                if !self.live_updates.contains(&item.name) {
                    self.live_updates.push(item.name.clone());
                }
            }
        }
        Applied::New
    }

    /// A relayed profile newer than the one known: its node is asked for it directly.
    fn want_if_newer_profile(&mut self, item: &Item) {
        let known = self.entries.get(&item.name).filter(|e| e.node == item.node);
        if known.is_some_and(|e| e.profile.as_ref().is_none_or(|(seq, _)| *seq < item.seq)) {
            self.want(&item.node);
        }
    }

    /// Asks a member for its items directly; only members SWIM counts alive, so a forged item
    /// cannot make this node send to arbitrary addresses.
    fn want(&mut self, node: &NodeId) {
        if self.active.contains(node) && !self.wants.contains(node) {
            self.wants.push(node.clone());
        }
    }

    pub(super) fn member_up(&mut self, node: &NodeId) {
        if self.active.insert(node.clone()) {
            self.newcomers.push(node.clone());
        }
        for name in self.by_node.get(node).into_iter().flatten() {
            if let Some(e) = self.entries.get_mut(name) {
                e.down_since = None;
                self.dirty = true;
            }
        }
    }

    pub(super) fn member_down(&mut self, node: &NodeId, now: Instant) {
        if self.active.remove(node) {
            self.dirty = true;
            self.lost = true;
        }
        for name in self.by_node.get(node).into_iter().flatten() {
            if let Some(e) = self
                .entries
                .get_mut(name)
                .filter(|e| e.down_since.is_none())
            {
                e.down_since = Some(now);
                self.dirty = true;
            }
        }
    }

    /// A new identity at a member's address (foca reports a rename, not a join): it is a
    /// newcomer all the same and gets this node's items directly. The old identity is gone, so
    /// its entries stop being routable (and are pruned unless their agent comes back).
    ///
    /// They are not moved to `new`: an identity carries no agent name, and the new node may be
    /// another agent that got the address (Kubernetes reuses pod IPs), which would then hold
    /// the old agent's name and lock it out. Which agent `new` is comes from its own first-hand
    /// items: `bind` starts its entry afresh (a restart in place: its `seq` counts from 1 again)
    /// or creates one under its own name.
    pub(super) fn renamed(&mut self, old: &NodeId, new: &NodeId, now: Instant) {
        if self.active.remove(old) && self.active.insert(new.clone()) {
            self.newcomers.push(new.clone());
        }
        for name in self.by_node.get(old).into_iter().flatten() {
            if let Some(e) = self
                .entries
                .get_mut(name)
                .filter(|e| e.down_since.is_none())
            {
                e.down_since = Some(now);
            }
        }
        self.dirty = true;
        self.lost = true;
    }

    /// Asks the members SWIM counts alive whose profile this node never got (their
    /// introduction was lost, and no relayed item has come to show it yet).
    pub(super) fn want_unintroduced(&mut self) {
        let entries = &self.entries;
        let unintroduced: Vec<NodeId> = self
            .active
            .iter()
            .filter(|node| {
                self.by_node.get(*node).is_none_or(|names| {
                    names
                        .iter()
                        .all(|name| entries.get(name).is_none_or(|e| e.profile.is_none()))
                })
            })
            .cloned()
            .collect();
        for node in unintroduced {
            self.want(&node);
        }
    }

    pub(super) fn is_active(&self, node: &NodeId) -> bool {
        self.active.contains(node)
    }

    pub(super) fn active_addrs(&self) -> HashSet<std::net::SocketAddr> {
        self.active.iter().map(|n| n.addr).collect()
    }

    /// Members that can be routed to: alive in SWIM, profile known.
    pub(super) fn routable(&self) -> Vec<Member> {
        let mut out: Vec<Member> = self
            .entries
            .iter()
            .filter(|(_, e)| self.active.contains(&e.node))
            .filter_map(|(name, e)| {
                e.routed_profile.as_ref().map(|p| Member {
                    name: name.clone(),
                    node: e.node.clone(),
                    profile: p.clone(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    pub(super) fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter()
    }

    /// Drops members dead for a while, and ones heard of second-hand that SWIM never saw alive.
    pub(super) fn prune(&mut self, now: Instant) {
        let active = &self.active;
        let by_node = &mut self.by_node;
        let before = self.entries.len();
        self.entries.retain(|name, e| {
            let since = e.down_since.unwrap_or(e.last_heard);
            let keep =
                active.contains(&e.node) || now.saturating_duration_since(since) < DOWN_LISTED_FOR;
            if !keep {
                unindex(by_node, &e.node, name);
            }
            keep
        });
        if self.entries.len() != before {
            self.dirty = true;
            self.lost = true;
        }
    }
}

/// Forgets that `name` is bound to `node`.
fn unindex(by_node: &mut HashMap<NodeId, Vec<String>>, node: &NodeId, name: &str) {
    if let Some(names) = by_node.get_mut(node) {
        names.retain(|n| n != name);
        if names.is_empty() {
            by_node.remove(node);
        }
    }
}

fn fresh(node: NodeId, now: Instant) -> Entry {
    Entry {
        node,
        profile: None,
        routed_profile: None,
        live: None,
        vouched: 0,
        last_heard: now,
        down_since: None,
    }
}

/// Two socket addresses are one endpoint (an IPv4 peer may show as `::ffff:a.b.c.d`).
pub(super) fn same_addr(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && a.ip().to_canonical() == b.ip().to_canonical()
}

/// What an honest node cannot have sent: an epoch (its start time) from the future, a `seq`
/// beyond what it can have published since, a profile whose inbound address is not on its own
/// IP (or has port 0).
fn plausible(item: &Item, now_us: u64, window_us: u64) -> Result<(), Rejected> {
    let horizon = now_us.saturating_add(window_us);
    if item.node.epoch > horizon {
        return Err(Rejected::OutOfRange);
    }
    let uptime_s = (horizon - item.node.epoch) / 1_000_000;
    if item.seq > SEQ_SLACK.saturating_add(MAX_ITEM_RATE.saturating_mul(uptime_s)) {
        return Err(Rejected::OutOfRange);
    }
    match &item.body {
        Body::Profile(p) => match p.inbound.parse::<SocketAddr>() {
            Ok(inbound)
                if inbound.port() != 0
                    && inbound.ip().to_canonical() == item.node.addr.ip().to_canonical() =>
            {
                Ok(())
            }
            _ => Err(Rejected::BadAddress),
        },
        Body::Live(_) => Ok(()),
    }
}

/// SWIM's word on its members as of the node's last look (every half second, and after a
/// membership change). Only members it does not count alive are kept: a fleet is mostly alive,
/// and an absent member reads like an alive one (`GossipStatus::of`).
#[derive(Debug, Default)]
pub(super) struct SwimView {
    pub members: usize,
    pub not_alive: HashMap<NodeId, foca::State>,
}

/// A routable member as the sidecar sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub name: String,
    pub node: NodeId,
    pub profile: Arc<model::Profile>,
}

/// The key foca uses to stop passing on an item once a newer one of the same kind exists.
#[derive(Clone, Debug)]
pub(super) struct ItemKey {
    name: String,
    /// The kind's byte on the wire.
    kind: u8,
    epoch: u64,
    seq: u64,
}

impl foca::Invalidates for ItemKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.name == other.name
            && self.kind == other.kind
            && (self.epoch, self.seq) >= (other.epoch, other.seq)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("a gossip item that does not decode: {0}")]
pub(super) struct BadItem(#[from] wire::WireError);

/// Foca's hook for items riding on SWIM messages: new ones go into the table and on to others.
#[derive(Debug, Clone)]
pub(super) struct Handler {
    pub table: Arc<Mutex<Table>>,
}

impl Handler {
    pub(super) fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl foca::BroadcastHandler<NodeId> for Handler {
    type Key = ItemKey;
    type Error = BadItem;

    fn receive_item(
        &mut self,
        data: &[u8],
        sender: Option<&NodeId>,
    ) -> Result<Option<ItemKey>, BadItem> {
        let decoded = match wire::decode_item(data) {
            Ok(decoded) => decoded,
            // One item that does not decode is dropped alone (foca would drop the rest of the
            // message's items with it on an error).
            Err(_) if sender.is_some() => {
                self.lock().stats.reject(Rejected::Undecodable);
                return Ok(None);
            }
            Err(err) => return Err(err.into()),
        };
        let item = match decoded {
            Decoded::Known(item) => item,
            Decoded::Unknown {
                kind,
                name,
                node,
                seq,
                ..
            } => {
                if sender.is_none() {
                    // This node's own (only a newer sidecar, or a test, publishes one).
                    return Ok(Some(ItemKey {
                        name,
                        kind,
                        epoch: node.epoch,
                        seq,
                    }));
                }
                // A newer sidecar's: skipped, not passed on (nothing here can judge it), and
                // the other items riding on the same message are read all the same.
                self.lock().stats.reject(Rejected::UnknownKind);
                return Ok(None);
            }
        };
        let key = ItemKey {
            name: item.name.clone(),
            kind: item.kind().code(),
            epoch: item.node.epoch,
            seq: item.seq,
        };
        // This node's own items (sender None) are always passed on.
        if sender.is_none() {
            return Ok(Some(key));
        }
        let mut table = self.lock();
        let origin = table.origin(&item);
        match table.apply(&item, origin, Instant::now()) {
            Applied::New => Ok(Some(key)),
            Applied::Stale | Applied::Mine | Applied::Refused => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
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
        t.get(name).and_then(|e| e.live.map(|(_, l)| l.state))
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
}
