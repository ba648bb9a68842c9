//! The checker: reads back every accepted task and every agent's execution log, and holds the
//! run to what the fleet promises — no accepted task lost, no agent running one key's round
//! twice, no sync call lost by a draining sidecar, no stream left hanging, no panic.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinSet;

use super::fleet::Execution;
use super::load::{StreamOutcome, StreamRecord, SyncRecord, TaskRecord};
use super::net::{self, Failure};
use super::schedule::{Fault, Kind};

/// Accepted tasks, by how they ended.
#[derive(Debug, Default)]
pub struct Tasks {
    pub accepted: usize,
    pub done: usize,
    pub escalated: usize,
    pub resolved: usize,
    /// `failed` with the agent's own answer recorded: allowed.
    pub failed_by_agent: usize,
    /// `failed` without an agent's answer: the fleet gave up on it (lost), with its error.
    pub failed: Vec<(String, String)>,
    /// 404 on read-back: lost.
    pub missing: Vec<String>,
    /// Not finished by the deadline (id, state): lost.
    pub stuck: Vec<(String, String)>,
    /// Why escalated tasks escalated.
    pub escalated_why: BTreeMap<String, usize>,
    /// Escalated because nobody served the capability (`unknown_capability`): docs/tasks.md
    /// ("Nobody to ask is not a failure") has such a task wait for an agent instead.
    pub unasked: Vec<(String, String)>,
    /// Done tasks whose answering round (`<key>#<round>`) no agent logged.
    pub done_unlogged: usize,
    pub waited: Duration,
}

impl Tasks {
    pub fn lost(&self) -> usize {
        self.failed.len() + self.missing.len() + self.stuck.len()
    }
}

