//! One attempt on one peer: how it ended, and whether that allows another.

use http::{Response, StatusCode};
use hyper::body::Incoming;

use crate::error::ReachError;
use crate::http::headers;

/// How one attempt ended, as far as retrying cares.
pub(super) enum Attempt {
    Done(Response<Incoming>),
    /// Refused without running the task (429, or a peer sidecar's 503): safe to try elsewhere.
    Refused(Response<Incoming>, &'static str),
    Failed(ReachError),
}

impl Attempt {
    /// Why this attempt may move to another peer: it was refused, or never connected, so the
    /// request never reached an agent. Timeouts and broken responses may have run the task.
    /// Whether and how this attempt may be retried: the reason, and whether the retry must go
    /// to the same agent.
    ///
    /// | attempt | retried |
    /// |---|---|
    /// | refused (429, a sidecar's 503), connection failed | always, on another peer: nothing ran |
    /// | timed out, keyed (`idempotency-key`) | on the *same* agent, whose sidecar joins or replays the original |
    /// | timed out, 502/503/504 from the agent, idempotent method | on another peer |
    /// | anything else (other 4xx, success, a POST that may have run) | never |
    pub(super) fn retry(&self, keyed: bool, idempotent: bool) -> Option<(&'static str, bool)> {
        let timed_out = match self {
            Attempt::Failed(ReachError::Timeout { .. }) => true,
            Attempt::Done(response) => is_peer_timeout(response),
            _ => false,
        };
        match self {
            Attempt::Refused(_, why) => Some((why, false)),
            Attempt::Failed(ReachError::UpstreamConnect { .. }) => Some(("connect_failed", false)),
            _ if timed_out && keyed => Some(("timeout_keyed", true)),
            _ if timed_out && idempotent => Some(("timeout", false)),
            Attempt::Done(response)
                if idempotent && matches!(response.status().as_u16(), 502..=504) =>
            {
                Some(("server_error", false))
            }
            _ => None,
        }
    }
}

/// A 504 made by the peer's sidecar: its agent did not answer within its timeout, or within the
/// deadline we gave this attempt (which races our own timer: either way the attempt timed out).
pub(super) fn is_peer_timeout<B>(response: &Response<B>) -> bool {
    response.status() == StatusCode::GATEWAY_TIMEOUT
        && response
            .headers()
            .get(headers::REASON)
            .is_some_and(|r| r == "timeout" || r == "deadline_exceeded")
}
