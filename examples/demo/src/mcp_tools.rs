//! The demo's MCP act (`docs/mcp.md`): three MCP servers join the fleet, each behind its sidecar
//! with no capability written down — the sidecars read the servers' tools and the caller learns
//! by gossip which server has which. The caller lists the fleet's tools through its sidecar
//! (each once), calls `search` and `fetch`; then the busiest server's `search` breaks
//! (`isError: true`): its `search` calls move (read-only, so a failed call is tried once more
//! elsewhere and the caller sees no failure) while its `fetch` keeps serving; the caller's
//! per-tool view (its `/status`) shows that server's `search` paused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::Request;
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::{json, Value};

use super::{DemoError, Fleet};
use agent_reach::config::{Bootstrap, McpConfig};
use agent_reach::http::{body, client};
use agent_reach::Sidecar;
use testkit::mcp::{tool, McpServer};

const CAPABILITY: &str = "mcp";
const SERVERS: [&str; 3] = ["mcp-1", "mcp-2", "mcp-3"];
/// Calls per tool in each half of the act.
const CALLS: usize = 40;

#[derive(Clone, Debug, Serialize)]
pub struct McpSummary {
    /// From the servers' start to the caller routing every tool.
    pub tools_routable_after_ms: Option<f64>,
    /// The caller's federated `tools/list`: each tool and how many times it was listed.
    pub listed: BTreeMap<String, usize>,
    /// The server whose `search` broke.
    pub broken: String,
    /// Per server, the `search` and `fetch` calls it took before and after the break.
    pub search_before: BTreeMap<String, usize>,
    pub search_after: BTreeMap<String, usize>,
    pub fetch_before: BTreeMap<String, usize>,
    pub fetch_after: BTreeMap<String, usize>,
    /// Calls made per tool in each half, and the failed answers the caller saw after the break.
    pub calls: usize,
    pub failed_after: usize,
    /// The broken server's `search` in the caller's per-tool view at the end: `paused`, `trial`
    /// (the pause over, the next call decides) or `healthy`; and its failures in a row.
    pub broken_search_state: String,
    pub broken_search_failures: u32,
    /// The broken server's share of the `fetch` calls before and after the break, in percent
    /// (none when it has no `fetch`).
    pub broken_fetch_share_before_pct: Option<f64>,
    pub broken_fetch_share_after_pct: Option<f64>,
    /// The broken server's `fetch` in the caller's per-tool view at the end (`-` when it has no
    /// `fetch`): its search's failures are not held against it. Its share after the break is
    /// the latency tie-break's (`candidates/balance.rs`): with one call at a time, a server that
    /// looks twice as fast takes them all, which a loaded machine can make either server.
    pub broken_fetch_state: String,
    /// One client session brokered by the caller's sidecar over a server that keeps sessions
    /// (mcp-3, as the SDKs' servers do by default) and the stateless ones: its calls that
    /// succeeded of those made, and the sessions mcp-3 still held after the client ended its
    /// own (the importer's and the caller's shared one at most).
    pub session_calls_ok: usize,
    pub session_calls: usize,
    pub session_server_open_after: usize,
}

