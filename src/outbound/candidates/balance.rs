//! Choosing among scored candidates: power of two choices, each drawn with probability
//! proportional to its traffic cap, the higher score wins.
//!
//! Why P2C (Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing"): comparing two
//! random candidates avoids the herd that "always the best" creates when every caller acts on the
//! same slightly stale scores, at almost the quality of a full sort. Drawing by cap is what makes
//! a peer on parole or probation get only its small share.

use crate::peers::Scored;

/// The share of picks that go to the first (cap-weighted) draw whatever the scores, unless it is
/// full: every usable peer keeps being measured, so one old slow sample cannot starve it
/// (docs/reach-model.md).
const EXPLORE: f64 = 0.02;

/// Scores closer than this are a tie, settled by the draw: small differences are estimation noise
/// (priors, a poll's timing), and acting on them would herd traffic onto one peer.
const TIE: f64 = 0.05;

/// The index of the chosen candidate, skipping excluded ones and those already tried. A peer
/// cooling down after a 429 is chosen only when nobody else can be.
pub fn pick(scored: &[Scored], tried: &[usize], mut random: impl FnMut() -> f64) -> Option<usize> {
    let usable = |i: &usize| scored[*i].excluded.is_none() && !tried.contains(i);
    let mut eligible: Vec<usize> = (0..scored.len())
        .filter(usable)
        .filter(|i| !scored[*i].cooling_down)
        .collect();
    if eligible.is_empty() {
        eligible = (0..scored.len()).filter(usable).collect();
    }
    let first = draw(scored, &eligible, &mut random)?;
    // Exploration measures peers, it does not load full ones: a busy or saturated peer is not
    // explored.
    if random() < EXPLORE && scored[first].factors.saturation < 1.0 {
        return Some(first);
    }
    eligible.retain(|i| *i != first);
    let Some(second) = draw(scored, &eligible, &mut random) else {
        return Some(first);
    };
    let (a, b) = (&scored[first], &scored[second]);
    let (winner, loser) = if b.factors.score > a.factors.score + TIE {
        (second, first)
    } else if a.factors.score > b.factors.score + TIE {
        (first, second)
    } else if less_loaded(b, a) {
        // A tie on score: the one that will answer sooner, when that is clear.
        (second, first)
    } else {
        (first, second)
    };
    // A peer with a smaller cap never wins on score against a less-capped one: it gets only
    // what the cap-weighted first draw gives it. With two or three candidates both draws almost
    // always include it, and the score alone would hand a peer on parole everything.
    if scored[winner].cap < scored[loser].cap {
        Some(first)
    } else {
        Some(winner)
    }
}

/// `a` clearly answers sooner than `b`: its expected wait (latency × calls pending + 1) is under
/// half of `b`'s. The score's cost term measures latency against the capability's timeout, so
/// 60 ms and 300 ms score alike under a 30 s timeout; this tells them apart, and the pending
/// factor keeps it from herding (a peer that wins gets more pending calls and stops winning).
fn less_loaded(a: &Scored, b: &Scored) -> bool {
    matches!((a.load_ms(), b.load_ms()), (Some(x), Some(y)) if x * 2.0 < y)
}

