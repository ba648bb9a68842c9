//! Manual injection: `agent-reach inject --config injector.yaml --file app.yaml` prints the
//! manifests with the sidecar added to every pod template that asks for it, exactly as the
//! webhook would (for clusters without the webhook, and to see what it will do).

use serde_json::Value;

use super::config::InjectorConfig;
use super::patch::apply;
use super::pod::{decide, Decision, OptIn};
use crate::config::yaml;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("document {index}: not YAML: {message}")]
    Yaml { index: usize, message: String },
    #[error("document {index} ({kind} {name}): {message}")]
    Denied {
        index: usize,
        kind: String,
        name: String,
        message: String,
    },
}

/// Where a kind keeps its pod template.
fn template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(""),
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController" => Some("/spec/template"),
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// Injects every pod (template) in a multi-document YAML stream; other objects pass unchanged.
/// Returns the new stream and how many pods got the sidecar.
/// `namespace` is where the manifests will be applied (`kubectl apply -n`); an object's own
/// `metadata.namespace` wins.
pub fn inject_manifests(
    config: &InjectorConfig,
    text: &str,
    namespace: &str,
) -> Result<(String, usize), ManifestError> {
    let mut out = Vec::new();
    let mut injected = 0;
    for (index, document) in yaml::documents::<Value>(text).enumerate() {
        let index = index + 1;
        let mut doc = document.map_err(|e| ManifestError::Yaml {
            index,
            message: e.to_string(),
        })?;
        if doc.is_null() {
            continue;
        }
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let namespace = doc
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or(namespace)
            .to_owned();
        let denied = |message: String| ManifestError::Denied {
            index,
            kind: kind.clone(),
            name: name.clone(),
            message,
        };
        if let Some(pointer) = template_pointer(&kind) {
            if let Some(pod) = doc.pointer_mut(pointer) {
                match decide(config, pod, &namespace, OptIn::Annotation) {
                    Ok(Decision::Inject(ops)) => {
                        apply(pod, &ops).map_err(|e| denied(e.to_string()))?;
                        injected += 1;
                    }
                    Ok(Decision::Skip { .. }) => {}
                    Err(err) => return Err(denied(err.to_string())),
                }
            }
        }
        out.push(yaml::to_string(&doc).map_err(|e| ManifestError::Yaml {
            index,
            message: e.to_string(),
        })?);
    }
    Ok((out.join("---\n"), injected))
}
