//! Outbound resilience: deadlines across both sidecars, and the async fallback chain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::*;
use testkit::{Latency, MockConfig};

fn slow_agent() -> MockConfig {
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(Duration::from_secs(5));
    config
}

fn ms_from_now(ms: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    (now + ms).to_string()
}

#[tokio::test]
async fn a_deadline_shorter_than_the_agent_gives_504_without_waiting_for_it() {
    let pair = Pair::start(slow_agent()).await;
    let url = format!("http://{}/review", pair.outbound());
    let reply = tokio::time::timeout(
        Duration::from_secs(3),
        send(
            &client(),
            "POST",
            &url,
            &[("reach-capability", CAP), ("reach-timeout", "300ms")],
            "x",
        ),
    )
    .await
    .expect("answered at the deadline, not after the agent's 5 s");
    assert_eq!(reply.status, 504, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "deadline_exceeded");
    assert_eq!(reply.json()["error"], "deadline_exceeded");
}

#[tokio::test]
async fn the_callee_enforces_a_forwarded_deadline() {
    let pair = Pair::start(slow_agent()).await;
    let url = format!("http://{}/review", pair.callee.addrs.inbound);
    let deadline = ms_from_now(300);
    let reply = tokio::time::timeout(
        Duration::from_secs(3),
        send(
            &client(),
            "POST",
            &url,
            &[("reach-capability", CAP), ("reach-deadline", &deadline)],
            "x",
        ),
    )
    .await
    .expect("the callee gave up at the deadline");
    assert_eq!(reply.status, 504);
    assert_eq!(reply.header("reach-reason"), "deadline_exceeded");
}

#[tokio::test]
async fn a_passed_deadline_never_reaches_the_agent() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let url = format!("http://{}/review", pair.callee.addrs.inbound);
    let reply = send(&client(), "POST", &url, &[("reach-deadline", "1")], "x").await;
    assert_eq!(reply.status, 504);
    assert_eq!(reply.header("reach-reason"), "deadline_exceeded");
    assert_eq!(
        pair.agent.stats().business,
        0,
        "no work for a caller that already gave up"
    );
}

#[tokio::test]
async fn a_malformed_timeout_is_a_clear_400() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let url = format!("http://{}/review", pair.outbound());
    let reply = send(
        &client(),
        "POST",
        &url,
        &[("reach-capability", CAP), ("reach-timeout", "soon")],
        "x",
    )
    .await;
    assert_eq!(reply.status, 400);
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap()
            .contains("reach-timeout"),
        "{}",
        reply.body
    );
}

