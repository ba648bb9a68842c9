//! **ramp** (predicted saturation, docs/reach-model.md): one agent is weaker (a pool of 2, and its
//! sidecar declares `max_concurrency` 2; the other three have 8), the fleet starts with 4
//! callers and from a quarter of the way in gains one more every `RAMP_EVERY` (closed loop, a
//! caller waits 40 ms after a failed call) up to 64. agent-reach only, twice: with prediction (`estimates.horizon: 10s`, the default)
//! and without (`agent-reach/h0`: `0s`). Measures: attempts refused as saturated (429, or 503
//! `saturated`) counted at the caller's sidecar (every peer) and at the weak agent's sidecar,
//! the weak agent's share of the calls that reached agents during the ramp, the p95 and the
//! failed calls.
//!
//! **ramp-shared**: ramp with its callers spread over 4 caller sidecars (caller `k` calls
//! through sidecar `k mod 4`: one each at the start, 16 each at the end), each a real sidecar
//! that finds the fleet by gossip. ramp's one caller sidecar counts its own calls in flight to
//! each peer exactly and at once, so a peer's prediction tells it nothing new; here each caller
//! sidecar learns of the other three's load on the weak agent only from the agent's gossiped
//! view, which is where a published trend could help. Same measures; refusals at the callers
//! are summed over the four. Measured (`cargo bench --bench scenarios -- --only ramp-shared`,
//! four full runs each way, 2-core machine shared with other builds): with prediction refused
//! 126/271/136/235 at the callers, 12/28/16/20 at the weak agent, weak share 6.7–8.0 %, p95
//! 130–135 ms; without, 191/226/127/159, 17/16/19/11, 7.1–7.9 %, 128–136 ms; no failed call.
//! No difference beyond the run-to-run spread. Why (`--diag`): the weak agent's saturation is
//! 0, 0.5 or 1 (whole calls over a pool of 2) and its published prediction never once rose
//! above it (the others' ran at most 0.09 ahead); from half way the 64 callers offer more than
//! the fleet's 26 slots, every agent reads 1.0 now and predicted (a full pool is 1.0 whatever
//! its queue), so nothing is left to rank by (docs/reach-model.md, "Predicted saturation").
//!
//! **ramp-under**: ramp-shared with a ramp that stays under the fleet's slots, so that the
//! ranking has room to act on: the weak agent has a pool of 4 (its saturation moves in
//! quarters), 4 callers and 20 more (24 in all, against 28 slots). Measured (`cargo bench
//! --bench scenarios -- --only ramp-under`, three runs each way): no refusal either way; with
//! prediction p95 68.5/68.1/72.0 ms and weak share 14.7–16.9 %, without 73.8/71.9/71.1 ms and
//! 15.7–16.6 %. Under capacity the callers' own counts and the gossiped saturation already keep
//! the weak agent at about its share of the slots (4 of 28: 14 %), so the prediction has
//! nothing left to prevent: its benefit is still not shown by a benchmark here.

use std::time::Duration;

use crate::scenario::Scenario;
use crate::scenario::{RAMP_CALLER_SIDECARS, RAMP_FROM, RAMP_WEAK, REACH_NO_PREDICTION};
use crate::support::measures::{p95, pct, share, Observed};
use crate::support::Call;

pub(crate) struct Measures {
    /// Attempts refused as saturated: at the caller's sidecar (every peer), at the weak agent's
    /// sidecar.
    refused_caller: Option<u64>,
    refused_weak: Option<u64>,
    /// The weak agent's share of the calls that reached agents during the ramp.
    weak_share: Option<f64>,
    p95: f64,
    failed: usize,
}

pub(crate) fn measure(o: &Observed) -> Measures {
    let all: Vec<&Call> = o.calls.iter().collect();
    Measures {
        refused_caller: o.refusals.map(|r| r.0),
        refused_weak: o.refusals.map(|r| r.1),
        weak_share: share(o.samples, RAMP_WEAK, o.fault_at, o.end()),
        p95: p95(&all),
        failed: o.failed_sent(Duration::ZERO, Duration::MAX),
    }
}

/// The ramp table, if a ramp ran.
pub(crate) fn print(rows: &[(Scenario, &str, &Measures)], seconds: u64) {
    if rows.is_empty() {
        return;
    }
    // Each ramp scenario run, once: its callers and the weak agent's pool.
    let mut shown: Vec<Scenario> = rows.iter().map(|e| e.0).collect();
    shown.dedup();
    println!();
    for s in shown {
        println!(
            "{}: {RAMP_FROM} callers, then one more every {:.0} ms from {:.1} s (up to {}); agent-{} has a \
             pool of {} (max_concurrency {}), the others {}{}",
            s.name(),
            s.ramp_every(seconds).unwrap_or_default().as_secs_f64() * 1000.0,
            s.fault_at(seconds).as_secs_f64(),
            RAMP_FROM + s.ramp_added(),
            RAMP_WEAK + 1,
            s.weak_pool(),
            s.weak_pool(),
            s.max_concurrency(),
            if s.caller_sidecars() > 1 {
                format!(
                    "; callers spread over {RAMP_CALLER_SIDECARS} caller sidecars (caller k \
                     through sidecar k mod {RAMP_CALLER_SIDECARS}), each finding the fleet by gossip"
                )
            } else {
                String::new()
            }
        );
    }
    println!(
        "{:<18} {:<15} {:>11} {:>10} {:>10} {:>8} {:>7}",
        "scenario", "router", "refused@clr", "refused@wk", "weak share", "p95 ms", "failed"
    );
    for (scenario, router, m) in rows {
        let count = |n: Option<u64>| n.map_or("-".to_owned(), |n| n.to_string());
        println!(
            "{:<18} {:<15} {:>11} {:>10} {:>10} {:>8.1} {:>7}",
            scenario.name(),
            router,
            count(m.refused_caller),
            count(m.refused_weak),
            pct(m.weak_share),
            m.p95,
            m.failed
        );
    }
    println!(
        "refused@clr: attempts refused as saturated (429, or 503 saturated) counted by the callers' sidecars, \
         every peer, summed; refused@wk: turned away\nby the weak agent's sidecar. weak share: its share of the calls \
         that reached agents from the ramp's start. agent-reach predicts (estimates.horizon 10s);\n{} does not \
         (0s).",
        REACH_NO_PREDICTION
    );
}
