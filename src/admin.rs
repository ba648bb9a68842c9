//! The admin listener: `/metrics`, `/live`, `/ready`, `/status` and a small index page.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::Serialize;

use crate::config::{AgentProfile, ConfigStore, Policy};
use crate::error::ReachError;
use crate::http::server::text;
use crate::http::ReachBody;
use crate::inbound::{Inbound, Load, StatsSnapshot};
use crate::metrics::Metrics;
use crate::registry::{Peer, Registry};

#[derive(Debug)]
pub struct Admin {
    pub store: Arc<ConfigStore>,
    pub metrics: Arc<Metrics>,
    pub inbound: Arc<Inbound>,
    pub registry: Arc<Registry>,
    /// Listeners bound and not draining.
    pub ready: Arc<AtomicBool>,
}

/// The `/status` document.
#[derive(Debug, Serialize)]
pub struct Status {
    pub agent: AgentProfile,
    pub load: Load,
    pub inbound: StatsSnapshot,
    pub peers: Vec<Arc<Peer>>,
    pub policy: Policy,
    pub config_generation: u64,
    pub ready: bool,
    pub version: &'static str,
}

impl Admin {
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        _remote: SocketAddr,
    ) -> Response<ReachBody> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return ReachError::BadRequest("admin endpoints answer GET only".to_owned())
                .into_response();
        }
        match req.uri().path() {
            "/metrics" => {
                let load = self.inbound.load();
                self.metrics.inbound_load(load.in_flight, load.queued);
                text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    self.metrics.render(),
                )
            }
            "/live" => text(StatusCode::OK, "text/plain", "live\n"),
            "/ready" => {
                if self.ready.load(Ordering::Acquire) {
                    text(StatusCode::OK, "text/plain", "ready\n")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n")
                }
            }
            "/status" => {
                let body = serde_json::to_string_pretty(&self.status()).unwrap_or_else(|e| {
                    serde_json::json!({ "error": "internal", "message": e.to_string() }).to_string()
                });
                text(StatusCode::OK, "application/json", body)
            }
            "/" => text(StatusCode::OK, "text/plain", INDEX),
            other => ReachError::NotFound(other.to_owned()).into_response(),
        }
    }

    pub fn status(&self) -> Status {
        let snapshot = self.store.snapshot();
        Status {
            agent: snapshot.bootstrap.agent.clone(),
            load: self.inbound.load(),
            inbound: self.inbound.stats(),
            peers: self.registry.peers(&snapshot),
            policy: snapshot.policy.clone(),
            config_generation: snapshot.generation,
            ready: self.ready.load(Ordering::Acquire),
            version: env!("CARGO_PKG_VERSION"),
        }
    }
}

const INDEX: &str = "agent-reach admin\n\n/metrics  Prometheus metrics\n/live     liveness\n/ready    readiness\n/status   this agent and its peers (JSON)\n";
