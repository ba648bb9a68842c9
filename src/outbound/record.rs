//! The last word on a call: the metrics of how it ended (when its body has been delivered, for
//! an answer that streams) and `reach-attempts`.

use std::sync::Arc;
use std::time::Instant;

use http::Response;

use super::call::{Recorded, Routed};
use crate::budget::usage;
use crate::classify::{Class, Outcome};
use crate::error::ReachError;
use crate::http::layers::field;
use crate::http::observed::{BodyEnd, Observed};
use crate::http::{body, headers, ReachBody};
use crate::metrics::{Direction, Metrics};

/// The routed answer, recorded and answered (asked by `routing`, on whatever comes back).
pub(super) fn respond<B>(metrics: &Arc<Metrics>, routed: Routed<B>, started: Instant) -> Recorded
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<crate::http::body::BoxError>,
{
    let Routed {
        answer,
        tokens,
        label,
        peer,
        attempts,
    } = routed;
    let (mut response, last_tried) = match answer {
        Ok(response) => {
            let measured = measured(metrics.clone(), response, tokens, label, peer, started);
            (measured, None)
        }
        Err(err) => {
            let refused = refuse(metrics, &label, &peer, err, started);
            (refused, (peer != "-").then_some(peer))
        }
    };
    if let Some(attempts) = attempts {
        response
            .headers_mut()
            .insert(headers::ATTEMPTS, headers::count(attempts));
    }
    Recorded {
        response,
        last_tried,
    }
}

/// A peer's answer, recorded when its body has been delivered.
fn measured<B>(
    metrics: Arc<Metrics>,
    response: Response<B>,
    tokens: Option<Box<usage::Watch>>,
    label: String,
    peer: String,
    started: Instant,
) -> Response<ReachBody>
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<crate::http::body::BoxError>,
{
    let outcome = Class::of_response(&response).outcome();
    crate::http::layers::record_in_span(field::OUTCOME, outcome.as_str());
    let (parts, incoming) = response.into_parts();
    // An external target's answer, marked by the endpoint, has its tokens counted too.
    let observer = usage::then(tokens.map(|t| *t), &parts.headers, move |end: BodyEnd| {
        let outcome = if end == BodyEnd::Error {
            Outcome::Failure
        } else {
            outcome
        };
        metrics.request_finished(
            Direction::Outbound,
            &label,
            &peer,
            outcome.as_str(),
            (started, Instant::now()),
        );
    });
    Response::from_parts(parts, body::boxed(Observed::new(incoming, observer)))
}

/// The sidecar's own answer, recorded now.
pub(super) fn refuse(
    metrics: &Metrics,
    label: &str,
    peer: &str,
    err: ReachError,
    started: Instant,
) -> Response<ReachBody> {
    if matches!(err, ReachError::DeadlineExceeded) {
        metrics.deadline_exceeded(Direction::Outbound);
    }
    let outcome = Class::of_error(&err).outcome();
    crate::http::layers::record_in_span(field::OUTCOME, outcome.as_str());
    metrics.request_finished(
        Direction::Outbound,
        label,
        peer,
        outcome.as_str(),
        (started, Instant::now()),
    );
    err.into_response()
}
