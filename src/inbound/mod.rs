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
pub use stats::{InboundStats, Outcome, StatsSnapshot};

use crate::config::{ConfigStore, Snapshot};
use crate::error::ReachError;
use crate::http::client::UpstreamClient;
use crate::http::deadline::{attempt_timeout, Deadline};
use crate::http::forward::{forward, into_upstream};
use crate::http::measured::{BodyEnd, MeasuredBody};
use crate::http::{body, headers, ReachBody};
use crate::idempotency::{self, Claim, IdempotencyTable};
use crate::local::LocalAgent;
use crate::metrics::{Direction, Metrics};
use crate::peers::SELF_PATH;
use crate::rate_limit::RateLimiters;
use crate::reach::{Signal, State};

/// Capability label for requests that named none, or one this agent does not declare.
const OTHER: &str = "other";

/// The inbound proxy for one local agent.
#[derive(Debug)]
pub struct Inbound {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    client: UpstreamClient,
    admission: Arc<Admission>,
    local: Arc<LocalAgent>,
    stats: Arc<InboundStats>,
    idempotency: Arc<IdempotencyTable>,
    rate_limit: RateLimiters,
}

impl Inbound {
    pub fn new(
        store: Arc<ConfigStore>,
        metrics: Arc<Metrics>,
        client: UpstreamClient,
        admission: Arc<Admission>,
        local: Arc<LocalAgent>,
        idempotency: Arc<IdempotencyTable>,
    ) -> Self {
        Self {
            store,
            metrics,
            client,
            admission,
            local,
            stats: Arc::new(InboundStats::default()),
            idempotency,
            rate_limit: RateLimiters::default(),
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
        if req.uri().path() == SELF_PATH && req.method() == http::Method::GET {
            return self_view(&self.local);
        }
        let snapshot = self.store.snapshot();
        let capability = match capability_of(&req, &snapshot) {
            Ok(c) => c,
            Err(err) => return err.into_response(),
        };
        let label = capability.unwrap_or(OTHER).to_owned();
        let agent = &snapshot.bootstrap.agent;
        let deadline = match Deadline::from_headers(req.headers()) {
            Ok(d) => d,
            Err(err) => return err.into_response(),
        };
        if deadline.is_some_and(|d| d.remaining().is_zero()) {
            // The caller has already given up: running the task would be wasted work.
            self.finish(&label, Outcome::Timeout, None, arrived.elapsed());
            self.metrics.deadline_exceeded(Direction::Inbound);
            return ReachError::DeadlineExceeded.into_response();
        }
        // An agent out of rotation by its own view takes no new work; the caller moves on.
        if let Some(state) = self.local.barred() {
            self.finish(&label, Outcome::Rejected, None, arrived.elapsed());
            let err = match state {
                State::Draining => ReachError::Draining,
                _ => ReachError::Ejected {
                    agent: agent.name.to_string(),
                },
            };
            return err.into_response();
        }

        if let Some(limit) = agent.rate_limit {
            if let Err(retry_after) = self.rate_limit.take("local", limit) {
                self.finish(&label, Outcome::Rejected, None, arrived.elapsed());
                let target = agent.name.to_string();
                return ReachError::RateLimited {
                    target,
                    retry_after,
                }
                .into_response();
            }
        }
        if let Some(key) = idempotency::key_of(req.headers()) {
            let capability = capability.map(str::to_owned);
            return self
                .keyed(req, key, snapshot, label, capability, deadline, arrived)
                .await;
        }
        let own_timeout = snapshot.capability_timeout(capability);
        self.run(req, &snapshot, label, own_timeout, deadline, arrived)
            .await
    }

    /// Runs a request against the local agent: admission, forward, measurement.
    async fn run(
        self: Arc<Self>,
        req: Request<Incoming>,
        snapshot: &Snapshot,
        label: String,
        own_timeout: Duration,
        deadline: Option<Deadline>,
        arrived: Instant,
    ) -> Response<ReachBody> {
        let agent = &snapshot.bootstrap.agent;
        let limits = AdmissionLimits {
            max_concurrency: agent.max_concurrency.get(),
            queue_capacity: agent.queue.capacity,
            // Nobody waits in the queue past the caller's deadline.
            max_wait: attempt_timeout(agent.queue.max_wait.get(), deadline).0,
        };
        let slot = match self.admission.acquire(limits).await {
            Ok(slot) => slot,
            Err(_) => {
                self.finish(&label, Outcome::Rejected, None, arrived.elapsed());
                let retry_after = limits.max_wait.max(Duration::from_secs(1));
                let err = ReachError::Saturated {
                    agent: agent.name.to_string(),
                    retry_after,
                };
                return err.into_response();
            }
        };

        let admitted = Instant::now();
        let (timeout, by_deadline) = attempt_timeout(own_timeout, deadline);
        let req = into_upstream(req);
        let target = format!("agent {}", agent.name);
        let response =
            match forward(&self.client, req, agent.address.as_str(), &target, timeout).await {
                Ok(response) => response,
                Err(err) => {
                    let (outcome, signal, err) = match err {
                        // The caller's deadline, not the agent's timeout: no evidence against it.
                        ReachError::Timeout { .. } if by_deadline => {
                            self.metrics.deadline_exceeded(Direction::Inbound);
                            (Outcome::Timeout, None, ReachError::DeadlineExceeded)
                        }
                        ReachError::Timeout { .. } => (
                            Outcome::Timeout,
                            Some(Signal::Timeout(admitted.elapsed())),
                            err,
                        ),
                        _ => (
                            Outcome::Failure,
                            Some(Signal::Failure(admitted.elapsed())),
                            err,
                        ),
                    };
                    self.finish(&label, outcome, signal, arrived.elapsed());
                    tracing::debug!(%err, capability = %label, "inbound request failed");
                    let mut response = err.into_response();
                    response
                        .headers_mut()
                        .insert(headers::AGENT, headers::value(agent.name.as_str()));
                    return response;
                }
            };
        let ttfb = admitted.elapsed();
        self.metrics.inbound_first_byte(&label, ttfb);
        self.agent_reports(response.headers());

        let outcome = Outcome::of_status(response.status());
        let signal = signal_of(&response, ttfb);
        let (mut parts, incoming) = response.into_parts();
        parts
            .headers
            .insert(headers::AGENT, headers::value(agent.name.as_str()));
        // The slot is held until the body has been fully delivered: the agent is busy until then.
        let this = self.clone();
        let measured = MeasuredBody::new(incoming, move |end| {
            let (outcome, signal) = match end {
                BodyEnd::Error => (Outcome::Failure, Signal::Failure(arrived.elapsed())),
                _ => (outcome, signal),
            };
            this.finish(&label, outcome, Some(signal), arrived.elapsed());
            drop(slot);
        });
        Response::from_parts(parts, body::boxed(measured))
    }

    /// A request with an `idempotency-key`: the first runs — to completion, whatever its caller
    /// does, so a retry with the same key joins it rather than running the task again — and
    /// every request with that key, the first included, answers from its outcome.
    #[allow(clippy::too_many_arguments)]
    async fn keyed(
        self: Arc<Self>,
        req: Request<Incoming>,
        key: String,
        snapshot: Arc<Snapshot>,
        label: String,
        capability: Option<String>,
        deadline: Option<Deadline>,
        arrived: Instant,
    ) -> Response<ReachBody> {
        let own_timeout = snapshot.capability_timeout(capability.as_deref());
        let (wait, by_deadline) = attempt_timeout(own_timeout, deadline);
        let claim = self.idempotency.claim(&label, &key);
        let (claim, first) = match claim {
            Claim::First(ticket) => {
                let joined = ticket.subscribe();
                let this = self.clone();
                // The agent is working on it: wait for its answer as long as the key lives,
                // not just the capability's timeout, so nobody has to run it again.
                let run_for = snapshot.policy.idempotency.ttl.get().max(own_timeout);
                tokio::spawn(async move {
                    let response = this
                        .clone()
                        .run(req, &snapshot, label, run_for, None, arrived)
                        .await;
                    ticket.settle(response).await;
                });
                (joined, true)
            }
            other => {
                self.metrics.idempotent_replay();
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
                self.metrics.deadline_exceeded(Direction::Inbound);
                ReachError::DeadlineExceeded.into_response()
            }
            Err(_) => ReachError::Timeout {
                target: "the keyed original".to_owned(),
                after: wait,
            }
            .into_response(),
        }
    }

    /// `reach-busy` / `reach-load` on any response: the agent telling us how loaded it is.
    fn agent_reports(&self, h: &http::HeaderMap) {
        if let Some(busy) = h.get("reach-busy").and_then(|v| v.to_str().ok()) {
            self.local
                .report_busy(busy.trim().eq_ignore_ascii_case("true"), None);
        }
        if let Some(load) = h
            .get("reach-load")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            if load.is_finite() {
                self.local.report_load(load);
            }
        }
    }

    fn finish(
        &self,
        capability: &str,
        outcome: Outcome,
        signal: Option<Signal>,
        duration: Duration,
    ) {
        if let Some(signal) = signal {
            self.local.observe(signal);
        }
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

/// What a response tells the reach model: 429 and 503-with-`retry-after` are refusals (load, and
/// a cooldown), other 5xx failures, the rest successes at their time to first byte.
fn signal_of<B>(response: &Response<B>, ttfb: Duration) -> Signal {
    let status = response.status();
    let retry_after = headers::retry_after(response.headers());
    let refused = status == http::StatusCode::TOO_MANY_REQUESTS
        || (status == http::StatusCode::SERVICE_UNAVAILABLE && retry_after.is_some());
    if refused {
        Signal::Refused {
            retry_after: retry_after.unwrap_or(Duration::from_secs(1)),
        }
    } else if status.is_server_error() {
        Signal::Failure(ttfb)
    } else {
        Signal::Success(ttfb)
    }
}

fn self_view(local: &LocalAgent) -> Response<ReachBody> {
    let body = serde_json::to_string(&local.self_view()).unwrap_or_else(|_| "{}".to_owned());
    crate::http::server::text(http::StatusCode::OK, "application/json", body)
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
