//! A small MCP server for tests and the demo (`docs/mcp.md`): streamable HTTP, JSON-RPC on
//! any path, answering `initialize`, `tools/list` and `tools/call` in JSON or as event streams,
//! and `notifications/tools/list_changed` on a GET's open event stream when a tool is added. A
//! call with `arguments.ask: true` is answered `input_required` with a `requestState` only this
//! server takes back (revision 2026-07-28's multi round-trip requests).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Channel, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

/// A small MCP server (streamable HTTP, JSON-RPC on `POST /mcp`): its tools can change at run
/// time, a tool can be made to fail (`isError: true`), and it remembers each tool call.
#[derive(Clone)]
pub struct McpServer {
    pub name: &'static str,
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    tools: Vec<Value>,
    failing: BTreeSet<String>,
    served: Vec<String>,
    /// Request states issued so far.
    issued: u64,
    /// Retries refused for a `requestState` another server issued.
    foreign: usize,
    /// Answer with an event stream instead of JSON.
    sse: bool,
    /// Tells every open GET stream that the tool list changed.
    changes: Option<broadcast::Sender<()>>,
    /// Keeps sessions, as the SDKs' servers do by default: `initialize` opens one, every other
    /// request must carry it (`400` without, `404` for one it does not hold), `DELETE` ends it.
    sessions: bool,
    open: BTreeSet<String>,
    opened: usize,
}

type Body = BoxBody<Bytes, std::convert::Infallible>;

/// A tool with a one-string input schema.
pub fn tool(name: &str, read_only: bool) -> Value {
    json!({ "name": name, "title": format!("The {name} tool"),
        "inputSchema": { "type": "object", "properties": { "q": { "type": "string" } } },
        "annotations": { "readOnlyHint": read_only } })
}

/// [`tool`] with a description: servers whose descriptions differ announce two definitions of
/// one tool (the demo does not; `tests/it/mcp_tools.rs` does).
#[allow(dead_code)]
pub fn described(name: &str, read_only: bool, description: &str) -> Value {
    let mut t = tool(name, read_only);
    t["description"] = json!(description);
    t
}

