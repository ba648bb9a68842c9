//! Which definition of a tool this caller lists and routes to (`docs/mcp.md`, "Whose tool
//! definitions are believed"). Servers announce each tool with the digest of its definition
//! (description, schemas, annotations); a tool name is pinned to the first definition this
//! caller settles on — the one most of its servers announce then — and a server announcing
//! another is held back (not listed, not routed, counted and shown) until the policy accepts
//! that digest (`mcp.accept`), which moves the tool to it. So one server cannot change what a
//! shared tool means for the fleet, and a merged list never promises a definition the routed
//! server does not have: a tool is listed and routed by one definition only.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::config::Snapshot;
use crate::fast_hash::FastMap;
use crate::registry::Peer;

/// Tools pinned at most; past it a tool is judged by the majority each time, unpinned.
const MAX_PINS: usize = 4096;

/// The definition pinned for each (capability, tool).
#[derive(Debug, Default)]
pub(crate) struct Pins {
    pinned: Mutex<FastMap<(String, String), String>>,
}

impl Pins {
    /// The digest of `tool` this caller lists and routes to, given the servers announcing it:
    /// one the policy accepts (the last listed first) that a server announces, else the pinned
    /// one (pinned now to the majority's when none is). `None` when no server announces it.
    pub(crate) fn chosen<'p>(
        &self,
        snapshot: &Snapshot,
        capability: &str,
        tool: &str,
        servers: impl IntoIterator<Item = &'p Peer>,
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
        match pinned.get(&key) {
            Some(pin) => announced.contains(&pin.as_str()).then(|| pin.clone()),
            None => {
                let majority = majority(&announced)?.to_owned();
                if pinned.len() < MAX_PINS {
                    pinned.insert(key, majority.clone());
                }
                Some(majority)
            }
        }
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
    use super::*;

    #[test]
    fn the_majority_settles_a_pin_and_ties_go_to_the_smallest() {
        assert_eq!(majority(&["b", "a", "b"]), Some("b"));
        assert_eq!(majority(&["b", "a"]), Some("a"));
        assert_eq!(majority(&[]), None);
    }
}
