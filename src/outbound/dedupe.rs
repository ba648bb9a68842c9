//! The local agent's own repeated call (its client timed out and resent it with the same
//! `idempotency-key`) runs once: later copies join the first or replay its answer.

use std::sync::Arc;

use http::Response;
use tower::layer::Layer;
use tower::ServiceExt;

use super::call::Call;
use super::Outbound;
use crate::error::ReachError;
use crate::http::deadline::Deadline;
use crate::http::headers::Present;
use crate::http::step::{self, answer, Step};
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
    step::layer!(out, once::<step::Next<S>>)
}

/// A keyed call through the idempotency table; any other straight on.
///
/// One function, the claim made before anything is awaited: a nested `async fn` for keyed
/// calls kept its own copy of the call and of the rest of the stack in every call's future.
async fn once<S>(out: Arc<Outbound>, inner: S, call: Call) -> Response<ReachBody>
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    let key = call.present.has(Present::IDEMPOTENCY_KEY);
    let key = key
        .then(|| idempotency::key_of(&call.parts.headers))
        .flatten();
    let claim = key.map(|key| {
        let fingerprint = idempotency::fingerprint(&call.parts, &call.upload);
        out.idempotency
            .claim(LOCAL_SCOPE, call.capability.as_str(), &key, fingerprint)
    });
    match claim {
        None => answer(inner.oneshot(call).await),
        Some(Claim::First(ticket)) => {
            let response = answer(inner.oneshot(call).await);
            if response.headers().contains_key(headers::REASON) {
                // Made by the sidecar: nothing ran, or nothing is known; free the key.
                drop(ticket);
                response
            } else {
                ticket.record(response)
            }
        }
        Some(other) => {
            out.metrics.idempotent_replay();
            let wait = call.deadline.map_or(
                call.snapshot.policy.timeouts.request.get(),
                Deadline::remaining,
            );
            drop(call);
            // Boxed: only a resent call waits here.
            match Box::pin(tokio::time::timeout(wait, idempotency::answer(other))).await {
                Ok(response) => response,
                Err(_) => ReachError::DeadlineExceeded.into_response(),
            }
        }
    }
}

/// The step against a stub that counts what runs: no sockets, paused time.
#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use http::Request;
    use http_body_util::BodyExt;

    use super::*;
    use crate::config::{Name, Policy};
    use crate::http::upload::Upload;
    use crate::http::{body, step::answer};
    use crate::outbound::for_tests;

    fn call(out: &Outbound, key: Option<&str>, body: &'static [u8]) -> Call {
        let mut builder = Request::builder().method("POST").uri("/review");
        if let Some(key) = key {
            builder = builder.header(idempotency::HEADER, key);
        }
        let (parts, ()) = builder.body(()).unwrap_or_default().into_parts();
        Call {
            capability: Name::parse("review").unwrap_or_else(|e| panic!("{e}")),
            parts: Box::new(parts),
            upload: Upload::Buffered(Bytes::from_static(body)),
            deadline: None,
            snapshot: out.store.snapshot(),
            started: Instant::now(),
            present: Present::ALL,
            carried: None,
        }
    }

    /// A stub that takes 100 ms to run a call and counts how many ran.
    fn counting(ran: Arc<AtomicUsize>) -> impl Step<Call, Response = Response<ReachBody>> {
        tower::service_fn(move |_call: Call| {
            let ran = ran.clone();
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, Infallible>(Response::new(body::full("done")))
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_resent_keyed_call_runs_once_and_a_different_body_is_refused() {
        let out = for_tests(Policy::default());
        let ran = Arc::new(AtomicUsize::new(0));
        let step = layer(out.clone()).layer(counting(ran.clone()));
        let first = tokio::spawn(step.clone().oneshot(call(&out, Some("k"), b"{}")));
        let resent = tokio::spawn(step.clone().oneshot(call(&out, Some("k"), b"{}")));
        let first = answer(first.await.unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(first.status(), 200);
        // The original's answer is kept as it is delivered; the resent call replays it.
        let delivered = first.into_body().collect().await.map(|b| b.to_bytes());
        assert_eq!(delivered.ok().as_deref(), Some(&b"done"[..]));
        let resent = answer(resent.await.unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "the resent call joined the first"
        );
        assert_eq!(resent.status(), 200);
        assert_eq!(resent.headers()[idempotency::REPLAYED], "true");
        // The same key for another request is the caller's mistake, not a replay.
        let other = answer(
            step.clone()
                .oneshot(call(&out, Some("k"), b"{\"x\":1}"))
                .await,
        );
        assert_eq!(other.status(), 422);
        // Unkeyed calls all run.
        answer(step.clone().oneshot(call(&out, None, b"{}")).await);
        answer(step.oneshot(call(&out, None, b"{}")).await);
        assert_eq!(ran.load(Ordering::SeqCst), 3);
    }
}
