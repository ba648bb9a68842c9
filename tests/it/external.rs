//! External targets: plain services with no sidecar, measured by the caller itself and held to
//! their rate limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use agent_reach::config::{ExternalTarget, Name, Policy, RateLimit, TargetEndpoint};
use agent_reach::Bootstrap;
use support::*;
use testkit::MockConfig;

fn target(addr: SocketAddr, rate_limit: Option<RateLimit>) -> ExternalTarget {
    ExternalTarget {
        name: Name::parse("inventory").unwrap(),
        capability: Name::parse("inventory").unwrap(),
        endpoints: vec![TargetEndpoint::parse(&addr.to_string()).unwrap()],
        ca_file: None,
        timeout: None,
        max_concurrency: Some(8),
        rate_limit,
        budget_group: None,
        model_provider: false,
    }
}

async fn caller_with(policy: Policy) -> agent_reach::Sidecar {
    let bootstrap = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    sidecar_with(bootstrap, policy, Default::default()).await
}

#[tokio::test]
async fn an_external_target_is_routed_to_and_measured() {
    let service = mock(MockConfig::new("inventory-svc")).await;
    let mut policy = Policy::default();
    policy.targets.push(target(service.addr, None));
    let caller = caller_with(policy).await;
    let url = format!("http://{}/stock", caller.addrs.outbound);
    let reply = send(
        &client(),
        "GET",
        &url,
        &[("reach-capability", "inventory")],
        "",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["agent"], "inventory-svc");
    let status = caller.status();
    assert_eq!(
        status
            .peers
            .iter()
            .find(|p| p.name == "inventory-1")
            .map(|p| p.source),
        Some("external")
    );
    let view = status
        .peer_views
        .into_iter()
        .find(|p| p.name == "inventory-1")
        .unwrap();
    assert!(
        view.view.estimates.latency_ms.is_some(),
        "the caller measured it: {view:?}"
    );
    assert!(view.self_view.is_none(), "a plain service has no self-view");
}

#[tokio::test]
async fn an_external_target_over_its_rate_limit_is_refused_at_once() {
    let service = mock(MockConfig::new("inventory-svc")).await;
    let mut policy = Policy::default();
    policy.targets.push(target(
        service.addr,
        Some(RateLimit {
            per_second: 0.1,
            burst: 2,
        }),
    ));
    let caller = caller_with(policy).await;
    let url = format!("http://{}/stock", caller.addrs.outbound);
    let c = client();
    for _ in 0..2 {
        assert_eq!(
            send(&c, "GET", &url, &[("reach-capability", "inventory")], "")
                .await
                .status,
            200
        );
    }
    let reply = tokio::time::timeout(
        Duration::from_secs(2),
        send(&c, "GET", &url, &[("reach-capability", "inventory")], ""),
    )
    .await
    .expect("refused at once, not queued");
    assert_eq!(reply.status, 429, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "rate_limited");
    assert!(!reply.header("retry-after").is_empty());
    assert_eq!(
        service.stats().business,
        2,
        "the third call never reached the service"
    );
}

/// A model provider over TLS, as a real one is: a certificate for `localhost` from a test CA,
/// `/v1/chat/completions` answered in JSON or, for `"stream":true`, as an SSE stream whose second
/// event waits for `release`; OpenAI's rate-limit headers on every answer. It speaks what its
/// ALPN list offers (`h2` and `http/1.1`, as the big providers, or `http/1.1` only).
struct TlsProvider {
    addr: SocketAddr,
    /// Each request's `authorization`, `host` (`:authority` over HTTP/2) and HTTP version.
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>,
    release: std::sync::Arc<tokio::sync::Notify>,
    /// TLS connections accepted.
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// Offers ALPN `h2` and `http/1.1`, in that order.
const H2_AND_H1: &[&[u8]] = &[b"h2", b"http/1.1"];
const H1_ONLY: &[&[u8]] = &[b"http/1.1"];

async fn tls_provider(ca: &agent_reach::pki::DevCa) -> TlsProvider {
    tls_provider_with(ca, H1_ONLY).await
}

async fn tls_provider_with(ca: &agent_reach::pki::DevCa, alpn: &[&[u8]]) -> TlsProvider {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let issued = ca
        .issue_with("localhost", &[], &["localhost"], Duration::from_secs(3600))
        .unwrap();
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let served = TlsProvider {
        addr: listener.local_addr().unwrap(),
        seen: Default::default(),
        release: Default::default(),
        connections: Default::default(),
    };
    let (seen, release) = (served.seen.clone(), served.release.clone());
    let connections = served.connections.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen, release) = (acceptor.clone(), seen.clone(), release.clone());
            let connections = connections.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let service = hyper::service::service_fn(move |req| {
                    answer(req, seen.clone(), release.clone())
                });
                // HTTP/2 when the client sent its preface (it does after ALPN `h2`), else 1.1.
                let executor = hyper_util::rt::TokioExecutor::new();
                let _ = hyper_util::server::conn::auto::Builder::new(executor)
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    served
}

