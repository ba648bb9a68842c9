//! `prefer: respond-async` makes a call a task: stored (durably) and answered `202 Accepted`
//! with where to find it, instead of routed now. `docs/tasks.md`.

use std::sync::Arc;

use http::{Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use tower::layer::Layer;
use tower::ServiceExt;

use super::call::Call;
use super::{record, Outbound};
use crate::error::ReachError;
use crate::http::headers::Present;
use crate::http::step::{self, answer, Step};
use crate::http::upload::Upload;
use crate::http::{body, ReachBody};
use crate::tasks::{self, Queue};

pub(super) fn layer<S>(
    out: Arc<Outbound>,
) -> impl Layer<S, Service = impl Step<Call, Response = Response<ReachBody>>> + Clone
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    step::layer!(out, maybe_submit::<step::Next<S>>)
}

/// A call that asks for async stored as a task; any other straight on.
async fn maybe_submit<S>(out: Arc<Outbound>, inner: S, call: Call) -> Response<ReachBody>
where
    S: Step<Call, Response = Response<ReachBody>>,
{
    if !(call.present.has(Present::PREFER) && tasks::wants_async(&call.parts.headers)) {
        return answer(inner.oneshot(call).await);
    }
    let started = call.started;
    let label = call.capability.to_string();
    match submit(out.tasks.as_deref(), call).await {
        Ok(response) => response,
        Err(err) => record::refuse(&out.metrics, &label, "-", err, started),
    }
}

async fn submit(queue: Option<&Queue>, call: Call) -> Result<Response<ReachBody>, ReachError> {
    let queue = queue.ok_or(ReachError::TasksDisabled)?;
    let limit = queue.max_payload();
    let bytes = match call.upload {
        Upload::Buffered(bytes) if bytes.len() <= limit => bytes,
        Upload::Buffered(_) => return Err(ReachError::PayloadTooLarge { limit }),
        Upload::Stream(_, Some(len)) if len > limit as u64 => {
            return Err(ReachError::PayloadTooLarge { limit })
        }
        // Larger than the retry buffer but within what a task may carry: read the rest.
        Upload::Stream(incoming, _) => {
            let gap = call.snapshot.bootstrap.limits.body_read_timeout.get();
            let read = tokio::time::timeout(gap * 8, Limited::new(incoming, limit).collect());
            match read.await {
                Ok(Ok(collected)) => collected.to_bytes(),
                Ok(Err(err)) if err.is::<http_body_util::LengthLimitError>() => {
                    return Err(ReachError::PayloadTooLarge { limit })
                }
                Ok(Err(_)) => return Err(ReachError::ClientBody),
                Err(_) => return Err(ReachError::BodyTimeout),
            }
        }
    };
    let submitted = queue
        .submit(call.capability.as_str(), &call.parts, bytes)
        .await?;
    let task = &submitted.task;
    let location = format!("{}/{}", tasks::TASKS_PATH, task.id);
    let json = serde_json::json!({
        "id": task.id,
        "state": task.state.as_str(),
        "location": location,
        "existing": submitted.existing,
    });
    let mut response = Response::new(body::full(json.to_string()));
    *response.status_mut() = StatusCode::ACCEPTED;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Ok(value) = http::HeaderValue::from_str(&location) {
        headers.insert(http::header::LOCATION, value);
    }
    // RFC 7240: the preference was honoured.
    headers.insert(
        http::HeaderName::from_static("preference-applied"),
        http::HeaderValue::from_static("respond-async"),
    );
    Ok(response)
}
