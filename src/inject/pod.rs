//! One pod: decide whether it gets the sidecar, and build the JSON patch that adds it.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::annotations::{
    join, AnnotationError, Settings, INJECT, INJECTED_LABEL, RELEASE_LABEL, STATUS,
};
use super::config::InjectorConfig;
use super::mtls;
use super::patch::{escape, Op};
use super::probes;
use super::tasks;
use crate::config::{parse_bootstrap, yaml, Bootstrap};

/// Init containers that set up a mesh's traffic redirection: the sidecar goes after them.
const NETWORK_SETUP: [&str; 4] = [
    "istio-init",
    "istio-validation",
    "linkerd-init",
    "linkerd-network-validator",
];
/// The init container that installs the interception rules.
pub(super) const INIT_NET: &str = "agent-reach-init";
/// Its writable `/run` (an in-memory emptyDir).
const INIT_NET_RUN: &str = "agent-reach-init-run";
const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";

/// Where the bootstrap ConfigMap named by `agent-reach.io/config` is mounted.
const BOOTSTRAP_DIR: &str = "/etc/agent-reach/bootstrap";
const BOOTSTRAP_VOLUME: &str = "agent-reach-bootstrap";

/// Which webhook asked: a pod opts in by annotation, or its namespace opted every pod in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptIn {
    Annotation,
    Namespace,
}

/// What the webhook does with a pod.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Leave it alone; the reason is logged (and, where the user may be surprised, warned).
    Skip {
        reason: &'static str,
        warn: bool,
    },
    Inject(Vec<Op>),
}

/// Decides for one pod (`pod` is the admission request's object; `namespace` the request's,
/// since a pod being created may not carry its own yet).
pub fn decide(
    config: &InjectorConfig,
    pod: &Value,
    namespace: &str,
    opt_in: OptIn,
) -> Result<Decision, AnnotationError> {
    let empty = Map::new();
    if !pod.is_object() || pod.get("spec").and_then(Value::as_object).is_none() {
        return Err(AnnotationError::NotAPod(
            "it has no `spec` mapping".to_owned(),
        ));
    }
    let annotations = pod
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let wanted = match annotations.get(INJECT).and_then(Value::as_str) {
        Some("enabled") => true,
        Some("disabled") => false,
        Some(other) => {
            return Err(AnnotationError::Invalid {
                key: INJECT,
                value: other.to_owned(),
                problem: "is not `enabled` or `disabled`".to_owned(),
            })
        }
        None => opt_in == OptIn::Namespace,
    };
    if !wanted {
        return Ok(Decision::Skip {
            reason: "not opted in",
            warn: false,
        });
    }
    let sidecar = config.sidecar_name().unwrap_or("agent-reach");
    let has_container = |list: &str| names(pod, list).any(|n| n == sidecar);
    if annotations.get(STATUS).and_then(Value::as_str) == Some("injected")
        || has_container("containers")
        || has_container("initContainers")
    {
        return Ok(Decision::Skip {
            reason: "already injected",
            warn: false,
        });
    }
    if pod.pointer("/spec/hostNetwork") == Some(&Value::Bool(true)) {
        return Ok(Decision::Skip {
            reason: "hostNetwork pods share the node's ports; the sidecar is not added",
            warn: true,
        });
    }
    // A static pod's mirror may not reference Secrets or ConfigMaps (NodeRestriction).
    if annotations.contains_key("kubernetes.io/config.mirror") {
        return Ok(Decision::Skip {
            reason: "a static pod's mirror",
            warn: false,
        });
    }
    let mut settings = Settings::from_annotations(config, annotations)?;
    check_ports(config, pod, annotations)?;
    // A pod that serves nothing (a CronJob that only calls out) gets no `init-net`: nothing of
    // its would be intercepted, and the init container would only cost it root and time. A
    // pod serves when a container declares a port, or it names its agent's port.
    let serves = annotations.contains_key(super::annotations::AGENT_PORT)
        || ["containers", "initContainers"].iter().any(|list| {
            pod.pointer(&format!("/spec/{list}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|c| {
                    c.get("ports")
                        .and_then(Value::as_array)
                        .is_some_and(|p| !p.is_empty())
                })
        });
    settings.intercept &= serves;
    if settings.intercept {
        check_one_interceptor(pod, annotations)?;
    }
    patch(config, pod, namespace, &settings).map(Decision::Inject)
}

