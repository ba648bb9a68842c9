//! Metric names, help texts and buckets in one place, recorded into this sidecar's own registry.
//!
//! Each sidecar owns its recorder instead of installing a process-global one, so several sidecars
//! in one process (tests, the demo (`cargo run -p demo`)) keep separate `/metrics`.
//!
//! Series stay bounded as the fleet grows: the recorder holds aggregates only (labels from fixed
//! sets, capability names this agent or the registry declares, never a value a caller typed),
//! and the per-peer series are a bounded, expiring table of their own ([`peers`]).
//! `docs/metrics.md` lists every series.

mod claimed;
mod demand;
mod inbound;
mod known;
mod peers;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram, Counter, Histogram, Recorder, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::fast_hash::FastMap;
use crate::reach::{State, Transition, ViewSnapshot};

pub(crate) use demand::CapabilityGauges;
pub(crate) use inbound::InboundSeries;
use peers::PeerSeries;
pub(crate) use peers::{Limits as PeerSeriesLimits, PeerGauges};

pub(crate) const REQUESTS_TOTAL: &str = "reach_requests_total";
pub(crate) const REQUEST_DURATION: &str = "reach_request_duration_seconds";
pub(crate) const INBOUND_TTFB: &str = "reach_inbound_time_to_first_byte_seconds";
pub(crate) const INBOUND_IN_FLIGHT: &str = "reach_inbound_in_flight";
pub(crate) const INBOUND_QUEUE_DEPTH: &str = "reach_inbound_queue_depth";
pub(crate) const NO_CANDIDATE_TOTAL: &str = "reach_no_candidate_total";
/// The capability label of a call that named no capability anyone serves: typed names must not
/// grow the series.
pub(crate) const UNKNOWN_CAPABILITY: &str = "unknown";
pub(crate) const CONFIG_RELOADS_TOTAL: &str = "reach_config_reloads_total";
pub(crate) const CONNECTIONS_OPEN: &str = "reach_connections_open";
pub(crate) const CONNECTIONS_TOTAL: &str = "reach_connections_total";
pub(crate) const INFO: &str = "reach_info";
pub(crate) const STATE_TRANSITIONS_TOTAL: &str = "reach_state_transitions_total";
pub(crate) const SELF_STATE: &str = "reach_self_state";
pub(crate) const SELF_SATURATION: &str = "reach_self_saturation_ratio";
pub(crate) const SELF_SATURATION_PREDICTED: &str = "reach_self_saturation_predicted_ratio";
pub(crate) const SELF_AVAILABILITY: &str = "reach_self_availability_ratio";
pub(crate) const QUALITY_SIMILARITY: &str = "reach_quality_similarity_ratio";
pub(crate) const PEERS: &str = "reach_peers";
pub(crate) const PROBES_TOTAL: &str = "reach_probes_total";
pub(crate) const PROBE_DURATION: &str = "reach_probe_duration_seconds";
pub(crate) const RETRIES_TOTAL: &str = "reach_retries_total";
pub(crate) const RETRY_BUDGET_EXHAUSTED_TOTAL: &str = "reach_retry_budget_exhausted_total";
pub(crate) const LOOPS_REFUSED_TOTAL: &str = "reach_loops_refused_total";
pub(crate) const HEDGES_TOTAL: &str = "reach_hedges_total";
pub(crate) const TIER_PICKS_TOTAL: &str = "reach_tier_picks_total";
pub(crate) const IDEMPOTENT_REPLAYS_TOTAL: &str = "reach_idempotent_replays_total";
pub(crate) const DEADLINES_EXCEEDED_TOTAL: &str = "reach_deadlines_exceeded_total";
pub(crate) const TASKS_TOTAL: &str = "reach_tasks_total";
pub(crate) const TASK_DELIVERIES_TOTAL: &str = "reach_task_deliveries_total";
pub(crate) const TASK_STORE_ERRORS_TOTAL: &str = "reach_task_store_errors_total";
pub(crate) const GOSSIP_MEMBERS: &str = "reach_gossip_members";
pub(crate) const GOSSIP_MESSAGES_TOTAL: &str = "reach_gossip_messages_total";
pub(crate) const GOSSIP_BYTES_TOTAL: &str = "reach_gossip_bytes_total";
pub(crate) const GOSSIP_REJECTED_TOTAL: &str = "reach_gossip_rejected_total";
pub(crate) const MODEL_BUDGET_MALFORMED_TOTAL: &str = "reach_model_budget_malformed_total";
pub(crate) const MODEL_HEADROOM: &str = "reach_model_headroom_ratio";
/// OpenTelemetry's GenAI semantic convention, as a counter of tokens.
pub(crate) const GEN_AI_TOKEN_USAGE: &str = "gen_ai_client_token_usage";
pub(crate) const GEN_AI_TTFT: &str = "gen_ai_server_time_to_first_token_seconds";
/// Model names with a label of their own; past them, `other`.
const MAX_MODEL_LABELS: usize = 16;
/// (capability, tool) pairs `reach_mcp_tool_calls_total` names at most; the rest are `other`.
/// Only announced tools are routed, up to 32 per server (`docs/mcp.md`), but a fleet's are many.
const MAX_TOOL_LABELS: usize = 128;
pub(crate) const PANICS_TOTAL: &str = "reach_panics_total";
pub(crate) const TLS_HANDSHAKE_FAILURES_TOTAL: &str = "reach_tls_handshake_failures_total";
pub(crate) const AUTHZ_DENIED_TOTAL: &str = "reach_authz_denied_total";
pub(crate) const CLAIMS_REFUSED_TOTAL: &str = "reach_claims_refused_total";
pub(crate) const OBSERVE_CALLS_TOTAL: &str = "reach_observe_calls_total";
pub(crate) const OBSERVE_AVOIDABLE_FAILURES_TOTAL: &str = "reach_observe_avoidable_failures_total";
pub(crate) const OUTPUT_INVALID_TOTAL: &str = "reach_output_invalid_total";
pub(crate) const OUTPUT_UNVALIDATED_TOTAL: &str = "reach_output_unvalidated_total";
pub(crate) const AFFINITY_HITS_TOTAL: &str = "reach_affinity_hits_total";
pub(crate) const AFFINITY_LOST_TOTAL: &str = "reach_affinity_lost_total";
pub(crate) const AFFINITY_ENTRIES: &str = "reach_affinity_entries";
pub(crate) const MCP_TOOL_CALLS_TOTAL: &str = "reach_mcp_tool_calls_total";
pub(crate) const MCP_TOOLS_PAUSED: &str = "reach_mcp_tools_paused";
pub(crate) const MCP_TOOLS_HELD: &str = "reach_mcp_tools_held";

