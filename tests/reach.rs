//! The reachability model end to end: fake-online agents leave rotation, busy agents get no new
//! work, recovered agents ramp back in, probes report why they failed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use agent_reach::mock_agent::MockConfig;
use support::*;

#[tokio::test]
async fn a_caller_learns_its_peers_self_view() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    eventually(
        Duration::from_secs(10),
        "the caller has the peer's self-view",
        || async {
            let status = pair.caller.status();
            status
                .peer_views
                .first()
                .is_some_and(|p| p.self_view.is_some())
        },
    )
    .await;
}
