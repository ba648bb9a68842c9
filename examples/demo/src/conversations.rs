//! The demo's A2A act (`docs/a2a.md`, `docs/affinity.md`): three A2A agents join the fleet, each
//! behind its sidecar with no capability written down — the sidecars read the agents' cards and
//! their skill `translate` reaches the caller by gossip. The caller reads the card through its
//! outbound port (its URL rewritten to `http://translate.reach/`), then holds conversations:
//! a `message/send`, a `tasks/get` follow-up and a second turn in the same context. Follow-ups
//! must reach the agent that holds the task; spread over three agents, two in three would not.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::Request;
use http_body_util::BodyExt;
use serde::Serialize;
use serde_json::{json, Value};

use super::{DemoError, Fleet};
use agent_reach::config::{A2aConfig, Bootstrap};
use agent_reach::http::{body, client};
use agent_reach::Sidecar;
use testkit::a2a::{A2aAgent, A2aSkill};

const SKILL: &str = "translate";
const AGENTS: usize = 3;
const CONVERSATIONS: usize = 12;

#[derive(Clone, Debug, Serialize)]
pub struct ConversationsSummary {
    /// From the agents' start to the caller routing their skill, read from their cards.
    pub skill_routable_after_ms: Option<f64>,
    /// The card's `url` as the caller's outbound port served it.
    pub card_url: String,
    pub conversations: usize,
    /// Follow-ups (a `tasks/get` and a second turn per conversation) and how many reached the
    /// agent holding the task.
    pub follow_ups: usize,
    pub reached_holder: usize,
    /// Agents that started a conversation (the first turn picks freely).
    pub agents_used: usize,
}

pub(super) async fn run(fleet: &mut Fleet) -> Result<ConversationsSummary, DemoError> {
    let started = Instant::now();
    let mut agents: Vec<(A2aAgent, Sidecar)> = Vec::new();
    for n in 1..=AGENTS {
        let name = format!("linguist-{n}");
        let agent = A2aAgent::start_named(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            Some(&name),
            vec![A2aSkill::new(SKILL, &["french", "german"])],
        )
        .await?;
        let mut bootstrap = Bootstrap::local(&name, agent.addr, &[])
            .map_err(DemoError::Config)?
            .with_gossip(&fleet.seed, fleet.key_dir.join("gossip.key"));
        bootstrap.agent.a2a = Some(A2aConfig::default());
        let bootstrap = fleet.with_tls(bootstrap, &super::agent_identity(&name))?;
        let sidecar = super::start_sidecar(bootstrap, fleet.policy.clone()).await?;
        agents.push((agent, sidecar));
    }
    let caller = &fleet.caller;
    let routable = super::poll(Duration::from_secs(20), || {
        let status = caller.status();
        status
            .peers
            .iter()
            .filter(|p| p.capabilities.iter().any(|c| c == SKILL))
            .count()
            >= AGENTS
    })
    .await
    .map(|_| started.elapsed());

    let outbound = caller.addrs.outbound;
    let http = client::build(&fleet.policy);
    let card = get(&http, outbound, "/.well-known/agent-card.json").await;
    let card_url = card["url"].as_str().unwrap_or("-").to_owned();

    let (mut follow_ups, mut reached_holder) = (0, 0);
    let mut starters = std::collections::BTreeSet::new();
    for n in 0..CONVERSATIONS {
        let context = format!("ctx-{n}");
        let first = rpc(
            &http,
            outbound,
            "message/send",
            json!({
                "message": {"role": "user", "messageId": format!("m-{n}-1"), "contextId": context,
                            "parts": [{"kind": "text", "text": "bonjour"}]}
            }),
        )
        .await;
        let Some(task_id) = first["result"]["id"].as_str().map(str::to_owned) else {
            continue;
        };
        let holder = agents.iter().position(|(a, _)| a.holds(&task_id));
        if let Some(h) = holder {
            starters.insert(h);
        }
        let get = rpc(&http, outbound, "tasks/get", json!({ "id": task_id })).await;
        let again = rpc(
            &http,
            outbound,
            "message/send",
            json!({
                "message": {"role": "user", "messageId": format!("m-{n}-2"), "contextId": context,
                            "taskId": task_id, "parts": [{"kind": "text", "text": "merci"}]}
            }),
        )
        .await;
        follow_ups += 2;
        reached_holder += usize::from(get["result"]["id"] == task_id.as_str());
        reached_holder += usize::from(again["result"]["id"] == task_id.as_str());
    }
    for (agent, sidecar) in agents {
        sidecar.shutdown().await;
        agent.stop().await;
    }
    Ok(ConversationsSummary {
        skill_routable_after_ms: routable.map(|d| super::round(d.as_secs_f64() * 1000.0)),
        card_url,
        conversations: CONVERSATIONS,
        follow_ups,
        reached_holder,
        agents_used: starters.len(),
    })
}

/// A JSON-RPC call to the skill through the caller's outbound port, as an A2A client pointed at
/// the proxy would make it.
async fn rpc(
    http: &client::UpstreamClient,
    outbound: SocketAddr,
    method: &str,
    params: Value,
) -> Value {
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let Ok(request) = Request::post(format!("http://{outbound}/"))
        .header(http::header::HOST, format!("{SKILL}.reach"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body::full(call.to_string()))
    else {
        return Value::Null;
    };
    read(http.request(request).await.ok()).await
}

/// A GET of `path` on the skill's authority, through the caller's outbound port.
async fn get(http: &client::UpstreamClient, outbound: SocketAddr, path: &str) -> Value {
    let Ok(request) = Request::get(format!("http://{outbound}{path}"))
        .header(http::header::HOST, format!("{SKILL}.reach"))
        .body(body::empty())
    else {
        return Value::Null;
    };
    read(http.request(request).await.ok()).await
}

async fn read(response: Option<http::Response<hyper::body::Incoming>>) -> Value {
    let Some(response) = response else {
        return Value::Null;
    };
    match response.into_body().collect().await {
        Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or_default(),
        Err(_) => Value::Null,
    }
}
