//! Everything this node knows of the others, keyed by agent name: the newest incarnation of each
//! agent, its profile and live view, and whether SWIM counts it alive.
//!
//! Items only move an entry forward: an older incarnation (epoch) or an older `seq` of the same
//! kind changes nothing, so a replayed or late item cannot roll an agent's state back, and a
//! restarted agent's new address replaces the old one the moment the first item from it arrives.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::{Duration, Instant};

use super::wire::{self, Body, Item, ItemKind, Live, NodeId, Profile};

/// How long a dead member stays listed (as `down`) in `/status`.
const DOWN_LISTED_FOR: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(super) struct Entry {
    pub node: NodeId,
    pub profile: Option<(u64, Profile)>,
    pub live: Option<(u64, Live)>,
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
}

#[derive(Debug)]
pub(super) struct Table {
    me: String,
    my_node: NodeId,
    entries: HashMap<String, Entry>,
    /// Identities SWIM counts alive.
    active: HashSet<NodeId>,
    /// Set when the routable set or a profile changed.
    pub dirty: bool,
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
    pub(super) fn new(me: String, my_node: NodeId) -> Self {
        Self {
            me,
            my_node,
            entries: HashMap::new(),
            active: HashSet::new(),
            dirty: false,
            live_updates: Vec::new(),
            wants: Vec::new(),
            newcomers: Vec::new(),
            name_conflicts: 0,
        }
    }

    pub(super) fn set_my_node(&mut self, node: NodeId) {
        self.my_node = node;
    }

    pub(super) fn apply(&mut self, item: &Item, now: Instant) -> Applied {
        if item.name == self.me {
            if item.node.addr != self.my_node.addr {
                self.name_conflicts += 1;
            }
            return Applied::Mine;
        }
        let entry = match self.entries.get_mut(&item.name) {
            Some(e) if item.node.epoch < e.node.epoch => return Applied::Stale,
            Some(e) if item.node.epoch == e.node.epoch && item.node.addr != e.node.addr => {
                // Two incarnations started in the same microsecond: keep the one known first.
                return Applied::Stale;
            }
            Some(e) if item.node.epoch > e.node.epoch => {
                // A restarted agent (or one that rejoined): its old address is gone for good.
                *e = fresh(item.node.clone(), now);
                self.dirty = true;
                e
            }
            Some(e) => e,
            None => {
                self.dirty = true;
                self.entries
                    .entry(item.name.clone())
                    .or_insert_with(|| fresh(item.node.clone(), now))
            }
        };
        let applied = match &item.body {
            Body::Profile(p) => {
                if entry
                    .profile
                    .as_ref()
                    .is_some_and(|(seq, _)| *seq >= item.seq)
                {
                    Applied::Stale
                } else {
                    entry.profile = Some((item.seq, p.clone()));
                    self.dirty = true;
                    Applied::New
                }
            }
            Body::Live(l) => {
                if entry.live.as_ref().is_some_and(|(seq, _)| *seq >= item.seq) {
                    Applied::Stale
                } else {
                    entry.live = Some((item.seq, *l));
                    if entry
                        .profile
                        .as_ref()
                        .is_none_or(|(seq, _)| *seq < l.profile_seq)
                        && !self.wants.contains(&entry.node)
                    {
                        self.wants.push(entry.node.clone());
                    }
                    if !self.live_updates.contains(&item.name) {
                        self.live_updates.push(item.name.clone());
                    }
                    Applied::New
                }
            }
        };
        if applied == Applied::New {
            entry.last_heard = now;
        }
        applied
    }

    pub(super) fn member_up(&mut self, node: &NodeId) {
        if self.active.insert(node.clone()) {
            self.newcomers.push(node.clone());
        }
        for e in self.entries.values_mut() {
            if e.node == *node {
                e.down_since = None;
                self.dirty = true;
            }
        }
    }

    pub(super) fn member_down(&mut self, node: &NodeId, now: Instant) {
        self.active.remove(node);
        for e in self.entries.values_mut() {
            if e.node == *node && e.down_since.is_none() {
                e.down_since = Some(now);
                self.dirty = true;
            }
        }
    }

