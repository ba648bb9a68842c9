//! A call's delegation chain against its candidates (`docs/chains.md`): one hop past
//! `chains.max_hops` is refused, and a candidate already on the chain for this capability is
//! passed over unless the capability is `reentrant`; when every candidate is, the call is a loop,
//! refused at this caller with `508 loop_detected`. Only a call that carries a chain gets here.

use http::HeaderValue;

use crate::chain::Chain;
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::layers::field;
use crate::metrics::Metrics;
use crate::peers::Scored;

/// Why a candidate was passed over, as the decision log and `no_available_instance` show it.
const ON_CHAIN: &str = "on the call's delegation chain";

/// Checks `value` (the call's chain, peer form) and marks the candidates it rules out.
pub(super) fn guard(
    snapshot: &Snapshot,
    metrics: &Metrics,
    capability: &str,
    value: &HeaderValue,
    scored: &mut [Scored],
) -> Result<(), ReachError> {
    let chain = value
        .to_str()
        .map_err(|_| "not text".to_owned())
        .and_then(Chain::parse)
        .map_err(|why| ReachError::BadRequest(format!("reach-chain: {why}")))?;
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.record(field::CHAIN, chain.display());
    }
    let max_hops = snapshot.policy.chains.max_hops;
    let refuse = |looped: bool| {
        metrics.loop_refused(looped);
        if snapshot.policy.decision_log {
            let chain = chain.display();
            tracing::info!(target: "agent_reach::decision", direction = "outbound", capability, chain, error = "loop_detected", "refused");
        }
        ReachError::LoopDetected {
            capability: capability.to_owned(),
            chain: chain.display(),
            hops: chain.hops(),
            max_hops,
            looped,
        }
    };
    if chain.hops() >= max_hops {
        return Err(refuse(false));
    }
    let reentrant = snapshot
        .policy
        .capabilities
        .get(capability)
        .is_some_and(|c| c.reentrant);
    if reentrant {
        return Ok(());
    }
    let mut left = false;
    for candidate in scored.iter_mut() {
        if chain.holds(&candidate.peer.name, capability) {
            candidate.excluded = Some(ON_CHAIN.into());
        } else {
            left = true;
        }
    }
    if left {
        Ok(())
    } else {
        Err(refuse(true))
    }
}
