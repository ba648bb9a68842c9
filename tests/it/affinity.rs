//! Session affinity through a caller sidecar with three agents serving one capability: a
//! `reach-affinity` key, A2A conversations (send, `tasks/get`, a second turn in the context) and
//! MCP sessions each stay on the agent that holds them; a stopped holder is `affinity_lost`, or,
//! under `affinity: fallback`, replaced.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::config::{AffinityMode, CapabilityPolicy, ConfigPaths, Policy};
use agent_reach::{Bootstrap, Sidecar};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use support::{
    any_port, client, counter, eventually, get, send, sidecar, sidecar_with, Reply, CAP,
};

/// What a tiny A2A- and MCP-shaped agent holds: its tasks (id → context) and a counter.
#[derive(Default)]
struct Memory {
    tasks: HashMap<String, String>,
    n: usize,
}

/// An agent that answers A2A `message/send` with a Task `<name>-<n>` (in the message's context,
/// or a new one), `tasks/get` with a task it holds (else a JSON-RPC error), MCP `initialize` with
/// `Mcp-Session-Id: s-<name>`, and anything else with its name.
async fn stateful_agent(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let memory = Arc::new(Mutex::new(Memory::default()));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let memory = memory.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let memory = memory.clone();
                        async move {
                            let bytes = req.into_body().collect().await?.to_bytes();
                            Ok::<_, hyper::Error>(answer(name, &memory, &bytes))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn answer(name: &str, memory: &Mutex<Memory>, body: &[u8]) -> Response<Full<bytes::Bytes>> {
    let json = |v: Value| {
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::from(v.to_string()))
            .unwrap()
    };
    let Ok(rpc) = serde_json::from_slice::<Value>(body) else {
        return Response::new(Full::from(name.to_owned()));
    };
    let id = rpc["id"].clone();
    let mut memory = memory.lock().unwrap();
    let task = |task: &str, context: &str| {
        json!({"kind": "task", "id": task, "contextId": context,
               "status": {"state": "completed"}, "metadata": {"agent": name}})
    };
    match rpc["method"].as_str() {
        Some("message/send") => {
            memory.n += 1;
            let n = memory.n;
            let context = rpc["params"]["message"]["contextId"]
                .as_str()
                .map_or_else(|| format!("ctx-{name}-{n}"), str::to_owned);
            let id_ = format!("{name}-{n}");
            memory.tasks.insert(id_.clone(), context.clone());
            json(json!({"jsonrpc": "2.0", "id": id, "result": task(&id_, &context)}))
        }
        Some("message/stream") => {
            memory.n += 1;
            let id_ = format!("{name}-{}", memory.n);
            let context = format!("ctx-{id_}");
            memory.tasks.insert(id_.clone(), context.clone());
            let first = json!({"jsonrpc": "2.0", "id": id, "result": task(&id_, &context)});
            let last = json!({"jsonrpc": "2.0", "id": id, "result": {"kind": "status-update",
                "taskId": id_, "contextId": context, "final": true}});
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(Full::from(format!("data: {first}\n\ndata: {last}\n\n")))
                .unwrap()
        }
        Some("tasks/get") => {
            let wanted = rpc["params"]["id"].as_str().unwrap_or_default();
            match memory.tasks.get(wanted) {
                Some(context) => {
                    json(json!({"jsonrpc": "2.0", "id": id, "result": task(wanted, context)}))
                }
                None => json(json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32001, "message": format!("{name} has no task {wanted}")}})),
            }
        }
        Some("initialize") => {
            let mut response = json(json!({"jsonrpc": "2.0", "id": id, "result": {}}));
            response.headers_mut().insert(
                "mcp-session-id",
                http::HeaderValue::from_str(&format!("s-{name}")).unwrap(),
            );
            response
        }
        _ => json(json!({"jsonrpc": "2.0", "id": id, "result": {"agent": name}})),
    }
}

struct Fleet {
    callees: Vec<Option<Sidecar>>,
    caller: Sidecar,
}

impl Fleet {
    async fn start(policy: Policy) -> Self {
        let mut caller =
            Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
        let mut callees = Vec::new();
        for name in NAMES {
            let agent = stateful_agent(name).await;
            let callee = sidecar(Bootstrap::local(name, agent, &[CAP]).unwrap()).await;
            caller = caller
                .with_peer(name, callee.addrs.inbound, &[CAP])
                .unwrap();
            callees.push(Some(callee));
        }
        let caller = sidecar_with(caller, policy, ConfigPaths::default()).await;
        Fleet { callees, caller }
    }

    async fn call(&self, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut all = vec![("reach-capability", CAP)];
        all.extend_from_slice(headers);
        let url = format!("http://{}/a2a", self.caller.addrs.outbound);
        send(&client(), "POST", &url, &all, body).await
    }

