//! The sessions the caller's sidecar holds for MCP clients (`broker.rs` says how they are
//! used): each client session's server sessions, the sidecar's own shared ones per capability,
//! and the table's bounds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderValue, Response};
use tokio::time::Instant;

use crate::fast_hash::FastMap;
use crate::http::headers;
use crate::http::ReachBody;
use crate::mcp::jsonrpc::{STATELESS_REVISION, VERSION_HEADER};

/// What the sidecar's own session ids start with: a client's session with a server behind it
/// never does (those pass on as before).
pub(super) const SESSION_PREFIX: &str = "reach-";
/// Client sessions held at most; the one idle longest makes room.
pub(super) const MAX_SESSIONS: usize = 10_000;
/// A client session unused this long is ended.
pub(super) const IDLE: Duration = Duration::from_secs(30 * 60);
/// One server's session, as a client's session (or the sidecar's shared one) holds it.
#[derive(Clone, Debug)]
pub(crate) struct ServerSession {
    /// `None` for a server that keeps no sessions.
    pub(crate) id: Option<HeaderValue>,
    /// The revision the server answered `initialize` with.
    pub(crate) revision: HeaderValue,
}

/// Sets the attempt's MCP session headers, when its call goes on servers' sessions.
pub(crate) fn apply_sessions(request: &mut http::Request<ReachBody>, peer: &str) {
    if let Some(sessions) = request.extensions().get::<ServerSessions>().cloned() {
        sessions.apply(peer, request.headers_mut());
    }
}

/// The sessions a call may use, by server: the candidates step keeps only these servers, and
/// each attempt carries its server's session (`apply`).
#[derive(Clone, Debug, Default)]
pub(crate) struct ServerSessions(pub(crate) Arc<FastMap<String, ServerSession>>);

impl ServerSessions {
    /// The revision of the server that gave `response` (its `reach-agent`), when known.
    pub(crate) fn revision_of(&self, response: &Response<ReachBody>) -> Option<&str> {
        let peer = response.headers().get(headers::AGENT)?.to_str().ok()?;
        self.0.get(peer)?.revision.to_str().ok()
    }

    /// Sets the request's session and revision headers to those of the server it goes to.
    pub(crate) fn apply(&self, peer: &str, request_headers: &mut http::HeaderMap) {
        let Some(server) = self.0.get(peer) else {
            return;
        };
        match &server.id {
            Some(id) => request_headers.insert(headers::MCP_SESSION_ID, id.clone()),
            None => request_headers.remove(headers::MCP_SESSION_ID),
        };
        request_headers.insert(VERSION_HEADER, server.revision.clone());
    }
}

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
