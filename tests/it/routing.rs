//! Capability calls through a caller sidecar → peer sidecar → mock agent, and the refusals that
//! keep the outbound listener from being an open proxy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::*;
use testkit::MockConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn routes_by_header_over_http1() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let reply = call(&client(), pair.outbound()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-agent"), "coder-1", "{reply:?}");
    assert_eq!(reply.json()["agent"], "coder-1");
    assert_eq!(
        reply.json()["received_bytes"],
        5,
        "the request body reached the agent"
    );
}

#[tokio::test]
async fn routes_by_capability_authority() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let url = format!("http://{}/review", pair.outbound());
    let reply = send(&client(), "GET", &url, &[("host", "code-review.reach")], "").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("reach-agent"), "coder-1", "{reply:?}");
}

#[tokio::test]
async fn routes_absolute_form_requests_as_http_proxy_clients_send_them() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    // What any client does with HTTP_PROXY=http://127.0.0.1:4140 and a URL http://code-review.reach/…
    let mut stream = tokio::net::TcpStream::connect(pair.outbound())
        .await
        .unwrap();
    stream
        .write_all(b"GET http://code-review.reach/review?q=1 HTTP/1.1\r\nHost: code-review.reach\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.contains("reach-agent: coder-1"), "{raw}");
    assert!(raw.contains("\"path\":\"/review\""), "{raw}");
}

#[tokio::test]
async fn routes_over_h2c_with_prior_knowledge() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<agent_reach::http::ReachBody>();
    let request = http::Request::post(format!("http://{}/review", pair.outbound()))
        .header("reach-capability", CAP)
        .body(agent_reach::http::body::full("x"))
        .unwrap();
    let response = h2.request(request).await.expect("h2c response");
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["reach-agent"], "coder-1");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("coder-1"));
}

#[tokio::test]
async fn refuses_unknown_capability_with_json() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let url = format!("http://{}/x", pair.outbound());
    let reply = send(
        &client(),
        "GET",
        &url,
        &[("reach-capability", "translate")],
        "",
    )
    .await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.header("reach-reason"), "unknown_capability");
    assert_eq!(reply.json()["error"], "unknown_capability");
    assert!(reply.json()["message"]
        .as_str()
        .unwrap()
        .contains("translate"));
}

#[tokio::test]
async fn refuses_a_missing_capability() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let reply = get(&client(), &format!("http://{}/x", pair.outbound())).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.header("reach-reason"), "missing_capability");
    assert_eq!(reply.json()["error"], "missing_capability");
}

#[tokio::test]
async fn refuses_foreign_hosts_never_an_open_proxy() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let url = format!("http://{}/x", pair.outbound());
    let reply = send(&client(), "GET", &url, &[("host", "example.com")], "").await;
    assert_eq!(reply.status, 403);
    assert_eq!(reply.json()["error"], "forbidden_host");

    // Proxy-style, even when the capability header is present.
    let mut stream = tokio::net::TcpStream::connect(pair.outbound())
        .await
        .unwrap();
    stream
        .write_all(b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nreach-capability: code-review\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    assert!(raw.starts_with("HTTP/1.1 403"), "{raw}");
    assert!(raw.contains("reach-reason: forbidden_host"), "{raw}");

    // CONNECT tunnels are refused too.
    let mut stream = tokio::net::TcpStream::connect(pair.outbound())
        .await
        .unwrap();
    stream
        .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = stream.read(&mut buf).await.unwrap();
    let raw = String::from_utf8_lossy(&buf[..n]);
    assert!(raw.starts_with("HTTP/1.1 403"), "{raw}");
}

#[tokio::test]
async fn a_peer_that_shut_down_is_passed_over_at_once() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let outbound = pair.outbound();
    // The callee announces `draining` for one self-view poll before it closes its listeners.
    pair.callee.shutdown().await;
    let reply = tokio::time::timeout(std::time::Duration::from_secs(5), call(&client(), outbound))
        .await
        .expect("never a hang");
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "no_available_instance");
    assert_eq!(
        reply.json()["candidates"][0]["passed_over"],
        "draining (no traffic allowed)"
    );
}

#[tokio::test]
async fn a_peer_nobody_listens_for_is_a_json_502() {
    // A port that was bound and released: connections to it are refused.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let caller = agent_reach::Bootstrap::local("caller", free, &[])
        .unwrap()
        .with_peer("gone", free, &[CAP])
        .unwrap();
    let caller = sidecar(caller).await;
    let reply = call(&client(), caller.addrs.outbound).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "upstream_connect_failed");
}

#[tokio::test]
async fn an_agent_that_never_answers_times_out_with_504() {
    let mut config = MockConfig::new("coder-1");
    config.mode = testkit::Mode::Hang;
    let pair = Pair::start_with(config, |mut b| {
        b.agent.capabilities[0].timeout =
            Some(agent_reach::config::HumanDuration::from_millis(200));
        b
    })
    .await;
    let reply = call(&client(), pair.outbound()).await;
    assert_eq!(reply.status, 504, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "timeout");
    assert_eq!(reply.header("reach-agent"), "coder-1", "{reply:?}");
}

#[tokio::test]
async fn a_refused_connection_retries_on_another_peer_even_for_post() {
    let good = Pair::start(MockConfig::new("coder-1")).await;
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let caller = agent_reach::Bootstrap::local("caller", gone, &[])
        .unwrap()
        .with_peer("gone", gone, &[CAP])
        .unwrap()
        .with_peer("coder-1", good.callee.addrs.inbound, &[CAP])
        .unwrap();
    let caller = sidecar(caller).await;
    let mut retried = false;
    for _ in 0..20 {
        let reply = call(&client(), caller.addrs.outbound).await;
        assert_eq!(
            reply.status, 200,
            "a refused connection never ran the POST: {}",
            reply.body
        );
        retried |= reply.header("reach-attempts") == "2";
        if retried {
            break;
        }
    }
    assert!(retried, "no call ever tried the dead peer first");
}
