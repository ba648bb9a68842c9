//! The binary: `check` reports file:line:col, `run` refuses an invalid file, and SIGTERM under
//! load drains without losing an accepted request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;
use testkit::{Latency, MockConfig};

const BIN: &str = env!("CARGO_BIN_EXE_agent-reach");

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agent-reach-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn check_accepts_the_example_configs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(BIN)
        .args([
            "check",
            &format!("{root}/config/agent-reach.yaml"),
            &format!("{root}/config/policy.yaml"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ok (bootstrap)") && stdout.contains("ok (policy)"),
        "{stdout}"
    );
}

#[test]
fn check_reports_file_line_and_column() {
    let bad = temp_file(
        "bad-bootstrap.yaml",
        "agent:\n  name: coder-1\n  address: 127.0.0.1:8080\n  max_concurrency: 0\n",
    );
    let out = Command::new(BIN).arg("check").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:4:20:", bad.display())),
        "{stderr}"
    );
    assert!(stderr.contains("max_concurrency"), "{stderr}");

    let typo = temp_file("bad-policy.yaml", "timeouts:\n  conect: 1s\n");
    let out = Command::new(BIN).arg("check").arg(&typo).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:2:3: timeouts: unknown field `conect`",
            typo.display()
        )),
        "{stderr}"
    );
}

