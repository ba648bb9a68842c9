//! One `tools/call`: routed to a server that has the tool (the candidates step narrows with
//! [`super::narrow`]), its answer read for how the tool did — a JSON-RPC error, a result with
//! `isError: true`, a `5xx` or a timeout — and told to this caller's view of that server's tool. A tool its servers
//! mark `readOnlyHint` or `idempotentHint` is tried once more on another server that has it.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, Response};
use tower::ServiceExt;

use super::broker::{self, Context};
use super::message::copy;
use super::Outbound;
use crate::error::{ReachError, Reason};
use crate::http::observed::{BodyEnd, Observed, Observer, OnEnd};
use crate::http::step::{answer, Step};
use crate::http::upload::Upload;
use crate::http::{body, headers, ReachBody};
use crate::mcp::fetch::MAX_ANSWER_BYTES;
use crate::mcp::jsonrpc::{self, ToolOutcome};
use crate::outbound::call::{Call, McpRoute, Recorded, ServerSessions};

/// Routes the call for `tool` on a server's session (`broker.rs`); on a failed tool that is
/// safe to repeat, once more elsewhere — unless it `resumes` a multi round-trip request, whose
/// state is its issuer's alone (the affinity step pins it there,
/// `src/outbound/affinity/mod.rs`).
pub(super) async fn routed<S>(
    out: Arc<Outbound>,
    inner: S,
    call: Call,
    (tool, resumes, id): (String, bool, Option<serde_json::Value>),
    context: Context,
) -> Response<ReachBody>
where
    S: Step<Call, Response = Recorded>,
{
    let replay = match &call.upload {
        Upload::Buffered(bytes) if !resumes => Some(bytes.clone()),
        _ => None,
    };
    let template = copy(&call, Bytes::new());
    let mut excluded = Vec::new();
    let capability = call.capability.as_str().to_owned();
    let revision = context.revision(&call);
    let mut call = call;
    let mut on;
    loop {
        let route = McpRoute::Tool {
            tool: tool.clone(),
            excluded: excluded.clone(),
        };
        match broker::sessions_for(&out, inner.clone(), &call, &context, &route).await {
            Ok(sessions) => {
                on = sessions.clone();
                broker::for_servers(&mut call, sessions, ("tools/call", Some(&tool)));
            }
            Err(refused) => {
                let response = refused.answer(&capability, id.clone());
                broker::after(&out, inner, &template, &context, response.status()).await;
                return unknown_tool_as_mcp(response, &tool, id);
            }
        }
        call.carried_mut().mcp_route = Some(route);
        let again = replay.as_ref().map(|bytes| copy(&call, bytes.clone()));
        let recorded = answer(inner.clone().oneshot(call).await);
        let (response, failed_on) = observed(&out, &capability, &tool, recorded).await;
        match (failed_on, again) {
            (Some(peer), Some(next))
                if excluded.is_empty() && elsewhere(&out, &next, &tool, &peer) =>
            {
                excluded.push(peer);
                call = next;
            }
            _ => {
                broker::after(&out, inner, &template, &context, response.status()).await;
                let mut response = unknown_tool_as_mcp(response, &tool, id);
                broker::as_the_clients(&context, &mut response);
                return bridged(response, &on, &revision, false).await;
            }
        }
    }
}

/// A method that names no tool (`resources/list`, `prompts/get`, …): on the session of a
/// server the client's session already holds, or a new one on the server routing picks.
pub(super) async fn on_a_session<S>(
    out: Arc<Outbound>,
    inner: S,
    mut call: Call,
    (method, id): (String, Option<serde_json::Value>),
    context: Context,
) -> Response<ReachBody>
where
    S: Step<Call, Response = Recorded>,
{
    let template = copy(&call, Bytes::new());
    let capability = call.capability.as_str().to_owned();
    let revision = context.revision(&call);
    // A list's answer carries cache hints in the stateless revision.
    let list = method.ends_with("/list");
    let on = match broker::sessions_for(&out, inner.clone(), &call, &context, &McpRoute::Any).await
    {
        Ok(sessions) => sessions,
        Err(refused) => return refused.answer(&capability, id),
    };
    broker::for_servers(&mut call, on.clone(), (&method, None));
    call.carried_mut().mcp_route = Some(McpRoute::Any);
    let mut response = answer(inner.clone().oneshot(call).await).response;
    broker::after(&out, inner, &template, &context, response.status()).await;
    broker::as_the_clients(&context, &mut response);
    bridged(response, &on, &revision, list).await
}

