//! Refusals before any work: a deadline that has already passed, an agent out of rotation by its
//! own view, and the agent's rate limit.

use http::Response;

use super::super::call::Call;
use super::super::Inbound;
use crate::classify::Outcome;
use crate::error::ReachError;
use crate::http::ReachBody;
use crate::metrics::Direction;
use crate::reach::State;

/// A refusal before any work, if the call gets one (asked by `intake`, the first step).
pub(in crate::inbound) fn refuse_early(
    inbound: &Inbound,
    call: &Call,
) -> Option<Response<ReachBody>> {
    let agent = &call.snapshot.bootstrap.agent;
    let refused = |outcome| {
        let m = &call.meta;
        inbound.finish(
            &call.snapshot,
            m,
            outcome,
            None,
            tokio::time::Instant::now(),
        );
    };
    if call.meta.left.is_some_and(|left| left.is_zero()) {
        // The caller has already given up: running the task would be wasted work.
        refused(Outcome::Timeout);
        inbound.metrics.deadline_exceeded(Direction::Inbound);
        return Some(ReachError::DeadlineExceeded.into_response());
    }
    // An agent out of rotation by its own view takes no new work; the caller moves on. Not in
    // observe-only mode, where nothing is taken out of rotation (a draining agent still is).
    let barred = inbound
        .local
        .barred(&call.snapshot, call.meta.arrived)
        .filter(|state| {
            *state == State::Draining || !call.snapshot.observe_only(call.meta.label())
        });
    if let Some(state) = barred {
        refused(Outcome::Rejected);
        let err = match state {
            State::Draining => ReachError::Draining,
            _ => ReachError::Ejected {
                agent: agent.name.to_string(),
            },
        };
        return Some(err.into_response());
    }
    let limit = agent.rate_limit?;
    let retry_after = inbound.rate_limit.take("local", limit).err()?;
    refused(Outcome::Rejected);
    let target = agent.name.to_string();
    Some(
        ReachError::RateLimited {
            target,
            retry_after,
        }
        .into_response(),
    )
}
