//! The fleet policy file: timeouts, pooling, the reachability model's tunables, retries.

use serde::{Deserialize, Deserializer, Serialize};

use super::bounds::{ms, secs, Row, Rule, DAY, HOUR, MINUTE, MS, ZERO};
use super::duration::HumanDuration;
use super::mesh::{Authorization, MtlsPolicy};
use super::scalar::{Name, NumVisitor, TargetEndpoint};
use super::tasks::{CallbacksPolicy, EscalationPolicy, QueueRounds};
use crate::reach::{EstimateParams, StateParams, Weights};

/// `config/policy.yaml`, shared by the fleet. Every field has a default, so an empty file is valid.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub timeouts: Timeouts,
    pub pool: Pool,
    pub estimates: EstimatesPolicy,
    pub weights: WeightSets,
    pub states: StatesPolicy,
    pub zones: Zones,
    pub probes: ProbesPolicy,
    pub peer_views: PeerViewsPolicy,
    pub retry: RetryPolicy,
    pub idempotency: IdempotencyPolicy,
    /// Capabilities served by plain services with no sidecar (order, inventory or
    /// logistics services): the caller measures them itself with the same model.
    pub targets: Vec<ExternalTarget>,
    /// Log one event per routed attempt, as structured fields (target `agent_reach::decision`).
    pub decision_log: bool,
    /// Header names whose values are secrets, besides the built-in list (`authorization`,
    /// `proxy-authorization`, `cookie`, `set-cookie`, `x-api-key`, `api-key`, `x-goog-api-key`):
    /// masked wherever shown.
    #[serde(deserialize_with = "super::scalar::header_names")]
    pub redact_headers: Vec<String>,
    /// Identity-like headers (`x-real-ip`, `x-forwarded-user`, `ssl-client-cert`, …: the list
    /// in `src/inbound/intake/vouched.rs`) that reach the agent from a caller; every other one is
    /// dropped at the inbound listener.
    #[serde(deserialize_with = "super::scalar::header_names")]
    pub pass_identity_headers: Vec<String>,
    /// Mutual TLS between sidecars (`docs/mtls.md`).
    pub mtls: MtlsPolicy,
    /// Which callers may call which capabilities.
    pub authorization: Authorization,
    /// Route as a plain proxy (round robin, no ejection, no caps) and only record what the model
    /// would have chosen: the trial run before letting it decide.
    pub observe_only: bool,
    /// Per-capability settings, by capability name.
    pub capabilities: std::collections::BTreeMap<String, CapabilityPolicy>,
    /// Keyword rules that resolve a call to `any.reach` (or with `reach-intent`) to a
    /// capability (`docs/intents.md`).
    pub intents: super::intents::Intents,
    /// The least confidence (the winner's share of the matched keyword lengths) an intent
    /// resolves with; below it the call is ambiguous.
    pub intent_threshold: super::intents::IntentThreshold,
    /// How many peers get series of their own on `/metrics`, and for how long.
    pub metrics: MetricsPolicy,
    /// Where a task goes when every agent failed it (`retry.fallback.final_fallback: escalate`).
    pub escalation: EscalationPolicy,
    /// Where a task's `reach-callback` may point, and when its delivery is given up.
    pub callbacks: CallbacksPolicy,
    /// Checking answers against a capability's `output_schema`.
    pub validation: ValidationPolicy,
    /// The session-affinity table's bounds (`docs/affinity.md`).
    pub affinity: AffinityPolicy,
    /// Delegation chains: how many hops a chain may take (`docs/chains.md`).
    pub chains: super::chains::ChainsPolicy,
    /// Whether callers act on the model budgets they hear (`docs/model-budgets.md`).
    pub model_budgets: ModelBudgetsPolicy,
    /// MCP tool definitions accepted beside those pinned when first seen (`docs/mcp.md`).
    pub mcp: McpPolicy,
}

/// `mcp`: tool definitions the fleet accepts, as `<capability>/<tool>@<digest>` (the digest
/// `/status` shows for a held-back server's tool). An accepted definition is listed and routed
/// to in place of the pinned one wherever a server announces it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct McpPolicy {
    pub accept: Vec<String>,
}