async fn answer(
    req: http::Request<hyper::body::Incoming>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, String, String)>>>,
    release: std::sync::Arc<tokio::sync::Notify>,
) -> Result<http::Response<agent_reach::http::ReachBody>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let host = match req.uri().authority() {
        Some(authority) => authority.to_string(),
        None => header("host"),
    };
    let version = format!("{:?}", req.version());
    seen.lock()
        .unwrap()
        .push((header("authorization"), host, version));
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let response = http::Response::builder()
        .header("x-ratelimit-limit-requests", "100")
        .header("x-ratelimit-remaining-requests", "2")
        .header("x-ratelimit-reset-requests", "6m0s");
    if !String::from_utf8_lossy(&body).contains("\"stream\":true") {
        let json = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
        return Ok(response
            .header("content-type", "application/json")
            .body(agent_reach::http::body::full(json))
            .unwrap());
    }
    let (mut tx, rx) =
        http_body_util::channel::Channel::<bytes::Bytes, std::convert::Infallible>::new(4);
    tokio::spawn(async move {
        let _ = tx
            .send_data("data: {\"choices\":[{\"delta\":{\"content\":\"h\"}}]}\n\n".into())
            .await;
        release.notified().await;
        let _ = tx
            .send_data(
                "data: {\"choices\":[{\"delta\":{\"content\":\"i\"}}]}\n\ndata: [DONE]\n\n".into(),
            )
            .await;
    });
    Ok(response
        .header("content-type", "text/event-stream")
        .body(agent_reach::http::body::boxed(rx))
        .unwrap())
}

