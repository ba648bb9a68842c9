//! The outbound listener: the local agent calls a capability; the sidecar picks a peer serving it
//! and forwards the call there.

mod target;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;

pub use target::capability_of;

use crate::config::ConfigStore;
use crate::error::ReachError;
use crate::http::client::UpstreamClient;
use crate::http::forward::{forward, into_upstream};
use crate::http::measured::{BodyEnd, MeasuredBody};
use crate::http::{body, headers, ReachBody};
use crate::inbound::Outcome;
use crate::metrics::{Direction, Metrics};
use crate::registry::Registry;

#[derive(Debug)]
pub struct Outbound {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    client: UpstreamClient,
    registry: Arc<Registry>,
    next: AtomicUsize,
}

impl Outbound {
    pub fn new(
        store: Arc<ConfigStore>,
        metrics: Arc<Metrics>,
        client: UpstreamClient,
        registry: Arc<Registry>,
    ) -> Self {
        Self {
            store,
            metrics,
            client,
            registry,
            next: AtomicUsize::new(0),
        }
    }

    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        _remote: SocketAddr,
    ) -> Response<ReachBody> {
        let started = Instant::now();
        let snapshot = self.store.snapshot();
        let capability = match capability_of(&req) {
            Ok(c) => c,
            Err(err) => return self.refuse("-", err, started),
        };
        let candidates = self.registry.candidates(&snapshot, capability.as_str());
        if candidates.is_empty() {
            self.metrics.no_candidate(capability.as_str());
            let err = ReachError::UnknownCapability {
                capability: capability.to_string(),
            };
            // Not labelled by name: a caller's typos must not grow the metric series.
            return self.refuse("unknown", err, started);
        }
        // Round robin until the reachability model scores candidates.
        let peer = &candidates[self.next.fetch_add(1, Ordering::Relaxed) % candidates.len()];

        let mut req = into_upstream(req);
        let h = req.headers_mut();
        h.insert(headers::CAPABILITY, headers::value(capability.as_str()));
        h.insert(
            headers::CALLER,
            headers::value(snapshot.bootstrap.agent.name.as_str()),
        );
        let timeout = snapshot.policy.timeouts.request.get();
        let target = format!("peer {} ({})", peer.name, peer.address);
        let response = match forward(&self.client, req, &peer.address, &target, timeout).await {
            Ok(response) => response,
            Err(err) => {
                tracing::debug!(%err, capability = %capability, peer = %peer.name, "outbound call failed");
                return self.refuse_for(capability.as_str(), &peer.name, err, started);
            }
        };

        let outcome = Outcome::of_status(response.status());
        let (parts, incoming) = response.into_parts();
        let (metrics, capability, peer_name) = (
            self.metrics.clone(),
            capability.to_string(),
            peer.name.clone(),
        );
        let measured = MeasuredBody::new(incoming, move |end| {
            let outcome = if end == BodyEnd::Error {
                Outcome::Failure
            } else {
                outcome
            };
            metrics.request_finished(
                Direction::Outbound,
                &capability,
                &peer_name,
                outcome.as_str(),
                started.elapsed(),
            );
        });
        Response::from_parts(parts, body::boxed(measured))
    }

    fn refuse(&self, capability: &str, err: ReachError, started: Instant) -> Response<ReachBody> {
        self.refuse_for(capability, "-", err, started)
    }

    fn refuse_for(
        &self,
        capability: &str,
        peer: &str,
        err: ReachError,
        started: Instant,
    ) -> Response<ReachBody> {
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