    async fn rpc(&self, method: &str, params: Value) -> Reply {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        self.call(&[("content-type", "application/json")], &body.to_string())
            .await
    }

    async fn stop(&mut self, name: &str) {
        let i = NAMES.iter().position(|n| *n == name).unwrap();
        if let Some(callee) = self.callees[i].take() {
            callee.kill().await;
        }
    }

    async fn metric(&self, series: &str) -> u64 {
        let url = format!("http://{}/metrics", self.caller.addrs.admin);
        counter(&get(&client(), &url).await.body, series)
    }
}

const NAMES: [&str; 3] = ["a1", "a2", "a3"];

/// The agent that answered, by its sidecar's `reach-agent`.
fn agent(reply: &Reply) -> String {
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.header("reach-agent").to_owned()
}

fn with_mode(mode: AffinityMode) -> Policy {
    let mut policy = Policy::default();
    policy.capabilities.insert(
        CAP.to_owned(),
        CapabilityPolicy {
            affinity: mode,
            ..CapabilityPolicy::default()
        },
    );
    policy
}

#[tokio::test]
async fn a_reach_affinity_key_stays_with_its_agent() {
    let fleet = Fleet::start(Policy::default()).await;
    let mut holders = HashMap::new();
    for round in 0..8 {
        for key in ["k1", "k2", "k3", "k4"] {
            let reply = fleet.call(&[("reach-affinity", key)], "hello").await;
            let who = agent(&reply);
            let first = holders.entry(key).or_insert_with(|| who.clone());
            assert_eq!(*first, who, "round {round}: {key} moved");
        }
    }
    // Without a key, calls spread.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..30 {
        seen.insert(agent(&fleet.call(&[], "hello").await));
    }
    assert!(seen.len() > 1, "{seen:?}");
    assert!(fleet.metric("reach_affinity_hits_total{").await >= 28);
}

#[tokio::test]
async fn a2a_follow_ups_reach_the_agent_that_holds_the_task() {
    let fleet = Fleet::start(Policy::default()).await;
    let mut holders = std::collections::HashSet::new();
    for conversation in 0..9 {
        let message = json!({"message": {"role": "user", "messageId": format!("m{conversation}"),
                                         "parts": [{"kind": "text", "text": "hi"}]}});
        let first = fleet.rpc("message/send", message).await;
        let holder = agent(&first);
        holders.insert(holder.clone());
        let result = first.json()["result"].clone();
        let (task, context) = (
            result["id"].as_str().unwrap(),
            result["contextId"].as_str().unwrap(),
        );
        assert!(task.starts_with(&holder), "{task} from {holder}");
        for _ in 0..3 {
            let got = fleet.rpc("tasks/get", json!({"id": task})).await;
            assert_eq!(agent(&got), holder, "{}", got.body);
            assert_eq!(got.json()["result"]["id"], task, "{}", got.body);
            // A second turn in the same context, as a new task.
            let turn = json!({"message": {"role": "user", "messageId": "m", "contextId": context,
                                          "parts": [{"kind": "text", "text": "more"}]}});
            let next = fleet.rpc("message/send", turn).await;
            assert_eq!(agent(&next), holder, "{}", next.body);
            assert_eq!(next.json()["result"]["contextId"], context);
        }
    }
    // Nine first messages picked freely: more than one agent holds conversations.
    assert!(holders.len() > 1, "{holders:?}");
}

#[tokio::test]
async fn a_streamed_answer_binds_the_task_its_first_event_names() {
    streamed_answers_bind_their_tasks(Fleet::start(Policy::default()).await).await;
}

/// The same under a first-event deadline, for which the first event is read ahead: it is still
/// the body's, and the watcher still reads the task it names.
#[tokio::test]
async fn a_first_event_read_for_its_deadline_still_binds_its_task() {
    let mut policy = Policy::default();
    let deadline = serde_yaml::from_str("2s").expect("a duration");
    let capability = CapabilityPolicy {
        first_event_timeout: Some(deadline),
        ..CapabilityPolicy::default()
    };
    policy.capabilities.insert(CAP.to_owned(), capability);
    streamed_answers_bind_their_tasks(Fleet::start(policy).await).await;
}

async fn streamed_answers_bind_their_tasks(fleet: Fleet) {
    let message = json!({"message": {"role": "user", "messageId": "m", "parts": []}});
    for _ in 0..6 {
        let stream = fleet.rpc("message/stream", message.clone()).await;
        let holder = agent(&stream);
        let data = stream
            .body
            .lines()
            .next()
            .unwrap()
            .trim_start_matches("data: ");
        let first: Value = serde_json::from_str(data).unwrap();
        let task = first["result"]["id"].as_str().unwrap();
        for _ in 0..3 {
            let got = fleet.rpc("tasks/get", json!({"id": task})).await;
            assert_eq!(agent(&got), holder, "{}", got.body);
        }
    }
}

