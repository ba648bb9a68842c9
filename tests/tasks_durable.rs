//! A task survives `kill -9` of the caller's sidecar: stored before the `202`, every step
//! committed before it is acted on, resumed when the sidecar starts again on the same file —
//! and an agent that was already running it is not asked to run it twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_reach::mock_agent::{Latency, MockConfig, Mode};
use agent_reach::Bootstrap;
use support::process::SidecarProcess;
use support::tasks::{caller_bootstrap, submit, wait_state};
use support::*;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "reach-durable-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The caller's files: a bootstrap with one static peer and the task store in `dir`, and a
/// policy whose failed chains queue for another round a second later.
fn caller_files(dir: &Path, peer: &str, inbound: SocketAddr) -> (PathBuf, PathBuf) {
    let bootstrap = caller_bootstrap(dir, peer, inbound, "{ path: tasks.db, lease: 5s }");
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "retry:\n  fallback:\n    interval: 50ms\n    final_fallback: queue\n    \
         queue: { delay: 1s, max_delay: 1s, max_rounds: 50 }\n",
    )
    .unwrap();
    (bootstrap, policy)
}

async fn submit_one(outbound: SocketAddr) -> String {
    let reply = submit(outbound, &[], "{\"diff\": 1}").await;
    assert_eq!(reply.status, 202, "{}", reply.body);
    reply.json()["id"].as_str().unwrap().to_owned()
}

/// The task once it is in `state`, within 30 s.
async fn until_state(outbound: SocketAddr, id: &str, state: &str) -> serde_json::Value {
    wait_state(outbound, id, state, Duration::from_secs(30)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_killed_between_attempts_completes_after_a_restart() {
    let agent = mock(MockConfig::new("coder-1")).await;
    agent.set_mode(Mode::RateLimited);
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let dir = tmp("between");
    let (bootstrap, policy) = caller_files(&dir, "coder-1", callee.addrs.inbound);

    let first = SidecarProcess::start(&bootstrap, Some(&policy), &[]);
    let id = submit_one(first.outbound).await;
    // The first chain fails; the task waits for its next round.
    until_state(first.outbound, &id, "retrying").await;
    first.kill9();

    agent.set_mode(Mode::Normal);
    let second = SidecarProcess::start(&bootstrap, Some(&policy), &[]);
    let done = until_state(second.outbound, &id, "done").await;
    assert_eq!(done["response"]["status"], 200, "{done:#}");
    let attempts = done["attempts"].as_array().unwrap();
    assert!(
        attempts.len() >= 2,
        "the failed round is remembered: {done:#}"
    );
    assert_eq!(attempts[0]["status"], 429);
    assert_eq!(attempts.last().unwrap()["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_killed_mid_attempt_resumes_without_running_twice() {
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(Duration::from_millis(1500));
    let agent = mock(config).await;
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let dir = tmp("mid");
    let (bootstrap, policy) = caller_files(&dir, "coder-1", callee.addrs.inbound);

    let first = SidecarProcess::start(&bootstrap, Some(&policy), &[]);
    let id = submit_one(first.outbound).await;
    eventually(
        Duration::from_secs(10),
        "the agent is running the task",
        || async { agent.stats().in_flight == 1 },
    )
    .await;
    first.kill9();

    let second = SidecarProcess::start(&bootstrap, Some(&policy), &[]);
    let done = until_state(second.outbound, &id, "done").await;
    assert_eq!(done["response"]["status"], 200, "{done:#}");
    assert_eq!(done["rounds"], 1, "the same round, resumed: {done:#}");
    // The resumed attempt carried the same key: the callee's sidecar joined the original.
    assert_eq!(agent.stats().business, 1, "the agent ran the task once");
}
