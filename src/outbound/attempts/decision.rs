//! The decision log: one event per routed attempt (tracing target `agent_reach::decision`) with
//! the choice, the outcome and every candidate's factors — the data to tune weights from; and
//! one per call resolved by intent, with the capability and why.
//!
//! The choice and the outcome are fields of their own, so a log pipeline filters and counts on
//! them (`capability`, `attempt`, `chosen`, `status`, …); only the candidates, a list of records
//! with nested factors, are one JSON value (`candidates`), as a flat field cannot hold them.

use super::retry::Attempt;
use crate::config::{RouteMode, Snapshot};
use crate::peers::{RouteRequest, Scored};

pub(in crate::outbound) fn log<B>(
    snapshot: &Snapshot,
    route: &RouteRequest,
    scored: &[Scored],
    chosen: usize,
    attempt: usize,
    outcome: &Attempt<B>,
    head: &http::HeaderMap,
) {
    if !snapshot.policy.decision_log {
        return;
    }
    let (status, refused, error) = match outcome {
        Attempt::Done(a) => (Some(a.response.status().as_u16()), None, None),
        Attempt::Refused(a, why) => (Some(a.response.status().as_u16()), Some(why.as_str()), None),
        Attempt::Failed(e) | Attempt::Limited(e) => (None, None, Some(e.code())),
    };
    let Some(pick) = scored.get(chosen) else {
        return;
    };
    let candidates = serde_json::Value::from(snapshot_of(scored));
    tracing::info!(
        target: "agent_reach::decision",
        direction = "outbound",
        capability = %route.capability,
        tags = %route.tags.join(","),
        mode = route.mode.map(mode_str),
        attempt,
        chosen = %pick.peer.name,
        chosen_state = pick.state.as_str(),
        score = pick.factors.score,
        candidates_count = scored.len(),
        status,
        refused,
        error,
        candidates = %candidates,
        chain = head.get(crate::chain::HEADER).and_then(|c| c.to_str().ok()),
        "routed"
    );
}

/// How a call's capability was chosen, when it did not simply name it (`docs/intents.md`).
pub(in crate::outbound) enum Resolution<'a> {
    /// By the policy's intent rules.
    Intent { keyword: &'a str, confidence: f64 },
    /// Intent routing was asked for, but the call named its capability: the name won.
    Override,
}

/// One event per call that asked for intent routing: the capability it went to and why, logged
/// once before its attempts (each of which logs `routed`).
pub(in crate::outbound) fn resolved(snapshot: &Snapshot, capability: &str, how: &Resolution<'_>) {
    if !snapshot.policy.decision_log {
        return;
    }
    let (by, keyword, confidence) = match *how {
        Resolution::Intent {
            keyword,
            confidence,
        } => ("intent", Some(keyword), Some(confidence)),
        Resolution::Override => ("override", None, None),
    };
    tracing::info!(
        target: "agent_reach::decision",
        direction = "outbound",
        capability,
        by,
        keyword,
        confidence,
        "resolved"
    );
}

fn mode_str(mode: RouteMode) -> &'static str {
    match mode {
        RouteMode::Sync => "sync",
        RouteMode::Async => "async",
    }
}

/// The candidate snapshot shown in `no_available_instance` and the decision log.
pub(in crate::outbound) fn snapshot_of(scored: &[Scored]) -> Vec<serde_json::Value> {
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
