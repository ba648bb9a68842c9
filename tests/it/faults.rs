//! Faults on a fleet of real sidecar processes (the built binary) that find each other by gossip
//! and speak strict mutual TLS, each beside a mock agent process that logs what it executes:
//! a SIGTERM under load, a `kill -9` in the middle of an SSE stream, a Redis restart under
//! running tasks. Every wait polls against a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use testkit::chaos;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chaos::fleet::{scratch, Fleet, Redis, SidecarSpec};
use chaos::load::{read_stream, StreamOutcome, CAP};
use chaos::net::{self, now_ms, Failure};

/// A fleet in a fresh directory: the seed sidecar `caller` (no agent; `tasks` as given) and one
/// worker per `(name, latency, sse events, sse interval)`, started and routable from `caller`.
async fn fleet(
    tag: &str,
    caller_tasks: Option<&str>,
    workers: &[(&str, &str, u32, &str)],
) -> Fleet {
    let dir = scratch(tag).unwrap();
    let mut fleet = Fleet::new(&dir, chaos::POLICY).unwrap();
    let mut caller = SidecarSpec::caller("caller");
    if let Some(tasks) = caller_tasks {
        caller = caller.tasks(tasks);
    }
    fleet.add_sidecar(&caller).unwrap();
    for (name, latency, events, interval) in workers {
        let a = fleet.add_agent(name, latency, *events, interval).unwrap();
        let addr = fleet.agents[a].addr;
        fleet
            .add_sidecar(&SidecarSpec::new(name, addr, &[CAP]))
            .unwrap();
    }
    fleet.start_all().await.unwrap();
    let names: Vec<String> = workers.iter().map(|w| w.0.to_owned()).collect();
    fleet
        .wait_peers(0, &names, Duration::from_secs(30))
        .await
        .unwrap();
    // One call answered through the caller: routing is warm.
    let outbound = fleet.sidecars[0].outbound;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = review(outbound, &[]).await;
        if matches!(&answer, Ok(a) if a.status == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the caller does not route {CAP} within 20 s: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fleet
}

async fn review(outbound: SocketAddr, extra: &[(&str, &str)]) -> Result<net::Answer, Failure> {
    let mut headers = vec![("reach-capability", CAP)];
    headers.extend_from_slice(extra);
    net::call(
        outbound,
        "POST",
        "/review",
        &headers,
        "x = 1",
        Duration::from_secs(30),
    )
    .await
}

/// 1. A caller sends concurrent sync calls to a capability two callees serve; the sidecar of the
/// callee whose agent is running calls right then gets SIGTERM. It drains: every call is
/// answered 200 — those it held finish (its agent completes calls after the SIGTERM), new ones
/// go to the other callee — and it exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_a_callee_under_load_loses_no_call() {
    let mut fleet = fleet(
        "faults-drain",
        None,
        &[
            ("callee-1", "150ms..250ms", 5, "100ms"),
            ("callee-2", "150ms..250ms", 5, "100ms"),
        ],
    )
    .await;
    let outbound = fleet.sidecars[0].outbound;
    let stop = tokio_util::sync::CancellationToken::new();
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                while !stop.is_cancelled() {
                    let started = now_ms();
                    let result = review(outbound, &[]).await;
                    let agent = result
                        .as_ref()
                        .ok()
                        .and_then(|a| a.json()["agent"].as_str().map(str::to_owned));
                    outcomes.push((
                        started,
                        result.map(|a| (a.status, a.reason(), a.text())),
                        agent,
                    ));
                }
                outcomes
            })
        })
        .collect();
    // Under load, SIGTERM the callee whose agent is running calls right now.
    let deadline = Instant::now() + Duration::from_secs(10);
    let victim = 'found: loop {
        for agent in &fleet.agents {
            if let Ok((200, stats)) = net::get_json(agent.addr, "/admin/stats").await {
                if stats["in_flight"].as_u64().unwrap_or(0) >= 2 {
                    break 'found agent.name.clone();
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no callee ran two calls at once within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let other = if victim == "callee-1" {
        "callee-2"
    } else {
        "callee-1"
    };
    let callee = fleet.sidecar(&victim).unwrap();
    let agent = fleet.agent(&victim).unwrap();
    let term_ms = now_ms();
    fleet.sidecars[callee].sigterm().unwrap();
    let exit = fleet.sidecars[callee]
        .wait_exit(Duration::from_secs(30))
        .await;
    let exited_ms = now_ms();
    // The other callee alone for a while, then stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let mut outcomes = Vec::new();
    for c in callers {
        outcomes.extend(c.await.unwrap());
    }

    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, r, _)| !matches!(r, Ok((200, _, _))))
        .map(|(t, r, _)| format!("at {} ms after SIGTERM: {r:?}", *t as i64 - term_ms as i64))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} calls not answered 200:\n{}",
        failed.len(),
        outcomes.len(),
        failed.join("\n")
    );
    assert!(outcomes.len() > 40, "only {} calls", outcomes.len());
    let exit = exit.unwrap_or_else(|| panic!("{victim} did not exit within 30 s of SIGTERM"));
    assert!(exit.success(), "{victim} exited with {exit}");
    // The calls it held when it got SIGTERM were completed by its agent during the drain.
    let finished_in_drain = fleet.agents[agent]
        .executions()
        .iter()
        .filter(|e| e.t_ms >= term_ms && e.t_ms <= exited_ms)
        .count();
    assert!(
        finished_in_drain > 0,
        "{victim}'s agent finished no call between the SIGTERM and the exit"
    );
    let after = outcomes
        .iter()
        .filter(|(t, _, _)| *t > exited_ms)
        .filter(|(_, _, agent)| agent.as_deref() == Some(other))
        .count();
    assert!(after > 0, "no call went to {other} after {victim} left");
    assert!(fleet.panics().is_empty(), "{:?}", fleet.panics());
}

