//! Async tasks: where the bootstrap keeps them (per pod, restart-only) and the policy's final
//! fallback and escalation (per fleet, reloaded live). `docs/tasks.md`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::duration::HumanDuration;

/// Bootstrap `tasks`: the durable store of `prefer: respond-async` calls. Exactly one of `path`
/// (the embedded single-file store) and `store` (a shared Redis) is set.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TasksConfig {
    /// The embedded store's file, relative to the bootstrap file when relative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// A shared store, `redis://host:6379/0`: replicas of one caller share its tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The Redis key prefix; default `agent-reach:tasks:<workload>` (`AGENT_REACH_WORKLOAD`,
    /// which the injector sets from the pod's app label, else the agent name), so the replicas
    /// of one caller share a queue and other agents do not see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// How long a claimed task stays its runner's without a renewal: after it, another replica
    /// (or this one after a restart) takes the task over.
    #[serde(default = "default_lease")]
    pub lease: HumanDuration,
    /// Tasks run at once by this sidecar.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// The largest request body a task may carry (it is stored).
    #[serde(default = "default_max_payload")]
    pub max_payload_bytes: usize,
    /// The agent's response body is kept up to this size; a longer one is cut and marked.
    #[serde(default = "default_max_response")]
    pub max_response_bytes: usize,
    /// Finished tasks are kept this long, then removed.
    #[serde(default = "default_retention")]
    pub retention: HumanDuration,
}

fn default_lease() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_workers() -> usize {
    4
}
fn default_max_payload() -> usize {
    1 << 20
}
fn default_max_response() -> usize {
    1 << 20
}
fn default_retention() -> HumanDuration {
    HumanDuration::from_secs(24 * 3600)
}

impl TasksConfig {
    /// The embedded store at `path`, every other setting at its default.
    pub fn file(path: PathBuf) -> Self {
        Self {
            path: Some(path),
            store: None,
            prefix: None,
            lease: default_lease(),
            workers: default_workers(),
            max_payload_bytes: default_max_payload(),
            max_response_bytes: default_max_response(),
            retention: default_retention(),
        }
    }

    /// The same, its file path taken relative to `base` (the bootstrap's directory).
    pub fn resolved(&self, base: Option<&Path>) -> Self {
        let mut out = self.clone();
        if let (Some(dir), Some(path)) = (base, &self.path) {
            if path.is_relative() {
                out.path = Some(dir.join(path));
            }
        }
        out
    }

    /// Where the tasks are kept, or why the section is wrong.
    pub fn location(&self) -> Result<StoreLocation, String> {
        match (&self.path, &self.store) {
            (Some(path), None) => Ok(StoreLocation::File(path.clone())),
            (None, Some(url)) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                Ok(StoreLocation::Redis(url.clone()))
            }
            // Not echoed: the URL may carry a password.
            (None, Some(_)) => Err("tasks.store is not a redis:// or rediss:// URL".to_owned()),
            (Some(_), Some(_)) => {
                Err("tasks: set `path` (embedded store) or `store` (Redis), not both".to_owned())
            }
            (None, None) => Err("tasks: set `path` (embedded store) or `store` (Redis)".to_owned()),
        }
    }
}

/// Where a sidecar's tasks live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    File(PathBuf),
    Redis(String),
}

/// Policy `retry.fallback.queue`: the whole chain again later, `delay` doubling up to
/// `max_delay`, `max_rounds` times.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueRounds {
    pub delay: HumanDuration,
    pub max_delay: HumanDuration,
    pub max_rounds: u32,
}

impl Default for QueueRounds {
    fn default() -> Self {
        Self {
            delay: HumanDuration::from_secs(30),
            max_delay: HumanDuration::from_secs(600),
            max_rounds: 5,
        }
    }
}

impl QueueRounds {
    /// The pause before round `round` (1-based: the first repeat waits `delay`).
    pub fn delay_before(&self, round: u32) -> std::time::Duration {
        let doublings = round.saturating_sub(1).min(20);
        self.delay
            .get()
            .saturating_mul(1 << doublings)
            .min(self.max_delay.get())
    }
}

/// Policy `escalation`: where a task goes when every agent failed it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EscalationPolicy {
    /// The webhook a person's tooling listens on (JSON POST). Without it, escalated tasks wait
    /// for `agent-reach tasks` alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// The HMAC-SHA256 key that signs each POST (`reach-signature: sha256=<hex>`); relative to
    /// the policy file. Re-read at every delivery, so a rotated key applies at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The task's payload is sent up to this size (a longer one is cut and marked).
    pub max_payload_bytes: usize,
}

impl EscalationPolicy {
    /// The key file, a relative path taken from `policy_dir` (the policy file's directory).
    pub fn key_path(&self, policy_dir: Option<&Path>) -> Option<PathBuf> {
        let key = self.key_file.as_ref()?;
        Some(match policy_dir {
            Some(dir) if key.is_relative() => dir.join(key),
            _ => key.clone(),
        })
    }
}

impl Default for EscalationPolicy {
    fn default() -> Self {
        Self {
            webhook: None,
            key_file: None,
            max_payload_bytes: 64 * 1024,
        }
    }
}
