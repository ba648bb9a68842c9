//! Which definition of a tool this caller lists and routes to (`docs/mcp.md`, "Whose tool
//! definitions are believed"). Servers announce each tool with the digest of its definition
//! (description, schemas, annotations); a tool name is pinned to the first definition this
//! caller settles on and a server announcing another is held back (not listed, not routed,
//! counted and shown) until the policy accepts that digest (`mcp.accept`), which moves the tool
//! to it. So one server cannot change what a shared tool means for the fleet, and a merged list
//! never promises a definition the routed server does not have: a tool is listed and routed by
//! one definition only.
//!
//! Pins are known to the whole fleet: each sidecar publishes its own over gossip, and a caller
//! settling a tool for the first time adopts the one most members pin (`set_fleet`), falling
//! back to the one most servers announce when no member pins the tool yet. A caller that starts
//! after servers with another definition joined is not swayed by their number.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::config::Snapshot;
use crate::fast_hash::FastMap;
use crate::gossip::{Member, Pin};
use crate::peers::FleetPins;
use crate::registry::Peer;

/// Tools pinned at most; past it a tool is judged each time, unpinned. Also the most (tool,
/// digest) pairs kept of the fleet's pins: past it, the digests of members later by name are not
/// counted.
const MAX_PINS: usize = 4096;
/// A member's pins counted at most: more than one gossip item holds (`MAX_ITEM`); a member
/// claiming more is read no further.
const MAX_MEMBER_PINS: usize = 128;

type Key = (String, String);

/// The definition pinned for each (capability, tool), and what the fleet's members pin.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    pinned: Mutex<FastMap<Key, String>>,
    /// Counts the pins settled, so the gossip task republishes only after a change.
    settled: AtomicU64,
    /// Per tool: each digest members pin, and how many members pin it.
    fleet: Mutex<FastMap<Key, BTreeMap<String, u32>>>,
}

impl Pins {
    /// The digest of `tool` this caller lists and routes to, given the servers announcing it:
    /// one the policy accepts (the last listed first) that a server announces, else the pinned
    /// one. With none pinned yet it is pinned now: to the fleet's pin (`fleet_pin`), else to the
    /// majority's. `None` when no server announces it.
    pub(crate) fn chosen<'p>(
        &self,
        snapshot: &Snapshot,
        capability: &str,
        tool: &str,
        servers: impl IntoIterator<Item = &'p Peer>,
    ) -> Option<String> {
        self.choose(snapshot, (capability, tool), servers, true)
    }

    /// What `chosen` would answer, settling nothing: `/status` and `/metrics` may be read
    /// before gossip brought the fleet's pins, and a pin never moves once set.
    pub(crate) fn shown<'p>(
        &self,
        snapshot: &Snapshot,
        capability: &str,
        tool: &str,
        servers: impl IntoIterator<Item = &'p Peer>,
    ) -> Option<String> {
        self.choose(snapshot, (capability, tool), servers, false)
    }

    fn choose<'p>(
        &self,
        snapshot: &Snapshot,
        (capability, tool): (&str, &str),
        servers: impl IntoIterator<Item = &'p Peer>,
        settle: bool,
    ) -> Option<String> {
        let announced: Vec<&str> = servers
            .into_iter()
            .filter_map(|p| p.tool(capability, tool))
            .map(|t| t.schema.as_str())
            .collect();
        let accepted = snapshot.policy.mcp.accepted(capability, tool);
        if let Some(digest) = accepted.iter().rev().find(|a| announced.contains(a)) {
            return Some((*digest).to_owned());
        }
        let key = (capability.to_owned(), tool.to_owned());
        let mut pinned = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pin) = pinned.get(&key) {
            return announced.contains(&pin.as_str()).then(|| pin.clone());
        }
        let digest = self
            .fleet_pin(&key, &announced)
            .or_else(|| majority(&announced).map(str::to_owned))?;
        if settle && pinned.len() < MAX_PINS {
            pinned.insert(key, digest.clone());
            self.settled.fetch_add(1, Ordering::Relaxed);
        }
        Some(digest)
    }

    /// The digest most members pin for the tool among those announced (the smallest of those
    /// tied), each member counted once.
    fn fleet_pin(&self, key: &Key, announced: &[&str]) -> Option<String> {
        let fleet = self.fleet.lock().unwrap_or_else(|p| p.into_inner());
        let counts = fleet.get(key)?;
        let mut best: Option<(&String, u32)> = None;
        // By digest, smallest first: a tie keeps the first.
        for (digest, n) in counts {
            if announced.contains(&digest.as_str()) && best.is_none_or(|(_, most)| *n > most) {
                best = Some((digest, *n));
            }
        }
        best.map(|(digest, _)| digest.clone())
    }

    /// How many members pin `digest` for `tool` (`/status`).
    pub(crate) fn pinned_by(&self, capability: &str, tool: &str, digest: &str) -> u32 {
        let fleet = self.fleet.lock().unwrap_or_else(|p| p.into_inner());
        fleet
            .get(&(capability.to_owned(), tool.to_owned()))
            .and_then(|counts| counts.get(digest))
            .copied()
            .unwrap_or(0)
    }

    /// This sidecar's pins, for gossip: by capability then tool.
    pub(crate) fn published(&self) -> Vec<Pin> {
        let pinned = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
        let mut pins: Vec<Pin> = pinned
            .iter()
            .map(|((capability, tool), digest)| Pin {
                capability: capability.clone(),
                tool: tool.clone(),
                digest: digest.clone(),
            })
            .collect();
        pins.sort();
        pins
    }

    /// Grows with every pin settled: `published` changed since it was last read at another.
    pub(crate) fn generation(&self) -> u64 {
        self.settled.load(Ordering::Relaxed)
    }
}

