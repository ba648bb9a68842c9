//! Unit tests across the injector's pieces: the shipped `injector.yaml` with an `mtls` section,
//! a pod decided and patched, and the pod JSON as the API server would store it.

use std::path::Path;

use serde_json::{json, Value};

use super::annotations::{AnnotationError, A2A, MCP, MTLS, TASKS};
use super::config::InjectorConfig;
use super::mtls::{TLS_DIR, TLS_VOLUME};
use super::overrides::{
    LOG_LEVEL, PROXY_CPU_LIMIT, PROXY_CPU_REQUEST, PROXY_MEMORY_LIMIT, PROXY_MEMORY_REQUEST,
};
use super::patch::apply;
use super::pod::{decide, Decision, OptIn};
use super::tasks::{TASKS_DIR, TASKS_VOLUME, WORKLOAD_ENV};
use crate::config::{parse_bootstrap, yaml};

const SHIPPED: &str = include_str!("../../config/injector.yaml");

/// What the chart renders with mtls.source=csi.
const CSI: &str = r#"
mtls:
  volume:
    csi:
      driver: spiffe.csi.cert-manager.io
      readOnly: true
      volumeAttributes: { spiffe.csi.cert-manager.io/fs-group: "65532" }
"#;

/// What the chart renders with mtls.source=certificate.
const CERTIFICATE: &str = r#"
mtls:
  volume:
    secret: { secretName: "agent-reach-mtls-{service_account}" }
  service_accounts: ["agents/coder", "agents/writer"]
"#;

fn config(extra: &str) -> InjectorConfig {
    config_from(&format!("{SHIPPED}{extra}"), extra)
}

/// The shipped file with its `intercept` section replaced by `section`.
fn with_intercept(section: &str) -> InjectorConfig {
    let start = SHIPPED.find("\nintercept:").map_or(0, |i| i + 1);
    let end = SHIPPED.find("\nsidecar:").map_or(SHIPPED.len(), |i| i + 1);
    let text = format!("{}{section}{}", &SHIPPED[..start], &SHIPPED[end..]);
    config_from(&text, section)
}

fn config_from(text: &str, extra: &str) -> InjectorConfig {
    match InjectorConfig::parse(Path::new("injector.yaml"), text) {
        Ok(c) => c,
        Err(err) => panic!("injector.yaml with {extra}: {err}"),
    }
}

fn new_pod(annotations: Value, service_account: Option<&str>) -> Value {
    let mut pod = json!({
        "metadata": { "name": "coder-0", "annotations": annotations },
        "spec": { "containers": [{ "name": "agent", "image": "agent:1",
            "ports": [{ "name": "http", "containerPort": 8080 }] }] },
    });
    if let Some(sa) = service_account {
        pod["spec"]["serviceAccountName"] = json!(sa);
    }
    pod
}

fn enabled() -> Value {
    json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/capabilities": "code-review" })
}

/// The pod after the webhook's patch.
fn injected(config: &InjectorConfig, pod: &Value) -> Result<Value, AnnotationError> {
    let mut pod = pod.clone();
    match decide(config, &pod, "agents", OptIn::Annotation)? {
        Decision::Inject(ops) => {
            if let Err(err) = apply(&mut pod, &ops) {
                panic!("patch: {err}");
            }
            Ok(pod)
        }
        Decision::Skip { reason, .. } => panic!("skipped: {reason}"),
    }
}

fn sidecar(pod: &Value) -> &Value {
    &pod["spec"]["initContainers"][0]
}

