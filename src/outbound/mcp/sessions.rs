//! The sessions the caller's sidecar holds for MCP clients (`broker.rs` says how they are
//! used): each client session's server sessions, the sidecar's own shared ones per capability,
//! and the table's bounds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::fast_hash::FastMap;
use crate::mcp::jsonrpc::STATELESS_REVISION;
use crate::outbound::call::ServerSession;

/// What the sidecar's own session ids start with: a client's session with a server behind it
/// never does (those pass on as before).
pub(super) const SESSION_PREFIX: &str = "reach-";
/// Client sessions held at most; the one idle longest makes room.
pub(super) const MAX_SESSIONS: usize = 10_000;
/// A client session unused this long is ended.
pub(super) const IDLE: Duration = Duration::from_secs(30 * 60);
/// A client's session with this sidecar (or the sidecar's shared one, per capability).
#[derive(Debug)]
pub(crate) struct Brokered {
    pub(super) revision: &'static str,
    servers: Mutex<FastMap<String, ServerSession>>,
    last_used: Mutex<Instant>,
}

impl Brokered {
    fn new(revision: &'static str) -> Self {
        Self {
            revision,
            servers: Mutex::default(),
            last_used: Mutex::new(Instant::now()),
        }
    }

    pub(super) fn servers(&self) -> std::sync::MutexGuard<'_, FastMap<String, ServerSession>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The client sessions this sidecar holds, and its own shared one per capability.
#[derive(Debug, Default)]
pub(crate) struct Broker {
    sessions: Mutex<FastMap<String, Arc<Brokered>>>,
    shared: Mutex<FastMap<String, Arc<Brokered>>>,
}

impl Broker {
    /// A new client session of `revision`: its id.
    pub(super) fn open(&self, revision: &'static str) -> String {
        let id = format!("{SESSION_PREFIX}{:032x}", rand::random::<u128>());
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        // Swept only when full: an `initialize` costs no walk of the table.
        if sessions.len() >= MAX_SESSIONS {
            let now = Instant::now();
            sessions.retain(|_, b| {
                let last = *b.last_used.lock().unwrap_or_else(|p| p.into_inner());
                now.saturating_duration_since(last) < IDLE
            });
        }
        if sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, b)| *b.last_used.lock().unwrap_or_else(|p| p.into_inner()))
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(id.clone(), Arc::new(Brokered::new(revision)));
        id
    }

    /// The session `id`, now used; one unused for [`IDLE`] is ended (gone).
    pub(super) fn get(&self, id: &str) -> Option<Arc<Brokered>> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let found = sessions.get(id).cloned()?;
        let now = Instant::now();
        let mut last = found.last_used.lock().unwrap_or_else(|p| p.into_inner());
        if now.saturating_duration_since(*last) >= IDLE {
            drop(last);
            sessions.remove(id);
            return None;
        }
        *last = now;
        drop(last);
        Some(found)
    }

    pub(super) fn remove(&self, id: &str) -> Option<Arc<Brokered>> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    pub(super) fn shared(&self, capability: &str) -> Arc<Brokered> {
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        shared
            .entry(capability.to_owned())
            .or_insert_with(|| Arc::new(Brokered::new(STATELESS_REVISION)))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A local client opening sessions without end cannot grow the table: the one unused
    /// longest makes room, and it is gone (a later call in it is answered `404`).
    #[tokio::test(start_paused = true)]
    async fn a_client_flooding_initialize_holds_at_most_the_bound() {
        let broker = Broker::default();
        let first = broker.open("2025-11-25");
        for _ in 0..MAX_SESSIONS {
            tokio::time::advance(Duration::from_millis(1)).await;
            broker.open("2025-11-25");
        }
        let held = broker.sessions.lock().map(|s| s.len()).unwrap_or_default();
        assert_eq!(held, MAX_SESSIONS);
        assert!(broker.get(&first).is_none());
    }

    #[test]
    fn a_session_is_the_sidecars_own_and_ends_once() {
        let broker = Broker::default();
        let id = broker.open("2025-11-25");
        assert!(id.starts_with(SESSION_PREFIX));
        assert!(broker.get(&id).is_some());
        assert!(broker.remove(&id).is_some());
        assert!(broker.get(&id).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_unused_for_the_idle_time_is_gone() {
        let broker = Broker::default();
        let id = broker.open("2025-11-25");
        tokio::time::advance(IDLE - Duration::from_secs(1)).await;
        assert!(broker.get(&id).is_some(), "used just in time");
        tokio::time::advance(IDLE).await;
        assert!(broker.get(&id).is_none());
    }
}