/// Latency buckets in seconds: sub-millisecond proxy hops up to multi-minute agent tasks.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
];

/// Help texts: promtool wants one for every metric.
const COUNTERS: &[(&str, &str)] = &[
    (
        MCP_TOOL_CALLS_TOTAL,
        "MCP tools/call answers read by this caller, by capability, tool and outcome (ok, error, timeout).",
    ),
    (
        AFFINITY_HITS_TOTAL,
        "Calls routed to the agent their affinity key is bound to, by capability.",
    ),
    (
        AFFINITY_LOST_TOTAL,
        "Calls whose affinity key's agent was out (answered 503 affinity_lost, or moved under `affinity: fallback`), by capability.",
    ),
    (
        OUTPUT_INVALID_TOTAL,
        "Agent answers refused by the capability's output_schema (answered 502 invalid_output), by capability.",
    ),
    (
        OUTPUT_UNVALIDATED_TOTAL,
        "Agent answers of a capability with an output_schema passed on unchecked, by capability and reason (streamed, oversized, not_json).",
    ),
    (
        OBSERVE_CALLS_TOTAL,
        "Calls routed in observe-only mode, by capability and whether the model would have chosen the same agent (agreement=same|different).",
    ),
    (
        OBSERVE_AVOIDABLE_FAILURES_TOTAL,
        "Observe-only calls that failed on an agent the model would have avoided, by capability.",
    ),
    (
        TLS_HANDSHAKE_FAILURES_TOTAL,
        "Connections refused by the inbound listener's mutual TLS, by reason: plaintext (in strict mode), unknown_ca, no_client_certificate, expired, bad_certificate, timeout, …",
    ),
    (
        AUTHZ_DENIED_TOTAL,
        "Inbound calls refused by the authorization policy (403 forbidden), by capability.",
    ),
    (
        CLAIMS_REFUSED_TOTAL,
        "Claims of other members the policy does not believe, by kind (serve: a member claiming a capability its served_by does not let it serve) and subject (the capability).",
    ),
    (
        REQUESTS_TOTAL,
        "Requests through the sidecar by direction, capability and outcome (per peer: reach_peer_requests_total).",
    ),
    (
        NO_CANDIDATE_TOTAL,
        "Outbound calls that found no peer able to serve the capability.",
    ),
    (
        CONFIG_RELOADS_TOTAL,
        "Config file reloads by file and result (ok or error).",
    ),
    (CONNECTIONS_TOTAL, "Connections accepted by listener."),
    (
        PANICS_TOTAL,
        "Panics by listener: in a request handler (answered 500 internal) or a connection (closed).",
    ),
    (
        STATE_TRANSITIONS_TOTAL,
        "State transitions by view (self or peer), from, to and reason.",
    ),
    (
        PROBES_TOTAL,
        "Business probes by capability and result (ok, failed, skipped_*).",
    ),
    (
        RETRIES_TOTAL,
        "Retries on another candidate by capability and failed attempt's reason.",
    ),
    (
        TIER_PICKS_TOTAL,
        "Attempts by zone tier of the chosen peer (zone, region, any).",
    ),
    (
        DEADLINES_EXCEEDED_TOTAL,
        "Calls ended by the caller's reach-timeout / reach-deadline, by direction.",
    ),
    (
        IDEMPOTENT_REPLAYS_TOTAL,
        "Duplicates of a keyed request answered without running it again.",
    ),
    (
        TASKS_TOTAL,
        "Async task events (submitted, done, failed, requeued, waiting, escalated, retried, resolved, taken_over).",
    ),
    (
        TASK_DELIVERIES_TOTAL,
        "POSTs of escalations and callbacks by kind and result (accepted, refused).",
    ),
    (
        TASK_STORE_ERRORS_TOTAL,
        "Task store operations that failed, by kind (io, redis, corrupt, full).",
    ),
    (
        RETRY_BUDGET_EXHAUSTED_TOTAL,
        "Calls that failed fast because the retry budget was spent.",
    ),
    (
        LOOPS_REFUSED_TOTAL,
        "Calls refused for their delegation chain at this caller, by why: loop and max_hops (508 loop_detected), forged and replayed (a reach-chain the agent passed on that this sidecar did not seal, or whose call has ended: 400).",
    ),
    (
        HEDGES_TOTAL,
        "Hedged attempts by result: won (the hedge's head came first), lost (the first attempt's did), no_budget (the retry budget was spent).",
    ),
    (
        GOSSIP_MESSAGES_TOTAL,
        "Gossip datagrams by direction (sent, received).",
    ),
    (
        GOSSIP_BYTES_TOTAL,
        "Gossip bytes by direction (sent, received), envelopes included.",
    ),
    (
        GOSSIP_REJECTED_TOTAL,
        "Gossip datagrams dropped unread, and authenticated items refused, by reason (bad_mac, expired, replayed, malformed, oversized, undecodable; not_sender, name_taken, bad_address, out_of_range, unknown_kind).",
    ),
    (
        GEN_AI_TOKEN_USAGE,
        "Tokens an external target's answers reported in `usage`, by gen_ai_token_type (input, output), gen_ai_request_model (the answer's model; at most 16, then other) and gen_ai_provider_name (the target).",
    ),
    (
        MODEL_BUDGET_MALFORMED_TOTAL,
        "Rate-limit header values from an external target that did not parse (ignored), by target.",
    ),
];

