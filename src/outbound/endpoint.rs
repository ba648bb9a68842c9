//! One attempt on one peer: sent over the peer client with the attempt's deadline, and what its
//! answer meant told to this caller's view of the peer.

use std::sync::Arc;
use std::time::Instant;

use super::attempts::retry::{Attempt, Refusal};
use super::call::Try;
use crate::classify::Class;
use crate::error::ReachError;
use crate::http::deadline::{self, attempt_timeout, Deadline};
use crate::http::pool::{forward, Named, Pool};
use crate::http::step::{self, Step};
use crate::peers::PeerViews;
use crate::reach::Signal;

/// The innermost outbound step.
pub(super) fn endpoint(client: Pool, peers: Arc<PeerViews>) -> impl Step<Try, Response = Attempt> {
    step::service!((client, peers), attempt)
}

/// Sends one attempt and tells the caller's view of the peer what happened.
async fn attempt((client, peers): (Pool, Arc<PeerViews>), attempt: Try) -> Attempt {
    let (client, peers) = (&client, &*peers);
    let Try {
        mut request,
        candidate,
        deadline,
        keyed_deadline,
        upload,
        snapshot,
        first_event,
    } = attempt;
    let peer = &candidate.peer;
    let (timeout, by_deadline) = attempt_timeout(candidate.timeout, deadline);
    // The callee enforces the same budget: it stops work the caller no longer waits for.
    let attempt_deadline = keyed_deadline.unwrap_or_else(|| Deadline::after(timeout));
    request
        .headers_mut()
        .insert(deadline::DEADLINE, attempt_deadline.header_value());
    // Named only if it fails: no string per attempt.
    let target =
        Named(|f: &mut std::fmt::Formatter<'_>| write!(f, "peer {} ({})", peer.name, peer.address));
    let sent = Instant::now();
    let pending = peers.begin(peer, candidate.latency_ms);
    let identity = peer.dial_identity(snapshot.mtls_mode());
    let forwarded = forward(
        client,
        request,
        &peer.address,
        identity.as_ref(),
        &target,
        timeout,
    );
    let forwarded = match first_event.filter(|limit| *limit < timeout) {
        None => forwarded.await,
        // Boxed: a capability with a first-event deadline is the rare case.
        Some(limit) => Box::pin(super::first_event::within(forwarded, limit, &target)).await,
    };
    let elapsed = sent.elapsed();
    let response = match forwarded {
        Ok(response) => response,
        Err(err) => {
            if let Some(fault) = upload.caller_fault(Class::of_error(&err) == Class::TimedOut) {
                // The agent's own upload broke or stalled: nothing against the peer.
                pending.discard();
                return Attempt::Failed(fault);
            }
            if by_deadline && matches!(err, ReachError::Timeout { .. }) {
                // The caller's budget ran out, not the peer's time: no evidence against the
                // peer, unless the wait was far past what the peer usually takes (`Pending`).
                drop(pending);
                return Attempt::Failed(ReachError::DeadlineExceeded);
            }
            match Class::of_error(&err).signal(elapsed) {
                // A peer's sidecar that refuses connections: this caller has no prober to
                // see it come back, so it is a failure like any other here.
                Some(Signal::Unreachable(t)) => pending.finish(Signal::Failure(t), &snapshot),
                Some(signal) => pending.finish(signal, &snapshot),
                None => pending.finish(Signal::Failure(elapsed), &snapshot),
            }
            return Attempt::Failed(err);
        }
    };
    let class = Class::of_response(&response);
    match class.signal(elapsed) {
        Some(signal) => pending.finish(signal, &snapshot),
        // Our registry is stale: nothing ran, and that peer earns no credit for it.
        None => pending.discard(),
    }
    match class {
        Class::Refused { .. } => Attempt::Refused(response, Refusal::RateLimited),
        // Never reached the agent: load, or news its own view carries.
        Class::Shed { why, .. } => Attempt::Refused(response, why),
        Class::Stale => Attempt::Refused(response, Refusal::UnknownCapability),
        _ => Attempt::Done(response),
    }
}
