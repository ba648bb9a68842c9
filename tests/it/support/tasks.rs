//! Async tasks from the outside: submit one, read it, wait for a state, and a caller's
//! bootstrap for a sidecar run as its own process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{client, get, send, Reply, CAP};

/// `POST /review` for `CAP` with `prefer: respond-async` and `extra` headers.
pub async fn submit(outbound: SocketAddr, extra: &[(&str, &str)], body: &str) -> Reply {
    let mut headers = vec![("reach-capability", CAP), ("prefer", "respond-async")];
    headers.extend_from_slice(extra);
    send(
        &client(),
        "POST",
        &format!("http://{outbound}/review"),
        &headers,
        body,
    )
    .await
}

/// `GET /reach/v1/tasks/<id>`.
pub async fn task(outbound: SocketAddr, id: &str) -> serde_json::Value {
    get(&client(), &format!("http://{outbound}/reach/v1/tasks/{id}"))
        .await
        .json()
}

/// Polls the task until it is in `state`; fails the test with the task as it stands past
/// `within`.
pub async fn wait_state(
    outbound: SocketAddr,
    id: &str,
    state: &str,
    within: Duration,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let now = task(outbound, id).await;
        if now["state"] == state {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} did not reach {state}: {now:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A caller's bootstrap in `dir`: ports chosen by the OS, one static peer serving `CAP` at
/// `inbound`, and `tasks` as given (YAML flow mapping).
pub fn caller_bootstrap(dir: &Path, peer: &str, inbound: SocketAddr, tasks: &str) -> PathBuf {
    let bootstrap = dir.join("agent-reach.yaml");
    std::fs::write(
        &bootstrap,
        format!(
            "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\n\
             agent:\n  name: caller\n  address: 127.0.0.1:9\n  max_concurrency: 8\n  capabilities: []\n\
             peers:\n  - {{ name: {peer}, address: {inbound}, capabilities: [{CAP}] }}\n\
             tasks: {tasks}\n"
        ),
    )
    .unwrap();
    bootstrap
}
