//! The innermost inbound step: the call forwarded to the local agent over the agent client,
//! within its timeout.

use std::convert::Infallible;

use http::Response;
use hyper::body::Incoming;
use tower::service_fn;

use super::call::Forward;
use crate::error::ReachError;
use crate::http::client::AgentClient;
use crate::http::forward::forward;
use crate::http::step::Step;

pub(super) fn endpoint(
    client: AgentClient,
) -> impl Step<Forward, Response = Result<Response<Incoming>, ReachError>> {
    service_fn(move |call: Forward| {
        let client = client.clone();
        async move {
            let agent = &call.snapshot.bootstrap.agent;
            let target = format!("agent {}", agent.name);
            let address = agent.address.as_str();
            let forwarded = forward(&client, call.request, address, &target, call.timeout).await;
            Ok::<_, Infallible>(forwarded)
        }
    })
}
