//! Delegation chains (`reach-chain`): the agents and capabilities a call passed on its way, and
//! how many sidecar-to-sidecar hops it took, so a caller's sidecar can refuse a loop or a chain
//! past `chains.max_hops` before it starts (`docs/chains.md`).
//!
//! Two forms travel. Between sidecars, the peer form `<hops>;<agent>><agent>/<capability>…`,
//! trusted only from a verified caller and rewritten at each inbound edge. To the agent, the same
//! text sealed with this sidecar's key (`…;<mac>`): the agent passes it on, like `traceparent`,
//! on the calls it makes while serving the call, and the outbound listener opens it, so an agent
//! can neither shorten nor invent the chain it is in. Only the outbound step of a call that
//! carries one pays for it.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::error::ReachError;

pub const HEADER: HeaderName = HeaderName::from_static("reach-chain");

/// The most entries a chain keeps (the origin and the last hops): its size stays bounded past
/// any `chains.max_hops` the policy allows, while the hop count keeps counting.
pub const MAX_ENTRIES: usize = 33;

/// The longest `reach-chain` value read: 33 entries of two 63-byte names each, and the rest.
const MAX_TEXT: usize = 4400;

/// The entry of a caller the sidecar could not name (a client without a sidecar).
const UNKNOWN: &str = "-";

/// A delegation chain: who called whom, oldest first, and the hops so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    hops: u32,
    /// `agent` (the origin, which called no capability of its own) or `agent/capability`.
    entries: Vec<String>,
}

impl Chain {
    /// The sidecar-to-sidecar hops the call has taken.
    pub fn hops(&self) -> u32 {
        self.hops
    }

    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// Whether `agent` serving `capability` is already on the chain: entering it again is a loop.
    pub fn holds(&self, agent: &str, capability: &str) -> bool {
        self.entries.iter().any(|e| {
            e.split_once('/')
                .is_some_and(|(a, c)| a == agent && c == capability)
        })
    }

    /// The peer form, `<hops>;<entry>><entry>…`.
    pub fn render(&self) -> String {
        format!("{};{}", self.hops, self.entries.join(">"))
    }

    /// For people: `a > b/review > c/plan`.
    pub fn display(&self) -> String {
        self.entries.join(" > ")
    }

    /// The peer form read back; `Err` names what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_TEXT {
            return Err(format!("longer than {MAX_TEXT} bytes"));
        }
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

    /// The chain as this sidecar hands it to its agent: what a verified caller's sidecar `sent`
    /// (its hops plus this one), or a new chain from the caller, then `me` serving `capability`.
    /// An unverified caller's chain is not read: only sidecars write chains.
    pub fn at_edge(sent: Option<&HeaderValue>, caller: Option<&str>, me: &str, cap: &str) -> Self {
        let from_peer = caller.and(sent).and_then(|v| v.to_str().ok());
        let mut chain = from_peer
            .and_then(|t| Chain::parse(t).ok())
            .unwrap_or_default();
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

/// This sidecar's key for the chains it hands its agent: made at start, never leaves the process.
pub struct Seal {
    key: ring::hmac::Key,
    /// First hops sealed already, by capability, then caller: a plain call's chain is the same
    /// for every call from one caller to one capability, so it is sealed once, not per call.
    first_hops: std::sync::RwLock<FirstHops>,
}

/// Capability → caller (`-` for one the sidecar could not name) → (this agent, sealed value).
type FirstHops =
    crate::fast_hash::FastMap<String, crate::fast_hash::FastMap<String, (String, HeaderValue)>>;

/// First hops kept at most (past it, the rest are sealed per call).
const MAX_FIRST_HOPS: usize = 4096;

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal(..)")
    }
}

impl Default for Seal {
    fn default() -> Self {
        let bytes: [u8; 32] = rand::random();
        Seal {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes),
            first_hops: Default::default(),
        }
    }
}

/// The bytes of the MAC kept: 128 bits.
const MAC_BYTES: usize = 16;

impl Seal {
    /// `chain` as the agent is given it: the peer form and its MAC.
    pub fn seal(&self, chain: &Chain) -> HeaderValue {
        use base64::Engine as _;
        let text = chain.render();
        let tag = ring::hmac::sign(&self.key, text.as_bytes());
        let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(&tag.as_ref()[..MAC_BYTES.min(tag.as_ref().len())]);
        crate::http::headers::value(&format!("{text};{mac}"))
    }

    /// The sealed chain of a call that starts one: `caller` (if vouched for) then `me` serving
    /// `cap`, one hop. Sealed once per caller and capability, then read back.
    pub fn first_hop(&self, caller: Option<&str>, me: &str, cap: &str) -> HeaderValue {
        let who = caller.unwrap_or(UNKNOWN);
        {
            let known = self.first_hops.read().unwrap_or_else(|p| p.into_inner());
            let hit = known.get(cap).and_then(|by| by.get(who));
            if let Some((_, value)) = hit.filter(|(agent, _)| agent == me) {
                return value.clone();
            }
        }
        let value = self.seal(&Chain::at_edge(None, caller, me, cap));
        let mut known = self.first_hops.write().unwrap_or_else(|p| p.into_inner());
        if known.values().map(|by| by.len()).sum::<usize>() < MAX_FIRST_HOPS {
            let by = known.entry(cap.to_owned()).or_default();
            by.insert(who.to_owned(), (me.to_owned(), value.clone()));
        }
        value
    }

