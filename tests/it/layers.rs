//! The edge layers over real sockets: a panic becomes a 500 and the listener keeps serving,
//! `x-request-id` travels from the caller to the agent, the admin gzips `/metrics` on request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use agent_reach::http::server::{self, text, ServerSettings};
use agent_reach::http::{layers, BoxError, ReachBody};
use agent_reach::metrics::Metrics;
use agent_reach::transport::{Accepted, PlainTcp};
use agent_reach::{Bootstrap, ReachError};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use support::*;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A body that panics when it is first read: the panic happens in the connection's task, after
/// the handler returned, where no `CatchPanic` can see it.
struct PanickingBody;

impl http_body::Body for PanickingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        panic!("forced panic while streaming a body")
    }
}

/// A handler that panics on `/panic`, answers `/body-panic` with a body that panics, and
/// answers anything else with the client's address, as the accept loop gave it.
async fn stub(
    accepted: Arc<Accepted>,
    req: Request<Incoming>,
) -> Result<Response<ReachBody>, Infallible> {
    match req.uri().path() {
        "/panic" => panic!("forced panic in a handler"),
        "/body-panic" => Ok(Response::new(agent_reach::http::body::boxed(PanickingBody))),
        _ => {
            let client = accepted.client.0.to_string();
            Ok(text(StatusCode::OK, "text/plain", client))
        }
    }
}

fn gauge(metrics: &Metrics, name: &str) -> String {
    metrics
        .render()
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_panicking_handler_answers_500_internal_and_the_listener_keeps_serving() {
    let metrics = Arc::new(Metrics::new("test"));
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let settings = ServerSettings::from_limits(&Default::default(), Duration::from_secs(1));
    let serving = tokio::spawn(server::serve(
        "test",
        listener,
        PlainTcp::new(Duration::from_secs(5)),
        {
            let metrics = metrics.clone();
            move |accepted: Arc<Accepted>| {
                let stub = move |req| stub(accepted.clone(), req);
                layers::edge("test", &metrics, tower::service_fn(stub))
            }
        },
        settings,
        metrics.clone(),
        stop.clone(),
    ));

    let c = client();
    let panicked = get(&c, &format!("http://{addr}/panic")).await;
    assert_eq!(panicked.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(panicked.header("reach-reason"), "internal");
    assert_eq!(panicked.json()["error"], "internal");
    assert_eq!(panicked.header("x-request-id").len(), 32, "{panicked:?}");
    assert!(metrics
        .render()
        .contains(r#"reach_panics_total{listener="test"} 1"#));

    // The same pooled connection, and the listener, keep serving; the handler sees the client.
    let next = get(&c, &format!("http://{addr}/ok")).await;
    assert_eq!(next.status, StatusCode::OK);
    assert!(next.body.starts_with("127.0.0.1:"), "{}", next.body);

    // A panic in the connection's own task closes that connection only.
    let broken = c
        .request(
            Request::get(format!("http://{addr}/body-panic"))
                .body(agent_reach::http::body::empty())
                .unwrap(),
        )
        .await;
    if let Ok(response) = broken {
        assert!(response.into_body().collect().await.is_err());
    }
    assert_eq!(
        get(&client(), &format!("http://{addr}/ok")).await.status,
        StatusCode::OK
    );

    // Every connection closed, whether its task ended, panicked or not: the gauge is back at 0.
    drop(c);
    eventually(
        Duration::from_secs(5),
        "the connection gauge back at 0",
        || {
            let open = gauge(&metrics, r#"reach_connections_open{listener="test"}"#);
            async move { open.ends_with(" 0") }
        },
    )
    .await;
    stop.cancel();
    serving.await.unwrap();
    assert!(
        metrics
            .render()
            .contains(r#"reach_panics_total{listener="test"} 2"#),
        "the connection task's panic is counted too:\n{}",
        metrics.render()
    );
}

/// An agent that records the `x-request-id` of every request it serves.
async fn recording_agent() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let id = req
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    record.lock().unwrap().push(id);
                    async { Ok::<_, Infallible>(text(StatusCode::OK, "text/plain", "done\n")) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn the_request_id_is_made_when_absent_kept_when_present_and_reaches_the_agent() {
    let (agent, seen) = recording_agent().await;
    let callee = sidecar(Bootstrap::local("coder-1", agent, &[CAP]).unwrap()).await;
    let caller = sidecar(
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap()
            .with_peer("coder-1", callee.addrs.inbound, &[CAP])
            .unwrap(),
    )
    .await;
    let url = format!("http://{}/review", caller.addrs.outbound);
    let c = client();

    let made = send(&c, "POST", &url, &[("reach-capability", CAP)], "x").await;
    assert_eq!(made.status, StatusCode::OK, "{made:?}");
    let id = made.header("x-request-id").to_owned();
    assert_eq!(id.len(), 32, "a generated id: {made:?}");

    let kept = send(
        &c,
        "POST",
        &url,
        &[("reach-capability", CAP), ("x-request-id", "trace-me-42")],
        "x",
    )
    .await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    assert_eq!(kept.header("x-request-id"), "trace-me-42");

    // Through the caller's sidecar and the callee's, to the agent: the same ids.
    assert_eq!(*seen.lock().unwrap(), vec![id, "trace-me-42".to_owned()]);
    caller.kill().await;
    callee.kill().await;
}

#[tokio::test]
async fn metrics_are_gzipped_for_a_client_that_asks_and_plain_otherwise() {
    let caller =
        sidecar(Bootstrap::local("solo", SocketAddr::from(([127, 0, 0, 1], 9)), &[CAP]).unwrap())
            .await;
    let c = client();
    let url = format!("http://{}/metrics", caller.addrs.admin);

    let plain = get(&c, &url).await;
    assert_eq!(plain.status, StatusCode::OK);
    assert_eq!(plain.header("content-encoding"), "");
    assert!(plain.body.contains("reach_info"), "{}", plain.body);

    let request = Request::get(&url)
        .header("accept-encoding", "gzip")
        .body(agent_reach::http::body::empty())
        .unwrap();
    let response = c.request(request).await.unwrap();
    assert_eq!(response.headers()["content-encoding"], "gzip");
    let zipped = response.into_body().collect().await.unwrap().to_bytes();
    let mut unzipped = String::new();
    flate2::read::GzDecoder::new(&zipped[..])
        .read_to_string(&mut unzipped)
        .unwrap();
    assert!(unzipped.contains("reach_info"), "{unzipped}");
    assert!(zipped.len() < unzipped.len());

    // Only `/metrics` and `/status`: the small endpoints stay plain whatever the client accepts.
    let index = send(
        &c,
        "GET",
        &format!("http://{}/", caller.addrs.admin),
        &[("accept-encoding", "gzip")],
        "",
    )
    .await;
    assert_eq!(index.header("content-encoding"), "");
    caller.kill().await;
}

#[tokio::test]
async fn an_admin_request_over_the_body_limit_is_refused_in_the_wire_format() {
    let caller =
        sidecar(Bootstrap::local("solo", SocketAddr::from(([127, 0, 0, 1], 9)), &[CAP]).unwrap())
            .await;
    let big = "x".repeat(64 * 1024);
    let refused = send(
        &client(),
        "GET",
        &format!("http://{}/live", caller.addrs.admin),
        &[],
        &big,
    )
    .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        refused.header("reach-reason"),
        ReachError::BadRequest(String::new()).code()
    );
    caller.kill().await;
}
