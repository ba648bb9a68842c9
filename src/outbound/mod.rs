//! The outbound listener: the local agent calls a capability; the sidecar scores the peers that
//! serve it, picks one, forwards the call, and moves to another peer when the first refused it.
//!
//! The request path is one stack, built in [`Outbound::stack`] (just below) in request order;
//! each step is a tower service in a file or folder named for it. The first, `lanes`, answers
//! the `local_api`, rewrites an `agent_card`, `resolve`s the capability (by name or intent) and
//! picks a lane: the full one runs `submit`, `dedupe` and `mcp` first; both end in the routing a
//! task's runner shares, [`Outbound::routing`]: the `routing` step (asking `affinity`,
//! `candidates` (sampled, scored, in tiers; the pick), `attempts` (the attempt policy: retry
//! table, budget, backoff) and `record`) and `endpoint` (with `target_limit`). What passes
//! between them is in `call`.

mod affinity;
mod agent_card;
mod attempts;
mod call;
mod candidates;
mod dedupe;
mod endpoint;
mod first_event;
mod lanes;
mod local_api;
mod mcp;
mod record;
mod resolve;
mod routing;
mod submit;
mod target_limit;

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tower::ServiceBuilder;

pub use attempts::observe::ObserveCounts;
pub(crate) use attempts::observe::ObserveLog;
pub use candidates::balance::pick;
pub use candidates::sample::score_candidates;
pub(crate) use mcp::pins::Pins as McpPins;
#[cfg(test)]
pub(crate) use mcp::status::ToolServer;
pub(crate) use mcp::status::ToolStatus;
pub(crate) use resolve::capability_of;

use crate::config::{ConfigStore, Snapshot};
use crate::http::pool::Pool;
use crate::http::step::Step;
use crate::http::ReachBody;
use crate::idempotency::IdempotencyTable;
use crate::local::LocalAgent;
use crate::metrics::Metrics;
use crate::peers::PeerViews;
use crate::rate_limit::RateLimiters;
use crate::registry::Registry;
use crate::runtime::Shared;
use crate::tasks::Queue;
use attempts::budget::RetryBudgets;
use call::Call;
use tower::ServiceExt;

impl Outbound {
    /// The outbound request path, in request order: the first step (`lanes`) answers the
    /// agent's own API, resolves a capability call and sends it down the plain lane (routing
    /// alone) or, when one of its steps may act, the full lane.
    pub(crate) fn stack(
        self: &Arc<Self>,
    ) -> impl Step<Request<Incoming>, Response = Response<ReachBody>> {
        let full = ServiceBuilder::new()
            // `prefer: respond-async`: stored as a task and answered 202; a runner routes it.
            .layer(submit::layer(self.clone()))
            // The agent's own resent call (its client timed out and resent) runs once.
            .layer(dedupe::layer(self.clone()))
            // An MCP capability: tool calls to servers with a working tool; the fleet's tool list.
            .layer(mcp::layer(self.clone()))
            .service(self.routing());
        lanes::service(lanes::Lanes {
            out: self.clone(),
            // The agent's own API (`/reach/v1/busy`, `/reach/v1/tasks`) is not a capability call.
            api: local_api::service(self.local.clone(), self.store.clone(), self.tasks.clone()),
            plain: self.routing(),
            full,
        })
    }

    /// A call routed: what a task's runner sends its stored call through.
    fn routing(self: &Arc<Self>) -> impl Step<Call, Response = call::Recorded> {
        ServiceBuilder::new()
            // Affinity (a bound key's holder), the candidates (scored, in zone tiers), the
            // attempt policy (retry table, budget, backoff, deadline, fallback) and the record
            // (metrics, `reach-attempts`): one step, `routing`, asking each in turn.
            .layer(routing::layer(self.clone()))
            // One attempt on one peer, over the peer client; the caller's view hears the answer,
            // and an external target's answer teaches the agent's model budget. An external
            // target's rate limit refuses it at once (`target_limit`); another endpoint may take it.
            .service(endpoint::endpoint(self.clone()))
    }
}

/// What the outbound steps share: the sidecar's state, each `Arc` cloned into the steps.
#[derive(Debug)]
pub(crate) struct Outbound {
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
    client: Pool,
    registry: Arc<Registry>,
    peers: Arc<PeerViews>,
    local: Arc<LocalAgent>,
    budgets: RetryBudgets,
    rate_limits: RateLimiters,
    idempotency: Arc<IdempotencyTable>,
    /// Observe-only mode's round robin and its comparison with the model.
    observe: ObserveLog,
    /// Where `prefer: respond-async` calls go; `None` when the bootstrap has no `tasks`.
    tasks: Option<Arc<Queue>>,
    /// Which agent holds which task or session (`docs/affinity.md`).
    affinity: Arc<affinity::Table>,
    /// This caller's view of each MCP server's tools (`docs/mcp.md`).
    tools: mcp::view::ToolViews,
    /// The MCP tool definitions this caller lists and routes to (`mcp/pins.rs`), shared with
    /// gossip, which brings the fleet's and publishes this sidecar's.
    pins: Arc<McpPins>,
    /// MCP clients' sessions with this sidecar, and the servers' sessions behind them.
    broker: mcp::sessions::Broker,
    /// Opens the delegation chain the agent passes on (`src/chain/`).
    seal: Arc<crate::chain::Seal>,
    /// Recent times to an answer's head, per hedged capability (`hedge: {after: p95}`).
    head_times: attempts::hedge::HeadTimes,
}

