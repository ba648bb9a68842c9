//! Hedging (`capabilities.<name>.hedge`, `docs/chains.md`): when a retry-safe call's first
//! attempt has not answered its head after the threshold, a second goes to another candidate.
//! The first head wins; the other attempt is dropped, its request and connection with it, so the
//! callee's sidecar sees a cancel, not a failure. A hedge spends the retry budget like a retry,
//! so a slow fleet cannot double its load.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tower::ServiceExt;

use super::retry::Attempt;
use crate::http::step::{answer, Step};
use crate::metrics::Metrics;
use crate::outbound::call::Try;

/// Head latencies kept per capability for `after: p95`.
const SAMPLES: usize = 128;
/// Fewer samples than this: no p95 yet, so no hedge.
const MIN_SAMPLES: usize = 20;
/// Capabilities tracked at most (only those with `hedge: {after: p95}` are).
const MAX_CAPABILITIES: usize = 256;

/// This caller's recent time to an answer's head, per hedged capability: what `p95` reads.
#[derive(Debug, Default)]
pub(in crate::outbound) struct HeadTimes {
    by_capability: Mutex<HashMap<String, VecDeque<u32>>>,
}

impl HeadTimes {
    pub(super) fn p95(&self, capability: &str) -> Option<Duration> {
        let map = self.by_capability.lock().unwrap_or_else(|p| p.into_inner());
        let samples = map.get(capability).filter(|s| s.len() >= MIN_SAMPLES)?;
        let mut sorted: Vec<u32> = samples.iter().copied().collect();
        sorted.sort_unstable();
        let at = (sorted.len() * 95).div_ceil(100).saturating_sub(1);
        sorted
            .get(at)
            .map(|ms| Duration::from_millis(u64::from(*ms)))
    }

    fn record(&self, capability: &str, took: Duration) {
        let ms = u32::try_from(took.as_millis()).unwrap_or(u32::MAX);
        let mut map = self.by_capability.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(capability) && map.len() >= MAX_CAPABILITIES {
            return;
        }
        let samples = map.entry(capability.to_owned()).or_default();
        if samples.len() >= SAMPLES {
            samples.pop_front();
        }
        samples.push_back(ms);
    }
}

/// What a race came to: the answer, and the hedge's candidate when its answer is the one used.
pub(super) struct Raced<B> {
    pub(super) attempt: Attempt<B>,
    pub(super) hedge: Option<usize>,
}

/// Runs `first`; after `wait` (never, when `None`: the race only times the head for `p95`)
/// starts the attempt `hedge` builds (`None`: no candidate or no budget left), and takes the
/// first answer that ran: a refusal or failure leaves the race to the other attempt.
pub(super) async fn race<B, S, F>(
    inner: S,
    first: Try,
    wait: Option<Duration>,
    hedge: F,
    (metrics, times, capability): (&Metrics, &HeadTimes, &str),
) -> Raced<B>
where
    S: Step<Try, Response = Attempt<B>>,
    F: FnOnce() -> Option<(Try, usize)>,
{
    let started = Instant::now();
    let first = inner.clone().oneshot(first);
    tokio::pin!(first);
    let timer = async {
        match wait {
            Some(wait) => tokio::time::sleep(wait).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        done = &mut first => {
            let attempt = answer(done);
            if ran(&attempt) {
                times.record(capability, started.elapsed());
            }
            return Raced { attempt, hedge: None };
        }
        () = timer => {}
    }
    let Some((second, index)) = hedge() else {
        return Raced {
            attempt: answer(first.await),
            hedge: None,
        };
    };
    let second = inner.oneshot(second);
    tokio::pin!(second);
    let (attempt, won) = tokio::select! {
        a = &mut first => {
            let a = answer(a);
            if ran(&a) { (a, false) } else { (answer(second.await), true) }
        }
        b = &mut second => {
            let b = answer(b);
            if ran(&b) { (b, true) } else { (answer(first.await), false) }
        }
    };
    // The other attempt, still running, is dropped here with its connection: a cancel.
    if ran(&attempt) {
        times.record(capability, started.elapsed());
    }
    metrics.hedge(if won { "won" } else { "lost" });
    Raced {
        attempt,
        hedge: won.then_some(index),
    }
}

/// Whether the attempt got an answer that ran (not a refusal or a failure the other may beat).
fn ran<B>(attempt: &Attempt<B>) -> bool {
    matches!(attempt, Attempt::Done(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_needs_samples_and_reads_the_tail() {
        let times = HeadTimes::default();
        for ms in 1..=10 {
            times.record("review", Duration::from_millis(ms));
        }
        assert_eq!(times.p95("review"), None, "too few samples");
        for ms in 11..=100 {
            times.record("review", Duration::from_millis(ms));
        }
        assert_eq!(times.p95("review"), Some(Duration::from_millis(95)));
        assert_eq!(times.p95("other"), None);
    }
}
