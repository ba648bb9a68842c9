//! Policy `chains` and the per-capability settings for delegation chains and slow first answers:
//! `capabilities.<name>.reentrant`, `first_event_timeout` and `hedge` (`docs/chains.md`).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

use super::duration::{parse_duration, HumanDuration};

/// Policy `chains`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ChainsPolicy {
    /// The most sidecar-to-sidecar hops a delegation chain may take; the call that would take
    /// one more is refused with `508 loop_detected`.
    pub max_hops: u32,
}

impl Default for ChainsPolicy {
    fn default() -> Self {
        Self { max_hops: 8 }
    }
}

/// `capabilities.<name>.hedge`: a second attempt, to another candidate, when the first has not
/// answered its head after `after` (default `p95`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HedgePolicy {
    pub after: HedgeAfter,
    /// Hedges per call (only 1 for now: the first head wins, the other is cancelled).
    pub max: u32,
}

impl Default for HedgePolicy {
    fn default() -> Self {
        Self {
            after: HedgeAfter::P95,
            max: 1,
        }
    }
}

/// When a hedge starts: a fixed wait, or the capability's recent p95 in this caller's view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeAfter {
    Fixed(HumanDuration),
    P95,
}

impl HedgeAfter {
    /// The wait, given the capability's recent p95 (`None` before any sample: then no hedge).
    pub(crate) fn wait(self, p95: Option<Duration>) -> Option<Duration> {
        match self {
            HedgeAfter::Fixed(d) => Some(d.get()),
            HedgeAfter::P95 => p95,
        }
    }
}

impl fmt::Display for HedgeAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HedgeAfter::Fixed(d) => write!(f, "{d}"),
            HedgeAfter::P95 => f.write_str("p95"),
        }
    }
}

impl Serialize for HedgeAfter {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HedgeAfter {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = HedgeAfter;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as `200ms`, or `p95`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HedgeAfter, E> {
                if v.trim() == "p95" {
                    return Ok(HedgeAfter::P95);
                }
                match parse_duration(v) {
                    Ok(d) if d.is_zero() => Err(E::custom(
                        "hedge.after must be above zero: a hedge at once doubles every call",
                    )),
                    Ok(d) => Ok(HedgeAfter::Fixed(HumanDuration(d))),
                    Err(e) => Err(E::custom(format!("{e}, or `p95`"))),
                }
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}