const GAUGES: &[(&str, &str)] = &[
    (
        MCP_TOOLS_PAUSED,
        "Servers' MCP tools this caller passes over now for failing (one per server and tool).",
    ),
    (
        MCP_TOOLS_HELD,
        "Servers' MCP tools this caller holds back because their definition is not the one it lists and routes by (pinned when first seen, or accepted by the policy's mcp.accept).",
    ),
    (
        MODEL_HEADROOM,
        "The local agent's model headroom, 0..1: the tightest of its providers' budgets (1 when none is known).",
    ),
    (
        AFFINITY_ENTRIES,
        "Affinity keys bound to an agent in this caller's table.",
    ),
    (
        INBOUND_IN_FLIGHT,
        "Requests the local agent is working on now.",
    ),
    (
        INBOUND_QUEUE_DEPTH,
        "Requests waiting for a concurrency slot of the local agent.",
    ),
    (CONNECTIONS_OPEN, "Open connections by listener."),
    (
        INFO,
        "Always 1; labels name the agent and the sidecar version.",
    ),
    (
        SELF_STATE,
        "1 for the state this agent's own view is in, 0 for the others; `degraded` stands in for `healthy` while its golden tasks drift.",
    ),
    (
        QUALITY_SIMILARITY,
        "The last golden-task run's mean similarity to the baselines in 0..1, by capability.",
    ),
    (
        SELF_SATURATION,
        "This agent's saturation in 0..1, from its own view.",
    ),
    (
        SELF_SATURATION_PREDICTED,
        "The saturation this agent's own view expects estimates.horizon ahead, from its load's trend, in 0..1.",
    ),
    (
        SELF_AVAILABILITY,
        "This agent's availability estimate in 0..1, from its own view.",
    ),
    (
        PEERS,
        "Peers this caller knows, by the state of whichever view allows less traffic (its own or the peer's).",
    ),
    (
        GOSSIP_MEMBERS,
        "Gossip members this sidecar knows, by liveness (alive, suspect, down).",
    ),
];

