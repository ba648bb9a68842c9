//! The embedded store: one redb file. redb because it is pure Rust (no C toolchain), ACID with
//! copy-on-write B-trees, and a commit is on disk (fsync) when it returns — the guarantee the
//! `202 Accepted` makes. One process owns the file (redb locks it), so every lease found at
//! open belonged to a runner that died: those tasks are queued again at once.
//!
//! Writes go through one writer thread that commits whatever has queued up in one transaction:
//! concurrent submissions share an fsync (group commit) instead of waiting for one each.
//!
//! After an I/O error (a full disk) redb refuses every later operation until the database is
//! closed and opened again: the writer does that, with backoff, until a commit succeeds — so
//! writes resume by themselves once space returns. Meanwhile every operation fails fast.
//!
//! The page cache is bounded (`CACHE_BYTES`; redb's default is 1 GiB, which a sidecar filled
//! with pages it had written): memory does not grow with the number of stored tasks. The count
//! and bytes of the stored documents are kept in the file (`META`), in the same transaction as
//! the writes, so `tasks.max_tasks` and `tasks.max_bytes` are checked exactly.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use tokio::sync::oneshot;

use super::{Inserted, Limits, StoreError};
use crate::tasks::model::{Lease, State, Task};

/// Task id → JSON document.
const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
/// (rank, due_ms, id): the tasks owing work, not claimed.
const READY: TableDefinition<(u8, u64, &str), ()> = TableDefinition::new("ready");
/// (lease until_ms, id): the claimed tasks.
const LEASED: TableDefinition<(u64, &str), ()> = TableDefinition::new("leased");
/// (created_ms, id): every task, for listing newest first and purging.
const CREATED: TableDefinition<(u64, &str), ()> = TableDefinition::new("created");
/// `tasks` and `bytes`: how many documents the store holds, and their size in all.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Writes committed together at most.
const MAX_BATCH: usize = 512;
/// redb's page cache: enough for the indexes' hot pages and a batch of documents.
const CACHE_BYTES: usize = 8 << 20;
/// After an I/O error the database is reopened after this, doubling up to `REOPEN_MAX`.
const REOPEN_FIRST: Duration = Duration::from_millis(100);
const REOPEN_MAX: Duration = Duration::from_secs(5);
/// What an operation hears while the database is being reopened.
const REOPENING: &str = "unavailable after an I/O error (a full disk?); reopening";

type Reply = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// A write: runs inside the batch's transaction, says whether the batch may commit, and hands
/// back what to answer once the commit is known.
type Op = Box<dyn FnOnce(&WriteTransaction) -> (bool, Reply) + Send>;

#[derive(Debug)]
pub(crate) struct FileStore {
    /// `None` while the writer reopens it after an I/O error.
    db: Arc<ArcSwapOption<Database>>,
    writer: mpsc::Sender<Op>,
    limits: Limits,
}

fn open_db(path: &Path) -> Result<Database, StoreError> {
    redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create(path)
        .map_err(|e| StoreError::Backend(format!("{}: {e}", path.display())))
}

fn backend(err: impl Into<redb::Error>) -> StoreError {
    StoreError::Backend(err.into().to_string())
}

fn parse(id: &str, bytes: &[u8]) -> Result<Task, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        id: id.to_owned(),
        reason: e.to_string(),
    })
}

fn encode(task: &Task) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(task).map_err(|e| StoreError::Backend(e.to_string()))
}

/// Where a task sits in the indexes.
enum Slot {
    Ready(u8, u64),
    Leased(u64),
    Idle,
}

fn slot(task: &Task) -> Slot {
    match (&task.lease, task.work()) {
        (Some(lease), _) => Slot::Leased(lease.until_ms),
        (None, Some(_)) => Slot::Ready(task.rank(), task.due_ms),
        (None, None) => Slot::Idle,
    }
}

/// Moves `task` from the slot of `old` (if any) to its own, and writes it.
fn place(txn: &WriteTransaction, old: Option<&Task>, task: &Task) -> Result<(), StoreError> {
    let id = task.id.as_str();
    let mut ready = txn.open_table(READY).map_err(backend)?;
    let mut leased = txn.open_table(LEASED).map_err(backend)?;
    if let Some(old) = old {
        match slot(old) {
            Slot::Ready(rank, due) => {
                ready.remove((rank, due, id)).map_err(backend)?;
            }
            Slot::Leased(until) => {
                leased.remove((until, id)).map_err(backend)?;
            }
            Slot::Idle => {}
        }
    }
    match slot(task) {
        Slot::Ready(rank, due) => {
            ready.insert((rank, due, id), ()).map_err(backend)?;
        }
        Slot::Leased(until) => {
            leased.insert((until, id), ()).map_err(backend)?;
        }
        Slot::Idle => {}
    }
    let doc = encode(task)?;
    let mut tasks = txn.open_table(TASKS).map_err(backend)?;
    let before = tasks
        .insert(id, doc.as_slice())
        .map_err(backend)?
        .map(|old| old.value().len() as u64);
    match before {
        None => adjust(txn, 1, doc.len() as i64),
        Some(len) => adjust(txn, 0, doc.len() as i64 - len as i64),
    }
}