impl FleetPins for Pins {
    /// Counts the members' pins afresh: per tool, each digest and how many members pin it (a
    /// member counted once per tool, its first pin of it; at most `MAX_MEMBER_PINS` of its
    /// pins read, and `MAX_PINS` pairs kept in all). A member is a gossip address: a node
    /// publishing under several names is counted once, by the first of them.
    fn set_fleet(&self, members: &[Member]) {
        let mut fleet: FastMap<Key, BTreeMap<String, u32>> = FastMap::default();
        let mut kept = 0;
        let mut nodes: HashSet<SocketAddr> = HashSet::new();
        for member in members {
            let addr = member.node.addr;
            if !nodes.insert(SocketAddr::new(addr.ip().to_canonical(), addr.port())) {
                continue;
            }
            let mut counted: HashSet<(&str, &str)> = HashSet::new();
            for pin in member.pins.iter().take(MAX_MEMBER_PINS) {
                if !counted.insert((pin.capability.as_str(), pin.tool.as_str())) {
                    continue;
                }
                let key = (pin.capability.clone(), pin.tool.clone());
                match fleet.get_mut(&key).and_then(|c| c.get_mut(&pin.digest)) {
                    Some(n) => *n += 1,
                    None if kept < MAX_PINS => {
                        fleet.entry(key).or_default().insert(pin.digest.clone(), 1);
                        kept += 1;
                    }
                    None => {}
                }
            }
        }
        *self.fleet.lock().unwrap_or_else(|p| p.into_inner()) = fleet;
    }
}

