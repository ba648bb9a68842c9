//! Who is out there: the peers that can serve each capability. Members found by gossip come
//! first; the bootstrap's static peers and the policy's external targets are there too.

use std::collections::{BTreeMap, HashSet};

use crate::fast_hash::FastMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::config::{ExternalTarget, MtlsMode, Snapshot, StaticPeer, ToolFacts};
use crate::gossip::Member;
use crate::identity::SpiffeId;
use crate::transport::Expected;

/// A peer sidecar that can take calls for some capabilities.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Peer {
    pub name: String,
    /// The peer sidecar's inbound address (host:port).
    pub address: String,
    pub(crate) zone: String,
    pub(crate) region: String,
    pub capabilities: Vec<String>,
    /// Where this sidecar learned of the peer: `gossip`, `static`, or `external` (a plain
    /// service).
    pub source: &'static str,
    /// For an external target: its name (rate limits are per target), timeout and per-endpoint
    /// concurrency limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
    #[serde(skip)]
    pub(crate) timeout: Option<std::time::Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_concurrency: Option<usize>,
    /// The SPIFFE ID the peer's sidecar must present over mutual TLS (announced in gossip, or
    /// configured for a static peer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) identity: Option<SpiffeId>,
    /// Capability → its MCP server's tools, for the capabilities that are an MCP server's
    /// (announced in gossip; `docs/mcp.md`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) tools: BTreeMap<String, Vec<ToolFacts>>,
    /// An external target's `https://` endpoint: how it is dialled over TLS.
    #[serde(skip)]
    pub(crate) tls: Option<Arc<crate::transport::TargetTls>>,
}

impl Peer {
    /// The IP its sidecar's address names (`None` for a host name). By byte: `rsplit_once(':')`
    /// runs a reverse char searcher, and a plaintext call's caller is checked this way each time.
    pub(crate) fn ip(&self) -> Option<std::net::IpAddr> {
        let host = match self.address.bytes().rposition(|b| b == b':') {
            Some(colon) => self.address.get(..colon)?,
            None => self.address.as_str(),
        };
        host.trim_matches(['[', ']']).parse().ok()
    }

    /// The peer's entry for `tool` of `capability`, when its server has that tool.
    pub(crate) fn tool(&self, capability: &str, tool: &str) -> Option<&ToolFacts> {
        self.tools.get(capability)?.iter().find(|t| t.name == tool)
    }

    pub(crate) fn from_static(peer: &StaticPeer) -> Self {
        Self {
            name: peer.name.to_string(),
            address: peer.address.to_string(),
            zone: peer.zone.clone(),
            region: peer.region.clone(),
            capabilities: peer.capabilities.iter().map(ToString::to_string).collect(),
            source: "static",
            target: None,
            timeout: None,
            max_concurrency: None,
            identity: peer.identity.clone(),
            tools: BTreeMap::new(),
            tls: None,
        }
    }

    pub(crate) fn from_member(member: &Member) -> Self {
        let p = &member.profile;
        Self {
            name: member.name.clone(),
            address: p.inbound.clone(),
            zone: p.zone.clone(),
            region: p.region.clone(),
            capabilities: p.capabilities.iter().map(|c| c.name.clone()).collect(),
            source: "gossip",
            target: None,
            timeout: None,
            max_concurrency: None,
            identity: p.identity.clone(),
            tools: p
                .capabilities
                .iter()
                .filter(|c| !c.tools.is_empty())
                .map(|c| (c.name.clone(), c.tools.clone()))
                .collect(),
            tls: None,
        }
    }

    /// One peer per endpoint of an external target, named `<target>-<n>`; an `https://` one
    /// with its TLS.
    pub(crate) fn from_target(target: &ExternalTarget) -> Vec<Self> {
        target
            .endpoints
            .iter()
            .enumerate()
            .map(|(i, endpoint)| Self {
                name: format!("{}-{}", target.name, i + 1),
                address: endpoint.address().to_string(),
                zone: String::new(),
                region: String::new(),
                capabilities: vec![target.capability.to_string()],
                source: "external",
                target: Some(target.name.to_string()),
                timeout: target.timeout.map(|t| t.get()),
                max_concurrency: target.max_concurrency,
                identity: None,
                tools: BTreeMap::new(),
                tls: endpoint.is_tls().then(|| target_tls(target, endpoint)),
            })
            .collect()
    }

    pub(crate) fn is_external(&self) -> bool {
        self.source == "external"
    }

    /// The identity a call to this peer proves under `mode`: the one its certificate must carry
    /// to complete the handshake. `None` when nothing is proven (plaintext, or any SVID of the
    /// trust domain).
    pub(crate) fn verified_identity(&self, mode: MtlsMode) -> Option<&SpiffeId> {
        match self.dial_identity(mode) {
            Some(Expected::Exactly(_)) => self.identity.as_ref(),
            _ => None,
        }
    }

