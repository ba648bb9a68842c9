//! Quality drift end to end: golden tasks compared with recorded baselines, an agent whose
//! answers drift marked `degraded` within one interval and passed over by a caller for a peer
//! that still answers well — with no call failing — and back to healthy when its answers
//! recover; `agent-reach baseline record` and `check` on the files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agent_reach::config::{Compare, GoldenTask, HumanDuration, Policy, QualitySpec, Snapshot};
use agent_reach::http::client::AgentClient;
use agent_reach::{Bootstrap, Sidecar};
use support::*;
use testkit::{Latency, MockAgent, MockConfig, Mode};

const BIN: &str = env!("CARGO_BIN_EXE_agent-reach");
/// Short, so a drift shows within the test; the default is an hour.
const INTERVAL: Duration = Duration::from_millis(300);

/// A private directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "agent-reach-quality-{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One golden task on `/review`: `ok` and `language` must stay equal, `summary` close.
fn golden(baseline: PathBuf) -> QualitySpec {
    QualitySpec {
        interval: HumanDuration(INTERVAL),
        threshold: 0.8,
        tasks: vec![GoldenTask {
            method: "POST".into(),
            path: "/review".into(),
            body: Some(r#"{"code":"fn main() {}"}"#.into()),
            headers: Default::default(),
            baseline,
            compare: Compare {
                json_fields: vec!["/ok".into(), "/language".into()],
                text_field: Some("/summary".into()),
            },
        }],
    }
}

/// Timings shortened so agents leave parole at once and callers read self-views often. The
/// parole prior (availability 0.7) is forgiven as fast: otherwise the agent that took fewer
/// calls while on parole scores below the other past the tie band for ~10 s and gets only the
/// exploration share, and the "fair share while healthy" runs measure the prior, not the pick.
fn policy() -> Policy {
    let mut p = Policy::default();
    p.states.parole.duration = HumanDuration::from_millis(100);
    p.estimates.availability_recovery = HumanDuration::from_millis(300);
    p.peer_views.poll_interval = HumanDuration::from_millis(100);
    p
}

async fn status(s: &Sidecar) -> serde_json::Value {
    get(&client(), &format!("http://{}/status", s.addrs.admin))
        .await
        .json()
}

/// A mock agent whose calls take long enough that a millisecond of noise between two of them is
/// inside the pick's tie band: the share then follows the caps and the scores, not the noise.
fn agent_config(name: &str) -> MockConfig {
    let mut config = MockConfig::new(name);
    config.latency = Latency::fixed(Duration::from_millis(25));
    config
}

/// An agent behind its sidecar, with golden tasks whose baselines are recorded from it now.
async fn agent_with_golden_tasks(name: &str, dir: &Path) -> (MockAgent, Sidecar) {
    let agent = mock(agent_config(name)).await;
    let mut bootstrap = Bootstrap::local(name, agent.addr, &[CAP]).unwrap();
    let spec = golden(dir.join(format!("{name}-review.json")));
    let snapshot = Snapshot::new(bootstrap.clone(), policy(), 0);
    let capability = &snapshot.bootstrap.agent.capabilities[0];
    let client = AgentClient::new(&snapshot.policy);
    let written = agent_reach::quality::record(&client, &snapshot, capability, &spec).await;
    assert!(written.iter().all(Result::is_ok), "{written:?}");
    bootstrap.agent.capabilities[0].quality = Some(spec);
    let sidecar = sidecar_with(bootstrap, policy(), Default::default()).await;
    (agent, sidecar)
}

/// `n` calls through the caller, one after another: how many reached each agent, and whether
/// every one succeeded.
async fn drive(outbound: SocketAddr, n: usize, agents: [&MockAgent; 2]) -> ([u64; 2], bool) {
    let before = agents.map(|a| a.stats().business);
    let mut all_ok = true;
    for _ in 0..n {
        all_ok &= call(&client(), outbound).await.status == 200;
    }
    let after = agents.map(|a| a.stats().business);
    ([after[0] - before[0], after[1] - before[1]], all_ok)
}

fn share(reached: [u64; 2]) -> f64 {
    reached[0] as f64 / (reached[0] + reached[1]).max(1) as f64
}

/// The caller's peer view of `name`, as `/status` has it.
fn peer<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doc["peer_views"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or(&serde_json::Value::Null)
}

#[tokio::test]
async fn a_drifting_agent_is_degraded_loses_share_without_a_failed_call_and_comes_back() {
    let dir = scratch("drift");
    let (drifter, drifter_sidecar) = agent_with_golden_tasks("drifter", &dir).await;
    let steady = mock(agent_config("steady")).await;
    let steady_sidecar = sidecar_with(
        Bootstrap::local("steady", steady.addr, &[CAP]).unwrap(),
        policy(),
        Default::default(),
    )
    .await;
    let caller_bootstrap = Bootstrap::local("caller", SocketAddr::from(([127, 0, 0, 1], 9)), &[])
        .unwrap()
        .with_peer("drifter", drifter_sidecar.addrs.inbound, &[CAP])
        .unwrap()
        .with_peer("steady", steady_sidecar.addrs.inbound, &[CAP])
        .unwrap();
    let caller = sidecar_with(caller_bootstrap, policy(), Default::default()).await;
    let outbound = caller.addrs.outbound;

    // The recorded answers match: similarity 1, healthy, for both views.
    eventually(
        Duration::from_secs(5),
        "the drifter's first run matches its baseline",
        || async {
            let doc = status(&drifter_sidecar).await;
            doc["quality"][0]["similarity"] == 1.0 && doc["self_state"] == "healthy"
        },
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "the caller sees both agents healthy",
        || async {
            drive(outbound, 4, [&drifter, &steady]).await;
            let doc = status(&caller).await;
            ["drifter", "steady"]
                .iter()
                .all(|n| peer(&doc, n)["effective_state"] == "healthy")
        },
    )
    .await;
    // A fair share while healthy. A run of calls can all go to one agent when the other's
    // latency spiked past the tie band (a loaded machine): try a few runs.
    let mut before = [0, 0];
    let mut all_ok = true;
    for _ in 0..10 {
        let (reached, ok) = drive(outbound, 40, [&drifter, &steady]).await;
        all_ok &= ok;
        before = reached;
        if share(before) > 0.2 {
            break;
        }
    }
    assert!(all_ok, "no call failed while both were healthy");
    assert!(
        share(before) > 0.2,
        "a fair share while healthy: {before:?}"
    );

    drifter.set_mode(Mode::Drift);
    let drifted_at = tokio::time::Instant::now();
    // Within one interval (and the time a run takes): the next run sees the drift.
    eventually(
        INTERVAL + Duration::from_secs(1),
        "the drifter is degraded",
        || async { status(&drifter_sidecar).await["self_state"] == "degraded" },
    )
    .await;
    let took = drifted_at.elapsed();
    let own = status(&drifter_sidecar).await;
    let run = &own["quality"][0];
    assert!(run["similarity"].as_f64().unwrap() < 0.8, "{run}");
    assert_eq!(
        own["self"]["state"], "healthy",
        "the machine's state is unchanged"
    );
    assert_eq!(own["self"]["cap"], 0.5, "states.degraded.cap");
    let differing = run["tasks"][0]["differing"].to_string();
    assert!(
        differing.contains("/language") && differing.contains("/summary"),
        "{differing}"
    );
    let metrics = get(
        &client(),
        &format!("http://{}/metrics", drifter_sidecar.addrs.admin),
    )
    .await;
    assert!(
        metrics
            .body
            .lines()
            .any(|l| l
                .starts_with(r#"reach_quality_similarity_ratio{capability="code-review"} 0.25"#)),
        "{}",
        metrics.body
    );
    // The self-view gauges are set once a second.
    eventually(
        Duration::from_secs(2),
        "reach_self_state says degraded",
        || async {
            let url = format!("http://{}/metrics", drifter_sidecar.addrs.admin);
            get(&client(), &url)
                .await
                .body
                .contains(r#"reach_self_state{state="degraded"} 1"#)
        },
    )
    .await;

    eventually(
        Duration::from_secs(3),
        "the caller sees the drifter degraded",
        || async {
            let doc = status(&caller).await;
            peer(&doc, "drifter")["self_view"]["view"]["quality"]["degraded"] == true
        },
    )
    .await;
    let mut after = [0, 0];
    let mut all_ok = true;
    for _ in 0..10 {
        let (reached, ok) = drive(outbound, 40, [&drifter, &steady]).await;
        all_ok &= ok;
        after = reached;
        if share(after) < share(before) / 2.0 {
            break;
        }
    }
    assert!(all_ok, "no call failed: a drifting agent still answers");
    assert!(
        share(after) < share(before) / 2.0,
        "its share fell: {before:?} → {after:?} (degraded after {took:?})"
    );
    let doc = status(&caller).await;
    assert_eq!(
        peer(&doc, "drifter")["effective_state"],
        "healthy",
        "never ejected for quality alone"
    );
    assert_eq!(status(&drifter_sidecar).await["inbound"]["failures"], 0);

    drifter.set_mode(Mode::Normal);
    eventually(
        INTERVAL + Duration::from_secs(1),
        "the drifter is healthy again",
        || async {
            let doc = status(&drifter_sidecar).await;
            doc["self_state"] == "healthy" && doc["quality"][0]["similarity"] == 1.0
        },
    )
    .await;
    eventually(
        Duration::from_secs(3),
        "the drifter wins its share back",
        || async {
            let (reached, ok) = drive(outbound, 30, [&drifter, &steady]).await;
            ok && share(reached) > 0.2
        },
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bootstrap file for `agent` on loopback with OS-chosen ports, one golden task whose
/// baseline is `baselines/review.json` beside it.
fn bootstrap_file(dir: &Path, agent: SocketAddr) -> PathBuf {
    let text = format!(
        "listen: {{ outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }}\n\
         agent:\n  name: recorded\n  address: {agent}\n  max_concurrency: 4\n  capabilities:\n\
         \x20   - name: {CAP}\n      quality:\n        interval: 300ms\n        tasks:\n\
         \x20         - path: /review\n            body: '{{\"code\": \"x = 1\"}}'\n\
         \x20           baseline: baselines/review.json\n\
         \x20           compare: {{ json_fields: [/ok, /language], text_field: /summary }}\n"
    );
    let path = dir.join("agent-reach.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn check_reports_a_missing_baseline_and_record_writes_one_a_run_matches() {
    let dir = scratch("record");
    let agent = mock(MockConfig::new("recorded")).await;
    let file = bootstrap_file(&dir, agent.addr);
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let path = file.to_str().unwrap();
    let (ok, text) = run(&["check", path]);
    assert!(!ok, "a missing baseline fails check: {text}");
    assert!(text.contains("baselines/review.json: missing"), "{text}");

    // `record` blocks on its own runtime: off this test's.
    let (ok, text) = tokio::task::spawn_blocking({
        let path = path.to_owned();
        move || run(&["baseline", "record", "--config", &path])
    })
    .await
    .unwrap();
    assert!(ok, "{text}");
    let baseline = dir.join("baselines").join("review.json");
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&baseline).unwrap()).unwrap();
    assert_eq!(recorded["language"], "en", "{recorded}");
    let (ok, text) = run(&["check", path]);
    assert!(ok, "{text}");
    assert!(text.contains("1 golden task(s)"), "{text}");

    std::fs::write(&baseline, "not json").unwrap();
    let (ok, text) = run(&["check", path]);
    assert!(
        !ok && text.contains("not JSON"),
        "an unreadable baseline fails check: {text}"
    );
    std::fs::remove_file(&baseline).unwrap();
    let (ok, _) = tokio::task::spawn_blocking({
        let path = path.to_owned();
        move || run(&["baseline", "record", "--config", &path, "--capability", CAP])
    })
    .await
    .unwrap();
    assert!(ok);

    // A sidecar started from the same file matches the recorded answer exactly.
    let bootstrap = agent_reach::config::load_bootstrap(&file).unwrap();
    let sidecar = sidecar(bootstrap).await;
    eventually(
        Duration::from_secs(5),
        "a run matches the recorded baseline",
        || async {
            let doc = status(&sidecar).await;
            doc["quality"][0]["similarity"] == 1.0
                && doc["quality"][0]["tasks"][0]["differing"] == serde_json::json!([])
        },
    )
    .await;
    let (ok, text) = run(&[
        "baseline",
        "record",
        "--config",
        path,
        "--capability",
        "nope",
    ]);
    assert!(!ok && text.contains("no capability named `nope`"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