impl McpPolicy {
    /// The digests accepted for `tool` of `capability`, in the order written.
    pub(crate) fn accepted(&self, capability: &str, tool: &str) -> Vec<&str> {
        self.accept
            .iter()
            .filter_map(|entry| {
                let (name, digest) = entry.rsplit_once('@')?;
                let (cap, t) = name.split_once('/')?;
                (cap == capability && t == tool).then_some(digest)
            })
            .collect()
    }
}

/// Policy `capabilities.<name>`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CapabilityPolicy {
    /// Overrides the fleet's `observe_only` for this capability.
    pub observe_only: Option<bool>,
    /// What a call bound to an agent that is out does (`docs/affinity.md`).
    pub affinity: AffinityMode,
    /// Which protocol's affinity keys the capability's calls carry; `None` looks at each call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// A call may enter an agent serving this capability that is already on its delegation
    /// chain (a recursion the capability expects); `chains.max_hops` still bounds it.
    pub reentrant: bool,
    /// An attempt whose answer's head (for `text/event-stream`, its first event) has not come
    /// in this long is abandoned before a byte reaches the caller and, when the call is safe to
    /// repeat, moved to another candidate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_event_timeout: Option<HumanDuration>,
    /// A second attempt to another candidate when the first is slow to answer (`docs/chains.md`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hedge: Option<super::chains::HedgePolicy>,
}

/// `capabilities.<name>.affinity`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AffinityMode {
    /// The call fails with `affinity_lost`: the holder's task or session is not elsewhere.
    #[default]
    Strict,
    /// The call is routed as if it had no key, and the key moves to whoever answers.
    Fallback,
}

/// `capabilities.<name>.protocol`: where a call's affinity keys are read from.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// A2A JSON-RPC: task and context ids in the body, whatever its `content-type`.
    A2a,
    /// MCP streamable HTTP: `Mcp-Session-Id`; the body is never read.
    Mcp,
    /// Only `reach-affinity`.
    Http,
}

