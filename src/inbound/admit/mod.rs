//! Admission: a slot under the agent's concurrency limit, else a place in its bounded queue
//! (never waiting past the caller's deadline), else `503 saturated` with a `retry-after`. An
//! admitted call goes on to `measure` (asked, not a step of its own: each step a call passes
//! costs it, `docs/perf-levers.md`).

pub(super) mod gate;

use std::sync::Arc;
use std::time::Duration;

use http::Response;

use super::call::{Admitted, Call};
use super::{measure, Inbound};
use crate::classify::Outcome;
use crate::error::ReachError;
use crate::http::step::{self, Step};
use crate::http::ReachBody;
use crate::local::AdmissionLimits;

pub(super) fn service(inbound: Arc<Inbound>) -> impl Step<Call, Response = Response<ReachBody>> {
    step::service!(inbound, slot)
}

/// Admits the call (a slot, or a place in the queue) and has it measured, or refuses it.
async fn slot(inbound: Arc<Inbound>, call: Call) -> Response<ReachBody> {
    match admit(&inbound, call).await {
        Ok(admitted) => measure::measure(inbound, admitted).await,
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
        max_wait: call
            .meta
            .timeout_at(agent.queue.max_wait.get(), call.meta.arrived)
            .0,
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
                tokio::time::Instant::now(),
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
