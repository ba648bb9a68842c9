//! The shared store on Redis: replicas of one caller share a queue, and a replica takes over a
//! task whose owner died once its lease expires.
//!
//! Keys, under the configured prefix `P`:
//! - `P:task:<id>` — a hash: `doc` (the task as JSON), `v` (its version), `r` (its rank), and
//!   while it is claimed `owner` and `u` (the lease's until_ms).
//! - `P:ready` — a sorted set of the unclaimed tasks that owe work, scored
//!   `rank * RANK_SPAN + due_ms`: lower rank (higher priority) first, then the earliest due.
//! - `P:leased` — a sorted set of the claimed tasks, scored by the lease's until_ms.
//! - `P:created` — a sorted set of every task, scored by created_ms (list and purge).
//! - `P:bytes` — the size of every stored document, in all (`tasks.max_bytes`; the count for
//!   `tasks.max_tasks` is `P:created`'s).
//!
//! Nothing accepted is lost across a Redis restart only if Redis keeps every write on disk
//! before it answers: `appendonly yes` with `appendfsync always` (`docs/tasks.md`). While Redis
//! is away, operations fail (the store counts as down, submissions answer `503` with
//! `retry-after`) and the connection manager reconnects on the next command.
//!
//! Every write that touches more than one key is one Lua script (EVALSHA), so it is atomic.
//! The hash fields `v`, `owner` and `u` are authoritative: a read puts them into the document's
//! `version` and `lease`. That lets a claim stay one script that never rewrites the JSON (Lua's
//! cjson would turn `[]` into `{}` and round large numbers), while `get` still shows the lease
//! and the version the claim wrote.
//!
//! Single-node Redis (or a primary with replicas); the claim script builds task keys from ids it
//! reads, so Redis Cluster would need every key in one slot (a `{…}` hash tag in the prefix).

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::{Inserted, Limits, StoreError};
use crate::tasks::model::{Lease, State, Task};

/// The ready score's span per rank: due times are kept below it (year 2286), so a score
/// (at most 10 × 1e13) is an integer f64 represents exactly.
const RANK_SPAN: u64 = 10_000_000_000_000;
/// Each connection attempt gives up after this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A command without an answer after this fails (the manager reconnects for the next one).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Ids read per round trip when listing or purging.
const PAGE: usize = 256;

/// Moves a task between the indexes: `slot` is `r` (ready, at `score`), `l` (leased until
/// `score`, held by `owner` until `untl`) or `i` (idle: in neither). Shared by the scripts.
const PLACE: &str = r"
local function place(task, ready, leased, id, slot, score, owner, untl)
  redis.call('ZREM', ready, id)
  redis.call('ZREM', leased, id)
  if slot == 'l' then
    redis.call('HSET', task, 'owner', owner, 'u', untl)
    redis.call('ZADD', leased, score, id)
  else
    redis.call('HDEL', task, 'owner', 'u')
    if slot == 'r' then redis.call('ZADD', ready, score, id) end
  end
end
";

/// Create-if-absent, within the limits. KEYS: task, ready, leased, created, bytes. ARGV: id,
/// doc, rank, slot, score, owner, until, created score, max tasks, max bytes. Returns the stored
/// row when the id is taken, `{nil, 0, …}` when the store is full, else a row of nils.
const INSERT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HMGET', KEYS[1], 'doc', 'v', 'owner', 'u')
end
local bytes = tonumber(redis.call('GET', KEYS[5]) or '0')
if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[9])
  or bytes + string.len(ARGV[2]) > tonumber(ARGV[10]) then
  return {false, 0, false, false}
