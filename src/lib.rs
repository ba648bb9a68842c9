//! agent-reach: a sidecar proxy that knows whether an AI agent can take a task right now, and
//! routes each capability call to the peer best able to serve it.
//!
//! Start a sidecar in-process with [`Sidecar::start`]; the binary's `run` command does the same.

#![warn(missing_debug_implementations)]

// The gossip fleet harness (`tests/it/support/gossip_fleet.rs`) names the crate as the
// black-box tests do; the unit tests include it by path.
#[cfg(test)]
extern crate self as agent_reach;

pub mod a2a;
pub mod admin;
pub mod agent_request;
pub mod app;
pub mod budget;
pub mod chain;
pub mod classify;
pub mod config;
pub mod error;
pub mod fast_hash;
pub mod gossip;
pub mod http;
pub mod idempotency;
pub mod identity;
pub mod inbound;
pub mod intercept;
pub mod local;
pub mod mcp;
pub mod metrics;
pub mod outbound;
pub mod peers;
pub mod pki;
pub mod probe;
pub mod quality;
pub mod rate_limit;
pub mod reach;
pub mod redact;
pub mod registry;
pub mod runtime;
pub mod tasks;
pub mod trace;
pub mod transport;

pub use app::{BoundAddrs, Sidecar, StartError};
pub use config::{Bootstrap, ConfigStore, Policy};
pub use error::ReachError;
