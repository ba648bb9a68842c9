//! The demo's hostile act: while the caller's traffic runs, a stranger on the network sends
//! coder-3's inbound port the input a review used to hurt sidecars with — uploads that break
//! off or stall, asterisk-form targets, a path the capability does not serve, a reused
//! idempotency key with another body. Each gets its refusal; none counts against the agent.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::drive::Calls;
use super::{Fleet, CAPABILITY};
use agent_reach::reach::State;

/// What the stranger did and what it changed.
#[derive(Clone, Debug, Serialize)]
pub struct HostileSummary {
    pub target: String,
    /// Requests sent, by kind.
    pub sent: Vec<(&'static str, u64)>,
    /// Requests that must get an answer, and how many got the expected refusal.
    pub answerable: u64,
    pub refused_as_expected: u64,
    /// Failures the target's own view counted during the act (the agent's fault only).
    pub agent_failures_added: u64,
    pub state_before: State,
    pub state_after: State,
    /// The caller's traffic meanwhile.
    pub calls: u64,
    pub failed: u64,
}

/// One kind of bad request: what it sends and the status line it must get (`None`: the stranger
/// hangs up before any answer).
struct Attack {
    kind: &'static str,
    count: u64,
    expect: Option<&'static str>,
}

const ATTACKS: [Attack; 5] = [
    Attack {
        kind: "broken uploads",
        count: 8,
        expect: None,
    },
    Attack {
        kind: "stalled uploads",
        count: 4,
        expect: Some(" 408 "),
    },
    Attack {
        kind: "`POST *`",
        count: 4,
        expect: Some(" 400 "),
    },
    Attack {
        kind: "undeclared paths",
        count: 4,
        expect: Some(" 400 "),
    },
    Attack {
        kind: "reused keys",
        count: 2,
        expect: Some(" 422 "),
    },
];

pub(super) async fn run(fleet: &Fleet, duration: Duration, concurrency: usize) -> HostileSummary {
    // The storm's fallback: the one agent that is healthy by its own view after the storm.
    let (agent, sidecar) = &fleet.agents[2];
    let inbound = sidecar.addrs.inbound;
    let before = sidecar.status();
    let calls = Calls::default();
    let traffic = fleet.traffic(duration, concurrency, calls.clone());
    let attacks = async {
        let mut refused = 0;
        for attack in &ATTACKS {
            for i in 0..attack.count {
                let answer = send_politely(attack.kind, inbound, i).await;
                if attack.expect.is_some_and(|e| answer.contains(e)) {
                    refused += 1;
                }
            }
        }
        refused
    };
    let ((), refused) = tokio::join!(traffic, attacks);
    let after = sidecar.status();
    let calls = calls.take();
    HostileSummary {
        target: agent.name().to_owned(),
        sent: ATTACKS.iter().map(|a| (a.kind, a.count)).collect(),
        answerable: ATTACKS
            .iter()
            .filter(|a| a.expect.is_some())
            .map(|a| a.count)
            .sum(),
        refused_as_expected: refused,
        agent_failures_added: (after.inbound.failures + after.inbound.timeouts)
            .saturating_sub(before.inbound.failures + before.inbound.timeouts),
        state_before: before.self_view.state,
        state_after: after.self_view.state,
        calls: calls.len() as u64,
        failed: calls.iter().filter(|c| !c.ok).count() as u64,
    }
}

/// Like any client, the stranger comes back when the agent is momentarily full (`503
/// saturated`): the refusal it gets must be for what it sent, not for the load.
async fn send_politely(kind: &str, inbound: SocketAddr, i: u64) -> String {
    let mut answer = String::new();
    for _ in 0..20 {
        answer = send(kind, inbound, i).await;
        if !answer.contains("reach-reason: saturated") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    answer
}

/// Sends one bad request of `kind`; returns whatever came back (empty when nothing did).
async fn send(kind: &str, inbound: SocketAddr, i: u64) -> String {
    let head = |method: &str, target: &str, extra: &str, length: usize| {
        format!(
            "{method} {target} HTTP/1.1\r\nhost: agent\r\nreach-capability: {CAPABILITY}\r\n\
             {extra}content-length: {length}\r\nconnection: close\r\n\r\n"
        )
    };
    let (request, hang_up) = match kind {
        "broken uploads" => (head("POST", "/review", "", 100_000) + "def f(", true),
        "stalled uploads" => (head("POST", "/review", "", 100) + "def f(", false),
        "`POST *`" => (head("POST", "*", "", 2) + "hi", false),
        "undeclared paths" => (head("PUT", "/admin/mode", "", 5) + "crash", false),
        _ => {
            // The same key with another body: the second is refused.
            let key = format!("idempotency-key: demo-{i}\r\n");
            let first = exchange(inbound, &(head("POST", "/review", &key, 1) + "a"), false).await;
            if !first.contains(" 200 ") {
                return first;
            }
            (head("POST", "/review", &key, 1) + "b", false)
        }
    };
    exchange(inbound, &request, hang_up).await
}

/// Writes `request`; reads the answer (or hangs up at once), giving up after 5 s.
async fn exchange(addr: SocketAddr, request: &str, hang_up: bool) -> String {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return String::new();
    };
    if stream.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    if hang_up {
        // Long enough for the sidecar to start forwarding the body; then the stranger vanishes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        return String::new();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}
