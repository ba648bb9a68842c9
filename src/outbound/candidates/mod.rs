//! Who may take a call: the peers that serve its capability (a sample of them in a large fleet),
//! each scored by this caller's view, in zone tiers.

pub(super) mod balance;
#[cfg(test)]
mod latency_share;
mod loops;
pub(super) mod sample;
pub(super) mod tiers;

use http::HeaderMap;

use super::call::{Call, Routed};
use super::{affinity, mcp, Outbound};
use crate::config::RouteMode;
use crate::error::ReachError;
use crate::http::headers::{self, Present};
use crate::metrics::UNKNOWN_CAPABILITY;
use crate::peers::{RouteRequest, Scored};
use tiers::Tier;

/// A call with its candidates: who may take it, best first by the pick's lights.
pub(super) struct Plan {
    pub(super) call: Call,
    pub(super) route: RouteRequest,
    pub(super) scored: Vec<Scored>,
    pub(super) tiers: Vec<Tier>,
    /// The candidate the first attempt must go to: the holder of the call's affinity key.
    pub(super) prefer: Option<usize>,
}

/// Why nobody is a candidate. Unknown only when this sidecar can tell: one that knows no
/// member of its mesh right now (cut off from gossip), or whose policy refused every claimant
/// (`served_by`), answers 503 with `retry-after` — a condition that passes, not a typo.
fn nobody_serves(out: &Outbound, call: &Call, route: &RouteRequest) -> ReachError {
    let snapshot = &call.snapshot;
    let capability = route.capability.clone();
    if snapshot
        .policy
        .authorization
        .served_by(&capability)
        .is_some()
    {
        let refused: Vec<_> = out
            .registry
            .refused_claims(snapshot)
            .into_iter()
            .filter(|c| c.capability == capability)
            .collect();
        return ReachError::NoAvailableInstance {
            capability,
            candidates: serde_json::json!({
                "why": "no member that claims it proves an identity its served_by lists",
                "refused_claims": refused,
            }),
            attempts: 0,
        };
    }
    if snapshot.bootstrap.gossip.is_some() && out.registry.gossip_members() == 0 {
        return ReachError::NoAvailableInstance {
            capability,
            candidates: serde_json::json!({
                "why": "this sidecar knows no member of its mesh right now (gossip has none): it cannot tell who serves it",
            }),
            attempts: 0,
        };
    }
    ReachError::UnknownCapability { capability }
}

/// The call's plan, or its refusal when nobody serves it (asked by `routing`).
#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
pub(super) fn plan(out: &Outbound, call: Call) -> Result<Plan, Routed> {
    let route = route_request(&call);
    let scored = sample::score_candidates(&out.registry, &out.peers, &call.snapshot, &route, |n| {
        rand::random_range(0..n)
    });
    if scored.is_empty() {
        // Not labelled by name: a caller's typos must not grow the metric series.
        out.metrics.no_candidate(UNKNOWN_CAPABILITY);
        return Err(Routed::refused(
            UNKNOWN_CAPABILITY,
            nobody_serves(out, &call, &route),
        ));
    }
    // An MCP call goes to the servers that have its tool (`docs/mcp.md`).
    let carried = call.carried.as_deref();
    let scored = match carried.and_then(|c| c.mcp_route.as_ref()) {
        Some(route) => {
            let sessions = carried.and_then(|c| c.sessions.as_ref());
            mcp::narrow(
                out,
                &call.snapshot,
                (route, sessions),
                call.capability.as_str(),
                scored,
            )
            .map_err(|err| Routed::refused(call.capability.as_str(), err))?
        }
        None => scored,
    };
    // A call whose affinity key is bound goes to the key's holder.
    let (mut scored, prefer) = match carried.and_then(|c| c.pinned.as_ref()) {
        Some(pin) => affinity::narrow(out, pin, &call, &route, scored)?,
        None => (scored, None),
    };
    // A delegated call: no loop, no hop past the policy's limit.
    let chain = call.present.has(Present::CHAIN);
    if let Some(chain) = chain
        .then(|| call.parts.headers.get(crate::chain::HEADER))
        .flatten()
    {
        let snapshot = &call.snapshot;
        loops::guard(
            snapshot,
            &out.metrics,
            &route.capability,
            chain,
            &mut scored,
        )
        .map_err(|err| Routed::refused(&route.capability, err))?;
    }
    let me = &call.snapshot.bootstrap.agent;
    let tiers = scored
        .iter()
        .map(|s| Tier::of((&me.zone, &me.region), (&s.peer.zone, &s.peer.region)))
        .collect();
    Ok(Plan {
        call,
        route,
        scored,
        tiers,
        prefer,
    })
}

/// What the pick needs to know of the call: capability, required tags, sync or async.
fn route_request(call: &Call) -> RouteRequest {
    let headers = &call.parts.headers;
    RouteRequest {
        capability: call.capability.as_str().to_owned(),
        tags: match call.present.has(Present::TAGS) {
            true => header_list(headers, headers::TAGS),
            false => Vec::new(),
        },
        mode: call
            .present
            .has(Present::MODE)
            .then(|| headers.get(headers::MODE))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(RouteMode::parse),
    }
}

fn header_list(headers: &HeaderMap, name: http::HeaderName) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}
