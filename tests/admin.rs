//! The admin port: metrics after traffic (valid for promtool), liveness, readiness, status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use agent_reach::mock_agent::MockConfig;
use support::*;

#[tokio::test]
async fn metrics_count_requests_after_traffic() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(call(&c, pair.outbound()).await.status, 200);
    }
    let unknown = send(
        &c,
        "GET",
        &format!("http://{}/", pair.outbound()),
        &[("reach-capability", "nope")],
        "",
    )
    .await;
    assert_eq!(unknown.status, 404);

    let caller = get(&c, &format!("http://{}/metrics", pair.caller.addrs.admin)).await;
    assert_eq!(caller.status, 200);
    let text = &caller.body;
    assert!(
        text.contains(r#"reach_requests_total{direction="outbound",capability="code-review",peer="coder-1",outcome="success"} 3"#),
        "{text}"
    );
    assert!(
        // A name nobody serves is labelled `unknown`: typed names must not grow the series.
        text.contains(r#"reach_no_candidate_total{capability="unknown"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("# TYPE reach_request_duration_seconds histogram"),
        "{text}"
    );

    let callee = get(&c, &format!("http://{}/metrics", pair.callee.addrs.admin))
        .await
        .body;
    assert!(
        callee.contains(r#"reach_requests_total{direction="inbound",capability="code-review",peer="local",outcome="success"} 3"#),
        "{callee}"
    );
    assert!(callee.contains("reach_inbound_in_flight 0"), "{callee}");
    assert!(
        callee.contains("reach_inbound_time_to_first_byte_seconds_bucket"),
        "{callee}"
    );
    promtool_accepts(&callee);
    promtool_accepts(text);
}

/// `promtool check metrics` when promtool is installed (`.ci/run` installs it).
fn promtool_accepts(text: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not installed: skipping the exposition-format check");
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}\n{text}"
    );
}

#[tokio::test]
async fn live_ready_and_status() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let c = client();
    let admin = pair.caller.addrs.admin;
    assert_eq!(get(&c, &format!("http://{admin}/live")).await.status, 200);
    assert_eq!(get(&c, &format!("http://{admin}/ready")).await.status, 200);
    assert_eq!(get(&c, &format!("http://{admin}/nope")).await.status, 404);

    assert_eq!(call(&c, pair.outbound()).await.status, 200);
    let status = get(&c, &format!("http://{}/status", pair.callee.addrs.admin))
        .await
        .json();
    assert_eq!(status["agent"]["name"], "coder-1");
    assert_eq!(status["agent"]["capabilities"][0]["name"], CAP);
    assert_eq!(status["inbound"]["requests"], 1);
    assert_eq!(status["inbound"]["successes"], 1);
    assert_eq!(status["load"]["in_flight"], 0);
    assert_eq!(status["ready"], true);

    let caller = get(&c, &format!("http://{admin}/status")).await.json();
    assert_eq!(caller["peers"][0]["name"], "coder-1");
    assert_eq!(caller["peers"][0]["capabilities"][0], CAP);
}
