//! MCP sessions brokered by the caller's sidecar (`docs/mcp.md`, "Sessions"). A client's
//! session is with its sidecar: the sidecar answers `initialize` itself, in the revision the
//! client offers when it speaks it, and hands a session id of its own (`reach-…`) to the
//! revisions that have sessions. Behind it, the sidecar opens a session on each server when a
//! call first needs that server (`initialize`, then `notifications/initialized`) and ends them
//! all (`DELETE`) when the client's ends. So the federated `tools/list` covers servers with
//! sessions and without, and a client's calls reach any server of the fleet on that server's
//! own session.
//!
//! Within a client's session a tool goes to the server that already holds a session for it
//! (its state is there); when that server is gone, the client's session is answered as MCP
//! says a lost one is (`404`, `affinity_lost`) and ended, and the client starts another.
//! Clients without a session (the stateless revision) share the sidecar's own sessions.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::message::{self, json_answer};
use super::sessions::{Brokered, SESSION_PREFIX};
use super::Outbound;
use crate::error::{AffinityKey, ReachError};
use crate::fast_hash::FastMap;
use crate::http::headers::{self, Present};
use crate::http::step::{answer, Step};
use crate::http::{body, ReachBody};
use crate::mcp::fetch::MAX_ANSWER_BYTES;
use crate::mcp::jsonrpc::{self, METHOD_HEADER, NAME_HEADER, STATELESS_REVISION, VERSION_HEADER};
use crate::outbound::call::{Call, McpRoute, Recorded, ServerSession, ServerSessions};

/// The revisions this sidecar speaks with MCP clients.
const REVISIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    STATELESS_REVISION,
];
/// Answered to a client that offers a revision the sidecar does not speak: the newest with
/// sessions, which every SDK of the last year speaks.
const FALLBACK_REVISION: &str = "2025-11-25";

/// The revision a client gets: its offer when the sidecar speaks it (as the spec says).
pub(super) fn negotiate(offered: Option<&str>) -> &'static str {
    offered
        .and_then(|o| REVISIONS.iter().find(|r| **r == o))
        .copied()
        .unwrap_or(FALLBACK_REVISION)
}

/// Whose sessions a call uses.
pub(super) enum Context {
    /// A client session of this sidecar's: its id, and the session.
    Client(String, Arc<Brokered>),
    /// No session (the stateless revision): the sidecar's shared sessions.
    Shared(Arc<Brokered>),
}

impl Context {
    /// The revision the client speaks with this sidecar: its session's, else the one its
    /// request names (the stateless revision when it names none).
    pub(super) fn revision(&self, call: &Call) -> String {
        match self {
            Context::Client(_, b) => b.revision.to_owned(),
            Context::Shared(_) => call
                .parts
                .headers
                .get(VERSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or(STATELESS_REVISION)
                .to_owned(),
        }
    }

    fn brokered(&self) -> &Arc<Brokered> {
        match self {
            Context::Client(_, b) | Context::Shared(b) => b,
        }
    }
}

/// The call's context: `Ok(None)` for a session this sidecar did not issue (it passes on);
/// `Err` with MCP's answer for one it issued and no longer holds.
pub(super) fn context(out: &Outbound, call: &Call) -> Result<Option<Context>, ()> {
    let session = call
        .parts
        .headers
        .get(headers::MCP_SESSION_ID)
        .and_then(|v| v.to_str().ok());
    match session {
        None => Ok(Some(Context::Shared(
            out.broker.shared(call.capability.as_str()),
        ))),
        Some(id) if id.starts_with(SESSION_PREFIX) => match out.broker.get(id) {
            Some(b) => Ok(Some(Context::Client(id.to_owned(), b))),
            None => Err(()),
        },
        Some(_) => Ok(None),
    }
}

/// `initialize`, answered by the sidecar for the fleet: the client's revision when it is one
/// the sidecar speaks, and a session of the sidecar's for the revisions that have sessions.
pub(super) fn initialize(
    out: &Outbound,
    offered: Option<&str>,
    id: Option<Value>,
) -> Response<ReachBody> {
    let revision = negotiate(offered);
    let stateless = revision == STATELESS_REVISION;
    let mut response = json_answer(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "result": {
            "protocolVersion": revision,
            // The fleet's list changes as servers come and go; the stateless revision learns
            // of it by asking, and a session's client by the notification it may listen for.
            "capabilities": { "tools": { "listChanged": stateless } },
            "serverInfo": { "name": "agent-reach", "version": env!("CARGO_PKG_VERSION") }
        }
    }));
    if !stateless {
        let session = out.broker.open(revision);
        if let Ok(value) = HeaderValue::from_str(&session) {
            response
                .headers_mut()
                .insert(headers::MCP_SESSION_ID, value);
        }
    }
    response
}

