//! The keys themselves: who holds which (a ticket is the right to run under one), what each stored
//! response costs, and eviction within a byte budget with a per-caller share (one caller's flood
//! must not evict everyone's keys).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::stored::Stored;
use super::{Claim, Fingerprint, Outcome};

/// A key is scoped by who sent it and for what: another caller's `order-42` is another key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub(super) caller: Arc<str>,
    pub(super) capability: String,
    pub(super) key: String,
}

impl Key {
    /// What the entry costs besides a stored response: the key's text and the bookkeeping.
    fn overhead(&self) -> usize {
        self.caller.len() + self.capability.len() + self.key.len() + 160
    }
}

/// A key as one ticket holds it: the entry it created, not a later one under the same key (after
/// an eviction or expiry, a newer request may hold the key; the old ticket must not settle it).
#[derive(Clone, Debug)]
pub(super) struct Held {
    key: Key,
    at: Instant,
}

#[derive(Debug)]
pub(super) enum Slot {
    Running(watch::Sender<Outcome>),
    Done(Arc<Stored>),
    /// Ran, but its response was too large to keep: a duplicate must not run it again.
    TooLarge,
}

/// The right to run a keyed request. Dropped without an outcome (the request failed before a
/// response, or was cancelled), it frees the key: nothing is known to have run. Its response is
/// kept through `Ticket::record` and `Ticket::settle` (`record.rs`).
#[derive(Debug)]
pub(crate) struct Ticket {
    pub(super) table: Arc<IdempotencyTable>,
    pub(super) key: Option<Held>,
}

impl Ticket {
    fn new(table: Arc<IdempotencyTable>, key: Held) -> Self {
        Self {
            table,
            key: Some(key),
        }
    }

    /// Waits on this ticket's outcome, like a duplicate would.
    pub(crate) fn subscribe(&self) -> Claim {
        match &self.key {
            Some(key) => self.table.subscribe(key),
            None => Claim::Conflict,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.table.settle(&key, None);
        }
    }
}

#[derive(Debug)]
struct Entry {
    slot: Slot,
    at: Instant,
    fingerprint: Fingerprint,
    bytes: usize,
}

/// What the table holds now.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct TableUsage {
    pub(crate) keys: usize,
    pub bytes: usize,
    pub(crate) max_bytes: usize,
    /// Callers holding at least one key.
    pub(crate) callers: usize,
}

/// Sizes of the table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    pub(crate) max_keys: usize,
    pub(crate) ttl: Duration,
    /// One stored response.
    pub(crate) max_body: usize,
    /// Everything stored together.
    pub(crate) max_total_bytes: usize,
    /// The share of keys and bytes one caller may hold.
    pub(crate) per_caller_share: f64,
}

#[derive(Debug)]
pub(crate) struct IdempotencyTable {
    inner: Mutex<Inner>,
    budget: Budget,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Insertion order, for expiry and eviction; entries replaced since are skipped lazily.
    order: VecDeque<(Key, Instant)>,
    bytes: usize,
    callers: HashMap<Arc<str>, Usage>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    keys: usize,
    bytes: usize,
}