impl McpServer {
    /// Starts on an OS-assigned loopback port; `sse`: answers as event streams.
    pub async fn start(name: &'static str, tools: Vec<Value>, sse: bool) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            tools,
            sse,
            changes: Some(broadcast::channel(4).0),
            ..State::default()
        }));
        let server = Self { name, addr, state };
        let serving = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let serving = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: Request<hyper::body::Incoming>| {
                            let serving = serving.clone();
                            async move { Ok::<_, std::convert::Infallible>(serving.answer(req).await) }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(server)
    }

    async fn answer(&self, req: Request<hyper::body::Incoming>) -> Response<Body> {
        let session = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(refused) = self.session_refused(&req, session.as_deref()) {
            return refused;
        }
        if req.method() == Method::DELETE {
            return Response::new(Full::default().boxed());
        }
        if req.method() == Method::GET {
            return self.notifications();
        }
        let bytes = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let message: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let method = message["method"].as_str().unwrap_or_default().to_owned();
        let sessions = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sessions;
        if sessions && session.is_none() && method != "initialize" {
            let mut response = Response::new(Full::new(Bytes::from_static(
                b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32000,\"message\":\"Bad Request: No valid session ID provided\"}}",
            )).boxed());
            *response.status_mut() = http::StatusCode::BAD_REQUEST;
            return response;
        }
        let Some(id) = message.get("id").cloned() else {
            // A notification: accepted, no answer.
            let mut accepted = Response::new(Full::default().boxed());
            *accepted.status_mut() = http::StatusCode::ACCEPTED;
            return accepted;
        };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut opened = None;
        if method == "initialize" && state.sessions {
            state.opened += 1;
            let id = format!("{}-s{}", self.name, state.opened);
            state.open.insert(id.clone());
            opened = Some(id);
        }
        let result = match method.as_str() {
            "initialize" => Ok(
                json!({ "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": { "tools": { "listChanged": true } },
                "serverInfo": { "name": self.name, "version": "1" } }),
            ),
            "tools/list" => Ok(json!({ "tools": state.tools })),
            "tools/call" => self.call(&mut state, &message["params"]),
            _ => Ok(json!({})),
        };
        let answer = match result {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            Err(error) => json!({ "jsonrpc": "2.0", "id": id, "error": error }),
        }
        .to_string();
        let (content_type, body) = if state.sse {
            (
                "text/event-stream",
                format!("event: message\ndata: {answer}\n\n"),
            )
        } else {
            ("application/json", answer)
        };
        let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        if let Some(id) = opened.and_then(|id| http::HeaderValue::from_str(&id).ok()) {
            response.headers_mut().insert("mcp-session-id", id);
        }
        response
    }

    /// A session server's refusal of a request outside a session it holds; a `DELETE` of
    /// one it holds ends it.
    fn session_refused(
        &self,
        req: &Request<hyper::body::Incoming>,
        session: Option<&str>,
    ) -> Option<Response<Body>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.sessions {
            return None;
        }
        let refuse = |status: http::StatusCode, message: &str| {
            let mut response = Response::new(Full::new(Bytes::from(format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{{\"code\":-32000,\"message\":\"{message}\"}}}}"
            ))).boxed());
            *response.status_mut() = status;
            Some(response)
        };
        match session {
            // Only `initialize` opens a session; the body is read later, so any POST without
            // a session is let through to be told apart there.
            None if req.method() == Method::POST => None,
            None => refuse(
                http::StatusCode::BAD_REQUEST,
                "Bad Request: No valid session ID provided",
            ),
            Some(id) if !state.open.contains(id) => {
                refuse(http::StatusCode::NOT_FOUND, "Session not found")
            }
            Some(id) => {
                if req.method() == Method::DELETE {
                    state.open.remove(id);
                }
                None
            }
        }
    }

    /// A tool call: its text names this server; asked for input first when `arguments.ask`,
    /// and then the retry's `requestState` must be one this server issued.
    fn call(&self, state: &mut State, params: &Value) -> Result<Value, Value> {
        let tool = params["name"].as_str().unwrap_or_default().to_owned();
        match params.get("requestState").and_then(Value::as_str) {
            Some(echoed) if !echoed.starts_with(&format!("{}-", self.name)) => {
                state.foreign += 1;
                return Err(json!({ "code": -32602,
                    "message": format!("requestState {echoed} was not issued by {}", self.name) }));
            }
            None if params["arguments"]["ask"] == true => {
                state.issued += 1;
                return Ok(json!({ "resultType": "input_required",
                    "inputRequests": { "confirm": { "method": "elicitation/create",
                        "params": { "message": "Go on?", "requestedSchema": { "type": "object" } } } },
                    "requestState": format!("{}-{}", self.name, state.issued) }));
            }
            _ => {}
        }
        state.served.push(tool.clone());
        let failing = state.failing.contains(&tool);
        Ok(json!({ "content": [{ "type": "text", "text": self.name }], "isError": failing }))
    }

    /// A GET: an event stream that stays open and carries `notifications/tools/list_changed`.
    fn notifications(&self) -> Response<Body> {
        let changes = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .changes
            .as_ref()
            .map(broadcast::Sender::subscribe);
        let (mut tx, channel) = Channel::<Bytes, std::convert::Infallible>::new(4);
        if let Some(mut changes) = changes {
            tokio::spawn(async move {
                while changes.recv().await.is_ok() {
                    let note = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n";
                    if tx.send_data(Bytes::from(note)).await.is_err() {
                        return;
                    }
                }
            });
        }
        let mut response = Response::new(channel.boxed());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        response
    }

    /// From now on keeps sessions (the SDKs' default): see `State::sessions`.
    #[allow(dead_code)]
    pub fn keep_sessions(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sessions = true;
    }

    /// Sessions open now, and opened in all.
    #[allow(dead_code)]
    pub fn sessions(&self) -> (usize, usize) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (state.open.len(), state.opened)
    }

    /// Tool calls this server took for `tool`.
    pub fn served(&self, tool: &str) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .served
            .iter()
            .filter(|t| *t == tool)
            .count()
    }

    /// Retries this server refused for a `requestState` it did not issue (the demo does not
    /// look; `tests/it/mcp_tools.rs` does).
    #[allow(dead_code)]
    pub fn foreign_states(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).foreign
    }

    /// `tool` answers `isError: true` from now on.
    pub fn set_failing(&self, tool: &str) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .failing
            .insert(tool.to_owned());
    }

    /// `tools/list` lists `t` too from now on (the demo does not; `tests/it/mcp_tools.rs` does).
    #[allow(dead_code)]
    pub fn add_tool(&self, t: Value) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.tools.push(t);
        if let Some(changes) = &state.changes {
            let _ = changes.send(());
        }
    }
}
