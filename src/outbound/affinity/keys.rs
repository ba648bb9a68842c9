//! The affinity keys a call carries (`reach-affinity`, `Mcp-Session-Id`, an A2A request's task
//! and context ids) and those its answer assigns (an A2A task's id and context, an MCP session).
//!
//! A call with no key costs two header look-ups and a `content-type` check: only a buffered JSON
//! body that mentions `"jsonrpc"` is parsed, and only the fields that hold ids.

use std::borrow::Cow;

use http::HeaderMap;
use serde::Deserialize;

use super::table::Kind;

/// Reads a complete JSON-RPC answer for the keys it assigns (`None`: not a result).
pub(crate) type Reader = fn(&[u8]) -> Option<Vec<(Kind, String)>>;
use crate::config::Protocol;
use crate::http::headers::{self, Present};

/// What a call carries, in the order its keys are looked up.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Found {
    pub(crate) keys: Vec<(Kind, String)>,
    /// The call is A2A JSON-RPC: its answer may name the task and context to bind.
    pub(crate) a2a: bool,
    /// The call is an MCP request a server may answer with a `requestState` to bind.
    pub(crate) mcp: bool,
}

impl Found {
    /// How the answer is read for the keys it assigns: as A2A's, as MCP's, or not at all.
    pub(crate) fn reader(&self) -> Option<Reader> {
        if self.a2a {
            Some(of_a2a_response)
        } else if self.mcp {
            Some(of_mcp_response)
        } else {
            None
        }
    }
}

/// The keys of a request: `body` is its buffered body, when it was buffered.
pub(crate) fn of_request(
    head: &HeaderMap,
    present: Present,
    body: Option<&[u8]>,
    protocol: Option<Protocol>,
) -> Found {
    let mut found = Found::default();
    let affinity = present.has(Present::AFFINITY);
    if let Some(value) = affinity.then(|| text(head, headers::AFFINITY)).flatten() {
        found.keys.push((Kind::Header, value));
    }
    if matches!(protocol, None | Some(Protocol::Mcp)) && present.has(Present::MCP_SESSION) {
        if let Some(value) = text(head, headers::MCP_SESSION_ID) {
            found.keys.push((Kind::McpSession, value));
        }
    }
    let (a2a_body, mcp_body) = match protocol {
        None => {
            // Only a buffered body is read for keys: an empty one needs no content type.
            let json = body.is_some_and(|b| !b.is_empty()) && headers::is_json(head);
            (json, json)
        }
        Some(Protocol::A2a) => (true, false),
        Some(Protocol::Mcp) => (false, true),
        Some(Protocol::Http) => (false, false),
    };
    let rpc = match body {
        Some(body) if (a2a_body || mcp_body) && mentions_jsonrpc(body) => rpc_request(body),
        _ => None,
    };
    let Some((method, params)) = rpc else {
        return found;
    };
    if a2a_body && is_a2a_method(&method) {
        found.a2a = true;
        found.keys.extend(params.map(a2a_keys).unwrap_or_default());
    } else if mcp_body && is_mrtr_method(&method) {
        found.mcp = true;
        let state = params.and_then(|p| p.request_state);
        found.keys.extend(state.map(|s| (Kind::RequestState, s)));
    }
    found
}

/// The MCP methods a server may answer with `resultType: input_required` and a
/// `requestState` that the retry echoes (revision 2026-07-28's multi round-trip requests).
fn is_mrtr_method(method: &str) -> bool {
    matches!(method, "tools/call" | "prompts/get" | "resources/read")
}

/// The `requestState` an MCP answer's result carries: the state its retry must bring back to
/// the same server. `None` when it is no result (an error, or not JSON-RPC).
pub(crate) fn of_mcp_response(body: &[u8]) -> Option<Vec<(Kind, String)>> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct State {
        #[serde(default)]
        request_state: Option<String>,
    }
    let answer = serde_json::from_slice::<RpcResponse<'_, State>>(body).ok()?;
    let state = answer.result?.request_state.filter(|s| !s.is_empty());
    Some(state.map(|s| (Kind::RequestState, s)).into_iter().collect())
}

/// The keys an answer assigns: an MCP session from its head.
pub(crate) fn of_response_head(head: &HeaderMap) -> Option<(Kind, String)> {
    text(head, headers::MCP_SESSION_ID).map(|v| (Kind::McpSession, v))
}

