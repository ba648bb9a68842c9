//! Latency that counts: among the candidates that can take a call, each one's latency is judged
//! against the best of them, not against the capability's timeout. Under a 10 s timeout 20 ms and
//! 200 ms used to score within 0.02 of each other — a tie — so a ten times slower agent kept its
//! share; relative to the best, it loses clearly, while a few milliseconds of noise between
//! equals stays inside the tie band (docs/reach-model.md, "Latency").
//!
//! An estimate no traffic refreshes decays toward the candidates' typical latency (the lower
//! median) with a time constant of ten calls' worth of time, at least 1 s: one slow sample
//! cannot keep a peer unpicked, and so unmeasured, for long. The pick's exploration share does
//! the rest (`outbound::balance`).

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
pub(super) fn judge(scored: &mut [Scored]) {
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

    use std::time::Duration;

    use tokio::time::Instant;

    use crate::outbound::balance_test_support::{candidate, lcg};
    use crate::outbound::pick;
    use crate::reach::{EstimateParams, Estimates, Signal};

    /// Candidates with the given recent latencies (fresh samples), judged.
    fn judged(latencies: &[f64]) -> Vec<Scored> {
        let mut c: Vec<Scored> = latencies
            .iter()
            .enumerate()
            .map(|(i, ms)| {
                let mut s = candidate(&format!("p{i}"), 1.0, 0.9);
                s.recent = Some((*ms, 0.0));
                s
            })
            .collect();
        judge(&mut c);
        c
    }

    #[test]
    fn a_ten_times_slower_peer_among_three_gets_under_five_percent() {
        let c = judged(&[20.0, 22.0, 200.0]);
        let mut rng = lcg(7);
        let n = 20_000;
        let slow = (0..n)
            .filter(|_| pick(&c, &[], &mut rng) == Some(2))
            .count();
        let share = slow as f64 / n as f64;
        assert!(share <= 0.05, "{share}");
        // A few ms of noise between the two equals stays a tie.
        let first = (0..n)
            .filter(|_| pick(&c, &[], &mut rng) == Some(0))
            .count();
        assert!((0.35..0.65).contains(&(first as f64 / n as f64)), "{first}");
    }

    /// Two equal peers (4 ms), one caller calling one at a time for 60 s; one call to the
    /// second peer takes 17 ms at 5 s. Each 10 s window must split 35–65 %.
    #[test]
    fn one_slow_sample_does_not_herd_two_equal_peers() {
        let p = EstimateParams::default();
        let start = Instant::now();
        let mut peers = [Estimates::new(1.0), Estimates::new(1.0)];
        let mut rng = lcg(11);
        let mut now = start;
        let mut windows = [[0usize; 2]; 6];
        let mut slowed = false;
        while now < start + Duration::from_secs(60) {
            let mut c: Vec<Scored> = (0..2)
                .map(|i| {
                    let mut s = candidate(&format!("p{i}"), 1.0, 0.9);
                    s.recent = peers[i].recent(now);
                    s
                })
                .collect();
            judge(&mut c);
            let Some(i) = pick(&c, &[], &mut rng) else {
                panic!("no pick")
            };
            let took = if i == 1 && !slowed && now >= start + Duration::from_secs(5) {
                slowed = true;
                Duration::from_millis(17)
            } else {
                Duration::from_millis(4)
            };
            now += took;
            peers[i].observe(Signal::Success(took), now, &p);
            let w = (now - start).as_secs() as usize / 10;
            if let Some(window) = windows.get_mut(w) {
                window[i] += 1;
            }
        }
        assert!(slowed);
        for (w, [a, b]) in windows.iter().enumerate() {
            let share = *a as f64 / (a + b).max(1) as f64;
            assert!((0.35..=0.65).contains(&share), "window {w}: {a} vs {b}");
        }
    }

    #[test]
    fn an_old_estimate_drifts_back_to_the_typical_latency() {
        let fresh = decayed(17.0, 0.0, 4.0, 10.0);
        let old = decayed(17.0, 60.0, 4.0, 10.0);
        assert!((fresh - 17.0).abs() < 1e-9);
        assert!((old - 4.0).abs() < 0.1, "{old}");
    }
}
