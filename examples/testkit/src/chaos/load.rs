//! The mixed load: sync calls, keyed calls (`idempotency-key`, retried under the same key),
//! async tasks (`prefer: respond-async`, some under a key of their own, resubmitted when a
//! submission is cut off) and SSE streams, each at its own rate, every call on its own
//! connection, every outcome recorded with the run's clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::net::{self, now_ms, Failure};

/// The capability every worker serves.
pub const CAP: &str = "code-review";

/// A sidecar's outbound port that clients call.
#[derive(Clone, Debug)]
pub struct Entry {
    pub name: String,
    pub outbound: SocketAddr,
}

/// One sync call (one attempt of a keyed call).
#[derive(Clone, Debug)]
pub struct SyncRecord {
    pub entry: String,
    pub key: Option<String>,
    pub start_ms: u64,
    pub end_ms: u64,
    /// The status and the sidecar's reason, or how the call failed.
    pub outcome: Result<(u16, String), Failure>,
}

/// An accepted task: a `202` with its id.
#[derive(Clone, Debug)]
pub struct TaskRecord {
    pub entry: String,
    pub id: String,
    /// The submission's `idempotency-key` (the task's key), if it had one.
    pub key: Option<String>,
    pub at_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamOutcome {
    /// Every event, then the end.
    Complete,
    /// Fewer events, then a clean end: the body ended or broke off (why).
    Ended(String),
    /// Neither by the deadline.
    Hung,
    /// Not a stream: a status with the sidecar's reason.
    Status(u16, String),
    /// Never connected (nothing listened) or another connect error.
    NotConnected(String),
}

#[derive(Clone, Debug)]
pub struct StreamRecord {
    pub entry: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub events: u32,
    pub outcome: StreamOutcome,
}

/// Everything the load saw.
#[derive(Default)]
pub struct Recorder {
    pub sync: Mutex<Vec<SyncRecord>>,
    pub tasks: Mutex<Vec<TaskRecord>>,
    /// Submissions that got no `202`, by what they got instead.
    pub refused_tasks: Mutex<BTreeMap<String, u64>>,
    pub streams: Mutex<Vec<StreamRecord>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recorder {
    pub fn accepted(&self) -> usize {
        let tasks = lock(&self.tasks);
        let mut ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    pub fn sync_records(&self) -> Vec<SyncRecord> {
        lock(&self.sync).clone()
    }

    pub fn task_records(&self) -> Vec<TaskRecord> {
        lock(&self.tasks).clone()
    }

    pub fn stream_records(&self) -> Vec<StreamRecord> {
        lock(&self.streams).clone()
    }

    pub fn refused(&self) -> BTreeMap<String, u64> {
        lock(&self.refused_tasks).clone()
    }

    /// Records a task accepted outside the load (a probe).
    pub fn accept(&self, entry: &str, id: &str, key: Option<String>) {
        lock(&self.tasks).push(TaskRecord {
            entry: entry.to_owned(),
            id: id.to_owned(),
            key,
            at_ms: now_ms(),
        });
    }

    fn refuse(&self, what: String) {
        *lock(&self.refused_tasks).entry(what).or_default() += 1;
    }
}

/// What to send, how often, where.
#[derive(Clone, Debug)]
pub struct LoadPlan {
    pub seed: u64,
    pub sync_per_s: f64,
    pub keyed_per_s: f64,
    pub tasks_per_s: f64,
    pub streams_per_s: f64,
    /// Entries for sync, keyed calls and streams.
    pub sync_entries: Vec<Entry>,
    /// Entries that keep tasks.
    pub task_entries: Vec<Entry>,
    /// A sync call with no complete answer by then is counted hung.
    pub call_deadline: Duration,
    pub stream_deadline: Duration,
    /// Events a complete stream has.
    pub stream_events: u32,
}

/// The load's loops, running until `stop`; `join` waits for every call in flight.
pub struct Load {
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(plan: &LoadPlan, recorder: &Arc<Recorder>, stop: &CancellationToken) -> Self {
        let plan = Arc::new(plan.clone());
        let mut loops = Vec::new();
        let kinds: [(f64, Kind); 4] = [
            (plan.sync_per_s, Kind::Sync),
            (plan.keyed_per_s, Kind::Keyed),
            (plan.tasks_per_s, Kind::Task),
            (plan.streams_per_s, Kind::Stream),
        ];
        for (i, (rate, kind)) in kinds.into_iter().enumerate() {
            if rate <= 0.0 {
                continue;
            }
            let (plan, recorder, stop) = (plan.clone(), recorder.clone(), stop.clone());
            loops.push(tokio::spawn(run_loop(
                plan, recorder, stop, rate, kind, i as u64,
            )));
        }
        Self { loops }
    }

    pub async fn join(self) {
        for l in self.loops {
            let _ = l.await;
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Sync,
    Keyed,
    Task,
    Stream,
}

/// Starts one call of `kind` every 1/rate s (open loop: a slow call does not hold the next).
async fn run_loop(
    plan: Arc<LoadPlan>,
    recorder: Arc<Recorder>,
    stop: CancellationToken,
    rate: f64,
    kind: Kind,
    stream: u64,
) {
    let mut rng = StdRng::seed_from_u64(plan.seed.wrapping_mul(31).wrapping_add(stream));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut calls = JoinSet::new();
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        n += 1;
        let entries = match kind {
            Kind::Task => &plan.task_entries,
            _ => &plan.sync_entries,
        };
        if entries.is_empty() {
            continue;
        }
        let first = rng.random_range(0..entries.len());
        let flip = rng.random_bool(0.5);
        let (plan, recorder) = (plan.clone(), recorder.clone());
        let seed = plan.seed;
        match kind {
            Kind::Sync => calls.spawn(async move { sync(&plan, &recorder, first).await }),
            Kind::Keyed => calls.spawn(async move {
                keyed(&plan, &recorder, first, &format!("sync-{seed}-{n}")).await;
            }),
            Kind::Task => calls.spawn(async move {
                let key = flip.then(|| format!("task-{seed}-{n}"));
                task(&plan, &recorder, first, key).await;
            }),
            Kind::Stream => calls.spawn(async move { sse(&plan, &recorder, first).await }),
        };
        // Reap what finished, so the set does not grow with the run.
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}

async fn post_review(
    plan: &LoadPlan,
    entry: &Entry,
    extra: &[(&str, &str)],
    body: &'static str,
) -> (u64, u64, Result<net::Answer, Failure>) {
    let mut headers = vec![("reach-capability", CAP)];
    headers.extend_from_slice(extra);
    let start = now_ms();
    let result = net::call(
        entry.outbound,
        "POST",
        "/review",
        &headers,
        Bytes::from_static(body.as_bytes()),
        plan.call_deadline,
    )
    .await;
    (start, now_ms(), result)
}

/// A plain sync call; refused by a sidecar that is down, it goes to the next entry once.
async fn sync(plan: &LoadPlan, recorder: &Recorder, first: usize) {
    for i in 0..2 {
        let entry = &plan.sync_entries[(first + i) % plan.sync_entries.len()];
        let (start_ms, end_ms, result) = post_review(plan, entry, &[], "x = 1").await;
        let refused = matches!(result, Err(Failure::Refused));
        lock(&recorder.sync).push(SyncRecord {
            entry: entry.name.clone(),
            key: None,
            start_ms,
            end_ms,
            outcome: result.map(|a| (a.status, a.reason())),
        });
        if !refused {
            return;
        }
    }
}

/// A keyed call, tried again under the same key through the same entry until it is answered
/// (a sidecar restarting in between is waited for, up to ~15 s).
async fn keyed(plan: &LoadPlan, recorder: &Recorder, first: usize, key: &str) {
    let entry = &plan.sync_entries[first];
    for _ in 0..40 {
        let (start_ms, end_ms, result) =
            post_review(plan, entry, &[("idempotency-key", key)], "keyed = 1").await;
        let again = match &result {
            Ok(a) => a.status >= 500,
            Err(_) => true,
        };
        lock(&recorder.sync).push(SyncRecord {
            entry: entry.name.clone(),
            key: Some(key.to_owned()),
            start_ms,
            end_ms,
            outcome: result.map(|a| (a.status, a.reason())),
        });
        if !again {
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A task submission; one with a key is submitted again under it until a `202` (the same task,
/// `existing: true`, when the first was stored and its answer cut off).
async fn task(plan: &LoadPlan, recorder: &Recorder, first: usize, key: Option<String>) {
    let entry = &plan.task_entries[first];
    let tries = if key.is_some() { 40 } else { 1 };
    for _ in 0..tries {
        let mut extra = vec![("prefer", "respond-async")];
        if let Some(key) = &key {
            extra.push(("idempotency-key", key.as_str()));
        }
        let (_, end_ms, result) = post_review(plan, entry, &extra, "{\"diff\": 1}").await;
        match result {
            Ok(a) if a.status == 202 => {
                if let Some(id) = a.json()["id"].as_str() {
                    lock(&recorder.tasks).push(TaskRecord {
                        entry: entry.name.clone(),
                        id: id.to_owned(),
                        key: key.clone(),
                        at_ms: end_ms,
                    });
                    return;
                }
                recorder.refuse("202 without an id".to_owned());
            }
            Ok(a) => recorder.refuse(format!("{} {}", a.status, a.reason())),
            Err(Failure::Refused) => recorder.refuse("refused (sidecar down)".to_owned()),
            Err(f) => recorder.refuse(format!("cut off ({})", short(&f))),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn short(f: &Failure) -> &'static str {
    match f {
        Failure::Refused => "refused",
        Failure::Connect(_) => "connect",
        Failure::Broken(_) => "broken",
        Failure::BodyBroken(_) => "body broken",
        Failure::Timeout => "timeout",
    }
}

/// An SSE stream read to its end within the deadline.
async fn sse(plan: &LoadPlan, recorder: &Recorder, first: usize) {
    let entry = &plan.sync_entries[first];
    let start_ms = now_ms();
    let (events, outcome) = read_stream(
        entry.outbound,
        &[],
        plan.stream_events,
        plan.stream_deadline,
    )
    .await;
    lock(&recorder.streams).push(StreamRecord {
        entry: entry.name.clone(),
        start_ms,
        end_ms: now_ms(),
        events,
        outcome,
    });
}

/// `GET /sse` for [`CAP`] through `outbound`: the events seen and how the stream ended.
pub async fn read_stream(
    outbound: SocketAddr,
    extra: &[(&str, &str)],
    expected: u32,
    deadline: Duration,
) -> (u32, StreamOutcome) {
    let mut headers = vec![("reach-capability", CAP), ("accept", "text/event-stream")];
    headers.extend_from_slice(extra);
    let mut events = 0u32;
    let read = async {
        let response = match net::open(outbound, "GET", "/sse", &headers, Bytes::new()).await {
            Ok(r) => r,
            Err(Failure::Refused | Failure::Connect(_)) => {
                return StreamOutcome::NotConnected("connect".to_owned())
            }
            Err(f) => return StreamOutcome::Ended(f.to_string()),
        };
        if response.status() != 200 {
            let status = response.status().as_u16();
            let reason = response
                .headers()
                .get("reach-reason")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            return StreamOutcome::Status(status, reason);
        }
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        events += data.windows(5).filter(|w| *w == b"data:").count() as u32;
                    }
                }
                Err(e) => return StreamOutcome::Ended(net::error_chain(&e)),
            }
        }
        if events >= expected {
            StreamOutcome::Complete
        } else {
            StreamOutcome::Ended(format!("ended after {events} of {expected} events"))
        }
    };
    let outcome = tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(StreamOutcome::Hung);
    (events, outcome)
}