impl Outbound {
    /// The outbound listener over the sidecar's shared state, calling peers over `client`.
    pub(crate) fn new(shared: &Shared, client: Pool) -> Self {
        Self {
            store: shared.store.clone(),
            metrics: shared.metrics.clone(),
            client,
            registry: shared.registry.clone(),
            peers: shared.peers.clone(),
            local: shared.local.clone(),
            budgets: RetryBudgets::default(),
            rate_limits: RateLimiters::default(),
            idempotency: shared.idempotency.clone(),
            observe: ObserveLog::default(),
            tasks: None,
            affinity: Arc::default(),
            tools: mcp::view::ToolViews::default(),
            pins: Arc::default(),
            broker: mcp::sessions::Broker::default(),
            seal: shared.seal.clone(),
            head_times: Default::default(),
        }
    }

    /// The task queue, when this sidecar takes async tasks.
    pub(crate) fn tasks(&self) -> Option<&Arc<Queue>> {
        self.tasks.as_ref()
    }

    /// Takes async tasks into `queue`.
    pub(crate) fn with_tasks(mut self, queue: Arc<Queue>) -> Self {
        self.tasks = Some(queue);
        self
    }

    /// The MCP tool pins, for gossip to feed and publish (`mcp/pins.rs`).
    pub(crate) fn mcp_pins(&self) -> Arc<McpPins> {
        self.pins.clone()
    }

    /// Each MCP capability's tools and how each server's tool stands (`docs/mcp.md`).
    pub(crate) fn mcp_tools(&self, snapshot: &Snapshot) -> Vec<ToolStatus> {
        mcp::status::tools(self, snapshot)
    }

    /// How many servers' tools this caller holds back for a definition it does not route by.
    pub(crate) fn mcp_tools_held(&self, snapshot: &Snapshot) -> usize {
        mcp::status::held(self, snapshot)
    }

    /// How many servers' tools this caller passes over now.
    pub(crate) fn mcp_tools_paused(&self) -> usize {
        self.tools.paused(std::time::Instant::now())
    }

    /// What observe-only mode found so far, per capability.
    pub(crate) fn observed(&self) -> Vec<(String, ObserveCounts)> {
        self.observe.snapshot()
    }

    /// Routes a task's stored call for `capability` (its attempts reported to `journal`) and
    /// answers as a call would be answered.
    async fn run_task(
        self: &Arc<Self>,
        capability: &str,
        request: Request<bytes::Bytes>,
        journal: crate::tasks::Journal,
    ) -> Response<ReachBody> {
        let capability = match crate::config::Name::parse(capability) {
            Ok(name) => name,
            Err(err) => return crate::error::ReachError::BadRequest(err).into_response(),
        };
        let (parts, bytes) = request.into_parts();
        let present = crate::http::headers::Present::of(&parts.headers);
        let deadline = crate::http::deadline::Deadline::from_headers(&parts.headers)
            .ok()
            .flatten();
        let call = Call {
            capability,
            parts: Box::new(parts),
            upload: crate::http::upload::Upload::Buffered(bytes),
            deadline,
            snapshot: self.store.snapshot(),
            started: std::time::Instant::now(),
            present,
            carried: Some(Box::new(call::Carried {
                journal: Some(journal),
                ..call::Carried::default()
            })),
        };
        match self.routing().oneshot(call).await {
            Ok(recorded) => recorded.response,
            Err(never) => match never {},
        }
    }
}

/// A task runner's chain: the outbound routing of its stored call.
#[derive(Debug)]
pub(crate) struct TaskChain(pub(crate) Arc<Outbound>);

impl crate::tasks::Chain for TaskChain {
    fn run<'a>(
        &'a self,
        capability: &'a str,
        request: Request<bytes::Bytes>,
        journal: crate::tasks::Journal,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<ReachBody>> + Send + 'a>> {
        Box::pin(self.0.run_task(capability, request, journal))
    }
}

/// An `Outbound` with no listener, for the steps' own tests.
#[cfg(test)]
pub(super) fn for_tests(policy: crate::config::Policy) -> Arc<Outbound> {
    use crate::config::{Bootstrap, ConfigPaths};
    use crate::local::Admission;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 9));
    let bootstrap = Bootstrap::local("caller", addr, &[]).unwrap_or_else(|e| panic!("{e}"));
    let client = crate::http::pool::Pool::build(&policy);
    let store = Arc::new(ConfigStore::new(bootstrap, policy, ConfigPaths::default()));
    let metrics = Arc::new(Metrics::new("test"));
    let local = LocalAgent::new(store.clone(), metrics.clone(), Admission::new(1));
    let idempotency = IdempotencyTable::new(crate::idempotency::Budget {
        max_keys: 100,
        ttl: std::time::Duration::from_secs(60),
        max_body: 1 << 16,
        max_total_bytes: 1 << 20,
        per_caller_share: 1.0,
    });
    let shared = Shared {
        registry: Arc::new(Registry::new()),
        peers: Arc::new(PeerViews::new(store.clone(), metrics.clone())),
        local: Arc::new(local),
        admission: Admission::new(1),
        store,
        metrics,
        idempotency,
        seal: Arc::default(),
    };
    Arc::new(Outbound::new(&shared, client))
}
