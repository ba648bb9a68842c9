//! Sending a request on to an upstream (a peer sidecar or the local agent) with a timeout.

use std::time::Duration;

use http::{header, Request, Response, Uri, Version};
use hyper::body::Incoming;

use super::client::{self, UpstreamClient};
use super::{body, headers, ReachBody};
use crate::error::ReachError;

/// Rewrites `req` for `authority` (host:port), strips hop-by-hop headers and sends it; gives up on
/// the response headers after `timeout`.
pub async fn forward(
    client: &UpstreamClient,
    mut req: Request<ReachBody>,
    authority: &str,
    target_name: &str,
    timeout: Duration,
) -> Result<Response<Incoming>, ReachError> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let uri: Uri = format!("http://{authority}{path}")
        .parse()
        .map_err(|_| ReachError::BadRequest(format!("cannot form an upstream URI for `{path}`")))?;
    *req.uri_mut() = uri;
    // Upstream connections are HTTP/1.1 whatever the caller spoke.
    *req.version_mut() = Version::HTTP_11;
    let h = req.headers_mut();
    headers::strip_hop_by_hop(h);
    h.insert(header::HOST, headers::value(authority));
    match tokio::time::timeout(timeout, client.request(req)).await {
        Ok(Ok(mut response)) => {
            headers::strip_hop_by_hop(response.headers_mut());
            Ok(response)
        }
        Ok(Err(err)) => {
            let (connect, message) = client::describe(&err);
            let target = target_name.to_owned();
            Err(if connect {
                ReachError::UpstreamConnect { target, message }
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