fn draw(scored: &[Scored], eligible: &[usize], random: &mut impl FnMut() -> f64) -> Option<usize> {
    let total: f64 = eligible.iter().map(|i| scored[*i].cap).sum();
    if total <= 0.0 {
        return eligible.first().copied();
    }
    let mut point = random() * total;
    for &i in eligible {
        point -= scored[i].cap;
        if point < 0.0 {
            return Some(i);
        }
    }
    eligible.last().copied()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::reach::{Factors, State};
    use crate::registry::Peer;

    pub(crate) fn candidate(name: &str, cap: f64, score: f64) -> Scored {
        Scored {
            peer: Arc::new(Peer {
                name: name.into(),
                address: "127.0.0.1:1".into(),
                zone: String::new(),
                region: String::new(),
                capabilities: vec![],
                identity: None,
                source: "static",
                target: None,
                timeout: None,
                max_concurrency: None,
                tools: Default::default(),
                tls: None,
            }),
            state: State::Healthy,
            self_state: None,
            cap,
            factors: Factors {
                score,
                ..Factors::default()
            },
            excluded: None,
            cooling_down: false,
            timeout: std::time::Duration::from_secs(30),
            idempotent: false,
            latency_ms: None,
            recent: None,
            expected_ms: None,
            cost_weight: 0.6,
            pending: 0,
            queued: 0,
        }
    }

    pub(crate) fn lcg(seed: u64) -> impl FnMut() -> f64 {
        let mut x = seed;
        move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn a_capped_peer_gets_about_its_share() {
        let c = vec![
            candidate("a", 1.0, 0.5),
            candidate("b", 1.0, 0.5),
            candidate("p", 0.05, 0.9),
        ];
        let mut rng = lcg(7);
        let n = 20_000;
        let parole = (0..n)
            .filter(|_| pick(&c, &[], &mut rng) == Some(2))
            .count();
        let share = parole as f64 / n as f64;
        // Drawn in about 2 × 0.05/2.05 of the pairs, and it wins those on score.
        assert!(share > 0.02 && share < 0.08, "{share}");
    }

    #[test]
    fn a_cap_binds_even_between_two_candidates() {
        let c = vec![
            candidate("healthy", 1.0, 0.5),
            candidate("parole", 0.05, 0.9),
        ];
        let mut rng = lcg(11);
        let n = 20_000;
        let parole = (0..n)
            .filter(|_| pick(&c, &[], &mut rng) == Some(1))
            .count();
        let share = parole as f64 / n as f64;
        assert!(
            share < 0.08,
            "the parole peer took {share} despite its 5% cap"
        );
        assert!(share > 0.02, "{share}");
    }

    #[test]
    fn on_a_tie_the_one_that_answers_clearly_sooner_wins_and_pending_calls_even_it_out() {
        let mut c = vec![candidate("slow", 1.0, 0.80), candidate("fast", 1.0, 0.79)];
        c[0].latency_ms = Some(280.0);
        c[1].latency_ms = Some(60.0);
        let mut rng = lcg(5);
        // All but the exploration share.
        let won = (0..1000)
            .filter(|_| pick(&c, &[], &mut rng) == Some(1))
            .count();
        assert!(won >= 970, "{won}");
        // Five calls pending on the fast one: 60 × 6 = 360 ms against 280, no longer clear.
        c[1].pending = 5;
        let fast = (0..2000)
            .filter(|_| pick(&c, &[], &mut rng) == Some(1))
            .count();
        assert!((600..1400).contains(&fast), "{fast}");
    }

    #[test]
    fn the_higher_score_wins_a_pair() {
        let c = vec![candidate("low", 1.0, 0.1), candidate("high", 1.0, 0.9)];
        let mut rng = lcg(1);
        let won = (0..1000)
            .filter(|_| pick(&c, &[], &mut rng) == Some(1))
            .count();
        // The low one gets only the exploration share's half: 1 %.
        assert!((975..1000).contains(&won), "{won}");
    }

    #[test]
    fn excluded_tried_and_cooling_candidates_are_skipped() {
        let mut c = vec![
            candidate("a", 1.0, 0.9),
            candidate("b", 1.0, 0.1),
            candidate("c", 1.0, 0.5),
        ];
        c[0].excluded = Some("ejected".into());
        c[2].cooling_down = true;
        let mut rng = lcg(3);
        assert_eq!(pick(&c, &[], &mut rng), Some(1));
        assert_eq!(
            pick(&c, &[1], &mut rng),
            Some(2),
            "a cooling peer beats no peer"
        );
        assert_eq!(pick(&c, &[1, 2], &mut rng), None);
    }
}
