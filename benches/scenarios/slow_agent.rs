//! **slow-agent**: one agent goes from 20–60 ms to 400 ms (10× the mean), no errors.
//! Its share of the calls that reached agents over the 5 s from the slowdown (goal ≤ 5 %) and
//! after; the p95 of the calls made after the slowdown against the p95 of those made before it,
//! in the same run (goal ≤ 1.25×); failed calls made after it (goal 0).

use std::time::Duration;

use crate::scenario::Scenario;
use crate::scenario::{SLOW_AGENT, SLOW_WINDOW};
use crate::support::measures::{p95, pct, sent, share, Observed};
use crate::support::Call;

pub(crate) struct Measures {
    /// The slow agent's share of the calls that reached agents, over the first 5 s and after.
    share_first: Option<f64>,
    share_later: Option<f64>,
    /// p95 of the calls made before the slowdown and of those made after it.
    p95_before: f64,
    p95_after: f64,
    failed_after: usize,
}

pub(crate) fn measure(o: &Observed) -> Measures {
    let split = o.broke_at + SLOW_WINDOW;
    let before: Vec<&Call> = o.calls.iter().filter(|c| sent(c) < o.broke_at).collect();
    let after: Vec<&Call> = o.calls.iter().filter(|c| sent(c) >= o.broke_at).collect();
    Measures {
        share_first: share(o.samples, 1, o.broke_at, split),
        share_later: share(o.samples, 1, split, o.end()),
        p95_before: p95(&before),
        p95_after: p95(&after),
        failed_after: o.failed_sent(o.broke_at, Duration::MAX),
    }
}

/// The slow-agent table, if it ran.
pub(crate) fn print(rows: &[(Scenario, &str, &Measures)]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\nslow-agent: one of four agents goes from 20–60 ms to {} ms",
        SLOW_AGENT.as_millis()
    );
    println!(
        "{:<18} {:<12} {:>9} {:>9} {:>10} {:>9} {:>7} {:>8}",
        "scenario", "router", "share 5s", "share >5s", "p95 before", "p95 after", "ratio", "failed"
    );
    for (scenario, router, m) in rows {
        let ratio = if m.p95_before > 0.0 {
            format!("{:.2}x", m.p95_after / m.p95_before)
        } else {
            "-".to_owned()
        };
        println!(
            "{:<18} {:<12} {:>9} {:>9} {:>10.1} {:>9.1} {:>7} {:>8}",
            scenario.name(),
            router,
            pct(m.share_first),
            pct(m.share_later),
            m.p95_before,
            m.p95_after,
            ratio,
            m.failed_after
        );
    }
    println!(
        "share 5s: the slow agent's share of the calls that reached agents in the 5 s from the slowdown \
         (goal ≤ 5 %); share >5s: after them.\np95 of the calls made before / after the slowdown, and \
         ratio (goal ≤ 1.25×); failed: calls made after the slowdown that failed (goal 0)."
    );
}
