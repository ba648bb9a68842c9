//! Admission: a slot under the agent's concurrency limit, else a place in its bounded queue
//! (never waiting past the caller's deadline), else `503 saturated` with a `retry-after`.

pub(super) mod gate;

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tower::layer::Layer;
use tower::ServiceExt;

use super::call::{Admitted, Call};
use super::Inbound;
use crate::classify::Outcome;
use crate::error::ReachError;
use crate::http::deadline::attempt_timeout;
use crate::http::step::{self, answer, Step};
use crate::http::ReachBody;
use crate::local::AdmissionLimits;

pub(super) fn layer<S>(
    inbound: Arc<Inbound>,
) -> impl Layer<S, Service = impl Step<Call, Response = Response<ReachBody>>> + Clone
where
    S: Step<Admitted, Response = Response<ReachBody>>,
{
    step::layer!(inbound, slot::<step::Next<S>>)
}

/// Admits the call (a slot, or a place in the queue) or refuses it.
async fn slot<S>(inbound: Arc<Inbound>, inner: S, call: Call) -> Response<ReachBody>
where
    S: Step<Admitted, Response = Response<ReachBody>>,
{
    match admit(&inbound, call).await {
        Ok(admitted) => answer(inner.oneshot(admitted).await),
        Err(refused) => refused,
    }
}

#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
async fn admit(inbound: &Inbound, call: Call) -> Result<Admitted, Response<ReachBody>> {
    let agent = &call.snapshot.bootstrap.agent;
    let limits = AdmissionLimits {
        max_concurrency: agent.max_concurrency.get(),
        queue_capacity: agent.queue.capacity,
        // Nobody waits in the queue past the caller's deadline.
        max_wait: attempt_timeout(agent.queue.max_wait.get(), call.meta.deadline).0,
    };
    let slot = match inbound.admission.acquire(limits).await {
        Ok(slot) => slot,
        Err(_) => {
            let m = &call.meta;
            inbound.finish(
                &call.snapshot,
                m,
                Outcome::Rejected,
                None,
                m.arrived.elapsed(),
            );
            let err = ReachError::Saturated {
                agent: agent.name.to_string(),
                retry_after: limits.max_wait.max(Duration::from_secs(1)),
            };
            return Err(err.into_response());
        }
    };
    let (meta, snapshot, request, upload) = call.into_request();
    Ok(Admitted {
        meta,
        snapshot,
        request,
        upload,
        slot,
    })
}
