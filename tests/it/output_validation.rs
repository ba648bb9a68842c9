//! Output validation end to end: a capability's `output_schema` checked by the callee's sidecar,
//! a wrong shape answered `502 invalid_output` and counted against the agent in both views,
//! passed over for another agent only when that is safe, a streamed or oversized answer passed
//! on and counted, the schema's digest carried by gossip, and bad schemas refused by `check`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use agent_reach::config::{OutputSchema, Policy};
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::{MockAgent, MockConfig, Mode};

const BIN: &str = env!("CARGO_BIN_EXE_agent-reach");

/// What every mock agent's good answer has and a `wrong-shape` one lacks.
fn schema() -> OutputSchema {
    OutputSchema::inline(serde_json::json!({
        "type": "object",
        "required": ["ok", "agent"],
        "properties": { "ok": { "type": "boolean" }, "agent": { "type": "string" } }
    }))
    .unwrap()
}

fn with_schema(mut b: Bootstrap) -> Bootstrap {
    b.agent.capabilities[0].output_schema = Some(schema());
    b
}

/// A mock agent in `mode` behind a sidecar whose capability declares the schema.
async fn callee(name: &str, mode: Mode, policy: Policy) -> (MockAgent, Sidecar) {
    let mut config = MockConfig::new(name);
    config.mode = mode;
    let agent = mock(config).await;
    let bootstrap = with_schema(Bootstrap::local(name, agent.addr, &[CAP]).unwrap());
    let sidecar = sidecar_with(bootstrap, policy, Default::default()).await;
    (agent, sidecar)
}

/// A caller that knows `peers` (name, inbound) as static peers.
async fn caller(peers: &[(&str, SocketAddr)]) -> Sidecar {
    let mut b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
    for (name, inbound) in peers {
        b = b.with_peer(name, *inbound, &[CAP]).unwrap();
    }
    sidecar(b).await
}

async fn metrics(s: &Sidecar) -> String {
    get(&client(), &format!("http://{}/metrics", s.addrs.admin))
        .await
        .body
}

/// The sum of the series of `name` whose labels include every one of `labels`.
fn count(metrics: &str, name: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn direct(s: &Sidecar, method: &str, path: &str) -> Reply {
    let url = format!("http://{}{path}", s.addrs.inbound);
    send(&client(), method, &url, &[("reach-capability", CAP)], "q").await
}

#[tokio::test]
async fn a_wrong_shape_is_a_502_invalid_output_and_a_failure_of_the_agent() {
    let (_agent, callee) = callee("faker", Mode::WrongShape, Policy::default()).await;
    let reply = direct(&callee, "POST", "/review").await;
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(reply.header("reach-reason"), "invalid_output");
    assert_eq!(reply.header("reach-agent"), "faker");
    let body = reply.json();
    assert_eq!(body["error"], "invalid_output");
    let errors = body["errors"].as_array().cloned().unwrap_or_default();
    assert_eq!(errors.len(), 1, "{body}");
    let first = errors[0].as_str().unwrap_or_default();
    assert!(
        first.starts_with("/: ") && first.contains("\"ok\""),
        "{first}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("faker"),
        "{body}"
    );

    // The agent's own view counts it as the agent's failure.
    let status = callee.status();
    assert_eq!(status.inbound.failures, 1, "{:?}", status.inbound);
    assert_eq!(status.inbound.successes, 0);
    assert!(status.self_view.estimates.availability < 1.0);
    let m = metrics(&callee).await;
    assert_eq!(
        count(
            &m,
            "reach_output_invalid_total",
            &[&format!("capability=\"{CAP}\"")]
        ),
        1,
        "{m}"
    );
    assert_eq!(
        count(
            &m,
            "reach_requests_total",
            &["direction=\"inbound\"", "outcome=\"failure\""]
        ),
        1
    );
}

#[tokio::test]
async fn a_good_shape_passes_whole_and_a_capability_without_a_schema_is_untouched() {
    let (_agent, callee) = callee("honest", Mode::Normal, Policy::default()).await;
    let reply = direct(&callee, "POST", "/review").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.json()["ok"], true);
    assert_eq!(
        reply.header("content-length"),
        reply.body.len().to_string(),
        "the checked body is passed on with its length"
    );
    assert_eq!(callee.status().inbound.successes, 1);
    let head = direct(&callee, "HEAD", "/review").await;
    assert_eq!(head.status, 200, "a HEAD has no body to check: {head:?}");

    // Without a schema a wrong shape is the agent's business.
    let mut config = MockConfig::new("unchecked");
    config.mode = Mode::WrongShape;
    let agent = mock(config).await;
    let plain = sidecar(Bootstrap::local("unchecked", agent.addr, &[CAP]).unwrap()).await;
    let reply = direct(&plain, "POST", "/review").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let m = metrics(&plain).await;
    assert_eq!(count(&m, "reach_output_unvalidated_total", &[]), 0, "{m}");
}

