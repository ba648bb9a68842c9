//! The async act's crash (`docs/tasks.md`, Durability): the caller — the sidecar holding the
//! task queue, and the fleet's gossip seed — is killed with tasks queued and one round in
//! flight, and started again on the same store and gossip address, as a container restarted in
//! its pod. Its runner waits for gossip to hand the fleet back before resuming; every accepted
//! task ends done, and no agent runs one task's round twice (each agent's execution log).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http::Request;
use serde::Serialize;

use super::{start_sidecar, DemoError, Fleet, CAPABILITY};
use agent_reach::config::{ConfigPaths, ConfigStore, Policy};
use agent_reach::http::{body, client};
use agent_reach::Bootstrap;
use testkit::Mode;

/// Tasks submitted just before the kill.
const TASKS: usize = 40;

#[derive(Clone, Debug, Default, Serialize)]
pub struct RestartSummary {
    /// `202`s before the kill, and how many of those were not finished when it came.
    pub accepted: u64,
    pub unfinished_at_kill: u64,
    /// From the new process's start to its first resumed task done, and to the last.
    pub first_done_after_ms: Option<f64>,
    pub all_done_after_ms: Option<f64>,
    /// Accepted tasks done after the restart; lost: accepted, then missing or not done.
    pub done: u64,
    pub lost: u64,
    /// Task rounds an agent executed more than once (its execution log, by idempotency key).
    pub run_twice: u64,
}

pub(super) async fn run(fleet: &mut Fleet) -> Result<RestartSummary, DemoError> {
    let http = client::build(&fleet.policy);
    let outbound = fleet.caller.addrs.outbound;
    // Slow agents: the kill finds tasks running and most still queued.
    for (agent, _) in &fleet.agents {
        agent.set_mode(Mode::Slow);
    }
    let submissions = (0..TASKS).map(|n| {
        let http = http.clone();
        async move {
            let request = Request::post(format!("http://{outbound}/review"))
                .header("reach-capability", CAPABILITY)
                .header("prefer", "respond-async")
                .body(body::full(format!(r#"{{"code":"restart {n}"}}"#)))
                .ok()?;
            let response = http.request(request).await.ok()?;
            if response.status() != http::StatusCode::ACCEPTED {
                return None;
            }
            super::task_api::read_json(response).await["id"]
                .as_str()
                .map(str::to_owned)
        }
    });
    let ids: Vec<String> = futures_join_all(submissions).await;
    // Let the runner take a round to the agents before the crash.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let bootstrap = restarted_bootstrap(fleet);
    let policy: Policy = fleet.caller.store().snapshot().policy.clone();
    let stand_in = start_sidecar(
        Bootstrap::local(
            "stand-in",
            std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
            &[],
        )
        .map_err(DemoError::Config)?,
        Policy::default(),
    )
    .await?;
    let old = std::mem::replace(&mut fleet.caller, stand_in);
    let mut unfinished = 0;
    for id in &ids {
        if super::task_api::task(&http, outbound, id).await["state"] != "done" {
            unfinished += 1;
        }
    }
    old.kill().await;
    for (agent, _) in &fleet.agents {
        agent.set_mode(Mode::Normal);
    }

    // The same bootstrap again; the store's file lock and the gossip port free up as the old
    // process's threads wind down.
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(10);
    let caller = loop {
        let store = std::sync::Arc::new(ConfigStore::new(
            bootstrap.clone(),
            policy.clone(),
            ConfigPaths::default(),
        ));
        match agent_reach::Sidecar::start(store).await {
            Ok(sidecar) => break sidecar,
            Err(err) if Instant::now() > deadline => return Err(err.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let started = Instant::now();
    let outbound = caller.addrs.outbound;
    let stand_in = std::mem::replace(&mut fleet.caller, caller);
    stand_in.kill().await;

    let (mut done, mut first_done, mut all_done) = (0u64, None, None);
    let until = Instant::now() + Duration::from_secs(60);
    let mut pending: Vec<&String> = ids.iter().collect();
    while !pending.is_empty() && Instant::now() < until {
        let mut still = Vec::new();
        for id in pending {
            let t = super::task_api::task(&http, outbound, id).await;
            if t["state"] == "done" {
                done += 1;
                first_done.get_or_insert_with(|| started.elapsed());
            } else {
                still.push(id);
            }
        }
        pending = still;
        if pending.is_empty() {
            all_done = Some(started.elapsed());
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let ms = |d: Option<Duration>| d.map(|d| super::round(d.as_secs_f64() * 1000.0));
    Ok(RestartSummary {
        accepted: ids.len() as u64,
        unfinished_at_kill: unfinished,
        first_done_after_ms: ms(first_done),
        all_done_after_ms: ms(all_done),
        done,
        lost: ids.len() as u64 - done,
        run_twice: run_twice(fleet, &ids),
    })
}

/// The caller's bootstrap, to start it again as it was: the same store file, and its gossip on
/// the address the fleet knows as its seed.
fn restarted_bootstrap(fleet: &Fleet) -> Bootstrap {
    let mut bootstrap = fleet.caller.store().snapshot().bootstrap.clone();
    if let (Some(g), Some(addr)) = (bootstrap.gossip.as_mut(), fleet.caller.addrs.gossip) {
        g.listen = addr;
    }
    bootstrap
}

/// Rounds of the tasks `ids` (idempotency keys `<id>#<round>`) some agent's execution log shows
/// more than once.
fn run_twice(fleet: &Fleet, ids: &[String]) -> u64 {
    let ours = |key: &str| {
        key.split_once('#')
            .is_some_and(|(id, _)| ids.iter().any(|i| i == id))
    };
    let mut twice = 0;
    for (agent, _) in &fleet.agents {
        let Ok(text) = std::fs::read_to_string(fleet.execution_log(agent.name())) else {
            continue;
        };
        let mut seen: HashMap<String, u32> = HashMap::new();
        for line in text.lines() {
            let entry: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            if let Some(key) = entry["key"].as_str().filter(|k| ours(k)) {
                *seen.entry(key.to_owned()).or_default() += 1;
            }
        }
        twice += seen.values().filter(|n| **n > 1).count() as u64;
    }
    twice
}

/// Awaits every future; keeps the `Some`s.
async fn futures_join_all<F, T>(futures: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = Option<T>> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        if let Ok(Some(value)) = handle.await {
            out.push(value);
        }
    }
    out
}