/// Every number in the file and what it may be: checked where it is written, so an error names
/// the file, line and column (a NaN retry ratio once passed `check` and made every call panic).
/// A new numeric key gets a row here (`numeric_keys_all_have_a_rule` fails until it does).
#[rustfmt::skip] // one row per key: a table
pub(super) const RULES: &[Row] = &[
    ("timeouts.connect", Rule::Span(MS, HOUR)),
    ("timeouts.request", Rule::Span(MS, DAY)),
    ("pool.idle_timeout", Rule::Span(ZERO, HOUR)),
    ("pool.max_idle_per_host", Rule::Whole(0, 10_000)),
    ("pool.tcp_keepalive", Rule::Span(secs(1), HOUR)),
    // An EWMA weight of 0 would never move.
    ("estimates.availability_alpha", Rule::Above(0.0, 1.0)),
    ("estimates.availability_recovery", Rule::Span(MS, DAY)),
    ("estimates.latency_time_constant", Rule::Span(MS, DAY)),
    ("estimates.stale_after", Rule::Span(MS, DAY)),
    ("estimates.busy_ttl", Rule::Span(MS, DAY)),
    ("estimates.window", Rule::Span(secs(1), DAY)),
    ("estimates.horizon", Rule::Span(ZERO, HOUR)),
    ("weights.*.*", Rule::Real(0.0, 1000.0)),
    ("zones.cross_zone_cost", Rule::Real(0.0, 1000.0)),
    ("zones.cross_region_cost", Rule::Real(0.0, 1000.0)),
    ("zones.tier_min_score", Rule::Real(-1000.0, 1000.0)),
    ("states.parole.cap", Rule::Real(0.0, 1.0)),
    // Counts of outcomes: zero would be read as one.
    ("states.parole.successes", Rule::Whole(1, 1_000_000)),
    ("states.parole.duration", Rule::Span(ZERO, DAY)),
    ("states.parole.failures", Rule::Whole(1, 1_000_000)),
    ("states.healthy.failures", Rule::Whole(1, 1_000_000)),
    ("states.healthy.min_score", Rule::Real(-1000.0, 1000.0)),
    ("states.probation.cap", Rule::Real(0.0, 1.0)),
    ("states.degraded.cap", Rule::Real(0.0, 1.0)),
    ("states.probation.window", Rule::Span(MS, DAY)),
    ("states.probation.recover_rate", Rule::Real(0.0, 1.0)),
    ("states.probation.min_samples", Rule::Whole(1, 1_000_000)),
    ("states.probation.eject_failure_rate", Rule::Real(0.0, 1.0)),
    ("states.probation.failures", Rule::Whole(1, 1_000_000)),
    ("states.ejected.cool_off", Rule::Span(ZERO, DAY)),
    ("states.ejected.max_cool_off", Rule::Span(ZERO, DAY)),
    ("states.recovering.start_cap", Rule::Real(0.0, 1.0)),
    ("states.recovering.ramp", Rule::Span(ZERO, DAY)),
    ("states.recovering.failures", Rule::Whole(1, 1_000_000)),
    ("states.refusals_as_failure", Rule::Whole(1, 1_000_000)),
    // A zero interval would probe in a busy loop.
    ("probes.interval", Rule::Span(ms(100), DAY)),
    ("probes.busy_interval", Rule::Span(ms(100), DAY)),
    ("probes.busy_threshold", Rule::Real(0.0, 1.0)),
    ("probes.fast_interval", Rule::Span(ms(100), DAY)),
    ("probes.timeout", Rule::Span(MS, HOUR)),
    ("peer_views.poll_interval", Rule::Span(ms(10), HOUR)),
    ("model_budgets.max_wait", Rule::Span(ZERO, secs(600))),
    ("retry.max_retries", Rule::Whole(0, 20)),
    ("retry.max_body_bytes", Rule::Whole(0, 64 << 20)),
    ("retry.backoff_base", Rule::Span(ZERO, MINUTE)),
    ("retry.backoff_max", Rule::Span(ZERO, HOUR)),
    // tower's TpsBudget asserts its ttl and ratio: out of range, every outbound call panics.
    ("retry.budget.ratio", Rule::Real(0.0, 1.0)),
    ("retry.budget.min_per_second", Rule::Whole(0, 1_000_000)),
    ("retry.budget.ttl", Rule::Span(secs(1), MINUTE)),
    ("retry.fallback.interval", Rule::Span(ZERO, MINUTE)),
    ("retry.fallback.chain_length", Rule::Whole(2, 5)),
    ("retry.fallback.queue.delay", Rule::Span(ZERO, DAY)),
    ("retry.fallback.queue.max_delay", Rule::Span(ZERO, DAY)),
    ("retry.fallback.queue.max_rounds", Rule::Whole(0, 1000)),
    ("escalation.max_payload_bytes", Rule::Whole(0, 16 << 20)),
    ("callbacks.give_up_after", Rule::Span(secs(1), DAY)),
    ("callbacks.max_tries", Rule::Whole(1, 1000)),
    ("targets[].timeout", Rule::Span(MS, DAY)),
    ("targets[].max_concurrency", Rule::Whole(1, 100_000)),
    ("targets[].rate_limit.per_second", Rule::Above(0.0, 1e6)),
    // An empty bucket refuses everything.
    ("targets[].rate_limit.burst", Rule::Whole(1, 1_000_000)),
    ("idempotency.max_keys", Rule::Whole(1, 10_000_000)),
    ("idempotency.ttl", Rule::Span(MS, DAY)),
    ("idempotency.max_body_bytes", Rule::Whole(0, 64 << 20)),
    ("idempotency.max_total_bytes", Rule::Whole(0, 4 << 30)),
    // A share of 0 would let no caller keep anything.
    ("idempotency.per_caller_share", Rule::Above(0.0, 1.0)),
    // Per-peer series: each peer costs about ten; a thousand peers is already a lot of series.
    ("metrics.max_peer_series", Rule::Whole(0, 1_000)),
    ("metrics.max_capabilities", Rule::Whole(0, 1_000)),
    ("metrics.idle_timeout", Rule::Span(secs(1), DAY)),
    // 0 takes any match with no tie; 1 only a call whose keywords all belong to one rule.
    ("intent_threshold", Rule::Real(0.0, 1.0)),
    ("validation.max_body_bytes", Rule::Whole(0, 64 << 20)),
    // A table of 0 entries or bytes would bind nothing: use `protocol: http` and no header.
    ("affinity.max_entries", Rule::Whole(1, 100_000_000)),
    ("affinity.max_bytes", Rule::Whole(1024, 4 << 30)),
    ("affinity.idle_timeout", Rule::Span(secs(1), DAY)),
    // A chain keeps 33 entries (`chain::MAX_ENTRIES`): past 32 hops a loop could hide.
    ("chains.max_hops", Rule::Whole(1, 32)),
    ("capabilities.*.first_event_timeout", Rule::Span(ms(10), HOUR)),
    ("capabilities.*.hedge.after", Rule::Span(MS, HOUR)),
    ("capabilities.*.hedge.max", Rule::Whole(1, 1)),
];

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Establishing a TCP connection to a peer or the local agent.
    pub connect: HumanDuration,
    /// Time to response headers for a capability that declares no timeout of its own.
    pub request: HumanDuration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: HumanDuration::from_secs(1),
            request: HumanDuration::from_secs(30),
        }
    }
}

