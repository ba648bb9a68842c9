//! What a gossip node shows: its counters (for `/metrics`, tests and the benchmark) and its
//! membership as `/status` lists it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::envelope::Rejected;
use super::wire::NodeId;
use crate::reach::State;

/// Counters of one node, read by `/metrics`, tests and the benchmark.
#[derive(Debug, Default)]
pub struct Stats {
    pub packets_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub packets_received: AtomicU64,
    pub bytes_received: AtomicU64,
    /// This node's own items too large to publish (a profile with too many capabilities).
    pub oversized_items: AtomicU64,
    rejected: [AtomicU64; Rejected::ALL.len()],
}

impl Stats {
    fn rejected_slot(reason: Rejected) -> usize {
        Rejected::ALL.iter().position(|r| *r == reason).unwrap_or(0)
    }

    pub(super) fn reject(&self, reason: Rejected) {
        self.rejected[Self::rejected_slot(reason)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected(&self, reason: Rejected) -> u64 {
        self.rejected[Self::rejected_slot(reason)].load(Ordering::Relaxed)
    }

    pub fn rejected_total(&self) -> u64 {
        self.rejected
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .sum()
    }
}

/// Gossip as `/status` shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GossipStatus {
    pub node: Option<NodeId>,
    /// Members SWIM counts alive, profile known or not.
    pub swim_members: usize,
    pub alive: usize,
    pub suspect: usize,
    pub down: usize,
    pub members: Vec<MemberStatus>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    pub name: String,
    pub gossip: SocketAddr,
    pub epoch: u64,
    /// `alive`, `suspect`, `down`, or `unknown` (heard of, not yet seen by SWIM).
    pub liveness: &'static str,
    /// Seconds since this node last heard something new from the member.
    pub last_seen_s: f64,
    pub version: Option<String>,
    pub inbound: Option<String>,
    pub state: Option<State>,
    pub profile_seq: Option<u64>,
    pub live_seq: Option<u64>,
}
