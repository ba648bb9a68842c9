//! Latency that counts: among the candidates that can take a call, each one's latency is judged
//! against the best of them, not against the capability's timeout. Under a 10 s timeout 20 ms and
//! 200 ms used to score within 0.02 of each other — a tie — so a ten times slower agent kept its
//! share; relative to the best, it loses clearly, while a few milliseconds of noise between
//! equals stays inside the tie band (docs/reach-model.md, "Latency").
//!
//! An estimate no traffic refreshes decays toward the candidates' typical latency (the lower
//! median) with a time constant of ten calls' worth of time, at least 1 s: one slow sample
//! cannot keep a peer unpicked, and so unmeasured, for long. The pick's exploration share does
//! the rest (`outbound::candidates::balance`).

use super::Scored;
use crate::reach::recent_tau_s;

/// A latency this many times the best one costs the whole latency weight.
const FULL_PENALTY_RATIO: f64 = 10.0;
/// Up to this many times the best is noise and costs nothing: agents whose calls take 20–60 ms
/// at random differ by that much from one sample to the next, and acting on it would herd.
const NOISE_RATIO: f64 = 1.5;

/// The latency term of the cost, in 0..1: `log(ratio / 1.5) / log(10 / 1.5)` for `ratio` =
/// latency / best, capped. 1.5× the best costs nothing, 2× 0.15, 4× 0.52, 10× and beyond 1.
pub(super) fn relative_cost(latency_ms: f64, best_ms: f64) -> f64 {
    if !(latency_ms.is_finite() && best_ms.is_finite()) || best_ms <= 0.0 {
        return 0.0;
    }
    let ratio = latency_ms / best_ms / NOISE_RATIO;
    (ratio.ln() / (FULL_PENALTY_RATIO / NOISE_RATIO).ln()).clamp(0.0, 1.0)
}

/// A latency estimate `age_s` old, decayed toward `typical_ms` with time constant `tau_s`.
pub(super) fn decayed(latency_ms: f64, age_s: f64, typical_ms: f64, tau_s: f64) -> f64 {
    let w = (-age_s.max(0.0) / tau_s.max(1e-3)).exp();
    typical_ms + (latency_ms - typical_ms) * w
}

/// Sets each usable candidate's expected latency and adds its relative latency cost to its
/// score. A candidate with no sample yet costs nothing: its cap, not its score, bounds its share.
pub(crate) fn judge(scored: &mut [Scored]) {
    let usable = |s: &Scored| s.excluded.is_none() && s.cap > 0.0;
    let mut known: Vec<f64> = scored
        .iter()
        .filter(|s| usable(s))
        .filter_map(|s| s.recent.map(|(ms, _)| ms))
        .filter(|ms| ms.is_finite())
        .collect();
    if known.is_empty() {
        return;
    }
    known.sort_by(f64::total_cmp);
    let typical = known[(known.len() - 1) / 2];
    let tau_s = recent_tau_s(typical / 1000.0);
    for s in scored.iter_mut().filter(|s| usable(s)) {
        s.expected_ms = s.recent.map(|(ms, age)| decayed(ms, age, typical, tau_s));
    }
    let best = scored
        .iter()
        .filter_map(|s| s.expected_ms)
        .fold(f64::INFINITY, f64::min);
    for s in scored.iter_mut() {
        let Some(ms) = s.expected_ms else {
            continue;
        };
        let term = relative_cost(ms, best);
        s.factors.cost += term;
        s.factors.score -= s.cost_weight * term;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_times_slower_costs_everything_and_noise_almost_nothing() {
        assert!((relative_cost(200.0, 20.0) - 1.0).abs() < 1e-9);
        assert!(relative_cost(2000.0, 20.0) <= 1.0);
        assert!(
            relative_cost(22.0, 20.0) < 0.05,
            "10 % is noise: inside the tie band"
        );
        assert!(relative_cost(17.0, 4.0) > 0.5);
        assert_eq!(relative_cost(20.0, 20.0), 0.0);
        assert_eq!(relative_cost(f64::NAN, 20.0), 0.0);
    }

    #[test]
    fn an_old_estimate_drifts_back_to_the_typical_latency() {
        let fresh = decayed(17.0, 0.0, 4.0, 10.0);
        let old = decayed(17.0, 60.0, 4.0, 10.0);
        assert!((fresh - 17.0).abs() < 1e-9);
        assert!((old - 4.0).abs() < 0.1, "{old}");
    }
}
