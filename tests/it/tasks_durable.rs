//! A task survives `kill -9` of the caller's sidecar: stored before the `202`, every step
//! committed before it is acted on, resumed when the sidecar starts again on the same file —
//! and an agent that was already running it is not asked to run it twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_reach::Bootstrap;
use support::process::SidecarProcess;
use support::tasks::{caller_bootstrap, submit, wait_state};
use support::*;
use testkit::{Latency, MockConfig, Mode};

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

/// A UDP port on loopback that is free now, for a gossip address kept across a restart.
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A gossip key file in `dir`.
fn gossip_key(dir: &Path) -> PathBuf {
    let path = dir.join("gossip.key");
    let secret: [u8; 32] = rand::random();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&path, hex).unwrap();
    path
}

/// The caller: no static peers, the fleet's gossip seed (`seeds:
/// []`, at the fixed `gossip` address), its task store in `dir`, the default policy
/// (`final_fallback: fail`), one task at a time.
fn gossip_caller(dir: &Path, gossip: SocketAddr) -> PathBuf {
    gossip_key(dir);
    let bootstrap = dir.join("agent-reach.yaml");
    std::fs::write(
        &bootstrap,
        format!(
            "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\n\
             agent:\n  name: caller\n  address: 127.0.0.1:9\n  max_concurrency: 8\n  capabilities: []\n\
             tasks: {{ path: tasks.db, lease: 5s, workers: 1 }}\n\
             gossip:\n  listen: {gossip}\n  seeds: []\n  key_file: gossip.key\n  \
             probe_interval: 200ms\n  probe_timeout: 100ms\n  suspect_timeout: 1s\n  refresh_interval: 500ms\n"
        ),
    )
    .unwrap();
    bootstrap
}

/// A sidecar serving `CAP` that joins the fleet through `seed`, its agent answering in `latency`.
async fn gossip_callee(
    seed: SocketAddr,
    key: PathBuf,
    latency: Duration,
) -> (testkit::MockAgent, agent_reach::Sidecar) {
    let mut config = MockConfig::new("coder-1");
    config.latency = Latency::fixed(latency);
    let agent = mock(config).await;
    let mut bootstrap = Bootstrap::local("coder-1", agent.addr, &[CAP])
        .unwrap()
        .with_gossip(&[seed], key);
    if let Some(g) = bootstrap.gossip.as_mut() {
        g.probe_interval = agent_reach::config::HumanDuration::from_millis(200);
        g.probe_timeout = agent_reach::config::HumanDuration::from_millis(100);
        g.suspect_timeout = agent_reach::config::HumanDuration::from_secs(1);
        g.refresh_interval = agent_reach::config::HumanDuration::from_millis(500);
    }
    (agent, sidecar(bootstrap).await)
}

/// The task sidecar is the gossip seed and finds its peers only by gossip.
/// It is SIGKILLed with tasks queued and started again: the runner must not resume them before
/// gossip has found the one agent that serves them (before: every queued task `failed` with
/// `404 unknown_capability` within milliseconds of the restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gossip_seed_restarted_with_tasks_queued_fails_none_of_them() {
    let dir = tmp("gossip-restart");
    let gossip = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let bootstrap = gossip_caller(&dir, gossip);
    let first = SidecarProcess::start(&bootstrap, None, &[]);
    let (agent, _callee) =
        gossip_callee(gossip, dir.join("gossip.key"), Duration::from_millis(300)).await;
    // The fleet has formed: a first task is done.
    let warm = submit_one(first.outbound).await;
    until_state(first.outbound, &warm, "done").await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(submit_one(first.outbound).await);
    }
    first.kill9();
    let before = agent.stats().business;
    assert!(before < 13, "tasks were still queued at the kill");

    let second = SidecarProcess::start(&bootstrap, None, &[]);
    for id in &ids {
        let t = wait_state(second.outbound, id, "done", Duration::from_secs(60)).await;
        assert_eq!(t["response"]["status"], 200, "{t:#}");
    }
}

