//! The vendors' SDKs in their default configurations through a fleet built as the docs build
//! one: strict mTLS (`DevCa`), gossip, `agent.mcp` / `agent.a2a`, and a caller-only sidecar.
//! MCP: two TypeScript servers with sessions, a stateless TypeScript server and a fastmcp server
//! (sessions) behind one capability; twenty TypeScript clients connect to the path-prefix URL
//! with the SDK's default transport, list the fleet's tools, call every one (progress streamed),
//! and close. A2A: two a2a-js agents serving JSON-RPC at `/a2a/jsonrpc`; the a2a-js client and
//! google-adk's `RemoteA2aAgent` discover the card as the sidecar serves it and hold a second
//! turn on the first turn's agent. Pinned in `tests/sdk/js/package.json` and
//! `tests/sdk/requirements.txt`; skipped outside CI when they cannot be installed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_reach::config::{A2aConfig, ConfigPaths, HumanDuration, McpConfig, MtlsMode, Policy};
use agent_reach::pki::DevCa;
use agent_reach::{Bootstrap, Sidecar};
use serde_json::Value;

use support::sdk::{js_sdks, repo, venv_python, Sdk};
use support::*;

const MCP: &str = "tools";
const SKILL: &str = "echo";
const CLIENTS: usize = 20;
/// (name, how it is built, its tools).
const MCP_SERVERS: [(&str, &str, &[&str]); 4] = [
    ("ts-session-1", "stateful", &["whoami", "add", "count"]),
    ("ts-session-2", "stateful", &["whoami", "multiply"]),
    ("ts-stateless", "stateless", &["add", "multiply"]),
    ("fastmcp", "fastmcp", &["whoami", "subtract"]),
];
const A2A_AGENTS: [&str; 2] = ["js-a2a-1", "js-a2a-2"];
const WAIT: Duration = Duration::from_secs(30);

struct Pod {
    name: &'static str,
    _agent: Sdk,
    port: u16,
    _sidecar: Sidecar,
}

fn spiffe(name: &str) -> String {
    format!("spiffe://sdk-js.test/ns/agents/sa/{name}")
}

fn strict_policy() -> Policy {
    let mut p = Policy::default();
    p.mtls.mode = Some(MtlsMode::Strict);
    p
}

/// A sidecar for `name` on the fleet's gossip and CA, fast enough for a test.
fn bootstrap(name: &str, agent: SocketAddr, fleet: &FleetFiles, seeds: &[SocketAddr]) -> Bootstrap {
    let mut b = Bootstrap::local(name, agent, &[])
        .unwrap()
        .with_gossip(seeds, fleet.key.clone());
    if let Some(g) = b.gossip.as_mut() {
        g.probe_interval = HumanDuration::from_millis(200);
        g.probe_timeout = HumanDuration::from_millis(100);
        g.suspect_timeout = HumanDuration::from_secs(1);
        g.refresh_interval = HumanDuration::from_millis(300);
    }
    b.tls = Some(
        fleet
            .ca
            .write_files(&fleet.dir.join(name), &spiffe(name))
            .unwrap(),
    );
    b
}

struct FleetFiles {
    dir: PathBuf,
    key: PathBuf,
    ca: DevCa,
}

