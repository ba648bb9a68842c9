//! The newcomer of the membership act is set up the way Kubernetes sets up an agent: its pod
//! carries `agent-reach.io/*` annotations, the injector (with the chart's defaults,
//! `config/injector.yaml`) answers with a patch, and the sidecar runs from the bootstrap that
//! patch puts in its environment. Only what a pod has to itself is changed for loopback: the
//! listen ports (a pod has its own network namespace), the gossip seed (the demo's, not a
//! Service name) and the key file path.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};

use super::DemoError;
use agent_reach::config::{parse_bootstrap, Bootstrap, HostPort, Name};
use agent_reach::inject::{apply, decide, Decision, InjectorConfig, OptIn};

const INJECTOR: &str = include_str!("../../../config/injector.yaml");

/// What the injector did for the newcomer's pod.
#[derive(Clone, Debug, Serialize)]
pub struct Injection {
    pub annotations: Vec<String>,
    pub patch_ops: usize,
    /// An init container with `restartPolicy: Always`.
    pub native_sidecar: bool,
}

/// The newcomer's bootstrap, through the injector.
pub(super) fn injected_bootstrap(
    name: &str,
    agent: SocketAddr,
    capability: &str,
    seed: &[SocketAddr],
    key_file: PathBuf,
) -> Result<(Bootstrap, Injection), DemoError> {
    let bad = |e: String| DemoError::Config(format!("injection: {e}"));
    let config = InjectorConfig::parse(Path::new("config/injector.yaml"), INJECTOR)
        .map_err(|e| bad(e.to_string()))?;
    let annotations = json!({
        "agent-reach.io/inject": "enabled",
        "agent-reach.io/capabilities": capability,
        "agent-reach.io/agent-port": agent.port().to_string(),
        "agent-reach.io/max-concurrency": "16",
        "agent-reach.io/probe-path": "/review",
    });
    let mut pod = json!({
        "metadata": { "generateName": format!("{name}-"), "annotations": annotations },
        "spec": { "containers": [{ "name": "agent", "image": "mock-agent" }] },
    });
    let ops = match decide(&config, &pod, "demo", OptIn::Annotation) {
        Ok(Decision::Inject(ops)) => ops,
        Ok(Decision::Skip { reason, .. }) => return Err(bad(reason.to_owned())),
        Err(err) => return Err(bad(err.to_string())),
    };
    apply(&mut pod, &ops).map_err(|e| bad(e.to_string()))?;
    let sidecar = &pod["spec"]["initContainers"][0];
    let text = sidecar["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == "AGENT_REACH_BOOTSTRAP"))
        .and_then(|e| e["value"].as_str())
        .ok_or_else(|| bad("the patch set no AGENT_REACH_BOOTSTRAP".to_owned()))?;
    let mut bootstrap = parse_bootstrap(Path::new("$AGENT_REACH_BOOTSTRAP"), text)
        .map_err(|e| bad(e.to_string()))?;
    // In a pod: the pod's name, its own ports, the Service as seed, the mounted key.
    bootstrap.agent.name = Name::parse(name).map_err(bad)?;
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    bootstrap.listen.outbound = loopback;
    bootstrap.listen.inbound = loopback;
    bootstrap.listen.admin = loopback;
    if let Some(gossip) = bootstrap.gossip.as_mut() {
        gossip.listen = loopback;
        gossip.seeds = seed
            .iter()
            .map(|s| HostPort::parse(&s.to_string()))
            .collect::<Result<_, _>>()
            .map_err(bad)?;
        gossip.key_file = key_file.clone();
    }
    // In a pod, the task store is on the pod's own emptyDir; here, in the run's directory.
    if let (Some(tasks), Some(dir)) = (bootstrap.tasks.as_mut(), key_file.parent()) {
        if tasks.path.is_some() {
            tasks.path = Some(dir.join(format!("{name}-tasks.db")));
        }
    }
    let listed = annotations_of(&pod);
    Ok((
        bootstrap,
        Injection {
            annotations: listed,
            patch_ops: ops.len(),
            native_sidecar: sidecar["restartPolicy"] == "Always",
        },
    ))
}

fn annotations_of(pod: &Value) -> Vec<String> {
    pod.pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k.starts_with("agent-reach.io/") && *k != "agent-reach.io/status")
                .map(|(k, v)| {
                    let key = k.trim_start_matches("agent-reach.io/");
                    format!("{key}={}", v.as_str().unwrap_or_default())
                })
                .collect()
        })
        .unwrap_or_default()
}
