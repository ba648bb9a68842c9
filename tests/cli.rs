//! The binary: `check` reports file:line:col, `run` refuses an invalid file, and SIGTERM under
//! load drains without losing an accepted request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use agent_reach::mock_agent::{Latency, MockConfig};
use support::*;

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
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&bootstrap)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Read the log on a thread (it also keeps the pipe from filling), with a deadline for the start line.
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
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
