//! What peers' latency judgment (`peers::latency`) and the pick (`balance`) give together: the
//! share of calls a slower peer gets. Here, not in `peers`, because it drives the pick, and
//! `outbound` builds on `peers`, not the other way round.

use std::time::Duration;

use tokio::time::Instant;

use super::balance::pick;
use super::balance::tests::{candidate, lcg};
use crate::peers::{judge, Scored};
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
    let mut peers = [Estimates::new(1.0, start), Estimates::new(1.0, start)];
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
