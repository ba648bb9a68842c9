//! The per-agent bootstrap file: listeners, limits, the local agent's profile and static peers.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{de, Deserialize, Deserializer, Serialize};

use super::bounds::{ms, secs, Row, Rule, DAY, HOUR, MS, ZERO};
use super::duration::HumanDuration;
use super::mesh::TlsFiles;
use super::output_schema::OutputSchema;
use super::quality::QualitySpec;
use super::scalar::{self, Cost, HeaderBytes, HostPort, Name, PositiveCount, Proficiency};
use super::tasks::TasksConfig;
use crate::identity::SpiffeId;

/// `config/agent-reach.yaml`. The keys in `RESTART_ONLY` (src/config/restart_only.rs) need a
/// restart; the rest hot-reloads.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Bootstrap {
    #[serde(default)]
    pub listen: Listen,
    #[serde(default)]
    pub limits: Limits,
    pub agent: AgentProfile,
    #[serde(default)]
    pub peers: Vec<StaticPeer>,
    /// Membership and state sharing with the other sidecars; without it, only static peers.
    #[serde(default)]
    pub gossip: Option<GossipConfig>,
    /// This sidecar's certificate, key and trust bundle for mutual TLS with its peers.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// How often the config files are checked for changes.
    #[serde(default = "default_watch_interval")]
    pub watch_interval: HumanDuration,
    /// Where OpenTelemetry spans go (`docs/traces.md`); without it, the standard `OTEL_*`
    /// variables, else tracing is off. Restart-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingConfig>,
    /// Where `prefer: respond-async` tasks are kept (`docs/tasks.md`); without it, async
    /// submissions are refused. Restart-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TasksConfig>,
    /// The agent containers' kubelet probes the admin port runs for them, by
    /// `<container>/<livez|readyz|startupz>` (`src/config/app_probes.rs`): written by the
    /// injector (`AGENT_REACH_APP_PROBES`), read once at start.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub app_probes: super::AppProbes,
    /// What the kubelet's `preStop` hook of the agent's container presents to `GET /drain` on
    /// the admin port (`x-agent-reach-drain`): written by the injector
    /// (`AGENT_REACH_DRAIN_TOKEN`), never shown.
    #[serde(default, skip_serializing)]
    pub drain_token: Option<String>,
}

/// `tracing:` — OTLP/HTTP export of the sidecar's spans.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); `/v1/traces` is appended.
    /// Default: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, then `OTEL_EXPORTER_OTLP_ENDPOINT`.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the spans. Default: `OTEL_SERVICE_NAME`, else `agent-reach`.
    #[serde(default)]
    pub service_name: Option<String>,
    /// The share of new traces recorded; a call that arrives with a `traceparent` follows the
    /// caller's decision.
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
}

fn default_sample_ratio() -> f64 {
    1.0
}

fn default_watch_interval() -> HumanDuration {
    HumanDuration::from_secs(1)
}