/// Upstream connection pool. `idle_timeout`, `max_idle_per_host` and `peer_protocol` are
/// restart-only (the pools are built once); `tcp_keepalive` applies from the next new connection.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Pool {
    /// An idle pooled connection is closed after this long. Keep it below every server's
    /// keep-alive idle close (a peer sidecar's `header_read_timeout`, 5 s for Node.js and uvicorn
    /// agents): a connection reused just as the server closes it fails a call that never ran.
    pub idle_timeout: HumanDuration,
    /// Idle connections kept per upstream address.
    pub max_idle_per_host: usize,
    /// TCP keepalive probes on upstream connections, so a half-open peer is noticed.
    pub tcp_keepalive: HumanDuration,
    /// What the peer pool speaks to other sidecars: `http1` (a pool of HTTP/1.1 connections, one
    /// request each at a time) or `http2` (one multiplexed connection per peer; prior knowledge
    /// in plaintext, ALPN `h2` over mutual TLS). Every inbound listener serves both, so a fleet
    /// can switch one sidecar at a time. The local agent and external targets always get HTTP/1.1.
    pub peer_protocol: PeerProtocol,
}

/// The protocol between sidecars (`pool.peer_protocol`).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PeerProtocol {
    /// HTTP/1.1, a connection per request in flight.
    #[default]
    Http1,
    /// HTTP/2, requests multiplexed on one connection per peer.
    Http2,
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            idle_timeout: HumanDuration::from_secs(4),
            max_idle_per_host: 64,
            tcp_keepalive: HumanDuration::from_secs(15),
            peer_protocol: PeerProtocol::Http1,
        }
    }
}

/// How signals become estimates.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EstimatesPolicy {
    /// Weight of the newest outcome in the availability EWMA.
    pub availability_alpha: Fraction,
    /// Without new outcomes, availability climbs back toward 1 with this time constant.
    pub availability_recovery: HumanDuration,
    /// Time constant of the peak-sensitive latency EWMA.
    pub latency_time_constant: HumanDuration,
    /// With no signal for this long, estimates decay toward unknown.
    pub stale_after: HumanDuration,
    /// A busy report holds this long unless renewed.
    pub busy_ttl: HumanDuration,
    /// The window of the latency percentiles.
    pub window: HumanDuration,
    /// How far ahead the predicted saturation looks (docs/reach-model.md, "Predicted
    /// saturation"); `0s` switches prediction off.
    pub horizon: HumanDuration,
}

impl Default for EstimatesPolicy {
    fn default() -> Self {
        let d = EstimateParams::default();
        Self {
            availability_alpha: Fraction(d.availability_alpha),
            availability_recovery: HumanDuration(d.availability_recovery),
            latency_time_constant: HumanDuration(d.latency_time_constant),
            stale_after: HumanDuration(d.stale_after),
            busy_ttl: HumanDuration(d.busy_ttl),
            window: HumanDuration(d.window),
            horizon: HumanDuration(d.horizon),
        }
    }
}