#[tokio::test]
async fn mcp_sessions_stay_with_the_agent_that_assigned_them() {
    let fleet = Fleet::start(Policy::default()).await;
    for _ in 0..6 {
        let init = fleet
            .rpc("initialize", json!({"protocolVersion": "2025-06-18"}))
            .await;
        let holder = agent(&init);
        let session = init.header("mcp-session-id").to_owned();
        assert_eq!(session, format!("s-{holder}"));
        for _ in 0..4 {
            let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
            let headers = [
                ("content-type", "application/json"),
                ("mcp-session-id", session.as_str()),
            ];
            let reply = fleet.call(&headers, &body).await;
            assert_eq!(agent(&reply), holder);
        }
    }
}

#[tokio::test]
async fn a_stopped_holder_is_affinity_lost_when_strict() {
    let mut fleet = Fleet::start(Policy::default()).await;
    let holder = agent(&fleet.call(&[("reach-affinity", "k1")], "hello").await);
    fleet.stop(&holder).await;
    for _ in 0..3 {
        let reply = fleet.call(&[("reach-affinity", "k1")], "hello").await;
        assert_eq!(reply.status, 503, "{reply:?}");
        assert_eq!(reply.header("reach-reason"), "affinity_lost");
        assert_eq!(reply.json()["holder"], holder.as_str());
    }
    // Calls without the key are not held back.
    assert_eq!(fleet.call(&[], "hello").await.status, 200);
    let lost = format!("reach_affinity_lost_total{{capability=\"{CAP}\"}}");
    assert!(fleet.metric(&lost).await >= 3);
}

#[tokio::test]
async fn a_stopped_holder_is_replaced_under_fallback() {
    let mut fleet = Fleet::start(with_mode(AffinityMode::Fallback)).await;
    let holder = agent(&fleet.call(&[("reach-affinity", "k1")], "hello").await);
    fleet.stop(&holder).await;
    let next = agent(&fleet.call(&[("reach-affinity", "k1")], "hello").await);
    assert_ne!(next, holder);
    // Rebound: the key stays with its new agent.
    for _ in 0..10 {
        let reply = fleet.call(&[("reach-affinity", "k1")], "hello").await;
        assert_eq!(agent(&reply), next);
    }
    // Until the new holder goes too.
    fleet.stop(&next).await;
    let (fleet, next) = (&fleet, &next);
    eventually(
        Duration::from_secs(5),
        "the key moves again",
        move || async move {
            let reply = fleet.call(&[("reach-affinity", "k1")], "hello").await;
            reply.status == 200 && reply.header("reach-agent") != next.as_str()
        },
    )
    .await;
}

/// A lost holder answers in the protocol's own terms. An MCP session whose
/// holder is out: `404` with a JSON-RPC error carrying the request's id (the client starts a new
/// session, which then works on a survivor); an A2A task whose holder is out: a JSON-RPC
/// `-32001` task-not-found naming the holder. `reach-reason: affinity_lost` stays on both
/// (before: a bare `503` either way).
#[tokio::test]
async fn a_lost_holder_answers_in_the_protocols_terms() {
    let mut fleet = Fleet::start(Policy::default()).await;
    let init = fleet
        .rpc("initialize", json!({"protocolVersion": "2025-06-18"}))
        .await;
    let mcp_holder = agent(&init);
    let session = init.header("mcp-session-id").to_owned();
    let message = json!({"message": {"role": "user", "messageId": "m1",
                                     "parts": [{"kind": "text", "text": "hi"}]}});
    // A task on the same agent as the session, so one stop loses both.
    let (task, a2a_holder) = loop {
        let sent = fleet.rpc("message/send", message.clone()).await;
        if agent(&sent) == mcp_holder {
            break (
                sent.json()["result"]["id"].as_str().unwrap().to_owned(),
                mcp_holder.clone(),
            );
        }
    };
    fleet.stop(&mcp_holder).await;

    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}).to_string();
    let mcp = |session: String| {
        let fleet = &fleet;
        let body = body.clone();
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("mcp-session-id", session.as_str()),
            ];
            fleet.call(&headers, &body).await
        }
    };
    let lost = mcp(session.clone()).await;
    assert_eq!(lost.status, 404, "{lost:?}");
    assert_eq!(lost.header("reach-reason"), "affinity_lost");
    let rpc = lost.json();
    assert_eq!(rpc["jsonrpc"], "2.0", "{rpc}");
    assert_eq!(rpc["id"], 7, "{rpc}");
    assert_eq!(rpc["error"]["code"], -32001, "{rpc}");
    assert_eq!(rpc["error"]["data"]["holder"], mcp_holder.as_str(), "{rpc}");
    // The client starts a new session: it lands on a survivor and its calls work.
    let again = fleet
        .rpc("initialize", json!({"protocolVersion": "2025-06-18"}))
        .await;
    let survivor = agent(&again);
    assert_ne!(survivor, mcp_holder);
    let next = mcp(again.header("mcp-session-id").to_owned()).await;
    assert_eq!(agent(&next), survivor);

    let got = fleet.rpc("tasks/get", json!({"id": task})).await;
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.header("reach-reason"), "affinity_lost");
    let rpc = got.json();
    assert_eq!(rpc["id"], 1, "{rpc}");
    assert_eq!(rpc["error"]["code"], -32001, "{rpc}");
    assert!(
        rpc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Task not found"),
        "{rpc}"
    );
    assert_eq!(rpc["error"]["data"]["holder"], a2a_holder.as_str(), "{rpc}");
}

