//! The keys a reload cannot change: read once when a listener, pool, table or task is built.
//!
//! Why one table: a key read once at start-up and then accepted by a reload would be a silent
//! lie (the file says one thing, the sidecar does another). Every such key is listed here, and
//! `ConfigStore` keeps its running value in the live snapshot, so `/status` shows what runs; the
//! change is reported as pending until a restart (or until the file goes back). The same list is
//! in `docs/configuration.md`.

use serde_json::Value;

use super::{FileKind, Snapshot};

/// One restart-only key (a section stands for every key under it).
pub(crate) struct RestartOnly {
    /// The dotted key as written in the file.
    pub(crate) key: &'static str,
    pub(crate) file: FileKind,
    /// What reads it once.
    pub(crate) read_by: &'static str,
    differs: fn(&Snapshot, &Snapshot) -> bool,
    value: fn(&Snapshot) -> Value,
    keep: fn(&Snapshot, &mut Snapshot),
}

impl std::fmt::Debug for RestartOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestartOnly")
            .field("key", &self.key)
            .field("file", &self.file)
            .field("read_by", &self.read_by)
            .finish_non_exhaustive()
    }
}

/// A restart-only key whose value in a reloaded file differs from the running one.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PendingRestart {
    /// The dotted key, as precise as the change (`gossip.probe_interval`, or `gossip` when the
    /// whole section came or went).
    pub(crate) key: String,
    /// `bootstrap` or `policy`.
    pub(crate) file: &'static str,
    /// When the file first held the new value, milliseconds since the Unix epoch.
    pub(crate) since_unix_ms: u64,
}

macro_rules! restart_only {
    ($($key:literal => $file:ident . $($field:ident).+, $read_by:literal;)*) => {
        &[$(RestartOnly {
            key: $key,
            file: restart_only!(@file $file),
            read_by: $read_by,
            differs: |running, next| running.$file.$($field).+ != next.$file.$($field).+,
            value: |s| serde_json::to_value(&s.$file.$($field).+).unwrap_or_default(),
            keep: |running, next| next.$file.$($field).+ = running.$file.$($field).+.clone(),
        }),*]
    };
    (@file bootstrap) => { FileKind::Bootstrap };
    (@file policy) => { FileKind::Policy };
}

/// Every key read once at build. A key added to the config that is read once gets a row here
/// (and a line in `docs/configuration.md`).
#[rustfmt::skip] // one row per key: a table
pub(crate) const RESTART_ONLY: &[RestartOnly] = restart_only![
    "listen" => bootstrap.listen, "the listeners, bound at start";
    "limits" => bootstrap.limits, "the listeners' servers and acceptors, built at start";
    "agent.name" => bootstrap.agent.name, "the metrics' agent label, the gossip member and the task queue";
    "gossip" => bootstrap.gossip, "the gossip node (timings must match fleet-wide; the key file's contents rotate live)";
    "tls" => bootstrap.tls, "the mutual TLS files' paths (their contents rotate live)";
    "tracing" => bootstrap.tracing, "the span exporter, started at start";
    "tasks" => bootstrap.tasks, "the task store and its workers, opened at start";
    "pool.idle_timeout" => policy.pool.idle_timeout, "every connection pool, built at start";
    "pool.max_idle_per_host" => policy.pool.max_idle_per_host, "every connection pool, built at start";
    "pool.peer_protocol" => policy.pool.peer_protocol, "the peer pool, built at start";
    "idempotency" => policy.idempotency, "the idempotency-key table, sized at start";
];

/// Puts the running value of every restart-only key into `next`, and names the keys whose
/// value there differed (as precisely as the change), with their file.
pub(super) fn hold(running: &Snapshot, next: &mut Snapshot) -> Vec<(FileKind, String)> {
    let mut changed = Vec::new();
    for entry in RESTART_ONLY {
        if !(entry.differs)(running, next) {
            continue;
        }
        let before = changed.len();
        let (old, new) = ((entry.value)(running), (entry.value)(next));
        leaves_that_differ(entry.key, &old, &new, &mut |key| {
            changed.push((entry.file, key))
        });
        if changed.len() == before {
            // Equal as JSON but not as values: name the whole key.
            changed.push((entry.file, entry.key.to_owned()));
        }
        (entry.keep)(running, next);
    }
    changed
}

