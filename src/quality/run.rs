//! One run of a capability's golden tasks against the local agent, and the recording of their
//! baselines (`agent-reach baseline record`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::compare::{self, Compared};
use crate::agent_request::{self, AgentRequest};
use crate::config::{Capability, GoldenTask, QualitySpec, Snapshot};
use crate::http::client::AgentClient;

/// The `reach-probe` value golden tasks carry: sidecar traffic, not production work.
const MARKER: &str = "golden";

/// Why a golden task could not be judged (it then counts neither for nor against the agent:
/// whether it answers at all is the probes' and the traffic's business).
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("baseline {}: missing (write it with `agent-reach baseline record`)", .0.display())]
    BaselineMissing(PathBuf),
    #[error("baseline {}: {why}", path.display())]
    BaselineUnreadable { path: PathBuf, why: String },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Send(String),
    #[error("skipped: the agent has no free slot to spare")]
    Saturated,
    #[error("answer {status} is not one to record ({why})")]
    NotRecordable { status: u16, why: String },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One golden task's outcome in a run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TaskOutcome {
    pub(crate) method: String,
    pub(crate) path: String,
    /// `None` when the task could not be judged (`error` says why).
    pub(crate) similarity: Option<f64>,
    /// The fields (JSON pointers) that differ from the baseline, or the gate that failed.
    pub differing: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// One run of a capability's golden tasks.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunReport {
    pub(crate) capability: String,
    /// The mean over the judged tasks; `None` when none could be judged (no verdict).
    pub similarity: Option<f64>,
    pub(crate) threshold: f64,
    /// The similarity is below the threshold.
    pub(crate) degraded: bool,
    pub tasks: Vec<TaskOutcome>,
}

/// Sends every golden task of `capability` to the agent and compares the answers with their
/// baselines. `may_send` is asked before each task: a task never takes the agent's last slot.
pub(crate) async fn run(
    client: &AgentClient,
    snapshot: &Snapshot,
    capability: &Capability,
    spec: &QualitySpec,
    may_send: impl Fn() -> bool,
) -> RunReport {
    let mut tasks = Vec::with_capacity(spec.tasks.len());
    for task in &spec.tasks {
        let judged = if may_send() {
            judge(client, snapshot, capability, task).await
        } else {
            Err(TaskError::Saturated)
        };
        tasks.push(match judged {
            Ok(c) => outcome(task, Some(c.similarity), c.differing, None),
            Err(err) => outcome(task, None, Vec::new(), Some(err.to_string())),
        });
    }
    let judged: Vec<f64> = tasks.iter().filter_map(|t| t.similarity).collect();
    let similarity = (!judged.is_empty()).then(|| compare::mean(judged));
    RunReport {
        capability: capability.name.to_string(),
        similarity,
        threshold: spec.threshold,
        degraded: similarity.is_some_and(|s| s < spec.threshold),
        tasks,
    }
}

fn outcome(
    task: &GoldenTask,
    similarity: Option<f64>,
    differing: Vec<String>,
    error: Option<String>,
) -> TaskOutcome {
    TaskOutcome {
        method: task.method.clone(),
        path: task.path.clone(),
        similarity,
        differing,
        error,
    }
}

async fn judge(
    client: &AgentClient,
    snapshot: &Snapshot,
    capability: &Capability,
    task: &GoldenTask,
) -> Result<Compared, TaskError> {
    // Read first: without a baseline there is nothing to compare, so the agent is not asked.
    let baseline = read_baseline(&task.baseline)?;
    let (status, answer) = answer(client, snapshot, capability, task).await?;
    Ok(compare::compare(
        &task.compare,
        schema_of(capability),
        status,
        &answer,
        &baseline,
    ))
}

/// The baseline's text; missing and unreadable are told apart for `check`.
pub(crate) fn read_baseline(path: &Path) -> Result<String, TaskError> {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map_err(|_| unreadable(path, "not UTF-8".to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(TaskError::BaselineMissing(path.to_owned()))
        }
        Err(e) => Err(unreadable(path, e.to_string())),
    }
}

fn unreadable(path: &Path, why: String) -> TaskError {
    TaskError::BaselineUnreadable {
        path: path.to_owned(),
        why,
    }
}

/// A baseline as `check` wants it: present, readable, and JSON when the task compares JSON.
pub fn check_baseline(task: &GoldenTask) -> Result<(), TaskError> {
    let text = read_baseline(&task.baseline)?;
    let compares_json = !task.compare.json_fields.is_empty() || task.compare.text_field.is_some();
    if compares_json {
        serde_json::from_str::<serde_json::Value>(&text)
            .map_err(|e| unreadable(&task.baseline, format!("not JSON: {e}")))?;
    }
    Ok(())
}

/// Sends one golden task, with the capability's own timeout: golden tasks are real work.
async fn answer(
    client: &AgentClient,
    snapshot: &Snapshot,
    capability: &Capability,
    task: &GoldenTask,
) -> Result<(u16, String), TaskError> {
    let timeout = capability.timeout_or(snapshot.policy.timeouts.request.get());
    let request = AgentRequest {
        method: &task.method,
        path: &task.path,
        headers: &task.headers,
        body: task.body.as_deref(),
        marker: MARKER,
    };
    match tokio::time::timeout(timeout, agent_request::send(client, snapshot, request)).await {
        Err(_) => Err(TaskError::Timeout(timeout)),
        Ok(Err((message, _))) => Err(TaskError::Send(message)),
        Ok(Ok((_, status, text))) => Ok((status.as_u16(), text)),
    }
}

/// Runs each golden task of `capability` once and writes its answer as the task's baseline.
/// An answer that is not a 2xx, or fails the capability's output schema, is not written.
pub async fn record(
    client: &AgentClient,
    snapshot: &Snapshot,
    capability: &Capability,
    spec: &QualitySpec,
) -> Vec<Result<PathBuf, TaskError>> {
    let mut written = Vec::with_capacity(spec.tasks.len());
    for task in &spec.tasks {
        written.push(record_one(client, snapshot, capability, task).await);
    }
    written
}

async fn record_one(
    client: &AgentClient,
    snapshot: &Snapshot,
    capability: &Capability,
    task: &GoldenTask,
) -> Result<PathBuf, TaskError> {
    let (status, answer) = answer(client, snapshot, capability, task).await?;
    // The same gate a run applies: a baseline that fails it would make every run score 0.
    let gate = compare::compare(
        &task.compare,
        schema_of(capability),
        status,
        &answer,
        &answer,
    );
    if gate.similarity < 1.0 {
        return Err(TaskError::NotRecordable {
            status,
            why: gate.differing.join(", "),
        });
    }
    let path = &task.baseline;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| write_error(path, source))?;
    }
    std::fs::write(path, answer.as_bytes()).map_err(|source| write_error(path, source))?;
    Ok(path.clone())
}

fn write_error(path: &Path, source: std::io::Error) -> TaskError {
    TaskError::Write {
        path: path.to_owned(),
        source,
    }
}

fn schema_of(capability: &Capability) -> Option<&crate::config::CompiledSchema> {
    capability
        .output_schema
        .as_ref()
        .and_then(|s| s.compiled())
        .map(|s| s.as_ref())
}