/// The answer as a client of `revision` reads it: an older server's completed (`bridge.rs`).
async fn bridged(
    response: Response<ReachBody>,
    on: &ServerSessions,
    revision: &str,
    list: bool,
) -> Response<ReachBody> {
    let needed = on
        .revision_of(&response)
        .is_some_and(|server| super::bridge::needed(revision, server));
    if needed {
        return super::bridge::answer(response, list).await;
    }
    response
}

/// A tool no server has, answered as MCP says (a JSON-RPC error, `-32602`, inside a `200`), not
/// as a bare `404`: an MCP client reads a `404` on its session as "your session is gone".
fn unknown_tool_as_mcp(
    response: Response<ReachBody>,
    tool: &str,
    id: Option<serde_json::Value>,
) -> Response<ReachBody> {
    let unknown = response.status() == http::StatusCode::NOT_FOUND
        && response
            .headers()
            .get(crate::http::headers::REASON)
            .is_some_and(|r| r == "unknown_capability");
    if !unknown {
        return response;
    }
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": -32602, "message": format!("Unknown tool: {tool}: no server of the fleet has it") },
    });
    let mut answer = Response::new(crate::http::body::full(body.to_string()));
    answer.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if let Some(reason) = response.headers().get(crate::http::headers::REASON) {
        answer
            .headers_mut()
            .insert(crate::http::headers::REASON, reason.clone());
    }
    answer
}

/// Whether the tool is safe to repeat and a server other than `failed` has it.
fn elsewhere(out: &Outbound, call: &Call, tool: &str, failed: &str) -> bool {
    let capability = call.capability.as_str();
    let peers = out.registry.candidates(&call.snapshot, capability);
    let safe = peers
        .iter()
        .filter_map(|p| p.tool(capability, tool))
        .any(crate::config::ToolFacts::retry_safe);
    safe && peers
        .iter()
        .any(|p| p.name != failed && p.tool(capability, tool).is_some())
}

/// Tells the view of `peer`'s `tool`, and `reach_mcp_tool_calls_total`, how a call went:
/// `ok`, `error` or `timeout`.
fn record(out: &Outbound, capability: &str, peer: &str, tool: &str, outcome: &'static str) {
    out.tools
        .record(peer, tool, outcome == "ok", Instant::now());
    out.metrics.mcp_tool_call(capability, tool, outcome);
}

/// The answer, read (when it is one JSON document) for how the tool did, which the view of the
/// server's tool is told; with the server's name when the tool failed there. An event stream
/// is read as it passes, unbuffered (`StreamWatch`): its answer event tells the view, too late
/// to try another server; an answer the sidecar made itself passes on.
async fn observed(
    out: &Arc<Outbound>,
    capability: &str,
    tool: &str,
    recorded: Recorded,
) -> (Response<ReachBody>, Option<String>) {
    let Some(peer) = answered_by(&recorded) else {
        return (recorded.response, None);
    };
    let response = recorded.response;
    if response.status().is_server_error() {
        let timeout = Reason::of(&response) == Some(Reason::Timeout);
        let outcome = if timeout { "timeout" } else { "error" };
        record(out, capability, &peer, tool, outcome);
        return (response, Some(peer));
    }
    let content_type = jsonrpc::content_type(response.headers());
    // Only a JSON answer of known, bounded length is read: a longer one passes on as before.
    let length = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let readable = length.is_some_and(|n| n <= MAX_ANSWER_BYTES);
    if content_type.starts_with("text/event-stream") && response.status().is_success() {
        let watch = StreamWatch {
            out: out.clone(),
            capability: capability.to_owned(),
            peer,
            tool: tool.to_owned(),
            pending: String::new(),
        };
        let response = response.map(|b| body::boxed(Observed::new(b, watch)));
        return (response, None);
    }
    if !content_type.starts_with("application/json") || !response.status().is_success() || !readable
    {
        return (response, None);
    }
    let (parts, incoming) = response.into_parts();
    let bytes = match body::read_limited(incoming, MAX_ANSWER_BYTES).await {
        Ok(bytes) => bytes,
        Err(message) => {
            let err = ReachError::Upstream {
                target: format!("the MCP server {peer}"),
                message,
            };
            return (err.into_response(), None);
        }
    };
    let outcome = jsonrpc::answer(&content_type, &bytes).map(|a| jsonrpc::tool_outcome(&a));
    let ok = outcome.and_then(went_well);
    if let Some(ok) = ok {
        record(
            out,
            capability,
            &peer,
            tool,
            if ok { "ok" } else { "error" },
        );
    }
    let response = Response::from_parts(parts, body::full(bytes));
    (response, (ok == Some(false)).then_some(peer))
}

