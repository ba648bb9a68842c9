//! The demo's third act: membership by gossip. One agent's sidecar crashes (no goodbye) and
//! leaves every routing table within the failure-detection time; then a new agent starts, joins
//! through the seed, and ramps up from parole to its full share — all under traffic.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::drive::{self, Calls};
use super::{poll, round, DemoError, Fleet, TimedState};

/// The newcomer's share of calls counts as full at this fraction of its fair share.
const FULL_SHARE: f64 = 0.8;

#[derive(Clone, Debug, Serialize)]
pub struct MembershipSummary {
    /// From the first sidecar's start until the caller knew every agent, through one seed.
    pub fleet_found_after_ms: f64,
    pub killed: String,
    /// From the crash until neither the caller nor any agent's sidecar listed it.
    pub left_every_table_after_ms: Option<f64>,
    pub joined: String,
    /// The newcomer's sidecar was set up by the injector from its pod's annotations.
    pub joined_by_injection: super::Injection,
    /// From the newcomer's start until the caller listed it.
    pub joined_after_ms: Option<f64>,
    /// The caller's view of the newcomer, state by state.
    pub newcomer_states: Vec<TimedState>,
    /// From the newcomer's start to the first 500 ms in which it got at least 80% of a fair share.
    pub full_share_after_ms: Option<f64>,
    pub calls: u64,
    pub failed: u64,
    /// Calls that were in flight on the crashed agent: a crash loses what it was doing.
    pub failed_at_crash: u64,
}

/// Long enough for a crash to be detected and a newcomer to ramp up, whatever the run's length.
pub(super) fn act_length(run: Duration) -> Duration {
    run.mul_f64(0.5).max(Duration::from_secs(6))
}

pub(super) async fn run(
    fleet: &mut Fleet,
    duration: Duration,
    concurrency: usize,
) -> Result<MembershipSummary, DemoError> {
    let calls = Calls::default();
    let started = Instant::now();
    let traffic = tokio::spawn(fleet.traffic(duration, concurrency, calls.clone()));

    // The crash.
    tokio::time::sleep(duration.mul_f64(0.1)).await;
    let (agent, sidecar) = fleet.agents.remove(fleet.agents.len() - 1);
    let killed = agent.name().to_owned();
    let crashed_at = started.elapsed();
    sidecar.kill().await;
    let left = poll(Duration::from_secs(10), || {
        !fleet.caller.status().peers.iter().any(|p| p.name == killed)
            && fleet
                .agents
                .iter()
                .all(|(_, s)| !s.status().peers.iter().any(|p| p.name == killed))
    })
    .await;
    agent.stop().await;

    // The newcomer.
    let joined = "coder-4".to_owned();
    let join_at = started.elapsed();
    let injection = fleet.add_injected_agent(&joined).await?;
    let newcomer = fleet.agents.len() - 1;
    let joined_after = poll(Duration::from_secs(10), || {
        fleet.caller.status().peers.iter().any(|p| p.name == joined)
    })
    .await;
    let samples = drive::watch(
        &fleet.caller,
        &fleet.agents[newcomer].0,
        &joined,
        started,
        duration,
        &calls,
    )
    .await;
    let _ = traffic.await;

    let calls = calls.take();
    let fair = 1.0 / fleet.agents.len() as f64;
    let full_share_at = samples.windows(6).find_map(|w| {
        let (first, last) = (&w[0], &w[w.len() - 1]);
        let calls = last.calls.saturating_sub(first.calls) as f64;
        let share = last.reached.saturating_sub(first.reached) as f64 / calls.max(1.0);
        (calls > 0.0 && share >= FULL_SHARE * fair).then_some(last.at)
    });
    let mut states: Vec<TimedState> = Vec::new();
    for s in &samples {
        if let Some(state) = s.state {
            if states.last().map(|t| t.state) != Some(state) {
                states.push(TimedState {
                    at_s: round((s.at - join_at).as_secs_f64()),
                    state,
                });
            }
        }
    }
    let crash_window = crashed_at..crashed_at + Duration::from_secs(1);
    Ok(MembershipSummary {
        fleet_found_after_ms: fleet.found_after.as_secs_f64() * 1000.0,
        killed,
        left_every_table_after_ms: left.map(|d| d.as_secs_f64() * 1000.0),
        joined,
        joined_by_injection: injection,
        joined_after_ms: joined_after.map(|d| d.as_secs_f64() * 1000.0),
        newcomer_states: states,
        full_share_after_ms: full_share_at
            .map(|at| (at.saturating_sub(join_at)).as_secs_f64() * 1000.0),
        calls: calls.len() as u64,
        failed: calls.iter().filter(|c| !c.ok).count() as u64,
        failed_at_crash: calls
            .iter()
            .filter(|c| !c.ok && crash_window.contains(&c.at))
            .count() as u64,
    })
}