    /// The chain in a value this sidecar sealed; a value it did not seal, or one changed since,
    /// is refused: passing it on as it came is the agent's only part.
    pub fn open(&self, value: &HeaderValue) -> Result<Chain, ReachError> {
        use base64::Engine as _;
        let refused = |why: &str| {
            ReachError::BadRequest(format!(
                "reach-chain {why}: pass on the value this sidecar gave the agent, unchanged"
            ))
        };
        let text = value.to_str().map_err(|_| refused("is not text"))?;
        let (chain, mac) = text
            .rsplit_once(';')
            .ok_or_else(|| refused("carries no seal"))?;
        let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(mac.trim())
            .map_err(|_| refused("carries no seal"))?;
        let tag = ring::hmac::sign(&self.key, chain.as_bytes());
        let expected = &tag.as_ref()[..MAC_BYTES.min(tag.as_ref().len())];
        if !bool::from(subtle::ConstantTimeEq::ct_eq(expected, mac.as_slice())) {
            return Err(refused("was not written by this sidecar"));
        }
        Chain::parse(chain).map_err(|why| refused(&why))
    }

    /// The agent's sealed chain in `headers` opened and replaced by its peer form (what the
    /// routing, a stored task and the peer read). A call without one is left as it is: one
    /// header lookup.
    pub fn carry(&self, headers: &mut HeaderMap) -> Result<(), ReachError> {
        let Some(value) = headers.get(HEADER) else {
            return Ok(());
        };
        let chain = self.open(value)?;
        headers.insert(HEADER, crate::http::headers::value(&chain.render()));
        Ok(())
    }
}

/// The chain a call carries in its peer form (after [`Seal::carry`]), if any.
pub fn of(headers: &HeaderMap) -> Option<Result<Chain, String>> {
    let value = headers.get(HEADER)?;
    Some(
        value
            .to_str()
            .map_err(|_| "not text".to_owned())
            .and_then(Chain::parse),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    #[test]
    fn each_edge_adds_its_agent_and_a_hop() {
        let first = Chain::at_edge(None, Some("planner"), "coder", "review");
        assert_eq!(first.render(), "1;planner>coder/review");
        let sent = value(&first.render());
        let second = Chain::at_edge(Some(&sent), Some("coder"), "planner", "plan");
        assert_eq!(second.render(), "2;planner>coder/review>planner/plan");
        assert!(second.holds("coder", "review"));
        assert!(!second.holds("planner", "review"));
        assert_eq!(second.display(), "planner > coder/review > planner/plan");
    }

    #[test]
    fn an_unverified_callers_chain_is_not_read_and_a_mismatched_one_keeps_everything() {
        let forged = value("0;x");
        let c = Chain::at_edge(Some(&forged), None, "coder", "review");
        assert_eq!(c.render(), "1;->coder/review");
        let sent = value("3;a>b/x>c/y");
        let c = Chain::at_edge(Some(&sent), Some("d"), "e", "z");
        assert_eq!(c.render(), "4;a>b/x>c/y>d>e/z");
    }

    #[test]
    fn a_sealed_chain_opens_and_a_changed_one_is_refused() {
        let seal = Seal::default();
        let chain = Chain::at_edge(None, Some("a"), "b", "review");
        let sealed = seal.seal(&chain);
        assert_eq!(seal.open(&sealed).ok(), Some(chain));
        let text = sealed.to_str().unwrap_or_default();
        let shortened = text.replacen("1;a>", "0;", 1);
        assert!(seal.open(&value(&shortened)).is_err());
        assert!(seal.open(&value("0;x")).is_err());
        assert!(
            Seal::default().open(&sealed).is_err(),
            "another sidecar's key"
        );
    }

    #[test]
    fn a_first_hop_is_sealed_once_and_opens_like_any_chain() {
        let seal = Seal::default();
        let first = seal.first_hop(Some("a"), "b", "review");
        assert_eq!(first, seal.first_hop(Some("a"), "b", "review"));
        let chain = Chain::at_edge(None, Some("a"), "b", "review");
        assert_eq!(seal.open(&first).ok(), Some(chain));
        let unknown = seal.first_hop(None, "b", "review");
        assert_eq!(
            seal.open(&unknown).ok().map(|c| c.render()),
            Some("1;->b/review".to_owned())
        );
        // Renamed: the entry is made anew.
        let renamed = seal.first_hop(Some("a"), "c", "review");
        assert_eq!(
            seal.open(&renamed).ok().map(|c| c.render()),
            Some("1;a>c/review".to_owned())
        );
    }

    #[test]
    fn a_long_chain_stays_bounded_and_keeps_counting() {
        let mut chain = Chain::at_edge(None, Some("origin"), "a0", "c");
        for n in 1..100 {
            let sent = value(&chain.render());
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
                let _ = Chain::at_edge(Some(&v), Some("a"), "b", "c");
            }
        }
    }
}