impl EstimatesPolicy {
    pub(crate) fn params(&self) -> EstimateParams {
        EstimateParams {
            availability_alpha: self.availability_alpha.0,
            availability_recovery: self.availability_recovery.get(),
            latency_time_constant: self.latency_time_constant.get(),
            stale_after: self.stale_after.get(),
            busy_ttl: self.busy_ttl.get(),
            window: self.window.get(),
            horizon: self.horizon.get(),
        }
    }
}

/// The two weight sets; `reach-mode` or the capability's default picks one.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WeightSets {
    pub sync: Weights,
    #[serde(rename = "async")]
    pub async_: Weights,
}

impl Default for WeightSets {
    fn default() -> Self {
        Self {
            sync: Weights::SYNC,
            async_: Weights::ASYNC,
        }
    }
}

/// The state machine's thresholds and timings (docs/reach-model.md, "State machine").
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StatesPolicy {
    pub parole: ParoleStates,
    pub healthy: HealthyStates,
    /// A healthy agent whose golden tasks drifted from their baselines.
    pub degraded: DegradedStates,
    pub probation: ProbationStates,
    pub ejected: EjectedStates,
    pub recovering: RecoveringStates,
    /// Consecutive 429s after which each further one counts as a failure.
    pub refusals_as_failure: u32,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ParoleStates {
    pub cap: Fraction,
    pub successes: u32,
    pub duration: HumanDuration,
    pub failures: u32,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthyStates {
    pub failures: u32,
    /// A healthy agent whose score falls below this goes on probation.
    pub min_score: f64,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DegradedStates {
    /// The share of traffic a degraded agent may take: it still answers, less well.
    pub cap: Fraction,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProbationStates {
    pub cap: Fraction,
    pub window: HumanDuration,
    pub recover_rate: Fraction,
    pub min_samples: u32,
    pub eject_failure_rate: Fraction,
    pub failures: u32,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EjectedStates {
    pub cool_off: HumanDuration,
    pub max_cool_off: HumanDuration,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveringStates {
    pub start_cap: Fraction,
    pub ramp: HumanDuration,
    pub failures: u32,
}

impl Default for StatesPolicy {
    fn default() -> Self {
        let d = StateParams::default();
        Self {
            parole: ParoleStates {
                cap: Fraction(d.parole_cap),
                successes: d.parole_successes,
                duration: HumanDuration(d.parole_duration),
                failures: d.parole_failures,
            },
            healthy: HealthyStates {
                failures: d.healthy_failures,
                min_score: -1.0,
            },
            degraded: DegradedStates {
                cap: Fraction(d.degraded_cap),
            },
            probation: ProbationStates {
                cap: Fraction(d.probation_cap),
                window: HumanDuration(d.probation_window),
                recover_rate: Fraction(d.recover_rate),
                min_samples: d.probation_min_samples,
                eject_failure_rate: Fraction(d.probation_eject_failure_rate),
                failures: d.probation_failures,
            },
            ejected: EjectedStates {
                cool_off: HumanDuration(d.cool_off),
                max_cool_off: HumanDuration(d.max_cool_off),
            },
            recovering: RecoveringStates {
                start_cap: Fraction(d.recovering_start_cap),
                ramp: HumanDuration(d.ramp),
                failures: d.recovering_failures,
            },
            refusals_as_failure: d.refusals_as_failure,
        }
    }
}

impl StatesPolicy {
    pub(crate) fn params(&self) -> StateParams {
        StateParams {
            parole_cap: self.parole.cap.0,
            parole_successes: self.parole.successes.max(1),
            parole_duration: self.parole.duration.get(),
            parole_failures: self.parole.failures.max(1),
            healthy_failures: self.healthy.failures.max(1),
            degraded_cap: self.degraded.cap.0,
            probation_cap: self.probation.cap.0,
            probation_window: self.probation.window.get(),
            recover_rate: self.probation.recover_rate.0,
            probation_min_samples: self.probation.min_samples.max(1),
            probation_eject_failure_rate: self.probation.eject_failure_rate.0,
            probation_failures: self.probation.failures.max(1),
            cool_off: self.ejected.cool_off.get(),
            max_cool_off: self
                .ejected
                .max_cool_off
                .get()
                .max(self.ejected.cool_off.get()),
            recovering_start_cap: self.recovering.start_cap.0,
            ramp: self.recovering.ramp.get(),
            recovering_failures: self.recovering.failures.max(1),
            refusals_as_failure: self.refusals_as_failure.max(1),
        }
    }
}

macro_rules! default_from_states {
    ($($t:ident => $f:ident),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                StatesPolicy::default().$f
            }
        }
    )*};
}
default_from_states!(ParoleStates => parole, HealthyStates => healthy, DegradedStates => degraded,
    ProbationStates => probation,
    EjectedStates => ejected, RecoveringStates => recovering);

/// Zone distance, added to a candidate's cost.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Zones {
    /// Same region, another zone.
    pub cross_zone_cost: f64,
    /// Another region.
    pub cross_region_cost: f64,
    /// A zone tier is passed over when none of its candidates scores at least this.
    pub tier_min_score: f64,
}

impl Default for Zones {
    fn default() -> Self {
        Self {
            cross_zone_cost: 0.1,
            cross_region_cost: 0.3,
            tier_min_score: 0.0,
        }
    }
}

impl Zones {
    pub(crate) fn distance(
        &self,
        (zone_a, region_a): (&str, &str),
        (zone_b, region_b): (&str, &str),
    ) -> f64 {
        if !region_a.is_empty() && !region_b.is_empty() && region_a != region_b {
            self.cross_region_cost
        } else if !zone_a.is_empty() && !zone_b.is_empty() && zone_a != zone_b {
            self.cross_zone_cost
        } else {
            0.0
        }
    }
}

/// Business probes, run by each sidecar against its own agent.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProbesPolicy {
    /// Between probes of a capability that declares no interval of its own.
    pub interval: HumanDuration,
    /// The interval while the agent is loaded (saturation at or above `busy_threshold`).
    pub busy_interval: HumanDuration,
    pub busy_threshold: Fraction,
    /// The interval while the agent is on probation, ejected or recovering, so a change is
    /// noticed in seconds.
    pub fast_interval: HumanDuration,
    pub timeout: HumanDuration,
}

impl Default for ProbesPolicy {
    fn default() -> Self {
        Self {
            interval: HumanDuration::from_secs(60),
            busy_interval: HumanDuration::from_secs(120),
            busy_threshold: Fraction(0.8),
            fast_interval: HumanDuration::from_secs(2),
            timeout: HumanDuration::from_secs(5),
        }
    }
}

/// How a caller learns its static peers' own views of themselves (until gossip carries them).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PeerViewsPolicy {
    pub poll_interval: HumanDuration,
}

