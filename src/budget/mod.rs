//! The local agent's model budget, learned from its providers' answers (docs/model-budgets.md).
//!
//! Why: an agent whose `/healthz` answers but whose model account is nearly spent will fail its
//! next tasks with 429s. Providers say how much is left on every successful answer; reading it
//! lets callers move work away *before* the first 429, and agents on one account
//! (`budget_group:`) share what the first of them learns.
//!
//! `headers` reads one answer; `learn` keeps each external target's state and projects its
//! headroom; `shared` is the callers' side: the freshest state of each group, bounded in age;
//! `usage` counts the tokens the answers report.

pub(crate) mod headers;
mod learn;
pub(crate) mod shared;
pub(crate) mod usage;

pub(crate) use learn::{Answer, Headroom, ModelBudgets, LIMITED_BELOW};

use serde::{Deserialize, Serialize};

/// Tokens an answer reported, and for which model: read by `usage`, spent by `learn`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) input: u64,
    pub(crate) output: u64,
    pub(crate) model: Option<String>,
}

/// What an agent publishes about one budget: its own targets' (folded into one, `group: None`)
/// or one group's. Without `figure` it only says it belongs to the group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PublishedBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figure: Option<Figure>,
    /// The credential the figure was learned with ([`credential`]): a group's figures are
    /// shared only among members on the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) credential: Option<u64>,
}

/// The request headers that carry a model provider's key, in the order they are looked for.
const CREDENTIAL_HEADERS: [&str; 4] = ["authorization", "x-api-key", "api-key", "x-goog-api-key"];

/// The account behind a model call: a fingerprint of the key its request carries (SHA-256 of
/// the key under a fixed label, 64 bits of it), never the key. A budget is learned per
/// credential, so one exhausted key of another account teaches nothing about this one's.
pub(crate) fn credential(request: &http::HeaderMap) -> Option<u64> {
    let key = CREDENTIAL_HEADERS
        .iter()
        .find_map(|name| request.get(*name))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"agent-reach model credential\0");
    ctx.update(key.as_bytes());
    let digest = ctx.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(digest.as_ref().get(..8)?);
    Some(u64::from_be_bytes(first))
}

/// A learned budget as it stood when published: its headroom (0..1), how long until it resets
/// and how old the answer it was learned from is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub headroom: f64,
    pub(crate) reset_in_s: f64,
    pub(crate) age_s: f64,
}

impl Figure {
    /// The headroom `elapsed` after it was published: whole again once its reset has passed.
    pub(crate) fn headroom_after(&self, elapsed: std::time::Duration) -> f64 {
        if elapsed.as_secs_f64() >= seconds(self.reset_in_s) {
            1.0
        } else if self.headroom.is_finite() {
            self.headroom.clamp(0.0, 1.0)
        } else {
            1.0
        }
    }
}

/// Seconds as a peer published them, made safe: within 0..[`headers::MAX_BLOCK`], NaN as 0.
pub(crate) fn seconds(s: f64) -> f64 {
    let max = headers::MAX_BLOCK.as_secs_f64();
    if s.is_nan() {
        0.0
    } else {
        s.clamp(0.0, max)
    }
}
