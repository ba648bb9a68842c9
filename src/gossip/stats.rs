//! A node's counters: datagrams and bytes each way, and what was refused and why.

use std::sync::atomic::{AtomicU64, Ordering};

use super::envelope::Rejected;

/// Counters of one node, read by `/metrics`, tests and the benchmark.
#[derive(Debug, Default)]
pub struct Stats {
    pub packets_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub(crate) packets_received: AtomicU64,
    pub(crate) bytes_received: AtomicU64,
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
}
