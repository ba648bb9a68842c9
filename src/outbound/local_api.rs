//! The agent's own API on the outbound port: `PUT /reach/v1/busy` reports a busy agent (the only
//! way a sidecar can see a workspace lock from outside).

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

use crate::error::ReachError;
use crate::http::{headers, server::text, ReachBody};
use crate::local::LocalAgent;

pub(super) const BUSY_PATH: &str = "/reach/v1/busy";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BusyReport {
    busy: bool,
    #[serde(default)]
    in_flight: Option<usize>,
}

/// A request for the local API rather than a capability call.
pub(super) fn is_local_api<B>(req: &Request<B>) -> bool {
    req.uri().path().starts_with("/reach/v1/") && !req.headers().contains_key(headers::CAPABILITY)
}

pub(super) async fn handle(local: &LocalAgent, req: Request<Incoming>) -> Response<ReachBody> {
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
            local.report_busy(report.busy, report.in_flight);
            text(StatusCode::NO_CONTENT, "text/plain", "")
        }
        Err(err) => ReachError::BadRequest(format!("bad busy report: {err}")).into_response(),
    }
}
