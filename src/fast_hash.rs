//! Maps keyed by the sidecar's own strings — peer and capability names from config or from
//! authenticated gossip, metric label values — hashed with foldhash instead of SipHash: a hop
//! looks up a handful of them, and SipHash was a visible share of a hop (`docs/perf-levers.md`).
//! Maps keyed by what a caller sends (the idempotency table) keep the default, DoS-resistant
//! hasher.

/// A `HashMap` with foldhash's per-process randomly seeded hasher.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
