//! The task queue as the outbound port sees it: submission (`prefer: respond-async`), reading,
//! and a person's `retry` and `resolve`. Every change is in the store before it is answered.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::request::Parts;
use tokio::sync::Notify;

use super::callback::{self, Refused};
use super::model::{now_ms, Delivery, Resolution, State, StoredRequest, Task};
use super::store::{Inserted, StoreError, TaskStore};
use crate::config::{ConfigStore, StoreLocation, TasksConfig};
use crate::error::ReachError;
use crate::http::headers;
use crate::idempotency;
use crate::metrics::Metrics;

/// `prefer: respond-async` (RFC 7240) makes a call a task.
pub(crate) const PREFER: http::HeaderName = http::HeaderName::from_static("prefer");
/// Where the final result is POSTed.
pub(crate) const CALLBACK: http::HeaderName = http::HeaderName::from_static("reach-callback");
/// 0..9, higher first.
pub(crate) const PRIORITY: http::HeaderName = http::HeaderName::from_static("reach-priority");
/// The path of the task API on the outbound port.
pub const TASKS_PATH: &str = "/reach/v1/tasks";

/// Whether `prefer` asks for an asynchronous answer.
pub(crate) fn wants_async(headers: &http::HeaderMap) -> bool {
    headers.get_all(PREFER).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("respond-async"))
        })
    })
}

/// The store, and a bell that wakes the runners when work is added.
#[derive(Debug)]
pub(crate) struct Queue {
    pub(super) store: TaskStore,
    pub(super) config: TasksConfig,
    /// This sidecar's runner name in leases: its member name and a per-start nonce, so a
    /// restarted sidecar never mistakes a dead predecessor's lease for its own.
    pub(super) owner: String,
    pub(super) wake: Notify,
    pub(super) metrics: Arc<Metrics>,
    /// The live config, for the callback policy: set when the runner starts (`attach`). Until
    /// then a callback is refused rather than let through unchecked.
    live: OnceLock<Arc<ConfigStore>>,
}

fn store_error(err: StoreError) -> ReachError {
    match err {
        StoreError::Conflict(id) => {
            ReachError::TaskConflict(format!("task {id} changed while this ran; read it again"))
        }
        StoreError::Missing(id) => ReachError::NotFound(format!("{}/{id}", TASKS_PATH)),
        StoreError::Full(why) => ReachError::TaskStoreFull(why),
        StoreError::Backend(why) => ReachError::TaskStore(why),
        other => ReachError::TaskStore(other.to_string()),
    }
}

/// The answer to a submission.
#[derive(Debug)]
pub(crate) struct Submitted {
    pub(crate) task: Task,
    /// The id was already taken by the same request: this is the stored task.
    pub(crate) existing: bool,
}

