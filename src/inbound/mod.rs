//! The inbound listener: admits peers' requests against the local agent's limits, forwards them to
//! the agent, and measures what really happened.

mod admission;
mod stats;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;

pub use admission::{Admission, AdmissionLimits, Load, Refusal, Slot};
pub use stats::{percentile, InboundStats, Outcome, StatsSnapshot};

use crate::config::{ConfigStore, Snapshot};
use crate::error::ReachError;
use crate::http::client::UpstreamClient;
use crate::http::forward::{forward, into_upstream};
use crate::http::measured::{BodyEnd, MeasuredBody};
use crate::http::{body, headers, ReachBody};
use crate::metrics::{Direction, Metrics};

/// Capability label for requests that named none, or one this agent does not declare.
const OTHER: &str = "other";

/// The inbound proxy for one local agent.
#[derive(Debug)]
pub struct Inbound {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    client: UpstreamClient,
    admission: Arc<Admission>,
    stats: Arc<InboundStats>,
}

impl Inbound {
    pub fn new(store: Arc<ConfigStore>, metrics: Arc<Metrics>, client: UpstreamClient) -> Self {
        let limit = store.snapshot().bootstrap.agent.max_concurrency.get();
        Self {
            store,
            metrics,
            client,
            admission: Admission::new(limit),
            stats: Arc::new(InboundStats::default()),
        }
    }

    pub fn load(&self) -> Load {
        self.admission.load()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        _remote: SocketAddr,
    ) -> Response<ReachBody> {
        let arrived = Instant::now();
        let snapshot = self.store.snapshot();
        let capability = match capability_of(&req, &snapshot) {
            Ok(c) => c,
            Err(err) => return err.into_response(),
        };
        let label = capability.unwrap_or(OTHER).to_owned();
        let agent = &snapshot.bootstrap.agent;

        let limits = AdmissionLimits {
            max_concurrency: agent.max_concurrency.get(),
            queue_capacity: agent.queue.capacity,
            max_wait: agent.queue.max_wait.get(),
        };
        let slot = match self.admission.acquire(limits).await {
            Ok(slot) => slot,
            Err(_) => {
                self.finish(&label, Outcome::Rejected, arrived.elapsed());
                let retry_after = limits.max_wait.max(Duration::from_secs(1));
                let err = ReachError::Saturated {
                    agent: agent.name.to_string(),
                    retry_after,
                };
                return err.into_response();
            }
        };

        let admitted = Instant::now();
        let timeout = snapshot.capability_timeout(capability);
        let req = into_upstream(req);
        let target = format!("agent {}", agent.name);
        let response =
            match forward(&self.client, req, agent.address.as_str(), &target, timeout).await {
                Ok(response) => response,
                Err(err) => {
                    let outcome = if matches!(err, ReachError::Timeout { .. }) {
                        Outcome::Timeout
                    } else {
                        Outcome::Failure
                    };
                    self.finish(&label, outcome, arrived.elapsed());
                    tracing::debug!(%err, capability = %label, "inbound request failed");
                    let mut response = err.into_response();
                    response
                        .headers_mut()
                        .insert(headers::AGENT, headers::value(agent.name.as_str()));
                    return response;
                }
            };
        self.metrics.inbound_first_byte(&label, admitted.elapsed());

        let outcome = Outcome::of_status(response.status());
        let (mut parts, incoming) = response.into_parts();
        parts
            .headers
            .insert(headers::AGENT, headers::value(agent.name.as_str()));
        // The slot is held until the body has been fully delivered: the agent is busy until then.
        let this = self.clone();
        let measured = MeasuredBody::new(incoming, move |end| {
            let outcome = if end == BodyEnd::Error {
                Outcome::Failure
            } else {
                outcome
            };
            this.finish(&label, outcome, arrived.elapsed());
            drop(slot);
        });
        Response::from_parts(parts, body::boxed(measured))
    }

    fn finish(&self, capability: &str, outcome: Outcome, duration: Duration) {
        self.stats.record(outcome, duration);
        self.metrics.request_finished(
            Direction::Inbound,
            capability,
            "local",
            outcome.as_str(),
            duration,
        );
    }
}

/// The capability a request was routed as. A name this agent does not serve is refused, so a
/// caller with a stale view moves on; a request with no name is served as plain traffic.
fn capability_of<'s>(
    req: &Request<Incoming>,
    snapshot: &'s Snapshot,
) -> Result<Option<&'s str>, ReachError> {
    let Some(value) = req.headers().get(headers::CAPABILITY) else {
        return Ok(None);
    };
    let name = value.to_str().unwrap_or_default();
    match snapshot.bootstrap.agent.capability(name) {
        Some(cap) => Ok(Some(cap.name.as_str())),
        None => Err(ReachError::UnknownCapability {
            capability: name.to_owned(),
        }),
    }
}
