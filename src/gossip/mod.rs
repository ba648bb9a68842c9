//! Gossip: sidecars find each other and share profiles and live views without a registry.
//!
//! Membership and failure detection are SWIM (the `foca` crate); this module owns the bytes:
//! every datagram is sealed with the cluster key (`envelope`), items are versioned so nothing
//! rolls back (`table`), and the transport is UDP or an in-memory network (`transport`).
//! `docs/gossip.md` explains the protocol, its timings and its threat model.

mod address_warnings;
pub mod envelope;
mod node;
mod status;
mod table;
pub mod transport;
pub mod wire;

pub use envelope::{ClusterKey, KeyError, Rejected};
pub use node::{
    max_transmissions, spawn, GossipHandle, Membership, NodeOptions, MAX_DATAGRAM, MAX_ITEM,
};
pub use status::{GossipStatus, MemberStatus, Stats};
pub use table::Member;
pub use transport::{MemNetwork, Transport};
pub use wire::{Live, NodeId, Profile};