    /// Whether the policy of `snapshot` lets this peer serve `capability`: an external target
    /// is the policy's own word; a peer sidecar must prove an identity `served_by` lists.
    pub(crate) fn may_serve(&self, snapshot: &Snapshot, capability: &str) -> bool {
        self.is_external()
            || snapshot
                .policy
                .authorization
                .may_serve(capability, self.verified_identity(snapshot.mtls_mode()))
    }

    /// Who a call to this peer must reach, over mutual TLS, under `mode`; `None`: plaintext. A
    /// plain service (an external target's `http://` endpoint) is [`Expected::Plain`]: plaintext
    /// and HTTP/1.1 whatever the peer protocol; a peer sidecar that
    /// announces no identity is called in plaintext only outside `strict` — in `strict` over TLS
    /// all the same, to any SVID of the trust domain.
    pub(crate) fn dial_identity(&self, mode: MtlsMode) -> Option<Expected> {
        if let Some(tls) = &self.tls {
            return Some(Expected::Server(tls.clone()));
        }
        if self.is_external() {
            return Some(Expected::Plain);
        }
        match (mode, &self.identity) {
            (MtlsMode::Disabled, _) => None,
            (_, Some(identity)) => Some(Expected::Exactly(identity.clone())),
            (MtlsMode::Permissive, None) => None,
            (MtlsMode::Strict, None) => Some(Expected::TrustDomain),
        }
    }
}

/// A member's claim to serve a capability that the policy's `served_by` refuses.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Hash)]
pub struct RefusedClaim {
    pub capability: String,
    pub peer: String,
    /// The identity the peer proves (none: plaintext, or no identity announced).
    pub identity: Option<String>,
}

/// The TLS of an external target's `https://` endpoint: set up when the config was checked, so
/// a failure here is a bundle removed since; its handshakes fail then, saying why.
fn target_tls(
    target: &ExternalTarget,
    endpoint: &crate::config::TargetEndpoint,
) -> Arc<crate::transport::TargetTls> {
    let port = endpoint
        .address()
        .as_str()
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(443);
    Arc::new(crate::transport::TargetTls::or_failing(
        endpoint.host(),
        port,
        target.ca_file.as_deref(),
    ))
}

/// The peers config declares (the bootstrap's static list and the policy's external targets),
/// and capability name → those serving it: built once per config generation, not per request.
#[derive(Debug, Default)]
struct Configured {
    /// The snapshot generation these were built from (0: none yet).
    generation: u64,
    peers: Vec<Arc<Peer>>,
    index: FastMap<String, Vec<Arc<Peer>>>,
}

impl Configured {
    fn of(snapshot: &Snapshot) -> Self {
        let peers: Vec<Arc<Peer>> = snapshot
            .bootstrap
            .peers
            .iter()
            .map(|p| Arc::new(Peer::from_static(p)))
            .chain(
                snapshot
                    .policy
                    .targets
                    .iter()
                    .flat_map(Peer::from_target)
                    .map(Arc::new),
            )
            .collect();
        let mut index: FastMap<String, Vec<Arc<Peer>>> = FastMap::default();
        for peer in &peers {
            for cap in &peer.capabilities {
                index.entry(cap.clone()).or_default().push(peer.clone());
            }
        }
        Self {
            generation: snapshot.generation,
            peers,
            index,
        }
    }

    /// The configured peers serving `capability`, as one slice (sampling indexes into it).
    fn serving(&self, capability: &str) -> &[Arc<Peer>] {
        self.index.get(capability).map_or(&[], Vec::as_slice)
    }
}

/// The members gossip currently counts routable, indexed by capability.
#[derive(Debug, Default)]
struct Directory {
    peers: Vec<Arc<Peer>>,
    by_name: FastMap<String, Arc<Peer>>,
    index: FastMap<String, Vec<Arc<Peer>>>,
    /// The capabilities some member announces MCP tools for: a call for any other capability
    /// is never read as MCP.
    mcp: HashSet<String>,
}

