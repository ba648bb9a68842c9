//! MCP's JSON-RPC as it crosses streamable HTTP, read without I/O: what a request asks
//! (method, tool, id) and the one answer in a response body that is either JSON or
//! `text/event-stream` (the server picks; a client must take both).

use serde_json::Value;

/// The stateless protocol revision: no session, `Mcp-Method` / `Mcp-Name` on every request,
/// `initialize` answerable by an intermediary.
pub(crate) const STATELESS_REVISION: &str = "2026-07-28";
/// The revision this sidecar's own client speaks to its local server.
pub(crate) const CLIENT_REVISION: &str = "2025-06-18";
/// Request headers of the stateless revision that name the method and the tool.
pub(crate) const METHOD_HEADER: &str = "mcp-method";
pub(crate) const NAME_HEADER: &str = "mcp-name";
pub(crate) const VERSION_HEADER: &str = "mcp-protocol-version";

/// What a JSON-RPC request body asks, as far as routing cares.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Asked {
    pub(crate) method: String,
    /// `params.name` of a `tools/call`.
    pub(crate) tool: Option<String>,
    pub(crate) id: Option<Value>,
    /// `params.protocolVersion` of an `initialize`.
    pub(crate) revision: Option<String>,
    /// `params.requestState` is there: the retry of a multi round-trip request, which only the
    /// server that issued the state can take.
    pub(crate) resumes: bool,
}

/// Reads a single JSON-RPC request (a batch or anything else: `None`).
pub(crate) fn asked(body: &[u8]) -> Option<Asked> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let method = value.get("method")?.as_str()?.to_owned();
    let params = value.get("params");
    let text = |key: &str| {
        params
            .and_then(|p| p.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    Some(Asked {
        tool: text("name").filter(|_| method == "tools/call"),
        revision: text("protocolVersion"),
        resumes: params.is_some_and(|p| p.get("requestState").is_some()),
        id: value.get("id").cloned(),
        method,
    })
}

/// An answer's `content-type`, owned (the answer's body is taken after it is read); empty when
/// absent or not text.
pub fn content_type(headers: &http::HeaderMap) -> String {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// The JSON-RPC answer in a response body: the JSON itself, or the first event's `data` that
/// is an answer (has `result` or `error`) on an event stream.
pub fn answer(content_type: &str, body: &[u8]) -> Option<Value> {
    if !content_type.starts_with("text/event-stream") {
        return serde_json::from_slice(body).ok();
    }
    let text = std::str::from_utf8(body).ok()?.replace("\r\n", "\n");
    text.split("\n\n")
        .filter_map(event_data)
        .filter_map(|data| serde_json::from_str::<Value>(&data).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
}

/// The `data` lines of one event, joined as the event-stream format says.
pub(crate) fn event_data(event: &str) -> Option<String> {
    let lines: Vec<&str> = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// How a `tools/call` answer went for the tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ToolOutcome {
    Ok,
    /// `result.isError: true`: the tool ran and reported failure.
    ToolError,
    /// A JSON-RPC error the server owns (not the caller's malformed request or bad params).
    ServerError,
    /// The caller's own fault: says nothing of the tool.
    CallerError,
}

/// Classifies a `tools/call` answer.
pub(crate) fn tool_outcome(answer: &Value) -> ToolOutcome {
    if let Some(error) = answer.get("error") {
        // Parse error, invalid request, method not found, invalid params: the caller's.
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
        return if matches!(code, -32700 | -32600 | -32601 | -32602) {
            ToolOutcome::CallerError
        } else {
            ToolOutcome::ServerError
        };
    }
    match answer.pointer("/result/isError").and_then(Value::as_bool) {
        Some(true) => ToolOutcome::ToolError,
        _ => ToolOutcome::Ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tool_call_names_its_tool() {
        let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search","arguments":{}}}"#;
        let call = asked(body).unwrap_or_default();
        assert_eq!(call.method, "tools/call");
        assert_eq!(call.tool.as_deref(), Some("search"));
        assert_eq!(call.id, Some(json!(7)));
        assert!(!call.resumes);
        let retry = br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"search","requestState":"s"}}"#;
        assert!(asked(retry).is_some_and(|a| a.resumes), "a retry resumes");
        assert_eq!(asked(b"[1,2]"), None, "a batch is not read");
        assert_eq!(asked(b"not json"), None);
        let list =
            asked(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"name":"x"}}"#);
        assert_eq!(list.and_then(|a| a.tool), None, "only a call names a tool");
    }

    #[test]
    fn an_answer_is_read_from_json_or_an_event_stream() {
        let json = br#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#;
        assert_eq!(
            answer("application/json", json).map(|v| v["id"].clone()),
            Some(json!(1))
        );
        let sse = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\r\ndata:\"result\":{}}\r\n\r\n";
        // The second event's data spans two lines (CRLF ones); one space after `data:` is dropped.
        let got = answer("text/event-stream", sse);
        assert_eq!(got.map(|v| v["id"].clone()), Some(json!(2)));
    }

    #[test]
    fn tool_outcomes() {
        assert_eq!(
            tool_outcome(&json!({"result": {"content": []}})),
            ToolOutcome::Ok
        );
        assert_eq!(
            tool_outcome(&json!({"result": {"isError": true}})),
            ToolOutcome::ToolError
        );
        assert_eq!(
            tool_outcome(&json!({"error": {"code": -32603}})),
            ToolOutcome::ServerError
        );
        assert_eq!(
            tool_outcome(&json!({"error": {"code": -32602}})),
            ToolOutcome::CallerError
        );
    }
}
