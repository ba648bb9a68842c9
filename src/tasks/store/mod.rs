//! Where tasks are kept: the embedded single file ([`file::FileStore`], redb) or a shared Redis
//! ([`redis::RedisStore`]). Both keep one document per task and a queue of the tasks that still
//! owe work (`Task::work`), ordered by priority, then due time.
//!
//! Every write is a compare-and-set on the task's `version`: a store writes a task only when the
//! stored version is the one the writer read, and bumps it. A claim bumps it too, so a runner
//! whose lease ran out and was taken over cannot overwrite the new owner's progress — its save
//! fails with [`StoreError::Conflict`] and it lets go.

pub(crate) mod file;
pub(crate) mod redis;

use std::sync::Arc;

use crate::config::StoreLocation;
use crate::metrics::Metrics;

use super::model::{now_ms, State, Task};

/// A store operation that did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// The store itself failed (disk, connection): nothing was written.
    #[error("task store: {0}")]
    Backend(String),
    /// The task changed since it was read (another runner took it over, or a person acted).
    #[error("task {0} changed since it was read")]
    Conflict(String),
    /// The task is not in the store.
    #[error("no task {0}")]
    Missing(String),
    /// A stored document does not parse.
    #[error("task {id} is unreadable: {reason}")]
    Corrupt { id: String, reason: String },
    /// A new task would pass `tasks.max_tasks` or `tasks.max_bytes`: nothing was written.
    #[error("the task store is full ({0})")]
    Full(String),
}

/// What `insert` did.
#[derive(Debug)]
pub(crate) enum Inserted {
    /// The task is stored (version 1).
    New,
    /// A task with this id was already there (a resubmission): it is returned as stored.
    Existing(Box<Task>),
}

/// How much the store may hold (`tasks.max_tasks`, `tasks.max_bytes`): checked when a task is
/// added; a stored task may still grow (its attempts, its answer), so nothing accepted is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) max_tasks: u64,
    pub(crate) max_bytes: u64,
}

impl Limits {
    /// Why a store holding `tasks` documents of `bytes` in all cannot take one more of `adding`
    /// bytes, if it cannot.
    pub(crate) fn refuse(&self, tasks: u64, bytes: u64, adding: u64) -> Option<String> {
        if tasks >= self.max_tasks {
            return Some(format!(
                "{tasks} tasks stored, tasks.max_tasks is {}",
                self.max_tasks
            ));
        }
        if bytes.saturating_add(adding) > self.max_bytes {
            return Some(format!(
                "{bytes} bytes stored, tasks.max_bytes is {}",
                self.max_bytes
            ));
        }
        None
    }
}

/// The kinds of `reach_task_store_errors_total`: the disk (`io`), the Redis connection
/// (`redis`), a document that does not parse (`corrupt`), a submission refused by the bounds
/// (`full`).
pub(crate) const ERROR_KINDS: [&str; 4] = ["io", "redis", "corrupt", "full"];

/// Since when, and why, the store has been failing.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Down {
    /// Unix milliseconds.
    pub(crate) since_ms: u64,
    pub(crate) error: String,
}

#[derive(Debug)]
enum Backend {
    File(file::FileStore),
    Redis(redis::RedisStore),
}

/// The task store in use, and its health as its last operations found it: down from a failed
/// operation on the store itself until one succeeds. A store that cannot be opened at start is
/// opened again on use (at most once every [`REOPEN_EVERY`]): the sidecar serves its synchronous
/// traffic meanwhile, and submissions answer 503 `task_store_unavailable` until it opens.
#[derive(Debug)]
pub(crate) struct TaskStore {
    backend: tokio::sync::OnceCell<Backend>,
    /// How to open it, while it has not been opened.
    opener: Option<Opener>,
    kind: &'static str,
    down: std::sync::Mutex<Option<Down>>,
    metrics: Arc<Metrics>,
}

/// Where a store not yet opened is, and when to try again.
#[derive(Debug)]
struct Opener {
    location: StoreLocation,
    prefix: String,
    limits: Limits,
    next_try: std::sync::Mutex<tokio::time::Instant>,
}

/// A store that could not be opened is tried again at most this often.
const REOPEN_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl From<file::FileStore> for TaskStore {
    fn from(store: file::FileStore) -> Self {
        Self::new(Backend::File(store), Arc::new(Metrics::new("tasks")))
    }
}

impl From<redis::RedisStore> for TaskStore {
    fn from(store: redis::RedisStore) -> Self {
        Self::new(Backend::Redis(store), Arc::new(Metrics::new("tasks")))
    }
}

async fn open_backend(
    location: &StoreLocation,
    prefix: &str,
    limits: Limits,
) -> Result<Backend, StoreError> {
    Ok(match location {
        StoreLocation::File(path) => Backend::File(file::FileStore::open(path, limits).await?),
        StoreLocation::Redis(url) => {
            Backend::Redis(redis::RedisStore::open(url, prefix, limits).await?)
        }
    })
}