/// An MCP `DELETE` of a session ends its binding: answered by the holder,
/// and the session id is no longer pinned to it (before: the binding stayed).
#[tokio::test]
async fn an_mcp_delete_ends_the_sessions_binding() {
    let fleet = Fleet::start(Policy::default()).await;
    let init = fleet
        .rpc("initialize", json!({"protocolVersion": "2025-06-18"}))
        .await;
    let holder = agent(&init);
    let session = init.header("mcp-session-id").to_owned();
    let entries = || fleet.metric("reach_affinity_entries");
    let before = entries().await;
    assert!(before >= 1, "the session is bound");
    let url = format!("http://{}/a2a", fleet.caller.addrs.outbound);
    let deleted = send(
        &client(),
        "DELETE",
        &url,
        &[
            ("reach-capability", CAP),
            ("mcp-session-id", session.as_str()),
        ],
        "",
    )
    .await;
    assert_eq!(agent(&deleted), holder, "the holder answers the DELETE");
    assert_eq!(entries().await, before - 1, "the binding is gone");
}

/// Every A2A follow-up that names a task reaches the agent that holds it, in
/// both naming generations and each way a method names its task (`id`, `taskId`, a resource
/// name). Before, `SubscribeToTask` and the push-config methods got no affinity and reached any
/// agent (the holder 9 of 12 times through the SDK).
#[tokio::test]
async fn every_a2a_follow_up_reaches_the_holder_of_its_task() {
    let fleet = Fleet::start(Policy::default()).await;
    let message = json!({"message": {"role": "user", "messageId": "m1",
                                     "parts": [{"kind": "text", "text": "hi"}]}});
    let first = fleet.rpc("message/send", message).await;
    let holder = agent(&first);
    let task = first.json()["result"]["id"].as_str().unwrap().to_owned();
    let config = json!({"id": "cfg-1", "url": "https://example.invalid/hook"});
    let follow_ups = [
        ("tasks/resubscribe", json!({"id": task})),
        ("SubscribeToTask", json!({"id": task})),
        ("SubscribeToTask", json!({"name": format!("tasks/{task}")})),
        ("tasks/cancel", json!({"id": task})),
        ("CancelTask", json!({"id": task})),
        (
            "tasks/pushNotificationConfig/set",
            json!({"taskId": task, "pushNotificationConfig": config}),
        ),
        (
            "CreateTaskPushNotificationConfig",
            json!({"parent": format!("tasks/{task}"), "configId": "cfg-1", "config": config}),
        ),
        (
            "tasks/pushNotificationConfig/get",
            json!({"id": task, "pushNotificationConfigId": "cfg-1"}),
        ),
        (
            "GetTaskPushNotificationConfig",
            json!({"name": format!("tasks/{task}/pushNotificationConfigs/cfg-1")}),
        ),
        ("tasks/pushNotificationConfig/list", json!({"id": task})),
        (
            "ListTaskPushNotificationConfig",
            json!({"parent": format!("tasks/{task}")}),
        ),
        (
            "tasks/pushNotificationConfig/delete",
            json!({"id": task, "pushNotificationConfigId": "cfg-1"}),
        ),
        (
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": task, "id": "cfg-1"}),
        ),
    ];
    for (method, params) in follow_ups {
        // Three agents: a method without affinity lands elsewhere at least once in four.
        for round in 0..4 {
            let reply = fleet.rpc(method, params.clone()).await;
            assert_eq!(
                agent(&reply),
                holder,
                "{method} {params} (round {round}) left the holder"
            );
        }
    }
}
