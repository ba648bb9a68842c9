//! Estimates from signals, pure and clock-driven: availability EWMA, peak-sensitive latency EWMA,
//! windowed latency percentiles, saturation with cooldown and busy expiry, the saturation the
//! load's trend predicts (`super::trend`), and staleness decay.
//!
//! Why peak-sensitive latency (Finagle's PeakEWMA, as linkerd uses): a slow response moves the
//! estimate up at once, recovery is gradual, so a struggling agent is avoided quickly but one slow
//! answer is forgotten within a few time constants.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::trend::{Trend, TrendParams};

/// Availability assumed for an agent nothing is known about (or whose signals went stale).
pub(crate) const UNKNOWN_AVAILABILITY: f64 = 0.5;

/// Latency samples kept for the windowed percentiles.
const WINDOW_SAMPLES: usize = 256;

/// What one request or probe told us.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Signal {
    /// Served successfully (2xx–4xx other than 429), with its latency.
    Success(Duration),
    /// Connection error, 5xx, or broken response, with the time it took to fail.
    Failure(Duration),
    /// Gave up waiting.
    Timeout(Duration),
    /// Refused without running the task: 429, or 503 with `retry-after`; cools down for `retry_after`.
    /// The agent's own refusal (its model backend rate-limited): a run of them is an outage.
    Refused { retry_after: Duration },
    /// A peer's sidecar turned the call away before its agent saw it: full right now
    /// (`saturated`), out of rotation by its own view, or unable to reach its agent. Load, or
    /// news the peer's own view carries — never a failure of the peer in this caller's view;
    /// the peer is passed over for at most `retry_after`.
    Shed { retry_after: Duration },
    /// The agent refused the connection: it is not running. Definitive at the first occurrence.
    Unreachable(Duration),
}

/// The weight the recent-latency EWMA keeps of its old value on a new sample taken at once.
const RECENT_KEEP: f64 = 0.7;

/// How fast an old recent-latency value loses weight: ten calls' worth of time, at least 1 s —
/// the time scale of the calls themselves, so a 20 ms service and a 30 s one forgive alike.
pub(crate) fn recent_tau_s(latency_s: f64) -> f64 {
    (latency_s * 10.0).max(1.0)
}

/// Tunables, from the policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct EstimateParams {
    pub(crate) availability_alpha: f64,
    /// Failures are forgiven with this time constant: without new outcomes, availability climbs
    /// back toward 1, so one error does not hold a peer back until traffic happens to return.
    pub(crate) availability_recovery: Duration,
    pub(crate) latency_time_constant: Duration,
    pub(crate) stale_after: Duration,
    /// How long a busy report holds without being renewed.
    pub(crate) busy_ttl: Duration,
    /// How far back the windowed percentiles look.
    pub(crate) window: Duration,
    /// How far ahead the predicted saturation looks; zero switches prediction off.
    pub(crate) horizon: Duration,
}

impl Default for EstimateParams {
    fn default() -> Self {
        Self {
            availability_alpha: 0.25,
            availability_recovery: Duration::from_secs(10),
            latency_time_constant: Duration::from_secs(10),
            stale_after: Duration::from_secs(300),
            busy_ttl: Duration::from_secs(30),
            window: Duration::from_secs(60),
            horizon: Duration::from_secs(10),
        }
    }
}

/// Load as last reported for the agent (by its own sidecar's admission, or by the agent).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Load {
    pub(crate) in_flight: usize,
    pub(crate) max_concurrency: usize,
    pub(crate) queued: usize,
    pub(crate) queue_capacity: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct Estimates {
    availability: f64,
    /// When the last success or failure moved the availability estimate.
    last_outcome: Option<Instant>,
    /// Peak-EWMA latency in seconds; `None` until the first sample.
    latency: Option<f64>,
    latency_at: Option<Instant>,
    /// What this peer's calls have taken lately, in seconds: an EWMA that one outlier moves only
    /// part of the way, and whose old value loses weight with time since it was taken (so the
    /// first fresh sample after a quiet spell mostly replaces it). Routing compares peers by it
    /// (`peers::latency`); the peak-EWMA above is for timeouts and load.
    recent: Option<f64>,
    window: VecDeque<(Instant, f64)>,
    last_signal: Option<Instant>,
    load: Load,
    /// An explicit load figure in 0..1 (`reach-load` header), with when it was reported.
    reported_load: Option<(f64, Instant)>,
    busy_until: Option<Instant>,
    cooldown_until: Option<Instant>,
    /// The trend of the admitted load (in flight + queued), fed by the sidecar's own gauges.
    load_trend: Trend,
}