fn kind_of(location: &StoreLocation) -> &'static str {
    match location {
        StoreLocation::File(_) => "file",
        StoreLocation::Redis(_) => "redis",
    }
}

impl TaskStore {
    fn new(backend: Backend, metrics: Arc<Metrics>) -> Self {
        let kind = match backend {
            Backend::File(_) => "file",
            Backend::Redis(_) => "redis",
        };
        Self::with(
            tokio::sync::OnceCell::new_with(Some(backend)),
            None,
            kind,
            metrics,
        )
    }

    fn with(
        backend: tokio::sync::OnceCell<Backend>,
        opener: Option<Opener>,
        kind: &'static str,
        metrics: Arc<Metrics>,
    ) -> Self {
        // Every kind from zero, so a first error shows in `increase()`.
        for kind in ERROR_KINDS {
            metrics.task_store_error(kind, 0);
        }
        Self {
            backend,
            opener,
            kind,
            down: std::sync::Mutex::new(None),
            metrics,
        }
    }

    /// Opens (creating when absent) the store at `location`; `prefix` namespaces a shared store.
    /// A store that cannot be opened now (Redis unreachable, the disk full) is not an error: the
    /// store starts down and is opened on a later use.
    pub(crate) async fn open(
        location: &StoreLocation,
        prefix: &str,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Self {
        let kind = kind_of(location);
        match open_backend(location, prefix, limits).await {
            Ok(backend) => Self::new(backend, metrics),
            Err(err) => {
                let store = Self::with(
                    tokio::sync::OnceCell::new(),
                    Some(Opener {
                        location: location.clone(),
                        prefix: prefix.to_owned(),
                        limits,
                        next_try: std::sync::Mutex::new(tokio::time::Instant::now() + REOPEN_EVERY),
                    }),
                    kind,
                    metrics,
                );
                let _ = store.track::<()>(Err(err));
                store
            }
        }
    }

    /// The open store, opening it first when it could not be opened before (not more often
    /// than [`REOPEN_EVERY`]).
    async fn backend(&self) -> Result<&Backend, StoreError> {
        if let Some(backend) = self.backend.get() {
            return Ok(backend);
        }
        let Some(opener) = &self.opener else {
            return Err(StoreError::Backend("the task store is not open".to_owned()));
        };
        {
            let mut next = opener
                .next_try
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = tokio::time::Instant::now();
            if now < *next {
                let why = self
                    .down()
                    .map_or_else(|| "not open yet".to_owned(), |d| d.error);
                return Err(StoreError::Backend(why));
            }
            *next = now + REOPEN_EVERY;
        }
        let backend = self
            .backend
            .get_or_try_init(|| open_backend(&opener.location, &opener.prefix, opener.limits))
            .await?;
        tracing::info!(store = self.kind, "task store opened");
        Ok(backend)
    }

    /// What the store is, for logs and `/status`: `file` or `redis`.
    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }

    /// Since when and why the store has been failing; `None` while it works.
    pub(crate) fn down(&self) -> Option<Down> {
        self.down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Notes what an operation found of the store's health; logs a change once.
    fn track<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        let mut down = self
            .down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &result {
            Err(StoreError::Backend(error)) => {
                let kind = match self.kind {
                    "redis" => "redis",
                    _ => "io",
                };
                self.metrics.task_store_error(kind, 1);
                if down.is_none() {
                    tracing::error!(store = self.kind(), %error,
                        "task store down: submissions answer 503 and tasks wait until it is back");
                    *down = Some(Down {
                        since_ms: now_ms(),
                        error: error.clone(),
                    });
                }
            }
            Err(StoreError::Corrupt { .. }) => self.metrics.task_store_error("corrupt", 1),
            Err(StoreError::Full(_)) => self.metrics.task_store_error("full", 1),
            // A conflict or a missing task is an answer: the store worked.
            Ok(_) | Err(StoreError::Conflict(_) | StoreError::Missing(_)) => {
                if let Some(was) = down.take() {
                    tracing::info!(
                        store = self.kind(),
                        down_ms = now_ms().saturating_sub(was.since_ms),
                        "task store back"
                    );
                }
            }
        }
        result
    }

