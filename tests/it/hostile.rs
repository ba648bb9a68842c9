//! Hostile input, tried from outside over real sockets: each test is one way a review hurt a
//! sidecar, kept closed. (Gossip forgery and restarts are in `tests/gossip*.rs`, config values in
//! `tests/it/cli.rs` and `tests/it/reload.rs`, the injector's slow clients in `tests/it/inject.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::config::HumanDuration;
use agent_reach::reach::State;
use agent_reach::Bootstrap;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::*;
use testkit::{MockConfig, Mode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Writes `request` on a new connection and reads what comes back until the peer closes (or 5 s).
async fn raw(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status_line(response: &str) -> &str {
    response.lines().next().unwrap_or("")
}

// 1. Asterisk-form targets once became requests to port 80 of the upstream host.
#[tokio::test]
async fn asterisk_form_is_answered_or_refused_and_never_forwarded() {
    let (agent, seen) = echo_agent().await;
    let callee = sidecar(Bootstrap::local("coder-1", agent, &[CAP]).unwrap()).await;
    for listener in [callee.addrs.inbound, callee.addrs.outbound] {
        let options = raw(
            listener,
            "OPTIONS * HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(status_line(&options).contains(" 204"), "{options}");
        assert!(options.to_ascii_lowercase().contains("allow:"), "{options}");
        let post = raw(
            listener,
            "POST * HTTP/1.1\r\nhost: x\r\nreach-capability: code-review\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
        )
        .await;
        assert!(status_line(&post).contains(" 400"), "{post}");
        assert!(post.contains("reach-reason: bad_request"), "{post}");
    }
    // Authority-form (CONNECT) is a tunnel request: never turned into a request for `/`.
    let connect = raw(
        callee.addrs.inbound,
        "CONNECT 127.0.0.1:22 HTTP/1.1\r\nhost: 127.0.0.1:22\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(status_line(&connect).contains(" 400"), "{connect}");
    assert!(seen.lock().unwrap().is_empty(), "nothing reached any agent");
}

// 2. The sidecar's own headers are the sidecar's: a caller can neither forge nor strip them.
#[tokio::test]
async fn a_caller_can_neither_forge_nor_strip_the_sidecars_headers() {
    let (agent, seen) = echo_agent().await;
    // The callee knows the caller by name at 127.0.0.1: its claim can be checked.
    let callee_bootstrap = Bootstrap::local("coder-1", agent, &[CAP])
        .unwrap()
        .with_peer("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap();
    let callee = sidecar(callee_bootstrap).await;
    let caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer("coder-1", callee.addrs.inbound, &[CAP])
        .unwrap();
    let caller = sidecar(caller).await;

    // Through the caller's sidecar, the agent's `Connection` header names the sidecar's headers.
    let reply = send(
        &client(),
        "POST",
        &format!("http://{}/review", caller.addrs.outbound),
        &[
            ("reach-capability", CAP),
            (
                "connection",
                "reach-deadline, reach-caller, reach-capability",
            ),
            ("reach-caller", "admin"),
        ],
        "x",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let through = seen.lock().unwrap().pop().unwrap();
    assert!(through.contains_key("reach-deadline"), "{through:?}");
    assert_eq!(through["reach-capability"], CAP);
    assert_eq!(
        through["reach-caller"], "caller",
        "the verified name, not the claim"
    );

    // Straight at the inbound port, from a stranger claiming names.
    let reply = send(
        &client(),
        "POST",
        &format!("http://{}/review", callee.addrs.inbound),
        &[
            ("reach-capability", CAP),
            ("reach-caller", "admin"),
            ("reach-agent", "forged"),
            ("reach-replayed", "true"),
        ],
        "x",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let direct = seen.lock().unwrap().pop().unwrap();
    assert!(!direct.contains_key("reach-caller"), "{direct:?}");
    assert!(!direct.contains_key("reach-agent"), "{direct:?}");
    assert!(!direct.contains_key("reach-replayed"), "{direct:?}");
}

// 2. A capability serves the paths it declares; the agent's admin endpoints are not among them.
#[tokio::test]
async fn a_capability_serves_only_its_declared_paths() {
    let pair = Pair::start_with(MockConfig::new("coder-1"), |mut b| {
        b.agent.capabilities[0].paths = vec!["/review".to_owned()];
        b
    })
    .await;
    let inbound = pair.callee.addrs.inbound;
    let c = client();
    // Naming the capability does not stretch its paths; naming none maps the path to none.
    for (headers, status, reason) in [
        (
            &[("reach-capability", CAP)][..],
            400,
            "capability_path_mismatch",
        ),
        (&[][..], 404, "unknown_capability"),
    ] {
        let reply = send(
            &c,
            "PUT",
            &format!("http://{inbound}/admin/mode"),
            headers,
            "crash",
        )
        .await;
        assert_eq!(reply.status, status, "{}", reply.body);
        assert_eq!(reply.header("reach-reason"), reason);
    }
    // Dot segments and encoded separators cannot climb out of a declared prefix.
    for path in [
        "/review/../admin/mode",
        "/review/%2e%2e/admin/mode",
        "/review%2f..%2fadmin/mode",
    ] {
        let reply = send(
            &c,
            "PUT",
            &format!("http://{inbound}{path}"),
            &[("reach-capability", CAP)],
            "crash",
        )
        .await;
        assert_eq!(reply.status, 400, "{path}: {}", reply.body);
    }
    // Dot segments and encoded separators cannot climb out of a declared prefix.
    for path in [
        "/review/../admin/mode",
        "/review/%2e%2e/admin/mode",
        "/review%2f..%2fadmin/mode",
    ] {
        let url = format!("http://{inbound}{path}");
        let reply = send(&c, "PUT", &url, &[("reach-capability", CAP)], "crash").await;
        assert_eq!(reply.status, 400, "{path}: {}", reply.body);
    }
    assert_eq!(
        pair.agent.mode(),
        Mode::Normal,
        "the agent's admin endpoint was not reached"
    );
    let reply = send(
        &c,
        "POST",
        &format!("http://{inbound}/review/x"),
        &[("reach-capability", CAP)],
        "x",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

/// Sends the head of a POST that promises `length` bytes, then `sent` bytes, then hangs up.
async fn broken_upload(addr: SocketAddr, path: &str, length: usize, sent: usize) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nreach-capability: {CAP}\r\ncontent-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b'x'; sent]).await.unwrap();
    stream.flush().await.unwrap();
    // Long enough for the sidecar to start forwarding; then the caller vanishes.
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(stream);
}

// 3. A caller's broken upload is the caller's fault: it never ejects a healthy agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_broken_uploads_never_count_against_the_agent() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    for _ in 0..8 {
        broken_upload(pair.callee.addrs.inbound, "/review", 100_000, 10).await;
    }
    eventually(
        Duration::from_secs(5),
        "the callee saw all eight",
        || async { pair.callee.status().inbound.requests >= 8 },
    )
    .await;
    let status = pair.callee.status();
    assert_eq!(status.inbound.failures, 0, "{:?}", status.inbound);
    assert!(
        matches!(status.self_view.state, State::Parole | State::Healthy),
        "{:?}",
        status.self_view.state
    );

    // The same through the caller's outbound: a body too large to buffer streams to the peer.
    for _ in 0..8 {
        broken_upload(pair.outbound(), "/review", 50 << 20, 10).await;
    }
    eventually(
        Duration::from_secs(5),
        "the callee saw them too",
        || async { pair.callee.status().inbound.requests >= 16 },
    )
    .await;
    let view = pair.caller.status().peer_views;
    assert!(
        view.iter()
            .all(|p| matches!(p.view.state, State::Parole | State::Healthy)),
        "{:?}",
        view.iter().map(|p| p.view.state).collect::<Vec<_>>()
    );
    assert_eq!(call(&client(), pair.outbound()).await.status, 200);
}

// 13. A body that stops arriving gives its admission slot back, and is not the agent's fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_gives_up_its_admission_slot() {
    let pair = Pair::start_with(MockConfig::new("coder-1"), |mut b| {
        b.agent.max_concurrency = agent_reach::config::PositiveCount::new(1).unwrap();
        b.agent.queue.capacity = 0;
        b.limits.body_read_timeout = HumanDuration::from_millis(300);
        b
    })
    .await;
    let inbound = pair.callee.addrs.inbound;
    let mut slow = TcpStream::connect(inbound).await.unwrap();
    let head = format!("POST /review HTTP/1.1\r\nhost: x\r\nreach-capability: {CAP}\r\ncontent-length: 100\r\n\r\n0123456789");
    slow.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut answer))
        .await
        .expect("the stalled upload is answered within seconds, not the agent's timeout")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(status_line(&answer).contains(" 408"), "{answer}");
    assert!(answer.contains("reach-reason: body_timeout"), "{answer}");
    let reply = send(
        &client(),
        "POST",
        &format!("http://{inbound}/review"),
        &[("reach-capability", CAP)],
        "x",
    )
    .await;
    assert_eq!(reply.status, 200, "the slot is free again: {}", reply.body);
    assert_eq!(pair.callee.status().inbound.failures, 0);
}

// 13. Keyed work keeps the caller's deadline: it does not hold a slot for the key's lifetime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_work_stops_at_the_callers_deadline() {
    let mut config = MockConfig::new("coder-1");
    config.mode = Mode::Hang;
    let pair = Pair::start(config).await;
    let url = format!("http://{}/review", pair.callee.addrs.inbound);
    let headers = [
        ("reach-capability", CAP),
        ("idempotency-key", "k1"),
        ("reach-timeout", "300ms"),
    ];
    let reply = send(&client(), "POST", &url, &headers, "x").await;
    assert_eq!(reply.status, 504, "{}", reply.body);
    eventually(
        Duration::from_secs(3),
        "the keyed original let its slot go",
        || async { pair.callee.status().load.in_flight == 0 },
    )
    .await;
}

