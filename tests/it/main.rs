//! The black-box tests, one binary: real listeners on 127.0.0.1:0, mock agents, sidecars
//! in-process or as the built binary; a module per area. One binary links the library once
//! (35 did, each linking all of it). `cargo test --test it <module>::` runs one area.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

// The binary's mock agent, demo fleet and injector (src/bin/agent-reach), which these tests drive
// in-process, and the terminal client with `agent-reach status`'s rendering: included by path at
// the crate root, as in the binary, so their `crate::` paths resolve; their unit tests run here
// (the binary's test target is off). Each user leaves some of their items unused.
#[path = "../../src/bin/agent-reach/blocking.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod blocking;
#[path = "../../src/bin/agent-reach/demo/mod.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod demo;
#[path = "../../src/bin/agent-reach/inject/mod.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod inject;
#[path = "../../src/bin/agent-reach/mock_agent/mod.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod mock_agent;
#[path = "../../src/bin/agent-reach/commands/status.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod status;

mod a2a_cards;
mod admin;
mod affinity;
mod budget;
mod chains;
mod chaos;
mod claims;
mod cli;
mod demo_command;
mod external;
mod faults;
mod gossip;
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
