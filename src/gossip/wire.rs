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

    mod properties {
        use proptest::collection::{btree_map, vec};
        use proptest::prelude::*;

        use super::*;

        fn node() -> impl Strategy<Value = NodeId> {
            (any::<[u8; 4]>(), any::<u16>(), any::<u64>()).prop_map(|(ip, port, epoch)| NodeId {
                addr: SocketAddr::from((ip, port)),
                epoch,
            })
        }

        fn capability() -> impl Strategy<Value = WireCapability> {
            let mode = prop_oneof![Just(RouteMode::Sync), Just(RouteMode::Async)];
            (
                "[a-z-]{0,16}",
                btree_map("[a-z]{0,8}", any::<u16>(), 0..4),
                any::<u64>(),
                mode,
                any::<u32>(),
                any::<bool>(),
            )
                .prop_map(|(name, tags, timeout_ms, mode, cost_milli, idempotent)| {
                    WireCapability {
                        name,
                        tags,
                        timeout_ms,
                        mode,
                        cost_milli,
                        idempotent,
                    }
                })
        }

        fn profile() -> impl Strategy<Value = Profile> {
            (
                ".{0,24}",
                ".{0,8}",
                ".{0,8}",
                any::<u32>(),
                vec(capability(), 0..4),
                ".{0,8}",
            )
                .prop_map(
                    |(inbound, zone, region, max_concurrency, capabilities, version)| Profile {
                        inbound,
                        zone,
                        region,
                        max_concurrency,
                        capabilities,
                        version,
                    },
                )
        }

        fn live() -> impl Strategy<Value = Live> {
            let figures = (any::<u64>(), any::<u32>(), any::<[u16; 3]>());
            let latencies = any::<[Option<u32>; 3]>();
            let rest = (any::<[bool; 2]>(), any::<[u32; 2]>());
            let state = prop::sample::select(State::ALL.to_vec());
            (state, figures, latencies, rest).prop_map(
                |(state, (profile_seq, state_age_s, [cap, availability, saturation]), l, r)| Live {
                    profile_seq,
                    state,
                    state_age_s,
                    cap,
                    availability,
                    saturation,
                    latency_ms: l[0],
                    p50_ms: l[1],
                    p95_ms: l[2],
                    busy: r.0[0],
                    cooling_down: r.0[1],
                    in_flight: r.1[0],
                    queued: r.1[1],
                },
            )
        }

        fn item() -> impl Strategy<Value = Item> {
            let body = prop_oneof![
                profile().prop_map(Body::Profile),
                live().prop_map(Body::Live)
            ];
            (".{0,24}", node(), any::<u64>(), body).prop_map(|(name, node, seq, body)| Item {
                name,
                node,
                seq,
                body,
            })
        }

        proptest! {
            #[test]
            fn an_item_round_trips(item in item()) {
                let bytes = encode(&item);
                prop_assert!(bytes.is_ok());
                let back = decode::<Item>(&bytes.unwrap_or_default());
                prop_assert_eq!(back.ok(), Some(item));
            }

            #[test]
            fn a_batch_of_items_round_trips(items in vec(item(), 0..4)) {
                let bytes = encode(&items).unwrap_or_default();
                prop_assert_eq!(decode::<Vec<Item>>(&bytes).ok(), Some(items));
            }

            #[test]
            fn arbitrary_bytes_decode_or_give_an_error(bytes in vec(any::<u8>(), 0..1400)) {
                // Decoding returns (never panics, never allocates past the input); an `Ok` is a
                // value that encodes again.
                if let Ok(item) = decode::<Item>(&bytes) {
                    prop_assert!(encode(&item).is_ok());
                }
                let _ = decode::<Vec<Item>>(&bytes);
                let _ = decode::<NodeId>(&bytes);
            }

            #[test]
            fn a_damaged_item_decodes_or_gives_an_error(
                item in item(),
                cut in any::<prop::sample::Index>(),
                flip in any::<prop::sample::Index>(),
                bits in 1u8..=255,
            ) {
                let mut bytes = encode(&vec![item]).unwrap_or_default();
                let at = flip.index(bytes.len());
                bytes[at] ^= bits;
                bytes.truncate(cut.index(bytes.len() + 1));
                let _ = decode::<Vec<Item>>(&bytes);
                let _ = decode::<Item>(&bytes);
            }
        }
    }
}
