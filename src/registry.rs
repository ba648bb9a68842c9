//! Who is out there: the peers that can serve each capability. Today they come from the
//! bootstrap's static list; gossip will add members behind this same interface.

use std::sync::Arc;

use serde::Serialize;

use crate::config::{Snapshot, StaticPeer};

/// A peer sidecar that can take calls for some capabilities.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Peer {
    pub name: String,
    /// The peer sidecar's inbound address (host:port).
    pub address: String,
    pub zone: String,
    pub region: String,
    pub capabilities: Vec<String>,
    /// Where this sidecar learned of the peer.
    pub source: &'static str,
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
        }
    }
}

/// The peer directory consulted once per outbound request.
#[derive(Debug, Default)]
pub struct Registry;

impl Registry {
    /// Peers that serve `capability`, in a stable order.
    pub fn candidates(&self, snapshot: &Snapshot, capability: &str) -> Vec<Arc<Peer>> {
        snapshot.static_peers(capability).cloned().collect()
    }

    /// Every known peer, for `/status`.
    pub fn peers(&self, snapshot: &Snapshot) -> Vec<Arc<Peer>> {
        snapshot.all_static_peers().to_vec()
    }
}