// 5 and 7. Keys belong to one caller and one request.
#[tokio::test]
async fn idempotency_keys_belong_to_one_caller_and_one_request() {
    let somewhere = SocketAddr::from(([127, 0, 0, 1], 9));
    let pair = Pair::start_with(MockConfig::new("coder-1"), |b| {
        b.with_peer("alice", somewhere, &[])
            .unwrap()
            .with_peer("bob", somewhere, &[])
            .unwrap()
    })
    .await;
    let url = format!("http://{}/review", pair.callee.addrs.inbound);
    let c = client();
    let from = |caller: &'static str| {
        [
            ("reach-capability", CAP),
            ("idempotency-key", "order-42"),
            ("reach-caller", caller),
        ]
    };
    let first = send(&c, "POST", &url, &from("alice"), "charge 10").await;
    assert_eq!(first.status, 200, "{}", first.body);
    let changed = send(&c, "POST", &url, &from("alice"), "charge 99").await;
    assert_eq!(changed.status, 422, "{}", changed.body);
    assert_eq!(changed.header("reach-reason"), "idempotency_mismatch");
    assert_eq!(pair.agent.stats().business, 1);
    let other = send(&c, "POST", &url, &from("bob"), "charge 10").await;
    assert_eq!(other.status, 200, "{}", other.body);
    assert_eq!(other.header("reach-replayed"), "", "bob's key is bob's");
    assert_eq!(pair.agent.stats().business, 2);
    let again = send(&c, "POST", &url, &from("alice"), "charge 10").await;
    assert_eq!(again.header("reach-replayed"), "true");
    assert_eq!(pair.agent.stats().business, 2);
}

