//! Sending a request on to an upstream (a peer sidecar or the local agent) with a timeout.

use std::time::Duration;

use http::{header, Request, Response, Version};
use hyper::body::Incoming;

use super::client::{self, Upstream};
use super::request_target;
use super::{body, headers, ReachBody};
use crate::error::ReachError;
use crate::transport::Connect;

/// Rewrites `req` for `authority` (host:port) and sends it through `client`, an
/// [`AgentClient`](super::client::AgentClient) or a [`PeerClient`](super::client::PeerClient)
/// (the URI's scheme is its transport's); gives up on the response headers after `timeout`. The
/// request's hop-by-hop headers were stripped at the edge, before the sidecar added its own
/// (stripping here would let a caller's `Connection` header remove them).
pub async fn forward<C: Connect>(
    client: &Upstream<C>,
    mut req: Request<ReachBody>,
    authority: &str,
    target_name: &str,
    timeout: Duration,
) -> Result<Response<Incoming>, ReachError> {
    // The target was checked at the listener's edge (`request_target::of`).
    *req.uri_mut() = request_target::upstream_uri(client.scheme(), authority, req.uri())?;
    // Upstream connections are HTTP/1.1 whatever the caller spoke.
    *req.version_mut() = Version::HTTP_11;
    req.headers_mut()
        .insert(header::HOST, headers::value(authority));
    match tokio::time::timeout(timeout, client.request(req)).await {
        Ok(Ok(mut response)) => {
            headers::strip_hop_by_hop(response.headers_mut());
            Ok(response)
        }
        Ok(Err(err)) => {
            let failure = client::describe(&err);
            let (target, message) = (target_name.to_owned(), failure.message);
            Err(if failure.connect {
                ReachError::UpstreamConnect {
                    target,
                    message,
                    refused: failure.refused,
                }
            } else {
                ReachError::Upstream { target, message }
            })
        }
        Err(_) => Err(ReachError::Timeout {
            target: target_name.to_owned(),
            after: timeout,
        }),
    }
}

/// Turns an incoming request's body into the client's body type, streaming.
pub fn into_upstream(req: Request<Incoming>) -> Request<ReachBody> {
    req.map(body::boxed)
}