/// Every number in the file (and a few other values) and what it may be: checked where it is
/// written, so an error names the file, line and column. A new numeric key gets a row here
/// (`numeric_keys_all_have_a_rule` fails until it does).
#[rustfmt::skip] // one row per key: a table
pub(super) const RULES: &[Row] = &[
    // An outbound listener off loopback would route anyone's calls: an open proxy.
    ("listen.outbound", Rule::Loopback),
    ("watch_interval", Rule::Span(ms(10), HOUR)),
    ("limits.max_connections", Rule::Whole(1, 1_000_000)),
    ("limits.max_header_bytes", Rule::Whole(8192, 1 << 20)),
    // Zero would end every connection (or request) before it starts.
    ("limits.header_read_timeout", Rule::Span(ms(100), HOUR)),
    ("limits.drain_timeout", Rule::Span(ZERO, HOUR)),
    ("limits.idle_timeout", Rule::Span(ms(100), DAY)),
    ("limits.body_read_timeout", Rule::Span(ms(100), HOUR)),
    ("agent.max_concurrency", Rule::Whole(1, 100_000)),
    ("agent.queue.capacity", Rule::Whole(0, 100_000)),
    ("agent.queue.max_wait", Rule::Span(ZERO, HOUR)),
    ("agent.rate_limit.per_second", Rule::Above(0.0, 1e6)),
    // An empty bucket refuses everything.
    ("agent.rate_limit.burst", Rule::Whole(1, 1_000_000)),
    ("agent.capabilities[].tags.*", Rule::Real(0.0, 1.0)),
    ("agent.a2a.proficiency", Rule::Real(0.0, 1.0)),
    ("agent.a2a.tags.*", Rule::Real(0.0, 1.0)),
    // Each refresh is one small GET to the local agent; faster would be noise.
    ("agent.a2a.refresh", Rule::Span(ms(100), DAY)),
    // Each refresh is one `initialize` and one `tools/list` to the local MCP server.
    ("agent.mcp.refresh", Rule::Span(ms(100), DAY)),
    ("agent.capabilities[].timeout", Rule::Span(MS, DAY)),
    ("agent.capabilities[].expected_duration", Rule::Span(MS, DAY)),
    ("agent.capabilities[].cost", Rule::Real(0.0, 1e6)),
    ("agent.capabilities[].paths[]", Rule::PathPrefix),
    ("agent.capabilities[].probe.expect_status", Rule::Whole(100, 599)),
    ("agent.capabilities[].probe.expect_json.value", Rule::Any),
    // A zero interval would probe the agent in a busy loop.
    ("agent.capabilities[].probe.interval", Rule::Span(ms(100), DAY)),
    ("agent.capabilities[].probe.timeout", Rule::Span(MS, HOUR)),
    // A JSON Schema (any shape) or a file's path: checked when it is compiled.
    ("agent.capabilities[].output_schema", Rule::Any),
    // Golden tasks are real work for the agent: no faster than a probe.
    ("agent.capabilities[].quality.interval", Rule::Span(ms(100), DAY)),
    ("agent.capabilities[].quality.threshold", Rule::Real(0.0, 1.0)),
    ("gossip.probe_interval", Rule::Span(ms(10), HOUR)),
    ("gossip.probe_timeout", Rule::Span(MS, HOUR)),
    ("gossip.suspect_timeout", Rule::Span(ms(10), HOUR)),
    ("gossip.refresh_interval", Rule::Span(ms(10), HOUR)),
    ("gossip.resolve_interval", Rule::Span(secs(1), DAY)),
    ("gossip.expected_members", Rule::Whole(1, 100_000)),
    ("tracing.sample_ratio", Rule::Real(0.0, 1.0)),
    // A lease shorter than one renewal round trip would be lost while it is held.
    ("tasks.lease", Rule::Span(secs(1), HOUR)),
    ("tasks.workers", Rule::Whole(1, 1024)),
    ("tasks.max_payload_bytes", Rule::Whole(0, 64 << 20)),
    ("tasks.max_response_bytes", Rule::Whole(0, 64 << 20)),
    ("tasks.retention", Rule::Span(secs(1), secs(365 * 86_400))),
];

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    /// Inbound interception: off unless `init-net` redirects the agent's ports here.
    #[serde(skip_serializing_if = "Intercept::is_off")]
    pub intercept: Intercept,
}

/// `listen.intercept`: the agent ports `init-net` redirects to the inbound listener (the injector
/// writes it beside the init container). Only connections whose original destination is one of
/// these are served as intercepted; any other redirect is a direct connection (`docs/kubernetes.md`,
/// "Inbound interception").
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Intercept {
    pub ports: Vec<u16>,
}

impl Intercept {
    pub(crate) fn is_off(&self) -> bool {
        self.ports.is_empty()
    }
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            outbound: SocketAddr::from(([127, 0, 0, 1], 4140)),
            inbound: SocketAddr::from(([0, 0, 0, 0], 4143)),
            admin: SocketAddr::from(([0, 0, 0, 0], 4191)),
            intercept: Intercept::default(),
        }
    }
}

