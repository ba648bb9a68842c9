//! A minimal A2A-shaped agent for tests and examples: an agent card whose skills change at run
//! time, and JSON-RPC `message/send` / `tasks/get` over `POST /`, remembering which tasks and
//! contexts it holds so a test can tell which instance served a follow-up.
//!
//! It speaks just enough of A2A for agent-reach's card import and affinity: no streaming, no push
//! notifications, every task completes at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use agent_reach::http::{body, ReachBody};

/// Where an A2A agent publishes its card.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// JSON-RPC error code A2A uses when the task is not known to this agent.
pub const TASK_NOT_FOUND: i64 = -32001;

/// One skill of the card.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct A2aSkill {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

impl A2aSkill {
    /// A skill whose name and description are derived from its id.
    pub fn new(id: &str, tags: &[&str]) -> Self {
        Self {
            id: id.to_owned(),
            name: id.to_owned(),
            description: format!("the {id} skill"),
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
        }
    }
}

/// One JSON-RPC call the agent answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Served {
    pub method: String,
    /// The task the call created, continued or read; `None` when it was not found.
    pub task_id: Option<String>,
    pub context_id: Option<String>,
}

#[derive(Debug, Clone)]
struct Task {
    context_id: String,
    /// The text of every message the task received, in order.
    history: Vec<String>,
}

#[derive(Debug)]
struct State {
    name: String,
    url: String,
    skills: Mutex<Vec<A2aSkill>>,
    streaming: Mutex<bool>,
    tasks: Mutex<HashMap<String, Task>>,
    served: Mutex<Vec<Served>>,
    stop: CancellationToken,
}

/// A running A2A-shaped agent.
#[derive(Debug)]
pub struct A2aAgent {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl A2aAgent {
    /// Binds `listen` (port 0 for any); the agent is named `a2a-<port>`.
    pub async fn start(listen: SocketAddr, skills: Vec<A2aSkill>) -> std::io::Result<Self> {
        Self::start_named(listen, None, skills).await
    }

    /// Like [`A2aAgent::start`] with a chosen name.
    pub async fn start_named(
        listen: SocketAddr,
        name: Option<&str>,
        skills: Vec<A2aSkill>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            name: name.map_or_else(|| format!("a2a-{}", addr.port()), str::to_owned),
            url: format!("http://{addr}/"),
            skills: Mutex::new(skills),
            streaming: Mutex::new(false),
            tasks: Mutex::new(HashMap::new()),
            served: Mutex::new(Vec::new()),
            stop: CancellationToken::new(),
        });
        let task = tokio::spawn(serve(listener, state.clone()));
        Ok(Self { addr, state, task })
    }

    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// Replaces the card's skills; the next card read sees them.
    pub fn set_skills(&self, skills: Vec<A2aSkill>) {
        *lock(&self.state.skills) = skills;
    }

    /// Sets the card's `capabilities.streaming`.
    pub fn set_streaming(&self, streaming: bool) {
        *lock(&self.state.streaming) = streaming;
    }

    /// The card as served now.
    pub fn card(&self) -> Value {
        self.state.card()
    }

    /// Every JSON-RPC call answered so far, in order.
    pub fn served(&self) -> Vec<Served> {
        lock(&self.state.served).clone()
    }

    /// Whether this agent holds the task.
    pub fn holds(&self, task_id: &str) -> bool {
        lock(&self.state.tasks).contains_key(task_id)
    }

    /// Stops the agent and waits until its port is closed.
    pub async fn stop(mut self) {
        self.state.stop.cancel();
        let _ = (&mut self.task).await;
    }
}

