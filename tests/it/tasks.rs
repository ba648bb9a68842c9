//! Async tasks (`prefer: respond-async`): accepted durably with `202`, run through the async
//! chain, escalated to a signed webhook when every agent fails, sent back by a person's `retry`
//! or closed by `resolve`; callbacks only to hosts the policy allows, given up in bounded time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_reach::config::{
    ConfigPaths, FinalFallback, HumanDuration, Policy, QueueRounds, TasksConfig,
};
use agent_reach::{Bootstrap, Sidecar};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use support::tasks::{submit, task, wait_state};
use support::*;
use testkit::{MockAgent, MockConfig, Mode};
use tokio::net::TcpListener;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "reach-tasks-test-{name}-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Agents behind their sidecars, and a caller with a task store that knows them all.
struct Fleet {
    agents: Vec<MockAgent>,
    _callees: Vec<Sidecar>,
    caller: Sidecar,
}

async fn fleet(names: &[&str], policy: Policy, dir: &std::path::Path) -> Fleet {
    fleet_with(names, policy, dir, |b| b).await
}

/// `fleet`, the caller's bootstrap changed by `tune` first.
async fn fleet_with(
    names: &[&str],
    policy: Policy,
    dir: &std::path::Path,
    tune: impl FnOnce(Bootstrap) -> Bootstrap,
) -> Fleet {
    let mut agents = Vec::new();
    let mut callees = Vec::new();
    let mut caller =
        Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    for name in names {
        let agent = mock(MockConfig::new(name)).await;
        let callee = sidecar(Bootstrap::local(name, agent.addr, &[CAP]).unwrap()).await;
        caller = caller
            .with_peer(name, callee.addrs.inbound, &[CAP])
            .unwrap();
        agents.push(agent);
        callees.push(callee);
    }
    caller.tasks = Some(TasksConfig::file(dir.join("tasks.db")));
    let caller = tune(caller);
    let paths = ConfigPaths {
        bootstrap: None,
        policy: Some(dir.join("policy.yaml")),
    };
    let caller = sidecar_with(caller, policy, paths).await;
    Fleet {
        agents,
        _callees: callees,
        caller,
    }
}

/// `policy` with the `callbacks` section written in YAML (`{ allow_hosts: [...], ... }`).
fn with_callbacks(mut policy: Policy, section: &str) -> Policy {
    let text = format!("callbacks: {section}\n");
    policy.callbacks = agent_reach::config::parse_policy(std::path::Path::new("p.yaml"), &text)
        .unwrap()
        .callbacks;
    policy
}