/// A task whose capability nobody serves yet waits — `waiting`, with the reason —
/// and runs once a server appears; its round is not spent on the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_nobody_serves_yet_waits_then_runs_when_a_server_joins() {
    let dir = tmp("gossip-wait");
    let gossip = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let bootstrap = gossip_caller(&dir, gossip);
    let caller = SidecarProcess::start(&bootstrap, None, &[]);
    let id = submit_one(caller.outbound).await;
    // Alone, the runner starts after its settle bound; the task then waits.
    let waiting = wait_state(caller.outbound, &id, "waiting", Duration::from_secs(30)).await;
    let why = waiting["error"].as_str().unwrap_or_default();
    // Alone in its mesh, it cannot tell whether anyone serves it: no candidate, not unknown.
    assert!(why.contains("no_available_instance"), "{waiting:#}");
    assert!(waiting["waiting_since_ms"].is_u64(), "{waiting:#}");

    let (agent, _callee) =
        gossip_callee(gossip, dir.join("gossip.key"), Duration::from_millis(20)).await;
    let done = wait_state(caller.outbound, &id, "done", Duration::from_secs(30)).await;
    assert_eq!(done["rounds"], 1, "waiting spent no round: {done:#}");
    assert!(done.get("waiting_since_ms").is_none(), "{done:#}");
    assert_eq!(agent.stats().business, 1);
}

/// A wait is bounded by `tasks.max_wait`; then the task follows `final_fallback`
/// (here the default, `fail`), saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_waits_past_max_wait_follows_the_final_fallback() {
    let dir = tmp("max-wait");
    // A static peer that serves another capability: nobody serves `CAP`.
    let bootstrap = dir.join("agent-reach.yaml");
    std::fs::write(
        &bootstrap,
        "listen: { outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }\n\
         agent:\n  name: caller\n  address: 127.0.0.1:9\n  max_concurrency: 8\n  capabilities: []\n\
         peers:\n  - { name: other, address: 127.0.0.1:9, capabilities: [translate] }\n\
         tasks: { path: tasks.db, max_wait: 1500ms }\n",
    )
    .unwrap();
    let caller = SidecarProcess::start(&bootstrap, None, &[]);
    let id = submit_one(caller.outbound).await;
    wait_state(caller.outbound, &id, "waiting", Duration::from_secs(10)).await;
    let failed = wait_state(caller.outbound, &id, "failed", Duration::from_secs(10)).await;
    let why = failed["error"].as_str().unwrap_or_default();
    assert!(why.contains("tasks.max_wait"), "{failed:#}");
    assert!(
        failed["attempts"].as_array().is_some_and(|a| a.is_empty()),
        "{failed:#}"
    );
}

/// A tmpfs of `size` at `dir`, unmounted on drop; `None` where mounting is refused (not root).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the filesystem `fill` is on, leaving nothing.
fn fill_disk(fill: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(fill).unwrap();
    let block = vec![0u8; 64 * 1024];
    while file.write_all(&block).is_ok() {}
    let small = [0u8; 512];
    while file.write_all(&small).is_ok() {}
    let _ = file.sync_all();
}

