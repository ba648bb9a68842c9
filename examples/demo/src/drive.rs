//! The demo's load: callers' workers sending capability calls, and a watcher sampling what the
//! fleet does meanwhile.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, StatusCode};
use http_body_util::BodyExt;

use agent_reach::config::Policy;
use agent_reach::http::{body, client, headers};
use agent_reach::reach::State;
use agent_reach::Sidecar;
use testkit::MockAgent;

/// One call as the caller saw it.
#[derive(Clone, Debug)]
pub(super) struct Call {
    /// When it finished, from the start of the demo.
    pub(super) at: Duration,
    pub(super) ok: bool,
    /// The answer's status; 0 when none came.
    pub(super) status: u16,
    pub(super) ms: f64,
}

/// Calls recorded so far, shared by the workers and the watcher.
#[derive(Clone, Debug, Default)]
pub(super) struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn push(&self, call: Call) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub(super) fn take(&self) -> Vec<Call> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// What the watcher saw at one instant.
#[derive(Clone, Debug)]
pub(super) struct Sample {
    pub(super) at: Duration,
    /// Calls that reached the watched agent so far (probes excluded).
    pub(super) reached: u64,
    /// Calls the caller had completed so far.
    pub(super) calls: u64,
    /// The watched agent's state as the caller routes by it (the stricter of its two views).
    pub(super) state: Option<State>,
}

/// Sends calls to the demo's capability through the caller's outbound port from `concurrency`
/// workers for `duration`.
pub(super) async fn traffic(
    outbound: SocketAddr,
    duration: Duration,
    concurrency: usize,
    calls: Calls,
) {
    let client = client::build(&Policy::default());
    let started = Instant::now();
    let deadline = started + duration;
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (client, calls) = (client.clone(), calls.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let request = Request::post(format!("http://{outbound}/review"))
                        .header(headers::CAPABILITY, super::CAPABILITY)
                        .body(body::full("def f(): pass"));
                    let (ok, status) = match request {
                        Ok(request) => match client.request(request).await {
                            Ok(response) => {
                                let status = response.status();
                                let read = response.into_body().collect().await.is_ok();
                                (read && status == StatusCode::OK, status.as_u16())
                            }
                            Err(_) => (false, 0),
                        },
                        Err(_) => (false, 0),
                    };
                    calls.push(Call {
                        at: started.elapsed(),
                        ok,
                        status,
                        ms: sent.elapsed().as_secs_f64() * 1000.0,
                    });
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
}

/// Samples the watched agent's load and the caller's view of it every 100 ms.
pub(super) async fn watch(
    caller: &Sidecar,
    agent: &MockAgent,
    name: &str,
    started: Instant,
    duration: Duration,
    calls: &Calls,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while started.elapsed() < duration {
        tick.tick().await;
        let state = caller
            .status()
            .peer_views
            .into_iter()
            .find(|p| p.name == name)
            .map(|p| p.effective_state);
        samples.push(Sample {
            at: started.elapsed(),
            reached: agent.stats().business,
            calls: calls.len() as u64,
            state,
        });
    }
    samples
}
