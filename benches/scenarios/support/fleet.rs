//! What slow-tail and provider-budget share: they run outside the main loop (their own fleets
//! of three agents, their own routers' settings), so they need callers that keep each answer's
//! status, agent-reach sidecars found by static peers, and HAProxy or Envoy started from a
//! config text and waited for.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_reach::config::Policy;
use agent_reach::{Bootstrap, Sidecar};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::front::start_sidecar;
use crate::{CALL_TIMEOUT, CAP};
use testkit::bench::{self, free_port, write};

/// One call as a caller saw it: the status (0: no answer in time), how long it took.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Done {
    pub(crate) status: u16,
    pub(crate) ms: f64,
}

impl Done {
    pub(crate) fn ok(&self) -> bool {
        self.status == 200
    }
}

/// `workers` callers in a closed loop on `url` from now until `stop`; every call carries a
/// fresh `idempotency-key`, so a router may repeat it. A failed call is followed by a pause of
/// `pause`, so that a refusal does not become a spin.
pub(crate) struct Load {
    pub(crate) calls: Arc<Mutex<Vec<Done>>>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) started: Instant,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub(crate) fn start(url: &str, workers: usize, pause: Duration) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let calls: Arc<Mutex<Vec<Done>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let keys = Arc::new(AtomicU64::new(0));
        let tasks = (0..workers)
            .map(|_| {
                let (client, calls, stop, keys) =
                    (client.clone(), calls.clone(), stop.clone(), keys.clone());
                let url = url.to_owned();
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let sent = Instant::now();
                        let key = format!("call-{}", keys.fetch_add(1, Ordering::Relaxed));
                        let status = call(&client, &url, &key).await;
                        let done = Done {
                            status,
                            ms: sent.elapsed().as_secs_f64() * 1000.0,
                        };
                        calls.lock().unwrap_or_else(|p| p.into_inner()).push(done);
                        if status != 200 && !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                })
            })
            .collect();
        Self {
            calls,
            stop,
            started,
            tasks,
        }
    }

    /// Stops the callers, waits for their last calls, and hands back every call.
    pub(crate) async fn finish(self) -> Vec<Done> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.clone()
    }
}

/// One `code-review` call: the answer's status once its body has ended, 0 without one.
async fn call(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    url: &str,
    key: &str,
) -> u16 {
    let sent = Instant::now();
    let Ok(request) = hyper::Request::post(url)
        .header("reach-capability", CAP)
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"def f(): pass")))
    else {
        return 0;
    };
    match tokio::time::timeout(CALL_TIMEOUT, client.request(request)).await {
        Ok(Ok(response)) => {
            let status = response.status().as_u16();
            let body = tokio::time::timeout(
                CALL_TIMEOUT.saturating_sub(sent.elapsed()),
                response.into_body().collect(),
            )
            .await;
            if matches!(body, Ok(Ok(_))) {
                status
            } else {
                0
            }
        }
        _ => 0,
    }
}

/// The `q` quantile (0..1) of the calls' latencies, in ms; 0 without calls.
pub(crate) fn quantile(calls: &[Done], q: f64) -> f64 {
    let mut ms: Vec<f64> = calls.iter().map(|c| c.ms).collect();
    ms.sort_by(f64::total_cmp);
    let at = ((ms.len() as f64 * q).ceil() as usize)
        .saturating_sub(1)
        .min(ms.len().saturating_sub(1));
    ms.get(at).copied().unwrap_or(0.0)
}

/// agent-reach: one sidecar per agent and a caller's sidecar that knows them as static peers.
pub(crate) struct ReachFleet {
    pub(crate) caller: Sidecar,
    pub(crate) sidecars: Vec<Sidecar>,
}

impl ReachFleet {
    /// `agent_policy(i)` is agent `i`'s sidecar's policy (its model target, in provider-budget).
    pub(crate) async fn start(
        agents: &[(String, SocketAddr)],
        caller_policy: Policy,
        agent_policy: impl Fn(usize) -> Policy,
    ) -> Result<Self, String> {
        let nowhere = SocketAddr::from(([127, 0, 0, 1], 9));
        let mut caller = Bootstrap::local("caller", nowhere, &[])?;
        let mut sidecars = Vec::new();
        for (i, (name, addr)) in agents.iter().enumerate() {
            let b = Bootstrap::local(name, *addr, &[CAP])?;
            let side = start_sidecar(b, agent_policy(i)).await?;
            caller = caller.with_peer(name, side.addrs.inbound, &[CAP])?;
            sidecars.push(side);
        }
        let caller = start_sidecar(caller, caller_policy).await?;
        let fleet = Self { caller, sidecars };
        let url = fleet.url();
        if let Err(err) = ready(&url).await {
            fleet.stop().await;
            return Err(err);
        }
        Ok(fleet)
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/review", self.caller.addrs.outbound)
    }

    pub(crate) async fn stop(self) {
        self.caller.kill().await;
        for s in self.sidecars {
            s.kill().await;
        }
    }
}

/// HAProxy or Envoy, started from a config text; `config(port)` writes the listener's port in.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    child: Child,
}

impl Proxy {
    pub(crate) async fn haproxy(
        binary: &Path,
        dir: &Path,
        config: impl Fn(u16) -> String,
    ) -> Result<Self, String> {
        let port = free_port()?;
        let cfg = write(dir, &format!("haproxy-{port}.cfg"), &config(port))?;
        let child = bench::spawn_quiet(bench::haproxy(binary, &cfg))?;
        Self::ready(port, child).await
    }

    pub(crate) async fn envoy(
        binary: &Path,
        dir: &Path,
        config: impl Fn(u16) -> String,
    ) -> Result<Self, String> {
        let port = free_port()?;
        let cfg = write(dir, &format!("envoy-{port}.yaml"), &config(port))?;
        let child = bench::spawn_quiet(bench::envoy(binary, &cfg, port))?;
        Self::ready(port, child).await
    }

    async fn ready(port: u16, child: Child) -> Result<Self, String> {
        let proxy = Self { port, child };
        if let Err(err) = ready(&proxy.url()).await {
            proxy.stop();
            return Err(err);
        }
        Ok(proxy)
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/review", self.port)
    }

    pub(crate) fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ready when a call through `url` answers 200 (within 20 s).
async fn ready(url: &str) -> Result<(), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut n = 0u64;
    loop {
        tick.tick().await;
        n += 1;
        if call(&client, url, &format!("ready-{n}")).await == 200 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("no answer at {url} within 20 s"));
        }
    }
}