// 5. Stored responses stay within the byte budget, and a flood from one caller cannot evict
// another caller's keys.
#[tokio::test]
async fn stored_responses_stay_within_the_budget_and_each_callers_share() {
    let (agent, seen) = sized_agent(64 * 1024).await;
    let somewhere = SocketAddr::from(([127, 0, 0, 1], 9));
    let bootstrap = Bootstrap::local("coder-1", agent, &[CAP])
        .unwrap()
        .with_peer("quiet", somewhere, &[])
        .unwrap()
        .with_peer("flood", somewhere, &[])
        .unwrap();
    let mut policy = agent_reach::config::Policy::default();
    policy.idempotency.max_total_bytes = 1 << 20;
    let callee = sidecar_with(
        bootstrap,
        policy,
        agent_reach::config::ConfigPaths::default(),
    )
    .await;
    let url = format!("http://{}/review", callee.addrs.inbound);
    let c = client();
    let keyed = |caller: &'static str, key: &str| {
        let (c, url, key) = (c.clone(), url.clone(), key.to_owned());
        async move {
            let headers = [
                ("reach-capability", CAP),
                ("reach-caller", caller),
                ("idempotency-key", &key),
            ];
            send(&c, "POST", &url, &headers, "x").await
        }
    };
    assert_eq!(keyed("quiet", "mine").await.status, 200);
    for i in 0..60 {
        let reply = keyed("flood", &format!("k{i}")).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let usage = callee.status().idempotency;
        assert!(usage.bytes <= 1 << 20, "{usage:?}");
    }
    assert_eq!(seen.lock().unwrap().len(), 61);
    assert_eq!(
        keyed("quiet", "mine").await.header("reach-replayed"),
        "true",
        "kept despite the flood"
    );
    assert_eq!(
        keyed("flood", "k59").await.header("reach-replayed"),
        "true",
        "the newest is kept"
    );
    assert_eq!(
        keyed("flood", "k0").await.header("reach-replayed"),
        "",
        "the oldest was evicted"
    );
}

