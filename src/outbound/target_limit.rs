//! An external target's rate limit (`policy.targets[].rate_limit`): an attempt on one of its
//! endpoints over the limit is refused at once, before anything is sent (by `endpoint`, which
//! asks here first: one step less for every other attempt).

use std::time::Duration;

use super::call::Try;
use super::Outbound;
use crate::error::ReachError;

/// Over the limit of the target `attempt`'s peer is an endpoint of, if it is one.
pub(super) fn admit(out: &Outbound, attempt: &Try) -> Result<(), ReachError> {
    let Some(name) = attempt.candidate.peer.target.as_deref() else {
        return Ok(());
    };
    let limit = attempt
        .snapshot
        .policy
        .targets
        .iter()
        .find(|t| t.name.as_str() == name)
        .and_then(|t| t.rate_limit);
    let Some(limit) = limit else { return Ok(()) };
    out.rate_limits
        .take(name, limit)
        .map_err(|retry_after: Duration| ReachError::RateLimited {
            target: name.to_owned(),
            retry_after,
        })
}
