//! Business probes: a small real request per capability, straight to the local agent through its
//! whole dependency chain, on a low-priority thread of its own.
//!
//! Why a thread of its own at a lower OS priority: probes must never compete with production
//! traffic for the sidecar's CPU. Why business requests and not `/healthz`: a fake-online agent
//! answers `/healthz` while its model backend answers 429 (`docs/reach-model.md`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent_request::{self, AgentRequest};
use crate::classify::Class;
use crate::config::{Capability, ConfigStore, ProbeSpec, Snapshot};
use crate::http::client::AgentClient;
use crate::local::{LocalAgent, ProbeRecord, Traffic};
use crate::metrics::Metrics;
use crate::reach::{Signal, State};

/// How often the scheduler wakes to see which probes are due.
const TICK: Duration = Duration::from_millis(100);
/// How often an agent that refuses connections is tried again.
const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// Starts the probe thread; it stops when `stop` is cancelled.
pub(crate) fn spawn(
    store: Arc<ConfigStore>,
    local: Arc<LocalAgent>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("agent-reach-probes".to_owned()).spawn(move || {
        if let Err(err) = thread_priority::set_current_thread_priority(thread_priority::ThreadPriority::Min) {
            tracing::debug!(?err, "cannot lower the probe thread's priority; probing at normal priority");
        }
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(err) => {
                tracing::error!(%err, "cannot start the probe runtime; business probes are off");
                return;
            }
        };
        runtime.block_on(run(store, local, metrics, stop));
    })
}

async fn run(
    store: Arc<ConfigStore>,
    local: Arc<LocalAgent>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    // Its own client: pooled connections belong to the runtime that opened them, and the data
    // path's must not live on this low-priority thread.
    let client = AgentClient::following(&store);
    // Capability → when its next probe is due. New capabilities are probed at once.
    let mut due: HashMap<String, Instant> = HashMap::new();
    // Capability → when its last probe ran.
    let mut ran: HashMap<String, Instant> = HashMap::new();
    // Capability → when its golden tasks are next due. New capabilities run at once.
    let mut golden_due: HashMap<String, Instant> = HashMap::new();
    // While the agent refuses connections: when to try connecting again.
    let mut next_connect = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        let snapshot = store.snapshot();
        let now = Instant::now();
        if now >= next_connect && local.barred(&snapshot, now) == Some(State::Ejected) {
            // Out of rotation, the agent gets no traffic to tell us whether it runs: a TCP
            // connect, cheap on loopback, does — every half second. Refused: it is not running
            // (whatever ejected it), so it comes back as soon as it listens again. Accepted
            // after that: back, and a business probe confirms it at once if it has one.
            next_connect = now + RECONNECT_EVERY.min(snapshot.policy.probes.fast_interval.get());
            match connect(&snapshot).await {
                Connect::Refused => local.observe(
                    Signal::Unreachable(Duration::ZERO),
                    &snapshot,
                    Instant::now(),
                ),
                Connect::Accepted if local.is_unreachable() => {
                    if snapshot.has_probes() {
                        due.values_mut().for_each(|at| *at = now);
                    } else {
                        local.reachable();
                    }
                }
                _ => {}
            }
        }
        if local.take_probe_request() {
            // Production traffic just failed or was refused: confirm with a probe soon — but no
            // sooner than `fast_interval` after the last one, or a burst of 429s would turn the
            // prober into a second source of load on a backend that is already refusing.
            let soonest = snapshot.policy.probes.fast_interval.get();
            for (name, at) in due.iter_mut() {
                let last = ran.get(name).copied().unwrap_or(now);
                *at = (*at).min((last + soonest).max(now));
            }
        }
        for capability in &snapshot.bootstrap.agent.capabilities {
            let Some(spec) = &capability.probe else {
                continue;
            };
            let name = capability.name.as_str();
            if due.get(name).is_some_and(|at| now < *at) {
                continue;
            }
            let (view, traffic) = local.refresh();
            let interval = interval(&snapshot, spec, view.state, view.estimates.saturation);
            due.insert(name.to_owned(), now + interval);
            if let Some(skip) = skip_reason(&snapshot, &local, view.state, traffic, interval, now) {
                metrics.probe(name, skip, None);
                continue;
            }
            ran.insert(name.to_owned(), Instant::now());
            let (record, signal) = probe(&client, &snapshot, capability, spec).await;
            metrics.probe(
                name,
                if record.ok { "ok" } else { "failed" },
                Some(Duration::from_secs_f64(record.latency_ms / 1000.0)),
            );
            if !record.ok {
                tracing::info!(
                    capability = name,
                    reason = record.reason.as_deref().unwrap_or(""),
                    "business probe failed"
                );
                // Confirm or clear a failure quickly rather than a full interval later.
                due.insert(
                    name.to_owned(),
                    Instant::now() + snapshot.policy.probes.fast_interval.get(),
                );
            }
            local.probed(record, signal);
        }
        run_golden_tasks(&client, &snapshot, &local, &mut golden_due).await;
    }
}

