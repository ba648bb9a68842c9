//! What every scenario runs on: the agent slots, the callers, the router in front (`front`)
//! and the measures read from a run (`measures`).

mod baseline;
pub(crate) mod fleet;
pub(crate) mod front;
pub(crate) mod measures;
pub(crate) mod proxies;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;

use crate::scenario::Scenario;
use crate::{MockAgent, MockConfig, CALL_TIMEOUT, CAP};

/// One call as the caller saw it: when it ended, whether it succeeded, how long it took.
pub(crate) type Call = (Duration, bool, f64);

/// What reached each agent slot by `at`, and how many calls had ended.
pub(crate) struct Sample {
    pub(crate) at: Duration,
    pub(crate) reached: Vec<u64>,
    pub(crate) calls: usize,
}

/// One agent slot: the agent running in it now, and the calls its earlier incarnations got.
pub(crate) struct Slot {
    pub(crate) agent: Option<MockAgent>,
    pub(crate) before: u64,
}

impl Slot {
    pub(crate) async fn start(
        &mut self,
        scenario: Scenario,
        index: usize,
        listen: SocketAddr,
    ) -> Result<SocketAddr, String> {
        let mut config = MockConfig::new(&format!("agent-{}", index + 1));
        config.latency = scenario.latency();
        config.slow_latency = scenario.slow_latency();
        let agent = MockAgent::start_with(listen, config, scenario.workload(index))
            .await
            .map_err(|e| format!("agent {} on {listen}: {e}", index + 1))?;
        let addr = agent.addr;
        self.agent = Some(agent);
        Ok(addr)
    }

    /// The process dies: its port closes and its connections drop.
    pub(crate) async fn die(&mut self) {
        if let Some(agent) = self.agent.take() {
            self.before += agent.stats().business;
            agent.stop().await;
        }
    }

    /// The process comes back on `listen`, its old address: a port just closed may take a
    /// moment to bind again.
    pub(crate) async fn start_again(
        &mut self,
        scenario: Scenario,
        index: usize,
        listen: SocketAddr,
    ) -> Result<SocketAddr, String> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.start(scenario, index, listen).await {
                Ok(addr) => return Ok(addr),
                Err(err) if Instant::now() > deadline => return Err(err),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    pub(crate) fn reached(&self) -> u64 {
        self.before + self.agent.as_ref().map_or(0, |a| a.stats().business)
    }
}

/// One `code-review` call after another, each recorded, from `from` until the run stops or
/// `until`; after a failed call, a pause of `pause`. The callers take the router's front doors
/// in turn (ramp-shared has one per caller sidecar).
#[derive(Clone)]
pub(crate) struct Caller {
    pub(crate) client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    pub(crate) urls: Vec<String>,
    /// Callers spawned so far: the next one takes the next front door.
    pub(crate) spawned: Arc<AtomicUsize>,
    pub(crate) calls: Arc<Mutex<Vec<Call>>>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) started: Instant,
    pub(crate) pause: Duration,
}

impl Caller {
    pub(crate) fn spawn(
        &self,
        from: Duration,
        until: Option<Duration>,
    ) -> tokio::task::JoinHandle<()> {
        let k = self.spawned.fetch_add(1, Ordering::Relaxed);
        let Caller {
            client,
            urls,
            calls,
            stop,
            started,
            pause,
            ..
        } = self.clone();
        tokio::spawn(async move {
            let Some(url) = urls.iter().cycle().nth(k) else {
                return;
            };
            tokio::time::sleep_until(tokio::time::Instant::from_std(started + from)).await;
            while !stop.load(Ordering::Relaxed) && until.is_none_or(|u| started.elapsed() < u) {
                let sent = Instant::now();
                let request = hyper::Request::post(url)
                    .header("reach-capability", CAP)
                    .body(Full::new(Bytes::from_static(b"def f(): pass")));
                let ok = match request {
                    Ok(r) => match tokio::time::timeout(CALL_TIMEOUT, client.request(r)).await {
                        Ok(Ok(response)) => {
                            let status = response.status();
                            let body = tokio::time::timeout(
                                CALL_TIMEOUT.saturating_sub(sent.elapsed()),
                                response.into_body().collect(),
                            )
                            .await;
                            matches!(body, Ok(Ok(_))) && status == 200
                        }
                        _ => false,
                    },
                    Err(_) => false,
                };
                let ms = sent.elapsed().as_secs_f64() * 1000.0;
                calls
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((started.elapsed(), ok, ms));
                if !ok && !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        })
    }
}
