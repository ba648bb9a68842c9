//! Shared fixtures for the black-box tests: mock agents, sidecars on 127.0.0.1:0, an HTTP client.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

pub mod process;
pub mod sdk;
pub mod skip;
pub mod tasks;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::config::{ConfigPaths, ConfigStore, Policy};
use agent_reach::http::body;
use agent_reach::http::client::{self, UpstreamClient};
use agent_reach::{Bootstrap, Sidecar};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use testkit::{MockAgent, MockConfig};
use tokio::net::TcpListener;

pub const CAP: &str = "code-review";

pub fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

pub async fn mock(config: MockConfig) -> MockAgent {
    MockAgent::start(any_port(), config)
        .await
        .expect("mock agent starts")
}

pub async fn sidecar(bootstrap: Bootstrap) -> Sidecar {
    sidecar_with(bootstrap, Policy::default(), ConfigPaths::default()).await
}

pub async fn sidecar_with(bootstrap: Bootstrap, policy: Policy, paths: ConfigPaths) -> Sidecar {
    let store = Arc::new(ConfigStore::new(bootstrap, policy, paths));
    Sidecar::start(store).await.expect("sidecar starts")
}

/// A mock agent behind its sidecar (the callee), and a caller sidecar that knows it as a peer.
pub struct Pair {
    pub agent: MockAgent,
    pub callee: Sidecar,
    pub caller: Sidecar,
}

impl Pair {
    pub async fn start(config: MockConfig) -> Self {
        Self::start_with(config, |b| b).await
    }

    /// `tune` adjusts the callee's bootstrap (limits, queue, …) before it starts.
    pub async fn start_with(config: MockConfig, tune: impl FnOnce(Bootstrap) -> Bootstrap) -> Self {
        let name = config.name.clone();
        let agent = mock(config).await;
        let callee = sidecar(tune(Bootstrap::local(&name, agent.addr, &[CAP]).unwrap())).await;
        let caller_bootstrap =
            Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
                .unwrap()
                .with_peer(&name, callee.addrs.inbound, &[CAP])
                .unwrap();
        let caller = sidecar(caller_bootstrap).await;
        Self {
            agent,
            callee,
            caller,
        }
    }

    pub fn outbound(&self) -> SocketAddr {
        self.caller.addrs.outbound
    }
}

pub fn client() -> UpstreamClient {
    client::build(&Policy::default())
}

/// A finished response: status, headers and the whole body as text.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// Sends a request with the given headers and reads the whole response.
pub async fn send(
    client: &UpstreamClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body_text: &str,
) -> Reply {
    let mut builder = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let response = client
        .request(builder.body(body::full(body_text.to_owned())).unwrap())
        .await
        .expect("response");
    let (parts, incoming) = response.into_parts();
    let bytes = incoming.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// `n` POSTs of `body_text` to `url` at once, each on its own task.
pub fn spawn_posts(
    n: usize,
    url: &str,
    headers: &[(&'static str, &'static str)],
    body_text: &'static str,
) -> Vec<tokio::task::JoinHandle<Reply>> {
    (0..n)
        .map(|_| {
            let (url, headers) = (url.to_owned(), headers.to_vec());
            tokio::spawn(async move { send(&client(), "POST", &url, &headers, body_text).await })
        })
        .collect()
}

pub async fn get(client: &UpstreamClient, url: &str) -> Reply {
    send(client, "GET", url, &[], "").await
}

/// A call to the test capability through a caller's outbound port.
pub async fn call(client: &UpstreamClient, outbound: SocketAddr) -> Reply {
    send(
        client,
        "POST",
        &format!("http://{outbound}/review"),
        &[("reach-capability", CAP)],
        "x = 1",
    )
    .await
}

/// Polls `check` until it returns true, failing the test after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An agent that answers 200 and remembers the head of every request it got.
pub async fn echo_agent() -> (SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    sized_agent(2).await
}

/// An agent that answers every request with `size` bytes and remembers each request's head
/// (and its target, as `x-seen-path`).
pub async fn sized_agent(size: usize) -> (SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    let body = bytes::Bytes::from(vec![b'x'; size]);
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (record, body) = (record.clone(), body.clone());
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (record, body) = (record.clone(), body.clone());
                        async move {
                            // The head as the agent saw it, its target as `x-seen-path`.
                            let mut head = req.headers().clone();
                            head.insert("x-seen-path", req.uri().to_string().parse().unwrap());
                            record.lock().unwrap().push(head);
                            let _ = req.into_body().collect().await;
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(body)))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// The value of the first series in `metrics` (Prometheus text) starting with `series` (name
/// and labels), 0 when there is none.
/// Every label set of `series` (its name and `{`) whose line also holds `with`, summed.
pub fn sum(metrics: &str, series: &str, with: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(series) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A gossip membership listener that listens to nothing: for a hand-driven gossip node.
pub struct Quiet;

impl agent_reach::gossip::Membership for Quiet {
    fn members(&self, _: &[agent_reach::gossip::Member]) {}
    fn live(&self, _: &agent_reach::gossip::Member, _: &agent_reach::gossip::Live) {}
}

/// One capability as a gossip profile carries it, everything else at its default.
pub fn wire_capability(name: &str) -> agent_reach::gossip::Capability {
    agent_reach::gossip::Capability {
        name: name.to_owned(),
        tags: Default::default(),
        timeout_ms: 30_000,
        mode: agent_reach::config::RouteMode::Sync,
        cost_milli: 0,
        idempotent: false,
        output_schema: None,
        a2a: None,
        tools: Vec::new(),
    }
}
