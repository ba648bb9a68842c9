//! The call forwarded to the local agent over the agent client, within its timeout: asked by
//! `measure`, which the agent's answer goes back to.
//!
//! Connections to the agent stay within admission: the pool opens one only for a call holding a
//! slot and finding none idle, so at most `max_concurrency` in use plus the idle set. An agent
//! with a small listen backlog that is serving others can still time out a connect (its accept
//! queue is full): that call connects again within its time ([`Backlog::Wait`]), and if the time
//! runs out it is answered `503 saturated`, load and not failure: never `upstream_connect_failed`,
//! which would count against (and eject) an agent that is up.

use std::time::Duration;

use http::{Request, Response};

use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::pool::{forward_with, Backlog, Named, Pool, UpstreamBody};
use crate::http::ReachBody;

/// The call, forwarded to the agent.
pub(super) async fn forward(
    client: &Pool,
    snapshot: &Snapshot,
    request: Request<ReachBody>,
    timeout: Duration,
) -> Result<Response<UpstreamBody>, ReachError> {
    let agent = &snapshot.bootstrap.agent;
    let target = Named(|f: &mut std::fmt::Formatter<'_>| write!(f, "agent {}", agent.name));
    let address = agent.address.as_str();
    forward_with(
        client,
        request,
        address,
        None,
        &target,
        timeout,
        Backlog::Wait,
    )
    .await
}