    /// Stores `task` unless its id is taken; durable when this returns. Sets `task.version` to 1.
    /// A task with work is queued at its `due_ms`. Refused with [`StoreError::Full`] beyond the
    /// store's limits.
    pub(crate) async fn insert(&self, task: &mut Task) -> Result<Inserted, StoreError> {
        self.track(match self.backend().await {
            Ok(Backend::File(s)) => s.insert(task).await,
            Ok(Backend::Redis(s)) => s.insert(task).await,
            Err(err) => Err(err),
        })
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Option<Task>, StoreError> {
        self.track(match self.backend().await {
            Ok(Backend::File(s)) => s.get(id).await,
            Ok(Backend::Redis(s)) => s.get(id).await,
            Err(err) => Err(err),
        })
    }

    /// Up to `limit` tasks, newest first, in `state` when given.
    pub(crate) async fn list(
        &self,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        self.track(match self.backend().await {
            Ok(Backend::File(s)) => s.list(state, limit).await,
            Ok(Backend::Redis(s)) => s.list(state, limit).await,
            Err(err) => Err(err),
        })
    }

    /// Takes the next task whose work is due at `now_ms` — highest priority first, then the
    /// earliest due — or a task whose lease expired; it is leased to `owner` until
    /// `now_ms + lease_ms` and out of the queue. The returned task carries the version the claim
    /// wrote and its `lease`.
    pub(crate) async fn claim(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Option<Task>, StoreError> {
        self.track(match self.backend().await {
            Ok(Backend::File(s)) => s.claim(owner, now_ms, lease_ms).await,
            Ok(Backend::Redis(s)) => s.claim(owner, now_ms, lease_ms).await,
            Err(err) => Err(err),
        })
    }

    /// Writes `task` if the stored version is `task.version`, then bumps `task.version`; durable
    /// when this returns. With `task.lease` set, the task stays claimed (until `lease.until_ms`);
    /// without, it is queued at `due_ms` when it has work and dropped from the queue when not.
    pub(crate) async fn save(&self, task: &mut Task) -> Result<(), StoreError> {
        self.track(match self.backend().await {
            Ok(Backend::File(s)) => s.save(task).await,
            Ok(Backend::Redis(s)) => s.save(task).await,
            Err(err) => Err(err),
        })
    }

    /// The earliest `due_ms` among queued tasks (and lease expiries), to sleep until.
    pub(crate) async fn next_due(&self) -> Result<Option<u64>, StoreError> {
        self.track(match self.backend().await {
            Ok(Backend::File(s)) => s.next_due().await,
            Ok(Backend::Redis(s)) => s.next_due().await,
            Err(err) => Err(err),
        })
    }

    /// Removes finished tasks older than `retention_ms`; returns how many.
    pub(crate) async fn purge(&self, now_ms: u64, retention_ms: u64) -> Result<usize, StoreError> {
        self.track(match self.backend().await {
            Ok(Backend::File(s)) => s.purge(now_ms, retention_ms).await,
            Ok(Backend::Redis(s)) => s.purge(now_ms, retention_ms).await,
            Err(err) => Err(err),
        })
    }
}

/// The behaviour both stores must have, run against each (`file::tests`, `redis::tests`).
#[cfg(test)]
pub(crate) mod conformance {
    use super::*;
    use crate::tasks::model::{Lease, StoredRequest};

    pub(crate) fn task(id: &str, priority: u8, due_ms: u64) -> Task {
        Task {
            id: id.to_owned(),
            capability: "review".to_owned(),
            key: id.to_owned(),
            priority,
            state: State::Queued,
            request: StoredRequest {
                method: "POST".to_owned(),
                path: "/review".to_owned(),
                headers: vec![("content-type".to_owned(), "application/json".to_owned())],
                body: b"{\"n\":1}".to_vec(),
            },
            created_ms: due_ms,
            updated_ms: due_ms,
            due_ms,
            rounds: 0,
            round_base: 0,
            attempts: Vec::new(),
            response: None,
            error: None,
            waiting_since_ms: None,
            callback: None,
            escalation: None,
            resolution: None,
            lease: None,
            version: 0,
        }
    }

    /// Insert, resubmission, get, list.
    pub(crate) async fn insert_and_read(store: &TaskStore) {
        let mut t = task("t1", 5, 1_000);
        assert!(matches!(store.insert(&mut t).await, Ok(Inserted::New)));
        assert_eq!(t.version, 1);
        let mut again = task("t1", 9, 2_000);
        match store.insert(&mut again).await {
            Ok(Inserted::Existing(stored)) => assert_eq!(stored.priority, 5),
            other => panic!("a resubmission returns the stored task: {other:?}"),
        }
        let got = store.get("t1").await.ok().flatten();
        assert_eq!(got.as_ref().map(|t| t.version), Some(1));
        assert_eq!(got.map(|t| t.request.body), Some(b"{\"n\":1}".to_vec()));
        assert!(matches!(store.get("nope").await, Ok(None)));
        let mut t2 = task("t2", 0, 1_500);
        assert!(store.insert(&mut t2).await.is_ok());
        let listed = store.list(None, 10).await.unwrap_or_default();
        let ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["t2", "t1"], "newest first");
        let queued = store.list(Some(State::Done), 10).await.unwrap_or_default();
        assert!(queued.is_empty());
    }

    /// Claims go by priority, then due time, and only when due; a claimed task is out of the
    /// queue until its lease runs out.
    pub(crate) async fn claim_order_and_leases(store: &TaskStore) {
        for (id, prio, due) in [("low", 1, 100), ("high", 8, 300), ("later", 9, 10_000)] {
            let mut t = task(id, prio, due);
            assert!(store.insert(&mut t).await.is_ok());
        }
        assert!(
            matches!(store.claim("a", 50, 1_000).await, Ok(None)),
            "nothing due"
        );
        let first = store.claim("a", 500, 1_000).await.ok().flatten();
        assert_eq!(first.as_ref().map(|t| t.id.as_str()), Some("high"));
        let first = first.unwrap_or_else(|| task("x", 0, 0));
        assert_eq!(
            first.lease,
            Some(Lease {
                owner: "a".into(),
                until_ms: 1_500
            })
        );
        let second = store.claim("a", 500, 1_000).await.ok().flatten();
        assert_eq!(second.map(|t| t.id), Some("low".to_owned()));
        assert!(matches!(store.claim("b", 600, 1_000).await, Ok(None)));
        assert_eq!(store.next_due().await.ok().flatten(), Some(1_500));
        // The lease of `high` runs out: replica b takes it over, and a's late save conflicts.
        let taken = store.claim("b", 1_600, 1_000).await.ok().flatten();
        assert_eq!(taken.as_ref().map(|t| t.id.as_str()), Some("high"));
        let mut stale = first.clone();
        stale.state = State::Done;
        assert!(matches!(
            store.save(&mut stale).await,
            Err(StoreError::Conflict(_))
        ));
        let mut taken = taken.unwrap_or_else(|| task("x", 0, 0));
        taken.state = State::Done;
        taken.lease = None;
        assert!(store.save(&mut taken).await.is_ok());
        let stored = store.get("high").await.ok().flatten();
        assert_eq!(stored.map(|t| t.state), Some(State::Done));
    }

    /// A save without a lease requeues a task that still owes work at its due time.
    pub(crate) async fn save_requeues(store: &TaskStore) {
        let mut t = task("r", 5, 100);
        assert!(store.insert(&mut t).await.is_ok());
        let mut claimed = store
            .claim("a", 100, 1_000)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| task("x", 0, 0));
        claimed.state = State::Retrying;
        claimed.due_ms = 5_000;
        claimed.lease = None;
        assert!(store.save(&mut claimed).await.is_ok());
        assert!(matches!(store.claim("a", 4_000, 1_000).await, Ok(None)));
        assert_eq!(store.next_due().await.ok().flatten(), Some(5_000));
        let again = store.claim("a", 5_000, 1_000).await.ok().flatten();
        assert_eq!(again.map(|t| t.state), Some(State::Retrying));
    }