/// The estimates at one instant, for scoring and display.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EstimateSnapshot {
    pub availability: f64,
    pub latency_ms: Option<f64>,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p95_ms: Option<f64>,
    pub saturation: f64,
    /// The saturation expected `horizon` ahead, never below `saturation` (docs/reach-model.md,
    /// "Predicted saturation"). Absent from an older sidecar's document: 0, and callers score
    /// with the larger of the two.
    #[serde(default)]
    pub saturation_predicted: f64,
    pub busy: bool,
    pub cooling_down: bool,
    /// Seconds since the last signal of any kind.
    pub(crate) age_s: Option<f64>,
    pub(crate) stale: bool,
}

impl Estimates {
    /// A peer first seen `now`, at `initial_availability`. The prior counts as an outcome taken
    /// then: doubt about a new peer is forgiven with time like a failure, so a peer the pick
    /// never chose does not stay below the others (and unchosen) for good.
    pub(crate) fn new(initial_availability: f64, now: Instant) -> Self {
        Self {
            availability: initial_availability,
            last_outcome: Some(now),
            latency: None,
            latency_at: None,
            recent: None,
            window: VecDeque::new(),
            last_signal: None,
            load: Load::default(),
            reported_load: None,
            busy_until: None,
            cooldown_until: None,
            load_trend: Trend::default(),
        }
    }

    pub(crate) fn observe(&mut self, signal: Signal, now: Instant, p: &EstimateParams) {
        self.last_signal = Some(now);
        let outcome = match signal {
            Signal::Success(_) => Some(1.0),
            Signal::Failure(_) | Signal::Timeout(_) | Signal::Unreachable(_) => Some(0.0),
            Signal::Refused { .. } | Signal::Shed { .. } => None,
        };
        if let Some(x) = outcome {
            // Start from the decayed value, so a stale estimate is not revived as if fresh.
            let current = self.availability_at(now, p);
            self.availability = current + p.availability_alpha * (x - current);
            self.last_outcome = Some(now);
        }
        match signal {
            Signal::Success(d) | Signal::Failure(d) | Signal::Timeout(d) => {
                self.observe_latency(d, now, p)
            }
            Signal::Refused { retry_after } => {
                let until = now + retry_after;
                self.cooldown_until = Some(self.cooldown_until.map_or(until, |u| u.max(until)));
            }
            // Never longer than the refusal asked for: a full peer frees a slot soon.
            Signal::Shed { retry_after } => {
                let until = now + retry_after;
                self.cooldown_until = Some(match self.cooldown_until {
                    Some(u) if u > now => u.min(until).max(now),
                    _ => until,
                });
            }
            // No latency sample: a refused connection says nothing about how fast it answers.
            Signal::Unreachable(_) => {}
        }
    }

    fn observe_latency(&mut self, d: Duration, now: Instant, p: &EstimateParams) {
        let rtt = d.as_secs_f64();
        self.recent = Some(match (self.recent, self.latency_at) {
            (Some(old), Some(at)) => {
                let elapsed = now.saturating_duration_since(at).as_secs_f64();
                let keep = RECENT_KEEP * (-elapsed / recent_tau_s(old)).exp();
                old * keep + rtt * (1.0 - keep)
            }
            _ => rtt,
        });
        self.latency = Some(match (self.latency, self.latency_at) {
            (Some(cost), Some(at)) if rtt <= cost => {
                let elapsed = now.saturating_duration_since(at).as_secs_f64();
                let tau = p.latency_time_constant.as_secs_f64().max(1e-3);
                let w = (-elapsed / tau).exp();
                cost * w + rtt * (1.0 - w)
            }
            // A new peak is taken at once.
            _ => rtt,
        });
        self.latency_at = Some(now);
        if self.window.len() == WINDOW_SAMPLES {
            self.window.pop_front();
        }
        self.window.push_back((now, rtt));
    }

    /// The recent latency in ms and how old its last sample is, in seconds.
    pub(crate) fn recent(&self, now: Instant) -> Option<(f64, f64)> {
        let recent = self.recent?;
        let age = self
            .latency_at
            .map_or(0.0, |at| now.saturating_duration_since(at).as_secs_f64());
        Some((recent * 1000.0, age))
    }