/// The keys an A2A answer assigns: a JSON-RPC response whose result is a Task (its `id`), a
/// Message or a stream event (its `taskId`), each with its `contextId`. `None` when it is no
/// result (an error, or not JSON-RPC): then nothing is bound.
pub(crate) fn of_a2a_response(body: &[u8]) -> Option<Vec<(Kind, String)>> {
    let rpc = serde_json::from_slice::<RpcResponse<'_, ResultIds>>(body).ok()?;
    let result = rpc.result?;
    // v1 wraps the object: `{"task": {..}}` or `{"message": {..}}`.
    let object = result.task.or(result.message).map_or(
        Ids {
            id: result.id,
            kind: result.kind,
            status: result.status,
            task_id: result.task_id,
            context_id: result.context_id,
        },
        |inner| *inner,
    );
    let mut keys = Vec::new();
    // A Message's `id` is not a task's: only a Task (it has a status) names its task by `id`.
    let is_task = object.kind.as_deref() == Some("task") || object.status.is_some();
    if let (true, Some(id)) = (is_task, object.id) {
        keys.push((Kind::Task, id));
    }
    if let Some(task) = object.task_id {
        keys.push((Kind::Task, task));
    }
    if let Some(context) = object.context_id {
        keys.push((Kind::Context, context));
    }
    Some(keys)
}

/// The first event of a `text/event-stream` answer, when `bytes` holds all of it: its `data`
/// lines joined. `None` while the event is incomplete.
pub(crate) fn first_event(bytes: &[u8]) -> Option<Vec<u8>> {
    let end = find(bytes, b"\n\n").or_else(|| find(bytes, b"\r\n\r\n"))?;
    let mut data = Vec::new();
    for line in bytes[..end].split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"data:") {
            data.extend_from_slice(rest.strip_prefix(b" ").unwrap_or(rest));
            data.push(b'\n');
        }
    }
    Some(data)
}

/// A2A's JSON-RPC methods that start or continue a task or context, in both naming generations
/// (v0.2/v0.3 slash forms, v1 PascalCase): the table in `docs/affinity.md`.
fn is_a2a_method(method: &str) -> bool {
    matches!(
        method,
        "message/send"
            | "message/stream"
            | "tasks/get"
            | "tasks/cancel"
            | "tasks/resubscribe"
            | "tasks/list"
            | "SendMessage"
            | "SendStreamingMessage"
            | "GetTask"
            | "CancelTask"
            | "ListTasks"
            | "SubscribeToTask"
            | "TaskResubscription"
            | "CreateTaskPushNotificationConfig"
            | "SetTaskPushNotificationConfig"
            | "GetTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfig"
            | "ListTaskPushNotificationConfigs"
            | "DeleteTaskPushNotificationConfig"
    ) || method.starts_with("tasks/pushNotificationConfig/")
}

/// The task a resource name names: `tasks/{id}`, or a sub-resource of it
/// (`tasks/{id}/pushNotificationConfigs/{config}`).
fn task_of_resource(name: &str) -> Option<String> {
    let rest = name.strip_prefix("tasks/")?;
    let id = rest.split('/').next().filter(|id| !id.is_empty())?;
    Some(id.to_owned())
}

/// A JSON-RPC 2.0 request's method and the params routing reads.
fn rpc_request(body: &[u8]) -> Option<(String, Option<Params>)> {
    let rpc: RpcRequest<'_> = serde_json::from_slice(body).ok()?;
    if rpc.jsonrpc.as_deref() != Some("2.0") {
        return None;
    }
    Some((rpc.method?.into_owned(), rpc.params))
}

fn a2a_keys(params: Params) -> Vec<(Kind, String)> {
    let mut keys = Vec::new();
    // A push config names its task by `taskId` (its own `id` is the config's); the others by
    // `id`, or by a resource name (`name`, `parent`: `tasks/{id}[/…]`).
    let task = params
        .task_id
        .or(params.id)
        .or_else(|| params.name.as_deref().and_then(task_of_resource))
        .or_else(|| params.parent.as_deref().and_then(task_of_resource));
    keys.extend(task.map(|t| (Kind::Task, t)));
    keys.extend(params.context_id.map(|c| (Kind::Context, c)));
    if let Some(message) = params.message {
        keys.extend(message.task_id.map(|t| (Kind::Task, t)));
        keys.extend(message.context_id.map(|c| (Kind::Context, c)));
    }
    keys
}