/// The count and bytes of the stored documents, as `META` holds them.
fn usage(txn: &WriteTransaction) -> Result<(u64, u64), StoreError> {
    let meta = txn.open_table(META).map_err(backend)?;
    let read = |key: &str| -> Result<u64, StoreError> {
        Ok(meta.get(key).map_err(backend)?.map_or(0, |v| v.value()))
    };
    Ok((read("tasks")?, read("bytes")?))
}

/// Adds `tasks` documents and `bytes` to the counts.
fn adjust(txn: &WriteTransaction, tasks: i64, bytes: i64) -> Result<(), StoreError> {
    let (count, size) = usage(txn)?;
    let mut meta = txn.open_table(META).map_err(backend)?;
    meta.insert("tasks", count.saturating_add_signed(tasks))
        .map_err(backend)?;
    meta.insert("bytes", size.saturating_add_signed(bytes))
        .map_err(backend)?;
    Ok(())
}

fn load(txn: &WriteTransaction, id: &str) -> Result<Option<Task>, StoreError> {
    let tasks = txn.open_table(TASKS).map_err(backend)?;
    let found = tasks.get(id).map_err(backend)?;
    found.map(|bytes| parse(id, bytes.value())).transpose()
}

impl FileStore {
    pub(crate) async fn open(path: &Path, limits: Limits) -> Result<Self, StoreError> {
        let path = path.to_owned();
        let at = path.clone();
        let db = tokio::task::spawn_blocking(move || -> Result<Database, StoreError> {
            if let Some(dir) = at.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    StoreError::Backend(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            let db = open_db(&at)?;
            recover(&db)?;
            Ok(db)
        })
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))??;
        let db = Arc::new(ArcSwapOption::from_pointee(db));
        let (writer, ops) = mpsc::channel::<Op>();
        let mut w = Writer {
            path,
            db: db.clone(),
            broken: None,
        };
        std::thread::Builder::new()
            .name("task-store".to_owned())
            .spawn(move || w.run(&ops))
            .map_err(|e| StoreError::Backend(format!("cannot start the writer: {e}")))?;
        Ok(Self { db, writer, limits })
    }

    /// Runs `f` in the next batch's transaction; answers once the batch is committed.
    async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&WriteTransaction) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<Result<R, StoreError>>();
        let op: Op = Box::new(move |txn| {
            let result = f(txn);
            // Only a store failure spoils the batch; a conflict wrote nothing.
            let commit = !matches!(result, Err(StoreError::Backend(_)));
            let reply: Reply = Box::new(move |committed| {
                let _ = tx.send(committed.and(result));
            });
            (commit, reply)
        });
        self.writer
            .send(op)
            .map_err(|_| StoreError::Backend("the writer has stopped".to_owned()))?;
        // A batch the writer could not begin drops its ops unrun: the store is reopening.
        rx.await
            .map_err(|_| StoreError::Backend(REOPENING.to_owned()))?
    }

    async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&redb::ReadTransaction) -> Result<R, StoreError> + Send + 'static,
    {
        let db = self
            .db
            .load_full()
            .ok_or_else(|| StoreError::Backend(REOPENING.to_owned()))?;
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(backend)?;
            f(&txn)
        })
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))?
    }

    pub(crate) async fn insert(&self, task: &mut Task) -> Result<Inserted, StoreError> {
        task.version = 1;
        let new = task.clone();
        let limits = self.limits;
        self.write(move |txn| {
            if let Some(stored) = load(txn, &new.id)? {
                return Ok(Inserted::Existing(Box::new(stored)));
            }
            let (count, bytes) = usage(txn)?;
            let adding = encode(&new)?.len() as u64;
            if let Some(why) = limits.refuse(count, bytes, adding) {
                return Err(StoreError::Full(why));
            }
            place(txn, None, &new)?;
            let mut created = txn.open_table(CREATED).map_err(backend)?;
            created
                .insert((new.created_ms, new.id.as_str()), ())
                .map_err(backend)?;
            Ok(Inserted::New)
        })
        .await
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Option<Task>, StoreError> {
        let id = id.to_owned();
        self.read(move |txn| {
            let tasks = txn.open_table(TASKS).map_err(backend)?;
            let found = tasks.get(id.as_str()).map_err(backend)?;
            found.map(|bytes| parse(&id, bytes.value())).transpose()
        })
        .await
    }

    pub(crate) async fn list(
        &self,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        self.read(move |txn| {
            let created = txn.open_table(CREATED).map_err(backend)?;
            let tasks = txn.open_table(TASKS).map_err(backend)?;
            let mut out = Vec::new();
            for entry in created.iter().map_err(backend)?.rev() {
                if out.len() >= limit {
                    break;
                }
                let (key, ()) = entry.map_err(backend).map(|(k, _)| (k, ()))?;
                let (_, id) = key.value();
                let Some(bytes) = tasks.get(id).map_err(backend)? else {
                    continue;
                };
                let task = parse(id, bytes.value())?;
                if state.is_none_or(|s| s == task.state) {
                    out.push(task);
                }
            }
            Ok(out)
        })
        .await
    }

    pub(crate) async fn claim(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Option<Task>, StoreError> {
        let owner = owner.to_owned();
        self.write(move |txn| {
            let Some(id) = next_claimable(txn, now_ms)? else {
                return Ok(None);
            };
            let Some(old) = load(txn, &id)? else {
                return Err(StoreError::Corrupt {
                    id,
                    reason: "queued but not stored".to_owned(),
                });
            };
            let mut task = old.clone();
            task.lease = Some(Lease {
                owner,
                until_ms: now_ms.saturating_add(lease_ms),
            });
            task.version += 1;
            place(txn, Some(&old), &task)?;
            Ok(Some(task))
        })
        .await
    }

    pub(crate) async fn save(&self, task: &mut Task) -> Result<(), StoreError> {
        let mut new = task.clone();
        new.version += 1;
        let written = new.clone();
        self.write(move |txn| {
            let Some(old) = load(txn, &new.id)? else {
                return Err(StoreError::Missing(new.id));
            };
            if old.version != new.version - 1 {
                return Err(StoreError::Conflict(new.id));
            }
            place(txn, Some(&old), &new)
        })
        .await?;
        *task = written;
        Ok(())
    }

    pub(crate) async fn next_due(&self) -> Result<Option<u64>, StoreError> {
        self.read(|txn| {
            let ready = txn.open_table(READY).map_err(backend)?;
            let leased = txn.open_table(LEASED).map_err(backend)?;
            let mut next: Option<u64> = None;
            for rank in 0..=9u8 {
                let first = ready
                    .range((rank, 0, "")..(rank, u64::MAX, ""))
                    .map_err(backend)?
                    .next();
                if let Some(entry) = first {
                    let (key, _) = entry.map_err(backend)?;
                    let due = key.value().1;
                    next = Some(next.map_or(due, |n| n.min(due)));
                }
            }
            if let Some(entry) = leased.first().map_err(backend)? {
                let until = entry.0.value().0;
                next = Some(next.map_or(until, |n| n.min(until)));
            }
            Ok(next)
        })
        .await
    }

    pub(crate) async fn purge(&self, now_ms: u64, retention_ms: u64) -> Result<usize, StoreError> {
        self.write(move |txn| {
            let mut gone = Vec::new();
            {
                let created = txn.open_table(CREATED).map_err(backend)?;
                let tasks = txn.open_table(TASKS).map_err(backend)?;
                for entry in created.iter().map_err(backend)? {
                    let (key, _) = entry.map_err(backend)?;
                    let (at, id) = key.value();
                    let expired = match tasks.get(id).map_err(backend)? {
                        Some(bytes) => {
                            parse(id, bytes.value()).is_ok_and(|t| t.expired(now_ms, retention_ms))
                        }
                        None => true,
                    };
                    if expired {
                        gone.push((at, id.to_owned()));
                    }
                }
            }
            let mut freed = 0u64;
            let mut removed = 0u64;
            {
                let mut created = txn.open_table(CREATED).map_err(backend)?;
                let mut tasks = txn.open_table(TASKS).map_err(backend)?;
                for (at, id) in &gone {
                    created.remove((*at, id.as_str())).map_err(backend)?;
                    if let Some(old) = tasks.remove(id.as_str()).map_err(backend)? {
                        freed += old.value().len() as u64;
                        removed += 1;
                    }
                }
            }
            adjust(txn, -(removed as i64), -(freed as i64))?;
            Ok(gone.len())
        })
        .await
    }
}

/// The id of the next task a claim takes: an expired lease first (its runner is gone), then the
/// highest-priority due task.
fn next_claimable(txn: &WriteTransaction, now_ms: u64) -> Result<Option<String>, StoreError> {
    let leased = txn.open_table(LEASED).map_err(backend)?;
    if let Some(entry) = leased.first().map_err(backend)? {
        let (until, id) = entry.0.value();
        if until <= now_ms {
            return Ok(Some(id.to_owned()));
        }
    }
    let ready = txn.open_table(READY).map_err(backend)?;
    for rank in 0..=9u8 {
        let first = ready
            .range((rank, 0, "")..(rank, now_ms.saturating_add(1), ""))
            .map_err(backend)?
            .next();
        if let Some(entry) = first {
            let (key, _) = entry.map_err(backend)?;
            return Ok(Some(key.value().2.to_owned()));
        }
    }
    Ok(None)
}

/// At open: every lease is a dead runner's, so its task is queued again, due at once.
fn recover(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(backend)?;
    // Create the tables, so reads never meet a missing one.
    drop(txn.open_table(TASKS).map_err(backend)?);
    drop(txn.open_table(READY).map_err(backend)?);
    drop(txn.open_table(CREATED).map_err(backend)?);
    let counted = txn
        .open_table(META)
        .map_err(backend)?
        .get("tasks")
        .map_err(backend)?
        .is_some();
    if !counted {
        // A file written before the counts were kept: count it once.
        let (mut count, mut bytes) = (0u64, 0u64);
        for entry in txn
            .open_table(TASKS)
            .map_err(backend)?
            .iter()
            .map_err(backend)?
        {
            let (_, doc) = entry.map_err(backend)?;
            count += 1;
            bytes += doc.value().len() as u64;
        }
        adjust(&txn, count as i64, bytes as i64)?;
    }
    let held: Vec<String> = {
        let leased = txn.open_table(LEASED).map_err(backend)?;
        let mut ids = Vec::new();
        for entry in leased.iter().map_err(backend)? {
            let (key, _) = entry.map_err(backend)?;
            ids.push(key.value().1.to_owned());
        }
        ids
    };
    for id in held {
        if let Some(old) = load(&txn, &id)? {
            let mut task = old.clone();
            task.lease = None;
            task.version += 1;
            place(&txn, Some(&old), &task)?;
        }
    }
    txn.commit().map_err(backend)
}

/// The writer thread: commits batches, and reopens the database after an I/O error.
struct Writer {
    path: PathBuf,
    db: Arc<ArcSwapOption<Database>>,
    /// Set after an I/O error: when to try reopening next, and the wait after that.
    broken: Option<(Instant, Duration)>,
}

impl Writer {
    fn run(&mut self, ops: &mpsc::Receiver<Op>) {
        while let Ok(first) = ops.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match ops.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            // Dropped unrun, the ops' callers hear that the store is reopening.
            let Some(db) = self.usable() else {
                drop(batch);
                continue;
            };
            let txn = match db.begin_write() {
                Ok(txn) => txn,
                Err(err) => {
                    drop(batch);
                    drop(db);
                    self.failed(&backend(err));
                    continue;
                }
            };
            let mut commit = true;
            let mut replies = Vec::with_capacity(batch.len());
            for op in batch {
                let (ok, reply) = op(&txn);
                commit &= ok;
                replies.push(reply);
            }
            let outcome = if commit {
                txn.commit().map_err(backend)
            } else {
                let _ = txn.abort();
                Err(StoreError::Backend(
                    "a write in the same commit failed; nothing was written".to_owned(),
                ))
            };
            drop(db);
            match &outcome {
                Ok(()) => self.broken = None,
                // A failed write may have poisoned the database (redb then refuses everything
                // until it is reopened); a commit failure always does.
                Err(err) if !commit => tracing::debug!(%err, "task store: a batch was aborted"),
                Err(err) => self.failed(err),
            }
            for reply in replies {
                let outcome = match &outcome {
                    Ok(()) => Ok(()),
                    Err(StoreError::Backend(e)) => Err(StoreError::Backend(e.clone())),
                    Err(e) => Err(StoreError::Backend(e.to_string())),
                };
                reply(outcome);
            }
        }
    }

    /// The database to write to: the open one, or, once the backoff allows, a reopened one.
    fn usable(&mut self) -> Option<Arc<Database>> {
        let Some((at, wait)) = self.broken else {
            return self.db.load_full();
        };
        if Instant::now() < at {
            return None;
        }
        match self.reopen() {
            Ok(()) => {
                tracing::info!(path = %self.path.display(), "task store reopened after an I/O error");
                // Still broken until a commit succeeds: a full disk fails the next one again.
                self.broken = Some((Instant::now() + wait, (wait * 2).min(REOPEN_MAX)));
                self.db.load_full()
            }
            Err(err) => {
                tracing::debug!(%err, "task store: cannot reopen yet");
                self.broken = Some((Instant::now() + wait, (wait * 2).min(REOPEN_MAX)));
                None
            }
        }
    }

    /// A write failed on the store itself: the database is reopened before the next one.
    fn failed(&mut self, err: &StoreError) {
        if self.broken.is_none() {
            tracing::warn!(%err, "task store: a write failed; the database will be reopened");
            self.broken = Some((Instant::now(), REOPEN_FIRST));
        }
        // Readers fail fast from here on, instead of meeting the poisoned database.
        if let Some(old) = self.db.swap(None) {
            self.close(old);
        }
    }

    /// Closes `db` once the readers still holding it are done (they are short).
    fn close(&self, mut db: Arc<Database>) {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match Arc::try_unwrap(db) {
                Ok(db) => {
                    if let Err(err) = db.close() {
                        tracing::debug!(%err, "task store: closing after an I/O error");
                    }
                    return;
                }
                Err(held) if Instant::now() < deadline => {
                    db = held;
                    std::thread::sleep(Duration::from_millis(5));
                }
                // A reader stuck on the old handle keeps the file locked; the reopen waits.
                Err(_) => return,
            }
        }
    }

    fn reopen(&mut self) -> Result<(), StoreError> {
        if let Some(old) = self.db.swap(None) {
            self.close(old);
        }
        let db = open_db(&self.path)?;
        self.db.store(Some(Arc::new(db)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{conformance, TaskStore};
    use super::*;

    const LIMITS: Limits = Limits {
        max_tasks: 1_000,
        max_bytes: 1 << 20,
    };

    async fn store(dir: &Path) -> TaskStore {
        match FileStore::open(&dir.join("tasks.db"), LIMITS).await {
            Ok(s) => TaskStore::from(s),
            Err(e) => panic!("{e}"),
        }
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "reach-tasks-{name}-{}-{}",
            std::process::id(),
            crate::tasks::model::now_ms()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[tokio::test]
    async fn conformance_file() {
        let dir = tmp("conf");
        conformance::insert_and_read(&store(&dir.join("a")).await).await;
        conformance::claim_order_and_leases(&store(&dir.join("b")).await).await;
        conformance::save_requeues(&store(&dir.join("c")).await).await;
        conformance::purge_finished(&store(&dir.join("d")).await).await;
        let small = Limits {
            max_tasks: 3,
            max_bytes: 1 << 20,
        };
        let bounded = FileStore::open(&dir.join("e").join("tasks.db"), small).await;
        match bounded {
            Ok(s) => conformance::refuses_beyond_limits(&TaskStore::from(s)).await,
            Err(e) => panic!("{e}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_claimed_task_is_queued_again_after_a_restart() {
        let dir = tmp("restart");
        {
            let s = store(&dir).await;
            let mut t = conformance::task("t", 5, 100);
            assert!(s.insert(&mut t).await.is_ok());
            let claimed = s.claim("dead", 100, 60_000).await.ok().flatten();
            assert!(claimed.is_some());
            assert!(matches!(s.claim("dead", 200, 60_000).await, Ok(None)));
        }
        // The writer thread of the first store still holds the file until it notices; wait.
        let reopened = {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                match FileStore::open(&dir.join("tasks.db"), LIMITS).await {
                    Ok(s) => break TaskStore::from(s),
                    Err(e) if std::time::Instant::now() > deadline => panic!("{e}"),
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                }
            }
        };
        let again = reopened.claim("new", 300, 60_000).await.ok().flatten();
        assert_eq!(again.map(|t| t.id), Some("t".to_owned()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn concurrent_inserts_share_commits_and_all_land() {
        let dir = tmp("group");
        let s = Arc::new(store(&dir).await);
        let mut joins = Vec::new();
        for i in 0..64 {
            let s = s.clone();
            joins.push(tokio::spawn(async move {
                let mut t = conformance::task(&format!("t{i}"), 5, 100 + i);
                s.insert(&mut t).await.is_ok()
            }));
        }
        for j in joins {
            assert_eq!(j.await.ok(), Some(true));
        }
        assert_eq!(s.list(None, 100).await.map(|l| l.len()).ok(), Some(64));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
