//! Everything this node knows of the others, keyed by agent name: the newest incarnation of each
//! agent, its profile, live view and MCP tool pins, and whether SWIM counts it alive.
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
/// Strangers kept between two drains: a burst of forged items cannot grow the list further.
const MAX_STRANGERS: usize = 64;

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
    pub(crate) node: NodeId,
    pub(crate) profile: Option<(u64, Profile)>,
    /// The profile as the routing model takes it, converted once when it arrives rather than
    /// each time the routable set is handed over.
    routed_profile: Option<Arc<model::Profile>>,
    pub(crate) live: Option<(u64, Live)>,
    /// Its MCP tool pins, as the routing model takes them (converted once, on arrival).
    pub(crate) pins: Option<(u64, Arc<Vec<model::Pin>>)>,
    /// The highest `seq` heard from the node first-hand.
    pub(crate) vouched: u64,
    pub(crate) last_heard: Instant,
    pub(crate) down_since: Option<Instant>,
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
    pub(crate) swim: SwimView,
    /// The source of the datagram being handled, so foca's hook can tell first-hand items.
    pub(crate) from: Option<SocketAddr>,
    /// Set when the routable set, a profile or a member's pins changed.
    pub(crate) dirty: bool,
    /// Set when a member stopped being routable (dead, restarted, pruned): callers must hear
    /// of that at once, while additions may be batched.
    pub(crate) lost: bool,
    /// Agents whose live view changed since last drained.
    pub(crate) live_updates: Vec<String>,
    /// Members whose profile this node lacks or has an old one of.
    pub(crate) wants: Vec<NodeId>,
    /// Members SWIM just reported up for the first time: they get this node's state directly.
    pub(crate) newcomers: Vec<NodeId>,
    /// Nodes whose items others relay but that SWIM does not count alive here: a membership
    /// update this node never got, or the other side of a healed partition. The node announces
    /// itself to them, which makes each side a member of the other.
    pub(crate) strangers: Vec<NodeId>,
    /// Another node claimed this node's name (two agents with one name).
    pub(crate) name_conflicts: u64,
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
            strangers: Vec::new(),
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
        if origin == Origin::Relayed && matches!(item.body, Body::Profile(_) | Body::Pins(_)) {
            // Where an agent is reached, and which tool definitions it pins, are taken from
            // the agent only (a relayed item in its name could be anyone's); ask it.
            self.want_if_newer(item);
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
                self.want_or_meet(&item.node);
                return Err(Applied::Stale);
            }
            self.bind_afresh(&item.name, &item.node, now);
            return Ok(());
        };
        if e.node == item.node {
            if origin == Origin::Relayed {
                // Others still hear from a node SWIM counts out here (a partition healed).
                self.meet(&item.node);
            }
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
            self.want_or_meet(&item.node);
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
            Body::Pins(_) => entry.pins.as_ref().map(|(seq, _)| *seq),
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
                entry.live = Some((item.seq, l.clone()));
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
            Body::Pins(p) => {
                let pins = p.pins.iter().map(model::Pin::from).collect();
                entry.pins = Some((item.seq, Arc::new(pins)));
                // Pins ride on `Member`: the routable set is handed over again with them.
                self.dirty = true;
            }
        }
        Applied::New
    }

    /// A relayed profile newer than the one known: its node is asked for it directly.
    fn want_if_newer(&mut self, item: &Item) {
        let known = self.entries.get(&item.name).filter(|e| e.node == item.node);
        let stored = |e: &Entry| match &item.body {
            Body::Pins(_) => e.pins.as_ref().map(|(seq, _)| *seq),
            _ => e.profile.as_ref().map(|(seq, _)| *seq),
        };
        if known.is_some_and(|e| stored(e).is_none_or(|seq| seq < item.seq)) {
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

    /// A node heard of second-hand: asked for its items if SWIM counts it alive, else met.
    fn want_or_meet(&mut self, node: &NodeId) {
        self.want(node);
        self.meet(node);
    }

    /// Notes a node others relay for but SWIM does not count alive here. SWIM alone may never
    /// bring it: a membership update is passed on a bounded number of times, a push-pull
    /// answer holds a few dozen members of a fleet of thousands, and after a partition each
    /// side holds the other as down. The node's items keep being relayed, so they show it.
    fn meet(&mut self, node: &NodeId) {
        if !self.active.contains(node)
            && self.strangers.len() < MAX_STRANGERS
            && !self.strangers.contains(node)
        {
            self.strangers.push(node.clone());
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
                    pins: e.pins.as_ref().map(|(_, p)| p.clone()).unwrap_or_default(),
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
        pins: None,
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
        Body::Live(_) | Body::Pins(_) => Ok(()),
    }
}

/// SWIM's word on its members as of the node's last look (every half second, and after a
/// membership change). Only members it does not count alive are kept: a fleet is mostly alive,
/// and an absent member reads like an alive one (`GossipStatus::of`).
#[derive(Debug, Default)]
pub(super) struct SwimView {
    pub(crate) members: usize,
    pub(crate) not_alive: HashMap<NodeId, foca::State>,
}

/// A routable member as the sidecar sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub name: String,
    pub node: NodeId,
    pub profile: Arc<model::Profile>,
    /// The MCP tool definitions it pinned (`src/outbound/mcp/pins.rs`); none heard yet is empty.
    pub pins: Arc<Vec<model::Pin>>,
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
    pub(crate) table: Arc<Mutex<Table>>,
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
mod tests;
