//! What travels inside the envelope besides SWIM: each node's identity, profile and live view.
//! Encoded with postcard (compact, no field names); fractions are quantized to 1/1000.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::RouteMode;
use crate::reach::State;

/// A member as SWIM knows it: its gossip address, and an epoch that grows with every start (and
/// every rejoin after being declared down), so a restarted sidecar replaces its old self.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeId {
    pub addr: SocketAddr,
    pub epoch: u64,
}

impl foca::Identity for NodeId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            addr: self.addr,
            epoch: self.epoch.wrapping_add(1),
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.epoch > adversary.epoch
    }
}

/// One published fact about one agent. `seq` grows with every item a node publishes, so the
/// newest of each kind wins and an old one played back changes nothing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub name: String,
    pub node: NodeId,
    pub seq: u64,
    pub body: Body,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Body {
    Profile(Profile),
    Live(Live),
}

impl Item {
    pub fn kind(&self) -> ItemKind {
        match self.body {
            Body::Profile(_) => ItemKind::Profile,
            Body::Live(_) => ItemKind::Live,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemKind {
    Profile,
    Live,
}

/// What an agent is: changes rarely (a config reload), sent on change and on request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// The sidecar's inbound address, where peers send work.
    pub inbound: String,
    pub zone: String,
    pub region: String,
    pub max_concurrency: u32,
    pub capabilities: Vec<WireCapability>,
    /// The sidecar's version.
    pub version: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireCapability {
    pub name: String,
    /// Tag → proficiency in thousandths.
    pub tags: BTreeMap<String, u16>,
    pub timeout_ms: u64,
    pub mode: RouteMode,
    /// Declared cost in thousandths.
    pub cost_milli: u32,
    pub idempotent: bool,
}

/// How the agent is doing now, as its own sidecar sees it: small, sent often.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Live {
    /// The `seq` of the profile this view goes with: a receiver without it asks for it.
    pub profile_seq: u64,
    pub state: State,
    pub state_age_s: u32,
    /// Fractions in thousandths.
    pub cap: u16,
    pub availability: u16,
    pub saturation: u16,
    pub latency_ms: Option<u32>,
    pub p50_ms: Option<u32>,
    pub p95_ms: Option<u32>,
    pub busy: bool,
    pub cooling_down: bool,
    pub in_flight: u32,
    pub queued: u32,
}

/// 0..1 → thousandths, clamped (NaN is 0).
pub fn milli(x: f64) -> u16 {
    if x.is_finite() {
        (x.clamp(0.0, 1.0) * 1000.0).round() as u16
    } else {
        0
    }
}

/// Thousandths → 0..1, clamped (a hostile 65535 is 1).
pub fn unmilli(x: u16) -> f64 {
    f64::from(x.min(1000)) / 1000.0
}

/// Bytes that are not a well-formed item (or a value that cannot be encoded).
#[derive(Debug, thiserror::Error)]
#[error("gossip wire format: {0}")]
pub struct WireError(#[from] postcard::Error);

pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, WireError> {
    Ok(postcard::to_allocvec(value)?)
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, WireError> {
    Ok(postcard::from_bytes(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_item_is_small() {
        let item = Item {
            name: "coder-2".into(),
            node: NodeId {
                addr: "10.1.2.3:4190"
                    .parse()
                    .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
                epoch: 1_764_489_600_123,
            },
            seq: 1234,
            body: Body::Live(Live {
                profile_seq: 1,
                state: State::Healthy,
                state_age_s: 120,
                cap: 1000,
                availability: 990,
                saturation: 250,
                latency_ms: Some(40),
                p50_ms: Some(38),
                p95_ms: Some(90),
                busy: false,
                cooling_down: false,
                in_flight: 3,
                queued: 0,
            }),
        };
        let bytes = encode(&item).unwrap_or_default();
        assert!(bytes.len() < 64, "{} bytes", bytes.len());
        assert_eq!(decode::<Item>(&bytes).ok(), Some(item));
    }

    #[test]
    fn garbage_does_not_decode() {
        assert!(decode::<Item>(&[0xff; 40]).is_err());
        assert!(decode::<Item>(&[]).is_err());
    }

    #[test]
    fn fractions_are_clamped_both_ways() {
        assert_eq!(milli(f64::NAN), 0);
        assert_eq!(milli(2.0), 1000);
        assert_eq!(unmilli(u16::MAX), 1.0);
    }
}
