//! The refusals of tower-http's timeout and body-limit layers, which answer in plain text, put in
//! the sidecar's error format (JSON with `reach-reason`) like every answer the sidecar makes.

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::Body;

use crate::error::ReachError;
use crate::http::{body, headers, BoxError, ReachBody};

/// Rewrites a 408 or 413 that carries no `reach-reason` (one a layer made, not a handler);
/// passes anything else through.
pub(super) fn in_wire_format<B>(
    response: Response<B>,
    timeout: Duration,
    body_limit: usize,
) -> Response<ReachBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if response.headers().contains_key(headers::REASON) {
        return response.map(body::boxed);
    }
    match response.status() {
        // 400 `bad_request`, as the handlers answer a body over their own limits.
        StatusCode::PAYLOAD_TOO_LARGE => ReachError::BadRequest(format!(
            "the request body is over the {body_limit} bytes this endpoint reads"
        ))
        .into_response(),
        StatusCode::REQUEST_TIMEOUT => {
            let mut refused = ReachError::Timeout {
                target: "this endpoint".to_owned(),
                after: timeout,
            }
            .into_response();
            // The client's request took too long, not an upstream: 408, not 504.
            *refused.status_mut() = StatusCode::REQUEST_TIMEOUT;
            refused
        }
        _ => response.map(body::boxed),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn bare(status: StatusCode) -> Response<ReachBody> {
        let mut response = Response::new(body::empty());
        *response.status_mut() = status;
        response
    }

    #[test]
    fn a_layers_refusals_get_a_reason_and_a_handlers_answers_pass() {
        let t = Duration::from_secs(10);
        let too_large = in_wire_format(bare(StatusCode::PAYLOAD_TOO_LARGE), t, 4096);
        assert_eq!(
            (
                too_large.status(),
                too_large.headers()[headers::REASON].to_str().unwrap()
            ),
            (StatusCode::BAD_REQUEST, "bad_request")
        );
        let slow = in_wire_format(bare(StatusCode::REQUEST_TIMEOUT), t, 4096);
        assert_eq!(
            (
                slow.status(),
                slow.headers()[headers::REASON].to_str().unwrap()
            ),
            (StatusCode::REQUEST_TIMEOUT, "timeout")
        );
        let own = in_wire_format(ReachError::BodyTimeout.into_response(), t, 4096);
        assert_eq!(own.headers()[headers::REASON], "body_timeout");
        let fine = in_wire_format(bare(StatusCode::OK), t, 4096);
        assert!(fine.headers().get(headers::REASON).is_none());
    }
}
