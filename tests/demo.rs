//! `agent-reach demo --json` runs the fleet and reports per-agent and total counters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn demo_json_reports_every_agent_and_the_total() {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(["demo", "--duration", "1s", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let agents = summary["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 3);
    let mut served = 0;
    for agent in agents {
        for key in [
            "name",
            "requests",
            "successes",
            "failures",
            "p50_ms",
            "p95_ms",
        ] {
            assert!(!agent[key].is_null(), "missing {key}: {agent}");
        }
        assert!(
            agent["requests"].as_u64().unwrap() > 0,
            "every agent got traffic: {agent}"
        );
        served += agent["requests"].as_u64().unwrap();
    }
    let total = &summary["total"];
    assert!(total["requests"].as_u64().unwrap() > 0);
    assert_eq!(
        total["requests"].as_u64().unwrap(),
        served,
        "the caller's calls all reached an agent"
    );
    assert_eq!(total["failures"], 0);
}

#[test]
fn demo_prints_a_table() {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-reach"))
        .args(["demo", "--duration", "500ms"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "agent",
        "requests",
        "p95 ms",
        "coder-1",
        "coder-2",
        "coder-3",
        "caller saw",
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
}
