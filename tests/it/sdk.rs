//! The official Python SDKs (`a2a-sdk`, `mcp`; pinned in `tests/sdk/requirements.txt`) against a
//! real fleet in strict mTLS: two A2A agents and two MCP servers, each a Python process behind its
//! own sidecar, and the SDK clients (`tests/sdk/client.py`) calling through a caller's sidecar.
//! Card discovery, send, stream, a multi-turn context and every follow-up of a live task stay on
//! the holder; MCP works over both revisions with progress and session continuity; then the
//! holders are killed and each SDK sees its own protocol's answer (`docs/affinity.md`).
//!
//! `tests/sdk/venv.sh` builds `target/sdk-venv` on first use; the test skips only when the
//! package index is unreachable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_reach::config::{ConfigPaths, MtlsMode, Policy};
use agent_reach::identity::SpiffeId;
use agent_reach::pki::DevCa;
use agent_reach::{Bootstrap, Sidecar};
use serde_json::Value;

use support::sdk::{repo, venv_python, Sdk as Py};
use support::sidecar_with;

const A2A: &str = "chat";
const MCP: &str = "tools";
const A2A_AGENTS: [&str; 2] = ["a1", "a2"];
const MCP_AGENTS: [&str; 2] = ["m1", "m2"];
/// The whole client run, both phases: well under a minute once the venv exists.
const CLIENT_DEADLINE: Duration = Duration::from_secs(60);

/// An SDK agent process behind its own sidecar.
struct Pod {
    name: &'static str,
    agent: Py,
    sidecar: Option<Sidecar>,
}

struct Fleet {
    pods: Vec<Pod>,
    caller: Sidecar,
    logs: PathBuf,
}

fn spiffe(name: &str) -> String {
    format!("spiffe://sdk.test/ns/agents/sa/{name}")
}

/// Strict mTLS between every pair of sidecars, with certificates from one CA.
fn strict(mut b: Bootstrap, ca: &DevCa, dir: &Path, name: &str) -> Bootstrap {
    b.tls = Some(ca.write_files(&dir.join(name), &spiffe(name)).unwrap());
    b
}

fn strict_policy() -> Policy {
    let mut p = Policy::default();
    p.mtls.mode = Some(MtlsMode::Strict);
    p
}