    /// A member restarted at the same address (foca reports a rename, not a join): it is a
    /// newcomer all the same and gets this node's items directly.
    pub(super) fn renamed(&mut self, old: &NodeId, new: &NodeId) {
        if self.active.remove(old) && self.active.insert(new.clone()) {
            self.newcomers.push(new.clone());
        }
        for e in self.entries.values_mut() {
            if e.node == *old && new.epoch > e.node.epoch {
                e.node = new.clone();
            }
        }
        self.dirty = true;
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
                e.profile.as_ref().map(|(_, p)| Member {
                    name: name.clone(),
                    node: e.node.clone(),
                    profile: Arc::new(p.clone()),
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
        let before = self.entries.len();
        self.entries.retain(|_, e| {
            let since = e.down_since.unwrap_or(e.last_heard);
            active.contains(&e.node) || now.saturating_duration_since(since) < DOWN_LISTED_FOR
        });
        if self.entries.len() != before {
            self.dirty = true;
        }
    }
}

fn fresh(node: NodeId, now: Instant) -> Entry {
    Entry {
        node,
        profile: None,
        live: None,
        last_heard: now,
        down_since: None,
    }
}

/// A routable member as the sidecar sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub name: String,
    pub node: NodeId,
    pub profile: Arc<Profile>,
}

/// The key foca uses to stop passing on an item once a newer one of the same kind exists.
#[derive(Clone, Debug)]
pub(super) struct ItemKey {
    name: String,
    kind: ItemKind,
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
#[error("a gossip item that does not decode")]
pub(super) struct BadItem;

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
        let item: Item = wire::decode(data).ok_or(BadItem)?;
        let key = ItemKey {
            name: item.name.clone(),
            kind: item.kind(),
            epoch: item.node.epoch,
            seq: item.seq,
        };
        // This node's own items (sender None) are always passed on.
        if sender.is_none() {
            return Ok(Some(key));
        }
        match self.lock().apply(&item, Instant::now()) {
            Applied::New => Ok(Some(key)),
            Applied::Stale | Applied::Mine => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reach::State;

    fn node(port: u16, epoch: u64) -> NodeId {
        NodeId {
            addr: std::net::SocketAddr::from(([10, 0, 0, 1], port)),
            epoch,
        }
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

    #[test]
    fn an_old_item_played_back_does_not_roll_state_back() {
        let now = Instant::now();
        let mut t = Table::new("me".into(), node(1, 1));
        let n = node(2, 5);
        assert_eq!(
            t.apply(&item("a", n.clone(), 1, profile("a:1")), now),
            Applied::New
        );
        assert_eq!(
            t.apply(&item("a", n.clone(), 3, live(1, State::Draining)), now),
            Applied::New
        );
        assert_eq!(
            t.apply(&item("a", n.clone(), 2, live(1, State::Healthy)), now),
            Applied::Stale
        );
        let state = t.get("a").and_then(|e| e.live.map(|(_, l)| l.state));
        assert_eq!(state, Some(State::Draining));
    }

    #[test]
    fn a_restarted_agent_replaces_its_old_address() {
        let now = Instant::now();
        let mut t = Table::new("me".into(), node(1, 1));
        let (old, new) = (node(2, 5), node(3, 9));
        t.member_up(&old);
        t.member_up(&new);
        t.apply(&item("a", old.clone(), 7, profile("old:1")), now);
        assert_eq!(
            t.routable().first().map(|m| m.profile.inbound.clone()),
            Some("old:1".into())
        );
        t.apply(&item("a", new.clone(), 1, profile("new:1")), now);
        let routable = t.routable();
        assert_eq!(routable.len(), 1);
        assert_eq!(routable[0].profile.inbound, "new:1");
        // The old incarnation's items, however late, change nothing.
        assert_eq!(
            t.apply(&item("a", old, 99, profile("old:1")), now),
            Applied::Stale
        );
        assert_eq!(t.routable()[0].profile.inbound, "new:1");
    }

    #[test]
    fn a_dead_member_is_not_routable_and_a_live_view_without_profile_asks_for_it() {
        let now = Instant::now();
        let mut t = Table::new("me".into(), node(1, 1));
        let n = node(2, 5);
        t.member_up(&n);
        t.apply(&item("a", n.clone(), 2, live(1, State::Healthy)), now);
        assert!(t.routable().is_empty(), "no profile yet");
        assert_eq!(t.wants, vec![n.clone()]);
        t.apply(&item("a", n.clone(), 1, profile("a:1")), now);
        assert_eq!(t.routable().len(), 1);
        t.member_down(&n, now);
        assert!(t.routable().is_empty());
    }

    #[test]
    fn items_about_this_node_are_not_taken_from_others() {
        let mut t = Table::new("me".into(), node(1, 1));
        assert_eq!(
            t.apply(&item("me", node(9, 9), 1, profile("x:1")), Instant::now()),
            Applied::Mine
        );
        assert_eq!(t.name_conflicts, 1);
        assert!(t.routable().is_empty());
    }
}