/// 2. `kill -9` of the callee's sidecar in the middle of an SSE stream: the client sees the
/// stream end (an error or an early end) well before its deadline, never a hang. A follow-up
/// with the stream's `reach-affinity` key gets `503 affinity_lost` naming the holder
/// (`docs/affinity.md`: `affinity: strict` is the default; the holder refuses the connection,
/// then is gone from the registry) — not an answer from the other agent — both right after the
/// kill and once gossip has dropped the holder. A call with a new key still goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_ends_the_stream_and_the_affinity_key_is_lost() {
    let mut fleet = fleet(
        "faults-sse",
        None,
        &[
            ("stream-1", "10ms", 40, "250ms"),
            ("stream-2", "10ms", 40, "250ms"),
        ],
    )
    .await;
    let outbound = fleet.sidecars[0].outbound;
    let key = [("reach-affinity", "session-42")];

    // Open the stream, read its first event to learn its holder.
    let mut headers = vec![("reach-capability", CAP), ("accept", "text/event-stream")];
    headers.extend_from_slice(&key);
    let response = net::open(outbound, "GET", "/sse", &headers, bytes::Bytes::new())
        .await
        .expect("the stream opens");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), async {
        use http_body_util::BodyExt;
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        let text = String::from_utf8_lossy(data).into_owned();
                        if text.contains("data:") {
                            return text;
                        }
                    }
                }
                other => panic!("the stream ended before its first event: {other:?}"),
            }
        }
    })
    .await
    .expect("a first event within 5 s");
    let holder = ["stream-1", "stream-2"]
        .into_iter()
        .find(|n| first.contains(&format!("\"agent\":\"{n}\"")))
        .unwrap_or_else(|| panic!("which agent streams? {first}"));

    let killed = fleet.sidecar(holder).unwrap();
    fleet.sidecars[killed].kill9();
    let killed_at = Instant::now();

    // The rest of the stream: it must end (error or EOF) within 10 s, short of its 40 events.
    let deadline = Duration::from_secs(10);
    let end = tokio::time::timeout(deadline, async {
        use http_body_util::BodyExt;
        let mut events = 1;
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        events += String::from_utf8_lossy(data).matches("data:").count();
                    }
                }
                Some(Err(e)) => return (events, format!("error: {e}")),
                None => return (events, "end of body".to_owned()),
            }
        }
    })
    .await;
    let (events, how) =
        end.unwrap_or_else(|_| panic!("the stream hung: no end within {deadline:?} of the kill"));
    assert!(
        events < 40,
        "the stream completed ({events} events) after its sidecar was killed"
    );
    println!(
        "stream ended {:?} after the kill ({how}, {events} events)",
        killed_at.elapsed()
    );

    // The follow-up with the same key: 503 affinity_lost, the holder named, at once…
    let lost = |answer: &net::Answer| {
        answer.status == 503
            && answer.header("reach-reason") == "affinity_lost"
            && answer.json()["holder"] == holder
    };
    let right_after = review(outbound, &key).await.expect("an answer");
    assert!(
        lost(&right_after),
        "right after the kill: {} {} {}",
        right_after.status,
        right_after.header("reach-reason"),
        right_after.text()
    );
    // …and once the caller's registry has dropped the holder.
    let deadline = Instant::now() + Duration::from_secs(15);
    while fleet.sidecars[0].peers().await.iter().any(|p| p == holder) {
        assert!(
            Instant::now() < deadline,
            "{holder} still in the caller's registry 15 s after its kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let later = review(outbound, &key).await.expect("an answer");
    assert!(
        lost(&later),
        "after the holder left the registry: {} {} {}",
        later.status,
        later.header("reach-reason"),
        later.text()
    );
    // A stream with a new key goes to the agent that is left, to its end.
    let (n, outcome) = read_stream(
        outbound,
        &[("reach-affinity", "session-43")],
        40,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(outcome, StreamOutcome::Complete, "{n} events");
    assert!(fleet.panics().is_empty(), "{:?}", fleet.panics());
}

/// 3. 50 tasks on the shared Redis store; `redis-server` is killed while they run and started
/// again 3 s later on its port and files (append-only, fsync always). Every task ends `done`, and no agent runs one
/// task's round twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_under_running_tasks_loses_none() {
    if !Redis::installed() {
        eprintln!("skipped: redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let dir = scratch("faults-redis").unwrap();
    let mut redis = Redis::start(&dir.join("redis")).await.unwrap();
    let tasks = format!(
        "{{ store: \"{}\", prefix: \"agent-reach:tasks:faults\", lease: 5s }}",
        redis.url()
    );
    let fleet = fleet(
        "faults-redis",
        Some(&tasks),
        &[
            ("task-1", "200ms..400ms", 5, "100ms"),
            ("task-2", "200ms..400ms", 5, "100ms"),
        ],
    )
    .await;
    let outbound = fleet.sidecars[0].outbound;

    // Submits task `n` under its own key until a 202 (the store may be down in between).
    let submit = |n: usize| async move {
        let key = format!("redis-task-{n}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = review(
                outbound,
                &[("prefer", "respond-async"), ("idempotency-key", &key)],
            )
            .await;
            match answer {
                Ok(a) if a.status == 202 => {
                    return a.json()["id"].as_str().unwrap().to_owned();
                }
                other => assert!(
                    Instant::now() < deadline,
                    "task {n} not accepted within 30 s: {other:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let mut ids = Vec::new();
    for n in 0..25 {
        ids.push(submit(n).await);
    }
    // Mid-way: tasks queued and running. Kill Redis; 3 s later start it again on its files.
    redis.kill9();
    let restarted_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    redis.spawn().await.unwrap();
    for n in 25..50 {
        ids.push(submit(n).await);
    }

    let deadline = Instant::now() + Duration::from_secs(90);
    let mut states = std::collections::BTreeMap::new();
    loop {
        states.clear();
        for id in &ids {
            let state = match net::get_json(outbound, &format!("/reach/v1/tasks/{id}")).await {
                Ok((200, v)) => v["state"].as_str().unwrap_or("?").to_owned(),
                Ok((status, v)) => format!("HTTP {status} {v}"),
                Err(f) => f.to_string(),
            };
            states
                .entry(state)
                .or_insert_with(Vec::new)
                .push(id.clone());
        }
        if states.keys().all(|s| s == "done") {
            break;
        }
        let finished = states
            .keys()
            .all(|s| matches!(s.as_str(), "done" | "failed" | "escalated" | "resolved"));
        if finished || Instant::now() > deadline {
            let summary: Vec<String> = states
                .iter()
                .map(|(s, ids)| format!("{s}: {} (e.g. {})", ids.len(), ids[0]))
                .collect();
            let example = states
                .iter()
                .find(|(s, _)| s.as_str() != "done")
                .map(|(_, ids)| ids[0].clone())
                .unwrap_or_default();
            let detail = net::get_json(outbound, &format!("/reach/v1/tasks/{example}"))
                .await
                .map(|(_, v)| v.to_string())
                .unwrap_or_default();
            panic!(
                "{:.0} s after the Redis restart, not every task is done: {}\nfor example: {detail}",
                restarted_at.elapsed().as_secs_f64(),
                summary.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all: Vec<_> = fleet.agents.iter().flat_map(|a| a.executions()).collect();
    let executions = chaos::check::executions(&all, &[]);
    assert!(
        executions.duplicates.is_empty(),
        "{:?}",
        executions.duplicates
    );
    assert!(fleet.panics().is_empty(), "{:?}", fleet.panics());
    drop(fleet);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}
