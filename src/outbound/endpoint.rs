//! One attempt on one peer: sent over the peer client with the attempt's deadline, and what its
//! answer meant told to this caller's view of the peer (and, from an external target, what it
//! said of the agent's model budget).

use std::sync::Arc;
use std::time::Instant;

use super::attempts::retry::{Attempt, Refusal};
use super::call::Try;
use crate::budget::{usage, ModelBudgets};
use crate::classify::Class;
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::deadline::{self, attempt_timeout, Deadline};
use crate::http::pool::{forward, Named, Pool};
use crate::http::step::{self, Step};
use crate::metrics::Metrics;
use crate::peers::PeerViews;
use crate::reach::Signal;
use crate::registry::Peer;

/// Where an external target's answers teach the agent's model budget.
pub(super) type Budgets = (Arc<ModelBudgets>, Arc<Metrics>);

/// The innermost outbound step.
pub(super) fn endpoint(
    client: Pool,
    peers: Arc<PeerViews>,
    budgets: Budgets,
) -> impl Step<Try, Response = Attempt> {
    step::service!((client, peers, budgets), attempt)
}

/// Sends one attempt and tells the caller's view of the peer what happened.
async fn attempt(
    (client, peers, budgets): (Pool, Arc<PeerViews>, Budgets),
    attempt: Try,
) -> Attempt {
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
    let mut response = match forwarded {
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
    learn_budget(&budgets, peer, &snapshot, &mut response, sent);
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

/// An external target's answer (a model provider's, typically): its rate-limit headers teach the
/// agent's model budget, and it is marked for its tokens to be counted when its body has passed
/// (`src/outbound/record.rs`). A peer sidecar's answers are not read: nothing per call for them.
fn learn_budget<B>(
    budgets: &Budgets,
    peer: &Peer,
    snapshot: &Snapshot,
    response: &mut http::Response<B>,
    sent: Instant,
) {
    let Some(target) = peer.target.as_deref() else {
        return;
    };
    response.extensions_mut().insert(usage::Watch {
        provider: Arc::from(target),
        metrics: budgets.1.clone(),
        sent,
        // Set by the attempt's span when the call is traced (`retry::end`).
        span: None,
    });
    let group = snapshot
        .policy
        .targets
        .iter()
        .find(|t| t.name.as_str() == target)
        .and_then(|t| t.budget_group.as_ref());
    let malformed = budgets.0.observe(
        target,
        group.map(|g| g.as_str()),
        response.status(),
        response.headers(),
        tokio::time::Instant::now(),
    );
    if malformed > 0 {
        budgets.1.model_budget_malformed(target, malformed);
    }
}