impl IdempotencyTable {
    pub(crate) fn new(budget: Budget) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::default(),
            budget: Budget {
                max_keys: budget.max_keys.max(1),
                ..budget
            },
        })
    }

    pub(super) fn max_body(&self) -> usize {
        self.budget.max_body
    }

    /// Bytes held by stored responses and keys.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// What the table holds, for `/status`.
    pub(crate) fn usage(&self) -> TableUsage {
        let inner = self.lock();
        TableUsage {
            keys: inner.entries.len(),
            bytes: inner.bytes,
            max_bytes: self.budget.max_total_bytes,
            callers: inner.callers.len(),
        }
    }

    pub(crate) fn claim(
        self: &Arc<Self>,
        caller: &str,
        capability: &str,
        key: &str,
        fingerprint: Fingerprint,
    ) -> Claim {
        let now = Instant::now();
        let key = Key {
            caller: Arc::from(caller),
            capability: capability.to_owned(),
            key: key.to_owned(),
        };
        let mut inner = self.lock();
        inner.expire(now, self.budget.ttl);
        if let Some(entry) = inner.entries.get(&key) {
            if entry.fingerprint != fingerprint {
                return Claim::Mismatch;
            }
            return match &entry.slot {
                Slot::Running(tx) => Claim::Joined(tx.subscribe()),
                Slot::Done(stored) => Claim::Replay(stored.clone()),
                Slot::TooLarge => Claim::Conflict,
            };
        }
        // Room is made from completed entries only: evicting a running one would let its retry
        // run the task a second time.
        let share = self.key_share();
        while inner.usage(&key.caller).keys >= share {
            if !inner.evict_oldest(Some(&key.caller), true) {
                return Claim::Busy;
            }
        }
        while inner.entries.len() >= self.budget.max_keys {
            if !inner.evict_oldest(None, true) {
                return Claim::Busy;
            }
        }
        let (tx, _) = watch::channel(None);
        let bytes = key.overhead();
        inner.insert(key.clone(), Slot::Running(tx), now, fingerprint, bytes);
        Claim::First(Ticket::new(self.clone(), Held { key, at: now }))
    }

    /// Settles `held` with `slot` (or frees it with `None`) and tells those waiting.
    pub(super) fn settle(&self, held: &Held, slot: Option<Slot>) {
        // What waiters learn follows from the new slot itself; no second look in the table.
        let outcome = match &slot {
            Some(Slot::Done(stored)) => Some(stored.clone()),
            _ => None,
        };
        let key = &held.key;
        let mut inner = self.lock();
        if !inner.holds(held) {
            return;
        }
        let previous = match slot {
            Some(slot) => {
                let bytes = key.overhead() + stored_bytes(&slot);
                let previous = inner.replace(key, slot, bytes);
                self.enforce(&mut inner, &key.caller);
                previous
            }
            None => inner.remove(key),
        };
        drop(inner);
        if let Some(Slot::Running(tx)) = previous {
            let _ = tx.send(outcome);
        }
    }

    /// Tells those waiting on `key` the outcome, then frees the key.
    pub(super) fn settle_passing(&self, held: &Held, stored: Arc<Stored>) {
        let mut inner = self.lock();
        let previous = if inner.holds(held) {
            inner.remove(&held.key)
        } else {
            None
        };
        drop(inner);
        if let Some(Slot::Running(tx)) = previous {
            let _ = tx.send(Some(stored));
        }
    }

    pub(super) fn subscribe(&self, held: &Held) -> Claim {
        let inner = self.lock();
        match inner.entries.get(&held.key) {
            Some(e) if e.at == held.at => match &e.slot {
                Slot::Running(tx) => Claim::Joined(tx.subscribe()),
                _ => Claim::Conflict,
            },
            _ => Claim::Conflict,
        }
    }

    /// Evicts completed entries until the caller is within its share and the table within its
    /// budget. Running entries are never evicted for bytes: they hold none yet.
    fn enforce(&self, inner: &mut Inner, caller: &Arc<str>) {
        let share = (self.budget.max_total_bytes as f64 * self.budget.per_caller_share) as usize;
        while inner.usage(caller).bytes > share {
            if !inner.evict_oldest(Some(caller), true) {
                break;
            }
        }
        while inner.bytes > self.budget.max_total_bytes {
            if !inner.evict_oldest(None, true) {
                break;
            }
        }
    }

    fn key_share(&self) -> usize {
        ((self.budget.max_keys as f64 * self.budget.per_caller_share) as usize).max(1)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn stored_bytes(slot: &Slot) -> usize {
    match slot {
        Slot::Done(stored) => stored.size(),
        _ => 0,
    }
}

impl Inner {
    /// Whether the entry `held` created is still the one under its key.
    fn holds(&self, held: &Held) -> bool {
        self.entries.get(&held.key).is_some_and(|e| e.at == held.at)
    }

    fn usage(&self, caller: &Arc<str>) -> Usage {
        self.callers.get(caller).copied().unwrap_or_default()
    }

    fn insert(
        &mut self,
        key: Key,
        slot: Slot,
        at: Instant,
        fingerprint: Fingerprint,
        bytes: usize,
    ) {
        self.account(&key.caller, 1, bytes as isize);
        self.order.push_back((key.clone(), at));
        let entry = Entry {
            slot,
            at,
            fingerprint,
            bytes,
        };
        self.entries.insert(key, entry);
        if self.order.len() > 2 * self.entries.len() + 64 {
            // Freed keys leave stale entries behind; keep the queue in proportion to the table.
            let entries = &self.entries;
            self.order
                .retain(|(k, at)| entries.get(k).is_some_and(|e| e.at == *at));
        }
    }

    fn replace(&mut self, key: &Key, slot: Slot, bytes: usize) -> Option<Slot> {
        let entry = self.entries.get_mut(key)?;
        let previous = std::mem::replace(&mut entry.slot, slot);
        let delta = bytes as isize - entry.bytes as isize;
        entry.bytes = bytes;
        self.account(&key.caller, 0, delta);
        Some(previous)
    }

    fn remove(&mut self, key: &Key) -> Option<Slot> {
        let entry = self.entries.remove(key)?;
        self.account(&key.caller, -1, -(entry.bytes as isize));
        Some(entry.slot)
    }

    fn account(&mut self, caller: &Arc<str>, keys: isize, bytes: isize) {
        self.bytes = self.bytes.saturating_add_signed(bytes);
        let usage = self.callers.entry(caller.clone()).or_default();
        usage.keys = usage.keys.saturating_add_signed(keys);
        usage.bytes = usage.bytes.saturating_add_signed(bytes);
        if usage.keys == 0 {
            self.callers.remove(caller);
        }
    }

    /// Drops completed entries older than the TTL (the order queue is by insertion time). A
    /// running one stays, moved to the back: its task may outlive the TTL, and a retry must
    /// still join it rather than run it again.
    fn expire(&mut self, now: Instant, ttl: Duration) {
        for _ in 0..self.order.len() {
            let Some((key, at)) = self.order.front().cloned() else {
                break;
            };
            if now.saturating_duration_since(at) < ttl {
                break;
            }
            self.order.pop_front();
            match self.entries.get(&key) {
                Some(e) if e.at == at && matches!(e.slot, Slot::Running(_)) => {
                    self.order.push_back((key, at));
                }
                Some(e) if e.at == at => {
                    self.remove(&key);
                }
                _ => {}
            }
        }
    }

    /// Removes the oldest entry (of `caller`, if given; only completed ones if `completed`).
    /// False when there is none to remove.
    fn evict_oldest(&mut self, caller: Option<&Arc<str>>, completed: bool) -> bool {
        let position = self.order.iter().position(|(key, at)| {
            self.entries.get(key).is_some_and(|e| {
                e.at == *at
                    && caller.is_none_or(|c| *c == key.caller)
                    && !(completed && matches!(e.slot, Slot::Running(_)))
            })
        });
        let Some((key, _)) = position.and_then(|i| self.order.remove(i)) else {
            return false;
        };
        self.remove(&key);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body;
    use http::Response;
    use http_body_util::BodyExt;

    fn budget(max_keys: usize, max_total_bytes: usize, share: f64) -> Budget {
        Budget {
            max_keys,
            ttl: Duration::from_secs(600),
            max_body: 64 * 1024,
            max_total_bytes,
            per_caller_share: share,
        }
    }

    async fn run(table: &Arc<IdempotencyTable>, caller: &str, key: &str, size: usize) {
        let Claim::First(ticket) = table.claim(caller, "c", key, [0; 32]) else {
            panic!("{caller}/{key} not first")
        };
        let response = ticket.record(Response::new(body::full(vec![b'x'; size])));
        let _ = response.into_body().collect().await;
    }

    fn stored(table: &Arc<IdempotencyTable>, caller: &str, key: &str) -> bool {
        matches!(table.claim(caller, "c", key, [0; 32]), Claim::Replay(_))
    }

    #[tokio::test]
    async fn stored_responses_stay_within_the_byte_budget() {
        let table = IdempotencyTable::new(budget(10_000, 100 * 1024, 1.0));
        for i in 0..50 {
            run(&table, "a", &format!("k{i}"), 10 * 1024).await;
            assert!(table.bytes() <= 100 * 1024, "{} bytes", table.bytes());
        }
        assert!(stored(&table, "a", "k49"), "the newest is kept");
        assert!(!stored(&table, "a", "k0"), "the oldest was evicted");
    }

    #[tokio::test]
    async fn one_caller_cannot_evict_another_callers_keys() {
        let table = IdempotencyTable::new(budget(10, 100 * 1024, 0.5));
        run(&table, "quiet", "mine", 1024).await;
        for i in 0..100 {
            run(&table, "flood", &format!("k{i}"), 10 * 1024).await;
        }
        assert!(stored(&table, "quiet", "mine"), "kept despite the flood");
    }

    #[tokio::test]
    async fn running_keys_are_never_evicted_and_a_stale_ticket_settles_nothing() {
        let table = IdempotencyTable::new(budget(2, 1 << 20, 1.0));
        let Claim::First(first) = table.claim("a", "c", "k1", [0; 32]) else {
            panic!("not first")
        };
        let _second = table.claim("a", "c", "k2", [0; 32]);
        assert!(
            matches!(table.claim("a", "c", "k3", [0; 32]), Claim::Busy),
            "both keys are running: no room, and neither is evicted"
        );
        assert!(matches!(
            table.claim("a", "c", "k1", [0; 32]),
            Claim::Joined(_)
        ));
        drop(first);
        // k1 was freed; a new request holds it now.
        let Claim::First(_newer) = table.claim("a", "c", "k1", [0; 32]) else {
            panic!("not first")
        };
        assert!(matches!(
            table.claim("a", "c", "k1", [0; 32]),
            Claim::Joined(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_key_outlives_its_ttl() {
        let table = IdempotencyTable::new(Budget {
            ttl: Duration::from_secs(60),
            ..budget(10, 1 << 20, 1.0)
        });
        let Claim::First(_running) = table.claim("a", "c", "k", [0; 32]) else {
            panic!("not first")
        };
        tokio::time::advance(Duration::from_secs(120)).await;
        assert!(matches!(
            table.claim("a", "c", "k", [0; 32]),
            Claim::Joined(_)
        ));
    }

    #[tokio::test]
    async fn keys_are_scoped_by_caller_and_a_changed_request_is_a_mismatch() {
        let table = IdempotencyTable::new(budget(10, 1 << 20, 0.5));
        run(&table, "a", "k", 10).await;
        assert!(matches!(
            table.claim("b", "c", "k", [0; 32]),
            Claim::First(_)
        ));
        assert!(matches!(
            table.claim("a", "c", "k", [1; 32]),
            Claim::Mismatch
        ));
    }
}