impl Default for PeerViewsPolicy {
    fn default() -> Self {
        Self {
            poll_interval: HumanDuration::from_secs(1),
        }
    }
}

/// `model_budgets`: with `steer: false` a sidecar still learns, shows and gossips its agent's
/// model headroom, but scores no candidate by it: the comparison run of `docs/model-budgets.md`,
/// or a fleet that wants the figures before it lets them move traffic. Reloaded live.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelBudgetsPolicy {
    pub steer: bool,
    /// The longest a provider's 429 (its `retry-after`) holds the agent's budget at 0; the
    /// next successful answer from the same account ends it sooner.
    pub max_wait: HumanDuration,
    /// Per `budget_group`: the identities whose figures speak for every member. A group not
    /// listed here shares nothing: each member speaks only for itself.
    pub groups: std::collections::BTreeMap<String, BudgetGroupPolicy>,
}

impl Default for ModelBudgetsPolicy {
    fn default() -> Self {
        Self {
            steer: true,
            max_wait: HumanDuration::from_secs(60),
            groups: Default::default(),
        }
    }
}

impl ModelBudgetsPolicy {
    /// Whether a member proving `identity` may publish figures for the whole `group`.
    pub(crate) fn may_publish(
        &self,
        group: &str,
        identity: Option<&crate::identity::SpiffeId>,
    ) -> bool {
        let Some(rule) = self.groups.get(group) else {
            return false;
        };
        identity.is_some_and(|id| rule.published_by.iter().any(|p| p.matches(id)))
    }
}

/// `model_budgets.groups.<name>`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetGroupPolicy {
    /// Identities (SPIFFE IDs or globs) whose figures for the group every caller believes for
    /// every member on the same credential (`docs/model-budgets.md`).
    pub published_by: Vec<crate::identity::IdentityPattern>,
}

