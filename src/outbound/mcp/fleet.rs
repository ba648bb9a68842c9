//! What the sidecar answers for the fleet behind an MCP capability: `tools/list` as the union
//! of the tools its servers announced, each once, in the one definition this caller routes it
//! by (`pins.rs`), read from a server that announced that definition and answered it (asked of
//! as few servers as cover every tool); a tool a server lists without having announced it, or
//! whose definition differs from what it announced, is not listed.

use std::sync::Arc;

use http::Response;
use serde_json::{json, Map, Value};
use tower::ServiceExt;

use super::message::{self, json_answer};
use super::{broker, Outbound};
use crate::http::step::{answer, Step};
use crate::http::upload::Upload;
use crate::http::{body, ReachBody};
use crate::mcp::fetch::MAX_ANSWER_BYTES;
use crate::mcp::jsonrpc;
use crate::outbound::call::{Call, McpRoute, Recorded};
use crate::registry::Peer;

/// Servers asked for one federated list at most.
const MAX_ASKED: usize = 8;

/// The fleet's tools, each server asked on the sidecar's own session with it (`broker.rs`).
pub(super) async fn tools_list<S>(
    out: &Outbound,
    inner: S,
    call: Call,
    (id, context): (Option<Value>, &broker::Context),
) -> Response<ReachBody>
where
    S: Step<Call, Response = Recorded>,
{
    let bytes = match &call.upload {
        Upload::Buffered(bytes) => bytes.clone(),
        Upload::Stream(..) => return answer(inner.oneshot(call).await).response,
    };
    let shared = broker::Context::Shared(out.broker.shared(call.capability.as_str()));
    let revision = context.revision(&call);
    let capability = call.capability.as_str();
    let mut servers: Vec<Arc<Peer>> = out
        .registry
        .candidates(&call.snapshot, capability)
        .into_iter()
        .filter(|p| p.tools.contains_key(capability))
        .collect();
    let wanted = routed_definitions(out, &call, &servers);
    let mut listed: Map<String, Value> = Map::new();
    let mut last = None;
    for _ in 0..MAX_ASKED {
        let Some(next) = most_missing(&servers, capability, &wanted, &listed) else {
            break;
        };
        let server = servers.swap_remove(next);
        let one = message::copy(&call, bytes.clone());
        match ask(out, inner.clone(), one, &shared, &server.name).await {
            Ok(tools) => {
                for tool in tools {
                    let Some(name) = tool.get("name").and_then(Value::as_str) else {
                        continue;
                    };
                    // Listed only as announced, and as this caller routes it.
                    let announced = server.tool(capability, name).map(|t| t.schema.as_str());
                    let digest = crate::mcp::tools::definition_hash(&tool);
                    let routed = wanted.get(name).and_then(Value::as_str);
                    if announced == Some(digest.as_str()) && routed == announced {
                        listed.entry(name.to_owned()).or_insert(tool);
                    }
                }
            }
            Err(response) => last = Some(response),
        }
    }
    match (listed.is_empty(), last) {
        (true, Some(mut failed)) => {
            broker::as_the_clients(context, &mut failed);
            failed
        }
        _ => {
            let tools: Vec<Value> = listed.into_iter().map(|(_, t)| t).collect();
            let mut list = json!({ "jsonrpc": "2.0", "id": id, "result": { "tools": tools } });
            // The fleet's list, in the client's revision (`bridge.rs`).
            if super::bridge::needed(&revision, "") {
                super::bridge::complete(&mut list, true);
            }
            json_answer(&list)
        }
    }
}

/// Each tool the servers announce, with the definition this caller routes it by (`pins.rs`).
fn routed_definitions(out: &Outbound, call: &Call, servers: &[Arc<Peer>]) -> Map<String, Value> {
    let capability = call.capability.as_str();
    let names: std::collections::BTreeSet<&str> = servers
        .iter()
        .flat_map(|p| p.tools.get(capability).into_iter().flatten())
        .map(|t| t.name.as_str())
        .collect();
    let mut wanted = Map::new();
    for name in names {
        let servers = servers.iter().map(|p| &**p);
        if let Some(digest) = out.pins.chosen(&call.snapshot, capability, name, servers) {
            wanted.insert(name.to_owned(), Value::String(digest));
        }
    }
    wanted
}

/// One server's `tools/list`, on the sidecar's own session with it.
async fn ask<S>(
    out: &Outbound,
    inner: S,
    mut one: Call,
    shared: &broker::Context,
    server: &str,
) -> Result<Vec<Value>, Response<ReachBody>>
where
    S: Step<Call, Response = Recorded>,
{
    let route = McpRoute::Server(server.to_owned());
    match broker::sessions_for(out, inner.clone(), &one, shared, &route).await {
        Ok(sessions) => broker::for_servers(&mut one, sessions, ("tools/list", None)),
        Err(refused) => return Err(refused.answer(one.capability.as_str(), None)),
    }
    one.carried_mut().mcp_route = Some(route);
    let template = message::copy(&one, bytes::Bytes::new());
    let response = answer(inner.clone().oneshot(one).await).response;
    if response.status() == http::StatusCode::NOT_FOUND {
        // The server forgot the sidecar's session (it restarted): opened again next time.
        broker::after(out, inner, &template, shared, response.status()).await;
    }
    tools_of(response).await
}

/// The server announcing the most wanted tools, in their routed definition, not listed yet
/// (none when every tool is listed or no server left has one).
fn most_missing(
    servers: &[Arc<Peer>],
    capability: &str,
    wanted: &Map<String, Value>,
    listed: &Map<String, Value>,
) -> Option<usize> {
    let missing = |p: &Arc<Peer>| {
        p.tools.get(capability).map_or(0, |ts| {
            ts.iter()
                .filter(|t| !listed.contains_key(&t.name))
                .filter(|t| wanted.get(&t.name).and_then(Value::as_str) == Some(t.schema.as_str()))
                .count()
        })
    };
    let (index, count) = servers
        .iter()
        .enumerate()
        .map(|(i, p)| (i, missing(p)))
        .max_by_key(|(_, n)| *n)?;
    (count > 0).then_some(index)
}

/// The `tools` of a server's `tools/list` answer; the answer itself when it is not one.
async fn tools_of(response: Response<ReachBody>) -> Result<Vec<Value>, Response<ReachBody>> {
    if !response.status().is_success() {
        return Err(response);
    }
    let content_type = jsonrpc::content_type(response.headers());
    let (parts, incoming) = response.into_parts();
    let bytes = body::read_limited(incoming, MAX_ANSWER_BYTES)
        .await
        .unwrap_or_default();
    let answer = jsonrpc::answer(&content_type, &bytes);
    match answer
        .as_ref()
        .and_then(|a| a.pointer("/result/tools"))
        .and_then(Value::as_array)
    {
        Some(tools) => Ok(tools.clone()),
        None => Err(Response::from_parts(parts, body::full(bytes))),
    }
}
