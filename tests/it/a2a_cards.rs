//! A2A agent cards as profiles: a sidecar with `agent.a2a` imports its agent's skills as
//! capabilities, callers route them, the card read through the outbound port names the proxy,
//! and a skill added to the card becomes routable across a gossip fleet.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_reach::config::{A2aConfig, HumanDuration, Proficiency};
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::a2a::{A2aAgent, A2aSkill};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(10);

fn key_file(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agent-reach-a2a-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gossip.key");
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, hex).unwrap();
    path
}

fn with_card(mut b: Bootstrap) -> Bootstrap {
    let mut config = A2aConfig {
        refresh: HumanDuration::from_millis(100),
        ..A2aConfig::default()
    };
    config
        .tags
        .insert("postgres".into(), Proficiency::clamped(0.95));
    b.agent.a2a = Some(config);
    b
}

fn fast_gossip(mut b: Bootstrap) -> Bootstrap {
    if let Some(g) = b.gossip.as_mut() {
        g.probe_interval = HumanDuration::from_millis(200);
        g.probe_timeout = HumanDuration::from_millis(100);
        g.suspect_timeout = HumanDuration::from_secs(1);
        g.refresh_interval = HumanDuration::from_millis(300);
    }
    b
}

async fn a2a_agent(name: &str, skills: Vec<A2aSkill>) -> A2aAgent {
    A2aAgent::start_named(any_port(), Some(name), skills)
        .await
        .expect("a2a agent starts")
}

/// The capabilities a sidecar publishes, from its self-view.
async fn published(s: &Sidecar) -> serde_json::Value {
    get(
        &client(),
        &format!("http://{}/reach/v1/self", s.addrs.inbound),
    )
    .await
    .json()["capabilities"]
        .clone()
}

fn named<'a>(caps: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    caps.as_array()?.iter().find(|c| c["name"] == name)
}

/// An A2A `message/send` for `capability` through a caller's outbound port.
async fn send_message(outbound: SocketAddr, capability: &str) -> Reply {
    let request = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "message/send",
        "params": { "message": { "role": "user", "messageId": "m1",
            "parts": [{ "kind": "text", "text": "hello" }] } }
    });
    send(
        &client(),
        "POST",
        &format!("http://{outbound}/"),
        &[
            ("reach-capability", capability),
            ("content-type", "application/json"),
        ],
        &request.to_string(),
    )
    .await
}

/// A GET in absolute form, as an A2A client with `HTTP_PROXY` pointed at the outbound port sends
/// it; the status and the body.
async fn proxied_get(outbound: SocketAddr, url: &str) -> (u16, String) {
    let authority = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default();
    let mut stream = tokio::net::TcpStream::connect(outbound).await.unwrap();
    let head = format!("GET {url} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_become_capabilities_that_callers_route_and_the_card_names_the_proxy() {
    let agent = a2a_agent(
        "sqlbot",
        vec![
            A2aSkill::new("sql-gen", &["sql", "postgres"]),
            A2aSkill::new("explain", &["sql"]),
            A2aSkill::new("Not A Name", &[]),
        ],
    )
    .await;
    agent.set_streaming(true);
    // `explain` is declared in the file too: the file's definition wins.
    let callee = sidecar(with_card(
        Bootstrap::local("sqlbot", agent.addr, &["explain"]).unwrap(),
    ))
    .await;
    eventually(WAIT, "the card's skills to be published", || async {
        named(&published(&callee).await, "sql-gen").is_some()
    })
    .await;
    let caps = published(&callee).await;
    let sql = named(&caps, "sql-gen").unwrap();
    assert_eq!(sql["tags"]["sql"], 0.8, "{sql}");
    assert_eq!(sql["tags"]["postgres"], 0.95, "{sql}");
    assert_eq!(sql["a2a"]["streaming"], true, "{sql}");
    assert_eq!(sql["a2a"]["input_modes"][0], "text/plain", "{sql}");
    let explain = named(&caps, "explain").unwrap();
    assert!(
        explain.get("a2a").is_none(),
        "declared, not imported: {explain}"
    );
    assert_eq!(caps.as_array().map(Vec::len), Some(2), "{caps}");

    let caller = sidecar(
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap()
            .with_peer("sqlbot", callee.addrs.inbound, &["sql-gen"])
            .unwrap(),
    )
    .await;
    let reply = send_message(caller.addrs.outbound, "sql-gen").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let task = &reply.json()["result"];
    assert_eq!(task["status"]["state"], "completed", "{task}");
    assert_eq!(task["metadata"]["agent"], "sqlbot");
    assert_eq!(agent.served().len(), 1);

    let (status, body) = proxied_get(
        caller.addrs.outbound,
        "http://sql-gen.reach/.well-known/agent-card.json",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let card: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(card["url"], "http://sql-gen.reach/", "{card}");
    assert_eq!(
        card["additionalInterfaces"][0]["url"], "http://sql-gen.reach/",
        "{card}"
    );
    assert_eq!(card["name"], "sqlbot");
    assert_eq!(agent.served().len(), 1, "the card is not a task");

    // From a plain base URL on the loopback listener (Node's fetch ignores HTTP_PROXY; google-adk
    // takes only https or loopback card URLs): the card points back at the same form.
    let base = format!("http://{}/.reach/sql-gen", caller.addrs.outbound);
    let host = caller.addrs.outbound.to_string();
    let card = send(
        &client(),
        "GET",
        &format!("{base}/.well-known/agent-card.json"),
        &[("host", host.as_str())],
        "",
    )
    .await;
    assert_eq!(card.status, 200, "{}", card.body);
    let card = card.json();
    assert_eq!(card["url"], format!("{base}/"), "{card}");
    let request = serde_json::json!({
        "jsonrpc": "2.0", "id": 2, "method": "message/send",
        "params": { "message": { "role": "user", "messageId": "m2",
            "parts": [{ "kind": "text", "text": "hello" }] } }
    });
    let url = card["url"].as_str().unwrap();
    let reply = send(
        &client(),
        "POST",
        url,
        &[("content-type", "application/json")],
        &request.to_string(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["result"]["metadata"]["agent"], "sqlbot");
    assert_eq!(agent.served().len(), 2);
    // A name that is not a capability's is a clear 400.
    let bad = get(
        &client(),
        &format!("http://{}/.reach/Not%20One/x", caller.addrs.outbound),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_added_to_the_card_becomes_routable_across_the_fleet() {
    let key = key_file("grow");
    let agent = a2a_agent("grower", vec![A2aSkill::new("summarize", &["text"])]).await;
    let callee = sidecar(fast_gossip(with_card(
        Bootstrap::local("grower", agent.addr, &[])
            .unwrap()
            .with_gossip(&[], key.clone()),
    )))
    .await;
    let seed = [callee.addrs.gossip.expect("gossip is on")];
    let caller = sidecar(fast_gossip(
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
            .unwrap()
            .with_gossip(&seed, key),
    ))
    .await;
    let routes = |cap: &'static str| {
        let outbound = caller.addrs.outbound;
        move || async move {
            let reply = send_message(outbound, cap).await;
            reply.status == 200 && reply.json()["result"]["metadata"]["agent"] == "grower"
        }
    };
    eventually(WAIT, "summarize to be routable", routes("summarize")).await;
    let before = send_message(caller.addrs.outbound, "translate").await;
    assert_ne!(before.status, 200, "{}", before.body);

    agent.set_skills(vec![
        A2aSkill::new("summarize", &["text"]),
        A2aSkill::new("translate", &["text", "french"]),
    ]);
    eventually(WAIT, "translate to be routable", routes("translate")).await;
}