fn fast_chain(final_fallback: FinalFallback, rounds: Option<u32>) -> Policy {
    let mut policy = Policy::default();
    policy.retry.fallback.interval = HumanDuration::from_millis(50);
    policy.retry.fallback.chain_length = 2;
    policy.retry.fallback.final_fallback = final_fallback;
    policy.retry.fallback.queue = rounds.map(|max_rounds| QueueRounds {
        delay: HumanDuration::from_millis(100),
        max_delay: HumanDuration::from_millis(200),
        max_rounds,
    });
    policy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_accepted_at_once_and_done_with_the_agents_answer() {
    let dir = tmp("done");
    let fleet = fleet(&["coder-1"], Policy::default(), &dir).await;
    let out = fleet.caller.addrs.outbound;
    let reply = submit(out, &[("reach-priority", "7")], "review this").await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let id = reply.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(reply.header("location"), format!("/reach/v1/tasks/{id}"));
    assert_eq!(reply.header("preference-applied"), "respond-async");
    let done = wait_state(out, &id, "done", Duration::from_secs(10)).await;
    assert_eq!(done["response"]["status"], 200, "{done}");
    assert_eq!(done["priority"], 7);
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{done}");
    assert_eq!(attempts[0]["agent"], "coder-1");
    assert_eq!(attempts[0]["outcome"], "success");
    assert_eq!(fleet.agents[0].stats().business, 1);
    // The list shows it, and a bad query is refused with the reason.
    let list = get(
        &client(),
        &format!("http://{out}/reach/v1/tasks?state=done"),
    )
    .await;
    assert_eq!(list.json()["tasks"][0]["id"], id.as_str());
    let bad = get(
        &client(),
        &format!("http://{out}/reach/v1/tasks?state=nope"),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.header("reach-reason"), "bad_request");
    let missing = get(&client(), &format!("http://{out}/reach/v1/tasks/t-none")).await;
    assert_eq!(missing.status, 404);

    // The same from a terminal: `agent-reach tasks`.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-reach"))
            .arg("tasks")
            .args(args)
            .args(["--outbound", &format!("http://{out}")])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, listed, _) = cli(&["list", "--state", "done"]);
    assert!(
        ok && listed.contains(&id) && listed.contains("answered 200"),
        "{listed}"
    );
    let (ok, shown, _) = cli(&["show", &id]);
    assert!(
        ok && shown.contains("coder-1") && shown.contains("response 200"),
        "{shown}"
    );
    let (ok, _, refused) = cli(&["resolve", &id, "--note", "late"]);
    assert!(
        !ok && refused.contains("409") && refused.contains("already done"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubmission_with_the_same_key_is_the_same_task() {
    let dir = tmp("key");
    let fleet = fleet(&["coder-1"], Policy::default(), &dir).await;
    let out = fleet.caller.addrs.outbound;
    let first = submit(out, &[("idempotency-key", "order-42")], "charge").await;
    let again = submit(out, &[("idempotency-key", "order-42")], "charge").await;
    assert_eq!(first.status, 202);
    assert_eq!(again.status, 202);
    assert_eq!(first.json()["id"], again.json()["id"]);
    assert_eq!(again.json()["existing"], true);
    let id = first.json()["id"].as_str().unwrap().to_owned();
    wait_state(out, &id, "done", Duration::from_secs(10)).await;
    // The same key for another request is the caller's mistake.
    let other = submit(out, &[("idempotency-key", "order-42")], "refund").await;
    assert_eq!(other.status, 422, "{}", other.body);
    assert_eq!(fleet.agents[0].stats().business, 1, "ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_task_store_an_async_call_is_refused_with_the_fix() {
    let pair = Pair::start(MockConfig::new("coder-1")).await;
    let reply = submit(pair.outbound(), &[], "x").await;
    assert_eq!(reply.status, 501);
    assert_eq!(reply.header("reach-reason"), "tasks_disabled");
    assert!(reply.body.contains("tasks.path"), "{}", reply.body);
}

/// A webhook that refuses its first `refuse` POSTs with 500, then accepts; keeps every POST.
async fn webhook(refuse: usize) -> (String, Arc<Mutex<Vec<(HeaderMap, String)>>>) {
    let listener = TcpListener::bind(any_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<(HeaderMap, String)>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (record, count) = (record.clone(), count.clone());
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (record, count) = (record.clone(), count.clone());
                        async move {
                            let headers = req.headers().clone();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            record
                                .lock()
                                .unwrap()
                                .push((headers, String::from_utf8_lossy(&body).into_owned()));
                            let n = count.fetch_add(1, Ordering::SeqCst);
                            let mut response = Response::new(Full::new(bytes::Bytes::new()));
                            if n < refuse {
                                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                            }
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}/hooks/agent-reach"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_failing_escalates_with_every_reason_then_retry_and_resolve() {
    let dir = tmp("escalate");
    let (url, posts) = webhook(1).await;
    std::fs::write(dir.join("escalation.key"), "s3cret\n").unwrap();
    let mut policy = fast_chain(FinalFallback::Escalate, Some(1));
    policy.escalation.webhook = Some(url);
    policy.escalation.key_file = Some("escalation.key".into());
    let fleet = fleet(&["coder-1", "coder-2"], policy, &dir).await;
    for agent in &fleet.agents {
        agent.set_mode(Mode::RateLimited);
    }
    let out = fleet.caller.addrs.outbound;
    let id = submit(out, &[], "{\"diff\": \"...\"}").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let escalated = wait_state(out, &id, "escalated", Duration::from_secs(20)).await;
    // Two rounds (the chain, then one queue round), two agents each.
    let attempts = escalated["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 4, "{escalated}");
    assert_eq!(escalated["rounds"], 2);
    // The webhook refused the first POST; it is delivered again until accepted.
    eventually(
        Duration::from_secs(10),
        "the escalation is accepted",
        || async { task(out, &id).await["escalation"]["delivered"] == true },
    )
    .await;
    let posts = posts.lock().unwrap().clone();
    assert_eq!(posts.len(), 2, "one refused, one accepted");
    for (n, (headers, body)) in posts.iter().enumerate() {
        let sent: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(sent["event"], "task.escalated");
        assert_eq!(sent["delivery"], n + 1);
        assert_eq!(headers["reach-task-id"], id.as_str());
        let signature = headers["reach-signature"].to_str().unwrap();
        assert!(
            agent_reach::tasks::deliver::verify(b"s3cret", signature, body.as_bytes()),
            "signed with the key"
        );
        assert_eq!(sent["payload"]["body"], "{\"diff\": \"...\"}");
        // Every attempt's reason, once each.
        let sent_attempts = sent["attempts"].as_array().unwrap();
        assert_eq!(sent_attempts.len(), 4);
        for a in sent_attempts {
            assert!(!a["reason"].as_str().unwrap().is_empty());
        }
        assert_eq!(body.matches("\"reason\"").count(), 4, "{body}");
    }
    // A person fixes the agents and sends the task back.
    for agent in &fleet.agents {
        agent.set_mode(Mode::Normal);
    }
    let retried = send(
        &client(),
        "POST",
        &format!("http://{out}/reach/v1/tasks/{id}/retry"),
        &[],
        "",
    )
    .await;
    assert_eq!(retried.status, 200, "{}", retried.body);
    let done = wait_state(out, &id, "done", Duration::from_secs(10)).await;
    assert_eq!(done["response"]["status"], 200);
    // Done is done: no retry of a finished task, no resolve either.
    let again = send(
        &client(),
        "POST",
        &format!("http://{out}/reach/v1/tasks/{id}/resolve"),
        &[],
        "",
    )
    .await;
    assert_eq!(again.status, 409, "{}", again.body);

    // Another task fails everywhere and a person closes it with a note.
    for agent in &fleet.agents {
        agent.set_mode(Mode::RateLimited);
    }
    let other = submit(out, &[], "{}").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_state(out, &other, "escalated", Duration::from_secs(20)).await;
    // While the runner still holds the task (delivering its escalation) a resolve is answered
    // 409 "try again when it is not"; a person's tool tries again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let resolved = loop {
        let answer = send(
            &client(),
            "POST",
            &format!("http://{out}/reach/v1/tasks/{other}/resolve"),
            &[],
            r#"{"note": "done by hand", "by": "oncall"}"#,
        )
        .await;
        if answer.status != 409 || tokio::time::Instant::now() > deadline {
            break answer;
        }
        assert!(answer.body.contains("try again"), "{}", answer.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(resolved.status, 200, "{}", resolved.body);
    assert_eq!(resolved.json()["state"], "resolved");
    assert_eq!(resolved.json()["resolution"]["note"], "done by hand");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_rounds_run_the_chain_again_later_and_then_fail() {
    let dir = tmp("queue");
    let policy = with_callbacks(
        fast_chain(FinalFallback::Queue, Some(2)),
        r#"{ allow_hosts: ["127.0.0.1"] }"#,
    );
    let fleet = fleet(&["coder-1"], policy, &dir).await;
    fleet.agents[0].set_mode(Mode::RateLimited);
    let out = fleet.caller.addrs.outbound;
    let (url, callbacks) = webhook(0).await;
    let id = submit(out, &[("reach-callback", url.as_str())], "{}")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = wait_state(out, &id, "failed", Duration::from_secs(20)).await;
    assert_eq!(
        failed["rounds"], 3,
        "the chain and two queue rounds: {failed}"
    );
    eventually(
        Duration::from_secs(10),
        "the callback is delivered",
        || async { !callbacks.lock().unwrap().is_empty() },
    )
    .await;
    let (_, body) = callbacks.lock().unwrap()[0].clone();
    let sent: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(sent["event"], "task.failed");
    assert_eq!(sent["id"], id.as_str());
}

/// A port nothing listens on right now, for a listener the bootstrap must name.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn port_of(url: &str) -> u16 {
    url.parse::<http::Uri>().unwrap().port_u16().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_is_refused_while_the_policy_lists_no_hosts() {
    let dir = tmp("cb-off");
    let fleet = fleet(&["coder-1"], Policy::default(), &dir).await;
    let out = fleet.caller.addrs.outbound;
    let (url, posts) = webhook(0).await;
    let reply = submit(out, &[("reach-callback", url.as_str())], "{}").await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.header("reach-reason"), "callback_refused");
    assert_eq!(reply.json()["error"], "callback_refused");
    assert!(
        reply.body.contains("callbacks.allow_hosts"),
        "{}",
        reply.body
    );
    // Nothing was stored, so nothing will be delivered.
    let list = get(&client(), &format!("http://{out}/reach/v1/tasks")).await;
    assert_eq!(list.json()["tasks"], serde_json::json!([]), "{}", list.body);
    assert!(posts.lock().unwrap().is_empty());
    // Without a callback the same call is a task as before.
    assert_eq!(submit(out, &[], "{}").await.status, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_local_userinfo_and_the_sidecars_own_ports_are_refused_even_when_listed() {
    let dir = tmp("cb-never");
    // Fixed in the bootstrap: a port 0 listener's port is the OS's, which the policy check
    // cannot know.
    let (admin, outbound) = (free_port(), free_port());
    let policy = with_callbacks(
        Policy::default(),
        r#"{ allow_hosts: ["169.254.169.254", "fe80::1", "127.0.0.1", "localhost"] }"#,
    );
    let fleet = fleet_with(&["coder-1"], policy, &dir, |mut b| {
        b.listen.admin = SocketAddr::from(([127, 0, 0, 1], admin));
        b.listen.outbound = SocketAddr::from(([127, 0, 0, 1], outbound));
        b
    })
    .await;
    let out = fleet.caller.addrs.outbound;
    assert_eq!(fleet.caller.addrs.admin.port(), admin);
    assert_eq!(out.port(), outbound);
    let (hook, _posts) = webhook(0).await;
    let hook_port = port_of(&hook);
    let refused = [
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "link-local",
        ),
        ("http://[fe80::1]/hook".to_owned(), "link-local"),
        ("http://[::ffff:169.254.169.254]/".to_owned(), "link-local"),
        (
            format!("http://ops:s3cret@127.0.0.1:{hook_port}/hook"),
            "user name or password",
        ),
        (
            format!("http://127.0.0.1:{admin}/status"),
            "own admin listener",
        ),
        (
            format!("http://localhost:{admin}/status"),
            "own admin listener",
        ),
        (
            format!("http://127.0.0.1:{}/review", out.port()),
            "own outbound listener",
        ),
    ];
    for (url, why) in &refused {
        let reply = submit(out, &[("reach-callback", url.as_str())], "{}").await;
        assert_eq!(reply.status, 400, "{url}: {}", reply.body);
        assert_eq!(reply.header("reach-reason"), "callback_refused", "{url}");
        assert!(reply.body.contains(why), "{url}: {}", reply.body);
        assert!(
            !reply.body.contains("s3cret"),
            "the password is not echoed: {}",
            reply.body
        );
    }
    // The list itself works: a listed host on a port of its own is accepted.
    let ok = submit(out, &[("reach-callback", hook.as_str())], "{}").await;
    assert_eq!(ok.status, 202, "{}", ok.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_host_receives_the_callback_and_the_view_says_delivered() {
    let dir = tmp("cb-ok");
    let (url, posts) = webhook(0).await;
    let port = port_of(&url);
    let policy = with_callbacks(
        Policy::default(),
        &format!(r#"{{ allow_hosts: ["127.0.0.1:{port}"] }}"#),
    );
    let fleet = fleet(&["coder-1"], policy, &dir).await;
    let out = fleet.caller.addrs.outbound;
    // Listed with its port: the same IP on another port is not.
    let other = format!("http://127.0.0.1:{}/hook", port.wrapping_add(1).max(1));
    let reply = submit(out, &[("reach-callback", other.as_str())], "{}").await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.contains("not in the policy"), "{}", reply.body);

    let id = submit(out, &[("reach-callback", url.as_str())], "review")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_state(out, &id, "done", Duration::from_secs(10)).await;
    eventually(
        Duration::from_secs(10),
        "the callback is delivered",
        || async { task(out, &id).await["callback"]["state"] == "delivered" },
    )
    .await;
    let view = task(out, &id).await;
    assert_eq!(view["callback"]["tries"], 1, "{view}");
    assert_eq!(view["callback"]["url"], url.as_str());
    let posts = posts.lock().unwrap().clone();
    assert_eq!(posts.len(), 1);
    let (headers, body) = &posts[0];
    assert_eq!(headers["reach-task-id"], id.as_str());
    let sent: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(sent["event"], "task.done");
    assert_eq!(
        sent["callback"]["state"], "pending",
        "sent before it was accepted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_that_always_fails_is_given_up_after_the_bounded_time() {
    let dir = tmp("cb-give-up");
    let (url, posts) = webhook(usize::MAX).await;
    let policy = with_callbacks(
        Policy::default(),
        r#"{ allow_hosts: ["127.0.0.1"], give_up_after: 2s, max_tries: 100 }"#,
    );
    let fleet = fleet(&["coder-1"], policy, &dir).await;
    let out = fleet.caller.addrs.outbound;
    let id = submit(out, &[("reach-callback", url.as_str())], "{}")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_state(out, &id, "done", Duration::from_secs(10)).await;
    let started = tokio::time::Instant::now();
    eventually(
        Duration::from_secs(15),
        "the callback is given up",
        || async { task(out, &id).await["callback"]["state"] == "given_up" },
    )
    .await;
    // Two seconds of tries, and the backoff's last wait cut to the deadline.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let view = task(out, &id).await;
    let callback = &view["callback"];
    let tries = callback["tries"].as_u64().unwrap();
    assert!(tries >= 2, "{view:#}");
    assert_eq!(callback["delivered"], false);
    let reason = callback["reason"].as_str().unwrap();
    assert!(
        reason.contains("give_up_after 2s") && reason.contains("answered 500"),
        "{reason}"
    );
    assert_eq!(callback["last_error"], "answered 500");
    assert_eq!(
        posts.lock().unwrap().len() as u64,
        tries,
        "each try was one POST"
    );
    // Given up is final: the task owes nothing more, so the list shows it as is.
    assert_eq!(view["state"], "done");
    assert!(view.get("next_ms").is_none(), "{view:#}");
}
