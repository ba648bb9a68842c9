//! A bounded in-memory history of each peer's success rate and p95, for the status page's
//! sparklines: one sample per peer every [`SAMPLE_EVERY`], the last [`SAMPLES_KEPT`] kept (15
//! minutes), at most [`PEERS_KEPT`] peers, departed peers dropped. Nothing touches the disk.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::ConfigStore;
use crate::peers::{Outcomes, PeerStatus, PeerViews};

/// How often each peer is sampled.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Samples kept per peer: 15 minutes at one per 10 s.
pub(crate) const SAMPLES_KEPT: usize = 90;
/// Peers with a history; more are shown without sparklines.
pub(crate) const PEERS_KEPT: usize = 256;

/// One peer over one sampling interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct Sample {
    /// Share of this caller's calls served in the interval; `None` without calls.
    pub(crate) success_rate: Option<f64>,
    /// The caller's windowed p95 latency of the peer, in milliseconds.
    pub(crate) p95_ms: Option<f64>,
}

#[derive(Debug, Default)]
pub(crate) struct History {
    inner: Mutex<BTreeMap<String, Series>>,
}

#[derive(Debug, Default)]
struct Series {
    samples: VecDeque<Sample>,
    /// The peer's outcome counters at the last sample.
    last: Outcomes,
}

impl History {
    /// Takes one sample of every peer; forgets peers no longer listed.
    pub(crate) fn sample(&self, peers: &[PeerStatus]) {
        let mut inner = self.lock();
        inner.retain(|name, _| peers.iter().any(|p| &p.name == name));
        for p in peers {
            if !inner.contains_key(&p.name) && inner.len() >= PEERS_KEPT {
                continue;
            }
            let series = inner.entry(p.name.clone()).or_default();
            let sample = sample(p, &series.last);
            if series.samples.len() == SAMPLES_KEPT {
                series.samples.pop_front();
            }
            series.samples.push_back(sample);
            series.last = p.outcomes;
        }
    }

    /// Each peer's samples, oldest first, with a last point for the interval under way.
    pub(crate) fn series(&self, peers: &[PeerStatus]) -> BTreeMap<String, Vec<Sample>> {
        let inner = self.lock();
        peers
            .iter()
            .map(|p| {
                // A peer first seen since the last sample has the live point alone.
                let (mut samples, last) = match inner.get(&p.name) {
                    Some(series) => (series.samples.iter().copied().collect(), series.last),
                    None => (Vec::new(), Outcomes::default()),
                };
                samples.push(sample(p, &last));
                (p.name.clone(), samples)
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Series>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The peer now, against its counters at the previous sample.
fn sample(p: &PeerStatus, before: &Outcomes) -> Sample {
    let judged = p.outcomes.judged().saturating_sub(before.judged());
    let served = p.outcomes.success.saturating_sub(before.success);
    Sample {
        success_rate: (judged > 0).then(|| served as f64 / judged as f64),
        p95_ms: p.view.estimates.p95_ms,
    }
}

/// Samples every peer now and every [`SAMPLE_EVERY`] until `stop`.
pub(crate) fn spawn(
    history: Arc<History>,
    peers: Arc<PeerViews>,
    store: Arc<ConfigStore>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => history.sample(&peers.status(&store.snapshot())),
            }
        }
    })
}
