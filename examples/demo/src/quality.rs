//! The demo's quality act: one agent's answers drift (same shape, still 200, `/healthz` fine,
//! every probe passing) while golden tasks compare them with a baseline recorded a moment
//! before. Its own sidecar marks it `degraded` within one run, callers move its share to the
//! agents that still answer well without a single failed call, and it is healthy again as soon
//! as its answers come back.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::drive::{self, Calls};
use super::{poll, round, DemoError, Fleet, CAPABILITY};
use agent_reach::config::{Compare, GoldenTask, HumanDuration, QualitySpec};
use testkit::Mode;

/// The agent whose answers drift.
const DRIFTING: usize = 0;
/// How often its golden tasks run in the act (the default is an hour).
const INTERVAL: Duration = Duration::from_millis(250);
/// Traffic measured before the drift and while it lasts.
const MEASURED: Duration = Duration::from_secs(1);
/// How long each change may take to show before the act moves on.
const WAIT: Duration = Duration::from_millis(1500);

/// What the drift did.
#[derive(Clone, Debug, Serialize)]
pub struct QualitySummary {
    pub agent: String,
    pub threshold: f64,
    /// The golden tasks' mean similarity: against the fresh baseline, while drifting, after.
    pub similarity_before: Option<f64>,
    pub similarity_drifted: Option<f64>,
    pub similarity_recovered: Option<f64>,
    /// What differed from the baseline while drifting.
    pub differing: Vec<String>,
    /// From the drift to its own sidecar showing `degraded`, and to the caller seeing it.
    pub degraded_after_ms: Option<f64>,
    pub caller_saw_after_ms: Option<f64>,
    /// Its share of the calls that reached agents, before and while degraded.
    pub share_before: f64,
    pub share_degraded: f64,
    /// From the answers' return to `healthy` again.
    pub recovered_after_ms: Option<f64>,
    pub calls: u64,
    pub failed: u64,
}

pub(super) async fn run(fleet: &Fleet, concurrency: usize) -> Result<QualitySummary, DemoError> {
    let (agent, sidecar) = &fleet.agents[DRIFTING];
    let name = agent.name().to_owned();
    let spec = golden(
        fleet
            .key_dir
            .join("baselines")
            .join(format!("{name}-review.json")),
    );
    // `agent-reach baseline record`, in process: one answer per golden task, written as its
    // baseline.
    let snapshot = sidecar.store().snapshot();
    let capability = snapshot
        .bootstrap
        .agent
        .capability(CAPABILITY)
        .ok_or_else(|| DemoError::Config(format!("{name} has no {CAPABILITY}")))?;
    let client = agent_reach::http::client::AgentClient::new(&snapshot.policy);
    for written in agent_reach::quality::record(&client, &snapshot, capability, &spec).await {
        written.map_err(|e| DemoError::Config(e.to_string()))?;
    }
    let mut bootstrap = snapshot.bootstrap.clone();
    for c in &mut bootstrap.agent.capabilities {
        c.quality = Some(spec.clone());
    }
    sidecar.store().replace(bootstrap, snapshot.policy.clone());

    let similarity = || {
        sidecar
            .status()
            .quality
            .first()
            .and_then(|q| q.report.similarity)
    };
    poll(WAIT, || similarity().is_some()).await;
    let similarity_before = similarity();

    let calls = Calls::default();
    let reached = || -> Vec<u64> {
        fleet
            .agents
            .iter()
            .map(|(a, _)| a.stats().business)
            .collect()
    };
    let share = |from: &[u64], to: &[u64]| {
        let total: u64 = to.iter().zip(from).map(|(t, f)| t.saturating_sub(*f)).sum();
        let mine = to[DRIFTING].saturating_sub(from[DRIFTING]);
        mine as f64 / total.max(1) as f64
    };
    let outbound = fleet.caller.addrs.outbound;
    let start = reached();
    drive::traffic(outbound, MEASURED, concurrency, calls.clone()).await;
    let before = reached();

    agent.set_mode(Mode::Drift);
    let drifted = Instant::now();
    let degraded_after = poll(WAIT, || sidecar.status().self_state == "degraded").await;
    let own = sidecar.status();
    let last = own.quality.first().map(|q| q.report.clone());
    let caller_saw = poll(WAIT, || {
        fleet.caller.status().peer_views.iter().any(|p| {
            p.name == name
                && p.self_view
                    .as_ref()
                    .and_then(|s| s.view.quality)
                    .is_some_and(|q| q.degraded)
        })
    })
    .await
    .map(|_| drifted.elapsed());
    let degraded_from = reached();
    drive::traffic(outbound, MEASURED, concurrency, calls.clone()).await;
    let degraded_to = reached();

    agent.set_mode(Mode::Normal);
    let recovered = poll(WAIT, || sidecar.status().self_state == "healthy").await;
    let similarity_recovered = similarity();
    // Later acts run without golden tasks.
    let snapshot = sidecar.store().snapshot();
    let mut bootstrap = snapshot.bootstrap.clone();
    for c in &mut bootstrap.agent.capabilities {
        c.quality = None;
    }
    sidecar.store().replace(bootstrap, snapshot.policy.clone());

    let calls = calls.take();
    let ms = |d: Option<Duration>| d.map(|d| round(d.as_secs_f64() * 1000.0));
    Ok(QualitySummary {
        agent: name,
        threshold: spec.threshold,
        similarity_before,
        similarity_drifted: last.as_ref().and_then(|r| r.similarity),
        similarity_recovered,
        differing: last
            .iter()
            .flat_map(|r| &r.tasks)
            .flat_map(|t| t.differing.clone())
            .collect(),
        degraded_after_ms: ms(degraded_after),
        caller_saw_after_ms: ms(caller_saw),
        share_before: round(100.0 * share(&start, &before)) / 100.0,
        share_degraded: round(100.0 * share(&degraded_from, &degraded_to)) / 100.0,
        recovered_after_ms: ms(recovered),
        calls: calls.len() as u64,
        failed: calls.iter().filter(|c| !c.ok).count() as u64,
    })
}

/// One golden review: `ok` and `language` must stay the same, the summary close.
fn golden(baseline: std::path::PathBuf) -> QualitySpec {
    QualitySpec {
        interval: HumanDuration(INTERVAL),
        threshold: 0.8,
        tasks: vec![GoldenTask {
            method: "POST".to_owned(),
            path: "/review".to_owned(),
            body: Some(r#"{"code":"def add(a, b): return a + b"}"#.to_owned()),
            headers: Default::default(),
            baseline,
            compare: Compare {
                json_fields: vec!["/ok".to_owned(), "/language".to_owned()],
                text_field: Some("/summary".to_owned()),
            },
        }],
    }
}