/// The digest most servers announce (the smallest of those tied).
fn majority<'a>(announced: &[&'a str]) -> Option<&'a str> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for d in announced {
        *counts.entry(d).or_default() += 1;
    }
    let most = counts.values().copied().max()?;
    counts.into_iter().find(|(_, n)| *n == most).map(|(d, _)| d)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::{Bootstrap, ConfigPaths, ConfigStore, Policy, ToolFacts};
    use crate::gossip::{NodeId, Profile};

    const D1: &str = "1111111111111111";
    const D2: &str = "2222222222222222";
    const D3: &str = "3333333333333333";

    fn snapshot() -> Arc<Snapshot> {
        let b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap_or_else(|e| panic!("{e}"));
        ConfigStore::new(b, Policy::default(), ConfigPaths::default()).snapshot()
    }

    /// A server announcing `search` of `mcp` with the definition `digest`.
    fn server(name: &str, digest: &str) -> Peer {
        let tool = ToolFacts {
            name: "search".into(),
            title: String::new(),
            schema: digest.into(),
            read_only: true,
            idempotent: false,
        };
        let mut peer = Peer::from_member(&member(name, &[]));
        peer.tools.insert("mcp".into(), vec![tool]);
        peer
    }

    /// A member pinning `search` of `mcp` to each of `digests` in turn, at a gossip address of
    /// its own.
    fn member(name: &str, digests: &[&str]) -> Member {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let [.., a, b, c] = NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes();
        Member {
            name: name.into(),
            node: NodeId {
                addr: SocketAddr::from(([10, a, b, c], 4190)),
                epoch: 1,
            },
            profile: Arc::new(Profile {
                inbound: "10.0.0.1:4143".into(),
                zone: String::new(),
                region: String::new(),
                max_concurrency: 1,
                capabilities: Vec::new(),
                version: "test".into(),
                identity: None,
            }),
            pins: Arc::new(
                digests
                    .iter()
                    .map(|d| Pin {
                        capability: "mcp".into(),
                        tool: "search".into(),
                        digest: (*d).into(),
                    })
                    .collect(),
            ),
        }
    }

    /// One honest server and two announcing another definition.
    fn servers() -> Vec<Peer> {
        vec![server("a", D1), server("m1", D2), server("m2", D2)]
    }

    fn chosen(pins: &Pins, servers: &[Peer]) -> Option<String> {
        pins.chosen(&snapshot(), "mcp", "search", servers)
    }

    #[test]
    fn the_majority_settles_a_pin_and_ties_go_to_the_smallest() {
        assert_eq!(majority(&["b", "a", "b"]), Some("b"));
        assert_eq!(majority(&["b", "a"]), Some("a"));
        assert_eq!(majority(&[]), None);
    }

    #[test]
    fn a_new_caller_adopts_the_fleets_pin_over_the_servers_majority() {
        let pins = Pins::default();
        pins.set_fleet(&[member("c1", &[D1])]);
        assert_eq!(pins.generation(), 0);
        assert_eq!(chosen(&pins, &servers()).as_deref(), Some(D1));
        assert_eq!(pins.generation(), 1);
        let published = pins.published();
        assert_eq!(published.len(), 1);
        assert_eq!(published[0].digest, D1);
        // Settled: the fleet changing its mind later does not move it.
        pins.set_fleet(&[member("x", &[D2]), member("y", &[D2])]);
        assert_eq!(chosen(&pins, &servers()).as_deref(), Some(D1));
    }

    #[test]
    fn with_no_member_pinning_the_tool_the_majority_settles_it_and_it_never_moves() {
        let pins = Pins::default();
        pins.set_fleet(&[member("c1", &[])]);
        assert_eq!(chosen(&pins, &servers()).as_deref(), Some(D2));
        pins.set_fleet(&[member("c1", &[D1]), member("c2", &[D1])]);
        assert_eq!(chosen(&pins, &servers()).as_deref(), Some(D2));
        assert_eq!(pins.published()[0].digest, D2);
    }

    #[test]
    fn the_fleets_pin_counts_members_once_among_announced_digests_ties_to_the_smallest() {
        let pins = Pins::default();
        pins.set_fleet(&[
            // Pinned by most members, but no server announces it.
            member("p", &[D3]),
            member("q", &[D3]),
            member("r", &[D3]),
            // One member naming the tool twice counts once, for its first pin.
            member("s", &[D2, D1, D1]),
            member("t", &[D1]),
        ]);
        assert_eq!(pins.pinned_by("mcp", "search", D1), 1);
        assert_eq!(pins.pinned_by("mcp", "search", D2), 1);
        assert_eq!(pins.pinned_by("mcp", "search", D3), 3);
        // D1 and D2 tie: the smallest.
        assert_eq!(chosen(&pins, &servers()).as_deref(), Some(D1));
    }

    #[test]
    fn a_node_publishing_under_several_names_is_counted_once() {
        let pins = Pins::default();
        let first = member("m", &[D2]);
        let mut fleet = vec![member("c1", &[D1]), member("c2", &[D1])];
        for i in 0..3 {
            fleet.push(Member {
                name: format!("m{i}"),
                ..first.clone()
            });
        }
        pins.set_fleet(&fleet);
        assert_eq!(pins.pinned_by("mcp", "search", D2), 1);
        assert_eq!(chosen(&pins, &servers()).as_deref(), Some(D1));
    }

    #[test]
    fn status_shows_the_choice_without_settling_it() {
        let pins = Pins::default();
        let shown = pins.shown(&snapshot(), "mcp", "search", &servers());
        assert_eq!(shown.as_deref(), Some(D2));
        assert!(pins.published().is_empty());
        // Gossip brings the fleet's pin afterwards: the first real use adopts it.
        pins.set_fleet(&[member("c1", &[D1])]);
        assert_eq!(chosen(&pins, &servers()).as_deref(), Some(D1));
    }

    #[test]
    fn the_fleets_pins_are_bounded() {
        let many: Vec<Pin> = (0..MAX_MEMBER_PINS + 10)
            .map(|i| Pin {
                capability: "mcp".into(),
                tool: format!("t{i}"),
                digest: D1.into(),
            })
            .collect();
        let mut loud = member("loud", &[]);
        loud.pins = Arc::new(many);
        let members: Vec<Member> = (0..MAX_PINS / MAX_MEMBER_PINS + 2)
            .map(|i| Member {
                pins: loud.pins.clone(),
                ..member(&format!("loud-{i}"), &[])
            })
            .collect();
        let pins = Pins::default();
        pins.set_fleet(&members);
        let fleet = pins.fleet.lock().unwrap_or_else(|p| p.into_inner());
        let kept: usize = fleet.values().map(BTreeMap::len).sum();
        assert_eq!(
            kept, MAX_MEMBER_PINS,
            "each member's pins past the bound ignored"
        );
        drop(fleet);
        // Pairs already kept are still counted; new pairs stop at `MAX_PINS`.
        assert_eq!(pins.pinned_by("mcp", "t0", D1), members.len() as u32);
        let other: Vec<Member> = (0..MAX_PINS + 5)
            .map(|i| Member {
                pins: Arc::new(vec![Pin {
                    capability: "mcp".into(),
                    tool: format!("u{i}"),
                    digest: D1.into(),
                }]),
                ..member(&format!("m{i}"), &[])
            })
            .collect();
        pins.set_fleet(&other);
        let fleet = pins.fleet.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(fleet.values().map(BTreeMap::len).sum::<usize>(), MAX_PINS);
    }
}