#[tokio::test]
async fn a_generous_deadline_lets_the_call_finish() {
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(Duration::from_millis(100));
    let pair = Pair::start(config).await;
    let url = format!("http://{}/review", pair.outbound());
    let reply = send(
        &client(),
        "POST",
        &url,
        &[("reach-capability", CAP), ("reach-timeout", "5s")],
        "x",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_call_walks_its_fallback_chain_with_spacing() {
    use agent_reach::config::{HumanDuration, Policy};
    use agent_reach::Bootstrap;
    use testkit::Mode;

    let mut policy = Policy::default();
    policy.retry.fallback.interval = HumanDuration::from_millis(300);
    policy.retry.fallback.chain_length = 3;
    let mut caller = Bootstrap::local(
        "caller",
        std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
        &[],
    )
    .unwrap();
    let mut fleet = Vec::new();
    for name in ["coder-1", "coder-2", "coder-3"] {
        let mut config = MockConfig::new(name);
        config.mode = Mode::RateLimited;
        let agent = mock(config).await;
        let callee = sidecar(Bootstrap::local(name, agent.addr, &[CAP]).unwrap()).await;
        caller = caller
            .with_peer(name, callee.addrs.inbound, &[CAP])
            .unwrap();
        fleet.push((agent, callee));
    }
    let caller = sidecar_with(caller, policy, Default::default()).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    let started = std::time::Instant::now();
    let reply = send(
        &client(),
        "POST",
        &url,
        &[("reach-capability", CAP), ("reach-mode", "async")],
        "x",
    )
    .await;
    let took = started.elapsed();
    assert_eq!(reply.status, 429, "every agent refused: {}", reply.body);
    assert_eq!(
        reply.header("reach-attempts"),
        "3",
        "the whole chain was tried"
    );
    assert!(
        took >= Duration::from_millis(600),
        "two 300 ms pauses between three agents: {took:?}"
    );
    let served: u64 = fleet.iter().map(|(a, _)| a.stats().business).sum();
    assert_eq!(served, 3, "each agent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_calls_move_to_another_peer_when_idempotent() {
    move_on_timeout("PUT", false).await;
    move_on_timeout("POST", true).await;
}

/// A hung peer and a fine one; `method` calls until one meets the hung peer first.
async fn move_on_timeout(method: &str, declared_idempotent: bool) {
    use agent_reach::config::HumanDuration;
    use agent_reach::Bootstrap;
    use testkit::Mode;

    let mut caller = Bootstrap::local(
        "caller",
        std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
        &[],
    )
    .unwrap();
    let mut fleet = Vec::new();
    for (name, mode) in [("hung", Mode::Hang), ("fine", Mode::Normal)] {
        let mut config = MockConfig::new(name);
        config.mode = mode;
        let agent = mock(config).await;
        let mut b = Bootstrap::local(name, agent.addr, &[CAP]).unwrap();
        b.agent.capabilities[0].timeout = Some(HumanDuration::from_millis(300));
        b.agent.capabilities[0].idempotent = declared_idempotent;
        let callee = sidecar(b).await;
        caller = caller
            .with_peer(name, callee.addrs.inbound, &[CAP])
            .unwrap();
        fleet.push((agent, callee));
    }
    let caller = sidecar(caller).await;
    eventually(
        Duration::from_secs(10),
        "the caller knows both peers' timeouts",
        || async {
            let views = caller.status().peer_views;
            views.len() == 2 && views.iter().all(|p| p.self_view.is_some())
        },
    )
    .await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    let mut moved = false;
    for _ in 0..20 {
        let reply = send(&client(), "PUT", &url, &[("reach-capability", CAP)], "x").await;
        assert_eq!(
            reply.status, 200,
            "a PUT is idempotent: retried elsewhere: {}",
            reply.body
        );
        if reply.header("reach-attempts") == "2" {
            moved = true;
            break;
        }
    }
    assert!(moved, "no {method} ever met the hung peer first");
    fleet[0].0.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_when_everyone_left_asked_for_a_pause() {
    use agent_reach::Bootstrap;
    use testkit::Mode;

    let mut caller = Bootstrap::local(
        "caller",
        std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
        &[],
    )
    .unwrap();
    let mut fleet = Vec::new();
    for name in ["coder-1", "coder-2"] {
        let mut config = MockConfig::new(name);
        config.mode = Mode::RateLimited; // 429 with retry-after: 1
        let agent = mock(config).await;
        let callee = sidecar(Bootstrap::local(name, agent.addr, &[CAP]).unwrap()).await;
        caller = caller
            .with_peer(name, callee.addrs.inbound, &[CAP])
            .unwrap();
        fleet.push((agent, callee));
    }
    let caller = sidecar(caller).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    // The first call meets both refusals; now both peers are cooling down for 1 s.
    assert_eq!(
        send(&client(), "POST", &url, &[("reach-capability", CAP)], "x")
            .await
            .status,
        429
    );
    let started = std::time::Instant::now();
    let reply = send(&client(), "POST", &url, &[("reach-capability", CAP)], "x").await;
    assert_eq!(reply.status, 429);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "the retry waited out retry-after: {:?}",
        started.elapsed()
    );
    // …but never past the caller's deadline.
    let started = std::time::Instant::now();
    let headers = [("reach-capability", CAP), ("reach-timeout", "300ms")];
    let reply = send(&client(), "POST", &url, &headers, "x").await;
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}: {}",
        started.elapsed(),
        reply.body
    );
}

/// An agent that refuses every call with 429 and `retry-after` as an HTTP date `ahead` from now.
async fn refusing_until_a_date(ahead: Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: http::Request<hyper::body::Incoming>| async move {
                        use http_body_util::BodyExt;
                        let _ = req.into_body().collect().await;
                        let date = httpdate::fmt_http_date(SystemTime::now() + ahead);
                        let response = http::Response::builder()
                            .status(429)
                            .header("retry-after", date)
                            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(response)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// RFC 9110 lets `retry-after` be an HTTP date (model backends send one): it is a wait from now,
/// honoured like the seconds form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_as_an_http_date_is_honoured_like_seconds() {
    use agent_reach::Bootstrap;

    let mut caller = Bootstrap::local(
        "caller",
        std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
        &[],
    )
    .unwrap();
    let mut fleet = Vec::new();
    for name in ["coder-1", "coder-2"] {
        // Three seconds ahead, to the second: a wait of 2 to 3 s, longer than the 1 s an
        // unreadable retry-after would cool a peer down for.
        let agent = refusing_until_a_date(Duration::from_secs(3)).await;
        let callee = sidecar(Bootstrap::local(name, agent, &[CAP]).unwrap()).await;
        caller = caller
            .with_peer(name, callee.addrs.inbound, &[CAP])
            .unwrap();
        fleet.push(callee);
    }
    let caller = sidecar(caller).await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    assert_eq!(
        send(&client(), "POST", &url, &[("reach-capability", CAP)], "x")
            .await
            .status,
        429
    );
    let started = std::time::Instant::now();
    let reply = send(&client(), "POST", &url, &[("reach-capability", CAP)], "x").await;
    assert_eq!(reply.status, 429);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
        "the retry waited out the retry-after date: {waited:?}"
    );
}

/// A peer that takes calls and never answers (a black-holed path, a hung agent) shows up only
/// through callers giving up on it. A deadline far past the peer's usual latency counts against
/// it; one shorter than a second does not (see `a_deadline_shorter_than_the_agent…`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_abandoned_far_past_the_peers_latency_count_against_it() {
    let mut config = MockConfig::new("coder-1");
    config.mode = testkit::Mode::Hang;
    let pair = Pair::start(config).await;
    let url = format!("http://{}/review", pair.outbound());
    let state = || {
        pair.caller
            .status()
            .peer_views
            .first()
            .map(|p| p.effective_state.as_str().to_owned())
    };
    assert_eq!(state().as_deref().unwrap_or("parole"), "parole");
    let calls = spawn_posts(
        4,
        &url,
        &[("reach-capability", CAP), ("reach-timeout", "1200ms")],
        "x",
    );
    for call in calls {
        assert_eq!(call.await.unwrap().status, 504);
    }
    let after = state();
    assert!(
        after
            .as_deref()
            .is_some_and(|s| s == "ejected" || s == "probation"),
        "four calls unanswered for 1.2 s leave the peer {after:?}: {}",
        serde_json::to_string(&pair.caller.status().peer_views).unwrap()
    );
}

