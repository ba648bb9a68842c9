//! A [`ReachError`] as the response the sidecar answers with: a JSON body with `error` and
//! `message`, the `reach-reason` header, and `retry-after` when the caller should wait; and the
//! [`Reason`] read back from a response.
//!
//! Inherent impls written here, beside the body and headers they use, so `error` does not import
//! `http`.

use http::{header, Response};

use super::{body, headers, ReachBody};
use crate::error::{AffinityKey, ReachError, Reason};

impl Reason {
    /// The reason on a response, when a sidecar made it.
    pub(crate) fn of<B>(response: &Response<B>) -> Option<Self> {
        let value = response.headers().get(headers::REASON)?;
        Reason::parse(value.to_str().ok()?)
    }
}

impl ReachError {
    /// The response the sidecar answers with for this error.
    pub(crate) fn into_response(self) -> Response<ReachBody> {
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
        if let ReachError::IntentUnresolved { candidates, .. }
        | ReachError::IntentAmbiguous { candidates, .. } = &self
        {
            // Which capabilities the intent could have meant, so the caller can name one.
            body["candidates"] = candidates.clone();
        }
        if let ReachError::AffinityLost {
            holder,
            key,
            rpc_id,
            ..
        } = &self
        {
            // The agent that holds the task or session, for the caller's logs.
            body["holder"] = holder.as_str().into();
            if let Some(rpc) = lost_in_protocol_terms(*key, holder, rpc_id.as_deref(), &body) {
                body = rpc;
            }
        }
        if let ReachError::LoopDetected { chain, hops, .. } = &self {
            // The chain that would have looped or grown too long, for the caller's logs.
            body["chain"] = chain.as_str().into();
            body["hops"] = (*hops).into();
        }
        if let ReachError::InvalidOutput { errors, .. } = &self {
            // Where the answer went wrong, one entry per error, for the caller's logs.
            body["errors"] = errors.clone().into();
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

/// A lost MCP session or A2A task as the protocol's client understands it: a JSON-RPC error
/// (MCP's "session not found", A2A's `TaskNotFoundError`, -32001 both; an MCP `requestState`
/// whose issuer is out, -32602) naming the holder in `data`, with the sidecar's own answer
/// there too.
fn lost_in_protocol_terms(
    key: AffinityKey,
    holder: &str,
    rpc_id: Option<&serde_json::Value>,
    ours: &serde_json::Value,
) -> Option<serde_json::Value> {
    // A state its issuer cannot take back is refused as a server refuses a state it cannot
    // verify (invalid params): the client starts the request over without it.
    let (code, message) = match key {
        AffinityKey::McpSession => (-32001, "Session not found"),
        AffinityKey::Task | AffinityKey::Context => (-32001, "Task not found"),
        AffinityKey::RequestState => (-32602, "requestState not accepted"),
        AffinityKey::Header => return None,
    };
    Some(serde_json::json!({
        "jsonrpc": "2.0",
        "id": rpc_id.cloned().unwrap_or(serde_json::Value::Null),
        "error": {
            "code": code,
            "message": format!("{message}: agent `{holder}`, which held it, is out"),
            "data": { "reason": "affinity_lost", "holder": holder, "sidecar": ours },
        },
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;

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
