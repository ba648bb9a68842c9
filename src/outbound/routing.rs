//! The routing every capability call ends in, whichever lane it took (a task's runner sends its
//! stored call through it too). One step that asks, in order:
//!
//! - `affinity`, around the rest: a call carrying a task or session key goes to the agent that
//!   holds it, and the answer's keys are bound;
//! - `candidates`: the peers that serve the capability, scored, in zone tiers (the plan);
//! - `attempts`: which candidate next and when (retry table, budget, backoff, deadline), each
//!   attempt sent through the `endpoint` step below;
//! - `record`: the metrics and `reach-attempts` on whatever answer comes back.
//!
//! One step rather than four: each step a call passes costs it whether it
//! acts or not (`docs/perf-levers.md`), and every call needs all four, in this order.

use std::sync::Arc;

use tower::layer::Layer;

use super::attempts::{self, retry::Attempt};
use super::call::{Call, Recorded, Try};
use super::{affinity, candidates, record, Outbound};
use crate::http::step::{self, Step};

pub(super) fn layer<S>(
    out: Arc<Outbound>,
) -> impl Layer<S, Service = impl Step<Call, Response = Recorded>> + Clone
where
    S: Step<Try, Response = Attempt>,
{
    step::layer!(out, route::<step::Next<S>>)
}

/// The call routed to a peer through `endpoint`, and its answer recorded.
async fn route<S>(out: Arc<Outbound>, endpoint: S, call: Call) -> Recorded
where
    S: Step<Try, Response = Attempt>,
{
    let started = call.started;
    let routed = affinity::affine(&out, call, |call| async {
        match candidates::plan(&out, call) {
            Ok(plan) => attempts::route(&out, endpoint, plan).await,
            Err(refused) => refused,
        }
    })
    .await;
    record::respond(&out.metrics, routed, started)
}