    /// A store of `max_tasks: 3` takes three tasks and refuses a fourth; a purge makes room,
    /// and a resubmission of a stored id is still answered.
    pub(crate) async fn refuses_beyond_limits(store: &TaskStore) {
        for i in 0..3 {
            let mut t = task(&format!("b{i}"), 5, 100);
            t.state = State::Done;
            assert!(matches!(store.insert(&mut t).await, Ok(Inserted::New)));
        }
        let mut more = task("b3", 5, 100);
        assert!(
            matches!(store.insert(&mut more).await, Err(StoreError::Full(_))),
            "a fourth task is refused"
        );
        assert!(matches!(store.get("b3").await, Ok(None)));
        let mut again = task("b0", 5, 100);
        assert!(matches!(
            store.insert(&mut again).await,
            Ok(Inserted::Existing(_))
        ));
        // A stored task may still grow: nothing accepted is refused its progress.
        let mut grown = store
            .get("b1")
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| task("x", 0, 0));
        grown.error = Some("x".repeat(4096));
        assert!(store.save(&mut grown).await.is_ok());
        assert_eq!(store.purge(100_000, 1_000).await.ok(), Some(3));
        assert!(matches!(store.insert(&mut more).await, Ok(Inserted::New)));
    }

    /// Finished tasks past their retention go; others stay.
    pub(crate) async fn purge_finished(store: &TaskStore) {
        let mut done = task("old", 5, 100);
        done.state = State::Done;
        assert!(store.insert(&mut done).await.is_ok());
        let mut open = task("open", 5, 100);
        assert!(store.insert(&mut open).await.is_ok());
        assert_eq!(store.purge(100_000, 1_000).await.ok(), Some(1));
        assert!(matches!(store.get("old").await, Ok(None)));
        assert!(matches!(store.get("open").await, Ok(Some(_))));
    }
}
