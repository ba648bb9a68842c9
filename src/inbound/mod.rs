//! The inbound listener: admits peers' requests against the local agent's limits, forwards them to
//! the agent, and measures what really happened.

mod admission;
mod edge;
mod keyed;
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
use crate::http::forward::forward;
use crate::http::measured::{BodyEnd, MeasuredBody};
use crate::http::request_target::{self, Target};
use crate::http::upload::{UploadWatch, WatchedUpload};
use crate::http::{body, headers, ReachBody};
use crate::idempotency::{self, IdempotencyTable};
use crate::local::LocalAgent;
use crate::metrics::{Direction, Metrics};
use crate::peers::SELF_PATH;
use crate::rate_limit::RateLimiters;
use crate::reach::{Signal, State};
use crate::registry::Registry;

/// Capability label for requests that named none, or one this agent does not declare.
const OTHER: &str = "other";

/// What one inbound call is, as the steps after the edge need it.
#[derive(Clone, Debug)]
struct Call {
    /// The capability's metric label.
    label: String,
    /// How long the agent may take to answer (the capability's timeout).
    own_timeout: Duration,
    deadline: Option<Deadline>,
    arrived: Instant,
}

/// The inbound proxy for one local agent.
#[derive(Debug)]
pub struct Inbound {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    client: UpstreamClient,
    admission: Arc<Admission>,
    local: Arc<LocalAgent>,
    registry: Arc<Registry>,
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
        registry: Arc<Registry>,
        idempotency: Arc<IdempotencyTable>,
    ) -> Self {
        Self {
            store,
            metrics,
            client,
            admission,
            local,
            registry,
            stats: Arc::new(InboundStats::default()),
            idempotency,
            rate_limit: RateLimiters::default(),
        }
    }

    pub fn load(&self) -> Load {
        self.admission.load()
    }

    /// The idempotency table's keys and bytes (shared with the outbound side).
    pub fn idempotency(&self) -> crate::idempotency::TableUsage {
        self.idempotency.usage()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        remote: SocketAddr,
    ) -> Response<ReachBody> {
        let arrived = Instant::now();
        let path = match request_target::of(&req) {
            Ok(Target::Path(path)) => path,
            Ok(Target::ServerOptions) => return request_target::server_options(),
            Err(err) => return err.into_response(),
        };
        if path.path() == SELF_PATH && req.method() == http::Method::GET {
            return self_view(&self.local);
        }
        let snapshot = self.store.snapshot();
        let capability = match capability_of(&req, &snapshot) {
            Ok(c) => c,
            Err(err) => return err.into_response(),
        };
        if let Err(err) = edge::check_path(&snapshot, capability, path.path()) {
            return err.into_response();
        }
        let deadline = match Deadline::from_headers(req.headers()) {
            Ok(d) => d,
            Err(err) => return err.into_response(),
        };
        let call = Call {
            label: capability.unwrap_or(OTHER).to_owned(),
            own_timeout: snapshot.capability_timeout(capability),
            deadline,
            arrived,
        };
        if let Some(refused) = self.refuse_early(&snapshot, &call) {
            return refused;
        }
        let caller = edge::verified_caller(&req, remote, &self.registry, &snapshot);
        let key = idempotency::key_of(req.headers());
        let (mut parts, incoming) = req.into_parts();
        let vouched = edge::Vouched {
            capability,
            deadline,
            caller: caller.clone(),
            attempt: edge::attempt_of(&parts.headers),
        };
        edge::rewrite(&mut parts.headers, vouched);
        let gap = snapshot.bootstrap.limits.body_read_timeout.get();
        if let Some(key) = key {
            // Keys are scoped by caller: the verified name, else the connection's address.
            let scope = caller.unwrap_or_else(|| remote.ip().to_string());
            return self
                .keyed(parts, incoming, &key, &scope, snapshot, call)
                .await;
        }
        let (body, upload) = WatchedUpload::new(incoming, gap);
        let req = Request::from_parts(parts, body::boxed(body));
        self.run(req, upload, &snapshot, call).await
    }

    /// Refusals before any work: a passed deadline, an agent out of rotation, the rate limit.
    fn refuse_early(&self, snapshot: &Snapshot, call: &Call) -> Option<Response<ReachBody>> {
        let agent = &snapshot.bootstrap.agent;
        if call.deadline.is_some_and(|d| d.remaining().is_zero()) {
            // The caller has already given up: running the task would be wasted work.
            self.finish(&call.label, Outcome::Timeout, None, call.arrived.elapsed());
            self.metrics.deadline_exceeded(Direction::Inbound);
            return Some(ReachError::DeadlineExceeded.into_response());
        }
        // An agent out of rotation by its own view takes no new work; the caller moves on.
        if let Some(state) = self.local.barred() {
            self.finish(&call.label, Outcome::Rejected, None, call.arrived.elapsed());
            let err = match state {
                State::Draining => ReachError::Draining,
                _ => ReachError::Ejected {
                    agent: agent.name.to_string(),
                },
            };
            return Some(err.into_response());
        }
        let limit = agent.rate_limit?;
        let retry_after = self.rate_limit.take("local", limit).err()?;
        self.finish(&call.label, Outcome::Rejected, None, call.arrived.elapsed());
        let target = agent.name.to_string();
        Some(
            ReachError::RateLimited {
                target,
                retry_after,
            }
            .into_response(),
        )
    }

    /// Runs a request against the local agent: admission, forward, measurement.
    async fn run(
        self: Arc<Self>,
        req: Request<ReachBody>,
        upload: UploadWatch,
        snapshot: &Snapshot,
        call: Call,
    ) -> Response<ReachBody> {
        let agent = &snapshot.bootstrap.agent;
        let limits = AdmissionLimits {
            max_concurrency: agent.max_concurrency.get(),
            queue_capacity: agent.queue.capacity,
            // Nobody waits in the queue past the caller's deadline.
            max_wait: attempt_timeout(agent.queue.max_wait.get(), call.deadline).0,
        };
        let slot = match self.admission.acquire(limits).await {
            Ok(slot) => slot,
            Err(_) => {
                self.finish(&call.label, Outcome::Rejected, None, call.arrived.elapsed());
                let retry_after = limits.max_wait.max(Duration::from_secs(1));
                let err = ReachError::Saturated {
                    agent: agent.name.to_string(),
                    retry_after,
                };
                return err.into_response();
            }
        };

        let admitted = Instant::now();
        let (timeout, by_deadline) = attempt_timeout(call.own_timeout, call.deadline);
        let target = format!("agent {}", agent.name);
        let forwarded = forward(&self.client, req, agent.address.as_str(), &target, timeout).await;
        let response = match forwarded {
            Ok(response) => response,
            Err(err) => return self.failed(err, &upload, by_deadline, admitted, &call, agent),
        };
        let ttfb = admitted.elapsed();
        self.metrics.inbound_first_byte(&call.label, ttfb);
        self.agent_reports(response.headers());

        let outcome = Outcome::of_status(response.status());
        // A response to a broken or stalled upload says nothing about the agent.
        let signal = match upload.caller_fault(false) {
            Some(_) => None,
            None => Some(signal_of(&response, ttfb)),
        };
        let (mut parts, incoming) = response.into_parts();
        parts
            .headers
            .insert(headers::AGENT, headers::value(agent.name.as_str()));
        // The slot is held until the body has been fully delivered: the agent is busy until then.
        let this = self.clone();
        let measured = MeasuredBody::new(incoming, move |end| {
            let arrived = call.arrived;
            let (outcome, signal) = match end {
                BodyEnd::Error => (Outcome::Failure, Some(Signal::Failure(arrived.elapsed()))),
                _ => (outcome, signal),
            };
            this.finish(&call.label, outcome, signal, arrived.elapsed());
            drop(slot);
        });
        Response::from_parts(parts, body::boxed(measured))
    }

    /// A forward that produced no response: whose fault it was decides what the view learns.
    fn failed(
        &self,
        err: ReachError,
        upload: &UploadWatch,
        by_deadline: bool,
        admitted: Instant,
        call: &Call,
        agent: &crate::config::AgentProfile,
    ) -> Response<ReachBody> {
        let timed_out = matches!(err, ReachError::Timeout { .. });
        let (outcome, signal, err) = match upload.caller_fault(timed_out) {
            // The caller's upload broke or stalled: no evidence against the agent.
            Some(fault) => (Outcome::Rejected, None, fault),
            // The caller's deadline, not the agent's timeout: no evidence against it.
            None if timed_out && by_deadline => {
                self.metrics.deadline_exceeded(Direction::Inbound);
                (Outcome::Timeout, None, ReachError::DeadlineExceeded)
            }
            None if timed_out => (
                Outcome::Timeout,
                Some(Signal::Timeout(admitted.elapsed())),
                err,
            ),
            // Nothing listens where the agent should: it is not running. Out at once.
            None if matches!(err, ReachError::UpstreamConnect { refused: true, .. }) => (
                Outcome::Failure,
                Some(Signal::Unreachable(admitted.elapsed())),
                err,
            ),
            None => (
                Outcome::Failure,
                Some(Signal::Failure(admitted.elapsed())),
                err,
            ),
        };
        self.finish(&call.label, outcome, signal, call.arrived.elapsed());
        tracing::debug!(%err, capability = %call.label, "inbound request failed");
        let mut response = err.into_response();
        response
            .headers_mut()
            .insert(headers::AGENT, headers::value(agent.name.as_str()));
        response
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
