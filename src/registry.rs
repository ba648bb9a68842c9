//! Who is out there: the peers that can serve each capability. Today they come from config —
//! the bootstrap's static peers and the policy's external targets; gossip will add members here.

use std::sync::Arc;

use serde::Serialize;

use crate::config::{ExternalTarget, Snapshot, StaticPeer};

/// A peer sidecar that can take calls for some capabilities.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Peer {
    pub name: String,
    /// The peer sidecar's inbound address (host:port).
    pub address: String,
    pub zone: String,
    pub region: String,
    pub capabilities: Vec<String>,
    /// Where this sidecar learned of the peer: `static`, or `external` (a plain service).
    pub source: &'static str,
    /// For an external target: its name (rate limits are per target), timeout and per-endpoint
    /// concurrency limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip)]
    pub timeout: Option<std::time::Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<usize>,
}

impl Peer {
    pub fn from_static(peer: &StaticPeer) -> Self {
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
        }
    }

    /// One peer per endpoint of an external target, named `<target>-<n>`.
    pub fn from_target(target: &ExternalTarget) -> Vec<Self> {
        target
            .endpoints
            .iter()
            .enumerate()
            .map(|(i, endpoint)| Self {
                name: format!("{}-{}", target.name, i + 1),
                address: endpoint.to_string(),
                zone: String::new(),
                region: String::new(),
                capabilities: vec![target.capability.to_string()],
                source: "external",
                target: Some(target.name.to_string()),
                timeout: target.timeout.map(|t| t.get()),
                max_concurrency: target.max_concurrency,
            })
            .collect()
    }

    pub fn is_external(&self) -> bool {
        self.source == "external"
    }
}

/// The peer directory consulted once per outbound request.
#[derive(Debug, Default)]
pub struct Registry;

impl Registry {
    /// Peers that serve `capability`, in a stable order.
    pub fn candidates(&self, snapshot: &Snapshot, capability: &str) -> Vec<Arc<Peer>> {
        snapshot.peers_serving(capability).cloned().collect()
    }

    /// Every known peer, for `/status`.
    pub fn peers(&self, snapshot: &Snapshot) -> Vec<Arc<Peer>> {
        snapshot.configured_peers().to_vec()
    }
}