/// `gossip:` — how this sidecar finds the others and shares its agent's profile and live view.
/// Timings must be the same across the fleet: the whole section is restart-only (the key file's
/// contents rotate live).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GossipConfig {
    /// UDP address gossip listens on.
    #[serde(default = "default_gossip_listen")]
    pub listen: SocketAddr,
    /// The IP other sidecars reach this one at, for gossip and for work (the pod IP). Default:
    /// the listen IP if it is specific, else the IP the host name resolves to. It must be the
    /// IP this sidecar's gossip datagrams leave from (no NAT in between): others refuse items
    /// from any other source, and log a warning naming it.
    #[serde(default)]
    pub advertise: Option<IpAddr>,
    /// `host:port` of sidecars to join through; a DNS name may resolve to many (a headless
    /// Service) and is re-resolved every `resolve_interval`. None: this sidecar starts alone.
    #[serde(default)]
    pub seeds: Vec<HostPort>,
    /// The cluster key (one per line; the first signs, any verifies). Relative paths are
    /// relative to this file.
    pub key_file: PathBuf,
    /// Each period this sidecar probes one member for liveness.
    #[serde(default = "default_probe_interval")]
    pub probe_interval: HumanDuration,
    /// A probe unanswered this long is retried through other members.
    #[serde(default = "default_probe_timeout")]
    pub probe_timeout: HumanDuration,
    /// A suspected member that does not refute within this time is declared dead.
    #[serde(default = "default_suspect_timeout")]
    pub suspect_timeout: HumanDuration,
    /// The live view is re-published at least this often (and at once when its state changes).
    #[serde(default = "default_refresh_interval")]
    pub refresh_interval: HumanDuration,
    /// How often seed names are resolved again.
    #[serde(default = "default_resolve_interval")]
    pub resolve_interval: HumanDuration,
    /// The fleet size the retransmission count is sized for (more is safe, less is slower).
    #[serde(default = "default_expected_members")]
    pub expected_members: PositiveCount,
}

fn default_gossip_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 4190))
}
fn default_probe_interval() -> HumanDuration {
    HumanDuration::from_secs(1)
}
fn default_probe_timeout() -> HumanDuration {
    HumanDuration::from_millis(300)
}
fn default_suspect_timeout() -> HumanDuration {
    HumanDuration::from_secs(3)
}
fn default_refresh_interval() -> HumanDuration {
    HumanDuration::from_secs(2)
}
fn default_resolve_interval() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_expected_members() -> PositiveCount {
    PositiveCount(256)
}

impl GossipConfig {
    /// A gossip section with the defaults, for embedding (demo, tests).
    pub(crate) fn new(listen: SocketAddr, seeds: Vec<HostPort>, key_file: PathBuf) -> Self {
        Self {
            listen,
            advertise: None,
            seeds,
            key_file,
            probe_interval: default_probe_interval(),
            probe_timeout: default_probe_timeout(),
            suspect_timeout: default_suspect_timeout(),
            refresh_interval: default_refresh_interval(),
            resolve_interval: default_resolve_interval(),
            expected_members: default_expected_members(),
        }
    }
}

/// Bounds that protect the sidecar from bad or slow clients.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Open connections per listener; further clients wait in the kernel backlog.
    pub max_connections: usize,
    /// Largest request head (request line + headers) accepted, in bytes.
    pub max_header_bytes: HeaderBytes,
    /// A client must finish sending its request head within this time (slowloris guard).
    pub header_read_timeout: HumanDuration,
    /// How long in-flight requests may run after SIGTERM before the sidecar exits anyway.
    pub drain_timeout: HumanDuration,
    /// A connection (HTTP/1 keep-alive or h2) with no request in flight is closed after this.
    pub idle_timeout: HumanDuration,
    /// A request body must keep arriving: a gap longer than this between two chunks ends the
    /// request with 408 (a slow upload must not hold an admission slot).
    pub body_read_timeout: HumanDuration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // Sized to the chart's 128 Mi container limit: an idle h2 connection holds ~14 KB.
            max_connections: 1_024,
            max_header_bytes: HeaderBytes(64 * 1024),
            header_read_timeout: HumanDuration::from_secs(10),
            drain_timeout: HumanDuration::from_secs(30),
            idle_timeout: HumanDuration::from_secs(60),
            body_read_timeout: HumanDuration::from_secs(10),
        }
    }
}

/// What the local agent is and what it can do; published to peers.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
    /// Default: the pod's name (`POD_NAME`, set by the injected sidecar), else `HOSTNAME`.
    #[serde(default = "name_from_environment")]
    pub name: Name,
    /// Where the local agent listens (host:port).
    pub address: HostPort,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub region: String,
    pub max_concurrency: PositiveCount,
    #[serde(default)]
    pub queue: QueueConfig,
    /// Work this agent accepts from peers per second; over it, 429 at once.
    #[serde(default)]
    pub rate_limit: Option<super::RateLimit>,
    #[serde(default, deserialize_with = "unique_capabilities")]
    pub capabilities: Vec<Capability>,
    /// Import the agent's A2A card: each skill becomes a capability (`docs/a2a.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<A2aConfig>,
    /// Import the local MCP server's tools into one capability (`docs/mcp.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpConfig>,
}