impl Fleet {
    async fn start(python: &Path) -> Self {
        let dir = std::env::temp_dir().join(format!("agent-reach-sdk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ca = DevCa::new("sdk test CA").unwrap();
        let kinds = A2A_AGENTS
            .iter()
            .map(|n| (*n, "a2a_agent.py", A2A))
            .chain(MCP_AGENTS.iter().map(|n| (*n, "mcp_agent.py", MCP)));
        // All four start at once: importing the SDKs is most of a second each.
        let agents: Vec<_> = kinds
            .map(|(name, script, capability)| {
                let agent = Py::spawn(
                    python,
                    &repo().join("tests/sdk").join(script),
                    &[name],
                    &dir,
                    name,
                );
                (name, capability, agent)
            })
            .collect();
        let mut pods = Vec::new();
        let mut caller =
            Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
        for (name, capability, mut agent) in agents {
            let port = agent.next_json(Duration::from_secs(30), name).await["port"]
                .as_u64()
                .unwrap();
            let address = SocketAddr::from(([127, 0, 0, 1], u16::try_from(port).unwrap()));
            let b = Bootstrap::local(name, address, &[capability]).unwrap();
            let sidecar = sidecar_with(
                strict(b, &ca, &dir, name),
                strict_policy(),
                ConfigPaths::default(),
            )
            .await;
            caller = caller
                .with_peer(name, sidecar.addrs.inbound, &[capability])
                .unwrap();
            caller.peers.last_mut().unwrap().identity =
                Some(SpiffeId::parse(&spiffe(name)).unwrap());
            pods.push(Pod {
                name,
                agent,
                sidecar: Some(sidecar),
            });
        }
        let caller = sidecar_with(
            strict(caller, &ca, &dir, "caller"),
            strict_policy(),
            ConfigPaths::default(),
        )
        .await;
        Fleet {
            pods,
            caller,
            logs: dir,
        }
    }

    fn pod(&mut self, name: &str) -> &mut Pod {
        self.pods
            .iter_mut()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no agent named {name:?}"))
    }
}

/// `value` as a string, for comparisons that name what they looked at.
fn s(value: &Value) -> &str {
    value.as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_work_through_a_strict_mtls_fleet() {
    let Some(python) = venv_python().await else {
        return;
    };
    let mut fleet = Fleet::start(&python).await;
    let outbound = fleet.caller.addrs.outbound.port().to_string();
    let mut client = Py::spawn(
        &python,
        &repo().join("tests/sdk/client.py"),
        &[&outbound, A2A, MCP],
        &fleet.logs,
        "client",
    );
    let deadline = tokio::time::Instant::now() + CLIENT_DEADLINE;
    let left = || deadline.saturating_duration_since(tokio::time::Instant::now());

    let kill = client.next_json(left(), "the client's first phase").await;
    assert_eq!(kill["phase"], "kill", "{kill}");
    let (a2a_holder, mcp_holder) = (s(&kill["a2a_holder"]), s(&kill["mcp_holder"]));
    assert!(A2A_AGENTS.contains(&a2a_holder), "{kill}");
    assert!(MCP_AGENTS.contains(&mcp_holder), "{kill}");
    // The A2A agent crashes (its sidecar answers for it); the MCP holder's whole pod goes.
    fleet.pod(a2a_holder).agent.kill();
    let pod = fleet.pod(mcp_holder);
    pod.agent.kill();
    pod.sidecar.take().unwrap().kill().await;
    client.say("killed");

    let done = client.next_json(left(), "the client's findings").await;
    assert_eq!(done["phase"], "done", "{done}");
    let f = &done["findings"];
    let context = format!("{f:#}\n{}", client.stderr());
    check_a2a(&f["a2a"], &context);
    check_a2a_lost(&f["a2a_lost"], a2a_holder, &context);
    check_mcp(&f["mcp"], &context);
    check_mcp_lost(&f["mcp_lost"], mcp_holder, &context);
    // Passed: the certificates and logs are of no more use (a failure keeps them to read).
    let _ = std::fs::remove_dir_all(&fleet.logs);
}

fn check_a2a(a2a: &Value, context: &str) {
    // The card came through the proxy, its interface pointed back at the proxy.
    let card = &a2a["card"];
    assert!(A2A_AGENTS.contains(&s(&card["agent"])), "card: {context}");
    assert_eq!(
        card["urls"],
        serde_json::json!([format!("http://{A2A}.reach/")]),
        "{context}"
    );

    let send = &a2a["send"];
    let holder = s(&send["agent"]);
    assert_eq!(send["state"], "TASK_STATE_COMPLETED", "send: {context}");
    assert_eq!(
        send["text"],
        format!("{holder} turn 1: hello"),
        "send: {context}"
    );
    // Two more turns in the context reach the agent that holds it.
    for (i, turn) in a2a["turns"].as_array().unwrap().iter().enumerate() {
        assert_eq!(turn["agent"], holder, "turn {}: {context}", i + 2);
        assert!(
            s(&turn["text"]).starts_with(&format!("{holder} turn {}:", i + 2)),
            "{context}"
        );
        assert_eq!(turn["context"], true, "{context}");
    }

    // The stream: its first event arrives before it ends (not buffered to the end).
    let stream = &a2a["stream"];
    let events = stream["events"].as_array().unwrap();
    assert!(events.len() >= 5, "stream: {context}");
    let first = events[0]["at"].as_f64().unwrap();
    let ended = stream["ended"].as_f64().unwrap();
    assert!(
        ended - first >= 0.6,
        "the first event came {first} s, the end {ended} s: {context}"
    );
    let agent = s(&stream["agent"]);
    let chunks: Vec<&str> = events
        .iter()
        .map(|e| s(&e["text"]))
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(
        chunks,
        [0, 1, 2].map(|i| format!("{agent} chunk {i}")),
        "{context}"
    );

    // Every follow-up of a live task reaches its holder, and is answered by it.
    let follow = &a2a["follow"];
    let holder = s(&follow["holder"]);
    assert!(A2A_AGENTS.contains(&holder), "{context}");
    // `return_immediately`: the task as the agent first published it, not yet finished.
    let state = s(&follow["state"]);
    assert!(
        ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"].contains(&state),
        "{context}"
    );
    let calls = follow["calls"].as_object().unwrap();
    for method in [
        "GetTask",
        "ListTasks",
        "SubscribeToTask",
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
        "CancelTask",
    ] {
        let tries = calls[method]
            .as_array()
            .unwrap_or_else(|| panic!("{method}: {context}"));
        for call in tries {
            assert_eq!(
                call["agent"], holder,
                "{method} reached another agent: {call}\n{context}"
            );
            assert!(
                call.get("error").is_none(),
                "{method} failed: {call}\n{context}"
            );
        }
    }
    let ok = |method: &str| calls[method][0]["ok"].clone();
    assert_eq!(ok("GetTask")["state"], "TASK_STATE_WORKING", "{context}");
    assert_eq!(ok("ListTasks")["found"], true, "{context}");
    assert_eq!(ok("SubscribeToTask"), "task", "{context}");
    assert_eq!(
        ok("CreateTaskPushNotificationConfig"),
        "hook-1",
        "{context}"
    );
    assert_eq!(
        ok("GetTaskPushNotificationConfig"),
        "http://127.0.0.1:9/push",
        "{context}"
    );
    assert_eq!(ok("ListTaskPushNotificationConfigs"), 1, "{context}");
    assert_eq!(ok("CancelTask"), "TASK_STATE_CANCELED", "{context}");
}

fn check_a2a_lost(lost: &Value, holder: &str, context: &str) {
    // The task's holder is gone: the SDK raises task-not-found, from a JSON-RPC -32001 that names
    // the holder, and the sidecar says why.
    for call in ["GetTask", "SendInContext", "ListTasks"] {
        let answer = &lost[call];
        assert_eq!(answer["type"], "TaskNotFoundError", "{call}: {context}");
        assert!(s(&answer["message"]).contains(holder), "{call}: {context}");
        let rpc = lost_answer(answer, 200, context);
        assert_eq!(rpc["error"]["code"], -32001, "{call}: {context}");
        assert_eq!(rpc["error"]["data"]["holder"], holder, "{call}: {context}");
    }
    let fresh = &lost["fresh"];
    let survivor = s(&fresh["agent"]);
    assert!(
        A2A_AGENTS.contains(&survivor) && survivor != holder,
        "{context}"
    );
    assert_eq!(
        fresh["text"],
        format!("{survivor} turn 1: fresh"),
        "{context}"
    );
}

/// The sidecar's `affinity_lost` answer to a call (its one POST; an MCP client's GET stream may
/// reconnect meanwhile): its status checked, its body as JSON.
fn lost_answer(answer: &Value, status: u16, context: &str) -> Value {
    let heads: Vec<&Value> = (answer["heads"].as_array().unwrap().iter())
        .filter(|h| h["method"] == "POST")
        .collect();
    assert_eq!(heads.len(), 1, "{context}");
    assert_eq!(heads[0]["status"], status, "{context}");
    assert_eq!(heads[0]["reason"], "affinity_lost", "{context}");
    serde_json::from_str(s(&heads[0]["body"])).unwrap_or_else(|e| panic!("{e}: {context}"))
}

/// One MCP round (`tools/list`, three `whoami`, a `count` with progress) on one agent.
fn check_mcp_round(round: &Value, session: bool, context: &str) -> String {
    assert_eq!(
        round["tools"],
        serde_json::json!(["count", "whoami"]),
        "{context}"
    );
    let calls = round["calls"].as_array().unwrap();
    let agent = s(&calls[0]["agent"]).to_owned();
    assert!(MCP_AGENTS.contains(&agent.as_str()), "{context}");
    for (i, call) in calls.iter().enumerate() {
        // A session's calls all reach the agent that holds it (another would not know it).
        let text = s(&call["text"]);
        let by = s(&call["agent"]);
        assert!(
            text.starts_with(&format!("{by} session ")),
            "{text}: {context}"
        );
        if session {
            assert_eq!(call["agent"], agent.as_str(), "{context}");
            assert!(
                text.ends_with(&format!(" call {}", i + 1)),
                "{text}: {context}"
            );
        }
    }
    // The streamed answer: progress arrives as it is made, before the result.
    let count = &round["count"];
    let counter = s(&count["agent"]);
    assert_eq!(count["text"], format!("{counter} counted 3"), "{context}");
    let progress = count["progress"].as_array().unwrap();
    assert_eq!(progress.len(), 3, "{context}");
    let first = progress[0]["at"].as_f64().unwrap();
    let ended = count["ended"].as_f64().unwrap();
    assert!(
        ended - first >= 0.3,
        "progress at {first} s, the end at {ended} s: {context}"
    );
    agent
}

fn check_mcp(mcp: &Value, context: &str) {
    let modern = &mcp["2026-07-28"];
    assert_eq!(modern["protocol"], "2026-07-28", "{context}");
    check_mcp_round(modern, false, context);
    let legacy = &mcp["legacy"];
    assert_eq!(legacy["protocol"], "2025-11-25", "{context}");
    let holder = check_mcp_round(legacy, true, context);
    assert_eq!(legacy["tools_agent"], holder.as_str(), "{context}");
    assert_eq!(legacy["count"]["agent"], holder.as_str(), "{context}");
}

fn check_mcp_lost(lost: &Value, holder: &str, context: &str) {
    // The open session's next call: 404 with a JSON-RPC error the SDK raises as such.
    let call = &lost["call"];
    assert_eq!(call["type"], "MCPError", "{context}");
    assert_eq!(call["data"]["holder"], holder, "{context}");
    let rpc = lost_answer(call, 404, context);
    assert_eq!(rpc["jsonrpc"], "2.0", "{context}");
    assert_eq!(rpc["error"]["code"], call["code"], "{context}");
    // Closing the lost session: its DELETE is answered 404, as for a session the server forgot.
    let close: Vec<&Value> = (lost["close"].as_array().unwrap().iter())
        .filter(|h| h["method"] == "DELETE")
        .collect();
    assert_eq!(close.len(), 1, "{context}");
    assert_eq!(close[0]["status"], 404, "{context}");
    assert!(lost.get("close_error").is_none(), "{context}");
    // A new session lands on the survivor and works, in both revisions.
    let survivor = check_mcp_round(&lost["again"], true, context);
    assert_ne!(survivor, holder, "{context}");
    assert_eq!(
        check_mcp_round(&lost["modern"], false, context),
        survivor,
        "{context}"
    );
}
