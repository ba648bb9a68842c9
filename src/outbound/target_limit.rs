//! An external target's rate limit (`policy.targets[].rate_limit`): an attempt on one of its
//! endpoints over the limit is refused here, at once, before anything is sent.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tower::layer::{layer_fn, Layer};
use tower::{service_fn, ServiceExt};

use super::attempts::retry::Attempt;
use super::call::Try;
use super::Outbound;
use crate::error::ReachError;
use crate::http::step::Step;

pub(super) fn layer<S>(
    out: Arc<Outbound>,
) -> impl Layer<S, Service = impl Step<Try, Response = Attempt>> + Clone
where
    S: Step<Try, Response = Attempt>,
{
    layer_fn(move |inner: S| {
        let out = out.clone();
        service_fn(move |attempt: Try| {
            let (out, inner) = (out.clone(), inner.clone());
            async move {
                if let Err(err) = admit(&out, &attempt) {
                    return Ok::<_, Infallible>(Attempt::Limited(err));
                }
                inner.oneshot(attempt).await
            }
        })
    })
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