#[tokio::test]
async fn a_streamed_or_oversized_answer_passes_unchecked_and_is_counted() {
    let mut policy = Policy::default();
    // The mock's JSON answer is ~70 bytes: over this limit.
    policy.validation.max_body_bytes = 16;
    let (_agent, callee) = callee("big", Mode::WrongShape, policy).await;
    let reply = direct(&callee, "POST", "/review").await;
    assert_eq!(
        reply.status, 200,
        "oversized: passed on unchecked: {reply:?}"
    );
    let reply = direct(&callee, "GET", "/sse").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(
        reply.body.contains("data: "),
        "the stream came through: {reply:?}"
    );
    let m = metrics(&callee).await;
    let cap = format!("capability=\"{CAP}\"");
    for reason in ["oversized", "streamed"] {
        let label = format!("reason=\"{reason}\"");
        assert_eq!(
            count(&m, "reach_output_unvalidated_total", &[&cap, &label]),
            1,
            "{reason}: {m}"
        );
    }
    assert_eq!(count(&m, "reach_output_invalid_total", &[]), 0);
    assert_eq!(callee.status().inbound.failures, 0);
}

/// Two agents serve the capability, one answers with the wrong shape. Each round starts them and
/// a caller afresh (an agent that has answered well scores higher with every caller after, so
/// only a fresh fleet makes the first pick a coin toss), the two listed either way round, until a
/// call's first attempt lands on the faker; returns that call's reply and the caller's retries
/// for `invalid_output`.
async fn until_the_faker_is_hit(method: &str, headers: &[(&str, &str)]) -> (Reply, u64) {
    for round in 0..30 {
        let (good_agent, good) = callee("honest", Mode::Normal, Policy::default()).await;
        let (bad_agent, bad) = callee("faker", Mode::WrongShape, Policy::default()).await;
        let mut peers = [("honest", good.addrs.inbound), ("faker", bad.addrs.inbound)];
        if round % 2 == 1 {
            peers.reverse();
        }
        let caller = caller(&peers).await;
        let url = format!("http://{}/review", caller.addrs.outbound);
        let mut all = vec![("reach-capability", CAP)];
        all.extend_from_slice(headers);
        let reply = send(&client(), method, &url, &all, "select the users").await;
        let retries = count(
            &metrics(&caller).await,
            "reach_retries_total",
            &["reason=\"invalid_output\""],
        );
        let faker = caller
            .status()
            .peer_views
            .into_iter()
            .find(|p| p.name == "faker")
            .map_or(0, |p| p.outcomes.failure);
        for s in [caller, good, bad] {
            s.kill().await;
        }
        good_agent.stop().await;
        bad_agent.stop().await;
        if retries > 0 || reply.header("reach-agent") == "faker" {
            assert_eq!(faker, 1, "the caller's view counts the faker's failure");
            return (reply, retries);
        }
    }
    panic!("30 fresh fleets never tried the faker first");
}

#[tokio::test]
async fn a_safe_call_is_passed_over_to_an_agent_whose_output_validates() {
    let safe: [(&str, &[(&str, &str)]); 2] = [("GET", &[]), ("POST", &[("reach-mode", "async")])];
    for (method, headers) in safe {
        let (reply, retries) = until_the_faker_is_hit(method, headers).await;
        assert_eq!(reply.status, 200, "{method} {headers:?}: {reply:?}");
        assert_eq!(
            reply.header("reach-agent"),
            "honest",
            "{method} {headers:?}"
        );
        assert_eq!(reply.json()["ok"], true);
        assert_eq!(retries, 1, "{method} {headers:?}: moved on once");
    }
}

#[tokio::test]
async fn an_unsafe_post_that_hits_the_faker_gets_its_502_and_is_not_retried() {
    // A plain POST may have done its work; a keyed one ran once and a second agent would run
    // its key again (deduplication is per callee): neither is repeated.
    for headers in [&[][..], &[("idempotency-key", "task-17")][..]] {
        let (reply, retries) = until_the_faker_is_hit("POST", headers).await;
        assert_eq!(reply.status, 502, "{headers:?}: {reply:?}");
        assert_eq!(reply.header("reach-reason"), "invalid_output");
        assert_eq!(reply.header("reach-agent"), "faker");
        assert_eq!(retries, 0, "{headers:?}: a POST that ran is never repeated");
    }
}

