//! The demo's slow-agent act: one agent's dependency gets ten times slower (no errors, `/healthz`
//! fine). Judged against the best candidate rather than the capability's timeout, its latency
//! costs it nearly every comparison: its share of calls collapses while the caller's p95 barely
//! moves.

use std::time::Duration;

use serde::Serialize;

use super::drive::{self, Calls};
use super::{round, Fleet};
use agent_reach::reach::percentile;
use testkit::Mode;

/// The agent that slows down (the one the membership act crashes later).
const SLOW: usize = 2;
/// Traffic before the slowdown, the time callers get to notice it, and the measured stretch.
const BEFORE: Duration = Duration::from_secs(2);
const NOTICE: Duration = Duration::from_secs(1);
const AFTER: Duration = Duration::from_secs(3);

/// What the slowdown did to the slow agent's share.
#[derive(Clone, Debug, Serialize)]
pub struct SlowSummary {
    pub agent: String,
    pub slow_ms: f64,
    /// Its share of the calls that reached agents, before and from `NOTICE` after the slowdown.
    pub share_before: f64,
    pub share_after: f64,
    /// The caller's p95 over the same stretches.
    pub p95_before_ms: f64,
    pub p95_after_ms: f64,
    pub calls: u64,
    pub failed: u64,
}

pub(super) async fn run(fleet: &Fleet, concurrency: usize) -> SlowSummary {
    let slow = &fleet.agents[SLOW].0;
    let reached = || -> Vec<u64> {
        fleet
            .agents
            .iter()
            .map(|(a, _)| a.stats().business)
            .collect()
    };
    let share = |from: &[u64], to: &[u64]| {
        let total: u64 = to.iter().zip(from).map(|(t, f)| t.saturating_sub(*f)).sum();
        let mine = to[SLOW].saturating_sub(from[SLOW]);
        if total == 0 {
            0.0
        } else {
            mine as f64 / total as f64
        }
    };
    // The storm's agents may still be ramping back in: their shares would hide the slow one's.
    fleet.settled(Duration::from_secs(15)).await;
    let before_calls = Calls::default();
    let start = reached();
    fleet
        .traffic(BEFORE, concurrency, before_calls.clone())
        .await;
    let before = reached();

    slow.set_mode(Mode::Slow);
    let noticing = Calls::default();
    fleet.traffic(NOTICE, concurrency, noticing.clone()).await;
    let noticed = reached();
    let after_calls = Calls::default();
    fleet.traffic(AFTER, concurrency, after_calls.clone()).await;
    let after = reached();
    slow.set_mode(Mode::Normal);

    let p95 = |calls: &[drive::Call]| {
        let mut ms: Vec<f64> = calls.iter().map(|c| c.ms).collect();
        ms.sort_by(f64::total_cmp);
        round(percentile(&ms, 0.95))
    };
    let (before_calls, noticing, after_calls) =
        (before_calls.take(), noticing.take(), after_calls.take());
    let all = || before_calls.iter().chain(&noticing).chain(&after_calls);
    SlowSummary {
        agent: slow.name().to_owned(),
        slow_ms: round(super::SLOW_LATENCY.as_secs_f64() * 1000.0),
        share_before: round(100.0 * share(&start, &before)) / 100.0,
        share_after: round(100.0 * share(&noticed, &after)) / 100.0,
        p95_before_ms: p95(&before_calls),
        p95_after_ms: p95(&after_calls),
        calls: all().count() as u64,
        failed: all().filter(|c| !c.ok).count() as u64,
    }
}
