//! What the inbound side has measured about the local agent: outcome counters and recent latencies.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::classify::Outcome;
use crate::reach::select_percentile;

/// Durations kept for percentiles: enough for a stable p95, bounded in memory.
const WINDOW: usize = 2048;

#[derive(Debug, Default)]
pub(crate) struct InboundStats {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    requests: u64,
    successes: u64,
    failures: u64,
    timeouts: u64,
    rejected: u64,
    durations_ms: VecDeque<f64>,
}

/// Counters since start plus percentiles over the most recent requests.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StatsSnapshot {
    pub requests: u64,
    pub successes: u64,
    pub failures: u64,
    pub timeouts: u64,
    pub rejected: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
}

impl InboundStats {
    pub(crate) fn record(&self, outcome: Outcome, duration: Duration) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.requests += 1;
        match outcome {
            Outcome::Success => inner.successes += 1,
            Outcome::Failure => inner.failures += 1,
            Outcome::Timeout => inner.timeouts += 1,
            Outcome::Rejected => inner.rejected += 1,
        }
        if outcome != Outcome::Rejected {
            if inner.durations_ms.len() == WINDOW {
                inner.durations_ms.pop_front();
            }
            inner
                .durations_ms
                .push_back(duration.as_secs_f64() * 1000.0);
        }
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut durations: Vec<f64> = inner.durations_ms.iter().copied().collect();
        StatsSnapshot {
            requests: inner.requests,
            successes: inner.successes,
            failures: inner.failures,
            timeouts: inner.timeouts,
            rejected: inner.rejected,
            p50_ms: select_percentile(&mut durations, 0.50),
            p95_ms: select_percentile(&mut durations, 0.95),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outcomes_and_percentiles() {
        let s = InboundStats::default();
        for ms in 1..=100 {
            s.record(Outcome::Success, Duration::from_millis(ms));
        }
        s.record(Outcome::Rejected, Duration::from_millis(0));
        s.record(Outcome::Failure, Duration::from_millis(100));
        let snap = s.snapshot();
        assert_eq!(
            (snap.requests, snap.successes, snap.failures, snap.rejected),
            (102, 100, 1, 1)
        );
        // 101 timed samples (rejections are not timed): 1..=100 ms plus the 100 ms failure.
        assert_eq!(snap.p50_ms, 51.0);
        assert_eq!(snap.p95_ms, 96.0);
    }
}
