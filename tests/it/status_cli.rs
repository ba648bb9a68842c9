//! `agent-reach status`, black-box: the binary against a running caller sidecar (the table, the
//! JSON, `--watch` redrawing), and against a closed port (a clear message, a non-zero exit).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::*;
use testkit::MockConfig;

const BIN: &str = env!("CARGO_BIN_EXE_agent-reach");

/// `agent-reach status ARGS…`, run off the runtime's threads.
async fn status(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(BIN).arg("status").args(args).output().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_shows_the_agent_and_one_line_per_peer() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(call(&c, pair.outbound()).await.status, 200);
    }
    let admin = format!("http://{}", pair.caller.addrs.admin);

    let out = status(vec!["--admin".into(), admin.clone()]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("agent caller · "), "{stdout}");
    assert!(lines[0].contains("config gen 1"), "{stdout}");
    let header = lines.iter().position(|l| l.starts_with("PEER")).unwrap();
    for column in [
        "STATE",
        "CAP",
        "SCORE",
        "SUCCESS",
        "P50",
        "P95",
        "LAST TRANSITION",
    ] {
        assert!(lines[header].contains(column), "{stdout}");
    }
    let peer = lines[header + 1];
    assert!(peer.starts_with("coder-1 "), "{stdout}");
    assert!(peer.contains("100.0% (3/3)"), "{stdout}");
    assert_eq!(lines.len(), header + 2, "one line per peer: {stdout}");

    let out = status(vec!["--admin".into(), admin.clone(), "--json".into()]).await;
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["peer_views"][0]["name"], "coder-1");
    assert_eq!(doc["peer_views"][0]["outcomes"]["success"], 3);
    assert_eq!(doc["agent"]["name"], "caller");

    // --watch redraws until stopped: read two frames, then stop it.
    let mut child = Command::new(BIN)
        .args(["status", "--watch", "--admin", &admin])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let frames = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.contains("agent caller · "))
            .take(2)
            .count()
    });
    let frames = tokio::time::timeout(Duration::from_secs(15), frames).await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(frames.unwrap().unwrap(), 2, "two frames within 15 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_admin_port_is_a_clear_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = status(vec!["--admin".into(), format!("http://{closed}")]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the admin port at http://{closed}/status does not answer"
        )),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let out = status(vec!["--admin".into(), "https://x:1".into()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not an admin URL"),
        "{out:?}"
    );
}

// `agent-reach status | head -1`: the reader goes away before the table is written; the command
// ends quietly (it panicked on the broken pipe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_ends_it_quietly() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let admin = format!("http://{}", pair.caller.addrs.admin);
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(BIN)
            .args(["status", "--json", "--admin", &admin])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end before anything is written.
        drop(child.stdout.take());
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{stderr}");
}