/// With one candidate, its refusal is the answer at once: no retry is
/// counted or budgeted when no untried candidate is left (before, every call added to
/// `reach_retries_total{reason="rate_limited"}` and spent budget while answering
/// `reach-attempts: 1`).
#[tokio::test]
async fn a_lone_refusing_candidate_is_not_retried_counted_or_budgeted() {
    use testkit::Mode;

    let mut config = MockConfig::new("coder-1");
    config.mode = Mode::RateLimited;
    let pair = support::Pair::start(config).await;
    let url = format!("http://{}/review", pair.outbound());
    // The first refusal cools the agent down (its `retry-after`); later calls find nobody.
    for i in 0..20 {
        let reply = send(&client(), "POST", &url, &[("reach-capability", CAP)], "x").await;
        if i == 0 || reply.status == 429 {
            assert_eq!(reply.status, 429, "{}", reply.body);
            assert_eq!(reply.header("reach-attempts"), "1");
        } else {
            assert_eq!(reply.header("reach-reason"), "no_available_instance");
        }
    }
    let metrics = get(
        &client(),
        &format!("http://{}/metrics", pair.caller.addrs.admin),
    )
    .await
    .body;
    let retries = support::sum(&metrics, "reach_retries_total{", "");
    assert_eq!(retries, 0.0, "no retry happened:\n{metrics}");
    let exhausted = support::sum(&metrics, "reach_retry_budget_exhausted_total{", "");
    assert_eq!(exhausted, 0.0, "no budget was spent to run out:\n{metrics}");
    assert!(pair.agent.stats().business >= 1);
}