/// `/metrics` per peer: aggregates cover the whole fleet, and at most `max_peer_series` peers
/// this caller sends traffic to get series of their own, dropped after `idle_timeout` without
/// traffic or a state change (`docs/metrics.md`). Reloaded live.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsPolicy {
    pub max_peer_series: usize,
    pub idle_timeout: HumanDuration,
    /// Capabilities other members claim (profiles, A2A cards, MCP tool lists) that get series
    /// of their own; past it they count under `capability="other"`.
    pub max_capabilities: usize,
}

impl Default for MetricsPolicy {
    fn default() -> Self {
        Self {
            max_peer_series: 20,
            idle_timeout: HumanDuration::from_secs(600),
            max_capabilities: 128,
        }
    }
}

/// Retries on another candidate for calls that never reached an agent.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    pub max_retries: u32,
    /// Request bodies up to this size are buffered so they can be replayed.
    pub max_body_bytes: usize,
    /// Full-jitter exponential backoff between attempts: a draw in 0..min(max, base·2^n).
    pub backoff_base: HumanDuration,
    pub backoff_max: HumanDuration,
    pub budget: RetryBudgetPolicy,
    /// How `reach-mode: async` calls move along their candidates.
    pub fallback: FallbackPolicy,
}

/// The fallback chain of async calls.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FallbackPolicy {
    /// Pause between consecutive agents (2 s by default, so the previous one can clean up).
    pub interval: HumanDuration,
    /// Agents tried in all, 2 to 5.
    pub chain_length: u32,
    /// When a task's chain is exhausted (`docs/tasks.md`): `fail`, `queue` (the whole chain
    /// again later) or `escalate` (to a person, after the queue's rounds when `queue` is set).
    /// A call that is not a task answers with the last error whatever this says.
    pub final_fallback: FinalFallback,
    /// The rounds of `queue`, and of `escalate` before it escalates; `queue` without it uses
    /// the defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueRounds>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FinalFallback {
    #[default]
    Fail,
    Queue,
    Escalate,
}

impl FallbackPolicy {
    /// How many more rounds a task gets after its `rounds_run`-th chain failed.
    pub(crate) fn rounds(&self) -> u32 {
        match (self.final_fallback, &self.queue) {
            (FinalFallback::Fail, _) => 0,
            (FinalFallback::Queue, q) => q.clone().unwrap_or_default().max_rounds,
            (FinalFallback::Escalate, q) => q.as_ref().map_or(0, |q| q.max_rounds),
        }
    }

    /// The queue's rounds as configured, or the defaults.
    pub(crate) fn queue_rounds(&self) -> QueueRounds {
        self.queue.clone().unwrap_or_default()
    }
}

impl Default for FallbackPolicy {
    fn default() -> Self {
        Self {
            interval: HumanDuration::from_secs(2),
            chain_length: 3,
            final_fallback: FinalFallback::Fail,
            queue: None,
        }
    }
}

/// Retries may add `ratio` of the calls of the last `ttl`, plus `min_per_second`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryBudgetPolicy {
    pub ratio: f64,
    pub min_per_second: u32,
    /// The window the ratio looks back over (1 s to 60 s).
    pub ttl: HumanDuration,
}

impl Default for RetryBudgetPolicy {
    fn default() -> Self {
        Self {
            ratio: 0.2,
            min_per_second: 10,
            ttl: HumanDuration::from_secs(10),
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 2,
            max_body_bytes: 64 * 1024,
            backoff_base: HumanDuration::from_millis(25),
            backoff_max: HumanDuration::from_secs(1),
            budget: RetryBudgetPolicy::default(),
            fallback: FallbackPolicy::default(),
        }
    }
}

