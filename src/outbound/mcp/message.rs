//! The messages the MCP steps make: a call copied for another server, and a JSON answer.

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use serde_json::Value;

use crate::http::upload::Upload;
use crate::http::{body, ReachBody};
use crate::outbound::call::Call;

/// The call again, with `bytes` for its buffered body, for another server.
pub(super) fn copy(call: &Call, bytes: Bytes) -> Call {
    Call {
        capability: call.capability.clone(),
        parts: call.parts.clone(),
        upload: Upload::Buffered(bytes),
        deadline: call.deadline,
        snapshot: call.snapshot.clone(),
        started: call.started,
        present: call.present,
        carried: call.carried.clone(),
    }
}

/// A JSON answer the sidecar makes itself.
pub(super) fn json_answer(value: &Value) -> Response<ReachBody> {
    let mut response = Response::new(body::full(value.to_string()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
