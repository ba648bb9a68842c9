//! The agent's own API on the outbound port: `PUT /reach/v1/busy` reports a busy agent (the only
//! way a sidecar can see a workspace lock from outside), and `/reach/v1/tasks` reads and acts on
//! its async tasks (`tasks::api`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use tower::service_fn;

use crate::config::ConfigStore;
use crate::error::ReachError;
use crate::http::step::Step;
use crate::http::{headers, layers, server::text, ReachBody};
use crate::local::LocalAgent;
use crate::tasks::Queue;

pub(super) const BUSY_PATH: &str = "/reach/v1/busy";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BusyReport {
    busy: bool,
    #[serde(default)]
    in_flight: Option<usize>,
}

/// The local API never streams: bounded in time and body like the admin.
const TIMEOUT: Duration = Duration::from_secs(10);
const BODY_LIMIT: usize = 4096;

/// The local API's service, bounded by `layers::guarded`; `lanes` sends it what
/// [`is_local_api`] says is for it.
pub(super) fn service(
    local: Arc<LocalAgent>,
    store: Arc<ConfigStore>,
    tasks: Option<Arc<Queue>>,
) -> impl Step<Request<Incoming>, Response = Response<ReachBody>> {
    layers::guarded(
        TIMEOUT,
        BODY_LIMIT,
        service_fn(move |req| {
            let (local, store, tasks) = (local.clone(), store.clone(), tasks.clone());
            async move { Ok::<_, Infallible>(handle(&local, &store, tasks.as_deref(), req).await) }
        }),
    )
}

/// A request for the local API rather than a capability call.
pub(super) fn is_local_api<B>(req: &Request<B>) -> bool {
    req.uri().path().starts_with("/reach/v1/") && !req.headers().contains_key(headers::CAPABILITY)
}

async fn handle<B>(
    local: &LocalAgent,
    store: &ConfigStore,
    tasks: Option<&Queue>,
    req: Request<B>,
) -> Response<ReachBody>
where
    B: http_body::Body,
    B::Error: Into<crate::http::BoxError>,
{
    if crate::tasks::api::is_tasks_path(req.uri().path()) {
        let (parts, body) = req.into_parts();
        let bytes = match Limited::new(body, BODY_LIMIT).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return ReachError::BadRequest(format!(
                    "the request body is unreadable or over {BODY_LIMIT} bytes"
                ))
                .into_response()
            }
        };
        return crate::tasks::api::handle(tasks, store, Request::from_parts(parts, bytes)).await;
    }
    if req.uri().path() != BUSY_PATH {
        return ReachError::NotFound(req.uri().path().to_owned()).into_response();
    }
    if req.method() != Method::PUT && req.method() != Method::POST {
        return ReachError::BadRequest(format!(r#"{BUSY_PATH} takes PUT with {{"busy": bool}}"#))
            .into_response();
    }
    let bytes = match Limited::new(req.into_body(), 4096).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return ReachError::BadRequest("the busy report is unreadable or over 4 KiB".to_owned())
                .into_response()
        }
    };
    match serde_json::from_slice::<BusyReport>(&bytes) {
        Ok(report) => {
            local.report_busy(report.busy, report.in_flight, &store.snapshot());
            text(StatusCode::NO_CONTENT, "text/plain", "")
        }
        Err(err) => ReachError::BadRequest(format!("bad busy report: {err}")).into_response(),
    }
}
