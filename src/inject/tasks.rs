//! Async tasks for an injected pod: the bootstrap's `tasks` (the embedded store on an `emptyDir`,
//! or the injector's shared Redis), that volume and its mount, and the workload name
//! (`AGENT_REACH_WORKLOAD`) under which replicas of one caller share a Redis queue.
//!
//! Why an `emptyDir`: it outlives a container restart (a crash, an OOM kill, a new sidecar
//! image), which is what the embedded store must survive; it does not outlive the pod, so pods
//! that may be deleted with queued tasks need the Redis store (`docs/kubernetes.md`).

use serde_json::{json, Value};

use super::config::{InjectorConfig, Tasks};

/// Where the embedded store's file lives in the sidecar.
pub(super) const TASKS_DIR: &str = "/var/lib/agent-reach/tasks";
/// The pod volume (`emptyDir`) holding it.
pub(super) const TASKS_VOLUME: &str = "agent-reach-tasks";
/// The environment variable naming the workload (`src/tasks/queue.rs` reads it).
pub(super) const WORKLOAD_ENV: &str = "AGENT_REACH_WORKLOAD";

/// The environment variable the Redis URL comes in when it is a Secret's.
pub(super) const STORE_ENV: &str = "AGENT_REACH_TASKS_STORE";

/// The bootstrap's `tasks`.
pub(super) fn bootstrap_tasks(tasks: &Tasks) -> Value {
    if tasks.store_secret.is_some() {
        json!({ "store_from_env": STORE_ENV })
    } else if tasks.store.is_empty() {
        json!({ "path": format!("{TASKS_DIR}/tasks.db") })
    } else {
        json!({ "store": tasks.store })
    }
}

/// The sidecar's variable holding the Redis URL, from its Secret, when it is one.
pub(super) fn store_env(tasks: &Tasks) -> Option<Value> {
    let secret = tasks.store_secret.as_ref()?;
    Some(
        json!({ "name": STORE_ENV, "valueFrom": { "secretKeyRef": { "name": secret.name, "key": secret.key } } }),
    )
}

/// The `emptyDir`, when the pod keeps its tasks itself.
pub(super) fn volume(tasks: &Tasks) -> Option<Value> {
    if !tasks.store.is_empty() || tasks.store_secret.is_some() {
        return None;
    }
    let mut empty_dir = json!({});
    if !tasks.size_limit.is_empty() {
        // Past it the kubelet evicts the pod: a bound on what a runaway queue takes of the node.
        empty_dir["sizeLimit"] = json!(tasks.size_limit);
    }
    Some(json!({ "name": TASKS_VOLUME, "emptyDir": empty_dir }))
}

/// The sidecar's mount of it, writable: the store's file and its journal.
pub(super) fn mount() -> Value {
    json!({ "name": TASKS_VOLUME, "mountPath": TASKS_DIR })
}

/// The workload the pod belongs to: its `app.kubernetes.io/name` label, else its `app` label,
/// else its `generateName` without the trailing `-` and, for a ReplicaSet's pod, the pod-template
/// hash. `None` for a pod with none of them (a bare pod); the sidecar then uses its agent name.
pub(super) fn workload(pod: &Value) -> Option<String> {
    let label = |key: &str| {
        pod.pointer("/metadata/labels")
            .and_then(|l| l.get(key))
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    if let Some(name) = label("app.kubernetes.io/name").or_else(|| label("app")) {
        return Some(name.to_owned());
    }
    let generated = pod
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)?
        .trim_end_matches('-');
    let base = match generated.rsplit_once('-') {
        Some((base, last))
            if !base.is_empty()
                && (label("pod-template-hash") == Some(last) || looks_like_hash(last)) =>
        {
            base
        }
        _ => generated,
    };
    (!base.is_empty()).then(|| base.to_owned())
}

/// A pod-template hash as Kubernetes writes it (`rand.SafeEncodeString`): 5–10 characters of an
/// alphabet without vowels, so a word of a workload's own name is rarely taken for one.
fn looks_like_hash(segment: &str) -> bool {
    (5..=10).contains(&segment.len())
        && segment
            .bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b))
}

