//! The first-event deadline (`capabilities.<name>.first_event_timeout`, `docs/chains.md`): an
//! attempt's answer head, and for `text/event-stream` its first event, within the limit, or the
//! attempt is dropped before a byte reaches the caller. The event read early stays in the
//! answer's body ([`UpstreamBody::read_ahead`]), so whatever reads the body on its way to the
//! caller (the token count, the affinity watcher) reads it first.

use std::time::{Duration, Instant};

use http::Response;

use crate::error::ReachError;
use crate::http::pool::UpstreamBody;

/// The answer's head within `limit` and, for a stream, its first event in what is left of it.
pub(super) async fn within<F>(
    forwarded: F,
    limit: Duration,
    target: &(dyn std::fmt::Display + Sync),
) -> Result<Response<UpstreamBody>, ReachError>
where
    F: std::future::Future<Output = Result<Response<UpstreamBody>, ReachError>>,
{
    let started = Instant::now();
    let late = || ReachError::FirstEventTimeout {
        target: target.to_string(),
        after: limit,
    };
    let mut response = tokio::time::timeout(limit, forwarded)
        .await
        .map_err(|_| late())??;
    if !crate::http::headers::is_event_stream(response.headers()) {
        return Ok(response);
    }
    let left = limit.saturating_sub(started.elapsed());
    match tokio::time::timeout(left, response.body_mut().read_ahead()).await {
        Err(_) => Err(late()),
        Ok(Err(err)) => Err(ReachError::Upstream {
            target: target.to_string(),
            message: err.to_string(),
        }),
        Ok(Ok(())) => Ok(response),
    }
}
