//! **crash-same-address**: like crash (the agent process dies, its sidecar stays,
//! the fleet found by gossip), but agent-reach's sidecars declare no business probe, and 3 s
//! later the agent is back on the same port; nobody is told. Failed calls among those in flight
//! at the kill (these may fail), made after it until the return (goal 0) and made from the
//! return on (the ramp, goal 0); the returned agent's share of the calls that reached agents in
//! the 10 s from its return (goal ≥ 15 %). Runs at least 17 s.

use std::time::Duration;

use crate::scenario::RETURN_WINDOW;
use crate::scenario::{Scenario, RESTART_AFTER};
use crate::support::measures::{pct, sent, share, Observed};

pub(crate) struct Measures {
    /// Failed calls made before the kill (in flight at it), and made after it until the
    /// agent's return.
    in_flight_failed: usize,
    later_failed: usize,
    /// The returned agent's share of the calls that reached agents, over 10 s from its
    /// return, and the calls made from its return that failed.
    share_back: Option<f64>,
    ramp_failed: usize,
}

pub(crate) fn measure(o: &Observed) -> Measures {
    let forever = Duration::MAX;
    let back = o.joined_at.unwrap_or(forever);
    Measures {
        in_flight_failed: o
            .calls
            .iter()
            .filter(|c| !c.1 && sent(c) < o.broke_at && c.0 >= o.broke_at)
            .count(),
        later_failed: o.failed_sent(o.broke_at, back),
        share_back: o
            .joined_at
            .and_then(|at| share(o.samples, 1, at, at + RETURN_WINDOW)),
        ramp_failed: o.failed_sent(back, forever),
    }
}

/// The crash-same-address table, if it ran.
pub(crate) fn print(rows: &[(Scenario, &str, &Measures)]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\ncrash-same-address: the agent dies, its sidecar stays (no business probe); {} s later it is back on its port",
        RESTART_AFTER.as_secs()
    );
    println!(
        "{:<18} {:<12} {:>9} {:>9} {:>9} {:>9}",
        "scenario", "router", "in flight", "later", "back 10s", "ramp"
    );
    for (scenario, router, m) in rows {
        println!(
            "{:<18} {:<12} {:>9} {:>9} {:>9} {:>9}",
            scenario.name(),
            router,
            m.in_flight_failed,
            m.later_failed,
            pct(m.share_back),
            m.ramp_failed
        );
    }
    println!(
        "failed calls: in flight: made before the kill (these may fail); later: made from the kill to the \
         return (goal 0);\nramp: made from the return on (goal 0). back 10s: the returned agent's share of \
         the calls that reached agents in the {} s from its return (goal ≥ 15 %).",
        RETURN_WINDOW.as_secs()
    );
}
