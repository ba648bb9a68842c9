//! The local agent's own repeated call (its client timed out and resent it with the same
//! `idempotency-key`) runs once: later copies join the first or replay its answer.

use std::convert::Infallible;
use std::sync::Arc;

use http::Response;
use tower::layer::{layer_fn, Layer};
use tower::{service_fn, ServiceExt};

use super::call::Call;
use super::Outbound;
use crate::error::ReachError;
use crate::http::deadline::Deadline;
use crate::http::step::{answer, Step};
use crate::http::{headers, ReachBody};
use crate::idempotency::{self, Claim};

/// The idempotency scope of the local agent's own keys (no peer is called by an empty name).
const LOCAL_SCOPE: &str = "";

pub(super) fn layer<S>(
    out: Arc<Outbound>,
) -> impl Layer<S, Service = impl Step<Call, Response = Response<ReachBody>>> + Clone
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    layer_fn(move |inner: S| {
        let out = out.clone();
        service_fn(move |call: Call| {
            let (out, inner) = (out.clone(), inner.clone());
            async move {
                Ok::<_, Infallible>(match idempotency::key_of(&call.parts.headers) {
                    Some(key) => keyed(&out, inner, call, &key).await,
                    None => answer(inner.oneshot(call).await),
                })
            }
        })
    })
}

async fn keyed<S>(out: &Outbound, inner: S, call: Call, key: &str) -> Response<ReachBody>
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    let fingerprint = idempotency::fingerprint(&call.parts, &call.upload);
    let claim = out
        .idempotency
        .claim(LOCAL_SCOPE, call.capability.as_str(), key, fingerprint);
    match claim {
        Claim::First(ticket) => {
            let response = answer(inner.oneshot(call).await);
            if response.headers().contains_key(headers::REASON) {
                // Made by the sidecar: nothing ran, or nothing is known; free the key.
                drop(ticket);
                response
            } else {
                ticket.record(response)
            }
        }
        other => {
            out.metrics.idempotent_replay();
            let wait = call.deadline.map_or(
                call.snapshot.policy.timeouts.request.get(),
                Deadline::remaining,
            );
            match tokio::time::timeout(wait, idempotency::answer(other)).await {
                Ok(response) => response,
                Err(_) => ReachError::DeadlineExceeded.into_response(),
            }
        }
    }
}