end
redis.call('INCRBY', KEYS[5], string.len(ARGV[2]))
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'v', 1, 'r', ARGV[3])
place(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
redis.call('ZADD', KEYS[4], ARGV[8], ARGV[1])
return {false, false, false, false}
";

/// Compare-and-set on `v`. KEYS: task, ready, leased, bytes. ARGV: id, expected v, doc, rank,
/// slot, score, owner, until. Returns the new version, -1 when the task is missing, -2 on a
/// conflict.
const SAVE: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return -1 end
if v ~= ARGV[2] then return -2 end
redis.call('INCRBY', KEYS[4], string.len(ARGV[3]) - redis.call('HSTRLEN', KEYS[1], 'doc'))
redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'r', ARGV[4])
place(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return redis.call('HINCRBY', KEYS[1], 'v', 1)
";

/// KEYS: ready, leased. ARGV: task key prefix, now (clamped), owner, until, until score.
/// An expired lease first (its runner is gone), else the first due task of the best rank.
/// Returns nil, or {id, {doc, v, owner, until}} (doc nil when the hash vanished: corrupt).
const CLAIM: &str = r"
local id = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'LIMIT', 0, 1)[1]
if not id then
  local now = tonumber(ARGV[2])
  for rank = 0, 9 do
    local lo = rank * 1e13
    id = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.0f', lo),
      string.format('%.0f', lo + now), 'LIMIT', 0, 1)[1]
    if id then break end
  end
end
if not id then return false end
local task = ARGV[1] .. id
if redis.call('EXISTS', task) == 0 then
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  return {id, {false, false, false, false}}
end
place(task, KEYS[1], KEYS[2], id, 'l', ARGV[5], ARGV[3], ARGV[4])
redis.call('HINCRBY', task, 'v', 1)
return {id, redis.call('HMGET', task, 'doc', 'v', 'owner', 'u')}
";

/// KEYS: ready, leased. The first due of each rank and the first lease expiry; the earliest.
const NEXT_DUE: &str = r"
local best = false
for rank = 0, 9 do
  local lo = rank * 1e13
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%.0f', lo),
    '(' .. string.format('%.0f', lo + 1e13), 'LIMIT', 0, 1, 'WITHSCORES')
  if first[2] then
    local due = tonumber(first[2]) - lo
    if not best or due < best then best = due end
  end
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[2] then
  local u = tonumber(first[2])
  if not best or u < best then best = u end
end
return best
";

/// Removes a task if it is still at the version it was judged expired at (ARGV[2]; empty for an
/// index entry whose hash had vanished). KEYS: task, ready, leased, created, bytes. ARGV: id, v.
const PURGE: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if v and v ~= ARGV[2] then return 0 end
redis.call('DECRBY', KEYS[5], redis.call('HSTRLEN', KEYS[1], 'doc'))
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if v or ARGV[2] == '' then return 1 end
return 0
";

/// A task hash as read: doc, v, owner, until.
type Row = (Option<String>, Option<u64>, Option<String>, Option<u64>);

/// The scripts, the same for every store (a `Script` holds its text and SHA1).
struct Scripts {
    insert: Script,
    save: Script,
    claim: Script,
    next_due: Script,
    purge: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let with_place = |body: &str| Script::new(&format!("{PLACE}{body}"));
    Scripts {
        insert: with_place(INSERT),
        save: with_place(SAVE),
        claim: with_place(CLAIM),
        next_due: Script::new(NEXT_DUE),
        purge: Script::new(PURGE),
    }
});

pub(crate) struct RedisStore {
    conn: ConnectionManager,
    /// `P:task:`, prepended to an id.
    task_prefix: String,
    ready: String,
    leased: String,
    created: String,
    bytes: String,
    limits: Limits,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("task_prefix", &self.task_prefix)
            .finish_non_exhaustive()
    }
}

fn backend(err: redis::RedisError) -> StoreError {
    StoreError::Backend(format!("redis: {err}"))
}

fn encode(task: &Task) -> Result<String, StoreError> {
    serde_json::to_string(task).map_err(|e| StoreError::Backend(e.to_string()))
}

/// The task a hash holds, its version and lease taken from the hash fields; `None` when gone.
fn decode(id: &str, (doc, v, owner, until): Row) -> Result<Option<Task>, StoreError> {
    let Some(doc) = doc else {
        return Ok(None);
    };
    let corrupt = |reason: String| StoreError::Corrupt {
        id: id.to_owned(),
        reason,
    };
    let mut task: Task = serde_json::from_str(&doc).map_err(|e| corrupt(e.to_string()))?;
    task.version = v.ok_or_else(|| corrupt("no version".to_owned()))?;
    task.lease = match (owner, until) {
        (Some(owner), Some(until_ms)) => Some(Lease { owner, until_ms }),
        _ => None,
    };
    Ok(Some(task))
}