    #[cfg(test)]
    pub(crate) fn set_load(&mut self, load: Load, now: Instant) {
        self.load = load;
        self.last_signal = Some(now);
    }

    /// Replaces the prior of an estimate that has seen no signal yet (a caller adopting the peer's
    /// own figure instead of starting every peer at the parole prior).
    pub(crate) fn seed_availability(&mut self, availability: f64) {
        if self.last_signal.is_none() {
            self.availability = availability.clamp(0.0, 1.0);
        }
    }

    /// Updates the load without counting it as a fresh signal (the sidecar's own gauges are
    /// always at hand; they say nothing about whether the agent still works), and feeds the
    /// load's trend.
    pub(crate) fn set_load_quietly(&mut self, load: Load, now: Instant, p: &EstimateParams) {
        self.load = load;
        if !p.horizon.is_zero() {
            let admitted = load.in_flight.saturating_add(load.queued) as f64;
            self.load_trend
                .observe(admitted, now, TrendParams::for_horizon(p.horizon));
        }
    }

    /// The agent (or a response header) reported itself busy or not.
    pub(crate) fn report_busy(&mut self, busy: bool, now: Instant, p: &EstimateParams) {
        self.busy_until = busy.then_some(now + p.busy_ttl);
        self.last_signal = Some(now);
    }

    /// The agent reported its own load in 0..1 (`reach-load`).
    pub(crate) fn report_load(&mut self, load: f64, now: Instant) {
        self.reported_load = Some((load.clamp(0.0, 1.0), now));
    }

    /// Availability, decayed toward unknown once signals are older than `stale_after`.
    pub(crate) fn availability_at(&self, now: Instant, p: &EstimateParams) -> f64 {
        let forgiven = match self.last_outcome {
            Some(at) => {
                let quiet = now.saturating_duration_since(at).as_secs_f64();
                let tau = p.availability_recovery.as_secs_f64().max(1e-3);
                1.0 - (1.0 - self.availability) * (-quiet / tau).exp()
            }
            None => self.availability,
        };
        let Some(last) = self.last_signal else {
            return forgiven;
        };
        let age = now.saturating_duration_since(last);
        if age <= p.stale_after {
            return forgiven;
        }
        let over = (age - p.stale_after).as_secs_f64() / p.stale_after.as_secs_f64().max(1e-3);
        UNKNOWN_AVAILABILITY + (forgiven - UNKNOWN_AVAILABILITY) * (-over).exp()
    }

    pub(crate) fn is_cooling_down(&self, now: Instant) -> bool {
        self.cooldown_until.is_some_and(|u| now < u)
    }

    pub(crate) fn is_busy(&self, now: Instant) -> bool {
        self.busy_until.is_some_and(|u| now < u)
    }

    /// max(in_flight / max_concurrency, queue / capacity, busy, cooldown, reported load), in 0..1.
    pub(crate) fn saturation(&self, now: Instant, p: &EstimateParams) -> f64 {
        let ratio = |a: usize, b: usize| {
            if b == 0 {
                0.0
            } else {
                (a as f64 / b as f64).min(1.0)
            }
        };
        let mut s = ratio(self.load.in_flight, self.load.max_concurrency)
            .max(ratio(self.load.queued, self.load.queue_capacity));
        if self.is_busy(now) || self.is_cooling_down(now) {
            s = 1.0;
        }
        if let Some((load, at)) = self.reported_load {
            if now.saturating_duration_since(at) <= p.busy_ttl {
                s = s.max(load);
            }
        }
        s
    }

    /// The saturation expected `horizon` ahead: the admitted load now plus the rise its trend
    /// predicts, over `max_concurrency`, clamped to 0..1 — never below the saturation now, and
    /// equal to it when the trend is flat, falling or lost in noise, or prediction is off.
    #[cfg(test)]
    pub(crate) fn saturation_predicted(&self, now: Instant, p: &EstimateParams) -> f64 {
        self.predicted_from(self.saturation(now, p), p)
    }

    /// The prediction given the saturation now (read once per snapshot: the scoring path's).
    fn predicted_from(&self, current: f64, p: &EstimateParams) -> f64 {
        if p.horizon.is_zero() || self.load.max_concurrency == 0 {
            return current;
        }
        let rise = self.load_trend.rise(p.horizon);
        if rise <= 0.0 {
            return current;
        }
        let admitted = self.load.in_flight.saturating_add(self.load.queued) as f64;
        let predicted = (admitted + rise) / self.load.max_concurrency as f64;
        predicted.clamp(0.0, 1.0).max(current)
    }