fn tls_volume(pod: &Value) -> Option<&Value> {
    pod["spec"]["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == TLS_VOLUME)
}

fn tls_mount(pod: &Value) -> Option<&Value> {
    sidecar(pod)["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == TLS_VOLUME)
}

/// The sidecar's bootstrap, from its environment, as YAML and as the sidecar parses it.
fn bootstrap(pod: &Value) -> Value {
    let env = sidecar(pod)["env"].as_array().cloned().unwrap_or_default();
    let text = env
        .iter()
        .find(|e| e["name"] == "AGENT_REACH_BOOTSTRAP")
        .and_then(|e| e["value"].as_str())
        .unwrap_or_default()
        .to_owned();
    if let Err(err) = parse_bootstrap(Path::new("bootstrap"), &text) {
        panic!("the injected bootstrap does not parse: {err}\n{text}");
    }
    yaml::from_str(&text).unwrap_or(Value::Null)
}

#[test]
fn csi_source_mounts_the_driver_volume_read_only_and_names_the_files_in_the_bootstrap() {
    let config = config(CSI);
    let pod = match injected(&config, &new_pod(enabled(), Some("coder"))) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(
        tls_volume(&pod),
        Some(&json!({
            "name": TLS_VOLUME,
            "csi": {
                "driver": "spiffe.csi.cert-manager.io",
                "readOnly": true,
                "volumeAttributes": { "spiffe.csi.cert-manager.io/fs-group": "65532" },
            },
        }))
    );
    assert_eq!(
        tls_mount(&pod),
        Some(&json!({ "name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": true }))
    );
    assert_eq!(
        bootstrap(&pod)["tls"],
        json!({
            "cert": "/var/run/agent-reach/tls/tls.crt",
            "key": "/var/run/agent-reach/tls/tls.key",
            "ca": "/var/run/agent-reach/tls/ca.crt",
        })
    );
    // No privilege for it: the sidecar's securityContext is the chart's, untouched.
    assert_eq!(
        sidecar(&pod)["securityContext"],
        config.sidecar["securityContext"]
    );
    assert_eq!(
        sidecar(&pod)["securityContext"]["capabilities"],
        json!({ "drop": ["ALL"] })
    );
    // The agent's own container sees none of it.
    assert_eq!(pod["spec"]["containers"][0].get("volumeMounts"), None);
}

#[test]
fn certificate_source_mounts_the_service_accounts_secret_and_refuses_an_unlisted_one() {
    let config = config(CERTIFICATE);
    let pod = match injected(&config, &new_pod(enabled(), Some("writer"))) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(
        tls_volume(&pod),
        Some(&json!({ "name": TLS_VOLUME, "secret": { "secretName": "agent-reach-mtls-writer" } }))
    );
    assert!(tls_mount(&pod).is_some());
    assert_eq!(
        bootstrap(&pod)["tls"]["cert"],
        json!("/var/run/agent-reach/tls/tls.crt")
    );

    // No serviceAccountName: `default`, which has no certificate here.
    let err = injected(&config, &new_pod(enabled(), None)).err();
    assert!(
        matches!(&err, Some(AnnotationError::NoCertificate { account, .. }) if account == "agents/default"),
        "{err:?}"
    );
}

#[test]
fn a_pod_can_opt_out_and_cannot_opt_in_where_the_injector_has_no_certificates() {
    let mut annotations = enabled();
    annotations[MTLS] = json!("disabled");
    let with = config(CERTIFICATE);
    // Opted out, an unlisted service account is no reason to refuse the pod.
    let pod = match injected(&with, &new_pod(annotations.clone(), Some("intern"))) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(tls_volume(&pod), None);
    assert_eq!(tls_mount(&pod), None);
    assert_eq!(bootstrap(&pod).get("tls"), None);

    let without = config("");
    annotations[MTLS] = json!("enabled");
    let err = injected(&without, &new_pod(annotations.clone(), None))
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("the chart's mtls.enabled")),
        "{err:?}"
    );
    annotations[MTLS] = json!("sometimes");
    assert!(injected(&with, &new_pod(annotations, Some("coder"))).is_err());
}

#[test]
fn without_mtls_a_pod_gets_no_certificate_volume_and_no_tls() {
    let config = config("");
    let pod = match injected(&config, &new_pod(enabled(), Some("coder"))) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(tls_volume(&pod), None);
    assert_eq!(tls_mount(&pod), None);
    assert_eq!(bootstrap(&pod).get("tls"), None);
}

#[test]
fn a_pod_with_a_volume_of_the_same_name_is_denied() {
    let config = config(CSI);
    let mut taken = new_pod(enabled(), Some("coder"));
    taken["spec"]["volumes"] = json!([{ "name": TLS_VOLUME, "emptyDir": {} }]);
    assert_eq!(
        injected(&config, &taken).err(),
        Some(AnnotationError::NameTaken {
            what: "volume",
            name: TLS_VOLUME.to_owned()
        })
    );
}