/// A plain service reached without a sidecar.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExternalTarget {
    pub name: Name,
    pub capability: Name,
    /// `host:port` (plain HTTP) or `https://host[:port]` (TLS: SNI and `Host` from the endpoint).
    pub endpoints: Vec<TargetEndpoint>,
    /// A PEM bundle of the CAs trusted for this target's `https://` endpoints instead of the
    /// Mozilla roots built in; relative to the policy file's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
    /// Calls in flight from this sidecar to one endpoint; beyond it the endpoint is passed over.
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// A token bucket over all endpoints; an empty bucket answers 429 at once, never a queue.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// The provider account this target's budget belongs to: agents whose targets name the same
    /// group share what any of them learns of it (docs/model-budgets.md). Makes the target a
    /// model provider.
    #[serde(default)]
    pub budget_group: Option<Name>,
    /// The target is a model provider: its rate-limit headers and 429s teach the agent's model
    /// budget. Any other target's 429 cools that target only.
    #[serde(default)]
    pub model_provider: bool,
}

impl ExternalTarget {
    /// Whether its answers teach the agent's model budget.
    pub(crate) fn teaches_budget(&self) -> bool {
        self.model_provider || self.budget_group.is_some()
    }
}

/// Makes the targets' relative `ca_file` paths relative to `base` (the policy's folder) and
/// reads each bundle: an unreadable or empty one, or one on a target with no `https://`
/// endpoint, is refused with the path as written (to locate it) and why.
pub(super) fn resolve_ca_files(
    targets: &mut [ExternalTarget],
    base: Option<&std::path::Path>,
) -> Result<(), (String, String)> {
    for target in targets {
        let Some(ca_file) = &mut target.ca_file else {
            continue;
        };
        let written = ca_file.display().to_string();
        if !target.endpoints.iter().any(TargetEndpoint::is_tls) {
            return Err((
                written,
                format!(
                    "targets[`{}`].ca_file: the target has no `https://` endpoint to trust it for",
                    target.name
                ),
            ));
        }
        if let Some(base) = base.filter(|_| ca_file.is_relative()) {
            *ca_file = base.join(&*ca_file);
        }
        if let Err(err) = super::ca_bundle::read_ca_bundle(ca_file) {
            return Err((
                written,
                format!("targets[`{}`].ca_file: {err}", target.name),
            ));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

/// `idempotency-key` tables (restart-only: the table is sized at start-up).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyPolicy {
    pub max_keys: usize,
    pub ttl: HumanDuration,
    /// Responses up to this size are kept for replay; a larger one makes duplicates a 409.
    pub max_body_bytes: usize,
    /// All stored responses together (bodies and heads); past it the oldest completed entries
    /// are evicted. Well under the chart's 128 Mi container limit.
    pub max_total_bytes: usize,
    /// The share of `max_total_bytes` (and of `max_keys`) one caller may hold, so one caller
    /// cannot evict everyone else's keys.
    pub per_caller_share: Fraction,
}

impl Default for IdempotencyPolicy {
    fn default() -> Self {
        Self {
            max_keys: 10_000,
            ttl: HumanDuration::from_secs(600),
            max_body_bytes: 256 * 1024,
            max_total_bytes: 32 * 1024 * 1024,
            per_caller_share: Fraction(0.5),
        }
    }
}

/// `validation:` — answers checked against a capability's `output_schema` are read whole before
/// they are passed on; this bounds what the callee's sidecar holds per call.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationPolicy {
    /// A JSON answer up to this size is checked; a larger one (or one that streams) is passed on
    /// unchecked and counted (`reach_output_unvalidated_total`).
    pub max_body_bytes: usize,
}

impl Default for ValidationPolicy {
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
        }
    }
}

/// `affinity:` — the table of which agent holds which task or session (`docs/affinity.md`).
/// Reloaded live: the bounds apply from the next binding.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AffinityPolicy {
    pub max_entries: usize,
    /// Keys, values and bookkeeping together; past it the least recently used go first.
    pub max_bytes: usize,
    /// A key unused this long is forgotten: the session's idle time.
    pub idle_timeout: HumanDuration,
}

impl Default for AffinityPolicy {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 16 * 1024 * 1024,
            idle_timeout: HumanDuration::from_secs(30 * 60),
        }
    }
}

/// A number in 0..1.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, PartialOrd)]
#[serde(transparent)]
pub struct Fraction(pub f64);

impl Fraction {
    pub fn get(self) -> f64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor("a number between 0 and 1", |value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(Self(value))
            } else {
                Err(format!("{value} must be between 0 and 1"))
            }
        }))
    }
}