/// An `https://` target trusting `ca`'s bundle, written to a file as `ca_file` is.
fn tls_target(
    provider: SocketAddr,
    ca: &agent_reach::pki::DevCa,
    dir: &std::path::Path,
) -> ExternalTarget {
    let bundle = dir.join("ca.pem");
    std::fs::write(&bundle, ca.pem()).unwrap();
    ExternalTarget {
        name: Name::parse("llm").unwrap(),
        capability: Name::parse("llm").unwrap(),
        endpoints: vec![
            TargetEndpoint::parse(&format!("https://localhost:{}", provider.port())).unwrap(),
        ],
        ca_file: Some(bundle),
        timeout: None,
        max_concurrency: None,
        rate_limit: None,
        budget_group: None,
        model_provider: true,
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("reach-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn an_https_target_is_called_over_tls_with_the_agents_authorization_and_streams() {
    called_over_tls(H1_ONLY, "HTTP/1.1", "tls-h1").await;
}

/// A provider whose server picks `h2`: the same calls over one multiplexed HTTP/2 connection,
/// the stream still chunk by chunk (whatever `peer_protocol` says: it is for sidecars).
#[tokio::test]
async fn an_https_target_that_picks_h2_is_called_over_http2_on_one_connection() {
    let provider = called_over_tls(H2_AND_H1, "HTTP/2.0", "tls-h2").await;
    assert_eq!(
        provider
            .connections
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the JSON call, the stream and the eight concurrent calls shared one connection"
    );
}

/// Calls a TLS provider offering `alpn` through a sidecar: JSON, a stream read chunk by chunk,
/// eight concurrent calls; each request reached it as `version`.
async fn called_over_tls(alpn: &[&[u8]], version: &str, tag: &str) -> TlsProvider {
    let ca = agent_reach::pki::DevCa::new("test-ca").unwrap();
    let provider = tls_provider_with(&ca, alpn).await;
    let dir = temp_dir(tag);
    let mut policy = Policy::default();
    policy.targets.push(tls_target(provider.addr, &ca, &dir));
    let caller = caller_with(policy).await;
    let url = format!("http://{}/v1/chat/completions", caller.addrs.outbound);
    let secret = "Bearer sk-test-s3cret";

    // As an OpenAI client with `base_url = http://llm.reach/v1` sends it.
    let reply = send(
        &client(),
        "POST",
        &url,
        &[("host", "llm.reach"), ("authorization", secret)],
        r#"{"model":"m","messages":[]}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["choices"][0]["message"]["content"], "hi");
    let port = provider.addr.port();
    assert_eq!(
        provider.seen.lock().unwrap().first().cloned(),
        Some((
            secret.to_owned(),
            format!("localhost:{port}"),
            version.to_owned()
        )),
        "the agent's own authorization reached the provider, with the endpoint's host"
    );

    // The budget is learned from the TLS target's headers.
    let budget = caller.status().model_budget.expect("a budget learned");
    assert!(budget.headroom < 1.0, "{budget:?}");

    // An SSE stream arrives chunk by chunk: the first event before the provider sends the rest.
    let request = http::Request::post(&url)
        .header("host", "llm.reach")
        .header("authorization", secret)
        .body(agent_reach::http::body::full(
            r#"{"model":"m","stream":true}"#,
        ))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    use http_body_util::BodyExt;
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first event arrives while the stream is still open")
        .expect("a frame")
        .expect("no error");
    let text = String::from_utf8_lossy(first.data_ref().expect("data")).into_owned();
    assert!(text.contains("\"h\"") && !text.contains("[DONE]"), "{text}");
    provider.release.notify_one();
    let rest = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the rest arrives once sent")
        .expect("no error")
        .to_bytes();
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));

    // Concurrent calls, all answered.
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                send(
                    &client(),
                    "POST",
                    &url,
                    &[("host", "llm.reach"), ("authorization", secret)],
                    r#"{"model":"m"}"#,
                )
                .await
                .status
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    let seen = provider.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 10);
    assert!(seen.iter().all(|(_, _, v)| v == version), "{seen:?}");

    // The secret is shown nowhere the sidecar shows things.
    for page in ["status", "metrics"] {
        let shown = get(&client(), &format!("http://{}/{page}", caller.addrs.admin)).await;
        assert!(!shown.body.contains("s3cret"), "/{page} shows the key");
    }
    let _ = std::fs::remove_dir_all(&dir);
    provider
}

/// A plain `http://` target is no sidecar: under `peer_protocol: http2` it is still called over
/// HTTP/1.1 (prior knowledge would break an HTTP/1.1-only service).
#[tokio::test]
async fn a_plain_target_gets_http1_under_peer_protocol_http2() {
    // Answers with the version each request came in: it serves both, as hyper's auto server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: http::Request<_>| async move {
                    let version = format!("{:?}", req.version());
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        agent_reach::http::body::full(version),
                    ))
                });
                let executor = hyper_util::rt::TokioExecutor::new();
                let _ = hyper_util::server::conn::auto::Builder::new(executor)
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let mut policy = Policy::default();
    policy.pool.peer_protocol = agent_reach::config::PeerProtocol::Http2;
    policy.targets.push(target(addr, None));
    let caller = caller_with(policy).await;
    let url = format!("http://{}/stock", caller.addrs.outbound);
    for _ in 0..2 {
        let reply = send(
            &client(),
            "GET",
            &url,
            &[("reach-capability", "inventory")],
            "",
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body, "HTTP/1.1");
    }
}

#[tokio::test]
async fn an_https_target_whose_certificate_the_bundle_does_not_trust_is_refused_clearly() {
    let ca = agent_reach::pki::DevCa::new("test-ca").unwrap();
    let other = agent_reach::pki::DevCa::new("other-ca").unwrap();
    let provider = tls_provider(&ca).await;
    let dir = temp_dir("tls-wrong-ca");
    let mut policy = Policy::default();
    policy.targets.push(tls_target(provider.addr, &other, &dir));
    let caller = caller_with(policy).await;
    let reply = send(
        &client(),
        "POST",
        &format!("http://{}/v1/chat/completions", caller.addrs.outbound),
        &[
            ("host", "llm.reach"),
            ("authorization", "Bearer sk-test-s3cret"),
        ],
        "{}",
    )
    .await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "upstream_connect_failed");
    assert!(
        reply.body.contains("TLS handshake with `localhost` failed")
            && reply.body.contains("certificate"),
        "{}",
        reply.body
    );
    assert!(
        provider.seen.lock().unwrap().is_empty(),
        "no request left unencrypted or untrusted"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