#[test]
fn mtls_mistakes_in_the_injectors_file_fail_at_load() {
    let path = Path::new("injector.yaml");
    let error = |extra: &str| {
        InjectorConfig::parse(path, &format!("{SHIPPED}{extra}"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(error("mtls:\n  volume: { name: x, csi: { driver: d } }\n").contains("without `name`"));
    assert!(error("mtls:\n  volume: {}\n").contains("mtls.volume"));
    assert!(error(&CERTIFICATE.replace("agents/writer", "writer")).contains("not namespace/name"));
    let with_tls = SHIPPED.replace(
        "bootstrap:                             # each pod's bootstrap; annotations fill `agent`\n",
        "bootstrap:\n  tls: { cert: a, key: b, ca: c }\n",
    );
    let err = InjectorConfig::parse(path, &format!("{with_tls}{CSI}"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("must not have `tls` beside `mtls`"), "{err}");
}

/// The shipped file with its `tasks` section replaced by `section`.
fn with_tasks(section: &str) -> String {
    let start = SHIPPED.find("\ntasks:").map_or(0, |i| i + 1);
    let end = SHIPPED
        .find("\nbootstrap:")
        .map_or(SHIPPED.len(), |i| i + 1);
    format!("{}{section}{}", &SHIPPED[..start], &SHIPPED[end..])
}

fn parsed(text: &str) -> Result<InjectorConfig, String> {
    InjectorConfig::parse(Path::new("injector.yaml"), text).map_err(|e| e.to_string())
}

fn tasks_volume(pod: &Value) -> Option<&Value> {
    pod["spec"]["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == TASKS_VOLUME)
}

fn env_value<'p>(pod: &'p Value, name: &str) -> Option<&'p str> {
    sidecar(pod)["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
}

#[test]
fn by_default_a_pod_keeps_its_tasks_on_an_empty_dir_named_for_its_workload() {
    let config = config("");
    let mut pod = new_pod(enabled(), None);
    pod["metadata"]["labels"] = json!({ "app": "coder" });
    let pod = match injected(&config, &pod) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(
        bootstrap(&pod)["tasks"],
        json!({ "path": format!("{TASKS_DIR}/tasks.db") })
    );
    assert_eq!(
        tasks_volume(&pod),
        Some(&json!({ "name": TASKS_VOLUME, "emptyDir": { "sizeLimit": "1Gi" } }))
    );
    let mounts = sidecar(&pod)["volumeMounts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(mounts.contains(&json!({ "name": TASKS_VOLUME, "mountPath": TASKS_DIR })));
    assert_eq!(env_value(&pod, WORKLOAD_ENV), Some("coder"));
}

#[test]
fn a_pod_can_opt_out_of_tasks_and_a_redis_store_needs_no_volume() {
    let mut annotations = enabled();
    annotations[TASKS] = json!("disabled");
    let pod = match injected(&config(""), &new_pod(annotations.clone(), None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(bootstrap(&pod).get("tasks"), None);
    assert_eq!(tasks_volume(&pod), None);
    annotations[TASKS] = json!("later");
    assert!(injected(&config(""), &new_pod(annotations.clone(), None)).is_err());

    let redis = match parsed(&with_tasks(
        "tasks: { store: \"redis://redis.agents:6379/0\" }\n",
    )) {
        Ok(c) => c,
        Err(err) => panic!("{err}"),
    };
    let pod = match injected(&redis, &new_pod(enabled(), None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(
        bootstrap(&pod)["tasks"],
        json!({ "store": "redis://redis.agents:6379/0" })
    );
    assert_eq!(tasks_volume(&pod), None);

    // From a Secret: the pod's spec names the Secret, never the URL and its password.
    let secret = match parsed(&with_tasks(
        "tasks: { store_secret: { name: redis-url, key: url } }\n",
    )) {
        Ok(c) => c,
        Err(err) => panic!("{err}"),
    };
    let pod = match injected(&secret, &new_pod(enabled(), None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(
        bootstrap(&pod)["tasks"],
        json!({ "store_from_env": "AGENT_REACH_TASKS_STORE" })
    );
    let sidecar = pod["spec"]["initContainers"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == "agent-reach"))
        .cloned()
        .unwrap_or_default();
    let env = sidecar["env"].as_array().cloned().unwrap_or_default();
    let var = env
        .iter()
        .find(|e| e["name"] == "AGENT_REACH_TASKS_STORE")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        var["valueFrom"]["secretKeyRef"],
        json!({ "name": "redis-url", "key": "url" })
    );
    assert!(!pod.to_string().contains("redis://"), "no URL in the spec");
    assert_eq!(tasks_volume(&pod), None);

    let off = match parsed(&with_tasks("tasks: { enabled: false }\n")) {
        Ok(c) => c,
        Err(err) => panic!("{err}"),
    };
    let pod = match injected(&off, &new_pod(enabled(), None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(bootstrap(&pod).get("tasks"), None);
    annotations[TASKS] = json!("enabled");
    let err = injected(&off, &new_pod(annotations, None))
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("the chart's tasks.enabled")),
        "{err:?}"
    );
}

#[test]
fn tasks_mistakes_in_the_injectors_file_fail_at_load() {
    let err = |section: &str| parsed(&with_tasks(section)).err().unwrap_or_default();
    assert!(err("tasks: { store: \"http://redis:6379\" }\n").contains("tasks.store"));
    assert!(err("tasks: { size_limit: lots }\n").contains("tasks.size_limit"));
    assert!(
        err("tasks: { store: \"redis://:p$$w@redis:6379\" }\n").contains("must not contain `$`")
    );
    assert!(err("tasks: { sizeLimit: 1Gi }\n").contains("sizeLimit"));
    let with_tasks_in_bootstrap = SHIPPED.replace(
        "bootstrap:                             # each pod's bootstrap; annotations fill `agent`\n",
        "bootstrap:\n  tasks: { path: /tmp/t.db }\n",
    );
    assert!(parsed(&with_tasks_in_bootstrap)
        .err()
        .unwrap_or_default()
        .contains("must not have `tasks`"));
    // Off, the bootstrap's own `tasks` is each pod's as written.
    assert!(
        parsed(&with_tasks_in_bootstrap.replace("  enabled: true\n", "  enabled: false\n")).is_ok()
    );
}

fn intercepting() -> Value {
    let mut annotations = enabled();
    annotations["agent-reach.io/intercept"] = json!("inbound");
    annotations
}

#[test]
fn an_intercepted_pod_gets_init_net_before_the_sidecar_which_runs_as_the_fixed_uid() {
    let config = config("");
    let pod = match injected(&config, &new_pod(intercepting(), None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    let init = &pod["spec"]["initContainers"][0];
    assert_eq!(init["name"], super::pod::INIT_NET);
    assert_eq!(
        init["command"],
        json!([
            "agent-reach",
            "init-net",
            "--agent-ports",
            "8080",
            "--inbound-port",
            "4143",
            "--proxy-uid",
            "2102"
        ])
    );
    assert_eq!(init["securityContext"]["runAsUser"], 0);
    assert_eq!(init["securityContext"]["runAsNonRoot"], false);
    assert_eq!(
        init["securityContext"]["capabilities"]["add"],
        json!(["NET_ADMIN", "NET_RAW"])
    );
    assert_eq!(init["image"], config.sidecar["image"]);
    let sidecar = &pod["spec"]["initContainers"][1];
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(sidecar["securityContext"]["runAsUser"], 2102);
}

#[test]
fn a_plain_sidecar_pod_gets_init_net_as_its_first_init_container() {
    let mut config = with_intercept("intercept: { default: true, proxy_uid: 3000 }\n");
    config.native_sidecar = false;
    let mut pod = new_pod(enabled(), None);
    pod["spec"]["initContainers"] = json!([{ "name": "migrate", "image": "m:1" }]);
    let pod = match injected(&config, &pod) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(
        pod["spec"]["initContainers"][0]["name"],
        super::pod::INIT_NET
    );
    assert_eq!(pod["spec"]["initContainers"][1]["name"], "migrate");
    assert_eq!(
        pod["spec"]["containers"][0]["securityContext"]["runAsUser"],
        3000
    );
}

#[test]
fn interception_is_off_by_default_and_can_be_turned_off_per_pod() {
    let plain = match injected(&config(""), &new_pod(enabled(), None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_ne!(sidecar(&plain)["name"], super::pod::INIT_NET);
    let mut off = enabled();
    off["agent-reach.io/intercept"] = json!("disabled");
    let config = with_intercept("intercept: { default: true }\n");
    let pod = match injected(&config, &new_pod(off, None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_ne!(sidecar(&pod)["name"], super::pod::INIT_NET);
}

#[test]
fn interception_beside_a_mesh_or_with_a_bad_value_is_denied() {
    let config = config("");
    let mut bad = enabled();
    bad["agent-reach.io/intercept"] = json!("outbound");
    let err = injected(&config, &new_pod(bad, None))
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("is not `inbound` or `disabled`")));
    let mut istio = intercepting();
    istio["sidecar.istio.io/inject"] = json!("true");
    let err = injected(&config, &new_pod(istio, None)).err();
    assert!(
        matches!(err, Some(AnnotationError::TwoInterceptors { .. })),
        "{err:?}"
    );
}

#[test]
fn init_net_is_hardened_only_where_a_port_is_served_and_takes_exclusions() {
    let config = config("");
    let mut annotations = intercepting();
    annotations["agent-reach.io/intercept-exclude-ports"] = json!("9090, 9091");
    annotations["agent-reach.io/intercept-exclude-cidrs"] = json!("10.96.0.0/12");
    let pod = injected(&config, &new_pod(annotations.clone(), None)).unwrap_or_default();
    let init = &pod["spec"]["initContainers"][0];
    assert_eq!(init["name"], super::pod::INIT_NET);
    let command: Vec<&str> = init["command"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        command
            .windows(2)
            .any(|w| w == ["--exclude-ports", "9090,9091"]),
        "{command:?}"
    );
    assert!(command
        .windows(2)
        .any(|w| w == ["--exclude-cidrs", "10.96.0.0/12"]));
    let security = &init["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    assert!(init["resources"]["limits"]["memory"].is_string(), "{init}");
    assert_eq!(init["volumeMounts"][0]["mountPath"], "/run");
    // A pod that serves nothing (a CronJob that only calls): no init-net.
    let mut caller = new_pod(annotations.clone(), None);
    caller["spec"]["containers"][0]
        .as_object_mut()
        .map(|c| c.remove("ports"));
    let pod = injected(&config, &caller).unwrap_or_default();
    let names: Vec<&str> = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(!names.contains(&super::pod::INIT_NET), "{names:?}");
    // A bad exclusion is denied, naming it.
    annotations["agent-reach.io/intercept-exclude-cidrs"] = json!("10.0.0.0/99");
    let err = injected(&config, &new_pod(annotations, None))
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("intercept-exclude-cidrs")));
}

#[test]
fn the_a2a_annotation_asks_for_card_import_and_is_checked() {
    let config = config("");
    let mut annotations = enabled();
    annotations[A2A] = json!("enabled");
    let pod = match injected(&config, &new_pod(annotations.clone(), None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(bootstrap(&pod)["agent"]["a2a"], json!({}));
    // Without it, no card import.
    let plain = injected(&config, &new_pod(enabled(), None)).unwrap_or_default();
    assert_eq!(bootstrap(&plain)["agent"].get("a2a"), None);
    annotations[A2A] = json!("yes");
    assert!(matches!(
        injected(&config, &new_pod(annotations, None)),
        Err(AnnotationError::Invalid { key: A2A, .. })
    ));
}

#[test]
fn resource_and_log_level_annotations_override_the_charts_sidecar() {
    let config = config("");
    let mut annotations = enabled();
    annotations[PROXY_CPU_REQUEST] = json!("250m");
    annotations[PROXY_CPU_LIMIT] = json!("1");
    annotations[PROXY_MEMORY_LIMIT] = json!("512Mi");
    annotations[LOG_LEVEL] = json!("info,agent_reach::gossip=debug");
    let pod = match injected(&config, &new_pod(annotations, None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(
        sidecar(&pod)["resources"],
        // The request of memory is the chart's (config/injector.yaml): only what is annotated moves.
        json!({ "requests": { "cpu": "250m", "memory": "32Mi" }, "limits": { "cpu": "1", "memory": "512Mi" } })
    );
    assert_eq!(
        env_value(&pod, "AGENT_REACH_LOG"),
        Some("info,agent_reach::gossip=debug")
    );
    let logs = sidecar(&pod)["env"].as_array().map_or(0, |env| {
        env.iter()
            .filter(|e| e["name"] == "AGENT_REACH_LOG")
            .count()
    });
    assert_eq!(logs, 1, "the chart's entry is replaced, not doubled");
    // Beside a whole bootstrap (agent-reach.io/config) they still apply.
    let mut whole =
        json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/config": "coder-bootstrap" });
    whole[LOG_LEVEL] = json!("debug");
    let pod = injected(&config, &new_pod(whole, None)).unwrap_or_default();
    assert_eq!(env_value(&pod, "AGENT_REACH_LOG"), Some("debug"));
}

#[test]
fn bad_quantities_and_a_request_above_its_limit_are_denied_naming_the_annotation() {
    let config = config("");
    let denial = |key: &str, value: &str| {
        let mut annotations = enabled();
        annotations[key] = json!(value);
        injected(&config, &new_pod(annotations, None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    for (key, value) in [
        (PROXY_CPU_REQUEST, "-1"),
        (PROXY_CPU_LIMIT, "lots"),
        (PROXY_MEMORY_REQUEST, "128MB"),
        (PROXY_MEMORY_LIMIT, "1 Gi"),
        (LOG_LEVEL, "verbose"),
    ] {
        let message = denial(key, value);
        assert!(
            message.contains(key) && message.contains(value),
            "{key}: {value}: {message}"
        );
    }
    assert!(denial(PROXY_CPU_REQUEST, "-1").contains("is negative"));
    // The chart's memory limit is 128Mi (config/injector.yaml).
    let above = denial(PROXY_MEMORY_REQUEST, "256Mi");
    assert!(
        above.contains(PROXY_MEMORY_REQUEST)
            && above.contains("above the sidecar's memory limit `128Mi`"),
        "{above}"
    );
    // Its memory request is 32Mi: a limit below it names the limit.
    let below = denial(PROXY_MEMORY_LIMIT, "16Mi");
    assert!(
        below.contains(PROXY_MEMORY_LIMIT) && below.contains("request `32Mi`"),
        "{below}"
    );
    let mut both = enabled();
    both[PROXY_CPU_REQUEST] = json!("2");
    both[PROXY_CPU_LIMIT] = json!("500m");
    let err = injected(&config, &new_pod(both, None)).err();
    assert!(
        matches!(
            &err,
            Some(AnnotationError::Invalid {
                key: PROXY_CPU_REQUEST,
                ..
            })
        ),
        "{err:?}"
    );
    // Equal is fine, in any notation.
    let mut equal = enabled();
    equal[PROXY_CPU_REQUEST] = json!("0.5");
    equal[PROXY_CPU_LIMIT] = json!("500m");
    assert!(injected(&config, &new_pod(equal, None)).is_ok());
}

#[test]
fn the_mcp_annotation_asks_for_tool_import_and_is_checked() {
    let config = config("");
    let mut annotations = enabled();
    annotations[MCP] = json!("enabled");
    let pod = match injected(&config, &new_pod(annotations.clone(), None)) {
        Ok(p) => p,
        Err(err) => panic!("denied: {err}"),
    };
    assert_eq!(bootstrap(&pod)["agent"]["mcp"], json!({ "path": "/mcp" }));
    annotations[MCP] = json!("/v1/mcp");
    let pod = injected(&config, &new_pod(annotations.clone(), None)).unwrap_or_default();
    assert_eq!(bootstrap(&pod)["agent"]["mcp"]["path"], "/v1/mcp");
    let plain = injected(&config, &new_pod(enabled(), None)).unwrap_or_default();
    assert_eq!(bootstrap(&plain)["agent"].get("mcp"), None);
    annotations[MCP] = json!("yes");
    assert!(matches!(
        injected(&config, &new_pod(annotations, None)),
        Err(AnnotationError::Invalid { key: MCP, .. })
    ));
}