/// Calls `found` with the dotted path of each leaf where `old` and `new` differ; an object that
/// appears or disappears is one change, named by its own path.
fn leaves_that_differ(path: &str, old: &Value, new: &Value, found: &mut dyn FnMut(String)) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let (x, y) = (
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                );
                leaves_that_differ(&format!("{path}.{key}"), x, y, found);
            }
        }
        _ if old != new => found(path.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::config::{
        parse_bootstrap, parse_policy, Bootstrap, GossipConfig, HumanDuration, Policy,
    };

    fn running() -> Snapshot {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let bootstrap = Bootstrap::local("a", addr, &["c"])
            .unwrap_or_else(|e| panic!("{e}"))
            .with_gossip(&[], PathBuf::from("key"));
        Snapshot::new(bootstrap, Policy::default(), 1)
    }

    /// The keys the audit found read once at build (src/app.rs `Sidecar::start` and what it
    /// calls): each must be in the table, so a reload cannot silently ignore it.
    #[test]
    fn the_table_names_every_key_read_once_at_build() {
        let keys: Vec<&str> = RESTART_ONLY.iter().map(|e| e.key).collect();
        for key in [
            "listen",
            "limits",
            "agent.name",
            "gossip",
            "tls",
            "tracing",
            "tasks",
            "pool.idle_timeout",
            "pool.max_idle_per_host",
            "idempotency",
        ] {
            assert!(keys.contains(&key), "`{key}` is not in the table");
        }
        // Made live instead (the connector reads them per new connection).
        for live in ["timeouts.connect", "pool.tcp_keepalive", "pool"] {
            assert!(!keys.contains(&live), "`{live}` reloads live");
        }
    }

    /// Each row's key is the path its value is written at: a file that sets that key changes
    /// exactly that row.
    #[test]
    fn each_key_is_where_the_file_writes_it() {
        let base = "agent:\n  name: a\n  address: 127.0.0.1:1\n  max_concurrency: 1\n";
        let bootstrap = |extra: &str| {
            parse_bootstrap(Path::new("b.yaml"), &format!("{base}{extra}"))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let policy =
            |text: &str| parse_policy(Path::new("p.yaml"), text).unwrap_or_else(|e| panic!("{e}"));
        let plain = Snapshot::new(bootstrap(""), Policy::default(), 1);
        let cases = [
            (
                bootstrap("listen: { admin: 127.0.0.1:9 }\n"),
                Policy::default(),
                "listen.admin",
            ),
            (
                bootstrap("limits: { max_connections: 9 }\n"),
                Policy::default(),
                "limits.max_connections",
            ),
            (
                bootstrap("gossip: { key_file: k }\n"),
                Policy::default(),
                "gossip",
            ),
            (
                bootstrap("tracing: { sample_ratio: 0.5 }\n"),
                Policy::default(),
                "tracing",
            ),
            (
                bootstrap("tasks: { path: t.db }\n"),
                Policy::default(),
                "tasks",
            ),
            (
                bootstrap("tls: { cert: c, key: k, ca: t }\n"),
                Policy::default(),
                "tls",
            ),
            (
                bootstrap(""),
                policy("pool: { max_idle_per_host: 3 }\n"),
                "pool.max_idle_per_host",
            ),
            (
                bootstrap(""),
                policy("pool: { idle_timeout: 3s }\n"),
                "pool.idle_timeout",
            ),
            (
                bootstrap(""),
                policy("idempotency: { ttl: 3s }\n"),
                "idempotency.ttl",
            ),
        ];
        for (b, p, want) in cases {
            let mut next = Snapshot::new(b, p, 2);
            let changed = hold(&plain, &mut next);
            let names: Vec<&str> = changed.iter().map(|(_, k)| k.as_str()).collect();
            assert_eq!(names, [want]);
            assert_eq!(
                next.bootstrap, plain.bootstrap,
                "{want}: the running value is kept"
            );
            assert_eq!(
                next.policy, plain.policy,
                "{want}: the running value is kept"
            );
        }
    }

    #[test]
    fn a_changed_timing_is_named_and_kept_and_the_rest_goes_through() {
        let running = running();
        let mut next = Snapshot::new(running.bootstrap.clone(), running.policy.clone(), 2);
        let gossip = next.bootstrap.gossip.get_or_insert_with(|| {
            GossipConfig::new(([127, 0, 0, 1], 0).into(), Vec::new(), PathBuf::new())
        });
        gossip.probe_interval = HumanDuration::from_secs(9);
        next.bootstrap.limits.max_connections = 7;
        next.policy.pool.max_idle_per_host = 1;
        next.policy.timeouts.connect = HumanDuration::from_secs(9);
        let changed = hold(&running, &mut next);
        assert_eq!(
            changed,
            [
                (FileKind::Bootstrap, "limits.max_connections".to_owned()),
                (FileKind::Bootstrap, "gossip.probe_interval".to_owned()),
                (FileKind::Policy, "pool.max_idle_per_host".to_owned()),
            ]
        );
        assert_eq!(next.bootstrap, running.bootstrap);
        assert_eq!(next.policy.pool, running.policy.pool);
        assert_eq!(
            next.policy.timeouts.connect,
            HumanDuration::from_secs(9),
            "a live key goes through"
        );
    }

    #[test]
    fn nothing_changed_is_nothing_held() {
        let running = running();
        let mut next = Snapshot::new(running.bootstrap.clone(), running.policy.clone(), 2);
        assert!(hold(&running, &mut next).is_empty());
    }
}