/// Whether the tool did its work; `None` for the caller's own fault, which says nothing of it.
fn went_well(outcome: ToolOutcome) -> Option<bool> {
    match outcome {
        ToolOutcome::Ok => Some(true),
        ToolOutcome::ToolError | ToolOutcome::ServerError => Some(false),
        ToolOutcome::CallerError => None,
    }
}

/// Reads an event-stream answer as it passes for its JSON-RPC answer (progress events go by),
/// and tells the view of the server's tool how it went; a stream that breaks before its
/// answer counts as the tool's error. Bounded: past [`MAX_ANSWER_BYTES`] of one event it stops
/// looking.
struct StreamWatch {
    out: Arc<Outbound>,
    capability: String,
    peer: String,
    tool: String,
    pending: String,
}

impl StreamWatch {
    fn record(&self, outcome: &'static str) {
        record(&self.out, &self.capability, &self.peer, &self.tool, outcome);
    }
}

impl OnEnd for StreamWatch {
    fn end(self, end: BodyEnd) {
        if end == BodyEnd::Error {
            self.record("error");
        }
    }
}

impl Observer<Bytes> for StreamWatch {
    fn frame(&mut self, frame: &http_body::Frame<Bytes>) -> ControlFlow<()> {
        let Some(data) = frame.data_ref() else {
            return ControlFlow::Continue(());
        };
        self.pending.push_str(&String::from_utf8_lossy(data));
        if self.pending.contains('\r') {
            self.pending = self.pending.replace("\r\n", "\n");
        }
        while let Some(end) = self.pending.find("\n\n") {
            let event: String = self.pending.drain(..end + 2).collect();
            let answer = jsonrpc::event_data(&event)
                .and_then(|data| serde_json::from_str::<serde_json::Value>(&data).ok())
                .filter(|v| v.get("result").is_some() || v.get("error").is_some());
            if let Some(answer) = answer {
                if let Some(ok) = went_well(jsonrpc::tool_outcome(&answer)) {
                    self.record(if ok { "ok" } else { "error" });
                }
                return ControlFlow::Break(());
            }
        }
        if self.pending.len() > MAX_ANSWER_BYTES {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }
}

/// The server whose tool the answer tells of: the agent that answered, or the one whose
/// attempt timed out.
fn answered_by(recorded: &Recorded) -> Option<String> {
    let response = &recorded.response;
    if let Some(agent) = response.headers().get(headers::AGENT) {
        return agent.to_str().ok().map(str::to_owned);
    }
    let timed_out = Reason::of(response) == Some(Reason::Timeout);
    let tried = recorded.last_tried.as_ref()?;
    timed_out.then(|| tried.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(reason: Reason, tried: Option<&str>) -> Recorded {
        let mut response = Response::new(body::empty());
        response
            .headers_mut()
            .insert(headers::REASON, headers::value(reason.as_str()));
        Recorded {
            response,
            last_tried: tried.map(str::to_owned),
        }
    }

    #[test]
    fn a_timeout_is_the_tool_of_the_server_last_tried() {
        let timed_out = refused(Reason::Timeout, Some("a"));
        assert_eq!(answered_by(&timed_out).as_deref(), Some("a"));
        // Any other refusal says nothing of a server's tool.
        assert_eq!(answered_by(&refused(Reason::Saturated, Some("a"))), None);
        assert_eq!(answered_by(&refused(Reason::Timeout, None)), None);
        let mut answered = refused(Reason::Timeout, None);
        answered.response.headers_mut().remove(headers::REASON);
        answered
            .response
            .headers_mut()
            .insert(headers::AGENT, headers::value("b"));
        assert_eq!(answered_by(&answered).as_deref(), Some("b"));
    }
}
