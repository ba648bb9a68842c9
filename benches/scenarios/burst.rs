//! **burst** and **burst-3x**: every agent has a pool of 8 (its own queue holds the
//! excess) and agent-reach's sidecars declare `max_concurrency` 8 and a queue of 16: the fleet's
//! *room* is 4 × 24 = 96 calls, its *capacity* 4 × 8 ÷ 40 ms = 800 calls/s. For 5 s from the
//! fault (half the run, if that is shorter) more callers join, so that 1.5× (144) or 3× (288)
//! the room call at once; then the 16 go on alone, at least 1.5 s. In both burst scenarios a
//! caller whose call failed waits 40 ms (one mean call) before its next, so that a refusal
//! holds its place in the offered load instead of turning into a spin. Measures: *served/cap*,
//! the successful calls that ended during the burst ÷ what the capacity serves in as long
//! (goal ≥ 90 %); *left rot.*, the agents out of rotation from the burst on — for agent-reach
//! by the caller's `/status` (any peer in probation or ejected, by the caller's view, the
//! peer's own or the effective state), for the others by the traffic (an agent that got no
//! call for a whole second); failed calls among those made in the first second after the
//! burst (goal 0) and among all made after it. The static routers have no admission limit:
//! their excess waits in the agents' queues.

use std::time::Duration;

use crate::scenario::{Scenario, FAIL_PAUSE};
use crate::support::measures::Observed;
use crate::{LATENCY, QUEUE};

pub(crate) struct Measures {
    /// Callers during the burst, all together.
    callers: usize,
    /// Successful calls that ended during the burst ÷ what the fleet can serve in as long.
    served_pct: f64,
    /// Agents out of rotation: by the caller's `/status` (agent-reach), by the traffic.
    left: String,
    /// Failed calls among those made in the first second after the burst, and after it.
    failed_1s: usize,
    failed_after: usize,
}

pub(crate) fn measure(scenario: Scenario, seconds: u64, o: &Observed) -> Measures {
    let until = o.fault_at + scenario.burst_length(seconds);
    let served = o
        .calls
        .iter()
        .filter(|c| c.1 && c.0 >= o.fault_at && c.0 < until)
        .count();
    let could = scenario.capacity() * (until - o.fault_at).as_secs_f64();
    let left = match &o.left {
        Some(seen) => {
            let ejected = seen.values().filter(|s| **s == "ejected").count();
            match (seen.len(), ejected) {
                (0, _) => "0".to_owned(),
                (n, 0) => format!("{n} prob."),
                (n, e) => format!("{n} ({e} ej.)"),
            }
        }
        // An agent that got no call for a whole second while the others got some.
        None => {
            let out = (0..scenario.agents())
                .filter(|i| {
                    o.samples
                        .windows(11)
                        .filter(|w| w[0].at >= o.fault_at)
                        .any(|w| {
                            let (first, last) = (&w[0], &w[w.len() - 1]);
                            let got = |j: usize| last.reached[j].saturating_sub(first.reached[j]);
                            got(*i) == 0 && (0..first.reached.len()).map(got).sum::<u64>() > 0
                        })
                })
                .count();
            format!("{out} (tr.)")
        }
    };
    Measures {
        callers: scenario.workers() + scenario.burst_workers(),
        served_pct: 100.0 * served as f64 / could.max(1.0),
        left,
        failed_1s: o.failed_sent(until, until + Duration::from_secs(1)),
        failed_after: o.failed_sent(until, Duration::MAX),
    }
}

/// The burst table, if any burst ran.
pub(crate) fn print(rows: &[(Scenario, &str, &Measures)], seconds: u64) {
    if rows.is_empty() {
        return;
    }
    let s = Scenario::Burst;
    println!(
        "\nburst: {:.1} s at 1.5× (burst) or 3× (burst-3x) the fleet's room of {} calls ({} agents × \
         (max_concurrency {} + queue {})), then normal load;\ncapacity {:.0} calls/s ({} agents × a pool \
         of {} ÷ {} ms mean latency); a caller waits {} ms after a failed call",
        s.burst_length(seconds).as_secs_f64(),
        s.room(),
        s.agents(),
        s.max_concurrency(),
        QUEUE,
        s.capacity(),
        s.agents(),
        s.max_concurrency(),
        (LATENCY.min + LATENCY.max).as_millis() / 2,
        FAIL_PAUSE.as_millis()
    );
    println!(
        "{:<18} {:<12} {:>7} {:>10} {:>11} {:>9} {:>10}",
        "scenario", "router", "callers", "served/cap", "left rot.", "fail ≤1s", "fail after"
    );
    for (scenario, router, m) in rows {
        println!(
            "{:<18} {:<12} {:>7} {:>9.1}% {:>11} {:>9} {:>10}",
            scenario.name(),
            router,
            m.callers,
            m.served_pct,
            m.left,
            m.failed_1s,
            m.failed_after
        );
    }
    println!(
        "served/cap: successful calls that ended during the burst ÷ what the fleet's capacity serves in as \
         long (goal ≥ 90 %). left rot.: agents out of rotation\nfrom the burst on, by the caller's /status for \
         agent-reach (prob.: probation, ej.: ejected), by the traffic for the others (tr.: no call for a whole \
         second).\nfail ≤1s: failed calls among those made in the first second after the burst (goal 0); \
         fail after: among all made after it."
    );
}