/// Runs the golden tasks of each capability whose run is due (`crate::quality`). They share the
/// probes' thread and their rule: never the agent's last free slot, asked before every task.
async fn run_golden_tasks(
    client: &AgentClient,
    snapshot: &Snapshot,
    local: &LocalAgent,
    due: &mut HashMap<String, Instant>,
) {
    let now = Instant::now();
    for capability in &snapshot.bootstrap.agent.capabilities {
        let Some(spec) = &capability.quality else {
            continue;
        };
        let name = capability.name.as_str();
        if due.get(name).is_some_and(|at| now < *at) {
            continue;
        }
        due.insert(name.to_owned(), now + spec.interval.get().max(TICK));
        // An agent out of rotation is the probes' business; its answers say nothing now.
        if local.barred(snapshot, Instant::now()).is_some() {
            continue;
        }
        let report = crate::quality::run(client, snapshot, capability, spec, || {
            !saturated(snapshot, local)
        })
        .await;
        local.quality_ran(report);
    }
}

/// Whether one more request would take the agent's last free slot (or there is none).
fn saturated(snapshot: &Snapshot, local: &LocalAgent) -> bool {
    let limit = snapshot.bootstrap.agent.max_concurrency.get();
    let load = local.load();
    load.in_flight + load.queued + 1 >= limit.max(2) && load.in_flight > 0
}

/// What a TCP connect to the agent found.
enum Connect {
    Accepted,
    /// Nothing listens there.
    Refused,
    /// Timed out or failed otherwise: no conclusion.
    Unknown,
}

async fn connect(snapshot: &Snapshot) -> Connect {
    let address = snapshot.bootstrap.agent.address.as_str();
    let timeout = snapshot.policy.timeouts.connect.get();
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(_)) => Connect::Accepted,
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::ConnectionRefused => Connect::Refused,
        _ => Connect::Unknown,
    }
}

/// The probe interval now: tighter while the agent is in trouble, looser while it is loaded.
/// Never below the scheduler's tick, whatever the config says.
fn interval(snapshot: &Snapshot, spec: &ProbeSpec, state: State, saturation: f64) -> Duration {
    let p = &snapshot.policy.probes;
    let chosen = match state {
        State::Probation | State::Ejected | State::Recovering | State::Parole => {
            p.fast_interval.get()
        }
        _ if saturation >= p.busy_threshold.get() => p.busy_interval.get(),
        _ => spec.interval.unwrap_or(p.interval).get(),
    };
    chosen.max(TICK)
}

/// Why a due probe should not run now, if it should not.
fn skip_reason(
    snapshot: &Snapshot,
    local: &LocalAgent,
    state: State,
    traffic: Traffic,
    interval: Duration,
    now: Instant,
) -> Option<&'static str> {
    // Never take the last free slot: a probe must not turn away real work.
    if saturated(snapshot, local) {
        return Some("skipped_saturated");
    }
    if state == State::Healthy && traffic.vouches(now, interval) {
        return Some("skipped_fresh");
    }
    None
}