/// Two sets of redirect rules in one pod fight over the same connections: the mesh's proxy would
/// take the agent's port first and our sidecar would only see the mesh's proxy as its client (or
/// the reverse), and both would count the work as theirs.
fn check_one_interceptor(
    pod: &Value,
    annotations: &Map<String, Value>,
) -> Result<(), AnnotationError> {
    let annotated = |key: &str, on: &str| annotations.get(key).and_then(Value::as_str) == Some(on);
    let mesh = if annotated("linkerd.io/inject", "enabled") {
        Some("Linkerd (linkerd.io/inject: enabled)")
    } else if annotated("sidecar.istio.io/inject", "true") {
        Some("Istio (sidecar.istio.io/inject: true)")
    } else if names(pod, "initContainers").any(|n| NETWORK_SETUP.contains(&n)) {
        Some("a mesh's init container (istio-init / linkerd-init)")
    } else {
        None
    };
    match mesh {
        Some(mesh) => Err(AnnotationError::TwoInterceptors { mesh }),
        None => Ok(()),
    }
}

/// The `init-net` init container: as root with NET_ADMIN and NET_RAW (iptables needs both), the
/// sidecar's image, done before the sidecar starts.
fn init_net(config: &InjectorConfig, settings: &Settings) -> Value {
    let mut command = vec![
        "agent-reach".to_owned(),
        "init-net".to_owned(),
        "--agent-ports".to_owned(),
        settings.agent_port.to_string(),
        "--inbound-port".to_owned(),
        config.inbound_port().to_string(),
        "--proxy-uid".to_owned(),
        config.intercept.proxy_uid.to_string(),
    ];
    if !settings.exclude_ports.is_empty() {
        command.push("--exclude-ports".to_owned());
        let ports: Vec<String> = settings.exclude_ports.iter().map(u16::to_string).collect();
        command.push(ports.join(","));
    }
    if !settings.exclude_cidrs.is_empty() {
        command.push("--exclude-cidrs".to_owned());
        command.push(settings.exclude_cidrs.join(","));
    }
    let mut init = json!({
        "name": INIT_NET,
        "command": command,
        // The same as the sidecar's (set by the chart): a Guaranteed pod stays Guaranteed and
        // a LimitRange finds them set.
        "resources": config.sidecar.get("resources").cloned().unwrap_or_else(|| json!({
            "requests": { "cpu": "50m", "memory": "32Mi" },
            "limits": { "cpu": "50m", "memory": "32Mi" },
        })),
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": false,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "seccompProfile": { "type": "RuntimeDefault" },
            "capabilities": { "add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"] },
        },
        // iptables takes its lock in /run: writable there, read-only everywhere else.
        "volumeMounts": [{ "name": INIT_NET_RUN, "mountPath": "/run" }],
    });
    for key in ["image", "imagePullPolicy"] {
        if let Some(value) = config.sidecar.get(key) {
            init[key] = value.clone();
        }
    }
    init
}

