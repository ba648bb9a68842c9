//! What a run measured: the main table's figures (`outcome`), and the shares, percentiles and
//! failed calls the scenarios' own measures are read from.

use std::collections::HashMap;
use std::time::Duration;

use super::{Call, Sample};
use crate::scenario::Scenario;
use crate::{Extra, AGENTS};

/// A new agent is at full traffic at this fraction of a fair share, over one second.
const FULL_SHARE: f64 = 0.9;

pub(crate) struct Outcome {
    pub(crate) calls: usize,
    pub(crate) failed_pct: f64,
    pub(crate) mean_ms: f64,
    pub(crate) p95_ms: f64,
    pub(crate) out_after: Option<Duration>,
    pub(crate) peak_ratio: Option<f64>,
    /// From the newcomer's start to its first second at full traffic.
    pub(crate) full_after: Option<Duration>,
    /// Calls that failed from the newcomer's start to the end of the run.
    pub(crate) join_failed: usize,
    /// The measures of burst, slow-agent, equal-pair and crash-same-address.
    pub(crate) extra: Option<Extra>,
}

/// A run's record, for the measures of the newer scenarios.
pub(crate) struct Observed<'a> {
    pub(crate) calls: &'a [Call],
    pub(crate) samples: &'a [Sample],
    pub(crate) fault_at: Duration,
    /// When the fault came: `fault_at`, to the watching loop's tick.
    pub(crate) broke_at: Duration,
    pub(crate) joined_at: Option<Duration>,
    /// agent-reach: the peers its caller took out of rotation, with the worst state seen.
    pub(crate) left: Option<HashMap<String, &'static str>>,
    /// agent-reach: attempts refused as saturated, at the caller's sidecar and at ramp's weak
    /// agent's.
    pub(crate) refusals: Option<(u64, u64)>,
}

impl Observed<'_> {
    /// The failed calls made from `from` to `to`.
    pub(crate) fn failed_sent(&self, from: Duration, to: Duration) -> usize {
        self.calls
            .iter()
            .filter(|c| !c.1 && sent(c) >= from && sent(c) < to)
            .count()
    }

    /// When the last sample was taken.
    pub(crate) fn end(&self) -> Duration {
        self.samples.last().map_or(Duration::ZERO, |s| s.at)
    }
}

