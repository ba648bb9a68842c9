//! MCP calls to a capability whose servers announce tools (`docs/mcp.md`): a `tools/call` goes
//! only to servers that have the tool and whose tool works in this caller's view
//! (`tool_call.rs`, `view.rs`); `tools/list` is answered with the fleet's tools; and a
//! client's session is the sidecar's own, brokered over a session per server (`broker.rs`).
//! Every call for a capability no MCP server announces passes straight on: the check is one
//! look at the registry's set of MCP capabilities, empty in a fleet without MCP.

mod bridge;
pub(super) mod broker;
mod fleet;
mod message;
pub(super) mod pins;
pub(super) mod sessions;
pub(super) mod status;
mod tool_call;
pub(super) mod view;

use std::sync::Arc;
use std::time::Instant;

use http::Response;
use tower::layer::Layer;
use tower::ServiceExt;

use super::call::{Call, McpRoute, Recorded, ServerSessions};
use super::Outbound;
use crate::error::ReachError;
use crate::http::step::{self, answer, Step};
use crate::http::upload::Upload;
use crate::http::ReachBody;
use crate::mcp::jsonrpc::{self, Asked, METHOD_HEADER, NAME_HEADER};
use crate::peers::Scored;
use broker::Context;
use http::Method;

pub(super) fn layer<S>(
    out: Arc<Outbound>,
) -> impl Layer<S, Service = impl Step<Call, Response = Response<ReachBody>>> + Clone
where
    S: Step<Call, Response = Recorded>,
{
    step::layer!(out, mcp::<step::Next<S>>)
}

/// An MCP capability's handshake, tool calls and tool list, on the client's session with the
/// sidecar; a session a server issued (not this sidecar) passes on as before.
async fn mcp<S>(out: Arc<Outbound>, inner: S, call: Call) -> Response<ReachBody>
where
    S: Step<Call, Response = Recorded>,
{
    if !out.registry.is_mcp(call.capability.as_str()) {
        return answer(inner.oneshot(call).await).response;
    }
    let context = match broker::context(&out, &call) {
        Ok(Some(context)) => context,
        Ok(None) => return answer(inner.oneshot(call).await).response,
        Err(()) => return broker::session_gone(asked_of(&call).and_then(|a| a.id)),
    };
    match (&call.parts.method, &context) {
        (&Method::DELETE, Context::Client(id, _)) => {
            let id = id.clone();
            return broker::end(&out, inner, &call, &id).await;
        }
        (&Method::GET, _) => return broker::no_stream(),
        _ => {}
    }
    let Some(asked) = asked_of(&call) else {
        return answer(inner.oneshot(call).await).response;
    };
    match asked.method.as_str() {
        "initialize" => broker::initialize(&out, asked.revision.as_deref(), asked.id),
        "ping" => broker::pong(asked.id),
        // A notification: nothing for the fleet to answer.
        _ if asked.id.is_none() => broker::accepted(),
        "tools/call" => match asked.tool {
            Some(tool) => {
                let asked = (tool, asked.resumes, asked.id);
                tool_call::routed(out, inner, call, asked, context).await
            }
            None => answer(inner.oneshot(call).await).response,
        },
        "tools/list" => fleet::tools_list(&out, inner, call, (asked.id, &context)).await,
        _ => tool_call::on_a_session(out, inner, call, (asked.method, asked.id), context).await,
    }
}

/// What the call asks: the stateless revision's `Mcp-Method` / `Mcp-Name` headers when present,
/// the buffered JSON-RPC body for the rest (its id, and what the headers do not say).
fn asked_of(call: &Call) -> Option<Asked> {
    let headers = &call.parts.headers;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let from_body = match &call.upload {
        Upload::Buffered(body) => jsonrpc::asked(body),
        Upload::Stream(..) => None,
    };
    match (header(METHOD_HEADER), from_body) {
        (Some(method), body) => {
            let body = body.unwrap_or_default();
            Some(Asked {
                tool: header(NAME_HEADER)
                    .or(body.tool)
                    .filter(|_| method == "tools/call"),
                method,
                ..body
            })
        }
        (None, body) => body,
    }
}

/// The candidates an MCP call may go to. For a tool call: those whose server has the tool,
/// minus the ones this call already tried; among them, those whose tool serves in this caller's
/// view (all of them when none does: a broken tool may have mended, and trying beats refusing).
pub(super) fn narrow(
    out: &Outbound,
    snapshot: &crate::config::Snapshot,
    (route, sessions): (&McpRoute, Option<&ServerSessions>),
    capability: &str,
    scored: Vec<Scored>,
) -> Result<Vec<Scored>, ReachError> {
    // On servers' sessions: only the servers the call has a session with.
    let scored: Vec<Scored> = match sessions {
        Some(sessions) => scored
            .into_iter()
            .filter(|s| sessions.0.contains_key(&s.peer.name))
            .collect(),
        None => scored,
    };
    let (tool, excluded) = match route {
        McpRoute::Server(name) => {
            return Ok(scored
                .into_iter()
                .filter(|s| &s.peer.name == name)
                .collect())
        }
        McpRoute::Any => return Ok(scored),
        McpRoute::Tool { tool, excluded } => (tool, excluded),
    };
    let having: Vec<Scored> = scored
        .into_iter()
        .filter(|s| s.peer.tool(capability, tool).is_some())
        .filter(|s| !excluded.contains(&s.peer.name))
        .collect();
    // Routed by definition: only to servers whose definition of the tool is the one listed
    // (`pins.rs`); another server's is held back.
    let chosen = out
        .pins
        .chosen(snapshot, capability, tool, having.iter().map(|s| &*s.peer));
    let having: Vec<Scored> = having
        .into_iter()
        .filter(|s| {
            let digest = s.peer.tool(capability, tool).map(|t| t.schema.as_str());
            chosen.is_some() && digest == chosen.as_deref()
        })
        .collect();
    if having.is_empty() {
        return Err(ReachError::UnknownTool {
            capability: capability.to_owned(),
            tool: tool.clone(),
        });
    }
    let now = Instant::now();
    let serving = |s: &Scored| out.tools.serving(&s.peer.name, tool, now);
    if having.iter().any(serving) {
        return Ok(having.into_iter().filter(|s| serving(s)).collect());
    }
    Ok(having)
}