/// A time as a score: clamped below `RANK_SPAN` so every score stays exact.
fn clamp(ms: u64) -> u64 {
    ms.min(RANK_SPAN - 1)
}

/// The script arguments that place a task: slot, score, owner, until — as file.rs `slot()`.
fn placement(task: &Task) -> (&'static str, u64, &str, u64) {
    match (&task.lease, task.work()) {
        (Some(lease), _) => ("l", clamp(lease.until_ms), &lease.owner, lease.until_ms),
        (None, Some(_)) => (
            "r",
            u64::from(task.rank()) * RANK_SPAN + clamp(task.due_ms),
            "",
            0,
        ),
        (None, None) => ("i", 0, "", 0),
    }
}

/// `url` without a password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://…@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl RedisStore {
    /// Connects and PINGs, so a wrong address fails at start rather than at the first task.
    /// `redis://` and `rediss://` (TLS with the system's roots).
    pub(crate) async fn open(url: &str, prefix: &str, limits: Limits) -> Result<Self, StoreError> {
        let shown = redact(url);
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Backend(format!("redis {shown}: {what}: {e}"))
        };
        let client = redis::Client::open(url).map_err(|e| fail("bad address", &e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            // Fail fast at start; later drops are retried by the manager on the next command.
            .set_number_of_retries(1);
        let mut conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| fail("cannot connect", &e))?;
        let pong: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| fail("PING failed", &e))?;
        if pong != "PONG" {
            return Err(fail("PING answered", &pong));
        }
        Ok(Self {
            conn,
            task_prefix: format!("{prefix}:task:"),
            ready: format!("{prefix}:ready"),
            leased: format!("{prefix}:leased"),
            created: format!("{prefix}:created"),
            bytes: format!("{prefix}:bytes"),
            limits,
        })
    }

    fn key(&self, id: &str) -> String {
        format!("{}{id}", self.task_prefix)
    }

    /// A handle for one operation (the manager is a cheap clone over one multiplexed connection).
    fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    pub(crate) async fn insert(&self, task: &mut Task) -> Result<Inserted, StoreError> {
        task.version = 1;
        let doc = encode(task)?;
        let (slot, score, owner, until) = placement(task);
        let row: Row = SCRIPTS
            .insert
            .key(self.key(&task.id))
            .key(&self.ready)
            .key(&self.leased)
            .key(&self.created)
            .key(&self.bytes)
            .arg(&task.id)
            .arg(doc)
            .arg(u64::from(task.rank()))
            .arg(slot)
            .arg(score)
            .arg(owner)
            .arg(until)
            .arg(task.created_ms)
            .arg(self.limits.max_tasks)
            .arg(self.limits.max_bytes)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        if row.0.is_none() && row.1 == Some(0) {
            return Err(StoreError::Full(format!(
                "tasks.max_tasks is {}, tasks.max_bytes is {}",
                self.limits.max_tasks, self.limits.max_bytes
            )));
        }
        Ok(match decode(&task.id, row)? {
            Some(stored) => Inserted::Existing(Box::new(stored)),
            None => Inserted::New,
        })
    }

    pub(crate) async fn get(&self, id: &str) -> Result<Option<Task>, StoreError> {
        let row: Row = redis::cmd("HMGET")
            .arg(self.key(id))
            .arg(&["doc", "v", "owner", "u"])
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        decode(id, row)
    }

    /// The rows of `ids`, in one round trip.
    async fn rows(&self, ids: &[String]) -> Result<Vec<Row>, StoreError> {
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("HMGET")
                .arg(self.key(id))
                .arg(&["doc", "v", "owner", "u"]);
        }
        pipe.query_async(&mut self.conn()).await.map_err(backend)
    }

    pub(crate) async fn list(
        &self,
        state: Option<State>,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        let mut out = Vec::new();
        let mut start = 0usize;
        while out.len() < limit {
            let page = if state.is_some() {
                PAGE
            } else {
                (limit - out.len()).min(PAGE)
            };
            let ids: Vec<String> = redis::cmd("ZREVRANGE")
                .arg(&self.created)
                .arg(start)
                .arg(start + page - 1)
                .query_async(&mut self.conn())
                .await
                .map_err(backend)?;
            if ids.is_empty() {
                break;
            }
            start += ids.len();
            for (id, row) in ids.iter().zip(self.rows(&ids).await?) {
                // A task purged since the index was read is skipped.
                let Some(task) = decode(id, row)? else {
                    continue;
                };
                if out.len() < limit && state.is_none_or(|s| s == task.state) {
                    out.push(task);
                }
            }
        }
        Ok(out)
    }

    pub(crate) async fn claim(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<Option<Task>, StoreError> {
        let until = now_ms.saturating_add(lease_ms);
        let found: Option<(String, Row)> = SCRIPTS
            .claim
            .key(&self.ready)
            .key(&self.leased)
            .arg(&self.task_prefix)
            .arg(clamp(now_ms))
            .arg(owner)
            .arg(until)
            .arg(clamp(until))
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let Some((id, row)) = found else {
            return Ok(None);
        };
        match decode(&id, row)? {
            Some(task) => Ok(Some(task)),
            // The script already dropped the stray index entry; the next claim moves on.
            None => Err(StoreError::Corrupt {
                id,
                reason: "queued but not stored".to_owned(),
            }),
        }
    }

    pub(crate) async fn save(&self, task: &mut Task) -> Result<(), StoreError> {
        let mut new = task.clone();
        new.version += 1;
        let doc = encode(&new)?;
        let (slot, score, owner, until) = placement(&new);
        let written: i64 = SCRIPTS
            .save
            .key(self.key(&new.id))
            .key(&self.ready)
            .key(&self.leased)
            .key(&self.bytes)
            .arg(&new.id)
            .arg(task.version)
            .arg(doc)
            .arg(u64::from(new.rank()))
            .arg(slot)
            .arg(score)
            .arg(owner)
            .arg(until)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)?;
        match written {
            -1 => Err(StoreError::Missing(new.id)),
            -2 => Err(StoreError::Conflict(new.id)),
            v => {
                new.version = u64::try_from(v).map_err(|_| {
                    StoreError::Backend(format!("redis: save answered version {v}"))
                })?;
                *task = new;
                Ok(())
            }
        }
    }

    pub(crate) async fn next_due(&self) -> Result<Option<u64>, StoreError> {
        SCRIPTS
            .next_due
            .key(&self.ready)
            .key(&self.leased)
            .invoke_async(&mut self.conn())
            .await
            .map_err(backend)
    }

    pub(crate) async fn purge(&self, now_ms: u64, retention_ms: u64) -> Result<usize, StoreError> {
        // Only a task created before the cutoff can have been updated before it (updated_ms
        // never precedes created_ms), so the rest of the index is not read.
        let Some(cutoff) = now_ms.checked_sub(retention_ms) else {
            return Ok(0);
        };
        let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(&self.created)
            .arg("-inf")
            .arg(format!("({cutoff}"))
            .query_async(&mut self.conn())
            .await
            .map_err(backend)?;
        let mut gone = 0usize;
        for page in ids.chunks(PAGE) {
            for (id, row) in page.iter().zip(self.rows(page).await?) {
                let version = match decode(id, row) {
                    Ok(Some(task)) if task.expired(now_ms, retention_ms) => {
                        task.version.to_string()
                    }
                    // An unreadable or unexpired task stays, as in the file store.
                    Ok(Some(_)) | Err(_) => continue,
                    Ok(None) => String::new(),
                };
                // Guarded by the version: a task changed since it was read is kept.
                let removed: i64 = SCRIPTS
                    .purge
                    .key(self.key(id))
                    .key(&self.ready)
                    .key(&self.leased)
                    .key(&self.created)
                    .key(&self.bytes)
                    .arg(id)
                    .arg(version)
                    .invoke_async(&mut self.conn())
                    .await
                    .map_err(backend)?;
                if removed == 1 {
                    gone += 1;
                }
            }
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{conformance, TaskStore};
    use super::*;

    // The `redis-server` launcher the black-box tests use too.
    pub(crate) use testkit::redis::RedisServer;

    async fn store(server: &RedisServer, prefix: &str) -> RedisStore {
        let limits = Limits {
            max_tasks: 1_000,
            max_bytes: 1 << 20,
        };
        match RedisStore::open(&server.url(), prefix, limits).await {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    #[tokio::test]
    async fn conformance_redis() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        // A prefix per function: each starts from an empty store on the one server.
        conformance::insert_and_read(&TaskStore::from(store(&server, "a").await)).await;
        conformance::claim_order_and_leases(&TaskStore::from(store(&server, "b").await)).await;
        conformance::save_requeues(&TaskStore::from(store(&server, "c").await)).await;
        conformance::purge_finished(&TaskStore::from(store(&server, "d").await)).await;
        let small = Limits {
            max_tasks: 3,
            max_bytes: 1 << 20,
        };
        match RedisStore::open(&server.url(), "e", small).await {
            Ok(s) => conformance::refuses_beyond_limits(&TaskStore::from(s)).await,
            Err(e) => panic!("{e}"),
        }
    }

    #[tokio::test]
    async fn a_second_replica_takes_over_an_expired_lease() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let a = store(&server, "fleet").await;
        let b = store(&server, "fleet").await;
        let mut t = conformance::task("t", 5, 100);
        assert!(matches!(a.insert(&mut t).await, Ok(Inserted::New)));
        let mut held = a
            .claim("a", 100, 1_000)
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| conformance::task("x", 0, 0));
        assert_eq!(held.version, 2);
        let seen = b.get("t").await.ok().flatten();
        assert_eq!(seen.as_ref().map(|t| t.version), Some(2));
        assert_eq!(
            seen.and_then(|t| t.lease).map(|l| l.owner),
            Some("a".into())
        );
        assert!(
            matches!(b.claim("b", 1_099, 1_000).await, Ok(None)),
            "lease still held"
        );
        let taken = b.claim("b", 1_100, 1_000).await.ok().flatten();
        assert_eq!(
            taken.as_ref().and_then(|t| t.lease.clone()),
            Some(Lease {
                owner: "b".into(),
                until_ms: 2_100
            })
        );
        held.state = State::Done;
        held.lease = None;
        assert!(matches!(
            a.save(&mut held).await,
            Err(StoreError::Conflict(_))
        ));
        let mut taken = taken.unwrap_or_else(|| conformance::task("x", 0, 0));
        taken.state = State::Done;
        taken.lease = None;
        assert!(b.save(&mut taken).await.is_ok());
        let done = a.get("t").await.ok().flatten();
        assert_eq!(done.as_ref().map(|t| t.state), Some(State::Done));
        assert_eq!(done.as_ref().map(|t| t.version), Some(taken.version));
        assert_eq!(done.and_then(|t| t.lease), None);
        assert!(matches!(a.claim("a", 10_000, 1_000).await, Ok(None)));
        assert_eq!(a.next_due().await.ok(), Some(None));
    }

    #[tokio::test]
    async fn save_of_a_missing_task_and_a_stale_version() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let s = store(&server, "cas").await;
        let mut ghost = conformance::task("ghost", 5, 100);
        ghost.version = 1;
        assert!(matches!(
            s.save(&mut ghost).await,
            Err(StoreError::Missing(_))
        ));
        let mut t = conformance::task("t", 5, 100);
        assert!(s.insert(&mut t).await.is_ok());
        let mut stale = t.clone();
        t.priority = 9;
        assert!(s.save(&mut t).await.is_ok());
        assert_eq!(t.version, 2);
        assert!(matches!(
            s.save(&mut stale).await,
            Err(StoreError::Conflict(_))
        ));
        assert_eq!(s.get("t").await.ok().flatten().map(|t| t.priority), Some(9));
    }

    #[tokio::test]
    async fn open_fails_fast_without_a_server() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let started = std::time::Instant::now();
        let limits = Limits {
            max_tasks: 1,
            max_bytes: 1,
        };
        let err =
            RedisStore::open(&format!("redis://:secret@127.0.0.1:{port}/0"), "x", limits).await;
        match err {
            Err(StoreError::Backend(msg)) => {
                assert!(msg.contains("cannot connect"), "{msg}");
                assert!(!msg.contains("secret"), "the password stays out: {msg}");
            }
            other => panic!("expected a connection error: {other:?}"),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(15));
    }
}
