//! The outbound listener: the local agent calls a capability; the sidecar scores the peers that
//! serve it, picks one, forwards the call, and moves to another peer when the first refused it.

mod attempt;
mod balance;
mod decision;
mod local_api;

mod retry;
mod sample;
mod target;
mod tiers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::request::Parts;
use http::{Request, Response};
use hyper::body::Incoming;

use crate::rate_limit::RateLimiters;
use attempt::{Attempt, Refusal};
pub use balance::pick;
#[cfg(test)]
pub(crate) use balance::tests as balance_test_support;
use retry::RetryBudgets;
pub use sample::{score_candidates, SAMPLE};
pub use target::capability_of;
use tiers::Tier;

use crate::config::{ConfigStore, RouteMode, Snapshot};
use crate::error::ReachError;
use crate::http::client::UpstreamClient;
use crate::http::deadline::{self, Deadline};
use crate::http::measured::{BodyEnd, MeasuredBody};
use crate::http::request_target::{self, Target};
use crate::http::upload::{self, Upload, UploadWatch, WatchedUpload};
use crate::http::{body, headers, ReachBody};
use crate::idempotency::{self, Claim, IdempotencyTable};
use crate::inbound::Outcome;
use crate::local::LocalAgent;
use crate::metrics::{Direction, Metrics};
use crate::peers::{PeerViews, RouteRequest};
use crate::registry::Registry;

/// The idempotency scope of the local agent's own keys (no peer is called by an empty name).
const LOCAL_SCOPE: &str = "";
/// The metric label of a capability nobody serves: typed names must not grow the series.
const UNKNOWN: &str = "unknown";

/// One call from the local agent, its body already read (or ready to stream).
struct Call {
    capability: crate::config::Name,
    parts: Parts,
    upload: Upload<Incoming>,
    snapshot: Arc<Snapshot>,
    started: Instant,
}

#[derive(Debug)]
pub struct Outbound {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    client: UpstreamClient,
    registry: Arc<Registry>,
    peers: Arc<PeerViews>,
    local: Arc<LocalAgent>,
    budgets: RetryBudgets,
    rate_limits: RateLimiters,
    idempotency: Arc<IdempotencyTable>,
}

impl Outbound {
    pub fn new(
        store: Arc<ConfigStore>,
        metrics: Arc<Metrics>,
        client: UpstreamClient,
        registry: Arc<Registry>,
        peers: Arc<PeerViews>,
        local: Arc<LocalAgent>,
        idempotency: Arc<IdempotencyTable>,
    ) -> Self {
        Self {
            store,
            metrics,
            client,
            registry,
            peers,
            local,
            budgets: RetryBudgets::default(),
            rate_limits: RateLimiters::default(),
            idempotency,
        }
    }

    pub async fn handle(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        _remote: SocketAddr,
    ) -> Response<ReachBody> {
        if local_api::is_local_api(&req) {
            return local_api::handle(&self.local, req).await;
        }
        let started = Instant::now();
        let target = request_target::of(&req);
        if let Ok(Target::ServerOptions) = target {
            return request_target::server_options();
        }
        // First: a proxy request for a foreign host (CONNECT included) is `forbidden_host`.
        let capability = match capability_of(&req) {
            Ok(c) => c,
            Err(err) => return self.refuse("-", "-", err, started),
        };
        if let Err(err) = target {
            return self.refuse("-", "-", err, started);
        }
        // Before the sidecar adds its own headers: a `Connection` header naming them must not
        // remove them on the way out.
        headers::strip_hop_by_hop(req.headers_mut());
        let snapshot = self.store.snapshot();
        let (parts, incoming) = req.into_parts();
        let max_body = snapshot.policy.retry.max_body_bytes;
        let gap = snapshot.bootstrap.limits.body_read_timeout.get();
        // A body that may need replaying on another peer is buffered, up to the policy's size;
        // a larger one streams and gets a single attempt.
        let upload = match upload::read(&parts.headers, incoming, max_body, gap).await {
            Ok(upload) => upload,
            Err(err) => return self.refuse("-", "-", err, started),
        };
        let call = Call {
            capability,
            parts,
            upload,
            snapshot,
            started,
        };
        // The agent's own repeated call (its client timed out and resent) runs once too.
        match idempotency::key_of(&call.parts.headers) {
            Some(key) => self.keyed(call, &key).await,
            None => self.route(call).await,
        }
    }

