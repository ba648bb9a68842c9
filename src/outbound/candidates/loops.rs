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
    // A model provider or a plain service is no agent: a call to one is no delegation.
    if scored.iter().all(|s| s.peer.is_external()) {
        return Ok(());
    }
    let chain = value
        .to_str()
        .map_err(|_| "not text".to_owned())
        .and_then(Chain::parse)
        .map_err(|why| ReachError::BadRequest(format!("reach-chain: {why}")))?;
    if let Some(span) = crate::http::layers::current_span() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Bootstrap, Policy};
    use crate::outbound::candidates::balance::tests::candidate;

    fn snapshot(policy: Policy) -> Snapshot {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 9));
        let bootstrap = Bootstrap::local("b", addr, &[]).unwrap_or_else(|e| panic!("{e}"));
        Snapshot::new(bootstrap, policy, 1)
    }

    fn guarded(
        policy: Policy,
        chain: &'static str,
        peers: &[&str],
    ) -> (Result<(), ReachError>, Vec<Scored>) {
        let mut scored: Vec<Scored> = peers.iter().map(|p| candidate(p, 1.0, 0.9)).collect();
        let metrics = Metrics::new("t");
        let value = HeaderValue::from_static(chain);
        let result = guard(&snapshot(policy), &metrics, "plan", &value, &mut scored);
        (result, scored)
    }

    #[test]
    fn a_candidate_on_the_chain_is_passed_over_and_the_last_one_is_a_loop() {
        let (result, scored) = guarded(Policy::default(), "2;user>a/plan>b/review", &["a", "c"]);
        assert!(result.is_ok());
        assert_eq!(scored[0].excluded.as_deref(), Some(ON_CHAIN));
        assert!(scored[1].excluded.is_none());
        let (result, _) = guarded(Policy::default(), "2;user>a/plan>b/review", &["a"]);
        match result {
            Err(ReachError::LoopDetected {
                looped,
                chain,
                hops,
                ..
            }) => {
                assert!(looped);
                assert_eq!((chain.as_str(), hops), ("user > a/plan > b/review", 2));
            }
            other => panic!("{other:?}"),
        }
        // The same agent serving another capability is no loop.
        let (result, scored) = guarded(Policy::default(), "1;user>b/review", &["b"]);
        assert!(result.is_ok() && scored[0].excluded.is_none());
    }

    #[test]
    fn reentrant_capabilities_loop_and_max_hops_still_bounds_them() {
        let mut policy = Policy::default();
        policy
            .capabilities
            .entry("plan".into())
            .or_default()
            .reentrant = true;
        policy.chains.max_hops = 3;
        let (result, scored) = guarded(policy.clone(), "2;user>a/plan>b/review", &["a"]);
        assert!(result.is_ok() && scored[0].excluded.is_none());
        let (result, _) = guarded(policy, "3;user>a/plan>b/review>a/plan", &["a"]);
        assert!(matches!(
            result,
            Err(ReachError::LoopDetected { looped: false, .. })
        ));
        let (result, _) = guarded(Policy::default(), "garbage", &["a"]);
        assert!(matches!(result, Err(ReachError::BadRequest(_))));
    }
}
