//! The demo's first act: the fault act's fake-online agent, once with the fleet in observe-only
//! mode. The sidecars route as a plain proxy would (round robin, nothing excluded) and count what
//! the model would have done instead; the summary says what it would have saved. Then
//! observe-only goes off, live, and the act waits for the agent to heal in every view so the
//! fault act proper starts from a healthy fleet.

use std::time::Duration;

use serde::Serialize;

use super::drive::Calls;
use super::{DemoError, Fleet, AGENTS, BROKEN, CAPABILITY};
use agent_reach::reach::State;
use testkit::Mode;

#[derive(Clone, Debug, Serialize)]
pub struct ObserveSummary {
    pub agent: String,
    pub duration_s: f64,
    /// The caller's calls, routed round robin.
    pub calls: u64,
    pub failed: u64,
    /// Calls the model would have sent elsewhere.
    pub disagreements: u64,
    /// Failures on an agent the model would have avoided: what it would have saved.
    pub avoidable_failures: u64,
    /// Latency above the model's pick's, on calls it would have sent elsewhere (s, summed).
    pub avoidable_latency_s: f64,
    /// From observe-only off (and the agent healed) until every view had it healthy again.
    pub healthy_again_after_ms: Option<f64>,
}

pub(super) async fn run(
    fleet: &mut Fleet,
    duration: Duration,
    concurrency: usize,
) -> Result<ObserveSummary, DemoError> {
    fleet.set_observe_only(true);
    let before = observed(fleet);
    let calls = Calls::default();
    let traffic = fleet.traffic(duration, concurrency, calls.clone());
    let broken = &fleet.agents[BROKEN].0;
    let fault = async {
        tokio::time::sleep(duration.mul_f64(0.2)).await;
        broken.set_mode(Mode::RateLimited);
    };
    tokio::join!(traffic, fault);
    let after = observed(fleet);
    broken.set_mode(Mode::Normal);
    fleet.set_observe_only(false);

    let name = AGENTS[BROKEN];
    let healthy = super::poll(Duration::from_secs(20), || {
        let caller = fleet.caller.status();
        let seen = caller
            .peer_views
            .iter()
            .find(|p| p.name == name)
            .is_some_and(|p| p.effective_state == State::Healthy);
        seen && fleet.agents[BROKEN].1.status().self_view.state == State::Healthy
    })
    .await;
    let calls = calls.take();
    Ok(ObserveSummary {
        agent: name.to_owned(),
        duration_s: super::round(duration.as_secs_f64()),
        calls: calls.len() as u64,
        failed: calls.iter().filter(|c| !c.ok).count() as u64,
        disagreements: after.disagreements - before.disagreements,
        avoidable_failures: after.avoidable_failures - before.avoidable_failures,
        avoidable_latency_s: super::round(
            (after.avoidable_latency_ms - before.avoidable_latency_ms) / 1000.0,
        ),
        healthy_again_after_ms: healthy.map(|d| d.as_secs_f64() * 1000.0),
    })
}

fn observed(fleet: &Fleet) -> agent_reach::outbound::ObserveCounts {
    fleet
        .caller
        .observed()
        .into_iter()
        .find(|(c, _)| c == CAPABILITY)
        .map(|(_, counts)| counts)
        .unwrap_or_default()
}
