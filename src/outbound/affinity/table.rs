//! Which agent holds which affinity key: a map bounded by entries and bytes, least recently used
//! out first, each key forgotten after the session's idle time. Pure: no I/O, time passed in.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// Where a key came from: the same kinds an `affinity_lost` names.
pub(crate) use crate::error::AffinityKey as Kind;

/// One key: the capability it was used with, its kind and its value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) capability: Arc<str>,
    pub(crate) kind: Kind,
    pub(crate) value: Box<str>,
}

/// The table's limits, read from the policy each time so a reload applies at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) max_entries: usize,
    pub(crate) max_bytes: usize,
    pub(crate) idle: Duration,
}

/// What an entry costs besides its strings: the map's and the order's slots, two `Arc`s, times.
const OVERHEAD: usize = 128;

#[derive(Debug, Default)]
pub(crate) struct Table {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Keyed by what callers and agents send: the default, DoS-resistant hasher.
    map: HashMap<Key, Entry>,
    /// Use order: the first is the least recently used (and so the first to expire).
    order: BTreeMap<u64, Key>,
    next: u64,
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    peer: Arc<str>,
    used: Instant,
    seq: u64,
    size: usize,
}

// === impl Table ===

impl Table {
    /// The agent `key` is bound to, if it was used within `idle`; a hit counts as a use.
    pub(crate) fn get(&self, key: &Key, now: Instant, idle: Duration) -> Option<Arc<str>> {
        let mut inner = self.lock();
        let expired = {
            let entry = inner.map.get(key)?;
            now.saturating_duration_since(entry.used) > idle
        };
        if expired {
            inner.remove(key);
            return None;
        }
        let seq = inner.bump();
        let entry = inner.map.get_mut(key)?;
        let old = std::mem::replace(&mut entry.seq, seq);
        entry.used = now;
        let peer = entry.peer.clone();
        if let Some(k) = inner.order.remove(&old) {
            inner.order.insert(seq, k);
        }
        Some(peer)
    }

    /// Binds `key` to `peer` (moving it when it was bound elsewhere), then evicts what the
    /// bounds no longer allow. Returns the number of entries left.
    pub(crate) fn bind(&self, key: Key, peer: &Arc<str>, now: Instant, bounds: Bounds) -> usize {
        let size = OVERHEAD + 2 * (key.capability.len() + key.value.len()) + peer.len();
        let mut inner = self.lock();
        inner.remove(&key);
        let seq = inner.bump();
        inner.order.insert(seq, key.clone());
        inner.bytes += size;
        inner.map.insert(
            key,
            Entry {
                peer: peer.clone(),
                used: now,
                seq,
                size,
            },
        );
        inner.evict(now, bounds);
        inner.map.len()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Ends `key`'s binding (its session was deleted, or its holder is gone for good); returns
    /// how many keys are left bound.
    pub(crate) fn forget(&self, key: &Key) -> usize {
        let mut inner = self.lock();
        inner.remove(key);
        inner.map.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere leaves the map consistent (every change is one step): keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn bump(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn remove(&mut self, key: &Key) {
        if let Some(entry) = self.map.remove(key) {
            self.order.remove(&entry.seq);
            self.bytes -= entry.size;
        }
    }

    /// The expired first (they are the least recently used), then the oldest over the bounds.
    fn evict(&mut self, now: Instant, bounds: Bounds) {
        while let Some((_, key)) = self.order.first_key_value() {
            let over = self.map.len() > bounds.max_entries || self.bytes > bounds.max_bytes;
            let expired = self
                .map
                .get(key)
                .is_none_or(|e| now.saturating_duration_since(e.used) > bounds.idle);
            if !over && !expired {
                break;
            }
            let key = key.clone();
            self.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &str) -> Key {
        Key {
            capability: "review".into(),
            kind: Kind::Header,
            value: value.into(),
        }
    }

    fn bounds(max_entries: usize, max_bytes: usize) -> Bounds {
        Bounds {
            max_entries,
            max_bytes,
            idle: Duration::from_secs(60),
        }
    }

    const IDLE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_key_stays_with_its_agent_and_moves_when_rebound() {
        let t = Table::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        t.bind(key("k1"), &a, Instant::now(), bounds(10, 1 << 20));
        assert_eq!(
            t.get(&key("k1"), Instant::now(), IDLE).as_deref(),
            Some("a")
        );
        assert_eq!(t.get(&key("k2"), Instant::now(), IDLE), None);
        // The same value under another kind or capability is another key.
        let mut other = key("k1");
        other.kind = Kind::Task;
        assert_eq!(t.get(&other, Instant::now(), IDLE), None);
        t.bind(key("k1"), &b, Instant::now(), bounds(10, 1 << 20));
        assert_eq!(
            t.get(&key("k1"), Instant::now(), IDLE).as_deref(),
            Some("b")
        );
        assert_eq!(t.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_least_recently_used_goes_first_past_the_entry_bound() {
        let t = Table::default();
        let a: Arc<str> = "a".into();
        let b = bounds(2, 1 << 20);
        t.bind(key("k1"), &a, Instant::now(), b);
        t.bind(key("k2"), &a, Instant::now(), b);
        // A use makes k1 the most recent: k2 is evicted by the third key.
        assert!(t.get(&key("k1"), Instant::now(), IDLE).is_some());
        assert_eq!(t.bind(key("k3"), &a, Instant::now(), b), 2);
        assert!(t.get(&key("k1"), Instant::now(), IDLE).is_some());
        assert!(t.get(&key("k2"), Instant::now(), IDLE).is_none());
        assert!(t.get(&key("k3"), Instant::now(), IDLE).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_byte_bound_counts_keys_and_values() {
        let t = Table::default();
        let a: Arc<str> = "a".into();
        let long = "x".repeat(1000);
        // Room for one and a half long keys.
        let b = bounds(1000, OVERHEAD + 2 * (6 + 1000) + 1 + 1000);
        t.bind(key(&long), &a, Instant::now(), b);
        t.bind(key(&format!("{long}2")), &a, Instant::now(), b);
        assert_eq!(t.len(), 1, "the second long key pushed the first out");
        // Short keys fit many at once.
        for i in 0..10 {
            t.bind(key(&i.to_string()), &a, Instant::now(), b);
        }
        assert!(t.len() >= 10);
        assert!(t.lock().bytes <= b.max_bytes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_unused_for_the_idle_time_is_forgotten() {
        let t = Table::default();
        let a: Arc<str> = "a".into();
        let b = bounds(10, 1 << 20);
        t.bind(key("k1"), &a, Instant::now(), b);
        t.bind(key("k2"), &a, Instant::now(), b);
        tokio::time::advance(Duration::from_secs(40)).await;
        // Used: its idle time starts again.
        assert!(t.get(&key("k1"), Instant::now(), IDLE).is_some());
        tokio::time::advance(Duration::from_secs(40)).await;
        assert!(t.get(&key("k1"), Instant::now(), IDLE).is_some());
        assert!(t.get(&key("k2"), Instant::now(), IDLE).is_none());
        // Expired entries also go when anything is bound.
        t.bind(key("k3"), &a, Instant::now(), b);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(t.bind(key("k4"), &a, Instant::now(), b), 1);
        assert_eq!(t.lock().order.len(), 1);
    }
}
