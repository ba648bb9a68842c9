//! The fleet policy file: timeouts and connection pooling now; weights, state machine and retries later.

use serde::{Deserialize, Serialize};

use super::duration::HumanDuration;

/// `config/policy.yaml`, shared by the fleet. Every field has a default, so an empty file is valid.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub timeouts: Timeouts,
    pub pool: Pool,
}

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

/// Upstream connection pool. Read at start-up: the pool is built once.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Pool {
    /// An idle pooled connection is closed after this long.
    pub idle_timeout: HumanDuration,
    /// Idle connections kept per upstream address.
    pub max_idle_per_host: usize,
    /// TCP keepalive probes on upstream connections, so a half-open peer is noticed.
    pub tcp_keepalive: HumanDuration,
}

impl Default for Pool {
    fn default() -> Self {
        Self {
            idle_timeout: HumanDuration::from_secs(30),
            max_idle_per_host: 64,
            tcp_keepalive: HumanDuration::from_secs(15),
        }
    }
}
