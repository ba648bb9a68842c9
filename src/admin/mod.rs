//! The admin listener: `/metrics`, `/live`, `/ready`, `/status` and the status page at `/`
//! (`page`, with the sparklines' history in `history`); `cli` is `agent-reach status`, which
//! reads `/status` from outside.

pub(crate) mod app_probe;
pub(crate) mod history;
mod page;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use http::{Method, Request, Response, StatusCode};
use serde::Serialize;

use crate::config::{AgentProfile, ConfigStore, PendingRestart, Policy, ReloadError};
use crate::error::ReachError;
use crate::gossip::{GossipHandle, GossipStatus};
use crate::http::layers::Compressible;
use crate::http::server::text;
use crate::http::ReachBody;
use crate::inbound::{Inbound, StatsSnapshot};
use crate::local::{Load, LocalAgent, ProbeRecord};
use crate::metrics::Metrics;
use crate::peers::{CapabilityDemand, PeerStatus, PeerViews};
use crate::reach::{State, TransitionRecord, ViewSnapshot, TRANSITIONS_KEPT};
use crate::registry::{Peer, Registry};

#[derive(Debug)]
pub(crate) struct Admin {
    pub(crate) store: Arc<ConfigStore>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) inbound: Arc<Inbound>,
    pub(crate) outbound: Arc<crate::outbound::Outbound>,
    pub(crate) local: Arc<LocalAgent>,
    pub(crate) peers: Arc<PeerViews>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) gossip: Option<Arc<GossipHandle>>,
    /// Listeners bound and not draining.
    pub(crate) ready: Arc<AtomicBool>,
    /// Each peer's recent success rate and p95, for the status page.
    pub(crate) history: Arc<history::History>,
    /// The agent containers' probes, run for the kubelet (`app_probe.rs`): read once at start.
    pub(crate) app_probes: Arc<crate::config::AppProbes>,
    /// What `GET /drain` must be shown (the bootstrap's `drain_token`): read once at start.
    pub(crate) drain_token: Option<Arc<str>>,
}

/// The agent's tightest model budget on `/status`.
#[derive(Debug, Serialize)]
pub struct ModelBudgetStatus {
    pub headroom: f64,
    pub reset_in_s: f64,
    pub(crate) reason: String,
}

/// The `/status` document.
#[derive(Debug, Serialize)]
pub struct Status {
    pub(crate) agent: AgentProfile,
    /// This agent's own view of itself: state, cap and every estimate.
    #[serde(rename = "self")]
    pub self_view: ViewSnapshot,
    /// The own state as shown: `degraded` in place of `healthy` while golden tasks drift, then
    /// `budget-limited` while a model budget's headroom is cut (docs/model-budgets.md).
    pub self_state: &'static str,
    /// The agent's tightest model budget, when any provider has stated one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_budget: Option<ModelBudgetStatus>,
    pub last_probe: Option<ProbeRecord>,
    /// Each capability's last golden-task run: similarity per task and what differed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quality: Vec<crate::quality::QualityStatus>,
    pub load: Load,
    pub inbound: StatsSnapshot,
    /// Stored responses for `idempotency-key` replays, against their byte budget.
    pub idempotency: crate::idempotency::TableUsage,
    /// Every peer this sidecar knows, from the registry.
    pub peers: Vec<Arc<Peer>>,
    /// Members' claims to serve a capability that the policy's `served_by` refuses: never
    /// routed to (`docs/security.md`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused_claims: Vec<crate::registry::RefusedClaim>,
    /// This caller's view of each peer it has scored, with the peer's own view.
    pub peer_views: Vec<PeerStatus>,
    /// Each MCP capability's tools, with each server's tool as this caller sees it
    /// (`docs/mcp.md`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<crate::outbound::ToolStatus>,
    /// Gossip membership: every member with its liveness, last-seen age and version.
    pub gossip: Option<Arc<GossipStatus>>,
    /// The fleet's demand against its capacity per capability, as `/metrics` shows it
    /// (`reach_capability_demand_ratio`).
    pub capabilities: Vec<CapabilityDemand>,
    pub policy: Policy,
    pub config_generation: u64,
    /// The last rejected config reload, until its file parses again.
    pub(crate) reload_error: Option<ReloadError>,
    /// Restart-only keys the files changed: they keep their running values (what `policy`
    /// shows) until a restart, or until the file goes back.
    pub pending_restart: Vec<PendingRestart>,
    /// The last state transitions of this agent's own view and of this caller's views of its
    /// peers, newest first.
    pub transitions: Vec<TransitionRecord>,
    /// Observe-only mode's comparison with the model, per capability (absent when no call was
    /// ever observed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) observe: Option<std::collections::BTreeMap<String, crate::outbound::ObserveCounts>>,
    /// Calls refused for their delegation chain, and hedges (`docs/chains.md`).
    pub chains: crate::metrics::ChainCounts,
    pub ready: bool,
    pub(crate) version: &'static str,
    /// What works less than it should (a task store that is down), each in a sentence.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) degraded: Vec<String>,
    /// Set when the reader is not on this pod's loopback: what was left out, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hidden: Option<&'static str>,
}

