//! The innermost inbound step: the call forwarded to the local agent over the agent client,
//! within its timeout.
//!
//! Connections to the agent stay within admission: the pool opens one only for a call holding a
//! slot and finding none idle, so at most `max_concurrency` in use plus the idle set. An agent
//! with a small listen backlog that is serving others can still time out a connect (its accept
//! queue is full): that call connects again within its time ([`Backlog::Wait`]), and if the time
//! runs out it is answered `503 saturated`, load and not failure: never `upstream_connect_failed`,
//! which would count against (and eject) an agent that is up.

use http::Response;

use super::call::Forward;
use crate::error::ReachError;
use crate::http::pool::{forward_with, Backlog, Named, Pool, UpstreamBody};
use crate::http::step::{self, Step};

pub(super) fn endpoint(
    client: Pool,
) -> impl Step<Forward, Response = Result<Response<UpstreamBody>, ReachError>> {
    step::service!(client, forward)
}

/// The call, forwarded to the agent.
async fn forward(client: Pool, call: Forward) -> Result<Response<UpstreamBody>, ReachError> {
    let agent = &call.snapshot.bootstrap.agent;
    let target = Named(|f: &mut std::fmt::Formatter<'_>| write!(f, "agent {}", agent.name));
    let address = agent.address.as_str();
    forward_with(
        &client,
        call.request,
        address,
        None,
        &target,
        call.timeout,
        Backlog::Wait,
    )
    .await
}
