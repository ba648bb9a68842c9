//! The task API on the outbound port (loopback: the agent and its operators):
//!
//! | request | answer |
//! |---|---|
//! | `GET /reach/v1/tasks?state=escalated&limit=50` | the tasks, newest first |
//! | `GET /reach/v1/tasks/<id>` | the task: state, every attempt, the response when done |
//! | `POST /reach/v1/tasks/<id>/retry` | an escalated, failed or resolved task runs again |
//! | `POST /reach/v1/tasks/<id>/resolve` | a person closes it; body `{"note": "...", "by": "..."}` (optional) |

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use serde::Deserialize;

use super::model::State;
use super::queue::{Queue, TASKS_PATH};
use super::view;
use crate::config::ConfigStore;
use crate::error::ReachError;
use crate::http::{server::text, ReachBody};

/// The most tasks one list returns.
const MAX_LIST: usize = 1000;

/// Whether `path` is the task API's.
pub(crate) fn is_tasks_path(path: &str) -> bool {
    path == TASKS_PATH || path.starts_with(&format!("{TASKS_PATH}/"))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    by: Option<String>,
}

/// Answers one task API request; `body` is already read (bounded by the local API's limit).
pub(crate) async fn handle(
    queue: Option<&Queue>,
    store: &ConfigStore,
    req: Request<Bytes>,
) -> Response<ReachBody> {
    match route(queue, store, req).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

async fn route(
    queue: Option<&Queue>,
    store: &ConfigStore,
    req: Request<Bytes>,
) -> Result<Response<ReachBody>, ReachError> {
    let queue = queue.ok_or(ReachError::TasksDisabled)?;
    let extra = store.snapshot().policy.redact_headers.clone();
    let path = req.uri().path().to_owned();
    let rest = path
        .strip_prefix(TASKS_PATH)
        .unwrap_or_default()
        .trim_start_matches('/');
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, []) => {
            let (state, limit) = list_query(req.uri().query())?;
            let tasks = queue.list(state, limit).await?;
            let views: Vec<_> = tasks.iter().map(|t| view::api(t, &extra)).collect();
            Ok(json(StatusCode::OK, &serde_json::json!({ "tasks": views })))
        }
        (&Method::GET, [id]) => {
            let task = queue.get(id).await?;
            Ok(json(StatusCode::OK, &view::api(&task, &extra)))
        }
        (&Method::POST, [id, "retry"]) => {
            let task = queue.retry(id).await?;
            Ok(json(StatusCode::OK, &view::api(&task, &extra)))
        }
        (&Method::POST, [id, "resolve"]) => {
            let body = req.body();
            let resolve: ResolveBody = if body.iter().all(u8::is_ascii_whitespace) {
                ResolveBody::default()
            } else {
                serde_json::from_slice(body)
                    .map_err(|e| ReachError::BadRequest(format!("bad resolve body: {e}")))?
            };
            let task = queue.resolve(id, resolve.note, resolve.by).await?;
            Ok(json(StatusCode::OK, &view::api(&task, &extra)))
        }
        (_, [] | [_] | [_, "retry" | "resolve"]) => Err(ReachError::BadRequest(format!(
            "{path} takes {}",
            if segments.len() == 2 { "POST" } else { "GET" }
        ))),
        _ => Err(ReachError::NotFound(path)),
    }
}

fn list_query(query: Option<&str>) -> Result<(Option<State>, usize), ReachError> {
    let mut state = None;
    let mut limit = 100;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some(("state", value)) => {
                state = Some(State::parse(value).ok_or_else(|| {
                    let known: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
                    ReachError::BadRequest(format!(
                        "unknown state `{value}`; one of {}",
                        known.join(", ")
                    ))
                })?);
            }
            Some(("limit", value)) => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIST).contains(n))
                    .ok_or_else(|| ReachError::BadRequest(format!("limit is 1 to {MAX_LIST}")))?;
            }
            _ => {
                return Err(ReachError::BadRequest(format!(
                    "unknown query `{pair}`: state, limit"
                )))
            }
        }
    }
    Ok((state, limit))
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<ReachBody> {
    let text_body = serde_json::to_string_pretty(value).unwrap_or_default();
    text(status, "application/json", text_body)
}
