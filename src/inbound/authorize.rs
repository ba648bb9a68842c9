//! Per-capability authorization: the fleet policy's `authorization` says which caller identities
//! may call which capability (`docs/mtls.md`). Checked at the edge, before the call takes a
//! slot or reaches the agent; a refusal names the capability, never the policy.

use std::net::SocketAddr;

use crate::config::Snapshot;
use crate::error::ReachError;
use crate::identity::SpiffeId;
use crate::metrics::Metrics;

/// Refuses a call `caller` (none: plaintext) may not make, counting it and writing it to the
/// decision log.
pub(super) fn check(
    snapshot: &Snapshot,
    metrics: &Metrics,
    capability: Option<&str>,
    label: &str,
    caller: Option<&SpiffeId>,
    remote: Option<SocketAddr>,
) -> Result<(), ReachError> {
    if snapshot.policy.authorization.allows(capability, caller) {
        return Ok(());
    }
    metrics.authz_denied(label);
    if snapshot.policy.decision_log {
        tracing::info!(
            target: "agent_reach::decision",
            direction = "inbound",
            capability = label,
            caller_identity = caller.map(SpiffeId::as_str),
            remote = remote.map(tracing::field::display),
            status = 403u16,
            error = "forbidden",
            "forbidden"
        );
    }
    Err(ReachError::Forbidden {
        capability: label.to_owned(),
    })
}