pub(crate) fn outcome(
    scenario: Scenario,
    calls: &[Call],
    samples: &[Sample],
    fault_at: Duration,
    joined_at: Option<Duration>,
) -> Outcome {
    let mut ms: Vec<f64> = calls.iter().map(|c| c.2).collect();
    ms.sort_by(f64::total_cmp);
    let failed = calls.iter().filter(|c| !c.1).count();
    let p95 = ms
        .get(((ms.len() as f64 * 0.95) as usize).min(ms.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    let mean = if ms.is_empty() {
        0.0
    } else {
        ms.iter().sum::<f64>() / ms.len() as f64
    };
    // How long the broken agent kept getting calls: from the fault to the end of the first
    // 500 ms in which it got under 5 % of its fair share of the calls that reached any agent
    // (sent into its path, in half-open). A half second in which the agents got less than a
    // tenth of what they got in an average half second before the fault (callers stuck) says
    // nothing either way.
    let bad = scenario.broken();
    let fair = 1.0 / AGENTS as f64;
    let arrived = |s: &Sample| s.reached.iter().sum::<u64>();
    let before = samples.iter().rfind(|s| s.at < fault_at);
    let quiet = before.map_or(0.0, |b| {
        let first = samples.first().map_or(0, arrived);
        arrived(b).saturating_sub(first) as f64 / b.at.as_secs_f64().max(0.1) * 0.5 * 0.1
    });
    let out_after = scenario
        .measures_out()
        .then(|| {
            samples
                .windows(6)
                .filter(|w| w[0].at >= fault_at)
                .find(|w| {
                    let (first, last) = (&w[0], &w[w.len() - 1]);
                    let got = |i: usize| last.reached[i].saturating_sub(first.reached[i]);
                    let all: u64 = (0..first.reached.len()).map(got).sum();
                    let reached: u64 = bad.iter().map(|i| got(*i)).sum();
                    all > 0
                        && all as f64 >= quiet
                        && reached as f64 / all as f64 / bad.len() as f64 <= 0.05 * fair
                })
                .map(|w| w[w.len() - 1].at.saturating_sub(fault_at))
        })
        .flatten();
    // Retry storm: the busiest 500 ms of the busiest survivor against its fair share of the
    // calls made (they are two: a half each).
    let peak_ratio = (scenario == Scenario::RetryStorm).then(|| {
        samples
            .windows(6)
            .filter(|w| w[0].at >= fault_at)
            .map(|w| {
                let (first, last) = (&w[0], &w[w.len() - 1]);
                let made = last.calls.saturating_sub(first.calls).max(1) as f64;
                (2..AGENTS)
                    .map(|i| last.reached[i].saturating_sub(first.reached[i]) as f64 / (made / 2.0))
                    .fold(0.0, f64::max)
            })
            .fold(0.0, f64::max)
    });
    // A newcomer at full traffic: the first second, from its start, in which it got at least
    // 90 % of a fair share of the calls that reached any agent.
    let full_after = scenario.newcomer().zip(joined_at).and_then(|(new, join)| {
        let fair = 1.0 / scenario.slots() as f64;
        samples
            .windows(11)
            .filter(|w| w[0].at >= join)
            .find(|w| {
                let (first, last) = (&w[0], &w[w.len() - 1]);
                let all: u64 = (0..first.reached.len())
                    .map(|i| last.reached[i].saturating_sub(first.reached[i]))
                    .sum();
                let mine = last.reached[new].saturating_sub(first.reached[new]);
                all > 0 && mine as f64 / all as f64 >= FULL_SHARE * fair
            })
            .map(|w| w[w.len() - 1].at.saturating_sub(join))
    });
    let join_failed = joined_at.map_or(0, |join| {
        calls.iter().filter(|c| !c.1 && c.0 >= join).count()
    });
    Outcome {
        calls: calls.len(),
        failed_pct: 100.0 * failed as f64 / calls.len().max(1) as f64,
        mean_ms: mean,
        p95_ms: p95,
        out_after,
        peak_ratio,
        full_after,
        join_failed,
        extra: None,
    }
}

/// When a call was made.
pub(crate) fn sent(c: &Call) -> Duration {
    c.0.saturating_sub(Duration::from_secs_f64(c.2 / 1000.0))
}

/// The calls that reached each agent from `from` to `to`, by the samples.
pub(crate) fn reached_between(
    samples: &[Sample],
    from: Duration,
    to: Duration,
) -> Option<Vec<u64>> {
    let first = samples.iter().rfind(|s| s.at <= from).or(samples.first())?;
    let last = samples.iter().rfind(|s| s.at <= to)?;
    (last.at > first.at).then(|| {
        last.reached
            .iter()
            .zip(&first.reached)
            .map(|(l, f)| l.saturating_sub(*f))
            .collect()
    })
}

/// Agent `slot`'s share of the calls that reached any agent from `from` to `to`.
pub(crate) fn share(samples: &[Sample], slot: usize, from: Duration, to: Duration) -> Option<f64> {
    let got = reached_between(samples, from, to)?;
    let all: u64 = got.iter().sum();
    (all > 0).then(|| got.get(slot).copied().unwrap_or(0) as f64 / all as f64)
}

pub(crate) fn p95(calls: &[&Call]) -> f64 {
    let mut ms: Vec<f64> = calls.iter().map(|c| c.2).collect();
    ms.sort_by(f64::total_cmp);
    ms.get(((ms.len() as f64 * 0.95) as usize).min(ms.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0)
}

/// The lowest and highest of some shares.
pub(crate) fn range(shares: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    shares.fold(None, |r, s| match r {
        None => Some((s, s)),
        Some((lo, hi)) => Some((f64::min(lo, s), f64::max(hi, s))),
    })
}

/// A share as a percentage, `-` when there is none.
pub(crate) fn pct(share: Option<f64>) -> String {
    share.map_or("-".to_owned(), |s| format!("{:.1}%", 100.0 * s))
}