/// `agent.mcp:` — where the local MCP server listens and how often its tools are read.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// The MCP endpoint's path on the agent (streamable HTTP).
    #[serde(default = "default_mcp_path", deserialize_with = "scalar::http_path")]
    pub path: String,
    /// How often `tools/list` is read again.
    #[serde(default = "default_mcp_refresh")]
    pub refresh: HumanDuration,
    /// The capability the tools are entries of; a written capability of that name keeps its
    /// own settings and gets the tools.
    #[serde(default = "default_mcp_capability")]
    pub capability: Name,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            path: default_mcp_path(),
            refresh: default_mcp_refresh(),
            capability: default_mcp_capability(),
        }
    }
}

fn default_mcp_path() -> String {
    "/mcp".to_owned()
}
fn default_mcp_refresh() -> HumanDuration {
    HumanDuration::from_secs(60)
}
fn default_mcp_capability() -> Name {
    Name::sanitized("mcp", "mcp")
}

/// One MCP tool as a capability entry: what routing and the federated `tools/list` need, kept
/// small enough that a server's tools fit a gossip profile item (`src/mcp/tools.rs` bounds them).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ToolFacts {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub title: String,
    /// The first 8 bytes of the SHA-256 of the canonical input schema, in hex.
    pub schema: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub idempotent: bool,
}

impl ToolFacts {
    /// A call for this tool may be sent again to another server.
    pub(crate) fn retry_safe(&self) -> bool {
        self.read_only || self.idempotent
    }
}

/// The tools an MCP capability's server has: set only by the import, never from a file.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct McpTools {
    /// The capability itself came from the import (no written capability of its name).
    #[serde(skip)]
    pub imported: bool,
    pub tools: Vec<ToolFacts>,
}

/// `agent.a2a:` — where the local agent's A2A card is and how its skills become capabilities.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct A2aConfig {
    /// The card's path on the agent.
    #[serde(default = "default_card_path", deserialize_with = "scalar::http_path")]
    pub card: String,
    /// The proficiency each skill tag gets.
    #[serde(default = "default_card_proficiency")]
    pub proficiency: Proficiency,
    /// Tag → proficiency, over the default.
    #[serde(default)]
    pub tags: BTreeMap<String, Proficiency>,
    /// How often the card is read again.
    #[serde(default = "default_card_refresh")]
    pub refresh: HumanDuration,
}

impl Default for A2aConfig {
    fn default() -> Self {
        Self {
            card: default_card_path(),
            proficiency: default_card_proficiency(),
            tags: BTreeMap::new(),
            refresh: default_card_refresh(),
        }
    }
}

fn default_card_path() -> String {
    "/.well-known/agent-card.json".to_owned()
}
fn default_card_proficiency() -> Proficiency {
    Proficiency::clamped(0.8)
}
fn default_card_refresh() -> HumanDuration {
    HumanDuration::from_secs(30)
}

/// What an A2A card says about a skill beyond its tags: set only on capabilities imported from
/// the card, which is also how a reload tells them from the file's own.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SkillFacts {
    /// The card's `capabilities.streaming`.
    pub streaming: bool,
    /// Media types the skill takes and gives (its own, else the card's defaults).
    pub input_modes: Vec<String>,
    pub output_modes: Vec<String>,
}

impl Capability {
    /// The explicit timeout, else 1.5× the expected duration, else `default`.
    pub(crate) fn timeout_or(&self, default: std::time::Duration) -> std::time::Duration {
        match (self.timeout, self.expected_duration) {
            (Some(t), _) => t.get(),
            (None, Some(expected)) => expected.get().mul_f64(1.5),
            (None, None) => default,
        }
    }
}

