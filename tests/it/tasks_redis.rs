//! The shared task store on Redis: replicas of one caller share a queue, and when the replica
//! running a task dies, another takes it over once its lease runs out — without the agent
//! running it twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::time::Duration;

use agent_reach::Bootstrap;
use support::process::SidecarProcess;
use support::tasks::{caller_bootstrap, submit};
use support::*;
use testkit::redis::RedisServer;
use testkit::{Latency, MockConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_takes_over_a_task_whose_owner_died() {
    let Some(redis) = RedisServer::start() else {
        support::skip::skip(
            "tests/it/tasks_redis.rs",
            "redis-server is not installed",
            support::skip::InCi::Fails,
        );
        return;
    };
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(Duration::from_millis(1500));
    let agent = mock(config).await;
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let dir = std::env::temp_dir().join(format!("reach-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tasks = format!("{{ store: \"{}\", lease: 2s }}", redis.url());
    let bootstrap = caller_bootstrap(&dir, "coder-1", callee.addrs.inbound, &tasks);

    let first = SidecarProcess::start(&bootstrap, None, &[("AGENT_REACH_WORKLOAD", "reviewer")]);
    let reply = submit(first.outbound, &[], "{}").await;
    assert_eq!(reply.status, 202, "{}", reply.body);
    let id = reply.json()["id"].as_str().unwrap().to_owned();
    eventually(
        Duration::from_secs(10),
        "the agent is running the task",
        || async { agent.stats().in_flight == 1 },
    )
    .await;
    // The second replica shares the queue: it sees the task, held by the first.
    let second = SidecarProcess::start(&bootstrap, None, &[("AGENT_REACH_WORKLOAD", "reviewer")]);
    let url = format!("http://{}/reach/v1/tasks/{id}", second.outbound);
    let seen = get(&client(), &url).await.json();
    assert_eq!(seen["state"], "running", "{seen:#}");
    first.kill9();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let done = loop {
        let now = get(&client(), &url).await.json();
        if now["state"] == "done" {
            break now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not taken over: {now:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["response"]["status"], 200, "{done:#}");
    assert_eq!(agent.stats().business, 1, "the agent ran the task once");
}

// No store, still a sidecar: with its Redis unreachable at start, the sidecar starts, serves
// synchronous calls, answers task submissions `503 task_store_unavailable` with `retry-after`,
// says it is degraded on `/ready` and in `/status`; once Redis is there, submissions are taken
// without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_whose_store_is_down_at_start_serves_calls_and_takes_tasks_once_it_is_back() {
    if RedisServer::start().is_none() {
        support::skip::skip(
            "tests/it/tasks_redis.rs",
            "redis-server is not installed",
            support::skip::InCi::Fails,
        );
        return;
    }
    let port = testkit::redis::free_port().unwrap();
    let agent = mock(MockConfig::new("coder-1")).await;
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let dir = std::env::temp_dir().join(format!("reach-redis-down-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tasks = format!("{{ store: \"redis://127.0.0.1:{port}/0\", lease: 2s }}");
    let bootstrap = caller_bootstrap(&dir, "coder-1", callee.addrs.inbound, &tasks);
    let caller = SidecarProcess::start(&bootstrap, None, &[]);

    let reply = call(&client(), caller.outbound).await;
    assert_eq!(
        reply.status, 200,
        "synchronous calls are served: {}",
        reply.body
    );
    let refused = submit(caller.outbound, &[], "{}").await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.header("reach-reason"), "task_store_unavailable");
    assert!(!refused.header("retry-after").is_empty());
    let ready = get(&client(), &format!("http://{}/ready", caller.admin)).await;
    assert_eq!(ready.status, 200);
    assert!(ready.body.contains("degraded"), "{}", ready.body);
    let status = get(&client(), &format!("http://{}/status", caller.admin))
        .await
        .json();
    assert!(
        status["degraded"][0]
            .as_str()
            .is_some_and(|d| d.contains("task store")),
        "{status:#}"
    );

    let _redis = RedisServer::start_on(port).unwrap();
    eventually(
        Duration::from_secs(15),
        "submissions to be taken",
        || async { submit(caller.outbound, &[], "{}").await.status == 202 },
    )
    .await;
    let ready = get(&client(), &format!("http://{}/ready", caller.admin)).await;
    assert_eq!(ready.body, "ready\n");
    let _ = std::fs::remove_dir_all(&dir);
}