const HISTOGRAMS: &[(&str, &str)] = &[
    (
        GEN_AI_TTFT,
        "From an external target's request sent to its stream's first event, by gen_ai_provider_name (the target).",
    ),
    (
        REQUEST_DURATION,
        "Request duration until the response body ended, by direction.",
    ),
    (
        INBOUND_TTFB,
        "Time from admission to the local agent's response headers.",
    ),
    (PROBE_DURATION, "Business probe duration by capability."),
];

/// Which way a request crossed the sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Direction {
    Inbound,
    Outbound,
}

impl Direction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }
}

/// The outcomes a request ends with (`outcome` label), in the order of the handle cache.
const OUTCOMES: [&str; 4] = ["success", "failure", "timeout", "rejected"];

/// The zone tiers of `reach_tier_picks_total` (`outbound::candidates::tiers::Tier::as_str`).
const TIERS: [&str; 3] = ["zone", "region", "any"];

/// A request's counter and duration histogram, for one direction and outcome.
type RequestHandles = (Counter, Histogram);

/// One finished request, counted and timed on its series.
fn count_request((counter, histogram): &RequestHandles, duration: Duration) {
    counter.increment(1);
    histogram.record(duration.as_secs_f64());
}

/// Handles per capability, then per direction × outcome. Registering a metric builds its key
/// (label strings, a hash) on every call; a found handle is two atomic adds. The map grows only
/// as the declared capability names do.
type HandleCache = FastMap<String, [Option<RequestHandles>; 8]>;

/// One sidecar's metrics registry.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    requests: Mutex<HandleCache>,
    /// `reach_tier_picks_total` by tier (zone, region, any), registered on first use.
    tier_picks: [std::sync::OnceLock<Counter>; 3],
    /// The inbound series by capability (`inbound::InboundSeries`).
    inbound: Mutex<FastMap<String, std::sync::Arc<InboundSeries>>>,
    /// The bounded, expiring per-peer series.
    peers: Mutex<PeerSeries>,
    /// The fleet's demand per capability, replaced on every refresh.
    fleet_demand: Mutex<demand::FleetDemand>,
    /// The capabilities whose series were registered at 0 (`known.rs`).
    known: known::Known,
    /// The capabilities whose series carry their own name; any other counts as `other`.
    labelled: Mutex<std::collections::HashSet<String>>,
    /// The capabilities other members claim that have a label of their own
    /// (`metrics.max_capabilities` at most), and those forgotten (`claimed.rs`).
    claimed: Mutex<claimed::Claimed>,
    /// The capabilities of this sidecar's own config: never forgotten, never a claim's label.
    configured: Mutex<std::collections::HashSet<String>>,
    /// Loops refused and hedges, as `/status` shows them.
    chains: ChainCounters,
    /// The model names `gen_ai_client_token_usage` has a label for (the rest are `other`).
    models: Mutex<Vec<String>>,
    /// The (capability, tool) pairs `reach_mcp_tool_calls_total` has a label for.
    mcp_tools: Mutex<std::collections::HashSet<(String, String)>>,
}

/// What `/status` shows of delegation chains and hedges: the totals of
/// `reach_loops_refused_total` and `reach_hedges_total` (`docs/chains.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChainCounts {
    pub loops_refused: u64,
    pub(crate) max_hops_refused: u64,
    pub hedges_won: u64,
    pub(crate) hedges_lost: u64,
    pub(crate) hedges_no_budget: u64,
}

