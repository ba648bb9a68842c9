//! Delegation chains (`reach-chain`): the agents and capabilities a call passed on its way, and
//! how many sidecar-to-sidecar hops it took, so a caller's sidecar can refuse a loop or a chain
//! past `chains.max_hops` before it starts (`docs/chains.md`).
//!
//! Two forms travel. Between sidecars, the peer form `<hops>;<agent>><agent>/<capability>…`,
//! signed with a key of the mesh (derived from the gossip key: `…;m<mac>`) and read only when
//! that signature holds or the caller's certificate was verified — a plaintext process cannot
//! plant one — and rewritten at each inbound edge. To the agent, the same text sealed with this
//! sidecar's key and bound to the inbound call that issued it (`…;<mac>;<run>.<call>`): the
//! agent passes it on, like `traceparent`, on the calls it makes while serving the call, and
//! the outbound listener opens it — only while that call is in flight (or just ended),
//! so an agent can neither shorten, invent nor replay the chain it is in. A call that carries no
//! chain while the agent serves exactly one call continues that call's chain: a framework that
//! drops the header still cannot loop. The key is derived from the gossip key, so a chain stays
//! valid across a restart of its sidecar.

mod seal;

use http::HeaderName;

pub(crate) const HEADER: HeaderName = HeaderName::from_static("reach-chain");

/// The most entries a chain keeps (the origin and the last hops): its size stays bounded past
/// any `chains.max_hops` the policy allows, while the hop count keeps counting.
pub(crate) const MAX_ENTRIES: usize = 33;

/// The longest `reach-chain` value read: 33 entries of two 63-byte names each, and the rest.
const MAX_TEXT: usize = 4400;

/// The entry of a caller the sidecar could not name (a client without a sidecar).
const UNKNOWN: &str = "-";

/// A delegation chain: who called whom, oldest first, and the hops so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Chain {
    hops: u32,
    /// `agent` (the origin, which called no capability of its own) or `agent/capability`.
    entries: Vec<String>,
}

impl Chain {
    /// The sidecar-to-sidecar hops the call has taken.
    pub(crate) fn hops(&self) -> u32 {
        self.hops
    }

    #[cfg(test)]
    pub(crate) fn entries(&self) -> &[String] {
        &self.entries
    }

    /// Whether `agent` serving `capability` is already on the chain: entering it again is a loop.
    pub(crate) fn holds(&self, agent: &str, capability: &str) -> bool {
        self.entries.iter().any(|e| {
            e.split_once('/')
                .is_some_and(|(a, c)| a == agent && c == capability)
        })
    }

    /// The peer form, `<hops>;<entry>><entry>…`.
    pub(crate) fn render(&self) -> String {
        format!("{};{}", self.hops, self.entries.join(">"))
    }

    /// For people: `a > b/review > c/plan`.
    pub(crate) fn display(&self) -> String {
        self.entries.join(" > ")
    }

    /// The peer form read back (its mesh signature, if any, set aside); `Err` names what is
    /// wrong.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_TEXT {
            return Err(format!("longer than {MAX_TEXT} bytes"));
        }
        let text = split_mesh_mac(text).0;
        let (hops, entries) = text
            .split_once(';')
            .ok_or("not `<hops>;<agent>[/<capability>]>…`")?;
        let hops: u32 = hops
            .trim()
            .parse()
            .map_err(|_| format!("hop count `{hops}` is not a number"))?;
        let entries: Vec<String> = entries
            .split('>')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        if entries.len() > MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} entries"));
        }
        if let Some(bad) = entries.iter().find(|e| !valid_entry(e)) {
            return Err(format!(
                "`{bad}` is not `<agent>` or `<agent>/<capability>`"
            ));
        }
        Ok(Chain { hops, entries })
    }

    /// The chain as this sidecar hands it to its agent: what the caller's sidecar `sent` (its
    /// hops plus this one; [`Seal::read_from_peer`] decides whether it is read), or a new chain from
    /// the caller, then `me` serving `capability`.
    pub(crate) fn at_edge(sent: Option<&str>, caller: Option<&str>, me: &str, cap: &str) -> Self {
        let mut chain = sent.and_then(|t| Chain::parse(t).ok()).unwrap_or_default();
        let caller = caller.unwrap_or(UNKNOWN);
        // The caller's own entry ends the chain it sent; a chain that does not end with it
        // keeps everything and gains it, so nothing on it is lost.
        let last = chain
            .entries
            .last()
            .map(|e| e.split('/').next().unwrap_or(e));
        if last != Some(caller) {
            chain.push(caller.to_owned());
        }
        chain.hops = chain.hops.saturating_add(1);
        chain.push(format!("{me}/{cap}"));
        chain
    }

    /// Adds an entry, dropping the oldest after the origin when the chain is full.
    fn push(&mut self, entry: String) {
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.remove(1.min(self.entries.len() - 1));
        }
        self.entries.push(entry);
    }
}

fn valid_entry(entry: &str) -> bool {
    let name = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    match entry.split_once('/') {
        Some((agent, capability)) => name(agent) && name(capability),
        None => entry == UNKNOWN || name(entry),
    }
}

/// The peer form and its mesh signature (`…;m<mac>`), when it carries one.
fn split_mesh_mac(text: &str) -> (&str, Option<&str>) {
    match text.rsplit_once(';') {
        Some((chain, mac)) if chain.contains(';') && mac.starts_with('m') => (chain, mac.get(1..)),
        _ => (text, None),
    }
}

pub(crate) use seal::{InFlight, Seal};

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn each_edge_adds_its_agent_and_a_hop() {
        let first = Chain::at_edge(None, Some("planner"), "coder", "review");
        assert_eq!(first.render(), "1;planner>coder/review");
        let sent = first.render();
        let second = Chain::at_edge(Some(&sent), Some("coder"), "planner", "plan");
        assert_eq!(second.render(), "2;planner>coder/review>planner/plan");
        assert!(second.holds("coder", "review"));
        assert!(!second.holds("planner", "review"));
        assert_eq!(second.display(), "planner > coder/review > planner/plan");
    }

    #[test]
    fn a_long_chain_stays_bounded_and_keeps_counting() {
        let mut chain = Chain::at_edge(None, Some("origin"), "a0", "c");
        for n in 1..100 {
            let sent = chain.render();
            chain = Chain::at_edge(
                Some(&sent),
                Some(&format!("a{}", n - 1)),
                &format!("a{n}"),
                "c",
            );
        }
        assert_eq!(chain.hops(), 100);
        assert_eq!(chain.entries().len(), MAX_ENTRIES);
        assert_eq!(chain.entries()[0], "origin");
        assert!(Chain::parse(&chain.render()).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_chain_headers_parse_or_are_refused(text in "\\PC{0,200}") {
            let _ = Chain::parse(&text);
            if let Ok(v) = HeaderValue::from_str(&text) {
                let _ = Seal::default().open(&v);
                let _ = Seal::default().read_from_peer(&v, true);
                let _ = Chain::at_edge(Some(&text), Some("a"), "b", "c");
            }
        }
    }
}