/// A JSON-RPC request's `id`, when `body` is one.
pub(crate) fn rpc_id(body: &[u8]) -> Option<serde_json::Value> {
    #[derive(Deserialize)]
    struct Id {
        #[serde(default)]
        id: Option<serde_json::Value>,
    }
    if !mentions_jsonrpc(body) {
        return None;
    }
    serde_json::from_slice::<Id>(body).ok()?.id
}

fn text(head: &HeaderMap, name: http::HeaderName) -> Option<String> {
    let value = head.get(name)?.to_str().ok()?.trim();
    (!value.is_empty()).then(|| value.to_owned())
}

/// A cheap look before a parse: most JSON bodies are not JSON-RPC.
fn mentions_jsonrpc(body: &[u8]) -> bool {
    find(body, b"\"jsonrpc\"").is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[derive(Deserialize)]
struct RpcRequest<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(default)]
    params: Option<Params>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    parent: Option<String>,
    #[serde(default)]
    task_id: Option<String>,
    /// `ListTasks` filters by context: the agent that holds the context has its tasks.
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    message: Option<MessageIds>,
    /// An MCP retry's echo of the state its server issued.
    #[serde(default)]
    request_state: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageIds {
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    context_id: Option<String>,
}

/// A JSON-RPC answer whose `result` is read as `R`.
#[derive(Deserialize)]
struct RpcResponse<'a, R> {
    #[serde(borrow)]
    #[allow(
        dead_code,
        reason = "required, so a body that is not JSON-RPC does not parse"
    )]
    jsonrpc: Cow<'a, str>,
    /// Absent (an error answer): `None`, as serde reads a missing `Option`.
    result: Option<R>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultIds {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    status: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    task: Option<Box<Ids>>,
    #[serde(default)]
    message: Option<Box<Ids>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Ids {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    status: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    context_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
                http::HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}")),
            );
        }
        h
    }

    const JSON: (&str, &str) = ("content-type", "application/json");

    fn keys(found: &Found) -> Vec<(Kind, &str)> {
        found.keys.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    #[test]
    fn headers_are_keys_for_any_capability() {
        let h = head(&[("reach-affinity", " k1 "), ("mcp-session-id", "s-1")]);
        let found = of_request(&h, Present::ALL, None, None);
        assert_eq!(
            keys(&found),
            [(Kind::Header, "k1"), (Kind::McpSession, "s-1")]
        );
        // `protocol: http` reads only `reach-affinity`.
        let found = of_request(&h, Present::ALL, None, Some(Protocol::Http));
        assert_eq!(keys(&found), [(Kind::Header, "k1")]);
        assert!(
            of_request(&head(&[("reach-affinity", "")]), Present::ALL, None, None)
                .keys
                .is_empty()
        );
    }

    #[test]
    fn a2a_requests_name_their_task_and_context() {
        let h = head(&[JSON]);
        let send = br#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"role":"user","parts":[],"messageId":"m1","contextId":"c1","taskId":"t1"}}}"#;
        let found = of_request(&h, Present::ALL, Some(send), None);
        assert!(found.a2a);
        assert_eq!(keys(&found), [(Kind::Task, "t1"), (Kind::Context, "c1")]);
        let get = br#"{"jsonrpc":"2.0","id":"x","method":"tasks/get","params":{"id":"t9"}}"#;
        assert_eq!(
            keys(&of_request(&h, Present::ALL, Some(get), None)),
            [(Kind::Task, "t9")]
        );
        let v1 = br#"{"jsonrpc":"2.0","id":2,"method":"GetTask","params":{"name":"tasks/t7"}}"#;
        assert_eq!(
            keys(&of_request(&h, Present::ALL, Some(v1), None)),
            [(Kind::Task, "t7")]
        );
        let push = br#"{"jsonrpc":"2.0","id":2,"method":"tasks/pushNotificationConfig/get","params":{"taskId":"t3"}}"#;
        assert_eq!(
            keys(&of_request(&h, Present::ALL, Some(push), None)),
            [(Kind::Task, "t3")]
        );
        // A first message: A2A, nothing to look up yet.
        let first = br#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m"}}}"#;
        let found = of_request(&h, Present::ALL, Some(first), None);
        assert!(found.a2a && found.keys.is_empty());
    }

    /// Every method that names a task, in both generations, is bound to
    /// the task's holder (`docs/affinity.md`); before, `SubscribeToTask` and the push-config
    /// methods were not.
    #[test]
    fn every_follow_up_method_names_its_task() {
        let h = head(&[JSON]);
        let cases: &[(&str, &str)] = &[
            ("tasks/get", r#"{"id":"t1"}"#),
            ("tasks/cancel", r#"{"id":"t1"}"#),
            ("tasks/resubscribe", r#"{"id":"t1"}"#),
            (
                "tasks/pushNotificationConfig/set",
                r#"{"taskId":"t1","pushNotificationConfig":{"url":"http://h/"}}"#,
            ),
            (
                "tasks/pushNotificationConfig/get",
                r#"{"id":"t1","pushNotificationConfigId":"c9"}"#,
            ),
            ("tasks/pushNotificationConfig/list", r#"{"id":"t1"}"#),
            (
                "tasks/pushNotificationConfig/delete",
                r#"{"id":"t1","pushNotificationConfigId":"c9"}"#,
            ),
            ("GetTask", r#"{"id":"t1"}"#),
            ("GetTask", r#"{"name":"tasks/t1"}"#),
            ("CancelTask", r#"{"id":"t1"}"#),
            ("SubscribeToTask", r#"{"id":"t1"}"#),
            ("SubscribeToTask", r#"{"name":"tasks/t1"}"#),
            ("TaskResubscription", r#"{"id":"t1"}"#),
            (
                "CreateTaskPushNotificationConfig",
                r#"{"taskId":"t1","id":"c9","url":"http://h/"}"#,
            ),
            (
                "CreateTaskPushNotificationConfig",
                r#"{"parent":"tasks/t1","configId":"c9"}"#,
            ),
            (
                "SetTaskPushNotificationConfig",
                r#"{"taskId":"t1","pushNotificationConfig":{}}"#,
            ),
            (
                "GetTaskPushNotificationConfig",
                r#"{"taskId":"t1","id":"c9"}"#,
            ),
            (
                "GetTaskPushNotificationConfig",
                r#"{"name":"tasks/t1/pushNotificationConfigs/c9"}"#,
            ),
            ("ListTaskPushNotificationConfigs", r#"{"taskId":"t1"}"#),
            ("ListTaskPushNotificationConfig", r#"{"parent":"tasks/t1"}"#),
            (
                "DeleteTaskPushNotificationConfig",
                r#"{"taskId":"t1","id":"c9"}"#,
            ),
            (
                "DeleteTaskPushNotificationConfig",
                r#"{"name":"tasks/t1/pushNotificationConfigs/c9"}"#,
            ),
        ];
        for (method, params) in cases {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}"#);
            let found = of_request(&h, Present::ALL, Some(body.as_bytes()), None);
            assert!(found.a2a, "{method} is A2A");
            assert_eq!(keys(&found), [(Kind::Task, "t1")], "{method} {params}");
        }
    }

    #[test]
    fn a_task_list_names_its_context() {
        let h = head(&[JSON]);
        for method in ["ListTasks", "tasks/list"] {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{"contextId":"c1"}}}}"#
            );
            let found = of_request(&h, Present::ALL, Some(body.as_bytes()), None);
            assert!(found.a2a, "{method} is A2A");
            assert_eq!(keys(&found), [(Kind::Context, "c1")], "{method}");
        }
    }

    #[test]
    fn other_bodies_are_not_a2a() {
        let json = head(&[JSON]);
        let plain = head(&[("content-type", "text/plain")]);
        let get = br#"{"jsonrpc":"2.0","id":"x","method":"tasks/get","params":{"id":"t9"}}"#;
        // Not JSON by its content-type: not read, unless the policy says A2A.
        assert_eq!(
            of_request(&plain, Present::ALL, Some(get), None),
            Found::default()
        );
        assert!(of_request(&plain, Present::ALL, Some(get), Some(Protocol::A2a)).a2a);
        assert_eq!(
            of_request(&json, Present::ALL, Some(get), Some(Protocol::Mcp)),
            Found::default()
        );
        // An MCP method: no A2A key (its answer is read for MCP's state only).
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"id":"t"}}"#;
        let found = of_request(&json, Present::ALL, Some(call), None);
        assert!(!found.a2a && found.keys.is_empty());
        // Another version, not JSON-RPC, not JSON at all.
        for body in [
            &br#"{"jsonrpc":"1.0","method":"tasks/get","params":{"id":"t"}}"#[..],
            br#"{"method":"tasks/get","params":{"id":"t"}}"#,
            b"{\"jsonrpc\": oops",
        ] {
            assert_eq!(
                of_request(&json, Present::ALL, Some(body), None),
                Found::default()
            );
        }
    }

    #[test]
    fn an_mcp_retry_carries_the_state_its_server_issued() {
        let h = head(&[JSON]);
        let first = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{}}}"#;
        let found = of_request(&h, Present::ALL, Some(first), Some(Protocol::Mcp));
        assert!(found.mcp && found.keys.is_empty());
        let retry = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","requestState":"s-1","inputResponses":{}}}"#;
        let found = of_request(&h, Present::ALL, Some(retry), None);
        assert!(found.mcp && !found.a2a);
        assert_eq!(keys(&found), [(Kind::RequestState, "s-1")]);
        // `tools/list` takes no state; `protocol: a2a` does not read MCP.
        let list =
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"requestState":"s"}}"#;
        assert_eq!(
            of_request(&h, Present::ALL, Some(list), None),
            Found::default()
        );
        assert_eq!(
            of_request(&h, Present::ALL, Some(retry), Some(Protocol::A2a)),
            Found::default()
        );
        let asks = br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{},"requestState":"s-2"}}"#;
        assert_eq!(
            of_mcp_response(asks),
            Some(vec![(Kind::RequestState, "s-2".into())])
        );
        let done = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;
        assert_eq!(of_mcp_response(done), Some(vec![]));
        let error = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#;
        assert_eq!(of_mcp_response(error), None);
        assert_eq!(of_mcp_response(b"{\"result\": oops"), None);
    }

    #[test]
    fn a2a_answers_name_what_they_created() {
        let task = br#"{"jsonrpc":"2.0","id":1,"result":{"kind":"task","id":"a-1","contextId":"c-1","status":{"state":"completed"}}}"#;
        assert_eq!(
            of_a2a_response(task),
            Some(vec![
                (Kind::Task, "a-1".into()),
                (Kind::Context, "c-1".into())
            ])
        );
        // A Message's id is its message id, not a task's.
        let message = br#"{"jsonrpc":"2.0","id":1,"result":{"kind":"message","messageId":"m","id":"m","contextId":"c-2"}}"#;
        assert_eq!(
            of_a2a_response(message),
            Some(vec![(Kind::Context, "c-2".into())])
        );
        let v1 =
            br#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","contextId":"c","status":{}}}}"#;
        assert_eq!(
            of_a2a_response(v1),
            Some(vec![(Kind::Task, "t".into()), (Kind::Context, "c".into())])
        );
        let event = br#"{"jsonrpc":"2.0","id":1,"result":{"kind":"status-update","taskId":"t","contextId":"c"}}"#;
        assert_eq!(
            of_a2a_response(event),
            Some(vec![(Kind::Task, "t".into()), (Kind::Context, "c".into())])
        );
        let error = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-1}}"#;
        assert_eq!(of_a2a_response(error), None);
        assert_eq!(of_a2a_response(b"not json"), None);
        assert_eq!(of_a2a_response(br#"{"result":{"id":"t"}}"#), None);
    }

    #[test]
    fn a_streams_first_event_is_its_data_lines() {
        assert_eq!(first_event(b"event: x\ndata: {\"a\":1}"), None);
        let data = first_event(b"id: 1\ndata: {\"a\":\ndata: 1}\n\ndata: next\n\n");
        assert_eq!(data.as_deref(), Some(&b"{\"a\":\n1}\n"[..]));
        let crlf = first_event(b"data: x\r\n\r\n");
        assert_eq!(crlf.as_deref(), Some(&b"x\n"[..]));
    }
}
