//! The inbound listener: admits peers' requests against the local agent's limits, forwards them to
//! the agent, and measures what really happened.
//!
//! The request path is one stack, built in [`Inbound::stack`] (just below) in request order;
//! each step is a tower service in a file or folder named for it: `intake` (asking `authorize`
//! and `admit::gate`), `keyed` (for a call with an `idempotency-key` only) and `admit` (asking
//! `measure`, which asks `agent` and `validate`). What passes between them is in `call`.

mod admit;
mod agent;
mod authorize;
mod call;
mod intake;
mod keyed;
mod measure;
mod stats;
mod validate;

use std::sync::Arc;
use tokio::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::ServiceBuilder;

pub(crate) use stats::{InboundStats, StatsSnapshot};

use crate::classify::Outcome;
use crate::config::{ConfigStore, Snapshot};
use crate::http::pool::Pool;
use crate::http::step::Step;
use crate::http::ReachBody;
use crate::idempotency::IdempotencyTable;
use crate::local::{Admission, Load, LocalAgent};
use crate::metrics::Metrics;
use crate::rate_limit::RateLimiters;
use crate::reach::Signal;
use crate::registry::Registry;
use crate::runtime::Shared;
use crate::transport::Accepted;

impl Inbound {
    /// The inbound request path of one connection (its client is `accepted`), in request
    /// order. The first step, `intake`, takes the request in and refuses early (`admit::gate`);
    /// a call with an `idempotency-key` then goes through `keyed`, any other straight to
    /// admission.
    pub(crate) fn stack(
        self: &Arc<Self>,
        accepted: Arc<Accepted>,
    ) -> impl Step<Request<Incoming>, Response = Response<ReachBody>> {
        intake::service(intake::Lanes {
            inbound: self.clone(),
            accepted,
            plain: self.admitted(),
            // A keyed call runs once, to completion; its retries join it or replay its answer.
            keyed: ServiceBuilder::new()
                .layer(keyed::layer(self.clone()))
                .service(self.admitted()),
        })
    }

    /// A call taken in, from admission to the agent's answer: a slot under the agent's
    /// concurrency limit, or a place in its queue, or `saturated`; then the local agent, over the
    /// agent client, within the call's timeout, a capability with an output schema having its
    /// JSON answer checked (a wrong shape refused as the agent's failure, `502 invalid_output`),
    /// and what really happened told to the agent's own view, the slot held until the answer
    /// is delivered. One step, `admit`, asking `measure`, which asks `agent` and `validate`.
    fn admitted(self: &Arc<Self>) -> impl Step<call::Call, Response = Response<ReachBody>> {
        admit::service(self.clone())
    }
}

/// What the inbound steps share: the sidecar's state, each `Arc` cloned into the steps.
#[derive(Debug)]
pub(crate) struct Inbound {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    client: Pool,
    admission: Arc<Admission>,
    local: Arc<LocalAgent>,
    registry: Arc<Registry>,
    stats: Arc<InboundStats>,
    idempotency: Arc<IdempotencyTable>,
    rate_limit: RateLimiters,
    /// Seals the delegation chain handed to the agent (`src/chain/`).
    seal: Arc<crate::chain::Seal>,
}

impl Inbound {
    /// The inbound listener over the sidecar's shared state, forwarding over `client`.
    pub(crate) fn new(shared: &Shared, client: Pool) -> Self {
        Self {
            store: shared.store.clone(),
            metrics: shared.metrics.clone(),
            client,
            admission: shared.admission.clone(),
            local: shared.local.clone(),
            registry: shared.registry.clone(),
            stats: Arc::new(InboundStats::default()),
            idempotency: shared.idempotency.clone(),
            rate_limit: RateLimiters::default(),
            seal: shared.seal.clone(),
        }
    }

    pub(crate) fn load(&self) -> Load {
        self.admission.load()
    }

    /// The idempotency table's keys and bytes (shared with the outbound side).
    pub(crate) fn idempotency(&self) -> crate::idempotency::TableUsage {
        self.idempotency.usage()
    }

    pub(crate) fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// How a call ended: the agent's view hears the signal, the counters and metrics the outcome.
    fn finish(
        &self,
        snapshot: &Snapshot,
        meta: &call::Meta,
        outcome: Outcome,
        signal: Option<Signal>,
        ended: Instant,
    ) {
        let duration = ended.saturating_duration_since(meta.arrived);
        if let Some(signal) = signal {
            self.local.observe(signal, snapshot, ended);
        }
        crate::http::layers::record_in_span(crate::http::layers::field::OUTCOME, outcome.as_str());
        self.stats.record(outcome, duration);
        let (metrics, intercepted) = (&self.metrics, meta.intercepted);
        meta.series
            .finished(metrics, intercepted, outcome.as_str(), duration);
    }
}
