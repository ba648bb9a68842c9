//! An external target's rate limit (`policy.targets[].rate_limit`): an attempt on one of its
//! endpoints over the limit is refused here, at once, before anything is sent.

use std::sync::Arc;
use std::time::Duration;

use tower::layer::Layer;
use tower::ServiceExt;

use super::attempts::retry::Attempt;
use super::call::Try;
use super::Outbound;
use crate::error::ReachError;
use crate::http::step::{self, answer, Step};

pub(super) fn layer<S>(
    out: Arc<Outbound>,
) -> impl Layer<S, Service = impl Step<Try, Response = Attempt>> + Clone
where
    S: Step<Try, Response = Attempt>,
{
    step::layer!(out, limited::<step::Next<S>>)
}

/// Refuses an attempt over its target's limit, or passes it on.
async fn limited<S>(out: Arc<Outbound>, inner: S, attempt: Try) -> Attempt
where
    S: Step<Try, Response = Attempt>,
{
    if let Err(err) = admit(&out, &attempt) {
        return Attempt::Limited(err);
    }
    answer(inner.oneshot(attempt).await)
}

/// Over the limit of the target `attempt`'s peer is an endpoint of, if it is one.
fn admit(out: &Outbound, attempt: &Try) -> Result<(), ReachError> {
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