/// Polls every accepted task on the sidecar that accepted it until it is finished or `within`
/// has passed.
pub async fn tasks(
    records: &[TaskRecord],
    entries: &HashMap<String, SocketAddr>,
    within: Duration,
) -> (Tasks, HashMap<String, Value>) {
    let mut unique: BTreeMap<String, &TaskRecord> = BTreeMap::new();
    for r in records {
        unique.entry(r.id.clone()).or_insert(r);
    }
    let mut report = Tasks {
        accepted: unique.len(),
        ..Tasks::default()
    };
    let started = Instant::now();
    let mut pending: Vec<(String, SocketAddr)> = unique
        .values()
        .filter_map(|r| entries.get(&r.entry).map(|a| (r.id.clone(), *a)))
        .collect();
    let mut last: HashMap<String, (u16, Value)> = HashMap::new();
    let mut finished: HashMap<String, Value> = HashMap::new();
    loop {
        let mut still = Vec::new();
        for chunk in pending.chunks(16) {
            let mut reads = JoinSet::new();
            for (id, addr) in chunk {
                let (id, addr) = (id.clone(), *addr);
                reads.spawn(async move {
                    let got = net::get_json(addr, &format!("/reach/v1/tasks/{id}")).await;
                    (id, addr, got)
                });
            }
            while let Some(Ok((id, addr, got))) = reads.join_next().await {
                match got {
                    Ok((200, v)) if is_final(&v) => {
                        finished.insert(id, v);
                    }
                    Ok((status, v)) => {
                        last.insert(id.clone(), (status, v));
                        still.push((id, addr));
                    }
                    Err(f) => {
                        last.insert(id.clone(), (0, Value::String(f.to_string())));
                        still.push((id, addr));
                    }
                }
            }
        }
        pending = still;
        if pending.is_empty() || started.elapsed() > within {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    report.waited = started.elapsed();
    for (id, _) in pending {
        match last.get(&id) {
            Some((404, _)) => report.missing.push(id),
            Some((200, v)) => report
                .stuck
                .push((id, v["state"].as_str().unwrap_or("?").to_owned())),
            Some((status, v)) => report.stuck.push((id, format!("HTTP {status}: {v}"))),
            None => report.stuck.push((id, "never read".to_owned())),
        }
    }
    for (id, v) in &finished {
        match v["state"].as_str().unwrap_or("") {
            "done" => report.done += 1,
            "escalated" => {
                report.escalated += 1;
                let why = v["error"].as_str().unwrap_or("?").to_owned();
                if unasked(&why) {
                    report.unasked.push((id.clone(), why.clone()));
                }
                *report.escalated_why.entry(why).or_default() += 1;
            }
            "resolved" => report.resolved += 1,
            _ if agents_answer(v) => report.failed_by_agent += 1,
            _ => report.failed.push((
                id.clone(),
                v["error"]
                    .as_str()
                    .unwrap_or("no error recorded")
                    .to_owned(),
            )),
        }
    }
    (report, finished)
}

/// A chain that asked nobody because nobody served the capability (a sidecar just restarted,
/// gossip has not found its peers). `no_available_instance` is not counted: servers ejected
/// for failing are a failed chain that may escalate (docs/tasks.md).
fn unasked(error: &str) -> bool {
    error.contains("unknown_capability")
}

fn is_final(v: &Value) -> bool {
    matches!(
        v["state"].as_str(),
        Some("done" | "failed" | "escalated" | "resolved")
    )
}

/// A failed task whose recorded response is the agent's own (no `reach-reason`: not one the
/// sidecar produced).
fn agents_answer(v: &Value) -> bool {
    let response = &v["response"];
    if !response.is_object() {
        return false;
    }
    let headers = &response["headers"];
    let by_sidecar = match headers {
        Value::Array(pairs) => pairs.iter().any(|p| {
            p[0].as_str()
                .is_some_and(|n| n.eq_ignore_ascii_case("reach-reason"))
        }),
        Value::Object(map) => map.keys().any(|k| k.eq_ignore_ascii_case("reach-reason")),
        _ => false,
    };
    !by_sidecar
}

/// What the agents' logs say.
#[derive(Debug, Default)]
pub struct Executions {
    pub total: usize,
    pub keyed: usize,
    /// One agent ran one key twice with no fault on it (or its sidecar) in between.
    pub duplicates: Vec<String>,
    /// ... with such a fault in between: allowed (its sidecar's memory of the key was gone,
    /// or it died after answering).
    pub excused: usize,
    /// Keys run by two or more agents (at least once, across a crash or a cut-off answer).
    pub on_several_agents: usize,
}

/// Keys run more than once by one agent, judged against the faults.
pub fn executions(all: &[Execution], faults: &[Fault]) -> Executions {
    let mut report = Executions {
        total: all.len(),
        ..Executions::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&Execution>> = BTreeMap::new();
    for e in all {
        if let Some(key) = &e.key {
            by_key.entry(key.as_str()).or_default().push(e);
        }
    }
    report.keyed = by_key.values().map(Vec::len).sum();
    for (key, mut runs) in by_key {
        runs.sort_by_key(|e| e.t_ms);
        let mut agents: Vec<&str> = runs.iter().map(|e| e.agent.as_str()).collect();
        agents.sort_unstable();
        agents.dedup();
        if agents.len() > 1 {
            report.on_several_agents += 1;
        }
        for agent in agents {
            let mine: Vec<&&Execution> = runs.iter().filter(|e| e.agent == agent).collect();
            for pair in mine.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                let fault = faults.iter().find(|f| {
                    f.target == agent
                        && matches!(
                            f.kind,
                            Kind::KillSidecar
                                | Kind::TermSidecar
                                | Kind::KillAgent
                                | Kind::Partition
                        )
                        && f.end_ms >= a.t_ms
                        && f.start_ms <= b.t_ms
                });
                match fault {
                    Some(_) => report.excused += 1,
                    None => report.duplicates.push(format!(
                        "{agent} ran `{key}` at {} (pid {}) and again at {} (pid {})",
                        a.t_ms, a.pid, b.t_ms, b.pid
                    )),
                }
            }
        }
    }
    report
}

/// Done tasks whose answering round no agent logged (replays are logged by the run they
/// replay, so every done task has one).
pub fn done_unlogged(
    records: &[TaskRecord],
    finished: &HashMap<String, Value>,
    all: &[Execution],
) -> usize {
    let keys: std::collections::HashSet<&str> =
        all.iter().filter_map(|e| e.key.as_deref()).collect();
    let mut seen = std::collections::HashSet::new();
    records
        .iter()
        .filter(|r| seen.insert(r.id.as_str()))
        .filter(|r| {
            let Some(v) = finished.get(&r.id) else {
                return false;
            };
            if v["state"] != "done" {
                return false;
            }
            let key = r.key.as_deref().unwrap_or(&r.id);
            let round = v["rounds"].as_u64().unwrap_or(1);
            !keys.contains(format!("{key}#{round}").as_str())
        })
        .count()
}

/// Sync calls, judged against the faults on their entry.
#[derive(Debug, Default)]
pub struct Sync {
    pub calls: usize,
    pub ok: usize,
    /// Answered with an error status, by `status reason`.
    pub errors: BTreeMap<String, usize>,
    /// ... of which during a drain of some sidecar.
    pub errors_in_drain: BTreeMap<String, usize>,
    /// Never accepted: nothing listened, or the connect failed.
    pub refused: usize,
    /// Cut off by a SIGKILL of the sidecar they were sent to: allowed.
    pub cut_by_kill: usize,
    /// Taken by a draining sidecar and not answered: lost.
    pub lost_in_drain: Vec<String>,
    /// Taken and not answered with no kill to explain it: lost.
    pub lost: Vec<String>,
    pub keys: usize,
    /// Keys whose every attempt failed (retried about 40 times).
    pub keys_unanswered: usize,
}

impl Sync {
    pub fn lost(&self) -> usize {
        self.lost_in_drain.len() + self.lost.len()
    }
}

fn overlaps(from: u64, to: u64, a: u64, b: u64) -> bool {
    from <= b && to >= a
}

pub fn sync(records: &[SyncRecord], faults: &[Fault]) -> Sync {
    let mut report = Sync {
        calls: records.len(),
        ..Sync::default()
    };
    let drains: Vec<(u64, u64)> = faults
        .iter()
        .filter(|f| f.kind == Kind::TermSidecar)
        .map(|f| (f.start_ms, f.exited_ms.unwrap_or(f.end_ms)))
        .collect();
    let mut keys: BTreeMap<&str, bool> = BTreeMap::new();
    for r in records {
        if let Some(key) = &r.key {
            let answered = matches!(&r.outcome, Ok((s, _)) if *s < 500);
            *keys.entry(key.as_str()).or_default() |= answered;
        }
        match &r.outcome {
            Ok((200, _)) => report.ok += 1,
            Ok((status, reason)) => {
                let what = format!("{status} {reason}");
                if drains
                    .iter()
                    .any(|(a, b)| overlaps(*a, *b, r.start_ms, r.end_ms))
                {
                    *report.errors_in_drain.entry(what.clone()).or_default() += 1;
                }
                *report.errors.entry(what).or_default() += 1;
            }
            Err(Failure::Refused | Failure::Connect(_)) => report.refused += 1,
            Err(failure) => {
                let on_entry = |kind: Kind| {
                    faults.iter().find(|f| {
                        f.kind == kind
                            && f.target == r.entry
                            && overlaps(f.start_ms, f.end_ms, r.start_ms, r.end_ms + 500)
                    })
                };
                let line = format!(
                    "{} {}..{} ms{}: {failure}",
                    r.entry,
                    r.start_ms,
                    r.end_ms,
                    r.key
                        .as_ref()
                        .map_or_else(String::new, |k| format!(" key {k}"))
                );
                if on_entry(Kind::KillSidecar).is_some() {
                    report.cut_by_kill += 1;
                } else if let Some(f) = on_entry(Kind::TermSidecar) {
                    let exited = f.exited_ms.unwrap_or(f.end_ms);
                    if r.start_ms <= exited {
                        report.lost_in_drain.push(line);
                    } else {
                        report.lost.push(line);
                    }
                } else {
                    report.lost.push(line);
                }
            }
        }
    }
    report.keys = keys.len();
    report.keys_unanswered = keys.values().filter(|a| !**a).count();
    report
}

/// SSE streams.
#[derive(Debug, Default)]
pub struct Streams {
    pub total: usize,
    pub complete: usize,
    /// Ended cleanly before the last event (an error, a reset, an early end).
    pub ended: usize,
    pub not_connected: usize,
    pub statuses: BTreeMap<String, usize>,
    /// Neither complete nor ended by the deadline.
    pub hung: Vec<String>,
}

pub fn streams(records: &[StreamRecord]) -> Streams {
    let mut report = Streams {
        total: records.len(),
        ..Streams::default()
    };
    for r in records {
        match &r.outcome {
            StreamOutcome::Complete => report.complete += 1,
            StreamOutcome::Ended(_) => report.ended += 1,
            StreamOutcome::NotConnected(_) => report.not_connected += 1,
            StreamOutcome::Status(s, reason) => {
                *report.statuses.entry(format!("{s} {reason}")).or_default() += 1;
            }
            StreamOutcome::Hung => report.hung.push(format!(
                "{} {}..{} ms after {} events",
                r.entry, r.start_ms, r.end_ms, r.events
            )),
        }
    }
    report
}
