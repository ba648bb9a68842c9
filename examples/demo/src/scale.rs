//! The demo's scale act: callers added in steps, then removed, while every sidecar reports the
//! fleet's demand for `code-review` against its capacity (`reach_capability_demand_ratio`, the
//! signal an autoscaler reads; `docs/kubernetes.md` "Scaling on demand"). The summary shows the
//! ratio follow the callers, and how far apart the sidecars' figures were.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::drive::Calls;
use super::{Fleet, CAPABILITY};
use agent_reach::peers::CapabilityDemand;
use testkit::Mode;

/// The demand ratio each step aims for: the callers are this share of the fleet's slots.
const STEPS: [f64; 4] = [0.1, 0.5, 0.9, 0.1];
/// How long each step's callers run; the ratio is read over its second half, once the gossip
/// has carried the new load.
const STEP: Duration = Duration::from_millis(850);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// What the fleet reported at each step.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleSummary {
    pub capability: &'static str,
    /// Concurrency slots of the agents serving the capability in rotation, and how many serve it.
    pub capacity: u64,
    pub members: usize,
    pub steps: Vec<ScaleStep>,
    /// After the last callers stopped.
    pub ratio_after: f64,
    pub calls: u64,
    pub failed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScaleStep {
    pub callers: usize,
    /// The caller's sidecar's ratio, averaged over the step's second half.
    pub ratio: f64,
    /// The largest difference between two sidecars' ratios at the step's end.
    pub spread: f64,
}

pub(super) async fn run(fleet: &Fleet) -> ScaleSummary {
    // Calls as long as a model's (`SLOW_LATENCY`) rather than the mocks' usual 20–60 ms: the
    // callers' time is then spent at the agents, where demand is counted, not between calls.
    for (agent, _) in &fleet.agents {
        agent.set_mode(Mode::Slow);
    }
    let start = demand(&fleet.caller);
    let capacity = start.as_ref().map_or(0, |d| d.capacity);
    let calls = Calls::default();
    let mut steps = Vec::with_capacity(STEPS.len());
    for target in STEPS {
        let callers = ((target * capacity as f64).round() as usize).max(1);
        let traffic = fleet.traffic(STEP, callers, calls.clone());
        let ((), (ratio, spread)) = tokio::join!(traffic, watch(fleet));
        steps.push(ScaleStep {
            callers,
            ratio: hundredths(ratio),
            spread: hundredths(spread),
        });
    }
    // The last calls ended with the step; the ratio follows within a gossip refresh.
    tokio::time::sleep(STEP / 2).await;
    for (agent, _) in &fleet.agents {
        agent.set_mode(Mode::Normal);
    }
    let ratio_after = demand(&fleet.caller).map_or(0.0, |d| hundredths(d.ratio));
    let calls = calls.take();
    ScaleSummary {
        capability: CAPABILITY,
        capacity,
        members: start.map_or(0, |d| d.members),
        steps,
        ratio_after,
        calls: calls.len() as u64,
        failed: calls.iter().filter(|c| !c.ok).count() as u64,
    }
}

/// The caller's mean ratio over the step's second half, and the sidecars' spread at its end.
async fn watch(fleet: &Fleet) -> (f64, f64) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    let mut samples = Vec::new();
    while started.elapsed() + SAMPLE_EVERY < STEP {
        tick.tick().await;
        if started.elapsed() >= STEP / 2 {
            samples.push(demand(&fleet.caller).map_or(0.0, |d| d.ratio));
        }
    }
    let ratios: Vec<f64> = fleet
        .sidecars()
        .map(|s| demand(s).map_or(0.0, |d| d.ratio))
        .collect();
    let spread = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        - ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    (mean, spread.max(0.0))
}

/// `sidecar`'s figures for the demo's capability, as its `/metrics` and `/status` show them.
fn demand(sidecar: &agent_reach::Sidecar) -> Option<CapabilityDemand> {
    sidecar
        .status()
        .capabilities
        .into_iter()
        .find(|c| c.name == CAPABILITY)
}

fn hundredths(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