pub(super) async fn run(fleet: &mut Fleet) -> Result<McpSummary, DemoError> {
    let started = Instant::now();
    let mut servers: Vec<(McpServer, Sidecar)> = Vec::new();
    for (n, name) in SERVERS.iter().enumerate() {
        let third = if n == 2 { "summarize" } else { "fetch" };
        let server =
            McpServer::start(name, vec![tool("search", true), tool(third, false)], false).await?;
        if n == 2 {
            // As the SDKs' servers do by default: every request in a session of its own.
            server.keep_sessions();
        }
        let mut bootstrap = Bootstrap::local(name, server.addr, &[])
            .map_err(DemoError::Config)?
            .with_gossip(&fleet.seed, fleet.key_dir.join("gossip.key"));
        bootstrap.agent.mcp = Some(McpConfig::default());
        let bootstrap = fleet.with_tls(bootstrap, &super::agent_identity(name))?;
        let sidecar = super::start_sidecar(bootstrap, fleet.policy.clone()).await?;
        servers.push((server, sidecar));
    }
    let outbound = fleet.caller.addrs.outbound;
    let http = client::build(&fleet.policy);
    let mut routable = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let listed = tools_list(&http, outbound).await;
        if ["search", "fetch", "summarize"]
            .iter()
            .all(|t| listed.contains_key(*t))
        {
            routable = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = tools_list(&http, outbound).await;
    let count = |tool: &str| -> BTreeMap<String, usize> {
        servers
            .iter()
            .map(|(s, _)| (s.name.to_owned(), s.served(tool)))
            .collect()
    };
    for _ in 0..CALLS {
        call(&http, outbound, "search").await;
        call(&http, outbound, "fetch").await;
    }
    let (search_before, fetch_before) = (count("search"), count("fetch"));
    // The server that took the most `search` calls breaks.
    let busiest = search_before
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or(SERVERS[0].to_owned(), |(name, _)| name.clone());
    if let Some((server, _)) = servers.iter().find(|(s, _)| s.name == busiest) {
        server.set_failing("search");
    }
    let mut failed_after = 0;
    for _ in 0..CALLS {
        failed_after += usize::from(!call(&http, outbound, "search").await);
        failed_after += usize::from(!call(&http, outbound, "fetch").await);
    }
    let minus = |after: BTreeMap<String, usize>, before: &BTreeMap<String, usize>| {
        after
            .into_iter()
            .map(|(k, v)| (k.clone(), v - before.get(&k).copied().unwrap_or(0)))
            .collect()
    };
    let search_after = minus(count("search"), &search_before);
    let fetch_after = minus(count("fetch"), &fetch_before);
    let tools = fleet.caller.status().tools;
    let view_of = |tool: &str| {
        tools
            .iter()
            .find(|t| t.capability == CAPABILITY && t.tool == tool)
            .and_then(|t| t.servers.iter().find(|s| s.server == busiest))
    };
    let view = view_of("search");
    let fetch_state = view_of("fetch").map_or("-", |v| v.state).to_owned();
    let share = |counts: &BTreeMap<String, usize>| {
        let all: usize = counts.values().sum();
        let own = *counts.get(&busiest)?;
        (all > 0).then(|| super::round(100.0 * own as f64 / all as f64))
    };
    let has_fetch = busiest != SERVERS[2];
    let (fetch_share_before, fetch_share_after) = match has_fetch {
        true => (share(&fetch_before), share(&fetch_after)),
        false => (None, None),
    };
    let (session_calls_ok, session_calls) = session_client(&http, outbound).await;
    let session_server_open_after = servers
        .iter()
        .find(|(s, _)| s.name == SERVERS[2])
        .map_or(0, |(s, _)| s.sessions().0);
    for (server, sidecar) in servers {
        sidecar.shutdown().await;
        drop(server);
    }
    Ok(McpSummary {
        tools_routable_after_ms: routable.map(|d| super::round(d.as_secs_f64() * 1000.0)),
        listed,
        broken: busiest,
        search_before,
        search_after,
        fetch_before,
        fetch_after,
        calls: CALLS,
        failed_after,
        broken_search_state: view.as_ref().map_or("-", |v| v.state).to_owned(),
        broken_search_failures: view.map_or(0, |v| v.failures),
        broken_fetch_share_before_pct: fetch_share_before,
        broken_fetch_share_after_pct: fetch_share_after,
        broken_fetch_state: fetch_state,
        session_calls_ok,
        session_calls,
        session_server_open_after,
    })
}

/// An MCP client with a session, as the SDKs open one (`docs/mcp.md`, "Sessions"): the caller's
/// sidecar answers `initialize` with a session of its own, and each call reaches its server on
/// that server's session; `summarize` is mcp-3's alone, and mcp-3 keeps sessions. The calls that
/// succeeded, of those made.
async fn session_client(http: &client::UpstreamClient, outbound: SocketAddr) -> (usize, usize) {
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": { "name": "demo", "version": "1" } } });
    let (_, session) = rpc_in(http, outbound, "POST", None, init).await;
    let Some(session) = session else {
        return (0, 4);
    };
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    rpc_in(http, outbound, "POST", Some(&session), initialized).await;
    let mut ok = 0;
    for tool in ["summarize", "fetch", "summarize", "search"] {
        let message = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": tool, "arguments": { "q": "agents" } } });
        let (answer, _) = rpc_in(http, outbound, "POST", Some(&session), message).await;
        ok += usize::from(answer["result"]["isError"] == false);
    }
    rpc_in(http, outbound, "DELETE", Some(&session), Value::Null).await;
    (ok, 4)
}

/// The caller's federated `tools/list`: tool name → times listed.
async fn tools_list(
    http: &client::UpstreamClient,
    outbound: SocketAddr,
) -> BTreeMap<String, usize> {
    let answer = rpc(
        http,
        outbound,
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" }),
    )
    .await;
    let mut listed = BTreeMap::new();
    for t in answer["result"]["tools"].as_array().into_iter().flatten() {
        if let Some(name) = t["name"].as_str() {
            *listed.entry(name.to_owned()).or_default() += 1;
        }
    }
    listed
}

/// One `tools/call` through the caller's sidecar; whether it succeeded.
async fn call(http: &client::UpstreamClient, outbound: SocketAddr, tool: &str) -> bool {
    let answer = rpc(
        http,
        outbound,
        json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": tool, "arguments": { "q": "agents" } } }),
    )
    .await;
    answer["result"]["isError"] == false
}

async fn rpc(http: &client::UpstreamClient, outbound: SocketAddr, message: Value) -> Value {
    rpc_in(http, outbound, "POST", None, message).await.0
}

/// One MCP request, in `session` when given: the answer (JSON or an event stream's one
/// message), and the session the answer names.
async fn rpc_in(
    http: &client::UpstreamClient,
    outbound: SocketAddr,
    method: &str,
    session: Option<&str>,
    message: Value,
) -> (Value, Option<String>) {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{outbound}/mcp"))
        .header("reach-capability", CAPABILITY)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, text/event-stream");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let body = if message.is_null() {
        String::new()
    } else {
        message.to_string()
    };
    let Ok(request) = request.body(body::full(body)) else {
        return (Value::Null, None);
    };
    let Ok(response) = http.request(request).await else {
        return (Value::Null, None);
    };
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let content_type = agent_reach::mcp::jsonrpc::content_type(response.headers());
    let answer = match response.into_body().collect().await {
        Ok(b) => agent_reach::mcp::jsonrpc::answer(&content_type, &b.to_bytes()),
        Err(_) => None,
    };
    (answer.unwrap_or_default(), session)
}
