//! The innermost inbound step: the call forwarded to the local agent over the agent client,
//! within its timeout.

use std::convert::Infallible;

use http::Response;
use tower::service_fn;

use super::call::Forward;
use crate::error::ReachError;
use crate::http::pool::{forward, Named, Pool, UpstreamBody};
use crate::http::step::Step;

pub(super) fn endpoint(
    client: Pool,
) -> impl Step<Forward, Response = Result<Response<UpstreamBody>, ReachError>> {
    service_fn(move |call: Forward| {
        let client = client.clone();
        async move {
            let agent = &call.snapshot.bootstrap.agent;
            let target = Named(|f: &mut std::fmt::Formatter<'_>| write!(f, "agent {}", agent.name));
            let address = agent.address.as_str();
            let forwarded =
                forward(&client, call.request, address, None, &target, call.timeout).await;
            Ok::<_, Infallible>(forwarded)
        }
    })
}