/// The agent's name when the file gives none: in a pod, the pod's name.
fn name_from_environment() -> Name {
    let raw = ["POD_NAME", "HOSTNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_default();
    Name::sanitized(&raw, "agent")
}

impl AgentProfile {
    pub fn capability(&self, name: &str) -> Option<&Capability> {
        self.capabilities.iter().find(|c| c.name.as_str() == name)
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Requests that may wait for a concurrency slot; beyond this the sidecar answers 503 at once.
    pub capacity: usize,
    /// Longest a request waits in the queue before it is refused with 503.
    pub max_wait: HumanDuration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            capacity: 0,
            max_wait: HumanDuration::from_secs(1),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Capability {
    pub name: Name,
    /// Tag → proficiency in 0..1.
    #[serde(default)]
    pub tags: BTreeMap<String, Proficiency>,
    /// How long one call may take before the sidecar gives up (time to response headers).
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
    /// How long a call usually takes; without an explicit `timeout`, the timeout is 1.5× this
    /// (code generation and retrieval must not share one number).
    #[serde(default)]
    pub expected_duration: Option<HumanDuration>,
    /// Which weight set scores calls that do not say (`reach-mode`).
    #[serde(default)]
    pub mode: RouteMode,
    /// A declared cost added to the score's cost term (e.g. a pricier model), ≥ 0.
    #[serde(default)]
    pub cost: Cost,
    /// The agent deduplicates this capability's work itself (across replicas): any request may be
    /// retried after a timeout or a 5xx, and a keyed one on any agent.
    #[serde(default)]
    pub idempotent: bool,
    #[serde(default)]
    pub probe: Option<ProbeSpec>,
    /// Path prefixes this capability serves on the agent (e.g. `/review`); calls for it to any
    /// other path are refused, so the agent's admin endpoints are not reachable through the
    /// inbound listener. Empty: every path (the least specific match; `docs/mtls.md`).
    #[serde(default)]
    pub paths: Vec<String>,
    /// The JSON Schema the agent's JSON answers must match (inline, or a file relative to this
    /// one): the callee's sidecar answers `502 invalid_output` for one that does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<OutputSchema>,
    /// Golden tasks compared with recorded baselines: an agent whose answers drift is
    /// `degraded` (`docs/reach-model.md`, "Quality and `degraded`").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualitySpec>,
    /// Set when the capability was imported from the agent's A2A card, never from a file.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub card: Option<SkillFacts>,
    /// The MCP server's tools, when the capability is its server's (`agent.mcp`).
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpTools>,
}

impl Capability {
    /// A capability with nothing declared but its name: every other field at its default.
    pub(crate) fn named(name: Name) -> Self {
        Self {
            name,
            tags: BTreeMap::new(),
            timeout: None,
            expected_duration: None,
            mode: RouteMode::Sync,
            cost: Cost(0.0),
            idempotent: false,
            probe: None,
            paths: Vec::new(),
            output_schema: None,
            quality: None,
            card: None,
            mcp: None,
        }
    }
}

/// `sync` (someone is waiting: latency first) or `async` (quality first).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RouteMode {
    #[default]
    Sync,
    Async,
}

impl RouteMode {
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "sync" => Some(RouteMode::Sync),
            "async" => Some(RouteMode::Async),
            _ => None,
        }
    }
}

/// A small real request through the agent's whole dependency chain.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    #[serde(
        default = "default_probe_method",
        deserialize_with = "scalar::http_method"
    )]
    pub method: String,
    /// Origin-form: starts with `/`.
    #[serde(deserialize_with = "scalar::http_path")]
    pub path: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default, deserialize_with = "scalar::http_headers")]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "default_expect_status")]
    pub expect_status: u16,
    /// A substring the response body must contain.
    #[serde(default)]
    pub expect_body: Option<String>,
    /// A value the JSON response must hold at a JSON pointer, e.g. `{pointer: /ok, value: true}`.
    #[serde(default)]
    pub expect_json: Option<ExpectJson>,
    #[serde(default)]
    pub interval: Option<HumanDuration>,
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExpectJson {
    pub pointer: String,
    pub value: serde_json::Value,
}

fn default_probe_method() -> String {
    "GET".to_owned()
}

fn default_expect_status() -> u16 {
    200
}

/// A peer sidecar known from the bootstrap file rather than from gossip.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StaticPeer {
    pub name: Name,
    /// The peer sidecar's inbound address (host:port).
    pub address: HostPort,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub region: String,
    pub capabilities: Vec<Name>,
    /// The SPIFFE ID the peer's certificate must carry; with mutual TLS on, it is called over
    /// TLS and refused if its certificate says otherwise.
    #[serde(default)]
    pub identity: Option<SpiffeId>,
}