/// `agent` (listening on `port`) behind a sidecar that joins the fleet, its agent section set
/// by `tune`; the sidecar's gossip address becomes a seed for the next.
async fn join(
    files: &FleetFiles,
    seeds: &mut Vec<SocketAddr>,
    (name, agent, port): (&'static str, Sdk, u16),
    tune: impl FnOnce(&mut Bootstrap),
) -> Pod {
    let mut b = bootstrap(name, SocketAddr::from(([127, 0, 0, 1], port)), files, seeds);
    tune(&mut b);
    let sidecar = sidecar_with(b, strict_policy(), ConfigPaths::default()).await;
    seeds.extend(sidecar.addrs.gossip);
    Pod {
        name,
        _agent: agent,
        port,
        _sidecar: sidecar,
    }
}

async fn start_agent(
    program: &Path,
    script: &Path,
    args: &[&str],
    dir: &Path,
    name: &str,
) -> (Sdk, u16) {
    let mut agent = Sdk::spawn(program, script, args, dir, name);
    let port = agent.next_json(WAIT, name).await["port"].as_u64().unwrap();
    (agent, u16::try_from(port).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_in_their_default_configurations_work_through_the_mesh() {
    let (Some(js), Some(python)) = (js_sdks().await, venv_python().await) else {
        return;
    };
    let node = PathBuf::from("node");
    let dir = std::env::temp_dir().join(format!("agent-reach-sdk-js-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("gossip.key");
    std::fs::write(&key, "cd".repeat(32)).unwrap();
    let files = FleetFiles {
        dir: dir.clone(),
        key,
        ca: DevCa::new("sdk-js test CA").unwrap(),
    };

    let mut pods: Vec<Pod> = Vec::new();
    let mut seeds: Vec<SocketAddr> = Vec::new();
    for (name, kind, tools) in MCP_SERVERS {
        let (agent, port) = match kind {
            "fastmcp" => {
                let script = repo().join("tests/sdk/fastmcp_agent.py");
                start_agent(&python, &script, &[name], &dir, name).await
            }
            _ => {
                let mut args = vec![name, kind];
                args.extend_from_slice(tools);
                start_agent(&node, &js.join("mcp_server.mjs"), &args, &dir, name).await
            }
        };
        let pod = join(&files, &mut seeds, (name, agent, port), |b| {
            b.agent.mcp = Some(McpConfig {
                capability: agent_reach::config::Name::parse(MCP).unwrap(),
                refresh: HumanDuration::from_secs(1),
                ..McpConfig::default()
            });
        });
        pods.push(pod.await);
    }
    for name in A2A_AGENTS {
        let (agent, port) =
            start_agent(&node, &js.join("a2a_agent.mjs"), &[name, SKILL], &dir, name).await;
        let pod = join(&files, &mut seeds, (name, agent, port), |b| {
            b.agent.a2a = Some(A2aConfig::default());
        });
        pods.push(pod.await);
    }
    // The caller-only sidecar: no agent behind it (docs/callers.md).
    let caller_b = bootstrap(
        "caller",
        SocketAddr::from(([127, 0, 0, 1], 9)),
        &files,
        &seeds,
    );
    let caller = sidecar_with(caller_b, strict_policy(), ConfigPaths::default()).await;
    let out = caller.addrs.outbound;

    // The fleet is ready when the caller lists every server's tools and knows the A2A skill.
    let all_tools = ["add", "count", "multiply", "subtract", "whoami"];
    eventually(WAIT, "the caller lists every server's tools", || async {
        let request = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        let reply = send(
            &client(),
            "POST",
            &format!("http://{out}/.reach/{MCP}/mcp"),
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
            ],
            request,
        )
        .await;
        let listed: Vec<String> = serde_json::from_str::<Value>(&reply.body)
            .ok()
            .and_then(|v| v["result"]["tools"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect();
        all_tools.iter().all(|t| listed.iter().any(|l| l == t))
            && caller
                .status()
                .peers
                .iter()
                .any(|p| p.capabilities.iter().any(|c| c == SKILL))
    })
    .await;

    // MCP: twenty TypeScript clients, default transport, one after another.
    let mcp_url = format!("http://{out}/.reach/{MCP}/mcp");
    let mut clients = Sdk::spawn(
        &node,
        &js.join("mcp_clients.mjs"),
        &[&mcp_url, &CLIENTS.to_string()],
        &dir,
        "mcp-clients",
    );
    let found = clients
        .next_json(Duration::from_secs(120), "the TypeScript clients")
        .await;
    let context = format!("{found:#}\n{}", clients.stderr());
    assert_eq!(found["connected"], CLIENTS, "{context}");
    assert_eq!(
        found["failures"].as_array().map(Vec::len),
        Some(0),
        "{context}"
    );
    let mut answered_by: BTreeMap<String, usize> = BTreeMap::new();
    for one in found["clients"].as_array().unwrap() {
        assert_eq!(one["tools"], serde_json::json!(all_tools), "{context}");
        assert!(
            one["session"]
                .as_str()
                .is_some_and(|s| s.starts_with("reach-")),
            "{context}"
        );
        for (tool, call) in one["calls"].as_object().unwrap() {
            let text = call["text"].as_str().unwrap_or_default();
            let server = text.split_whitespace().next().unwrap_or_default();
            let having: Vec<&str> = MCP_SERVERS
                .iter()
                .filter(|(_, _, tools)| tools.contains(&tool.as_str()))
                .map(|(n, ..)| *n)
                .collect();
            assert!(
                having.contains(&server),
                "{tool} answered by {server:?}: {context}"
            );
            assert_ne!(call["isError"], true, "{context}");
            *answered_by.entry(format!("{tool}@{server}")).or_default() += 1;
        }
        // Progress streamed as it was made, before the answer.
        let count = &one["calls"]["count"];
        let progress = count["progress"].as_array().unwrap();
        assert_eq!(progress.len(), 3, "{context}");
        let first = progress[0]["at"].as_f64().unwrap();
        assert!(
            count["ended"].as_f64().unwrap() - first >= 300.0,
            "{context}"
        );
    }
    // The Python SDK's clients, in both its revisions, against the same mixed fleet.
    let mut matrix = vec![format!("TypeScript 2025-11-25: {CLIENTS}/{CLIENTS}")];
    for mode in ["legacy", "2026-07-28"] {
        let script = repo().join("tests/sdk/mcp_clients.py");
        let mut py = Sdk::spawn(
            &python,
            &script,
            &[&mcp_url, "5", mode],
            &dir,
            &format!("py-{mode}"),
        );
        let found = py
            .next_json(Duration::from_secs(120), "the Python clients")
            .await;
        let context = format!("{found:#}\n{}", py.stderr());
        assert_eq!(found["connected"], 5, "{context}");
        for one in found["clients"].as_array().unwrap() {
            assert_eq!(one["tools"], serde_json::json!(all_tools), "{context}");
            for (tool, call) in one["calls"].as_object().unwrap() {
                assert_ne!(call["isError"], true, "{tool}: {context}");
                *answered_by
                    .entry(format!("{tool}@{}", first_word(&call["text"])))
                    .or_default() += 1;
            }
        }
        let revision = found["clients"][0]["protocol"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        matrix.push(format!("Python mcp {revision}: 5/5"));
    }
    // Every client ended its sessions: a session server holds at most the importer's and the
    // caller's own.
    for pod in pods.iter().filter(|p| p.name.starts_with("ts-session")) {
        let open = open_sessions(pod.port);
        assert!(open <= 2, "{}: {open} sessions open", pod.name);
    }
    // The per-tool series counted every call, streamed answers included.
    let metrics = get(&client(), &format!("http://{}/metrics", caller.addrs.admin))
        .await
        .body;
    for tool in all_tools {
        let ok = sum(
            &metrics,
            "reach_mcp_tool_calls_total",
            &format!("tool=\"{tool}\""),
        );
        assert!(
            ok >= CLIENTS as f64,
            "{tool}: {ok} calls counted\n{metrics}"
        );
    }

    // A2A: the card as the sidecar serves it, from a plain URL.
    let card_url = format!("http://{out}/.reach/{SKILL}/.well-known/agent-card.json");
    let mut a2a = Sdk::spawn(
        &node,
        &js.join("a2a_client.mjs"),
        &[&card_url],
        &dir,
        "a2a-client",
    );
    let js_turns = a2a.next_json(WAIT, "the a2a-js client").await;
    let context = format!("{js_turns:#}\n{}", a2a.stderr());
    assert_eq!(
        js_turns["interface"],
        format!("http://{out}/.reach/{SKILL}/a2a/jsonrpc"),
        "{context}"
    );
    let holder = check_turns(&js_turns, &context);
    let mut adk = Sdk::spawn(
        &python,
        &repo().join("tests/sdk/adk_client.py"),
        &[&card_url],
        &dir,
        "adk-client",
    );
    let adk_turns = adk.next_json(Duration::from_secs(60), "google-adk").await;
    let adk_holder = check_turns(&adk_turns, &format!("{adk_turns:#}\n{}", adk.stderr()));

    // The matrix, for the record (the closing note of the SDK issue quotes it).
    println!("MCP clients connected: {}", matrix.join(", "));
    println!("MCP tool@server calls: {answered_by:?}");
    println!("A2A: a2a-js client -> {holder} (card path /a2a/jsonrpc); google-adk -> {adk_holder}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sessions a TypeScript server holds now (`/sessions` of `tests/sdk/js/mcp_server.mjs`),
/// asked over HTTP/1.1 as Node's server wants it.
fn open_sessions(port: u16) -> u64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let json: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    json["open"].as_u64().unwrap()
}

/// The first word of an answer's text: the server that ran the tool.
fn first_word(text: &Value) -> String {
    let text = text.as_str().unwrap_or_default();
    text.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Two turns answered by one agent, the second its turn 2: the agent's name.
fn check_turns(turns: &Value, context: &str) -> String {
    let first = turns["first"].as_str().unwrap_or_default();
    let second = turns["second"].as_str().unwrap_or_default();
    let holder = first
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(A2A_AGENTS.contains(&holder.as_str()), "{context}");
    assert_eq!(first, format!("{holder} turn 1"), "{context}");
    assert_eq!(second, format!("{holder} turn 2"), "{context}");
    holder
}