impl Drop for A2aAgent {
    fn drop(&mut self) {
        self.state.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn card(&self) -> Value {
        let skills: Vec<Value> = lock(&self.skills)
            .iter()
            .map(|s| {
                json!({
                    "id": s.id, "name": s.name, "description": s.description, "tags": s.tags,
                    "examples": [format!("use {}", s.id)],
                    "inputModes": ["text/plain"], "outputModes": ["text/plain"],
                })
            })
            .collect();
        json!({
            "protocolVersion": "0.3.0",
            "name": self.name,
            "description": format!("{}: a minimal A2A-shaped agent", self.name),
            "url": self.url,
            "preferredTransport": "JSONRPC",
            "additionalInterfaces": [{ "url": self.url, "transport": "JSONRPC" }],
            "version": "1.0.0",
            "capabilities": { "streaming": *lock(&self.streaming), "pushNotifications": false },
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain", "application/json"],
            "skills": skills,
        })
    }

    fn record(&self, method: &str, task_id: Option<&str>, context_id: Option<&str>) {
        lock(&self.served).push(Served {
            method: method.to_owned(),
            task_id: task_id.map(str::to_owned),
            context_id: context_id.map(str::to_owned),
        });
    }

    /// `message/send`: continues the message's task when this agent holds it, else starts one.
    fn send(&self, params: &Value) -> Result<Value, (i64, String)> {
        let message = params.get("message").unwrap_or(&Value::Null);
        let text = message
            .get("parts")
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let asked_task = message.get("taskId").and_then(Value::as_str);
        let asked_context = message.get("contextId").and_then(Value::as_str);
        let mut tasks = lock(&self.tasks);
        let (id, task) = match asked_task {
            Some(id) => match tasks.get_mut(id) {
                Some(task) => {
                    task.history.push(text);
                    (id.to_owned(), task.clone())
                }
                None => {
                    drop(tasks);
                    self.record("message/send", None, asked_context);
                    return Err((TASK_NOT_FOUND, format!("task {id} not found")));
                }
            },
            None => {
                let id = format!("task-{:032x}", rand::random::<u128>());
                let context_id = asked_context.map_or_else(
                    || format!("ctx-{:032x}", rand::random::<u128>()),
                    str::to_owned,
                );
                let task = Task {
                    context_id,
                    history: vec![text],
                };
                tasks.insert(id.clone(), task.clone());
                (id, task)
            }
        };
        drop(tasks);
        self.record("message/send", Some(&id), Some(&task.context_id));
        Ok(self.task_json(&id, &task))
    }

    /// `tasks/get`: the task when this agent holds it, else TaskNotFound.
    fn get(&self, params: &Value) -> Result<Value, (i64, String)> {
        let id = params.get("id").and_then(Value::as_str).unwrap_or_default();
        let task = lock(&self.tasks).get(id).cloned();
        match task {
            Some(task) => {
                self.record("tasks/get", Some(id), Some(&task.context_id));
                Ok(self.task_json(id, &task))
            }
            None => {
                self.record("tasks/get", None, None);
                Err((TASK_NOT_FOUND, format!("task {id} not found")))
            }
        }
    }

    fn task_json(&self, id: &str, task: &Task) -> Value {
        let history: Vec<Value> = task
            .history
            .iter()
            .map(|text| json!({ "role": "user", "kind": "message", "parts": [{ "kind": "text", "text": text }] }))
            .collect();
        json!({
            "kind": "task",
            "id": id,
            "contextId": task.context_id,
            "status": { "state": "completed" },
            "history": history,
            "artifacts": [{
                "artifactId": format!("{id}-answer"),
                "parts": [{ "kind": "text", "text": format!("{} answered turn {}", self.name, task.history.len()) }],
                "metadata": { "agent": self.name },
            }],
            "metadata": { "agent": self.name },
        })
    }
}

async fn serve(listener: TcpListener, state: Arc<State>) {
    let stop = state.stop.clone();
    super::serve_until(listener, stop, move |req| {
        let state = state.clone();
        async move { handle(&state, req).await }
    })
    .await;
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<ReachBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, CARD_PATH) => respond(StatusCode::OK, &state.card()),
        (&Method::GET, "/healthz") => respond(StatusCode::OK, &json!({ "status": "ok" })),
        (&Method::POST, _) => {
            let request: Value = match req.into_body().collect().await {
                Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or(Value::Null),
                Err(_) => Value::Null,
            };
            respond(StatusCode::OK, &rpc(state, &request))
        }
        _ => respond(StatusCode::NOT_FOUND, &json!({ "error": "not found" })),
    }
}

/// One JSON-RPC request to its response object.
fn rpc(state: &State, request: &Value) -> Value {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let params = request.get("params").unwrap_or(&Value::Null);
    let outcome = match request.get("method").and_then(Value::as_str) {
        Some("message/send" | "SendMessage") => state.send(params),
        Some("tasks/get" | "GetTask") => state.get(params),
        Some(other) => Err((-32601, format!("method {other} not found"))),
        None => Err((-32600, "invalid request".to_owned())),
    };
    match outcome {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err((code, message)) => {
            json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
        }
    }
}

fn respond(status: StatusCode, value: &Value) -> Response<ReachBody> {
    let mut r = Response::new(body::full(value.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State {
            name: "a".into(),
            url: "http://127.0.0.1:1/".into(),
            skills: Mutex::new(vec![A2aSkill::new("sql", &["db"])]),
            streaming: Mutex::new(false),
            tasks: Mutex::new(HashMap::new()),
            served: Mutex::new(Vec::new()),
            stop: CancellationToken::new(),
        }
    }

    #[test]
    fn send_then_get_and_a_second_turn_keep_the_task() {
        let s = state();
        let first = rpc(
            &s,
            &json!({"jsonrpc": "2.0", "id": 1, "method": "message/send",
                "params": {"message": {"role": "user", "parts": [{"kind": "text", "text": "hi"}], "contextId": "c1"}}}),
        );
        let task = &first["result"];
        assert_eq!(task["contextId"], "c1");
        assert_eq!(task["status"]["state"], "completed");
        let id = task["id"].as_str().unwrap_or_default().to_owned();
        let got = rpc(
            &s,
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": id}}),
        );
        assert_eq!(got["result"]["id"], id.as_str());
        let second = rpc(
            &s,
            &json!({"jsonrpc": "2.0", "id": 3, "method": "message/send",
                "params": {"message": {"parts": [{"kind": "text", "text": "again"}], "taskId": id, "contextId": "c1"}}}),
        );
        assert_eq!(
            second["result"]["history"].as_array().map(Vec::len),
            Some(2)
        );
        let missing = rpc(
            &s,
            &json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": {"id": "nope"}}),
        );
        assert_eq!(missing["error"]["code"], TASK_NOT_FOUND);
        assert_eq!(lock(&s.served).len(), 4);
        assert_eq!(s.card()["skills"][0]["id"], "sql");
    }
}