/// The checks of `tasks` a chart mistake must fail at start-up rather than in every pod.
pub(super) fn check(config: &InjectorConfig) -> Result<(), String> {
    let tasks = &config.tasks;
    if !tasks.enabled {
        return Ok(());
    }
    if config.bootstrap.contains_key("tasks") {
        return Err(
            "bootstrap: must not have `tasks` beside an enabled `tasks` section; the injector adds it to each pod's"
                .to_owned(),
        );
    }
    // Not echoed: a Redis URL may carry a password.
    let redis = ["redis://", "rediss://"]
        .iter()
        .any(|scheme| tasks.store.starts_with(scheme));
    if !tasks.store.is_empty() && !redis {
        return Err("tasks.store: not a redis:// or rediss:// URL".to_owned());
    }
    // The URL goes into the sidecar's environment, where the kubelet expands `$(VAR)` and `$$`.
    if tasks.store.contains('$') {
        return Err("tasks.store: must not contain `$` (the kubelet expands it in the sidecar's environment)".to_owned());
    }
    if !tasks.size_limit.is_empty() && !is_quantity(&tasks.size_limit) {
        return Err(format!(
            "tasks.size_limit: `{}` is not a size such as 1Gi or 500Mi",
            tasks.size_limit
        ));
    }
    let taken = |list: Option<&Value>, key: &str, value: &str| {
        list.and_then(Value::as_array).is_some_and(|l| {
            l.iter()
                .any(|v| v.get(key).and_then(Value::as_str) == Some(value))
        })
    };
    if taken(config.sidecar.get("volumeMounts"), "mountPath", TASKS_DIR)
        || taken(config.sidecar.get("volumeMounts"), "name", TASKS_VOLUME)
        || config
            .volumes
            .iter()
            .any(|v| v.get("name").and_then(Value::as_str) == Some(TASKS_VOLUME))
    {
        return Err(format!(
            "sidecar: must not mount {TASKS_DIR} or a volume {TASKS_VOLUME} itself with `tasks` on; the injector adds them"
        ));
    }
    Ok(())
}

/// A Kubernetes quantity in the forms a size is written: digits, then an optional suffix.
fn is_quantity(text: &str) -> bool {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0
        && [
            "", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
        ]
        .contains(&&text[digits..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(metadata: Value) -> Value {
        json!({ "metadata": metadata, "spec": {} })
    }

    #[test]
    fn the_workload_is_the_name_label_then_app_then_the_generate_name() {
        let both = pod(json!({ "labels": { "app.kubernetes.io/name": "coder", "app": "other" } }));
        assert_eq!(workload(&both).as_deref(), Some("coder"));
        let app = pod(json!({ "labels": { "app": "writer" }, "generateName": "x-7d9f8b6c5-" }));
        assert_eq!(workload(&app).as_deref(), Some("writer"));
        assert_eq!(workload(&pod(json!({ "name": "bare" }))), None);
    }

    #[test]
    fn a_replica_sets_hash_is_trimmed_from_the_generate_name_and_nothing_else() {
        let generated = |name: &str| workload(&pod(json!({ "generateName": name })));
        // A Deployment's pod: <deployment>-<pod-template hash>-.
        assert_eq!(
            generated("web-backend-7d9f8b6c5-").as_deref(),
            Some("web-backend")
        );
        // A DaemonSet's or a Job's: <name>-, whose last word is no hash.
        assert_eq!(generated("log-shipper-").as_deref(), Some("log-shipper"));
        assert_eq!(generated("nightly-ds-").as_deref(), Some("nightly-ds"));
        assert_eq!(generated("coder-").as_deref(), Some("coder"));
        assert_eq!(generated("-"), None);
        // The label names the hash exactly, whatever it looks like.
        let labelled = pod(json!({
            "generateName": "api-abc123-",
            "labels": { "pod-template-hash": "abc123" },
        }));
        assert_eq!(workload(&labelled).as_deref(), Some("api"));
    }

    #[test]
    fn sizes_are_quantities() {
        for ok in ["1Gi", "500Mi", "2G", "1048576"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["Gi", "1 Gi", "1gb", "-1Gi", "1.5Gi"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}
