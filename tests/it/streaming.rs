//! Bodies stream through both sidecars without buffering: an SSE event reaches the caller while
//! the agent is still producing the stream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use http_body_util::BodyExt;
use support::*;
use testkit::MockConfig;

#[tokio::test]
async fn sse_events_arrive_before_the_stream_ends() {
    let mut config = MockConfig::new("coder-1");
    // The second event comes 30 s after the first: a buffering proxy would hold the first that long.
    config.sse_events = 2;
    config.sse_interval = Duration::from_secs(30);
    let pair = Pair::start(config).await;

    let request = http::Request::get(format!("http://{}/sse", pair.outbound()))
        .header("reach-capability", CAP)
        .body(agent_reach::http::body::empty())
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first event arrives long before the stream ends")
        .expect("a frame")
        .expect("no error");
    let text = String::from_utf8_lossy(first.data_ref().expect("data frame")).into_owned();
    assert!(text.contains("\"n\":0"), "{text}");
    // The agent is still mid-stream: its sidecar holds the concurrency slot.
    assert_eq!(pair.callee.status().load.in_flight, 1);
}

#[tokio::test]
async fn large_request_bodies_stream_to_the_agent() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let big = "x".repeat(3 * 1024 * 1024);
    let url = format!("http://{}/review", pair.outbound());
    let reply = send(&client(), "POST", &url, &[("reach-capability", CAP)], &big).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["received_bytes"], big.len());
}
