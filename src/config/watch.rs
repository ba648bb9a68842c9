//! Hot reload: polls the config files and swaps in each valid new version.
//!
//! Why polling and not inotify: Kubernetes updates a mounted ConfigMap by swapping the `..data`
//! symlink, so a watch on the file's old inode never fires; re-reading the path (which follows the
//! symlinks anew) sees in-place writes, rename-over and symlink swaps alike, for a few small reads
//! a second.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{parse_bootstrap, parse_policy, ConfigStore, FileKind};

/// The content hash of what the watcher last read from one file (`None`: unreadable).
#[derive(Clone, Copy, Default)]
struct Seen {
    hash: Option<u64>,
}

/// Hears each reload's result: the file's kind (`bootstrap`, `policy`) and what came of it.
/// A callback, so config does not depend on who counts reloads (the metrics).
pub(crate) type OnReload = Arc<dyn Fn(&'static str, ReloadResult) + Send + Sync>;

/// What came of one reload (the `result` label of `reach_config_reloads_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReloadResult {
    /// Everything the file changed is live.
    Ok,
    /// The file was unreadable or invalid: the running config stays.
    Error,
    /// The file changed restart-only keys: they keep their running values, the rest is live.
    RestartRequired,
}

impl ReloadResult {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Ok => "ok",
            ReloadResult::Error => "error",
            ReloadResult::RestartRequired => "restart_required",
        }
    }
}

/// Starts the watcher; it stops when `stop` is cancelled.
pub(crate) fn spawn_watcher(
    store: Arc<ConfigStore>,
    on_reload: OnReload,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        // Nothing seen yet: the first poll parses each file and swaps only if it differs from
        // what is running, so a change made between start-up and this task's first run counts.
        let mut seen_bootstrap = Seen::default();
        let mut seen_policy = Seen::default();
        loop {
            // A zero interval in the file must not turn the watcher into a busy loop.
            let interval = store
                .snapshot()
                .bootstrap
                .watch_interval
                .get()
                .max(Duration::from_millis(10));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            if let Some(path) = store.paths.bootstrap.clone() {
                poll(
                    &store,
                    &on_reload,
                    &path,
                    FileKind::Bootstrap,
                    &mut seen_bootstrap,
                )
                .await;
            }
            if let Some(path) = store.paths.policy.clone() {
                poll(
                    &store,
                    &on_reload,
                    &path,
                    FileKind::Policy,
                    &mut seen_policy,
                )
                .await;
            }
        }
    })
}

async fn poll(
    store: &ConfigStore,
    on_reload: &OnReload,
    path: &Path,
    kind: FileKind,
    seen: &mut Seen,
) {
    let text = match tokio::fs::read_to_string(path).await {
        Ok(text) => text,
        Err(err) => {
            // Reported once per disappearance, not on every poll.
            if seen.hash.take().is_some() {
                tracing::warn!(file = %path.display(), %err, "config file unreadable; keeping the running config");
                store.reloaded(kind.as_str(), Err(format!("{}: {err}", path.display())));
                on_reload(kind.as_str(), ReloadResult::Error);
            }
            return;
        }
    };
    let hash = hash_text(&text);
    if seen.hash == Some(hash) {
        return;
    }
    seen.hash = Some(hash);
    let current = store.snapshot();
    let result = match kind {
        FileKind::Bootstrap => parse_bootstrap(path, &text)
            .map(|bootstrap| store.reload(kind, bootstrap, current.policy.clone())),
        // The sidecar's watcher only ever polls bootstrap or policy paths.
        FileKind::Policy | FileKind::Injector => parse_policy(path, &text)
            .map(|policy| store.reload(kind, current.bootstrap.clone(), policy)),
    };
    let reloaded = match result {
        Ok(reloaded) => reloaded,
        Err(err) => {
            tracing::error!(%err, kind = kind.as_str(), "config reload rejected; the running config stays");
            store.reloaded(kind.as_str(), Err(err.to_string()));
            on_reload(kind.as_str(), ReloadResult::Error);
            return;
        }
    };
    store.reloaded(kind.as_str(), Ok(()));
    if reloaded.went_live {
        tracing::info!(file = %path.display(), kind = kind.as_str(), generation = store.snapshot().generation, "config reloaded");
    }
    for key in &reloaded.held {
        tracing::warn!(file = %path.display(), %key, "a restart-only key changed: it keeps its running value until a restart");
    }
    if !reloaded.held.is_empty() {
        on_reload(kind.as_str(), ReloadResult::RestartRequired);
    } else if reloaded.went_live {
        on_reload(kind.as_str(), ReloadResult::Ok);
    }
}

fn hash_text(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}