/// What `/status` and the page leave out for a reader off the pod's loopback.
const HIDDEN: &str = "shown on the pod's loopback only (docs/security.md): the policy's allow and served_by lists, targets, callback hosts, escalation webhook, budget-group publishers, and the tools of capabilities with an allow list";

impl Status {
    /// The status as a reader may see it: secrets in URLs masked for everyone; the policy's
    /// lists and the tools of restricted capabilities only for a reader on the pod's loopback
    /// (`local`). The admin port listens on every address, so the pod network can read it.
    pub fn shown_to(mut self, local: bool) -> Self {
        let policy = &mut self.policy;
        if let Some(url) = policy.escalation.webhook.as_mut() {
            *url = crate::redact::url(url);
        }
        if local {
            return self;
        }
        let restricted: std::collections::BTreeSet<String> = policy
            .authorization
            .capabilities
            .iter()
            .filter(|(_, rule)| rule.allow.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        self.tools.retain(|t| !restricted.contains(&t.capability));
        policy.authorization.capabilities.clear();
        policy.targets.clear();
        policy.callbacks.allow_hosts.clear();
        policy.escalation.webhook = None;
        policy.model_budgets.groups.clear();
        self.hidden = Some(HIDDEN);
        self
    }
}

/// How long `/drain` waits for the calls in flight to finish.
const DRAIN_WAIT: Duration = Duration::from_secs(25);

impl Admin {
    /// The agent is stopping (its container's `preStop` hook, before the kubelet's SIGTERM
    /// reaches it): from now on no new call is admitted and the fleet hears this agent is
    /// draining; the answer comes once the calls in flight have finished (at most
    /// [`DRAIN_WAIT`]). Only with the pod's token: the admin port is reachable from the pod
    /// network, and anyone else draining an agent would take it out of rotation.
    async fn drain<B>(&self, req: &Request<B>) -> Response<ReachBody> {
        let wanted = self.drain_token.clone();
        let sent = req
            .headers()
            .get(crate::config::DRAIN_HEADER)
            .map(http::HeaderValue::as_bytes);
        let allowed = match (&wanted, sent) {
            (Some(token), Some(sent)) => {
                bool::from(subtle::ConstantTimeEq::ct_eq(token.as_bytes(), sent))
            }
            _ => false,
        };
        if !allowed {
            return text(
                StatusCode::FORBIDDEN,
                "text/plain",
                "drain needs the pod's token (the injected preStop hook has it)\n",
            );
        }
        tracing::info!("the agent is stopping: draining");
        self.local.drain();
        if let Some(g) = &self.gossip {
            g.publish_live(crate::peers::live(&self.local.self_view()));
        }
        let deadline = tokio::time::Instant::now() + DRAIN_WAIT;
        loop {
            let load = self.inbound.load();
            if load.in_flight + load.queued == 0 || tokio::time::Instant::now() >= deadline {
                return text(
                    StatusCode::OK,
                    "text/plain",
                    format!("drained ({} calls still in flight)\n", load.in_flight),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What works less than it should, each in a sentence: a task store that is down.
    fn degraded(&self) -> Vec<String> {
        let store = self
            .outbound
            .tasks()
            .and_then(|q| q.store_down().map(|d| (q.kind(), d)));
        store
            .map(|(kind, down)| {
                let since = crate::tasks::model::now_ms().saturating_sub(down.since_ms);
                format!(
                    "the task store ({kind}) has failed for {:.1} s: task submissions answer 503 task_store_unavailable until it is back: {}",
                    since as f64 / 1000.0,
                    down.error
                )
            })
            .into_iter()
            .collect()
    }
}

impl Admin {
    /// Answers one admin request; the body, if any, is not read. `local`: it came from the
    /// pod's own loopback, which is shown the policy's lists.
    pub(crate) async fn handle<B>(
        self: Arc<Self>,
        req: Request<B>,
        local: bool,
    ) -> Response<ReachBody> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return ReachError::BadRequest("admin endpoints answer GET only".to_owned())
                .into_response();
        }
        match req.uri().path() {
            "/metrics" => {
                let load = self.inbound.load();
                self.metrics.inbound_load(load.in_flight, load.queued);
                if let Some(g) = &self.gossip {
                    self.metrics.gossip(g.stats(), &g.status());
                }
                // Pauses end with time, not with an event: counted when read.
                self.metrics
                    .mcp_tools_paused(self.outbound.mcp_tools_paused());
                let snapshot = self.store.snapshot();
                self.metrics
                    .mcp_tools_held(self.outbound.mcp_tools_held(&snapshot));
                compressible(text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    self.metrics.render(),
                ))
            }
            "/live" => text(StatusCode::OK, "text/plain", "live\n"),
            "/ready" => {
                // A task store that is down degrades the sidecar, it does not stop it: calls
                // are served, submissions answer 503 until the store is back. Ready, and saying
                // what is degraded (the same in `/status`'s `degraded`).
                if !self.ready.load(Ordering::Acquire) {
                    text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n")
                } else {
                    match self.degraded().first() {
                        Some(why) => text(
                            StatusCode::OK,
                            "text/plain",
                            format!("ready, degraded: {why}\n"),
                        ),
                        None => text(StatusCode::OK, "text/plain", "ready\n"),
                    }
                }
            }
            "/status" => {
                let status = self.status().shown_to(local);
                let body = serde_json::to_string_pretty(&status).unwrap_or_else(|e| {
                    serde_json::json!({ "error": "internal", "message": e.to_string() }).to_string()
                });
                compressible(text(StatusCode::OK, "application/json", body))
            }
            "/" if wants_html(&req) => {
                let status = self.status().shown_to(local);
                let history = self.history.series(&status.peer_views);
                compressible(text(
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    page::render(&status, &history),
                ))
            }
            "/" => text(StatusCode::OK, "text/plain", INDEX),
            "/drain" => self.drain(&req).await,
            path if path.starts_with(app_probe::PREFIX) => {
                let key = &path[app_probe::PREFIX.len()..];
                match self.app_probes.get(key) {
                    Some(probe) => {
                        let (status, body) = app_probe::run(probe).await;
                        text(status, "text/plain", body)
                    }
                    None => ReachError::NotFound(path.to_owned()).into_response(),
                }
            }
            other => ReachError::NotFound(other.to_owned()).into_response(),
        }
    }

    /// Samples the peers for the status page's sparklines until `stop`.
    pub(crate) fn spawn_history(&self, stop: CancellationToken) -> JoinHandle<()> {
        history::spawn(
            self.history.clone(),
            self.peers.clone(),
            self.store.clone(),
            stop,
        )
    }

    /// The agent's tightest model budget: what it learned itself, or a group of its targets as
    /// another member learned it (callers score it by the group's figure either way).
    fn model_budget(&self, snapshot: &crate::config::Snapshot) -> Option<crate::budget::Headroom> {
        let now = tokio::time::Instant::now();
        let own = self.local.budgets().headroom(now);
        let groups = snapshot
            .policy
            .targets
            .iter()
            .filter_map(|t| t.budget_group.as_ref())
            .filter_map(|g| {
                let credential = self.local.budgets().group_credential(g.as_str())?;
                let (headroom, reset_in) =
                    self.peers.group_headroom(g.as_str(), credential, now)?;
                Some(crate::budget::Headroom {
                    headroom,
                    reset_in,
                    reason: format!(
                        "group {g}: as a member learned it, resets in {:.0}s",
                        reset_in.as_secs_f64()
                    ),
                })
            });
        own.into_iter()
            .chain(groups)
            .min_by(|a, b| a.headroom.total_cmp(&b.headroom))
    }

    pub(crate) fn status(&self) -> Status {
        let snapshot = self.store.snapshot();
        let mut transitions = self.local.transitions();
        transitions.extend(self.peers.transitions());
        transitions.sort_by(|a, b| a.age_s.total_cmp(&b.age_s));
        transitions.truncate(TRANSITIONS_KEPT);
        let self_view = self.local.refresh().0;
        let budget = self.model_budget(&snapshot);
        let limited = budget
            .as_ref()
            .is_some_and(|b| b.headroom < crate::budget::LIMITED_BELOW);
        Status {
            // An overlay, like `degraded`, on the states that take traffic (an ejected or
            // draining agent's state says more): the wire state is untouched.
            self_state: match self_view.shown_state() {
                "healthy" | "parole" | "recovering" if limited => "budget-limited",
                shown => shown,
            },
            model_budget: budget.map(|b| ModelBudgetStatus {
                headroom: b.headroom,
                reset_in_s: b.reset_in.as_secs_f64(),
                reason: b.reason,
            }),
            quality: self.local.quality(),
            // The admin port listens on every address: a probe's credentials are not shown.
            agent: crate::redact::profile(
                &snapshot.bootstrap.agent,
                &snapshot.policy.redact_headers,
            ),
            self_view,
            last_probe: self.local.last_probe(),
            peer_views: self.peers.status(&snapshot),
            load: self.inbound.load(),
            inbound: self.inbound.stats(),
            idempotency: self.inbound.idempotency(),
            peers: self.registry.peers(&snapshot),
            refused_claims: self.registry.refused_claims(&snapshot),
            tools: self.outbound.mcp_tools(&snapshot),
            gossip: self.gossip.as_ref().map(|g| g.status()),
            capabilities: self.peers.fleet_demand(),
            policy: snapshot.policy.clone(),
            config_generation: snapshot.generation,
            reload_error: self.store.reload_error(),
            pending_restart: self.store.pending_restart(),
            transitions,
            observe: Some(self.outbound.observed().into_iter().collect())
                .filter(|o: &std::collections::BTreeMap<_, _>| !o.is_empty()),
            chains: self.metrics.chain_counts(),
            ready: self.ready.load(Ordering::Acquire),
            version: env!("CARGO_PKG_VERSION"),
            degraded: self.degraded(),
            hidden: None,
        }
    }
}

/// Problems first, on the page and in `agent-reach status`: the states that take an agent out
/// of rotation, then those that limit it.
pub fn severity(state: State) -> u8 {
    match state {
        State::Ejected => 0,
        State::Probation => 1,
        State::Draining => 2,
        State::Recovering => 3,
        State::Parole => 4,
        State::Healthy => 5,
    }
}

/// Scrapes and status documents are large and repetitive: gzip them for a client that asks.
fn compressible(mut response: Response<ReachBody>) -> Response<ReachBody> {
    response.extensions_mut().insert(Compressible);
    response
}

/// A browser gets the status page, curl and scripts the plain index; `?format=html|text` picks.
fn wants_html<B>(req: &Request<B>) -> bool {
    let format = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("format=")));
    if let Some(format) = format {
        return format == "html";
    }
    req.headers()
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"))
}

const INDEX: &str = "agent-reach admin\n\n/         the status page (HTML, for a browser)\n/metrics  Prometheus metrics\n/live     liveness\n/ready    readiness\n/status   this agent and its peers (JSON)\n";