fn unique_capabilities<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Capability>, D::Error> {
    let caps = Vec::<Capability>::deserialize(d)?;
    for (i, cap) in caps.iter().enumerate() {
        // `any.reach` asks for intent routing: a capability of that name could not be called.
        if cap.name.as_str() == super::ANY {
            return Err(de::Error::custom(format!(
                "capability `{}` is reserved for intent routing (`any.reach`)",
                super::ANY
            )));
        }
        if caps[..i].iter().any(|c| c.name == cap.name) {
            return Err(de::Error::custom(format!(
                "capability `{}` is declared twice",
                cap.name
            )));
        }
    }
    Ok(caps)
}

impl Bootstrap {
    /// Reads and compiles the schema files the capabilities name, relative to `base` (the
    /// bootstrap's directory). On failure: the capability, the path as written, and why.
    pub(super) fn resolve_schemas(
        &mut self,
        base: Option<&Path>,
    ) -> Result<(), (String, String, String)> {
        for cap in &mut self.agent.capabilities {
            if let Some(schema) = &mut cap.output_schema {
                let written = match schema.source() {
                    super::SchemaSource::File(p) => p.display().to_string(),
                    super::SchemaSource::Inline(_) => String::new(),
                };
                schema
                    .resolve(base)
                    .map_err(|e| (cap.name.to_string(), written, e))?;
            }
        }
        Ok(())
    }

    /// Makes the golden tasks' relative baseline paths relative to `base` (the bootstrap's
    /// directory). A missing baseline is not an error here: `check` reports it, and the runner
    /// skips the task until `agent-reach baseline record` writes it.
    pub(super) fn resolve_baselines(&mut self, base: Option<&Path>) {
        for cap in &mut self.agent.capabilities {
            if let Some(quality) = &mut cap.quality {
                quality.resolve(base);
            }
        }
    }

    /// A bootstrap for a sidecar on loopback with OS-assigned ports: what tests and the demo use.
    pub fn local(
        name: &str,
        agent: std::net::SocketAddr,
        capabilities: &[&str],
    ) -> Result<Self, String> {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let capabilities = capabilities
            .iter()
            .map(|c| Ok(Capability::named(Name::parse(c)?)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            listen: Listen {
                outbound: any,
                inbound: any,
                admin: any,
                intercept: Intercept::default(),
            },
            limits: Limits::default(),
            agent: AgentProfile {
                name: Name::parse(name)?,
                address: HostPort::parse(&agent.to_string())?,
                zone: String::new(),
                region: String::new(),
                max_concurrency: PositiveCount(16),
                rate_limit: None,
                queue: QueueConfig {
                    capacity: 16,
                    max_wait: HumanDuration::from_secs(1),
                },
                capabilities,
                a2a: None,
                mcp: None,
            },
            peers: Vec::new(),
            gossip: None,
            tls: None,
            watch_interval: default_watch_interval(),
            tracing: None,
            tasks: None,
            app_probes: Default::default(),
            drain_token: None,
        })
    }

    /// Turns gossip on, on a loopback UDP port chosen by the OS, joining through `seeds`.
    pub fn with_gossip(mut self, seeds: &[std::net::SocketAddr], key_file: PathBuf) -> Self {
        let seeds = seeds
            .iter()
            .filter_map(|s| HostPort::parse(&s.to_string()).ok())
            .collect();
        self.gossip = Some(GossipConfig::new(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            seeds,
            key_file,
        ));
        self
    }

    /// Adds a static peer (its sidecar's inbound address) serving `capabilities`.
    pub fn with_peer(
        mut self,
        name: &str,
        inbound: std::net::SocketAddr,
        capabilities: &[&str],
    ) -> Result<Self, String> {
        self.peers.push(StaticPeer {
            name: Name::parse(name)?,
            address: HostPort::parse(&inbound.to_string())?,
            zone: String::new(),
            region: String::new(),
            capabilities: capabilities
                .iter()
                .map(|c| Name::parse(c))
                .collect::<Result<_, _>>()?,
            identity: None,
        });
        Ok(self)
    }
}
