//! A bound call's candidates: its holder alone (`strict`), or everyone with the holder first
//! (`fallback`); `affinity_lost` when a strict call's holder is out.

use super::super::call::{Call, Pinned, Routed};
use super::super::Outbound;
use crate::config::AffinityMode;
use crate::error::ReachError;
use crate::peers::{RouteRequest, Scored};

/// `scored` narrowed for a call bound to `pin.holder`, and the candidate its first attempt must
/// go to.
#[allow(
    clippy::result_large_err,
    reason = "the refusal is the answer, moved once"
)]
pub(in crate::outbound) fn narrow(
    out: &Outbound,
    pin: &Pinned,
    call: &Call,
    route: &RouteRequest,
    mut scored: Vec<Scored>,
) -> Result<(Vec<Scored>, Option<usize>), Routed> {
    let at = scored.iter().position(|s| *s.peer.name == *pin.holder);
    let holder = match at {
        Some(i) => scored.get(i).cloned(),
        // A large fleet scores a sample: the holder is scored on its own.
        None => holder_outside_sample(out, pin, call, route),
    };
    let up = holder.filter(|h| !is_out(h)).map(|mut h| {
        // Full or lacking the call's tags is not out: the holder takes it (or says it is full).
        h.excluded = None;
        h
    });
    match (up, pin.mode) {
        (Some(holder), AffinityMode::Strict) => {
            out.metrics.affinity_hit(&route.capability);
            Ok((vec![holder], Some(0)))
        }
        (Some(holder), AffinityMode::Fallback) => {
            out.metrics.affinity_hit(&route.capability);
            let i = match at {
                Some(i) => {
                    scored[i] = holder;
                    i
                }
                None => {
                    scored.push(holder);
                    scored.len() - 1
                }
            };
            Ok((scored, Some(i)))
        }
        (None, AffinityMode::Fallback) => {
            // Routed afresh; whoever answers holds the key from now on.
            out.metrics.affinity_lost(&route.capability);
            Ok((scored, None))
        }
        (None, AffinityMode::Strict) => {
            out.metrics.affinity_lost(&route.capability);
            let err = ReachError::AffinityLost {
                capability: route.capability.clone(),
                holder: pin.holder.to_string(),
                key: pin.kind,
                rpc_id: None,
            };
            Err(Routed::refused(&route.capability, err))
        }
    }
}

fn holder_outside_sample(
    out: &Outbound,
    pin: &Pinned,
    call: &Call,
    route: &RouteRequest,
) -> Option<Scored> {
    let snapshot = &call.snapshot;
    let peer = out
        .registry
        .candidates(snapshot, &route.capability)
        .into_iter()
        .find(|p| *p.name == *pin.holder)?;
    out.peers.score(snapshot, &[peer], route).into_iter().next()
}

/// Out of rotation (ejected, draining: no cap) or its sidecar unreachable: its sessions are gone
/// or out of reach. The scorer says which only in its words.
fn is_out(holder: &Scored) -> bool {
    holder
        .excluded
        .as_deref()
        .is_some_and(|why| holder.cap <= 0.0 || why.starts_with("sidecar unreachable"))
}