    /// The latency estimate in seconds: the peak EWMA, decayed toward its last value with time.
    #[cfg(test)]
    pub(crate) fn latency(&self) -> Option<f64> {
        self.latency
    }

    /// Every estimate, the windowed percentiles included (for `/status` and what peers read).
    pub(crate) fn snapshot(&self, now: Instant, p: &EstimateParams) -> EstimateSnapshot {
        let mut recent: Vec<f64> = self
            .window
            .iter()
            .filter(|(at, _)| now.saturating_duration_since(*at) <= p.window)
            .map(|(_, s)| s * 1000.0)
            .collect();
        let mut pct = |q: f64| (!recent.is_empty()).then(|| select_percentile(&mut recent, q));
        EstimateSnapshot {
            p50_ms: pct(0.5),
            p95_ms: pct(0.95),
            ..self.scoring_snapshot(now, p)
        }
    }

    /// What a score reads, without the percentiles: a routing decision must not sort the
    /// latency window of every candidate (that was a tenth of the proxy's CPU).
    pub(crate) fn scoring_snapshot(&self, now: Instant, p: &EstimateParams) -> EstimateSnapshot {
        let age = self.last_signal.map(|l| now.saturating_duration_since(l));
        let saturation = self.saturation(now, p);
        EstimateSnapshot {
            availability: self.availability_at(now, p),
            latency_ms: self.latency.map(|l| l * 1000.0),
            p50_ms: None,
            p95_ms: None,
            saturation,
            saturation_predicted: self.predicted_from(saturation, p),
            busy: self.is_busy(now),
            cooling_down: self.is_cooling_down(now),
            age_s: age.map(|a| a.as_secs_f64()),
            stale: age.is_some_and(|a| a > p.stale_after),
        }
    }
}

/// Nearest-rank percentile of `values` (left reordered); 0 when there are none. By selection,
/// O(n): sorting a full latency window for each snapshot cost more than all the requests it
/// described (the self view is read on every peer's poll).
pub(crate) fn select_percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let rank = (q * values.len() as f64).ceil() as usize;
    *values
        .select_nth_unstable_by(rank.clamp(1, values.len()) - 1, f64::total_cmp)
        .1
}