/// Runs one probe and judges it. A refused connection is `Unreachable`: the agent is not running.
async fn probe(
    client: &AgentClient,
    snapshot: &Snapshot,
    capability: &Capability,
    spec: &ProbeSpec,
) -> (ProbeRecord, Signal) {
    let timeout = spec.timeout.unwrap_or(snapshot.policy.probes.timeout).get();
    let started = Instant::now();
    let outcome = tokio::time::timeout(timeout, send(client, snapshot, spec)).await;
    let elapsed = started.elapsed();
    let (reason, signal) = match outcome {
        Err(_) => (Some("timeout".to_owned()), Signal::Timeout(elapsed)),
        Ok(Err((message, refused))) => {
            let class = Class::Unreachable { refused };
            (
                Some(message),
                class.signal(elapsed).unwrap_or(Signal::Failure(elapsed)),
            )
        }
        Ok(Ok((class, status, text))) => judge(spec, class, status, &text, elapsed),
    };
    let record = ProbeRecord {
        capability: capability.name.to_string(),
        ok: reason.is_none(),
        reason,
        latency_ms: elapsed.as_secs_f64() * 1000.0,
        at: Some(Instant::now()),
        age_s: 0.0,
    };
    (record, signal)
}

async fn send(
    client: &AgentClient,
    snapshot: &Snapshot,
    spec: &ProbeSpec,
) -> Result<(Class, StatusCode, String), (String, bool)> {
    let request = AgentRequest {
        method: &spec.method,
        path: &spec.path,
        headers: &spec.headers,
        body: spec.body.as_deref(),
        marker: "1",
    };
    agent_request::send(client, snapshot, request).await
}

/// A probe passes on the status, body and JSON it expects. A miss is a failure, unless the
/// classifier reads the answer as a refusal (a 429, an agent's 503 with `retry-after`): then
/// it is load, with the cooldown the agent asked for.
fn judge(
    spec: &ProbeSpec,
    class: Class,
    status: StatusCode,
    text: &str,
    elapsed: Duration,
) -> (Option<String>, Signal) {
    if status.as_u16() != spec.expect_status {
        let signal = match class {
            Class::Refused { retry_after } => Signal::Refused { retry_after },
            _ => Signal::Failure(elapsed),
        };
        return (Some(format!("status {}", status.as_u16())), signal);
    }
    if let Some(needle) = &spec.expect_body {
        if !text.contains(needle.as_str()) {
            return (Some("body mismatch".to_owned()), Signal::Failure(elapsed));
        }
    }
    if let Some(expect) = &spec.expect_json {
        let found = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| v.pointer(&expect.pointer).cloned());
        if found.as_ref() != Some(&expect.value) {
            return (
                Some(format!("json mismatch at {}", expect.pointer)),
                Signal::Failure(elapsed),
            );
        }
    }
    (None, Signal::Success(elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ProbeSpec {
        ProbeSpec {
            method: "POST".into(),
            path: "/review".into(),
            body: None,
            headers: Default::default(),
            expect_status: 200,
            expect_body: Some(r#""ok":true"#.into()),
            expect_json: None,
            interval: None,
            timeout: None,
        }
    }

    #[test]
    fn judges_status_body_and_json() {
        let d = Duration::from_millis(5);
        let ok = Class::Success;
        assert_eq!(
            judge(&spec(), ok, StatusCode::OK, r#"{"ok":true}"#, d).0,
            None
        );
        let refused = Class::Refused {
            retry_after: Duration::from_secs(7),
        };
        let (reason, signal) = judge(&spec(), refused, StatusCode::TOO_MANY_REQUESTS, "", d);
        assert_eq!(reason.as_deref(), Some("status 429"));
        // The agent's own cooldown, as the classifier read it.
        assert_eq!(
            signal,
            Signal::Refused {
                retry_after: Duration::from_secs(7)
            }
        );
        let failed = judge(&spec(), Class::Failed, StatusCode::BAD_GATEWAY, "", d);
        assert_eq!(failed.1, Signal::Failure(d));
        assert_eq!(
            judge(&spec(), ok, StatusCode::OK, r#"{"ok":false}"#, d)
                .0
                .as_deref(),
            Some("body mismatch")
        );
        let mut s = spec();
        s.expect_body = None;
        s.expect_json = Some(crate::config::ExpectJson {
            pointer: "/answer".into(),
            value: serde_json::json!(42),
        });
        assert_eq!(judge(&s, ok, StatusCode::OK, r#"{"answer":42}"#, d).0, None);
        assert_eq!(
            judge(&s, ok, StatusCode::OK, r#"{"answer":41}"#, d)
                .0
                .as_deref(),
            Some("json mismatch at /answer")
        );
    }
}
