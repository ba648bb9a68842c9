//! Bounds against bad clients: slowloris heads, silent connections, oversized headers, malformed
//! requests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use agent_reach::config::{HumanDuration, Policy};
use agent_reach::Bootstrap;
use support::*;
use testkit::MockConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn pair_with_short_header_timeout() -> Pair {
    let agent = mock(MockConfig::new("coder-1")).await;
    let mut bootstrap = Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap();
    bootstrap.limits.header_read_timeout = HumanDuration::from_millis(300);
    let callee = sidecar(bootstrap).await;
    // The caller's pool lets idle connections go before the callee closes them, as the defaults
    // do (4 s against 10 s): otherwise a call may ride a connection the callee is closing.
    let mut policy = Policy::default();
    policy.pool.idle_timeout = HumanDuration::from_millis(100);
    let caller = sidecar_with(
        Bootstrap::local("caller", "127.0.0.1:9".parse().unwrap(), &[])
            .unwrap()
            .with_peer("coder-1", callee.addrs.inbound, &[CAP])
            .unwrap(),
        policy,
        Default::default(),
    )
    .await;
    Pair {
        agent,
        callee,
        caller,
    }
}

/// Reads until the server closes the connection; returns what it sent.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the server did not close the connection");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_slowloris_head_is_dropped() {
    let pair = pair_with_short_header_timeout().await;
    let mut stream = TcpStream::connect(pair.callee.addrs.inbound).await.unwrap();
    stream
        .write_all(b"GET /review HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let said = read_until_closed(&mut stream).await;
    assert!(
        said.is_empty() || said.starts_with("HTTP/1.1 408"),
        "{said}"
    );
    // The sidecar still serves others.
    assert_eq!(call(&client(), pair.outbound()).await.status, 200);
}

/// The deadline holds between requests too: a keep-alive connection that answered one call and
/// then trickles the next head is closed, and the first answer arrived whole.
#[tokio::test]
async fn a_slowloris_second_head_is_dropped() {
    let pair = pair_with_short_header_timeout().await;
    let mut stream = TcpStream::connect(pair.callee.addrs.inbound).await.unwrap();
    let first = format!("GET /review HTTP/1.1\r\nHost: x\r\nreach-capability: {CAP}\r\n\r\n");
    stream.write_all(first.as_bytes()).await.unwrap();
    stream
        .write_all(b"GET /review HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let said = read_until_closed(&mut stream).await;
    assert!(said.starts_with("HTTP/1.1 200"), "{said}");
    assert_eq!(said.matches("HTTP/1.1").count(), 1, "{said}");
}

#[tokio::test]
async fn a_silent_connection_is_dropped() {
    let pair = pair_with_short_header_timeout().await;
    let mut stream = TcpStream::connect(pair.callee.addrs.inbound).await.unwrap();
    let said = read_until_closed(&mut stream).await;
    assert!(said.is_empty(), "{said}");
}

#[tokio::test]
async fn an_oversized_header_gets_431() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let mut stream = TcpStream::connect(pair.outbound()).await.unwrap();
    let huge = "a".repeat(100 * 1024);
    let request = format!("GET / HTTP/1.1\r\nHost: code-review.reach\r\nX-Big: {huge}\r\n\r\n");
    // The server may close before reading all of it; the answer is what counts.
    let _ = stream.write_all(request.as_bytes()).await;
    let said = read_until_closed(&mut stream).await;
    assert!(said.starts_with("HTTP/1.1 431"), "{said}");
}

#[tokio::test]
async fn a_malformed_request_gets_400() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let mut stream = TcpStream::connect(pair.outbound()).await.unwrap();
    stream.write_all(b"THIS IS NOT HTTP\r\n\r\n").await.unwrap();
    let said = read_until_closed(&mut stream).await;
    assert!(said.starts_with("HTTP/1.1 400"), "{said}");
    assert_eq!(call(&client(), pair.outbound()).await.status, 200);
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_instead_of_failing() {
    // A lone sidecar: a caller's self-view poller would hold the only connection slot.
    let agent = mock(MockConfig::new("coder-1")).await;
    let mut bootstrap = agent_reach::Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap();
    bootstrap.limits.max_connections = 1;
    let callee = sidecar(bootstrap).await;
    // One idle connection holds the only slot…
    let held = TcpStream::connect(callee.addrs.inbound).await.unwrap();
    let inbound = callee.addrs.inbound;
    let waiting =
        tokio::spawn(async move { get(&client(), &format!("http://{inbound}/review")).await });
    // Give a wrong answer the chance to show: nothing may be served while the slot is held.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "a second connection was served past the limit"
    );
    assert_eq!(agent.stats().business, 0);
    // …until it goes away.
    drop(held);
    let reply = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, 200);
}