/// A session this sidecar issued and no longer holds: `404`, as MCP says, so the client
/// starts a new one.
pub(super) fn session_gone(id: Option<Value>) -> Response<ReachBody> {
    let mut response = json_answer(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": -32001, "message": "Session not found: start a new one" },
    }));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// A notification, or a client's response to a server: nothing for the fleet to answer.
pub(super) fn accepted() -> Response<ReachBody> {
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

/// `ping`, answered by the sidecar.
pub(super) fn pong(id: Option<Value>) -> Response<ReachBody> {
    json_answer(&json!({ "jsonrpc": "2.0", "id": id, "result": {} }))
}

/// The client's `GET` for server messages: the sidecar sends none on its own (`405`, which
/// the spec lets a server answer; clients then ask again for the list when they want it).
pub(super) fn no_stream() -> Response<ReachBody> {
    let mut response = Response::new(body::empty());
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
    response
}

/// Ends the client's session: each server's session behind it is ended with a `DELETE`.
pub(super) async fn end<S>(out: &Outbound, inner: S, call: &Call, id: &str) -> Response<ReachBody>
where
    S: Step<Call, Response = Recorded>,
{
    let Some(brokered) = out.broker.remove(id) else {
        return session_gone(None);
    };
    end_servers(inner, call, &brokered).await;
    Response::new(body::empty())
}

async fn end_servers<S>(inner: S, call: &Call, brokered: &Brokered)
where
    S: Step<Call, Response = Recorded>,
{
    let servers: Vec<(String, ServerSession)> = brokered.servers().drain().collect();
    for (peer, server) in servers {
        let Some(session) = server.id.clone() else {
            continue;
        };
        let mut delete = to_server(call, Bytes::new(), &peer, &server);
        delete.parts.method = Method::DELETE;
        delete
            .parts
            .headers
            .insert(headers::MCP_SESSION_ID, session);
        let _ = inner.clone().oneshot(delete).await;
    }
}

/// A server's answer as the client sees it: the session it names is the client's with this
/// sidecar, never the server's (an SDK client adopts whatever session an answer names, and its
/// next call would bypass the broker).
pub(super) fn as_the_clients(context: &Context, response: &mut Response<ReachBody>) {
    let h = response.headers_mut();
    match context {
        Context::Client(id, _) if h.contains_key(headers::MCP_SESSION_ID) => {
            if let Ok(id) = HeaderValue::from_str(id) {
                h.insert(headers::MCP_SESSION_ID, id);
            }
        }
        _ => {
            h.remove(headers::MCP_SESSION_ID);
        }
    }
}

/// After an answer on the client's sessions: a server that no longer knows its session (`404`)
/// ended the client's session (MCP's answer goes back, and the client starts another).
pub(super) async fn after<S>(
    out: &Outbound,
    inner: S,
    call: &Call,
    context: &Context,
    status: StatusCode,
) where
    S: Step<Call, Response = Recorded>,
{
    if status != StatusCode::NOT_FOUND {
        return;
    }
    match context {
        Context::Client(id, _) => {
            if let Some(brokered) = out.broker.remove(id) {
                end_servers(inner, call, &brokered).await;
            }
        }
        // The sidecar's own: opened again at the next call.
        Context::Shared(b) => b.servers().clear(),
    }
}

/// Why a call has no server session to go on.
pub(super) enum Refused {
    /// The server holding the client's session state is gone from the fleet.
    Lost(String),
    /// No session could be opened: the answer that said why.
    Answer(Response<ReachBody>),
}

impl Refused {
    /// The answer to the client: a lost session in MCP's terms (`404`, `affinity_lost`).
    pub(super) fn answer(self, capability: &str, id: Option<Value>) -> Response<ReachBody> {
        match self {
            Refused::Lost(holder) => ReachError::AffinityLost {
                capability: capability.to_owned(),
                holder,
                key: AffinityKey::McpSession,
                rpc_id: id.map(Box::new),
            }
            .into_response(),
            Refused::Answer(response) => response,
        }
    }
}

/// The servers `call` may go to, each with its session, for `route`: within a client's
/// session, the server that already holds a session and has the tool; else a new session on
/// the server the fleet's routing picks (the shared context: on every candidate). `Err` with
/// the answer when the server holding the client's state is gone, or none could be opened.
pub(super) async fn sessions_for<S>(
    out: &Outbound,
    inner: S,
    call: &Call,
    context: &Context,
    route: &McpRoute,
) -> Result<ServerSessions, Refused>
where
    S: Step<Call, Response = Recorded>,
{
    let capability = call.capability.as_str();
    let snapshot = &call.snapshot;
    let brokered = context.brokered();
    let candidates = out.registry.candidates(snapshot, capability);
    // A tool goes only to servers of the definition this caller lists and routes by (`pins.rs`):
    // a session already held on a server of another definition is not one for this tool.
    let chosen = match route {
        McpRoute::Tool { tool, .. } => {
            out.pins
                .chosen(snapshot, capability, tool, candidates.iter().map(|p| &**p))
        }
        _ => None,
    };
    let fits = |name: &str| match route {
        McpRoute::Server(server) => name == server,
        McpRoute::Any => candidates.iter().any(|p| p.name == name),
        McpRoute::Tool { tool, excluded } => {
            !excluded.iter().any(|e| e == name)
                && candidates.iter().any(|p| {
                    p.name == name
                        && p.tool(capability, tool).map(|t| t.schema.as_str()) == chosen.as_deref()
                })
        }
    };
    let held: FastMap<String, ServerSession> = brokered
        .servers()
        .iter()
        .filter(|(name, _)| fits(name))
        .map(|(n, s)| (n.clone(), s.clone()))
        .collect();
    if let Context::Client(..) = context {
        if let Some((name, server)) = held.into_iter().next() {
            return Ok(ServerSessions(Arc::new(
                [(name, server)].into_iter().collect(),
            )));
        }
        // A server gone from the fleet held this session's state: the session is lost.
        let gone = brokered
            .servers()
            .iter()
            .find(|(name, s)| s.id.is_some() && !candidates.iter().any(|p| &p.name == *name))
            .map(|(name, _)| name.clone());
        if let Some(holder) = gone {
            return Err(Refused::Lost(holder));
        }
        let (name, server) = open(out, inner, call, brokered, route)
            .await
            .map_err(Refused::Answer)?;
        return Ok(ServerSessions(Arc::new(
            [(name, server)].into_iter().collect(),
        )));
    }
    // Shared: every server that may take the call, each on a session of its own.
    let missing: Vec<String> = candidates
        .iter()
        .map(|p| p.name.clone())
        .filter(|n| fits(n) && !held.contains_key(n))
        .collect();
    open_every(out, inner, call, brokered, (held, missing)).await
}

/// The sessions held, and one opened on each server `missing`: `Err` when there are none.
async fn open_every<S>(
    out: &Outbound,
    inner: S,
    call: &Call,
    brokered: &Brokered,
    (mut sessions, missing): (FastMap<String, ServerSession>, Vec<String>),
) -> Result<ServerSessions, Refused>
where
    S: Step<Call, Response = Recorded>,
{
    let mut last = None;
    for name in missing {
        match open(out, inner.clone(), call, brokered, &McpRoute::Server(name)).await {
            Ok((name, server)) => {
                sessions.insert(name, server);
            }
            Err(response) => last = Some(response),
        }
    }
    match (sessions.is_empty(), last) {
        (true, Some(failed)) => Err(Refused::Answer(failed)),
        _ => Ok(ServerSessions(Arc::new(sessions))),
    }
}

/// Opens a session on the server `route` leads to: `initialize` in the client's revision (the
/// server answers with its own), then `notifications/initialized` in the session it gave.
async fn open<S>(
    out: &Outbound,
    inner: S,
    call: &Call,
    brokered: &Brokered,
    route: &McpRoute,
) -> Result<(String, ServerSession), Response<ReachBody>>
where
    S: Step<Call, Response = Recorded>,
{
    let _ = out;
    let init = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": brokered.revision,
            "capabilities": {},
            "clientInfo": { "name": "agent-reach", "version": env!("CARGO_PKG_VERSION") },
        }
    });
    let mut one = copy_for_server(call, Bytes::from(init.to_string()), route.clone());
    one.parts.headers.remove(VERSION_HEADER);
    let response = answer(inner.clone().oneshot(one).await).response;
    if !response.status().is_success() {
        return Err(response);
    }
    let Some(peer) = response
        .headers()
        .get(headers::AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return Err(response);
    };
    let id = response.headers().get(headers::MCP_SESSION_ID).cloned();
    let content_type = jsonrpc::content_type(response.headers());
    let bytes = body::read_limited(response.into_body(), MAX_ANSWER_BYTES)
        .await
        .unwrap_or_default();
    let revision = jsonrpc::answer(&content_type, &bytes)
        .and_then(|a| {
            a.pointer("/result/protocolVersion")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .and_then(|r| HeaderValue::from_str(&r).ok())
        .unwrap_or(HeaderValue::from_static(FALLBACK_REVISION));
    let server = ServerSession { id, revision };
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let mut note = to_server(call, Bytes::from(initialized.to_string()), &peer, &server);
    if let Some(id) = &server.id {
        note.parts
            .headers
            .insert(headers::MCP_SESSION_ID, id.clone());
    }
    let _ = inner.oneshot(note).await;
    brokered.servers().insert(peer.clone(), server.clone());
    Ok((peer, server))
}

/// The call, with `bytes` for a body, as the sidecar sends it to a server on its own behalf
/// (one that `route` leads to): no client session, no stateless-revision headers of the
/// client's request. Set here, not in the async caller: a call borrowed there is held across
/// its awaits.
fn copy_for_server(call: &Call, bytes: Bytes, route: McpRoute) -> Call {
    let mut one = message::copy(call, bytes);
    one.carried_mut().mcp_route = Some(route);
    let h = &mut one.parts.headers;
    h.remove(headers::MCP_SESSION_ID);
    h.remove(METHOD_HEADER);
    h.remove(NAME_HEADER);
    h.remove(header::CONTENT_LENGTH);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    one.parts.method = Method::POST;
    one.present = without_session(one.present);
    one
}

/// The call for one server on its session (`route` pinned to it).
fn to_server(call: &Call, bytes: Bytes, peer: &str, server: &ServerSession) -> Call {
    let mut one = copy_for_server(call, bytes, McpRoute::Server(peer.to_owned()));
    one.parts
        .headers
        .insert(VERSION_HEADER, server.revision.clone());
    one
}

/// Prepares a client's call for the servers behind the sidecar: the client's session is the
/// sidecar's (never sent on), the servers' sessions are set per attempt.
/// `asked`: the call's method and tool, as the MCP step read them.
pub(super) fn for_servers(
    call: &mut Call,
    sessions: ServerSessions,
    (method, tool): (&str, Option<&str>),
) {
    call.parts.headers.remove(headers::MCP_SESSION_ID);
    call.present = without_session(call.present);
    // A server of the stateless revision reads what is asked from these headers.
    let h = &mut call.parts.headers;
    if !h.contains_key(METHOD_HEADER) {
        if let Ok(method) = HeaderValue::from_str(method) {
            h.insert(METHOD_HEADER, method);
        }
    }
    if let Some(tool) = tool.filter(|_| !h.contains_key(NAME_HEADER)) {
        if let Ok(tool) = HeaderValue::from_str(tool) {
            h.insert(NAME_HEADER, tool);
        }
    }
    call.carried_mut().sessions = Some(sessions);
}

fn without_session(present: Present) -> Present {
    present.without(Present::MCP_SESSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_revision_is_answered_when_the_sidecar_speaks_it() {
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some(STATELESS_REVISION)), STATELESS_REVISION);
        assert_eq!(negotiate(Some("2099-01-01")), FALLBACK_REVISION);
        assert_eq!(negotiate(None), FALLBACK_REVISION);
    }
}
