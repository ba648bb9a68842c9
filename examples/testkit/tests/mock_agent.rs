//! The `mock-agent` binary as the process fleets run it: it says where it listens, answers
//! `/healthz` 200 in every mode, and switches to fake-online (business calls 429) on
//! `PUT /admin/mode`. Having this test also makes `cargo test --workspace` build the binary
//! before any test runs, so the fleets of processes find it (`testkit::bins`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use testkit::chaos::net;

/// The status of one call to the mock agent.
async fn status(addr: SocketAddr, method: &str, path: &str, body: &str) -> u16 {
    let deadline = Duration::from_secs(5);
    let answer = net::call(addr, method, path, &[], body.to_owned(), deadline).await;
    answer.unwrap().status
}

#[tokio::test]
async fn the_binary_serves_and_goes_fake_online_on_demand() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-agent"))
        .args(["--listen", "127.0.0.1:0", "--name", "probe-me"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // "mock agent `probe-me` on http://127.0.0.1:PORT (mode normal, latency 5ms)"
    let addr: SocketAddr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .parse()
        .unwrap();

    assert_eq!(status(addr, "POST", "/review", "{}").await, 200);
    assert_eq!(
        status(addr, "PUT", "/admin/mode", "rate-limited").await,
        200
    );
    assert_eq!(status(addr, "POST", "/review", "{}").await, 429);
    assert_eq!(status(addr, "GET", "/healthz", "").await, 200);
    let _ = child.kill();
    let _ = child.wait();
}