impl Queue {
    /// Opens the store the bootstrap names (`base`: the bootstrap's directory).
    pub(crate) async fn open(
        config: &TasksConfig,
        base: Option<&std::path::Path>,
        agent: &str,
        member: &str,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, String> {
        let config = config.resolved(base);
        let location = config.location()?;
        // Replicas of one caller share a queue: in Kubernetes the agent name is the pod's, so
        // the injector names the workload (`AGENT_REACH_WORKLOAD`).
        let prefix = config.prefix.clone().unwrap_or_else(|| {
            let workload = std::env::var("AGENT_REACH_WORKLOAD")
                .ok()
                .filter(|w| !w.is_empty())
                .unwrap_or_else(|| agent.to_owned());
            format!("agent-reach:tasks:{workload}")
        });
        let limits = crate::tasks::store::Limits {
            max_tasks: config.max_tasks,
            max_bytes: config.max_bytes,
        };
        let store = TaskStore::open(&location, &prefix, limits, metrics.clone()).await;
        match (store.down(), &location) {
            (Some(down), _) => tracing::warn!(store = store.kind(), error = %down.error,
                "task store cannot be opened: synchronous calls are served; task submissions answer 503 until it opens"),
            (None, StoreLocation::File(path)) => {
                tracing::info!(path = %path.display(), "task store open")
            }
            (None, _) => tracing::info!(prefix = %prefix, "task store open (redis)"),
        }
        Ok(Arc::new(Self {
            store,
            config,
            owner: format!("{member}-{:08x}", rand::random::<u32>()),
            wake: Notify::new(),
            metrics,
            live: OnceLock::new(),
        }))
    }

    /// Gives the queue the live config its callback checks read.
    pub(crate) fn attach(&self, config: Arc<ConfigStore>) {
        let _ = self.live.set(config);
    }

    /// The `reach-callback` URL, when the live policy allows it (`callback::check`).
    fn callback_url(&self, value: &http::HeaderValue) -> Result<String, Refused> {
        let text = value.to_str().map_err(|_| Refused::NotHttp)?.trim();
        let live = self.live.get().ok_or(Refused::NotReady)?.snapshot();
        callback::check(text, &live.policy, &live.bootstrap.listen)?;
        Ok(text.to_owned())
    }

    /// The largest body a task may carry.
    pub(crate) fn max_payload(&self) -> usize {
        self.config.max_payload_bytes
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.store.kind()
    }

    /// Since when and why the store has been failing; `None` while it works.
    pub(crate) fn store_down(&self) -> Option<crate::tasks::store::Down> {
        self.store.down()
    }

    /// Stores the call as a task (durable on return) and wakes a runner. A call with an
    /// idempotency key is the task of that key: its resubmission returns the stored task, and
    /// the same key with another request is refused.
    pub(crate) async fn submit(
        &self,
        capability: &str,
        parts: &Parts,
        body: Bytes,
    ) -> Result<Submitted, ReachError> {
        let callback = match parts.headers.get(CALLBACK) {
            None => None,
            Some(value) => Some(
                self.callback_url(value)
                    .map_err(|refused| ReachError::CallbackRefused(refused.to_string()))?,
            ),
        };
        let priority = match parts.headers.get(PRIORITY) {
            None => 5,
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u8>().ok())
                .filter(|p| *p <= 9)
                .ok_or_else(|| {
                    ReachError::BadRequest("`reach-priority` is a whole number from 0 to 9".into())
                })?,
        };
        let caller_key = idempotency::key_of(&parts.headers);
        let id = match &caller_key {
            Some(key) => keyed_id(capability, key),
            None => format!("t-{:032x}", rand::random::<u128>()),
        };
        let request = stored_request(parts, body);
        let now = now_ms();
        let mut task = Task {
            key: caller_key.unwrap_or_else(|| id.clone()),
            id,
            capability: capability.to_owned(),
            priority,
            state: State::Queued,
            request,
            created_ms: now,
            updated_ms: now,
            due_ms: now,
            rounds: 0,
            round_base: 0,
            attempts: Vec::new(),
            response: None,
            error: None,
            waiting_since_ms: None,
            callback: callback.as_deref().map(Delivery::to),
            escalation: None,
            resolution: None,
            lease: None,
            version: 0,
        };
        match self.store.insert(&mut task).await.map_err(store_error)? {
            Inserted::New => {
                self.metrics.task_event("submitted");
                self.wake.notify_one();
                Ok(Submitted {
                    task,
                    existing: false,
                })
            }
            Inserted::Existing(stored) => {
                let same = stored.capability == task.capability
                    && stored.request.method == task.request.method
                    && stored.request.path == task.request.path
                    && stored.request.body == task.request.body;
                if !same {
                    return Err(ReachError::IdempotencyMismatch);
                }
                Ok(Submitted {
                    task: *stored,
                    existing: true,
                })
            }
        }
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Task, ReachError> {
        self.store
            .get(id)
            .await
            .map_err(store_error)?
            .ok_or_else(|| ReachError::NotFound(format!("{TASKS_PATH}/{id}")))
    }

    pub(crate) async fn list(
        &self,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<Task>, ReachError> {
        self.store.list(state, limit).await.map_err(store_error)
    }

    /// A person sends the task through the chain again, with a fresh set of queue rounds.
    pub(crate) async fn retry(&self, id: &str) -> Result<Task, ReachError> {
        let mut task = self.unleased(id).await?;
        if !matches!(
            task.state,
            State::Escalated | State::Failed | State::Resolved
        ) {
            return Err(ReachError::TaskConflict(format!(
                "task {id} is {}: only an escalated, failed or resolved task can be retried",
                task.state.as_str()
            )));
        }
        task.state = State::Queued;
        task.round_base = task.rounds;
        task.due_ms = now_ms();
        task.updated_ms = task.due_ms;
        task.error = None;
        task.escalation = None;
        task.resolution = None;
        if let Some(callback) = &mut task.callback {
            *callback = Delivery::to(&callback.url);
        }
        self.store.save(&mut task).await.map_err(store_error)?;
        self.metrics.task_event("retried");
        self.wake.notify_one();
        Ok(task)
    }

    /// A person closes the task (its escalation is answered, or it is no longer wanted).
    pub(crate) async fn resolve(
        &self,
        id: &str,
        note: Option<String>,
        by: Option<String>,
    ) -> Result<Task, ReachError> {
        let mut task = self.unleased(id).await?;
        if matches!(task.state, State::Done | State::Resolved) {
            return Err(ReachError::TaskConflict(format!(
                "task {id} is already {}",
                task.state.as_str()
            )));
        }
        let now = now_ms();
        task.state = State::Resolved;
        task.updated_ms = now;
        task.due_ms = now;
        task.resolution = Some(Resolution {
            note,
            by,
            at_ms: now,
        });
        self.store.save(&mut task).await.map_err(store_error)?;
        self.metrics.task_event("resolved");
        self.wake.notify_one();
        Ok(task)
    }

    /// The task, when no runner holds it right now.
    async fn unleased(&self, id: &str) -> Result<Task, ReachError> {
        let task = self.get(id).await?;
        match &task.lease {
            Some(lease) if lease.until_ms > now_ms() => Err(ReachError::TaskConflict(format!(
                "task {id} is being worked on by {}; try again when it is not",
                lease.owner
            ))),
            _ => Ok(task),
        }
    }
}

/// The id of a keyed task: the same capability and key always name the same task.
fn keyed_id(capability: &str, key: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{capability}\0{key}").as_bytes(),
    );
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("k-{hex}")
}

/// The call as each attempt will replay it: the task's own headers dropped (they are not for
/// the agent), `reach-mode: async` so the pick weighs quality and the chain is a fallback
/// chain.
fn stored_request(parts: &Parts, body: Bytes) -> StoredRequest {
    let skip = [
        PREFER,
        CALLBACK,
        PRIORITY,
        idempotency::HEADER,
        headers::MODE,
        http::header::HOST,
        http::header::CONTENT_LENGTH,
    ];
    let mut stored: Vec<(String, String)> = parts
        .headers
        .iter()
        .filter(|(name, _)| !skip.contains(name))
        .filter(|(name, _)| name.as_str() != crate::http::deadline::TIMEOUT.as_str())
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect();
    stored.push((headers::MODE.as_str().to_owned(), "async".to_owned()));
    StoredRequest {
        method: parts.method.as_str().to_owned(),
        path: parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned(),
        headers: stored,
        body: body.to_vec(),
    }
}
