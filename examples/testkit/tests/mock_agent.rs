//! The `mock-agent` binary as the process fleets run it: it says where it listens, answers
//! `/healthz` 200 in every mode, and switches to fake-online (business calls 429) on
//! `PUT /admin/mode`. Having this test also makes `cargo test --workspace` build the binary
//! before any test runs, so the fleets of processes find it (`testkit::bins`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};

/// One HTTP/1.0 exchange: the status and the body.
fn exchange(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

#[test]
fn the_binary_serves_and_goes_fake_online_on_demand() {
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

    assert_eq!(exchange(addr, "POST", "/review", "{}").0, 200);
    assert_eq!(exchange(addr, "PUT", "/admin/mode", "rate-limited").0, 200);
    assert_eq!(exchange(addr, "POST", "/review", "{}").0, 429);
    assert_eq!(exchange(addr, "GET", "/healthz", "").0, 200);
    let _ = child.kill();
    let _ = child.wait();
}