/// The peer directory consulted once per outbound request. One registry serves one
/// `ConfigStore`: its snapshots' generations tell the configured peers apart.
#[derive(Debug, Default)]
pub struct Registry {
    gossip: ArcSwap<Directory>,
    /// Some member announces MCP tools: until one does, `is_mcp` is one relaxed load.
    any_mcp: std::sync::atomic::AtomicBool,
    /// The configured peers of the newest config generation seen.
    configured: ArcSwap<Configured>,
    /// The refused claims as of the last membership change: a claim is counted once when it
    /// appears, not on every change.
    refused: std::sync::Mutex<HashSet<RefusedClaim>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the gossip members (called on every membership or profile change).
    pub(crate) fn set_gossip(&self, peers: Vec<Peer>) {
        let peers: Vec<Arc<Peer>> = peers.into_iter().map(Arc::new).collect();
        let mut index: FastMap<String, Vec<Arc<Peer>>> = FastMap::default();
        for peer in &peers {
            for cap in &peer.capabilities {
                index.entry(cap.clone()).or_default().push(peer.clone());
            }
        }
        let by_name = peers.iter().map(|p| (p.name.clone(), p.clone())).collect();
        let mcp: HashSet<String> = peers.iter().flat_map(|p| p.tools.keys().cloned()).collect();
        self.any_mcp
            .store(!mcp.is_empty(), std::sync::atomic::Ordering::Relaxed);
        self.gossip.store(Arc::new(Directory {
            peers,
            by_name,
            index,
            mcp,
        }));
    }

    /// The configured peers of `snapshot`: the cached index when it is of the same generation,
    /// else built now (and kept when `snapshot` is newer than the cached one; a request still on
    /// an older snapshot right after a reload builds its own).
    fn configured(&self, snapshot: &Snapshot) -> Arc<Configured> {
        let cached = self.configured.load();
        if cached.generation == snapshot.generation {
            return Arc::clone(&cached);
        }
        let built = Arc::new(Configured::of(snapshot));
        if snapshot.generation > cached.generation {
            self.configured.rcu(|current| {
                if current.generation < built.generation {
                    Arc::clone(&built)
                } else {
                    Arc::clone(current)
                }
            });
        }
        built
    }

    /// Whether some member announces MCP tools for `capability`: with no MCP server in the
    /// fleet, one relaxed load answers (a plain call pays nothing more).
    pub(crate) fn is_mcp(&self, capability: &str) -> bool {
        self.any_mcp.load(std::sync::atomic::Ordering::Relaxed)
            && self.gossip.load().mcp.contains(capability)
    }

    /// The capabilities some member announces MCP tools for, sorted.
    pub(crate) fn mcp_capabilities(&self) -> Vec<String> {
        let mut names: Vec<String> = self.gossip.load().mcp.iter().cloned().collect();
        names.sort();
        names
    }

    /// How many members gossip has handed over (with their profiles).
    pub(crate) fn gossip_members(&self) -> usize {
        self.gossip.load().peers.len()
    }

    pub(crate) fn gossip_peer(&self, name: &str) -> Option<Arc<Peer>> {
        self.gossip.load().by_name.get(name).cloned()
    }

    /// Peers that serve `capability`, in a stable order. A gossip member shadows a configured
    /// peer of the same name: what the agent says of itself now beats what a file said.
    ///
    /// Under a `served_by` rule, only the peers it lets serve `capability`: a member's claim
    /// (its profile, A2A card or tool list) is not enough.
    pub(crate) fn candidates(&self, snapshot: &Snapshot, capability: &str) -> Vec<Arc<Peer>> {
        let gossip = self.gossip.load();
        let configured = self.configured(snapshot);
        let mut out: Vec<Arc<Peer>> = configured
            .serving(capability)
            .iter()
            .filter(|p| !gossip.by_name.contains_key(&p.name))
            .cloned()
            .collect();
        out.extend(gossip.index.get(capability).into_iter().flatten().cloned());
        if snapshot
            .policy
            .authorization
            .served_by(capability)
            .is_some()
        {
            out.retain(|p| p.may_serve(snapshot, capability));
        }
        out
    }

    /// The claims [`Self::refused_claims`] finds now that it did not find last time.
    pub(crate) fn newly_refused(&self, snapshot: &Snapshot) -> Vec<RefusedClaim> {
        let now: HashSet<RefusedClaim> = self.refused_claims(snapshot).into_iter().collect();
        let mut seen = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let new = now.difference(&seen).cloned().collect();
        *seen = now;
        new
    }

    /// The peers that claim `capability` but that the policy's `served_by` does not let serve
    /// it, with the identity each proves (none: plaintext or unnamed).
    pub(crate) fn refused_claims(&self, snapshot: &Snapshot) -> Vec<RefusedClaim> {
        let gossip = self.gossip.load();
        let configured = self.configured(snapshot);
        let mode = snapshot.mtls_mode();
        let mut out = Vec::new();
        for (capability, rule) in &snapshot.policy.authorization.capabilities {
            if rule.served_by.is_none() {
                continue;
            }
            let claimants = configured
                .serving(capability)
                .iter()
                .chain(gossip.index.get(capability).into_iter().flatten());
            for peer in claimants.filter(|p| !p.may_serve(snapshot, capability)) {
                out.push(RefusedClaim {
                    capability: capability.clone(),
                    peer: peer.name.clone(),
                    identity: peer.verified_identity(mode).map(|i| i.as_str().to_owned()),
                });
            }
        }
        out
    }

