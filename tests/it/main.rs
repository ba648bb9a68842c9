//! The black-box tests, one binary: real listeners on 127.0.0.1:0, mock agents, sidecars
//! in-process or as the built binary; a module per area. One binary links the library once
//! (35 did, each linking all of it). `cargo test --test it <module>::` runs one area.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod a2a_cards;
mod admin;
mod affinity;
mod budget;
mod chains;
mod chaos;
mod claims;
mod cli;
mod external;
mod faults;
mod gossip;
mod gossip_fleet;
mod gossip_mem;
mod hostile;
mod idempotency;
mod injection;
mod intent_routing;
mod intercept;
mod layers;
mod layout;
mod limits;
mod local_backlog;
mod mcp_tools;
mod mtls;
mod observe;
mod output_validation;
mod overload;
mod peer_h2;
mod prediction;
mod probes;
mod prometheus;
mod quality;
mod reach;
mod reload;
mod resilience;
mod routing;
mod saturation;
mod scale_signal;
mod sdk;
mod sdk_js;
mod status_cli;
mod status_page;
mod streaming;
mod tasks;
mod tasks_durable;
mod tasks_redis;
mod traces;
mod zones;
