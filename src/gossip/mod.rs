//! Gossip: sidecars find each other and share profiles and live views without a registry.
//!
//! Membership and failure detection are SWIM (the `foca` crate); this module owns the bytes:
//! every datagram is sealed with the cluster key (`envelope`), items are gossip's own types,
//! framed and versioned so a newer sidecar can add to them (`wire`; `model` converts to and from
//! the routing model's), items only move forward so nothing rolls back (`table`), and the
//! transport is UDP or an in-memory network (`transport`).
//! `docs/gossip.md` explains the protocol, its timings and its threat model.

mod address_warnings;
mod clock;
pub mod envelope;
mod model;
mod node;
mod stats;
mod status;
mod table;
pub mod transport;
pub mod wire;

pub use clock::Clock;
pub use envelope::{ClusterKey, KeyError, Rejected};
pub use model::{Capability, Live, Pin, Profile};
pub use node::{
    longest_refresh, max_transmissions, spawn, GossipHandle, Membership, NodeOptions, MAX_ITEM,
};
pub use stats::Stats;
pub use status::{GossipStatus, MemberStatus};
pub use table::Member;
pub use transport::{Faults, MemNetwork, Transport, MAX_DATAGRAM};
pub use wire::{milli, unmilli, LiveBudget, NodeId};