#[derive(Debug, Default)]
struct ChainCounters {
    loops_refused: AtomicU64,
    max_hops_refused: AtomicU64,
    hedges_won: AtomicU64,
    hedges_lost: AtomicU64,
    hedges_no_budget: AtomicU64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new(agent: &str) -> Self {
        let builder = PrometheusBuilder::new();
        // Real histograms, not summaries: Prometheus can aggregate them across the fleet.
        let builder = match builder.set_buckets(SECONDS_BUCKETS) {
            Ok(b) => b,
            Err(_) => PrometheusBuilder::new(),
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let metrics = Self {
            recorder,
            handle,
            requests: Mutex::default(),
            tier_picks: Default::default(),
            inbound: Mutex::default(),
            peers: Mutex::default(),
            fleet_demand: Mutex::default(),
            known: Mutex::default(),
            labelled: Mutex::default(),
            claimed: Mutex::default(),
            configured: Mutex::default(),
            chains: ChainCounters::default(),
            models: Mutex::default(),
            mcp_tools: Mutex::default(),
        };
        metrics.describe();
        metrics.register_fixed();
        let agent = agent.to_owned();
        metrics.with(|| {
            gauge!(INFO, "agent" => agent, "version" => env!("CARGO_PKG_VERSION")).set(1.0)
        });
        metrics
    }

    fn describe(&self) {
        let r = &self.recorder;
        for (name, help) in COUNTERS {
            r.describe_counter((*name).into(), None, (*help).into());
        }
        for (name, help) in GAUGES {
            r.describe_gauge((*name).into(), None, (*help).into());
        }
        for (name, help) in HISTOGRAMS {
            r.describe_histogram((*name).into(), Some(Unit::Seconds), (*help).into());
        }
    }

    /// Runs `f` with this sidecar's recorder behind the `metrics` macros.
    pub(crate) fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.recorder, f)
    }

    /// The Prometheus text exposition: the aggregates, the fleet's demand, then the tracked
    /// peers' series.
    pub fn render(&self) -> String {
        let mut text = self.handle.render();
        self.hide_forgotten(&mut text);
        self.fleet_demand
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .render(&mut text);
        self.peer_series().render(&mut text, Instant::now());
        text
    }

    /// The fleet's demand per capability as of this refresh; a capability left out loses its
    /// series.
    pub(crate) fn capability_demand<'a>(
        &self,
        fleet: impl IntoIterator<Item = (&'a str, CapabilityGauges)>,
    ) {
        // A capability without a label of its own has no demand series: members' claims
        // cannot grow them (`metrics.max_capabilities`).
        let labelled = self.labelled.lock().unwrap_or_else(|p| p.into_inner());
        let fleet: Vec<_> = fleet
            .into_iter()
            .filter(|(name, _)| labelled.contains(*name))
            .collect();
        drop(labelled);
        self.fleet_demand
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set(fleet);
    }

    /// Drains histogram samples into buckets and expires idle peers' series; called
    /// periodically so memory stays flat between scrapes.
    pub(crate) fn run_upkeep(&self) {
        self.handle.run_upkeep();
        self.settle_claims();
        self.peer_series().expire(Instant::now());
    }

    fn peer_series(&self) -> std::sync::MutexGuard<'_, PeerSeries> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn request_finished(
        &self,
        direction: Direction,
        capability: &str,
        peer: &str,
        outcome: &'static str,
        (started, ended): (Instant, Instant),
    ) {
        // Outbound answers only: an inbound call's peer is the local agent, and `-` is none.
        if direction == Direction::Outbound && peer != "-" {
            self.peer_series().request(peer, outcome, ended);
        }
        let duration = ended.saturating_duration_since(started);
        let Some(o) = OUTCOMES.iter().position(|x| *x == outcome) else {
            count_request(
                &self.register_request(direction, capability, outcome),
                duration,
            );
            return;
        };
        let slot = o * 2 + direction as usize;
        let mut cache = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        // Recorded through the cached handles under the lock: cloning them out and dropping the
        // clones was four locked instructions a call (`docs/perf-levers.md`).
        if let Some(handles) = cache.get(capability).and_then(|s| s[slot].as_ref()) {
            count_request(handles, duration);
            return;
        }
        // Cached under its label: a capability without one shares `other`'s handles.
        let label = self.label(capability);
        if let Some(handles) = cache.get(label).and_then(|s| s[slot].as_ref()) {
            count_request(handles, duration);
            return;
        }
        let handles = self.register_request(direction, label, outcome);
        count_request(&handles, duration);
        cache.entry(label.to_owned()).or_default()[slot] = Some(handles);
    }

    fn register_request(
        &self,
        direction: Direction,
        capability: &str,
        outcome: &'static str,
    ) -> RequestHandles {
        let capability = capability.to_owned();
        self.with(|| {
            (
                counter!(REQUESTS_TOTAL, "direction" => direction.as_str(), "capability" => capability.clone(), "outcome" => outcome),
                histogram!(REQUEST_DURATION, "direction" => direction.as_str(), "capability" => capability, "outcome" => outcome),
            )
        })
    }

    pub(crate) fn inbound_load(&self, in_flight: usize, queued: usize) {
        self.with(|| {
            gauge!(INBOUND_IN_FLIGHT).set(in_flight as f64);
            gauge!(INBOUND_QUEUE_DEPTH).set(queued as f64);
        });
    }

    pub(crate) fn no_candidate(&self, capability: &str) {
        let capability = capability.to_owned();
        self.with(|| counter!(NO_CANDIDATE_TOTAL, "capability" => capability).increment(1));
    }

    /// One config reload of `file` and its `result` (`ok`, `error`, `restart_required`).
    pub(crate) fn config_reload(&self, file: &'static str, result: &'static str) {
        self.with(|| {
            counter!(CONFIG_RELOADS_TOTAL, "file" => file, "result" => result).increment(1)
        });
    }

    pub(crate) fn connection_opened(&self, listener: &'static str) {
        self.with(|| {
            counter!(CONNECTIONS_TOTAL, "listener" => listener).increment(1);
            gauge!(CONNECTIONS_OPEN, "listener" => listener).increment(1.0);
        });
    }

    /// A state transition, counted without the agent's name (per-peer figures are the bounded
    /// table's); a tracked peer's series stay while it moves.
    pub(crate) fn transition(&self, view: &'static str, agent: &str, t: Transition) {
        if view == "peer" {
            self.peer_series().touch(agent, Instant::now());
        }
        let reason = reason_label(t.reason);
        self.with(|| {
            counter!(STATE_TRANSITIONS_TOTAL, "view" => view, "from" => t.from.as_str(), "to" => t.to.as_str(), "reason" => reason)
                .increment(1)
        });
    }

    pub(crate) fn self_view(&self, view: &ViewSnapshot) {
        self.with(|| {
            let shown = view.shown_state();
            let names = State::ALL.iter().map(|s| s.as_str()).chain(["degraded"]);
            for name in names {
                gauge!(SELF_STATE, "state" => name).set(if name == shown { 1.0 } else { 0.0 });
            }
            gauge!(SELF_SATURATION).set(view.estimates.saturation);
            gauge!(SELF_SATURATION_PREDICTED).set(view.estimates.saturation_predicted);
            gauge!(SELF_AVAILABILITY).set(view.estimates.availability);
        });
    }

    /// Every known peer as this caller sees it: `reach_peers{state}` counts them all, the
    /// tracked ones get their gauges; `limits` is the live policy's `metrics`.
    pub(crate) fn peers<'a>(
        &self,
        limits: PeerSeriesLimits,
        views: impl IntoIterator<Item = (&'a str, PeerGauges)>,
    ) {
        let views: Vec<(&str, PeerGauges)> = views.into_iter().collect();
        let mut by_state = [0usize; State::ALL.len()];
        for (_, g) in &views {
            if let Some(i) = State::ALL.iter().position(|s| *s == g.state) {
                by_state[i] += 1;
            }
        }
        self.with(|| {
            for (state, n) in State::ALL.iter().zip(by_state) {
                gauge!(PEERS, "state" => state.as_str()).set(n as f64);
            }
        });
        self.peer_series().views(limits, views, Instant::now());
    }

    /// Gossip counters and membership, copied from the node at scrape time.
    pub(crate) fn gossip(
        &self,
        stats: &crate::gossip::Stats,
        status: &crate::gossip::GossipStatus,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        self.with(|| {
            for (direction, packets, bytes) in [
                ("sent", &stats.packets_sent, &stats.bytes_sent),
                ("received", &stats.packets_received, &stats.bytes_received),
            ] {
                counter!(GOSSIP_MESSAGES_TOTAL, "direction" => direction)
                    .absolute(packets.load(Relaxed));
                counter!(GOSSIP_BYTES_TOTAL, "direction" => direction)
                    .absolute(bytes.load(Relaxed));
            }
            for reason in crate::gossip::Rejected::ALL {
                counter!(GOSSIP_REJECTED_TOTAL, "reason" => reason.as_str())
                    .absolute(stats.rejected(reason));
            }
            for (liveness, n) in [
                ("alive", status.alive),
                ("suspect", status.suspect),
                ("down", status.down),
            ] {
                gauge!(GOSSIP_MEMBERS, "status" => liveness).set(n as f64);
            }
        });
    }

    pub(crate) fn probe(&self, capability: &str, result: &'static str, duration: Option<Duration>) {
        let capability = capability.to_owned();
        self.with(|| {
            counter!(PROBES_TOTAL, "capability" => capability.clone(), "result" => result)
                .increment(1);
            if let Some(d) = duration {
                histogram!(PROBE_DURATION, "capability" => capability).record(d.as_secs_f64());
            }
        });
    }

    /// A golden-task run's mean similarity.
    pub(crate) fn quality(&self, capability: &str, similarity: f64) {
        let capability = capability.to_owned();
        self.with(|| gauge!(QUALITY_SIMILARITY, "capability" => capability).set(similarity));
    }

    pub(crate) fn retry(&self, capability: &str, reason: &'static str) {
        let capability = self.label(capability).to_owned();
        self.with(|| {
            counter!(RETRIES_TOTAL, "capability" => capability, "reason" => reason).increment(1)
        });
    }

    /// An answer its capability's output schema refused.
    pub(crate) fn output_invalid(&self, capability: &str) {
        let capability = self.label(capability).to_owned();
        self.with(|| counter!(OUTPUT_INVALID_TOTAL, "capability" => capability).increment(1));
    }

    /// An answer of a capability with a schema that was passed on unchecked, and why.
    pub(crate) fn output_unvalidated(&self, capability: &str, reason: &'static str) {
        let capability = self.label(capability).to_owned();
        self.with(|| {
            counter!(OUTPUT_UNVALIDATED_TOTAL, "capability" => capability, "reason" => reason)
                .increment(1)
        });
    }

    pub(crate) fn deadline_exceeded(&self, direction: Direction) {
        self.with(|| {
            counter!(DEADLINES_EXCEEDED_TOTAL, "direction" => direction.as_str()).increment(1)
        });
    }

    /// An async task's step (`TASKS_TOTAL`).
    pub(crate) fn task_event(&self, event: &'static str) {
        self.with(|| counter!(TASKS_TOTAL, "event" => event).increment(1));
    }

    /// A failed task store operation (`TASK_STORE_ERRORS_TOTAL`); `by` 0 registers the series.
    pub(crate) fn task_store_error(&self, kind: &'static str, by: u64) {
        self.with(|| counter!(TASK_STORE_ERRORS_TOTAL, "kind" => kind).increment(by));
    }

    /// A webhook or callback POST (`TASK_DELIVERIES_TOTAL`).
    pub(crate) fn task_delivery(&self, kind: &'static str, result: &'static str) {
        self.with(|| {
            counter!(TASK_DELIVERIES_TOTAL, "kind" => kind, "result" => result).increment(1)
        });
    }

    /// Unreadable rate-limit values in an external target's answer. `target` is a configured
    /// target's name: a bounded label.
    pub(crate) fn model_budget_malformed(&self, target: &str, n: u32) {
        let target = target.to_owned();
        self.with(|| {
            counter!(MODEL_BUDGET_MALFORMED_TOTAL, "target" => target).increment(u64::from(n))
        });
    }

    /// Tokens an external target's answer reported (docs/model-budgets.md, "Tokens").
    pub(crate) fn token_usage(&self, provider: &str, model: Option<&str>, input: u64, output: u64) {
        let model = {
            let mut known = self.models.lock().unwrap_or_else(|p| p.into_inner());
            match model {
                Some(m) if known.iter().any(|k| k == m) => m.to_owned(),
                Some(m) if known.len() < MAX_MODEL_LABELS => {
                    known.push(m.to_owned());
                    m.to_owned()
                }
                Some(_) => "other".to_owned(),
                None => "unknown".to_owned(),
            }
        };
        for (kind, n) in [("input", input), ("output", output)] {
            let (model, provider) = (model.clone(), provider.to_owned());
            self.with(|| {
                counter!(GEN_AI_TOKEN_USAGE, "gen_ai_token_type" => kind,
                    "gen_ai_request_model" => model, "gen_ai_provider_name" => provider)
                .increment(n)
            });
        }
    }

    /// A streamed answer's first event from an external target (docs/model-budgets.md, "Tokens").
    pub(crate) fn time_to_first_token(&self, provider: &str, ttft: Duration) {
        let provider = provider.to_owned();
        self.with(|| {
            histogram!(GEN_AI_TTFT, "gen_ai_provider_name" => provider).record(ttft.as_secs_f64())
        });
    }

    /// The local agent's model headroom (docs/model-budgets.md).
    pub(crate) fn model_headroom(&self, headroom: f64) {
        self.with(|| gauge!(MODEL_HEADROOM).set(headroom));
    }

    pub(crate) fn idempotent_replay(&self) {
        self.with(|| counter!(IDEMPOTENT_REPLAYS_TOTAL).increment(1));
    }

    pub(crate) fn tier_pick(&self, tier: &'static str) {
        match TIERS.iter().position(|t| *t == tier) {
            Some(i) => self.tier_picks[i]
                .get_or_init(|| self.with(|| counter!(TIER_PICKS_TOTAL, "tier" => tier)))
                .increment(1),
            None => self.with(|| counter!(TIER_PICKS_TOTAL, "tier" => tier).increment(1)),
        }
    }

    /// A call routed to the agent its affinity key is bound to.
    pub(crate) fn affinity_hit(&self, capability: &str) {
        let capability = self.label(capability).to_owned();
        self.with(|| counter!(AFFINITY_HITS_TOTAL, "capability" => capability).increment(1));
    }

    /// A call whose affinity key's agent was out.
    pub(crate) fn affinity_lost(&self, capability: &str) {
        let capability = self.label(capability).to_owned();
        self.with(|| counter!(AFFINITY_LOST_TOTAL, "capability" => capability).increment(1));
    }

    /// A `tools/call` answer read for how the tool did: `outcome` is `ok`, `error` or `timeout`.
    pub(crate) fn mcp_tool_call(&self, capability: &str, tool: &str, outcome: &'static str) {
        let key = (capability.to_owned(), tool.to_owned());
        let tool = {
            let mut known = self.mcp_tools.lock().unwrap_or_else(|p| p.into_inner());
            if known.contains(&key) || known.len() < MAX_TOOL_LABELS {
                known.insert(key.clone());
                key.1
            } else {
                "other".to_owned()
            }
        };
        let capability = key.0;
        self.with(|| {
            counter!(MCP_TOOL_CALLS_TOTAL, "capability" => capability, "tool" => tool, "outcome" => outcome)
                .increment(1)
        });
    }

    pub(crate) fn mcp_tools_paused(&self, n: usize) {
        self.with(|| gauge!(MCP_TOOLS_PAUSED).set(n as f64));
    }

    pub(crate) fn mcp_tools_held(&self, n: usize) {
        self.with(|| gauge!(MCP_TOOLS_HELD).set(n as f64));
    }

    pub(crate) fn affinity_entries(&self, n: usize) {
        self.with(|| gauge!(AFFINITY_ENTRIES).set(n as f64));
    }

    /// A call refused for its delegation chain: a loop, or one hop past `chains.max_hops`.
    pub(crate) fn loop_refused(&self, looped: bool) {
        let (why, count) = if looped {
            ("loop", &self.chains.loops_refused)
        } else {
            ("max_hops", &self.chains.max_hops_refused)
        };
        count.fetch_add(1, Ordering::Relaxed);
        self.with(|| counter!(LOOPS_REFUSED_TOTAL, "why" => why).increment(1));
    }

    /// A chain the agent passed on refused at the outbound listener (`forged`, `replayed`).
    pub(crate) fn chain_refused(&self, why: &'static str) {
        self.with(|| counter!(LOOPS_REFUSED_TOTAL, "why" => why).increment(1));
    }

    /// A hedge's result: `won`, `lost` or `no_budget`.
    pub(crate) fn hedge(&self, result: &'static str) {
        let count = match result {
            "won" => &self.chains.hedges_won,
            "lost" => &self.chains.hedges_lost,
            _ => &self.chains.hedges_no_budget,
        };
        count.fetch_add(1, Ordering::Relaxed);
        self.with(|| counter!(HEDGES_TOTAL, "result" => result).increment(1));
    }

    /// Loops refused and hedges so far, for `/status`.
    pub(crate) fn chain_counts(&self) -> ChainCounts {
        let c = &self.chains;
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ChainCounts {
            loops_refused: read(&c.loops_refused),
            max_hops_refused: read(&c.max_hops_refused),
            hedges_won: read(&c.hedges_won),
            hedges_lost: read(&c.hedges_lost),
            hedges_no_budget: read(&c.hedges_no_budget),
        }
    }

    pub(crate) fn retry_budget_exhausted(&self, capability: &str) {
        let capability = self.label(capability).to_owned();
        self.with(|| {
            counter!(RETRY_BUDGET_EXHAUSTED_TOTAL, "capability" => capability).increment(1)
        });
    }

    /// The panic counter of `listener`, registered now so it shows 0 before the first panic.
    pub(crate) fn panics(&self, listener: &'static str) -> Counter {
        self.with(|| counter!(PANICS_TOTAL, "listener" => listener))
    }

    pub(crate) fn tls_handshake_failed(&self, reason: &'static str) {
        self.with(|| counter!(TLS_HANDSHAKE_FAILURES_TOTAL, "reason" => reason).increment(1));
    }

    /// One observe-only call: whether the model agreed, and whether it failed where the model
    /// would not have gone.
    pub(crate) fn observed(&self, capability: &str, same: bool, avoidable_failure: bool) {
        let agreement = if same { "same" } else { "different" };
        let label = self.label(capability).to_owned();
        self.with(|| {
            counter!(OBSERVE_CALLS_TOTAL, "capability" => label.clone(), "agreement" => agreement)
                .increment(1);
            if avoidable_failure {
                counter!(OBSERVE_AVOIDABLE_FAILURES_TOTAL, "capability" => label).increment(1);
            }
        });
    }

    pub(crate) fn authz_denied(&self, capability: &str) {
        let capability = capability.to_owned();
        self.with(|| counter!(AUTHZ_DENIED_TOTAL, "capability" => capability).increment(1));
    }

    /// A member's claim the policy does not believe (`kind`: `serve`), about `subject`: a
    /// capability the policy names, so the labels stay bounded.
    pub(crate) fn claim_refused(&self, kind: &'static str, subject: &str) {
        let subject = subject.to_owned();
        self.with(|| {
            counter!(CLAIMS_REFUSED_TOTAL, "kind" => kind, "subject" => subject).increment(1)
        });
    }

    pub(crate) fn panicked(&self, listener: &'static str) {
        self.panics(listener).increment(1);
    }

    pub(crate) fn connection_closed(&self, listener: &'static str) {
        self.with(|| gauge!(CONNECTIONS_OPEN, "listener" => listener).decrement(1.0));
    }
}

/// A transition's reason as a label value: the state machine's fixed sentences, spaces as `_`.
fn reason_label(reason: &'static str) -> String {
    reason.replace(' ', "_")
}