/// `agent-reach check FILE`: its exit code and stderr.
fn check(path: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(BIN).arg("check").arg(path).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const AGENT: &str = "agent:\n  name: coder-1\n  address: 127.0.0.1:8080\n  max_concurrency: 1\n";

#[test]
fn check_refuses_non_finite_and_out_of_range_numbers_where_they_are_written() {
    let cases = [
        // A NaN retry ratio used to pass and make every outbound call panic.
        ("nan.yaml", "retry:\n  budget: { ratio: .nan }\n".to_owned(), "2:20: retry.budget.ratio:"),
        ("inf.yaml", "zones:\n  cross_zone_cost: .inf\n".to_owned(), "2:20: zones.cross_zone_cost:"),
        ("ttl.yaml", "retry:\n  budget: { ttl: 5m }\n".to_owned(), "2:18: retry.budget.ttl:"),
        (
            "weight.yaml",
            "weights:\n  sync: { availability: -1, capability_match: 0.3, cost: 0.6, saturation: 0.8 }\n"
                .to_owned(),
            "2:25: weights.sync.availability:",
        ),
        (
            "chain.yaml",
            "retry:\n  fallback:\n    chain_length: 9\n".to_owned(),
            "3:19: retry.fallback.chain_length:",
        ),
        // Used to be read as 1.
        (
            "connections.yaml",
            format!("limits:\n  max_connections: 0\n{AGENT}"),
            "2:20: limits.max_connections:",
        ),
        (
            "burst.yaml",
            format!("{AGENT}  rate_limit: {{ per_second: 20, burst: 0 }}\n"),
            "5:40: agent.rate_limit.burst:",
        ),
        (
            "tags.yaml",
            format!("{AGENT}  capabilities: [ {{ name: c, tags: {{ py: .nan }} }} ]\n"),
            "5:42: agent.capabilities[0].tags.py:",
        ),
        (
            "outbound.yaml",
            format!("listen: {{ outbound: 0.0.0.0:4140 }}\n{AGENT}"),
            "1:21: listen.outbound: `0.0.0.0:4140` is not a loopback address",
        ),
    ];
    for (name, text, expected) in cases {
        let path = temp_file(name, &text);
        let (code, stderr) = check(&path);
        assert_eq!(code, Some(1), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{}:{expected}", path.display())),
            "{name}: {stderr}"
        );
    }
}

#[test]
fn check_refuses_a_file_cut_short_and_takes_an_empty_one() {
    let root = env!("CARGO_MANIFEST_DIR");
    let example = std::fs::read_to_string(format!("{root}/config/agent-reach.yaml")).unwrap();
    // Cut in half (here mid flow mapping), mid quoted string, or after a key whose value never
    // came: each an error, never the defaults.
    let middle = example.len() / 2;
    let flow = middle + example[middle..].find("{ ").unwrap() + 3;
    let half = &example[..flow];
    let mid_string = &example[..example.find("\"max_tokens").unwrap()];
    let at = example.find("  capabilities:").unwrap();
    let no_value = format!("{}  capabilities:\n", &example[..at]);
    let no_section = "timeouts:\n  connect: 1s\nretry:\n";
    let cases = [
        ("half.yaml", half, None),
        ("mid-string.yaml", mid_string, None),
        (
            "no-value.yaml",
            &no_value,
            Some("agent.capabilities: has no value"),
        ),
        (
            "no-section.yaml",
            no_section,
            Some("3:7: retry: has no value"),
        ),
    ];
    for (name, text, expected) in cases {
        let path = temp_file(name, text);
        let (code, stderr) = check(&path);
        assert_eq!(code, Some(1), "{name}: {stderr}");
        // Every error names the file, line and column.
        let prefix = format!("{}:", path.display());
        let position = stderr.strip_prefix(&prefix).and_then(|rest| {
            rest.split(':')
                .take(2)
                .map(|n| n.parse::<u32>().ok())
                .collect::<Option<Vec<_>>>()
        });
        assert!(position.is_some(), "{name}: {stderr}");
        if let Some(expected) = expected {
            assert!(stderr.contains(expected), "{name}: {stderr}");
        }
    }
    let empty = temp_file("empty.yaml", "");
    let (code, stderr) = check(&empty);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn run_refuses_to_start_with_an_invalid_file() {
    let bad = temp_file(
        "bad-run.yaml",
        "agent:\n  name: coder-1\n  address: nowhere\n  max_concurrency: 1\n",
    );
    let out = Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:3:12:", bad.display())),
        "{stderr}"
    );
}

/// Reads the bound addresses from the sidecar's start-up log line.
fn bound_addr(line: &str, key: &str) -> Option<SocketAddr> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    line[start..].split_whitespace().next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_no_accepted_request() {
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(Duration::from_millis(700));
    let agent = mock(config).await;
    let bootstrap = temp_file(
        "drain.yaml",
        &format!(
            "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\n\
             limits: {{ drain_timeout: 20s }}\n\
             agent:\n  name: coder-1\n  address: {}\n  max_concurrency: 64\n  capabilities: [ {{ name: {CAP} }} ]\n",
            agent.addr
        ),
    );
    let mut command = Command::new(BIN);
    command.args(["run", "--config"]).arg(&bootstrap);
    let (mut child, rx) = logging(command);
    let inbound = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the sidecar logs its start");
        if let Some(addr) = bound_addr(&line, "inbound") {
            break addr;
        }
    };

    let url = format!("http://{inbound}/review");
    let calls = spawn_posts(20, &url, &[("reach-capability", CAP)], "work");
    eventually(
        Duration::from_secs(10),
        "all 20 calls are with the agent",
        || async { agent.stats().in_flight == 20 },
    )
    .await;

    // The shell's builtin `kill`: no procps needed on a bare machine.
    let killed = Command::new("sh")
        .args(["-c", &format!("kill -TERM {}", child.id())])
        .status()
        .unwrap();
    assert!(killed.success());
    // New connections are refused soon after the signal…
    eventually(Duration::from_secs(10), "the listener closes", || async {
        tokio::net::TcpStream::connect(inbound).await.is_err()
    })
    .await;
    // …while every accepted request completes.
    for call in calls {
        let reply = call.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// `AGENT_REACH_LOG_FORMAT=json`: every log line is one JSON object, and the decision log's
/// choice and outcome are fields of their own (not a JSON string inside the message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_by_env_carry_the_decision_as_fields() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let bootstrap = temp_file(
        "json-logs.yaml",
        &format!(
            "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\n\
             agent:\n  name: caller\n  address: 127.0.0.1:9\n  max_concurrency: 4\n  capabilities: []\n\
             peers:\n  - {{ name: coder-1, address: {}, capabilities: [{CAP}] }}\n",
            pair.callee.addrs.inbound
        ),
    );
    let policy = temp_file("json-logs-policy.yaml", "decision_log: true\n");
    let mut command = Command::new(BIN);
    command
        .args(["run", "--config"])
        .arg(&bootstrap)
        .arg("--policy")
        .arg(&policy)
        .env("AGENT_REACH_LOG_FORMAT", "json")
        .env_remove("RUST_LOG");
    let (mut child, rx) = logging(command);
    let next = || {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a log line within 20 s");
        let event: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|err| panic!("not a JSON line ({err}): {line}"));
        event
    };
    let outbound: SocketAddr = loop {
        let event = next();
        if let Some(addr) = event["outbound"].as_str() {
            break addr.parse().unwrap();
        }
    };

    let reply = call(&client(), outbound).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let decision = loop {
        let event = next();
        if event["target"] == "agent_reach::decision" {
            break event;
        }
    };
    let _ = Command::new("sh")
        .args(["-c", &format!("kill -TERM {}", child.id())])
        .status();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;

    assert_eq!(decision["capability"], CAP, "{decision}");
    assert_eq!(decision["chosen"], "coder-1", "{decision}");
    assert_eq!(decision["attempt"], 1, "{decision}");
    assert_eq!(decision["status"], 200, "{decision}");
    assert_eq!(decision["direction"], "outbound", "{decision}");
    assert!(decision["score"].is_number(), "{decision}");
    let candidates: serde_json::Value =
        serde_json::from_str(decision["candidates"].as_str().unwrap()).unwrap();
    assert_eq!(candidates[0]["peer"], "coder-1", "{decision}");
}

/// Starts `command` with its log read line by line on a thread (which also keeps the pipe from
/// filling): the receiver gets each line, to wait for one with a deadline.
fn logging(mut command: Command) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = command
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}
