//! Reading the local MCP server's tools: `initialize`, `notifications/initialized`, then
//! `tools/list` (every page), each one bounded POST over the agent client. The server answers
//! JSON or an event stream; both are read (`super::jsonrpc::answer`).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde_json::{json, Value};

use super::jsonrpc::{self, CLIENT_REVISION, VERSION_HEADER};
use crate::config::HostPort;
use crate::http::body;
use crate::http::client::UpstreamClient;

/// An answer larger than this is refused: a tool list is a few KiB to a few hundred.
pub(crate) const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// One request to the local server.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Pages of `tools/list` followed; more than this is a server that never stops paging.
const MAX_PAGES: usize = 8;
pub(super) const SESSION_HEADER: &str = "mcp-session-id";

/// Why the tools could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("mcp server {url}: {method}: {message}")]
    Request {
        url: String,
        method: &'static str,
        message: String,
    },
    #[error("mcp server {url}: {method}: the server answered {status}")]
    Status {
        url: String,
        method: &'static str,
        status: StatusCode,
    },
    #[error("mcp server {url}: {method}: no answer within {TIMEOUT:?}")]
    Timeout { url: String, method: &'static str },
    #[error("mcp server {url}: {method}: no JSON-RPC result: {message}")]
    Answer {
        url: String,
        method: &'static str,
        message: String,
    },
}

/// One MCP client session with the local server, for one read of its tools.
struct Session<'a> {
    client: &'a UpstreamClient,
    address: &'a HostPort,
    url: String,
    session: Option<HeaderValue>,
}

/// What one read gave: the `tools` of every page of the server's `tools/list`, and the session
/// the server assigned (its change notifications are listened for in it, `super::changes`).
#[derive(Debug, Default)]
pub(crate) struct Listed {
    pub(crate) tools: Vec<Value>,
    pub(crate) session: Option<HeaderValue>,
}

/// The server's tools, read in the session of the last read when the server still holds it
/// (one session per server, not one per refresh), else in a new one.
pub(crate) async fn tools(
    client: &UpstreamClient,
    address: &HostPort,
    path: &str,
    last: Option<HeaderValue>,
) -> Result<Listed, FetchError> {
    let held = last.is_some();
    let mut s = Session {
        client,
        address,
        url: format!("http://{address}{path}"),
        session: last,
    };
    match s.list().await {
        Ok(tools) => Ok(Listed {
            tools,
            session: s.session,
        }),
        // The server no longer holds the session (it restarted): a new one.
        Err(FetchError::Status { status, .. }) if held && matches!(status.as_u16(), 400 | 404) => {
            s.session = None;
            let tools = s.list().await?;
            Ok(Listed {
                tools,
                session: s.session,
            })
        }
        Err(err) => Err(err),
    }
}

/// Ends the importer's session with the server (`DELETE`), when it has one.
pub(crate) async fn end(
    client: &UpstreamClient,
    address: &HostPort,
    path: &str,
    session: HeaderValue,
) {
    let request = Request::delete(format!("http://{address}{path}"))
        .header(header::HOST, address.as_str())
        .header(SESSION_HEADER, session)
        .header(VERSION_HEADER, CLIENT_REVISION)
        .body(body::empty());
    if let Ok(request) = request {
        let _ = tokio::time::timeout(TIMEOUT, client.request(request)).await;
    }
}

impl Session<'_> {
    /// Every page of `tools/list`, after the handshake when no session is held yet.
    async fn list(&mut self) -> Result<Vec<Value>, FetchError> {
        let s = self;
        if s.session.is_none() {
            let init = json!({ "protocolVersion": CLIENT_REVISION, "capabilities": {},
                "clientInfo": { "name": "agent-reach", "version": env!("CARGO_PKG_VERSION") } });
            s.call("initialize", Some(init)).await?;
            s.post("notifications/initialized", None, None).await?;
        }
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_PAGES {
            let params = cursor.take().map(|c| json!({ "cursor": c }));
            let result = s.call("tools/list", params).await?;
            if let Some(page) = result.get("tools").and_then(Value::as_array) {
                tools.extend(page.iter().cloned());
            }
            match result.get("nextCursor").filter(|c| !c.is_null()) {
                Some(next) => cursor = Some(next.clone()),
                None => break,
            }
        }
        Ok(tools)
    }

    /// A request and its `result`.
    async fn call(
        &mut self,
        method: &'static str,
        params: Option<Value>,
    ) -> Result<Value, FetchError> {
        let (content_type, bytes) = self.post(method, params, Some(1)).await?;
        let fail = |message: String| FetchError::Answer {
            url: self.url.clone(),
            method,
            message,
        };
        let answer = jsonrpc::answer(&content_type, &bytes)
            .ok_or_else(|| fail("no JSON-RPC answer in the body".to_owned()))?;
        match answer.get("result") {
            Some(result) => Ok(result.clone()),
            None => Err(fail(
                answer
                    .get("error")
                    .map_or_else(String::new, Value::to_string),
            )),
        }
    }

    /// One POST (a notification when `id` is `None`): the answer's content type and body.
    async fn post(
        &mut self,
        method: &'static str,
        params: Option<Value>,
        id: Option<u64>,
    ) -> Result<(String, Bytes), FetchError> {
        let mut message = json!({ "jsonrpc": "2.0", "method": method });
        if let Some(params) = params {
            message["params"] = params;
        }
        if let Some(id) = id {
            message["id"] = json!(id);
        }
        let url = self.url.clone();
        let request_error = |message: String| FetchError::Request {
            url: url.clone(),
            method,
            message,
        };
        let mut request = Request::post(&self.url)
            .header(header::HOST, self.address.as_str())
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header(header::CONTENT_TYPE, "application/json")
            .header(VERSION_HEADER, CLIENT_REVISION)
            .body(body::full(message.to_string()))
            .map_err(|e| request_error(e.to_string()))?;
        if let Some(session) = &self.session {
            request
                .headers_mut()
                .insert(SESSION_HEADER, session.clone());
        }
        let timeout = || FetchError::Timeout {
            url: url.clone(),
            method,
        };
        let response = tokio::time::timeout(TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| timeout())?
            .map_err(|e| request_error(crate::http::client::describe(&e).message))?;
        if !response.status().is_success() {
            return Err(FetchError::Status {
                url,
                method,
                status: response.status(),
            });
        }
        if let Some(session) = response.headers().get(SESSION_HEADER) {
            self.session = Some(session.clone());
        }
        let content_type = jsonrpc::content_type(response.headers());
        let collected = tokio::time::timeout(
            TIMEOUT,
            Limited::new(response.into_body(), MAX_ANSWER_BYTES).collect(),
        )
        .await
        .map_err(|_| timeout())?
        .map_err(|e| request_error(e.to_string()))?;
        Ok((content_type, collected.to_bytes()))
    }
}
