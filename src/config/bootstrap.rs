//! The per-agent bootstrap file: listeners, limits, the local agent's profile and static peers.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use serde::{de, Deserialize, Deserializer, Serialize};

use super::duration::HumanDuration;

/// `config/agent-reach.yaml`. Listener addresses and limits need a restart; the rest hot-reloads.
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
    /// How often the config files are checked for changes.
    #[serde(default = "default_watch_interval")]
    pub watch_interval: HumanDuration,
}

fn default_watch_interval() -> HumanDuration {
    HumanDuration::from_secs(1)
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            outbound: SocketAddr::from(([127, 0, 0, 1], 4140)),
            inbound: SocketAddr::from(([0, 0, 0, 0], 4143)),
            admin: SocketAddr::from(([0, 0, 0, 0], 4191)),
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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_header_bytes: HeaderBytes(64 * 1024),
            header_read_timeout: HumanDuration::from_secs(10),
            drain_timeout: HumanDuration::from_secs(30),
        }
    }
}

/// What the local agent is and what it can do; published to peers.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
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
    #[serde(default, deserialize_with = "unique_capabilities")]
    pub capabilities: Vec<Capability>,
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
    /// Which weight set scores calls that do not say (`reach-mode`).
    #[serde(default)]
    pub mode: RouteMode,
    /// A declared cost added to the score's cost term (e.g. a pricier model), ≥ 0.
    #[serde(default)]
    pub cost: Cost,
    #[serde(default)]
    pub probe: Option<ProbeSpec>,
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
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "sync" => Some(RouteMode::Sync),
            "async" => Some(RouteMode::Async),
            _ => None,
        }
    }
}

/// A non-negative declared cost.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, PartialOrd)]
#[serde(transparent)]
pub struct Cost(pub f64);

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor("a cost of at least 0", |value: f64| {
            if value >= 0.0 && value.is_finite() {
                Ok(Self(value))
            } else {
                Err(format!("cost {value} must be a number of at least 0"))
            }
        }))
    }
}

/// A small real request through the agent's whole dependency chain.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    #[serde(default = "default_probe_method")]
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
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
}

// === validated scalars: each checks itself while parsing, so its error carries line and column ===

/// A name usable as a DNS label: lowercase letters, digits and `-` (it appears in `<name>.reach`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(transparent)]
pub struct Name(String);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let ok = !text.is_empty()
            && text.len() <= 63
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !text.starts_with('-')
            && !text.ends_with('-');
        if ok {
            Ok(Self(text.to_owned()))
        } else {
            Err(format!(
                "`{text}` is not a valid name: use 1-63 lowercase letters, digits and `-`, not starting or ending with `-`"
            ))
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor("a name", Name::parse))
    }
}

/// `host:port`, where host is an IP address or a DNS name.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Hash)]
#[serde(transparent)]
pub struct HostPort(String);

impl HostPort {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not a host:port address");
        let authority: http::uri::Authority = text.parse().map_err(|_| bad())?;
        if authority.port_u16().is_none() || authority.host().is_empty() || text.contains('@') {
            return Err(bad());
        }
        Ok(Self(text.to_owned()))
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor("a host:port address", HostPort::parse))
    }
}

/// How good an agent is at a tag, from 0 (not at all) to 1 (expert).
#[derive(Clone, Copy, Debug, Serialize, PartialEq, PartialOrd)]
#[serde(transparent)]
pub struct Proficiency(f64);

impl Proficiency {
    pub fn get(self) -> f64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Proficiency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(d)?;
        if (0.0..=1.0).contains(&value) {
            Ok(Self(value))
        } else {
            Err(de::Error::custom(format!(
                "proficiency {value} must be between 0 and 1"
            )))
        }
    }
}

/// A count that must be at least 1.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct PositiveCount(usize);

impl PositiveCount {
    pub fn get(self) -> usize {
        self.0
    }
}

impl<'de> Deserialize<'de> for PositiveCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor("a whole number of at least 1", |value: f64| {
            if value >= 1.0 && value.fract() == 0.0 && value <= u32::MAX as f64 {
                Ok(Self(value as usize))
            } else {
                Err(format!("{value} must be a whole number of at least 1"))
            }
        }))
    }
}

fn unique_capabilities<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Capability>, D::Error> {
    let caps = Vec::<Capability>::deserialize(d)?;
    for (i, cap) in caps.iter().enumerate() {
        if caps[..i].iter().any(|c| c.name == cap.name) {
            return Err(de::Error::custom(format!(
                "capability `{}` is declared twice",
                cap.name
            )));
        }
    }
    Ok(caps)
}

/// A request-head size limit: at least 8 KiB (hyper's floor), at most 1 MiB.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct HeaderBytes(usize);

impl HeaderBytes {
    pub fn get(self) -> usize {
        self.0
    }
}

impl<'de> Deserialize<'de> for HeaderBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor("a byte count", |value: f64| {
            if (8192.0..=1048576.0).contains(&value) && value.fract() == 0.0 {
                Ok(Self(value as usize))
            } else {
                Err(format!(
                    "max_header_bytes {value} must be a whole number between 8192 and 1048576"
                ))
            }
        }))
    }
}

// Validation runs inside the visitor, while the parser still knows where the scalar is: an
// error raised after deserializing would point at the enclosing mapping instead.

pub(super) struct StrVisitor<F>(&'static str, F);

impl<T, F: FnOnce(&str) -> Result<T, String>> de::Visitor<'_> for StrVisitor<F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.1)(v).map_err(E::custom)
    }
}

pub(super) struct NumVisitor<F>(pub(super) &'static str, pub(super) F);

impl<T, F: FnOnce(f64) -> Result<T, String>> de::Visitor<'_> for NumVisitor<F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        (self.1)(v as f64).map_err(E::custom)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        (self.1)(v as f64).map_err(E::custom)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        (self.1)(v).map_err(E::custom)
    }
}

impl Bootstrap {
    /// A bootstrap for a sidecar on loopback with OS-assigned ports: what tests and the demo use.
    pub fn local(
        name: &str,
        agent: std::net::SocketAddr,
        capabilities: &[&str],
    ) -> Result<Self, String> {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let capabilities = capabilities
            .iter()
            .map(|c| {
                Ok(Capability {
                    name: Name::parse(c)?,
                    tags: BTreeMap::new(),
                    timeout: None,
                    mode: RouteMode::Sync,
                    cost: Cost(0.0),
                    probe: None,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            listen: Listen {
                outbound: any,
                inbound: any,
                admin: any,
            },
            limits: Limits::default(),
            agent: AgentProfile {
                name: Name::parse(name)?,
                address: HostPort::parse(&agent.to_string())?,
                zone: String::new(),
                region: String::new(),
                max_concurrency: PositiveCount(16),
                queue: QueueConfig {
                    capacity: 16,
                    max_wait: HumanDuration::from_secs(1),
                },
                capabilities,
            },
            peers: Vec::new(),
            watch_interval: default_watch_interval(),
        })
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
        });
        Ok(self)
    }
}

impl PositiveCount {
    pub fn new(value: usize) -> Option<Self> {
        (value >= 1).then_some(Self(value))
    }
}