/// The sidecar's ports must be free in the pod: Linkerd's proxy, for one, uses the same defaults.
fn check_ports(
    config: &InjectorConfig,
    pod: &Value,
    annotations: &Map<String, Value>,
) -> Result<(), AnnotationError> {
    let ours = config.sidecar_ports();
    let defaults = [4140, 4143, 4191, 4190];
    if annotations.get("linkerd.io/inject").and_then(Value::as_str) == Some("enabled")
        && ours.iter().any(|p| defaults.contains(p))
    {
        return Err(AnnotationError::Linkerd);
    }
    for list in ["containers", "initContainers"] {
        for c in pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let declared = c
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|p| p.get("containerPort").and_then(Value::as_u64));
            for port in declared {
                if let Some(port) = ours.iter().find(|p| u64::from(**p) == port) {
                    return Err(AnnotationError::PortTaken {
                        container: c
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("?")
                            .to_owned(),
                        port: *port,
                        ports: join(ours),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The bootstrap a pod's sidecar starts from: the injector's shared part plus this agent, as
/// the text that goes in its environment and as the sidecar will read it.
pub(super) fn bootstrap_text(
    config: &InjectorConfig,
    settings: &Settings,
    namespace: &str,
) -> Result<(String, Bootstrap), String> {
    let mut bootstrap = config.bootstrap.clone();
    if let Some(seeds) = bootstrap
        .get_mut("gossip")
        .and_then(|g| g.get_mut("seeds"))
        .and_then(Value::as_array_mut)
    {
        for seed in seeds.iter_mut() {
            if let Some(text) = seed.as_str() {
                *seed = Value::String(text.replace("{namespace}", namespace));
            }
        }
    }
    let mut agent = Map::new();
    // No `name`: the sidecar takes the pod's name (POD_NAME) at start-up.
    agent.insert(
        "address".into(),
        json!(format!("127.0.0.1:{}", settings.agent_port)),
    );
    agent.insert("max_concurrency".into(), json!(settings.max_concurrency));
    if let Some(zone) = &settings.zone {
        agent.insert("zone".into(), json!(zone));
    }
    let capabilities: Vec<Value> = settings
        .capabilities
        .iter()
        .map(|name| match &settings.probe_path {
            Some(path) => json!({
                "name": name.as_str(),
                "probe": {
                    "method": "POST",
                    "path": path,
                    "body": "{}",
                    "headers": { "content-type": "application/json" },
                },
            }),
            None => json!({ "name": name.as_str() }),
        })
        .collect();
    agent.insert("capabilities".into(), Value::Array(capabilities));
    if settings.a2a {
        // The card's skills become capabilities; its defaults (the card's well-known path).
        agent.insert("a2a".into(), json!({}));
    }
    if let Some(path) = &settings.mcp {
        // The server's tools become entries of the `mcp` capability.
        agent.insert("mcp".into(), json!({ "path": path }));
    }
    bootstrap.insert("agent".into(), Value::Object(agent));
    if settings.intercept {
        // Beside `init-net`: the sidecar believes an original destination only for these ports.
        let listen = bootstrap
            .entry("listen")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(listen) = listen.as_object_mut() {
            listen.insert(
                "intercept".into(),
                json!({ "ports": [settings.agent_port] }),
            );
        }
    }
    if settings.mtls && config.mtls.is_some() {
        bootstrap.insert("tls".into(), mtls::bootstrap_tls());
    }
    if settings.tasks && config.tasks.enabled {
        bootstrap.insert("tasks".into(), tasks::bootstrap_tasks(&config.tasks));
    }
    let text = yaml::to_string(&Value::Object(bootstrap)).map_err(|e| e.to_string())?;
    let parsed = parse_bootstrap(Path::new("bootstrap"), &text).map_err(|e| e.to_string())?;
    Ok((text, parsed))
}

fn patch(
    config: &InjectorConfig,
    pod: &Value,
    namespace: &str,
    settings: &Settings,
) -> Result<Vec<Op>, AnnotationError> {
    let mut ops = Vec::new();
    let mut container = config.sidecar.clone();
    settings.sidecar.apply(&mut container);
    let mut volumes = config.volumes.clone();
    let mut env = vec![];
    match &settings.config_map {
        Some(name) => {
            env.push(json!({ "name": "AGENT_REACH_CONFIG", "value": format!("{BOOTSTRAP_DIR}/bootstrap.yaml") }));
            volumes.push(json!({ "name": BOOTSTRAP_VOLUME, "configMap": { "name": name } }));
            push(
                &mut container,
                "volumeMounts",
                json!({ "name": BOOTSTRAP_VOLUME, "mountPath": BOOTSTRAP_DIR, "readOnly": true }),
            );
        }
        None => {
            let text = bootstrap_text(config, settings, namespace)
                .map_err(AnnotationError::Bootstrap)?
                .0;
            env.push(json!({ "name": "AGENT_REACH_BOOTSTRAP", "value": text }));
        }
    }
    // The chart's own setting (sidecar.extraEnv), if any, wins.
    let has_env = |name: &str| {
        container
            .get("env")
            .and_then(Value::as_array)
            .is_some_and(|l| l.iter().any(|e| e.get("name") == Some(&json!(name))))
    };
    if !has_env(tasks::WORKLOAD_ENV) {
        if let Some(workload) = tasks::workload(pod) {
            env.push(json!({ "name": tasks::WORKLOAD_ENV, "value": workload }));
        }
    }
    if settings.intercept {
        volumes.push(
            json!({ "name": INIT_NET_RUN, "emptyDir": { "medium": "Memory", "sizeLimit": "1Mi" } }),
        );
    }
    // The agent's containers drain the sidecar before they are told to stop (`probes.rs`).
    let token: String = (0..16)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
    ops.extend(probes::drain_hooks(pod, config.admin_port(), &token));
    env.push(json!({ "name": probes::DRAIN_TOKEN_ENV, "value": token }));
    // Intercepted, the agent's port is the inbound listener's: the kubelet's probes of the
    // agent move to the admin port, which runs them against the agent (`probes.rs`). First in
    // the patch: they name containers by their index before the sidecar is added.
    if settings.intercept {
        let (moved, originals) = probes::rewrite(pod, config.admin_port());
        if !originals.is_empty() {
            let text = serde_json::to_string(&originals).unwrap_or_default();
            env.push(json!({ "name": probes::APP_PROBES_ENV, "value": text }));
        }
        ops.extend(moved);
    }
    for e in env {
        push(&mut container, "env", e);
    }
    if let Some(var) = tasks::store_env(&config.tasks).filter(|_| settings.tasks) {
        push(&mut container, "env", var);
    }
    if let Some(volume) = tasks::volume(&config.tasks).filter(|_| settings.tasks) {
        volumes.push(volume);
        push(&mut container, "volumeMounts", tasks::mount());
    }
    if let Some(source) = config.mtls.as_ref().filter(|_| settings.mtls) {
        volumes.push(mtls::volume(source, pod, namespace)?);
        push(&mut container, "volumeMounts", mtls::mount());
    }
    if settings.intercept {
        // The fixed UID the sidecar's traffic is told apart by (docs/kubernetes.md).
        if !container
            .get("securityContext")
            .is_some_and(Value::is_object)
        {
            container["securityContext"] = json!({});
        }
        container["securityContext"]["runAsUser"] = json!(config.intercept.proxy_uid);
    }
    let admin = config.admin_port();
    if config.native_sidecar {
        container["restartPolicy"] = json!("Always");
    } else {
        // A plain container: the agent starts once the sidecar is up (containers start in order
        // and a postStart hook holds the next one), and the sidecar stops a little after the
        // agent, so the agent's last calls still have a way out.
        let hooks = [
            (
                "postStart",
                json!({ "exec": { "command": ["agent-reach", "hook", "post-start", "--admin", format!("127.0.0.1:{admin}")] } }),
            ),
            (
                "preStop",
                json!({ "exec": { "command": ["agent-reach", "hook", "pre-stop", "--delay", "5s"] } }),
            ),
        ];
        if !container.get("lifecycle").is_some_and(Value::is_object) {
            container["lifecycle"] = json!({});
        }
        for (hook, action) in hooks {
            // The chart's own hooks, if it defines any, win.
            if container["lifecycle"].get(hook).is_none() {
                container["lifecycle"][hook] = action;
            }
        }
    }

    // Names the sidecar brings must be free in the pod.
    for v in &volumes {
        let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
        if names(pod, "volumes").any(|t| t == name) {
            return Err(AnnotationError::NameTaken {
                what: "volume",
                name: name.to_owned(),
            });
        }
    }

    let list = if config.native_sidecar {
        "initContainers"
    } else {
        "containers"
    };
    // With interception, `init-net` goes right in front of the sidecar (native: in the same
    // list; plain: first init container), so the agent's port is redirected from the agent's
    // first connection on.
    let init = settings.intercept.then(|| init_net(config, settings));
    let mut ahead: Vec<Value> = Vec::new();
    if let Some(init) = init {
        if config.native_sidecar {
            ahead.push(init);
        } else if pod
            .pointer("/spec/initContainers")
            .and_then(Value::as_array)
            .is_some()
        {
            ops.push(Op::add("/spec/initContainers/0".to_owned(), init));
        } else {
            ops.push(Op::add("/spec/initContainers".to_owned(), json!([init])));
        }
    }
    // First in its list: a native sidecar must be up before other init containers that may
    // call out; a plain one must start before the agent.
    match pod
        .pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
    {
        Some(existing) => {
            // After a mesh's network set-up (iptables) so the sidecar starts under the rules
            // it will run under; before everything else.
            let at = existing
                .iter()
                .rposition(|c| {
                    c.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| NETWORK_SETUP.contains(&n))
                })
                .map_or(0, |i| i + 1);
            for (i, c) in ahead.into_iter().chain([container]).enumerate() {
                ops.push(Op::add(format!("/spec/{list}/{}", at + i), c));
            }
        }
        None => {
            ahead.push(container);
            ops.push(Op::add(format!("/spec/{list}"), Value::Array(ahead)));
        }
    }
    if pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .is_some()
    {
        for v in volumes {
            ops.push(Op::add("/spec/volumes/-".to_owned(), v));
        }
    } else if !volumes.is_empty() {
        ops.push(Op::add("/spec/volumes".to_owned(), Value::Array(volumes)));
    }
    let grace = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_u64);
    let wanted = u64::from(config.termination_grace_seconds);
    match grace {
        None => ops.push(Op::add(
            "/spec/terminationGracePeriodSeconds".to_owned(),
            json!(wanted),
        )),
        Some(g) if g < wanted => ops.push(Op::replace(
            "/spec/terminationGracePeriodSeconds".to_owned(),
            json!(wanted),
        )),
        Some(_) => {}
    }

    let mut labels = vec![(INJECTED_LABEL.to_owned(), json!("true"))];
    if let Some(release) = &config.release {
        labels.push((RELEASE_LABEL.to_owned(), json!(release)));
    }
    labels.retain(|(k, _)| {
        pod.pointer(&format!("/metadata/labels/{}", escape(k)))
            .is_none()
    });
    add_entries(&mut ops, pod, "labels", labels);
    let has_annotation = |k: &str| {
        pod.pointer(&format!("/metadata/annotations/{}", escape(k)))
            .is_some()
    };
    let mut annotations = vec![(STATUS.to_owned(), json!("injected"))];
    if let Some(prom) = &config.prometheus {
        // A pod that set its own scraping keeps it, key by key.
        for (key, value) in [
            ("prometheus.io/scrape", "true".to_owned()),
            ("prometheus.io/port", prom.port.to_string()),
            ("prometheus.io/path", prom.path.clone()),
        ] {
            if !has_annotation(key) {
                annotations.push((key.to_owned(), json!(value)));
            }
        }
    }
    // `kubectl logs` and `exec` keep defaulting to the agent when the sidecar comes first.
    if !config.native_sidecar && !has_annotation(DEFAULT_CONTAINER) {
        if let Some(first) = pod
            .pointer("/spec/containers/0/name")
            .and_then(Value::as_str)
        {
            annotations.push((DEFAULT_CONTAINER.to_owned(), json!(first)));
        }
    }
    add_entries(&mut ops, pod, "annotations", annotations);
    Ok(ops)
}

/// Adds keys to `metadata.labels` / `metadata.annotations`, creating the map if the pod has none.
fn add_entries(ops: &mut Vec<Op>, pod: &Value, map: &str, entries: Vec<(String, Value)>) {
    if entries.is_empty() {
        return;
    }
    if pod
        .pointer(&format!("/metadata/{map}"))
        .and_then(Value::as_object)
        .is_some()
    {
        for (k, v) in entries {
            ops.push(Op::add(format!("/metadata/{map}/{}", escape(&k)), v));
        }
    } else {
        let object: Map<String, Value> = entries.into_iter().collect();
        let path = if pod.get("metadata").is_some_and(Value::is_object) {
            format!("/metadata/{map}")
        } else {
            // A pod always has metadata once admitted; a bare manifest might not.
            ops.push(Op::add("/metadata".to_owned(), json!({})));
            format!("/metadata/{map}")
        };
        ops.push(Op::add(path, Value::Object(object)));
    }
}

/// The `name`s of the items of `spec.<list>` (containers, volumes, …).
fn names<'p>(pod: &'p Value, list: &str) -> impl Iterator<Item = &'p str> {
    pod.pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| item.get("name").and_then(Value::as_str))
}

fn push(container: &mut Value, key: &str, item: Value) {
    match container.get_mut(key).and_then(Value::as_array_mut) {
        Some(list) => list.push(item),
        None => container[key] = json!([item]),
    }
}
