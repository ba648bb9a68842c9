//! The demo's second act: a correlated failure. Two of the three agents refuse at once (their
//! shared model backend is rate-limited); every call's retries land on the one that is left. The
//! retry budget, jittered backoff and cooldowns keep that fallback's load near its fair share —
//! the calls themselves — instead of a burst of retries that would melt it (`docs/reach-model.md`).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::drive::{self, Calls};
use super::{round, Fleet, AGENTS};
use testkit::Mode;

/// What the storm did to the fallback.
#[derive(Clone, Debug, Serialize)]
pub struct StormSummary {
    pub failing: Vec<&'static str>,
    pub fallback: &'static str,
    pub duration_s: f64,
    pub calls: u64,
    pub failed: u64,
    /// Calls per second the callers offered.
    pub offered_per_s: f64,
    /// The fallback's busiest 500 ms, in calls per second.
    pub fallback_peak_per_s: f64,
    /// `fallback_peak_per_s / offered_per_s`: 1 is the fair share of a fallback that takes it all.
    pub peak_ratio: f64,
    /// Attempts that reached any agent, per call.
    pub attempts_per_call: f64,
}

/// Breaks `coder-1` and `coder-2` together for `duration` under traffic, then heals them.
pub(super) async fn run(fleet: &Fleet, duration: Duration, concurrency: usize) -> StormSummary {
    let (failing, fallback) = ([0, 1], 2);
    let reached_before: u64 = fleet.agents.iter().map(|(a, _)| a.stats().business).sum();
    for i in failing {
        fleet.agents[i].0.set_mode(Mode::RateLimited);
    }
    let calls = Calls::default();
    let started = Instant::now();
    let traffic = fleet.traffic(duration, concurrency, calls.clone());
    let watch = drive::watch(
        &fleet.caller,
        &fleet.agents[fallback].0,
        AGENTS[fallback],
        started,
        duration,
        &calls,
    );
    let ((), samples) = tokio::join!(traffic, watch);
    let elapsed = started.elapsed().as_secs_f64().max(1e-3);
    for i in failing {
        fleet.agents[i].0.set_mode(Mode::Normal);
    }
    let calls = calls.take();
    let reached: u64 = fleet
        .agents
        .iter()
        .map(|(a, _)| a.stats().business)
        .sum::<u64>()
        - reached_before;
    // Busiest 500 ms window of the fallback (samples are 100 ms apart).
    let peak = samples
        .windows(6)
        .map(|w| {
            let (first, last) = (&w[0], &w[w.len() - 1]);
            let secs = (last.at - first.at).as_secs_f64().max(1e-3);
            last.reached.saturating_sub(first.reached) as f64 / secs
        })
        .fold(0.0, f64::max);
    let offered = calls.len() as f64 / elapsed;
    StormSummary {
        failing: failing.iter().map(|i| AGENTS[*i]).collect(),
        fallback: AGENTS[fallback],
        duration_s: round(elapsed),
        calls: calls.len() as u64,
        failed: calls.iter().filter(|c| !c.ok).count() as u64,
        offered_per_s: round(offered),
        fallback_peak_per_s: round(peak),
        peak_ratio: (peak / offered.max(1e-3) * 100.0).round() / 100.0,
        attempts_per_call: (reached as f64 / (calls.len() as f64).max(1.0) * 100.0).round() / 100.0,
    }
}
