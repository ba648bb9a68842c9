//! agent-reach: a sidecar proxy that knows whether an AI agent can take a task right now, and
//! routes each capability call to the peer best able to serve it.
//!
//! Start a sidecar in-process with [`Sidecar::start`]; the binary's `run` command does the same.

#![warn(missing_debug_implementations)]

pub(crate) mod a2a;
pub mod admin;
pub(crate) mod agent_request;
pub(crate) mod app;
pub(crate) mod budget;
pub(crate) mod chain;
pub(crate) mod classify;
pub mod config;
pub(crate) mod error;
pub(crate) mod fast_hash;
pub mod gossip;
pub mod http;
pub(crate) mod idempotency;
pub mod identity;
pub(crate) mod inbound;
pub mod inject;
pub mod intercept;
pub(crate) mod local;
pub mod mcp;
pub mod metrics;
pub mod outbound;
pub mod peers;
pub mod pki;
pub(crate) mod probe;
pub mod quality;
pub(crate) mod rate_limit;
pub mod reach;
pub(crate) mod redact;
pub mod registry;
pub(crate) mod runtime;
pub mod tasks;
pub mod trace;
pub mod transport;

pub use app::{BoundAddrs, Sidecar, StartError};
pub use config::{Bootstrap, ConfigStore, Policy};
pub use error::ReachError;