    /// At most `k` candidates drawn uniformly without replacement (every candidate when there are
    /// no more than `k`), and how many there are in all. Routing among hundreds of peers scores
    /// a sample instead of everyone: the pick's cost stays flat as the fleet grows.
    pub(crate) fn sample_candidates(
        &self,
        snapshot: &Snapshot,
        capability: &str,
        k: usize,
        mut random: impl FnMut(usize) -> usize,
    ) -> (Vec<Arc<Peer>>, usize) {
        if snapshot
            .policy
            .authorization
            .served_by(capability)
            .is_some()
        {
            // Rare and small: who may serve is listed by identity, so sample the allowed ones.
            let mut allowed = self.candidates(snapshot, capability);
            let n = allowed.len();
            while allowed.len() > k {
                let i = random(allowed.len());
                allowed.swap_remove(i);
            }
            return (allowed, n);
        }
        let gossip = self.gossip.load();
        let configured = self.configured(snapshot);
        let statics = configured.serving(capability);
        let gossiped = gossip.index.get(capability).map_or(&[][..], Vec::as_slice);
        let n = statics.len() + gossiped.len();
        if n <= k {
            return (self.candidates(snapshot, capability), n);
        }
        // Floyd's algorithm: k distinct indices in O(k²), no allocation of n.
        let mut picked: Vec<usize> = Vec::with_capacity(k);
        for j in (n - k)..n {
            let t = random(j + 1);
            picked.push(if picked.contains(&t) { j } else { t });
        }
        let sample = picked
            .into_iter()
            .filter_map(|i| match statics.get(i) {
                // A static peer that a gossip member of the same name shadows is not a candidate.
                Some(p) if gossip.by_name.contains_key(&p.name) => None,
                Some(p) => Some(p.clone()),
                None => gossiped.get(i - statics.len()).cloned(),
            })
            .collect();
        (sample, n)
    }

    /// Every known peer, for `/status` and the self-view poller.
    pub(crate) fn peers(&self, snapshot: &Snapshot) -> Vec<Arc<Peer>> {
        let gossip = self.gossip.load();
        let mut out: Vec<Arc<Peer>> = self
            .configured(snapshot)
            .peers
            .iter()
            .filter(|p| !gossip.by_name.contains_key(&p.name))
            .cloned()
            .collect();
        out.extend(gossip.peers.iter().cloned());
        out
    }

    /// The peer called `name`: a gossip member first, else a configured peer.
    pub(crate) fn find(&self, snapshot: &Snapshot, name: &str) -> Option<Arc<Peer>> {
        self.gossip_peer(name).or_else(|| {
            self.configured(snapshot)
                .peers
                .iter()
                .find(|p| p.name == name)
                .cloned()
        })
    }

    /// The first known peer `matches` accepts (gossip members first), without collecting them:
    /// the inbound path asks this per call.
    pub(crate) fn find_where(
        &self,
        snapshot: &Snapshot,
        matches: impl Fn(&Peer) -> bool,
    ) -> Option<Arc<Peer>> {
        let gossip = self.gossip.load();
        if let Some(p) = gossip.peers.iter().find(|p| matches(p)) {
            return Some(p.clone());
        }
        self.configured(snapshot)
            .peers
            .iter()
            .find(|p| !gossip.by_name.contains_key(&p.name) && matches(p))
            .cloned()
    }

    /// Names of every known peer.
    pub(crate) fn names(&self, snapshot: &Snapshot) -> HashSet<String> {
        self.peers(snapshot)
            .iter()
            .map(|p| p.name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::config::{Bootstrap, Policy};

    fn snapshot(peers: &[&str], generation: u64) -> Snapshot {
        let mut b = Bootstrap::local("me", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap_or_else(|e| panic!("{e}"));
        for (i, name) in peers.iter().enumerate() {
            let addr = SocketAddr::from(([10, 0, 0, i as u8 + 1], 4143));
            b = b
                .with_peer(name, addr, &["review"])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        Snapshot::new(b, Policy::default(), generation)
    }

    fn names(peers: &[Arc<Peer>]) -> Vec<&str> {
        peers.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn configured_peers_are_those_of_the_snapshot_asked_about() {
        let registry = Registry::new();
        let old = snapshot(&["a"], 1);
        let new = snapshot(&["a", "b"], 2);
        assert_eq!(names(&registry.candidates(&old, "review")), ["a"]);
        assert_eq!(names(&registry.candidates(&new, "review")), ["a", "b"]);
        // A request still on the older snapshot sees its own peers; the newer index stays.
        assert_eq!(names(&registry.candidates(&old, "review")), ["a"]);
        assert_eq!(registry.configured.load().generation, 2);
        assert!(registry.find(&new, "b").is_some());
        assert!(registry.find(&old, "b").is_none());
        assert_eq!(names(&registry.peers(&new)), ["a", "b"]);
    }
}