/// Nearest-rank percentile of sorted values; 0 when there are none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_percentiles_are_the_sorted_ones() {
        let mut values: Vec<f64> = (0..997).map(|i| f64::from((i * 7919) % 1000)).collect();
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        for q in [0.0, 0.01, 0.5, 0.95, 0.99, 1.0] {
            assert_eq!(
                select_percentile(&mut values, q),
                percentile(&sorted, q),
                "q={q}"
            );
        }
        assert_eq!(select_percentile(&mut [], 0.5), 0.0);
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_peers_prior_is_forgiven_without_any_outcome() {
        // Never chosen, so never measured: its doubt must not keep it below the others for good.
        let p = EstimateParams::default();
        let e = Estimates::new(0.7, Instant::now());
        assert!((e.availability_at(Instant::now(), &p) - 0.7).abs() < 1e-9);
        tokio::time::advance(p.availability_recovery * 3).await;
        let a = e.availability_at(Instant::now(), &p);
        assert!(a > 0.98, "{a}");
    }

    #[tokio::test(start_paused = true)]
    async fn availability_is_an_ewma_of_outcomes() {
        let p = EstimateParams::default();
        let mut e = Estimates::new(1.0, Instant::now());
        e.observe(Signal::Failure(ms(10)), Instant::now(), &p);
        assert!((e.availability_at(Instant::now(), &p) - 0.75).abs() < 1e-9);
        e.observe(Signal::Success(ms(10)), Instant::now(), &p);
        assert!((e.availability_at(Instant::now(), &p) - 0.8125).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_cools_down_and_saturates_without_touching_availability() {
        let p = EstimateParams::default();
        let mut e = Estimates::new(1.0, Instant::now());
        e.observe(
            Signal::Refused {
                retry_after: Duration::from_secs(2),
            },
            Instant::now(),
            &p,
        );
        let now = Instant::now();
        assert_eq!(e.availability_at(now, &p), 1.0);
        assert_eq!(e.saturation(now, &p), 1.0);
        assert!(e.is_cooling_down(now));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!e.is_cooling_down(Instant::now()));
        assert_eq!(e.saturation(Instant::now(), &p), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn peak_latency_jumps_up_and_decays_down() {
        let p = EstimateParams::default();
        let mut e = Estimates::new(1.0, Instant::now());
        e.observe(Signal::Success(ms(100)), Instant::now(), &p);
        e.observe(Signal::Success(ms(2000)), Instant::now(), &p);
        assert_eq!(e.latency(), Some(2.0), "a peak is taken at once");
        tokio::time::advance(Duration::from_secs(30)).await;
        e.observe(Signal::Success(ms(100)), Instant::now(), &p);
        let l = e.latency().unwrap_or(0.0);
        assert!(
            l < 0.2,
            "three time constants later the peak is mostly forgotten: {l}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_forgiven_with_time() {
        let p = EstimateParams::default();
        let mut e = Estimates::new(1.0, Instant::now());
        e.observe(Signal::Failure(ms(10)), Instant::now(), &p);
        assert!((e.availability_at(Instant::now(), &p) - 0.75).abs() < 1e-9);
        tokio::time::advance(Duration::from_secs(30)).await;
        let a = e.availability_at(Instant::now(), &p);
        assert!(a > 0.98, "three recovery constants later: {a}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_estimate_decays_toward_unknown() {
        let p = EstimateParams {
            stale_after: Duration::from_secs(60),
            ..EstimateParams::default()
        };
        let mut e = Estimates::new(1.0, Instant::now());
        e.observe(Signal::Success(ms(10)), Instant::now(), &p);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(e.availability_at(Instant::now(), &p), 1.0);
        tokio::time::advance(Duration::from_secs(600)).await;
        let a = e.availability_at(Instant::now(), &p);
        assert!((a - UNKNOWN_AVAILABILITY).abs() < 0.01, "{a}");
        assert!(e.snapshot(Instant::now(), &p).stale);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_report_expires() {
        let p = EstimateParams {
            busy_ttl: Duration::from_secs(5),
            ..EstimateParams::default()
        };
        let mut e = Estimates::new(1.0, Instant::now());
        e.report_busy(true, Instant::now(), &p);
        assert_eq!(e.saturation(Instant::now(), &p), 1.0);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(!e.is_busy(Instant::now()));
        assert_eq!(e.saturation(Instant::now(), &p), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn saturation_is_the_largest_load_ratio() {
        let p = EstimateParams::default();
        let mut e = Estimates::new(1.0, Instant::now());
        e.set_load(
            Load {
                in_flight: 2,
                max_concurrency: 4,
                queued: 3,
                queue_capacity: 4,
            },
            Instant::now(),
        );
        assert_eq!(e.saturation(Instant::now(), &p), 0.75);
        e.report_load(0.9, Instant::now());
        assert_eq!(e.saturation(Instant::now(), &p), 0.9);
    }

    /// Feeds one admitted load per 250 ms from `loads`, as the sidecar's own gauges would.
    async fn climb(e: &mut Estimates, p: &EstimateParams, loads: impl Iterator<Item = usize>) {
        for in_flight in loads {
            tokio::time::advance(ms(250)).await;
            let load = Load {
                in_flight,
                max_concurrency: 20,
                queued: 0,
                queue_capacity: 10,
            };
            e.set_load_quietly(load, Instant::now(), p);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_climbing_load_predicts_saturation_ahead_of_now() {
        let p = EstimateParams::default();
        let mut e = Estimates::new(1.0, Instant::now());
        // One more request in flight every second, for ten seconds: 10 of 20 slots.
        climb(&mut e, &p, (0..40).map(|i| i / 4)).await;
        let now = Instant::now();
        let (current, predicted) = (e.saturation(now, &p), e.saturation_predicted(now, &p));
        assert!(current < 0.5, "{current}");
        assert!(predicted > current + 0.1, "{predicted} vs {current}");
        assert!(predicted <= 1.0);
        let off = EstimateParams {
            horizon: Duration::ZERO,
            ..p
        };
        assert_eq!(e.saturation_predicted(now, &off), current);
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_or_falling_load_predicts_the_saturation_now() {
        let p = EstimateParams::default();
        let mut e = Estimates::new(1.0, Instant::now());
        climb(&mut e, &p, std::iter::repeat_n(6, 80)).await;
        let now = Instant::now();
        assert_eq!(e.saturation_predicted(now, &p), e.saturation(now, &p));
        climb(&mut e, &p, (0..24).rev().map(|i| i / 4)).await;
        let now = Instant::now();
        assert_eq!(e.saturation_predicted(now, &p), e.saturation(now, &p));
    }
}