// 10. A probe's credentials are not shown on the admin port.
#[tokio::test]
async fn status_never_shows_a_probes_secret_headers() {
    let pair = Pair::start_with(MockConfig::new("coder-1"), |mut b| {
        let mut probe = testkit::probe_spec();
        probe
            .headers
            .insert("authorization".to_owned(), "Bearer s3cret-token".to_owned());
        probe
            .headers
            .insert("X-Api-Key".to_owned(), "k3y-value".to_owned());
        b.agent.capabilities[0].probe = Some(probe);
        b
    })
    .await;
    let status = get(
        &client(),
        &format!("http://{}/status", pair.callee.addrs.admin),
    )
    .await;
    assert_eq!(status.status, 200);
    assert!(!status.body.contains("s3cret-token"), "{}", status.body);
    assert!(!status.body.contains("k3y-value"), "{}", status.body);
    assert!(status.body.contains("[redacted]"), "{}", status.body);
}

// 11. Capability names a caller typed never become metric labels.
#[tokio::test]
async fn typed_capability_names_do_not_grow_the_metrics() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let c = client();
    for i in 0..30 {
        let name = format!("nope-{i}");
        for listener in [pair.outbound(), pair.callee.addrs.inbound] {
            let reply = send(
                &c,
                "POST",
                &format!("http://{listener}/review"),
                &[("reach-capability", &name)],
                "x",
            )
            .await;
            assert_eq!(reply.status, 404, "{}", reply.body);
        }
    }
    for admin in [pair.caller.addrs.admin, pair.callee.addrs.admin] {
        let metrics = get(&c, &format!("http://{admin}/metrics")).await.body;
        assert!(!metrics.contains("nope-"), "{metrics}");
    }
}

// 12. An idle h2 connection is closed, not kept alive by PINGs forever.
#[tokio::test]
async fn idle_connections_are_closed() {
    let pair = Pair::start_with(MockConfig::new("coder-1"), |mut b| {
        b.limits.idle_timeout = HumanDuration::from_millis(300);
        b
    })
    .await;
    let stream = TcpStream::connect(pair.callee.addrs.inbound).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let request = Request::get("http://x/reach/v1/self")
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.into_body().collect().await;
    let closed = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(
        closed.is_ok(),
        "the idle h2 connection was closed by the sidecar"
    );

    // HTTP/1 keep-alive too.
    let mut stream = TcpStream::connect(pair.callee.addrs.inbound).await.unwrap();
    stream
        .write_all(b"GET /reach/v1/self HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 65536];
    let mut eof = false;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < until {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                eof = true;
                break;
            }
            Ok(Ok(_)) => continue,
            Err(_) => break,
        }
    }
    assert!(eof, "the idle keep-alive connection was closed");
}

// Also: a static peer removed by a reload leaves the caller's views, not just the registry.
#[tokio::test]
async fn a_removed_static_peer_leaves_the_callers_views() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    assert_eq!(call(&client(), pair.outbound()).await.status, 200);
    let views = |s: &agent_reach::Sidecar| s.status().peer_views.len();
    assert_eq!(views(&pair.caller), 1);
    let store = pair.caller.store();
    let snapshot = store.snapshot();
    let mut bootstrap = snapshot.bootstrap.clone();
    bootstrap.peers.clear();
    assert!(store.replace(bootstrap, snapshot.policy.clone()));
    eventually(
        Duration::from_secs(5),
        "the removed peer's view is gone",
        || async { views(&pair.caller) == 0 },
    )
    .await;
}

// Also: a peer's self-view is read with a size limit.
#[tokio::test]
async fn a_huge_self_view_is_not_buffered() {
    // Something at a static peer's address answers the self-view poll with 64 MiB; each
    // connection records how much it managed to write before it ended.
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written: Arc<Mutex<Vec<usize>>> = Arc::default();
    let record = written.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 1024];
                let _ = stream.read(&mut head).await;
                let len = 64usize << 20;
                let hdr = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
                );
                let mut sent = 0;
                if stream.write_all(hdr.as_bytes()).await.is_ok() {
                    let chunk = vec![b' '; 64 * 1024];
                    while sent < len && stream.write_all(&chunk).await.is_ok() {
                        sent += chunk.len();
                    }
                }
                record.lock().unwrap().push(sent);
            });
        }
    });
    let caller = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer("big", addr, &[CAP])
        .unwrap();
    let _caller = sidecar(caller).await;
    eventually(Duration::from_secs(10), "the first poll ended", || async {
        !written.lock().unwrap().is_empty()
    })
    .await;
    let sent = written.lock().unwrap()[0];
    // What was sent past the limit is what the socket buffers held: far from 64 MiB.
    assert!(sent < 16 << 20, "the caller kept reading: {sent} bytes");
}

