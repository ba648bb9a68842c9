//! The trend of one series (the agent's admitted load: in flight plus queued), pure and
//! clock-driven: Holt's linear smoothing in its time-aware form, and the rise it predicts over
//! a horizon (docs/reach-model.md, "Predicted saturation").
//!
//! Why Holt and not a plain EWMA: an EWMA of a climbing queue lags behind it by its time constant
//! times the slope, so it says "fine" exactly while the queue fills; Holt keeps a slope next to
//! the level and extrapolates it. Why the time-aware form: samples come when the sidecar looks
//! (its one-second tick, gossip offers, polls, `/status`), at irregular intervals; each sample's
//! weight follows from the time since the last one, so a burst of looks does not speed up time.

use std::time::Duration;

use tokio::time::Instant;

/// A sample closer than this to the previous one carries no slope information (and would divide
/// by almost nothing): it only updates the value now.
const MIN_STEP: Duration = Duration::from_millis(1);

/// How many residual standard deviations the rise over the horizon must exceed to count: a
/// flat or jittery series must not predict a rise (about 2.3 % of pure noise passes one side).
const NOISE_DEVIATIONS: f64 = 2.0;

/// Smoothing time constants, derived from the horizon: the slope (and the noise it is judged
/// against) has the horizon as its time constant, so it weighs the last few horizons (with the
/// default 10 s, about the last half-minute to minute); the level reacts within a quarter of the
/// horizon. Looking further ahead needs a slope measured over longer; a shorter memory would
/// take a burst for a trend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct TrendParams {
    pub(super) level_tau: Duration,
    pub(super) slope_tau: Duration,
}

impl TrendParams {
    /// The time constants for predicting `horizon` ahead.
    pub(super) fn for_horizon(horizon: Duration) -> Self {
        Self {
            level_tau: (horizon / 4).max(Duration::from_millis(100)),
            slope_tau: horizon.max(Duration::from_millis(400)),
        }
    }
}

/// Level, slope and residual noise of one series.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Trend {
    state: Option<Smoothed>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Smoothed {
    /// The smoothed value, in the series' unit.
    level: f64,
    /// Units per second.
    slope: f64,
    /// EWMA of the squared one-step forecast error: how far the series strays from its trend.
    noise_var: f64,
    at: Instant,
}

impl Trend {
    /// Takes the value `x` seen at `now`.
    pub(super) fn observe(&mut self, x: f64, now: Instant, p: TrendParams) {
        let Some(s) = self.state.as_mut() else {
            self.state = Some(Smoothed {
                level: x,
                slope: 0.0,
                noise_var: 0.0,
                at: now,
            });
            return;
        };
        let step = now.saturating_duration_since(s.at);
        if step < MIN_STEP {
            return;
        }
        let dt = step.as_secs_f64();
        let weight = |tau: Duration| 1.0 - (-dt / tau.as_secs_f64().max(1e-3)).exp();
        let (a, b) = (weight(p.level_tau), weight(p.slope_tau));
        let forecast = s.level + s.slope * dt;
        let error = x - forecast;
        let level = forecast + a * error;
        s.slope = b * (level - s.level) / dt + (1.0 - b) * s.slope;
        s.level = level;
        s.noise_var += b * (error * error - s.noise_var);
        s.at = now;
    }

    /// The rise the trend predicts over `horizon`, in the series' unit, counted only when it
    /// stands out of the series' own noise (by [`NOISE_DEVIATIONS`]) and only upward: a flat,
    /// jittery or falling series predicts 0.
    pub(super) fn rise(&self, horizon: Duration) -> f64 {
        let Some(s) = self.state else {
            return 0.0;
        };
        let rise = s.slope * horizon.as_secs_f64();
        (rise - NOISE_DEVIATIONS * s.noise_var.sqrt()).max(0.0)
    }

    /// The slope in units per second (0 before the second sample).
    #[cfg(test)]
    fn slope(&self) -> f64 {
        self.state.map_or(0.0, |s| s.slope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HORIZON: Duration = Duration::from_secs(10);

    fn params() -> TrendParams {
        TrendParams::for_horizon(HORIZON)
    }

    /// Feeds `f(t)` every `step` for `span`, on virtual time.
    async fn feed(trend: &mut Trend, span: Duration, step: Duration, f: impl Fn(f64) -> f64) {
        let start = Instant::now();
        while start.elapsed() < span {
            tokio::time::advance(step).await;
            trend.observe(f(start.elapsed().as_secs_f64()), Instant::now(), params());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_climb_is_predicted_to_go_on() {
        let mut trend = Trend::default();
        // Half a request more every second, looked at every 200 ms.
        feed(
            &mut trend,
            Duration::from_secs(60),
            Duration::from_millis(200),
            |t| 0.5 * t,
        )
        .await;
        assert!((trend.slope() - 0.5).abs() < 0.1, "slope {}", trend.slope());
        let rise = trend.rise(HORIZON);
        assert!(rise > 3.0 && rise < 6.0, "rise {rise}");
    }

    #[tokio::test(start_paused = true)]
    async fn irregular_sampling_finds_the_same_slope() {
        let mut even = Trend::default();
        feed(
            &mut even,
            Duration::from_secs(60),
            Duration::from_millis(500),
            |t| t,
        )
        .await;
        let mut uneven = Trend::default();
        let start = Instant::now();
        // Bursts of looks 5 ms apart, then a 2 s gap: the weights follow time, not the count.
        while start.elapsed() < Duration::from_secs(60) {
            for _ in 0..20 {
                tokio::time::advance(Duration::from_millis(5)).await;
                uneven.observe(start.elapsed().as_secs_f64(), Instant::now(), params());
            }
            tokio::time::advance(Duration::from_secs(2)).await;
            uneven.observe(start.elapsed().as_secs_f64(), Instant::now(), params());
        }
        assert!((even.slope() - 1.0).abs() < 0.15, "even {}", even.slope());
        assert!(
            (uneven.slope() - 1.0).abs() < 0.15,
            "uneven {}",
            uneven.slope()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_flat_jittery_series_predicts_no_rise() {
        let mut trend = Trend::default();
        let mut up = false;
        let start = Instant::now();
        let mut worst: f64 = 0.0;
        // 2 and 6 in flight in turn, at uneven intervals: mean 4, no trend.
        while start.elapsed() < Duration::from_secs(120) {
            up = !up;
            let step = if up { 300 } else { 700 };
            tokio::time::advance(Duration::from_millis(step)).await;
            trend.observe(if up { 6.0 } else { 2.0 }, Instant::now(), params());
            if start.elapsed() > Duration::from_secs(5) {
                worst = worst.max(trend.rise(HORIZON));
            }
        }
        assert_eq!(worst, 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_falling_series_predicts_no_rise() {
        let mut trend = Trend::default();
        feed(
            &mut trend,
            Duration::from_secs(20),
            Duration::from_millis(250),
            |t| (20.0 - t).max(0.0),
        )
        .await;
        assert!(trend.slope() < 0.0);
        assert_eq!(trend.rise(HORIZON), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn one_sample_or_a_repeat_at_the_same_instant_has_no_slope() {
        let mut trend = Trend::default();
        assert_eq!(trend.rise(HORIZON), 0.0);
        trend.observe(3.0, Instant::now(), params());
        trend.observe(30.0, Instant::now(), params());
        assert_eq!(trend.slope(), 0.0);
        assert_eq!(trend.rise(HORIZON), 0.0);
    }
}
