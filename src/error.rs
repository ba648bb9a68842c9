//! Errors the sidecar itself answers with, and the one place they become HTTP responses.

use std::time::Duration;

use http::{header, Response, StatusCode};

use crate::config::format_duration;
use crate::http::{body, headers, ReachBody};

/// Why the sidecar answered a request itself instead of passing on an agent's response.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    #[error("the request names no capability: set the `reach-capability` header or call http://<capability>.reach/")]
    MissingCapability,
    #[error(
        "`{host}` is not a capability authority: this listener routes only to `<capability>.reach`"
    )]
    ForeignHost { host: String },
    #[error("no agent known to this sidecar serves capability `{capability}`")]
    UnknownCapability { capability: String },
    #[error("no peer can take capability `{capability}` right now")]
    NoAvailableInstance {
        capability: String,
        candidates: serde_json::Value,
        attempts: usize,
    },
    #[error("agent `{agent}` is out of rotation (ejected) and takes no new work")]
    Ejected { agent: String },
    #[error("agent `{agent}` is at its concurrency limit and its queue is full")]
    Saturated {
        agent: String,
        retry_after: Duration,
    },
    #[error("this sidecar is shutting down and takes no new work")]
    Draining,
    #[error("cannot connect to {target}: {message}")]
    UpstreamConnect {
        target: String,
        message: String,
        /// The connection was refused (nothing listens there), not timed out.
        refused: bool,
    },
    #[error("{target} failed: {message}")]
    Upstream { target: String, message: String },
    #[error("{target} did not answer within {}", format_duration(*after))]
    Timeout { target: String, after: Duration },
    #[error("the request's deadline passed before an answer came")]
    DeadlineExceeded,
    #[error("a request with this idempotency-key already ran and its response cannot be replayed")]
    IdempotencyConflict,
    #[error("target `{target}` is over its rate limit")]
    RateLimited {
        target: String,
        retry_after: Duration,
    },
    #[error("this idempotency-key was used with a different request (method, path or body); use a new key for a new request")]
    IdempotencyMismatch,
    #[error("too many keyed requests from this caller are still running; retry later")]
    IdempotencyBusy,
    #[error("the request body broke off before it was complete")]
    ClientBody,
    #[error("the request body stopped arriving")]
    BodyTimeout,
    #[error("capability `{capability}` is not served at `{path}`")]
    UnknownPath { capability: String, path: String },
    #[error("{0}")]
    BadRequest(String),
    #[error("no such endpoint: {0}")]
    NotFound(String),
}

impl ReachError {
    pub fn status(&self) -> StatusCode {
        match self {
            ReachError::MissingCapability | ReachError::BadRequest(_) | ReachError::ClientBody => {
                StatusCode::BAD_REQUEST
            }
            ReachError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ReachError::IdempotencyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            ReachError::ForeignHost { .. } => StatusCode::FORBIDDEN,
            ReachError::IdempotencyConflict => StatusCode::CONFLICT,
            ReachError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ReachError::UnknownCapability { .. }
            | ReachError::UnknownPath { .. }
            | ReachError::NotFound(_) => StatusCode::NOT_FOUND,
            ReachError::NoAvailableInstance { .. }
            | ReachError::Saturated { .. }
            | ReachError::Ejected { .. }
            | ReachError::IdempotencyBusy
            | ReachError::Draining => StatusCode::SERVICE_UNAVAILABLE,
            ReachError::UpstreamConnect { .. } | ReachError::Upstream { .. } => {
                StatusCode::BAD_GATEWAY
            }
            ReachError::Timeout { .. } | ReachError::DeadlineExceeded => {
                StatusCode::GATEWAY_TIMEOUT
            }
        }
    }

    /// The machine-readable code: the JSON `error` field and the `reach-reason` header.
    pub fn code(&self) -> &'static str {
        match self {
            ReachError::MissingCapability => "missing_capability",
            ReachError::ForeignHost { .. } => "forbidden_host",
            ReachError::UnknownCapability { .. } => "unknown_capability",
            ReachError::NoAvailableInstance { .. } => "no_available_instance",
            ReachError::Saturated { .. } => "saturated",
            ReachError::Ejected { .. } => "ejected",
            ReachError::Draining => "draining",
            ReachError::UpstreamConnect { .. } => "upstream_connect_failed",
            ReachError::Upstream { .. } => "upstream_failed",
            ReachError::Timeout { .. } => "timeout",
            ReachError::DeadlineExceeded => "deadline_exceeded",
            ReachError::IdempotencyConflict => "idempotency_conflict",
            ReachError::RateLimited { .. } => "rate_limited",
            ReachError::IdempotencyMismatch => "idempotency_mismatch",
            ReachError::IdempotencyBusy => "idempotency_busy",
            ReachError::ClientBody => "client_body_error",
            ReachError::BodyTimeout => "body_timeout",
            ReachError::UnknownPath { .. } => "unknown_path",
            ReachError::BadRequest(_) => "bad_request",
            ReachError::NotFound(_) => "not_found",
        }
    }

    /// The `outcome` label this error gives a request in metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            ReachError::Timeout { .. } | ReachError::DeadlineExceeded => "timeout",
            ReachError::UpstreamConnect { .. } | ReachError::Upstream { .. } => "failure",
            _ => "rejected",
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            ReachError::Saturated { retry_after, .. }
            | ReachError::RateLimited { retry_after, .. } => Some(*retry_after),
            ReachError::Draining
            | ReachError::IdempotencyBusy
            | ReachError::Ejected { .. }
            | ReachError::NoAvailableInstance { .. } => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    pub fn into_response(self) -> Response<ReachBody> {
        let mut body = serde_json::json!({ "error": self.code(), "message": self.to_string() });
        if let ReachError::NoAvailableInstance {
            candidates,
            attempts,
            ..
        } = &self
        {
            // The snapshot says why each peer was passed over: the caller never has to guess.
            body["candidates"] = candidates.clone();
            body["attempts"] = (*attempts).into();
        }
        let mut response = Response::new(body::full(body.to_string()));
        *response.status_mut() = self.status();
        let h = response.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        h.insert(
            headers::REASON,
            header::HeaderValue::from_static(self.code()),
        );
        if let Some(after) = self.retry_after() {
            // Whole seconds, at least 1: RFC 9110's delay-seconds.
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            h.insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturated_is_503_with_reason_and_retry_after() {
        let r = ReachError::Saturated {
            agent: "a".into(),
            retry_after: Duration::from_millis(200),
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[headers::REASON], "saturated");
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