#[tokio::test]
async fn the_schema_digest_travels_with_the_profile_by_gossip() {
    let dir = temp_dir("gossip");
    let key = dir.join("gossip.key");
    let secret: [u8; 32] = rand::random();
    std::fs::write(
        &key,
        secret
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
    )
    .unwrap();
    let (_agent, callee) = {
        let agent = mock(MockConfig::new("checked")).await;
        let b = Bootstrap::local("checked", agent.addr, &[CAP])
            .unwrap()
            .with_gossip(&[], key.clone());
        (agent, sidecar(with_schema(b)).await)
    };
    let seed = callee.addrs.gossip.expect("gossip is on");
    let b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_gossip(&[seed], key.clone());
    let caller = sidecar(b).await;
    let want = schema().compiled().map(|c| c.digest().to_string());
    let digest = || {
        caller
            .status()
            .peer_views
            .into_iter()
            .find(|p| p.name == "checked")
            .and_then(|p| p.self_view)
            .and_then(|v| v.capabilities.into_iter().find(|c| c.name == CAP))
            .and_then(|c| c.output_schema)
            .map(|d| d.to_string())
    };
    eventually(
        Duration::from_secs(10),
        "the peer's schema digest",
        || async {
            // A call makes the caller score (and so show) the peer.
            let _ = call(&client(), caller.addrs.outbound).await;
            digest().is_some()
        },
    )
    .await;
    assert_eq!(digest(), want);
    let json = get(&client(), &format!("http://{}/status", caller.addrs.admin))
        .await
        .body;
    let shown = want.unwrap_or_default();
    assert!(shown.starts_with("sha256:"), "{shown}");
    assert!(json.contains(&shown), "/status shows it: {json}");
    let _ = std::fs::remove_dir_all(dir);
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reach-output-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn bootstrap_text(schema: &str) -> String {
    format!(
        "agent:\n  name: sql\n  address: 127.0.0.1:8080\n  max_concurrency: 2\n  capabilities:\n    - name: sql\n      output_schema: {schema}\n"
    )
}

#[test]
fn check_resolves_a_schema_file_and_refuses_a_bad_schema() {
    let dir = temp_dir("check");
    std::fs::write(
        dir.join("sql.schema.json"),
        r#"{"type": "object", "required": ["rows"]}"#,
    )
    .unwrap();
    std::fs::write(dir.join("bad.schema.json"), r#"{"type": 12}"#).unwrap();
    let cases = [
        ("good.yaml", bootstrap_text("sql.schema.json"), None),
        (
            "missing.yaml",
            bootstrap_text("nowhere.json"),
            Some("cannot read schema file"),
        ),
        (
            "bad-file.yaml",
            bootstrap_text("bad.schema.json"),
            Some("not a valid JSON Schema"),
        ),
        (
            "bad-inline.yaml",
            bootstrap_text("{ type: object, required: rows }"),
            Some("output_schema: not a valid JSON Schema"),
        ),
    ];
    for (name, text, error) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        // From another directory: a relative schema path is the bootstrap's, not the shell's.
        let out = Command::new(BIN)
            .arg("check")
            .arg(&path)
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match error {
            None => assert!(out.status.success(), "{name}: {stderr}"),
            Some(why) => {
                assert!(!out.status.success(), "{name} passed");
                assert!(stderr.contains(why), "{name}: {stderr}");
                assert!(stderr.contains(&path.display().to_string()), "{stderr}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// An async task (`prefer: respond-async`) whose chain meets the faker moves on to the agent
/// whose output validates, and its record says why the faker's attempt failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_passes_over_the_faker_for_an_agent_whose_output_validates() {
    let mut policy = Policy::default();
    policy.retry.fallback.interval = agent_reach::config::HumanDuration::from_millis(50);
    for round in 0..30 {
        let dir = temp_dir(&format!("task-{round}"));
        let (good_agent, good) = callee("honest", Mode::Normal, Policy::default()).await;
        let (bad_agent, bad) = callee("faker", Mode::WrongShape, Policy::default()).await;
        let mut peers = [("honest", good.addrs.inbound), ("faker", bad.addrs.inbound)];
        if round % 2 == 1 {
            peers.reverse();
        }
        let mut b = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[]).unwrap();
        for (name, inbound) in peers {
            b = b.with_peer(name, inbound, &[CAP]).unwrap();
        }
        b.tasks = Some(agent_reach::config::TasksConfig::file(dir.join("tasks.db")));
        let caller = sidecar_with(b, policy.clone(), Default::default()).await;
        let out = caller.addrs.outbound;
        let headers = [("reach-capability", CAP), ("prefer", "respond-async")];
        let url = format!("http://{out}/review");
        let accepted = send(&client(), "POST", &url, &headers, "select the users").await;
        assert_eq!(accepted.status, 202, "{accepted:?}");
        let id = accepted.json()["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let url = format!("http://{out}/reach/v1/tasks/{id}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let done = loop {
            let now = get(&client(), &url).await.json();
            if now["state"] == "done" {
                break now;
            }
            assert!(tokio::time::Instant::now() < deadline, "not done: {now:#}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for s in [caller, good, bad] {
            s.kill().await;
        }
        good_agent.stop().await;
        bad_agent.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
        let attempts = done["attempts"].as_array().cloned().unwrap_or_default();
        if attempts.first().map(|a| &a["agent"]) != Some(&"faker".into()) {
            continue; // the chain started with the honest agent: no faker met
        }
        assert_eq!(attempts.len(), 2, "{done:#}");
        assert_eq!(attempts[0]["outcome"], "failure", "{done:#}");
        assert!(
            attempts[0].to_string().contains("invalid_output"),
            "{done:#}"
        );
        assert_eq!(attempts[1]["agent"], "honest", "{done:#}");
        assert_eq!(done["response"]["status"], 200, "{done:#}");
        return;
    }
    panic!("30 fresh fleets never started a chain with the faker");
}