// Identity-like headers a caller writes (a client IP, a user, a certificate, the scheme and host
// it used) never reach the agent: the agent behind its sidecar would believe them. One the
// policy passes does.
#[tokio::test]
async fn identity_like_headers_from_a_caller_never_reach_the_agent() {
    let (agent, seen) = echo_agent().await;
    let policy = agent_reach::config::Policy {
        pass_identity_headers: vec!["x-forwarded-proto".to_owned()],
        ..Default::default()
    };
    let callee = sidecar_with(
        Bootstrap::local("coder-1", agent, &[CAP]).unwrap(),
        policy,
        Default::default(),
    )
    .await;
    let claims = [
        ("x-real-ip", "10.9.9.9"),
        ("true-client-ip", "10.9.9.9"),
        ("x-forwarded-host", "admin.internal"),
        ("x-forwarded-user", "root"),
        ("ssl-client-cert", "-----BEGIN CERTIFICATE-----"),
        ("x-client-cert", "forged"),
        ("remote-user", "root"),
        ("x-forwarded-proto", "https"),
    ];
    let mut headers = vec![("reach-capability", CAP)];
    headers.extend(claims);
    let url = format!("http://{}/review", callee.addrs.inbound);
    let reply = send(&client(), "POST", &url, &headers, "x").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let head = seen.lock().unwrap().last().cloned().unwrap();
    for (name, _) in &claims[..claims.len() - 1] {
        assert!(head.get(*name).is_none(), "{name} reached the agent");
    }
    assert_eq!(head["x-forwarded-proto"], "https", "passed by the policy");
}

// The outbound listener advertises a bound on an h2 connection's streams.
#[tokio::test]
async fn the_outbound_listener_advertises_max_concurrent_streams() {
    let caller =
        sidecar(Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap())
            .await;
    let tcp = TcpStream::connect(caller.addrs.outbound).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    // The server's SETTINGS arrive with the handshake's first exchange.
    let mut send = send.ready().await.unwrap();
    let request = Request::get("http://code-review.reach/").body(()).unwrap();
    let (response, _) = send.send_request(request, true).unwrap();
    let _ = response.await;
    assert_eq!(send.current_max_send_streams(), 256);
}

// A sidecar that knows no member of its mesh (cut off from gossip) cannot tell who serves a
// capability: it answers 503 with retry-after and says why, never a 404 that reads as permanent.
#[tokio::test]
async fn a_sidecar_with_no_gossip_member_answers_503_not_unknown_capability() {
    let dir = std::env::temp_dir().join(format!("reach-alone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("gossip.key");
    std::fs::write(&key, "00".repeat(32)).unwrap();
    let caller = sidecar(
        Bootstrap::local("alone", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap()
            .with_gossip(&[], key),
    )
    .await;
    let reply = call(&client(), caller.addrs.outbound).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "no_available_instance");
    assert!(!reply.header("retry-after").is_empty());
    assert!(reply.body.contains("knows no member"), "{}", reply.body);
    let _ = std::fs::remove_dir_all(&dir);
}

// The path-prefix form names a capability only on the loopback listener's own address: a proxy
// request for another host that carries the prefix is still a foreign host, never routed.
#[tokio::test]
async fn the_path_prefix_form_does_not_open_the_proxy_to_other_hosts() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let foreign = raw(
        pair.outbound(),
        &format!("GET http://evil.example/.reach/{CAP}/x HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(status_line(&foreign).contains("403"), "{foreign}");
    assert!(foreign.contains("forbidden_host"), "{foreign}");
    assert_eq!(pair.agent.stats().business, 0);
    // On the loopback address it is the capability.
    let host = pair.outbound().to_string();
    let local = raw(
        pair.outbound(),
        &format!("GET /.reach/{CAP}/x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    assert!(status_line(&local).contains("200"), "{local}");
    assert_eq!(pair.agent.stats().business, 1);
}
