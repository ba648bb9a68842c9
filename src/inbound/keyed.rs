//! Inbound requests with an `idempotency-key`: read and fingerprinted, claimed in the table, run
//! once, and answered from the original's outcome.

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tokio::time::Instant;
use tower::layer::Layer;
use tower::ServiceExt;

use super::call::{Call, CallBody};
use super::Inbound;
use crate::classify::Outcome;
use crate::error::ReachError;
use crate::http::step::{self, answer, Step};
use crate::http::upload::{self, Upload, UploadWatch, WatchedUpload};
use crate::http::{body, ReachBody};
use crate::idempotency::{self, Claim};
use crate::metrics::Direction;

pub(super) fn layer<S>(
    inbound: Arc<Inbound>,
) -> impl Layer<S, Service = impl Step<Call, Response = Response<ReachBody>>> + Clone
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    step::layer!(inbound, once::<step::Next<S>>)
}

/// A keyed call through the idempotency table; any other straight on.
async fn once<S>(inbound: Arc<Inbound>, inner: S, call: Call) -> Response<ReachBody>
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    let key = call.keyed.then(|| idempotency::key_of(&call.parts.headers));
    match key.flatten() {
        Some(key) => keyed(&inbound, inner, call, &key).await,
        None => answer(inner.oneshot(call).await),
    }
}

/// A request with an `idempotency-key`: the first runs — to completion or the caller's deadline,
/// whatever its connection does, so a retry with the same key joins it rather than running the
/// task again — and every request with that key, the first included, answers from its outcome.
/// The key is the caller's, and holds one request: the same key with another method, path or
/// body gets 422.
async fn keyed<S>(inbound: &Inbound, inner: S, mut call: Call, key: &str) -> Response<ReachBody>
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    let fingerprint = match read(inbound, &mut call).await {
        Ok(fingerprint) => fingerprint,
        Err(refused) => return refused,
    };
    let meta = &call.meta;
    let (wait, by_deadline) = meta.timeout_at(meta.own_timeout, Instant::now());
    let claim = inbound
        .idempotency
        .claim(&call.scope, meta.label(), key, fingerprint);
    let (claim, first) = match claim {
        Claim::First(ticket) => {
            let joined = ticket.subscribe();
            call.meta.own_timeout = runs_until(&call);
            // The agent is working on it: it runs to the end whatever this connection does.
            tokio::spawn(async move {
                let response = answer(inner.oneshot(call).await);
                ticket.settle(response).await;
            });
            (joined, true)
        }
        other => {
            inbound.metrics.idempotent_replay();
            (other, false)
        }
    };
    match tokio::time::timeout(wait, idempotency::answer(claim)).await {
        Ok(mut response) => {
            if first {
                response.headers_mut().remove(idempotency::REPLAYED);
            }
            response
        }
        Err(_) if by_deadline => {
            inbound.metrics.deadline_exceeded(Direction::Inbound);
            ReachError::DeadlineExceeded.into_response()
        }
        Err(_) => ReachError::Timeout {
            target: "the keyed original".to_owned(),
            after: wait,
        }
        .into_response(),
    }
}

/// Reads the body (up to the replay size) and fingerprints the request.
#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
async fn read(
    inbound: &Inbound,
    call: &mut Call,
) -> Result<idempotency::Fingerprint, Response<ReachBody>> {
    let snapshot = &call.snapshot;
    let gap = snapshot.bootstrap.limits.body_read_timeout.get();
    let max = snapshot.policy.retry.max_body_bytes;
    let CallBody::Arriving(incoming) = std::mem::replace(
        &mut call.body,
        CallBody::Ready(body::empty(), UploadWatch::complete()),
    ) else {
        return Err(ReachError::BadRequest("the body was already read".to_owned()).into_response());
    };
    let read = match upload::read(&call.parts.headers, incoming, max, gap).await {
        Ok(read) => read,
        Err(err) => {
            let m = &call.meta;
            inbound.finish(snapshot, m, Outcome::Rejected, None, Instant::now());
            return Err(err.into_response());
        }
    };
    let fingerprint = idempotency::fingerprint(&call.parts, &read);
    call.body = match read {
        Upload::Buffered(bytes) => CallBody::Ready(body::full(bytes), UploadWatch::complete()),
        Upload::Stream(incoming, _) => {
            let (body, upload) = WatchedUpload::new(incoming, gap);
            CallBody::Ready(body::boxed(body), upload)
        }
    };
    Ok(fingerprint)
}

/// How long the original may run: to the caller's deadline (its retries join it), or its own
/// timeout when the caller set none — capped, so a far-off deadline does not hold a slot for days.
fn runs_until(call: &Call) -> Duration {
    let meta = &call.meta;
    let retries = call.snapshot.policy.retry.max_retries.saturating_add(1);
    let longest = meta.own_timeout.saturating_mul(retries);
    match meta.left {
        Some(_) => meta.timeout_at(longest, Instant::now()).0,
        None => meta.own_timeout,
    }
}