/// A full disk. While the store cannot write, submissions answer `503 task_store_unavailable`
/// with `retry-after`, `/ready` says the sidecar is degraded (still 200: calls are served) and
/// the store's errors are counted; once space is freed, writes resume by themselves (redb
/// refuses everything after an I/O error until reopened). Root only (a 4 MiB tmpfs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_reported_and_the_store_heals_once_space_returns() {
    let dir = tmp("full-disk");
    let Some(fs) = Tmpfs::mount(&dir.join("store"), "4m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root); the full-disk test runs in CI");
        return;
    };
    let agent = mock(MockConfig::new("coder-1")).await;
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let bootstrap = caller_bootstrap(
        &dir,
        "coder-1",
        callee.addrs.inbound,
        "{ path: store/tasks.db, lease: 5s }",
    );
    let caller = SidecarProcess::start(&bootstrap, None, &[]);
    let degraded = || async move {
        let ready = get(&client(), &format!("http://{}/ready", caller.admin)).await;
        assert_eq!(ready.status, 200, "{}", ready.body);
        ready.body.contains("degraded")
    };
    let mut accepted = vec![submit_one(caller.outbound).await];
    assert!(!degraded().await);

    // Submissions go on until the store meets the full disk; every answer is a 202 or a 503.
    // redb may find room in its own file for small writes after a reopen, so the disk is
    // topped up again until a submission and `/ready` both see the store down.
    let mut refused = None;
    let mut fills = 0;
    for _ in 0..400 {
        fills += 1;
        fill_disk(&fs.0.join(format!("fill-{fills}")));
        let reply = submit(caller.outbound, &[], &"x".repeat(4096)).await;
        match reply.status.as_u16() {
            202 => accepted.push(reply.json()["id"].as_str().unwrap().to_owned()),
            503 if degraded().await => {
                refused = Some(reply);
                break;
            }
            503 => {}
            other => panic!("a submission answered {other}: {}", reply.body),
        }
    }
    let refused = refused.expect("a full disk refuses submissions and /ready says so");
    assert_eq!(refused.header("reach-reason"), "task_store_unavailable");
    assert!(refused.body.contains("No space left"), "{}", refused.body);
    assert!(
        !refused.header("retry-after").is_empty(),
        "retry-after is set"
    );
    let metrics = get(&client(), &format!("http://{}/metrics", caller.admin)).await;
    assert!(
        counter(&metrics.body, "reach_task_store_errors_total{kind=\"io\"") > 0,
        "store errors are counted"
    );

    for n in 1..=fills {
        let _ = std::fs::remove_file(fs.0.join(format!("fill-{n}")));
    }
    eventually(
        Duration::from_secs(30),
        "submissions to be taken again",
        || async {
            let reply = submit(caller.outbound, &[], "{\"diff\": 2}").await;
            if reply.status == 202 {
                return true;
            }
            assert_eq!(reply.status, 503, "{}", reply.body);
            false
        },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "/ready to say ready again",
        || async { !degraded().await },
    )
    .await;
    for id in &accepted {
        wait_state(caller.outbound, id, "done", Duration::from_secs(60)).await;
    }
    // The store's going down and coming back are logged once each, not per retry.
    let lines: Vec<String> = caller.log.try_iter().collect();
    let loud = lines
        .iter()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .count();
    assert!(
        loud < 20,
        "{loud} warnings and errors: {:#?}",
        &lines[..lines.len().min(40)]
    );
}

/// The store is bounded. Beyond `tasks.max_tasks` a submission is
/// answered `503 task_store_full` with `retry-after`, and nothing is stored (before: no bound
/// but `retention`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_beyond_max_tasks_is_refused_as_full() {
    let agent = mock(MockConfig::new("coder-1")).await;
    let callee = sidecar(Bootstrap::local("coder-1", agent.addr, &[CAP]).unwrap()).await;
    let dir = tmp("bounded");
    let bootstrap = caller_bootstrap(
        &dir,
        "coder-1",
        callee.addrs.inbound,
        "{ path: tasks.db, max_tasks: 5 }",
    );
    let caller = SidecarProcess::start(&bootstrap, None, &[]);
    for _ in 0..5 {
        submit_one(caller.outbound).await;
    }
    let full = submit(caller.outbound, &[], "{\"diff\": 6}").await;
    assert_eq!(full.status, 503, "{}", full.body);
    assert_eq!(full.header("reach-reason"), "task_store_full");
    assert!(full.body.contains("tasks.max_tasks"), "{}", full.body);
    assert!(!full.header("retry-after").is_empty());
    let listed = get(
        &client(),
        &format!("http://{}/reach/v1/tasks?limit=100", caller.outbound),
    )
    .await;
    assert_eq!(
        listed.json()["tasks"].as_array().map(Vec::len),
        Some(5),
        "{}",
        listed.body
    );
    // Still ready: a full store refuses new work but keeps the work it has.
    let ready = get(&client(), &format!("http://{}/ready", caller.admin)).await;
    assert_eq!(ready.status, 200);
}
