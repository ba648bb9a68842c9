//! The agent's answer checked against its capability's `output_schema`, before anyone sees it: a
//! 200 with the wrong shape ("a plausible fake") is a failure of the agent, answered
//! `502 invalid_output` with what was wrong, and the measure step above counts it so.
//!
//! Only a capability with a schema pays: its JSON answers (2xx, a `content-length` up to
//! `validation.max_body_bytes`) are read whole, parsed and checked. Every other answer streams
//! through untouched; a schema'd answer that streams or is too large to hold is passed on
//! unchecked and counted (`reach_output_unvalidated_total`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderMap, Method, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};

use super::call::Check;
use super::Inbound;
use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::pool::UpstreamBody;

/// The check for a call to `capability`, when the agent declares a schema for it. A HEAD answer
/// has a length but no body: nothing to check.
pub(super) fn check_for(snapshot: &Snapshot, capability: &str, method: &Method) -> Option<Check> {
    if method == Method::HEAD {
        return None;
    }
    let schema = snapshot
        .bootstrap
        .agent
        .capability(capability)?
        .output_schema
        .as_ref()?
        .compiled()?;
    Some(Check {
        capability: capability.to_owned(),
        schema: schema.clone(),
    })
}

/// The agent's answer, checked against the capability's output schema when it has one (asked by
/// `measure`). Only a checked answer pays: the reading is boxed, so a call with no schema
/// carries none of it.
pub(super) async fn checked(
    inbound: &Inbound,
    snapshot: &Snapshot,
    check: Option<Check>,
    response: Response<UpstreamBody>,
    timeout: std::time::Duration,
) -> Result<Response<AgentBody>, ReachError> {
    match check {
        None => Ok(response.map(AgentBody::Streamed)),
        Some(check) => Box::pin(validate(inbound, snapshot, check, response, timeout)).await,
    }
}

/// Why an answer of a capability with a schema was not checked: the metric's `reason`.
fn unchecked_because(headers: &HeaderMap, max: usize) -> Option<&'static str> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "text/event-stream" {
        return Some("streamed");
    }
    if essence != "application/json" && !essence.ends_with("+json") {
        return Some("not_json");
    }
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match length {
        // No length: it streams (chunked); holding it would undo that.
        None => Some("streamed"),
        Some(n) if n > max as u64 => Some("oversized"),
        Some(_) => None,
    }
}

/// Reads, parses and checks one answer; passes on what it does not check.
async fn validate(
    inbound: &Inbound,
    snapshot: &Snapshot,
    check: Check,
    response: Response<UpstreamBody>,
    timeout: std::time::Duration,
) -> Result<Response<AgentBody>, ReachError> {
    let status = response.status();
    // A failure or an empty answer has no shape to check: the classifier reads it as it is.
    if !status.is_success()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::RESET_CONTENT
    {
        return Ok(response.map(AgentBody::Streamed));
    }
    let max = snapshot.policy.validation.max_body_bytes;
    if let Some(reason) = unchecked_because(response.headers(), max) {
        inbound
            .metrics
            .output_unvalidated(&check.capability, reason);
        return Ok(response.map(AgentBody::Streamed));
    }
    let agent = snapshot.bootstrap.agent.name.to_string();
    let (parts, body) = response.into_parts();
    // The length was checked; the limit catches an agent whose body runs past it.
    let read = tokio::time::timeout(timeout, Limited::new(body, max).collect()).await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(err)) => {
            return Err(ReachError::Upstream {
                target: format!("agent {agent}"),
                message: format!("reading the answer to check it: {err}"),
            })
        }
        Err(_) => {
            return Err(ReachError::Timeout {
                target: format!("agent {agent}"),
                after: timeout,
            })
        }
    };
    let verdict = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(value) => check.schema.check(&value),
        Err(err) => Err(vec![format!("/: not JSON: {err}")]),
    };
    match verdict {
        Ok(()) => Ok(Response::from_parts(parts, AgentBody::Checked(Some(bytes)))),
        Err(errors) => {
            inbound.metrics.output_invalid(&check.capability);
            Err(ReachError::InvalidOutput {
                agent,
                capability: check.capability,
                errors,
            })
        }
    }
}

// === impl AgentBody ===

/// The agent's answer as the measure step passes it on: streaming from the agent's connection,
/// or already read and checked.
pub(super) enum AgentBody {
    Streamed(UpstreamBody),
    Checked(Option<Bytes>),
}

impl Body for AgentBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            AgentBody::Streamed(body) => Pin::new(body).poll_frame(cx),
            AgentBody::Checked(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AgentBody::Streamed(body) => body.is_end_stream(),
            AgentBody::Checked(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            AgentBody::Streamed(body) => body.size_hint(),
            AgentBody::Checked(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: Option<&'static str>, length: Option<u64>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(t) = content_type {
            h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(t));
        }
        if let Some(n) = length {
            h.insert(header::CONTENT_LENGTH, n.into());
        }
        h
    }

    #[test]
    fn which_answers_are_checked() {
        let max = 100;
        let json = Some("application/json");
        assert_eq!(unchecked_because(&headers(json, Some(10)), max), None);
        assert_eq!(
            unchecked_because(
                &headers(Some("application/problem+json; charset=utf-8"), Some(10)),
                max
            ),
            None
        );
        assert_eq!(
            unchecked_because(&headers(Some("Application/JSON"), Some(100)), max),
            None
        );
        assert_eq!(
            unchecked_because(&headers(json, Some(101)), max),
            Some("oversized")
        );
        assert_eq!(
            unchecked_because(&headers(json, None), max),
            Some("streamed")
        );
        assert_eq!(
            unchecked_because(&headers(Some("text/event-stream"), None), max),
            Some("streamed")
        );
        assert_eq!(
            unchecked_because(&headers(Some("text/plain"), Some(3)), max),
            Some("not_json")
        );
        assert_eq!(
            unchecked_because(&headers(None, Some(3)), max),
            Some("not_json")
        );
    }
}