    async fn keyed(self: Arc<Self>, call: Call, key: &str) -> Response<ReachBody> {
        let fingerprint = idempotency::fingerprint(&call.parts, &call.upload);
        let claim = self
            .idempotency
            .claim(LOCAL_SCOPE, call.capability.as_str(), key, fingerprint);
        match claim {
            Claim::First(ticket) => {
                let response = self.route(call).await;
                if response.headers().contains_key(headers::REASON) {
                    // Made by the sidecar: nothing ran, or nothing is known; free the key.
                    drop(ticket);
                    response
                } else {
                    ticket.record(response)
                }
            }
            other => {
                self.metrics.idempotent_replay();
                let wait = Deadline::from_headers(&call.parts.headers)
                    .ok()
                    .flatten()
                    .map_or(
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

    async fn route(self: Arc<Self>, call: Call) -> Response<ReachBody> {
        let Call {
            capability,
            mut parts,
            upload,
            snapshot,
            started,
        } = call;
        let route = RouteRequest {
            capability: capability.to_string(),
            tags: header_list(&parts.headers, "reach-tags"),
            mode: parts
                .headers
                .get("reach-mode")
                .and_then(|v| v.to_str().ok())
                .and_then(RouteMode::parse),
        };
        let scored =
            sample::score_candidates(&self.registry, &self.peers, &snapshot, &route, |n| {
                rand::random_range(0..n)
            });
        if scored.is_empty() {
            // Not labelled by name: a caller's typos must not grow the metric series.
            self.metrics.no_candidate(UNKNOWN);
            let err = ReachError::UnknownCapability {
                capability: route.capability.clone(),
            };
            return self.refuse(UNKNOWN, "-", err, started);
        }

        let deadline = match Deadline::from_headers(&parts.headers) {
            Ok(d) => d,
            Err(err) => return self.refuse(&route.capability, "-", err, started),
        };
        // The relative form is for the calling agent; peers get the absolute deadline per attempt.
        parts.headers.remove(deadline::TIMEOUT);
        let (replay, mut stream, upload) = match upload {
            Upload::Buffered(bytes) => (Some(bytes), None, UploadWatch::complete()),
            Upload::Stream(incoming, _) => {
                let gap = snapshot.bootstrap.limits.body_read_timeout.get();
                let (body, watch) = WatchedUpload::new(incoming, gap);
                (None, Some(body), watch)
            }
        };

        let me = &snapshot.bootstrap.agent;
        let tiers: Vec<Tier> = scored
            .iter()
            .map(|s| Tier::of((&me.zone, &me.region), (&s.peer.zone, &s.peer.region)))
            .collect();
        let budget = self.budgets.get(&route.capability, &snapshot.policy.retry);
        retry::deposit(&budget);
        // An async call walks a fallback chain of its own length; a sync one gets the retries.
        let is_async = route.mode == Some(RouteMode::Async);
        let max_attempts = match (&replay, is_async) {
            (None, _) => 1,
            (Some(_), true) => snapshot.policy.retry.fallback.chain_length.clamp(2, 5) as usize,
            (Some(_), false) => snapshot.policy.retry.max_retries as usize + 1,
        };
        let keyed = parts.headers.contains_key(idempotency::HEADER);
        // A keyed call's original may run past one attempt's timeout (a retry joins it), but not
        // past the time the whole call may take.
        let keyed_deadline = keyed.then(|| {
            deadline.unwrap_or_else(|| {
                let longest = scored.iter().map(|s| s.timeout).max().unwrap_or_default();
                Deadline::after(longest.saturating_mul(max_attempts as u32))
            })
        });
        let idempotent_method = parts.method.is_idempotent();
        let mut sticky: Option<usize> = None;
        let mut tried: Vec<usize> = Vec::new();
        let mut last: Option<(Attempt, usize)> = None;
        while tried.len() < max_attempts {
            if deadline.is_some_and(|d| d.remaining().is_zero()) {
                // Retries never run past the deadline.
                let peer = last
                    .as_ref()
                    .map_or("-", |(_, chosen)| scored[*chosen].peer.name.as_str());
                let mut response = self.refuse(
                    &route.capability,
                    peer,
                    ReachError::DeadlineExceeded,
                    started,
                );
                response
                    .headers_mut()
                    .insert("reach-attempts", tried.len().into());
                return response;
            }
            // Nearest tier first: skip the other tiers' candidates while the nearest can serve.
            let mut skip = tiers::outside_nearest(
                &scored,
                &tiers,
                &tried,
                snapshot.policy.zones.tier_min_score,
            );
            skip.extend_from_slice(&tried);
            let picked = match sticky.take() {
                Some(same) => Some(same),
                None => pick(&scored, &skip, rand::random::<f64>),
            };
            let Some(chosen) = picked else {
                break;
            };
            tried.push(chosen);
            if let Err(retry_after) = self.admit_external(&snapshot, &scored[chosen].peer) {
                // Over the target's rate limit: refused here, at once; another endpoint or peer
                // may still take it.
                let target = scored[chosen].peer.target.clone().unwrap_or_default();
                last = Some((
                    Attempt::Failed(ReachError::RateLimited {
                        target,
                        retry_after,
                    }),
                    chosen,
                ));
                continue;
            }
            self.metrics.tier_pick(tiers[chosen].as_str());
            let body = match (&replay, stream.take()) {
                (Some(bytes), _) => body::full(bytes.clone()),
                (None, Some(streamed)) => body::boxed(streamed),
                (None, None) => break,
            };
            let request =
                self.upstream_request(&parts, body, &snapshot, &route.capability, tried.len());
            let attempt = self
                .attempt(request, &scored[chosen], deadline, keyed_deadline, &upload)
                .await;
            decision::log(&snapshot, &route, &scored, chosen, tried.len(), &attempt);
            // A capability the agent deduplicates itself is safe to repeat on any agent.
            let declared = scored[chosen].idempotent;
            let retry = attempt
                .retry(keyed && !declared, idempotent_method || declared)
                .filter(|_| tried.len() < max_attempts);
            let retry = retry.map(|(reason, same_peer)| {
                if same_peer {
                    sticky = Some(chosen);
                }
                reason
            });
            last = Some((attempt, chosen));
            let Some(reason) = retry else { break };
            // A shed never reached an agent: moving it adds no load to any agent, so it does
            // not spend the budget that guards agents against retry storms (429s do).
            let shed = matches!(&last, Some((Attempt::Refused(_, why), _)) if why.never_reached_an_agent());
            if !shed && !retry::withdraw(&budget) {
                // Fail fast with what we have: this is what stops a correlated retry storm.
                self.metrics.retry_budget_exhausted(&route.capability);
                break;
            }
            self.metrics.retry(&route.capability, reason);
            let policy = &snapshot.policy.retry;
            let pause = if is_async {
                // Seed 002: give the previous agent time to clean up before the next takes over.
                policy.fallback.interval.get()
            } else {
                retry::backoff(
                    tried.len() as u32,
                    policy.backoff_base.get(),
                    policy.backoff_max.get(),
                    rand::random::<f64>(),
                )
            };
            // `retry-after` is honoured as a minimum: when everyone left is cooling down after
            // refusing us, the next attempt waits for the refusal's retry-after (within the
            // deadline) instead of hammering a fleet that asked for a pause.
            let refused_after = match &last {
                Some((Attempt::Refused(response, Refusal::RateLimited), _)) => {
                    headers::retry_after(response.headers())
                }
                _ => None,
            };
            let mut rest = scored
                .iter()
                .enumerate()
                .filter(|(i, s)| s.excluded.is_none() && !tried.contains(i));
            let only_cooling_left =
                rest.clone().next().is_some() && rest.all(|(_, s)| s.cooling_down);
            let pause = match (refused_after, &last) {
                (Some(after), _) if only_cooling_left => pause.max(after),
                // A full peer answered at once and nothing ran: the next may have a free slot
                // now. No backoff; when every candidate is full, the last refusal (`503
                // saturated`, with its retry-after) is the answer.
                (_, Some((Attempt::Refused(_, Refusal::Full), _))) => Duration::ZERO,
                _ => pause,
            };
            tokio::time::sleep(deadline.map_or(pause, |d| pause.min(d.remaining()))).await;
        }

        let attempts = tried.len();
        match last {
            None => {
                self.metrics.no_candidate(&route.capability);
                let candidates =
                    serde_json::to_value(decision::snapshot_of(&scored)).unwrap_or_default();
                let err = ReachError::NoAvailableInstance {
                    capability: route.capability.clone(),
                    candidates,
                    attempts,
                };
                self.refuse(&route.capability, "-", err, started)
            }
            Some((Attempt::Failed(err), chosen)) => {
                let mut response =
                    self.refuse(&route.capability, &scored[chosen].peer.name, err, started);
                response
                    .headers_mut()
                    .insert("reach-attempts", attempts.into());
                response
            }
            Some((Attempt::Done(response) | Attempt::Refused(response, _), chosen)) => self
                .respond(
                    response,
                    &route.capability,
                    &scored[chosen].peer.name,
                    attempts,
                    started,
                ),
        }
    }

    /// The rate limit of an external target, if `peer` is one of its endpoints.
    fn admit_external(
        &self,
        snapshot: &Snapshot,
        peer: &crate::registry::Peer,
    ) -> Result<(), Duration> {
        let Some(name) = peer.target.as_deref() else {
            return Ok(());
        };
        let limit = snapshot
            .policy
            .targets
            .iter()
            .find(|t| t.name.as_str() == name)
            .and_then(|t| t.rate_limit);
        match limit {
            Some(limit) => self.rate_limits.take(name, limit),
            None => Ok(()),
        }
    }

    fn upstream_request(
        &self,
        parts: &Parts,
        body: ReachBody,
        snapshot: &Snapshot,
        capability: &str,
        attempt: usize,
    ) -> Request<ReachBody> {
        let mut request = Request::new(body);
        *request.method_mut() = parts.method.clone();
        *request.uri_mut() = parts.uri.clone();
        *request.headers_mut() = parts.headers.clone();
        let h = request.headers_mut();
        h.insert(headers::CAPABILITY, headers::value(capability));
        h.insert(
            headers::CALLER,
            headers::value(snapshot.bootstrap.agent.name.as_str()),
        );
        h.insert("reach-attempt", attempt.into());
        request
    }

    fn respond(
        &self,
        response: Response<Incoming>,
        capability: &str,
        peer: &str,
        attempts: usize,
        started: Instant,
    ) -> Response<ReachBody> {
        let outcome = Outcome::of_status(response.status());
        let (mut parts, incoming) = response.into_parts();
        parts.headers.insert("reach-attempts", attempts.into());
        let (metrics, capability, peer) =
            (self.metrics.clone(), capability.to_owned(), peer.to_owned());
        let measured = MeasuredBody::new(incoming, move |end| {
            let outcome = if end == BodyEnd::Error {
                Outcome::Failure
            } else {
                outcome
            };
            metrics.request_finished(
                Direction::Outbound,
                &capability,
                &peer,
                outcome.as_str(),
                started.elapsed(),
            );
        });
        Response::from_parts(parts, body::boxed(measured))
    }

    fn refuse(
        &self,
        capability: &str,
        peer: &str,
        err: ReachError,
        started: Instant,
    ) -> Response<ReachBody> {
        if matches!(err, ReachError::DeadlineExceeded) {
            self.metrics.deadline_exceeded(Direction::Outbound);
        }
        self.metrics.request_finished(
            Direction::Outbound,
            capability,
            peer,
            err.outcome(),
            started.elapsed(),
        );
        err.into_response()
    }
}

fn header_list(headers: &http::HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}
