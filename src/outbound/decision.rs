//! The decision log: one JSON line per routed attempt (tracing target `agent_reach::decision`)
//! with every candidate's factors, the choice and the outcome — the data to tune weights from.

use super::attempt::Attempt;
use crate::config::Snapshot;
use crate::peers::{RouteRequest, Scored};

pub(super) fn log<B>(
    snapshot: &Snapshot,
    route: &RouteRequest,
    scored: &[Scored],
    chosen: usize,
    attempt: usize,
    outcome: &Attempt<B>,
) {
    if !snapshot.policy.decision_log {
        return;
    }
    let outcome = match outcome {
        Attempt::Done(r) => serde_json::json!({ "status": r.status().as_u16() }),
        Attempt::Refused(r, why) => {
            serde_json::json!({ "status": r.status().as_u16(), "refused": why.as_str() })
        }
        Attempt::Failed(e) | Attempt::Limited(e) => serde_json::json!({ "error": e.code() }),
    };
    let line = serde_json::json!({
        "capability": route.capability,
        "tags": route.tags,
        "mode": route.mode,
        "attempt": attempt,
        "chosen": scored[chosen].peer.name,
        "candidates": snapshot_of(scored),
        "outcome": outcome,
    });
    tracing::info!(target: "agent_reach::decision", decision = %line, "routed");
}

/// The candidate snapshot shown in `no_available_instance` and the decision log.
pub(super) fn snapshot_of(scored: &[Scored]) -> Vec<serde_json::Value> {
    scored
        .iter()
        .map(|s| {
            serde_json::json!({
                "peer": s.peer.name,
                "state": s.state,
                "self_state": s.self_state,
                "cap": s.cap,
                "score": s.factors.score,
                "factors": s.factors,
                "cooling_down": s.cooling_down,
                "passed_over": s.excluded,
            })
        })
        .collect()
}
