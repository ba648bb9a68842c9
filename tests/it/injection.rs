//! The injection webhook, black-box: real AdmissionReview JSON over HTTPS to the webhook server
//! on 127.0.0.1, the JSON patch it answers with applied as the API server would, and the
//! injected sidecar's config checked by the binary.

use crate::support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

use agent_reach::config::yaml;
use agent_reach::inject::patch::Op;
use agent_reach::inject::{apply, Injector, InjectorConfig};
use support::eventually;

const BIN: &str = env!("CARGO_BIN_EXE_agent-reach");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/inject")
        .join(name)
}

/// `agent-reach inject --config config/injector.yaml --file <file>` with `extra` arguments.
fn inject_file(file: &Path, extra: &[&str]) -> std::process::Output {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/injector.yaml");
    let out = std::process::Command::new(BIN)
        .arg("inject")
        .args(extra)
        .arg("--config")
        .arg(&config)
        .arg("--file")
        .arg(file)
        .output();
    match out {
        Ok(o) => o,
        Err(err) => panic!("run inject: {err}"),
    }
}

fn read_json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name)).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// A self-signed certificate for `localhost`, written where the injector reads it.
struct Cert {
    der: CertificateDer<'static>,
}

fn write_cert(dir: &Path) -> Cert {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]);
    let generated = match generated {
        Ok(g) => g,
        Err(err) => panic!("rcgen: {err}"),
    };
    std::fs::write(dir.join("tls.crt"), generated.cert.pem()).unwrap_or_default();
    std::fs::write(dir.join("tls.key"), generated.key_pair.serialize_pem()).unwrap_or_default();
    Cert {
        der: generated.cert.der().clone(),
    }
}

struct Webhook {
    injector: Injector,
    ca: CertificateDer<'static>,
    dir: tempdir::Dir,
}

mod tempdir {
    /// A directory removed when dropped.
    pub(crate) struct Dir(pub(crate) std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    pub(crate) fn new(tag: &str) -> Dir {
        let path = std::env::temp_dir().join(format!(
            "agent-reach-inject-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::create_dir_all(&path);
        Dir(path)
    }
}

/// The shipped example config (`config/injector.yaml`, the chart's defaults), listening on a
/// free loopback port with a fresh certificate.
fn config(dir: &Path, tune: impl FnOnce(&mut InjectorConfig)) -> InjectorConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/injector.yaml");
    let mut config = match InjectorConfig::load(&path) {
        Ok(c) => c,
        Err(err) => panic!("config/injector.yaml: {err}"),
    };
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.tls.cert_file = dir.join("tls.crt");
    config.tls.key_file = dir.join("tls.key");
    tune(&mut config);
    config
}

async fn webhook(tag: &str, tune: impl FnOnce(&mut InjectorConfig)) -> Webhook {
    let dir = tempdir::new(tag);
    let cert = write_cert(&dir.0);
    let config = config(&dir.0, tune);
    let injector = match Injector::start(config).await {
        Ok(i) => i,
        Err(err) => panic!("injector: {err}"),
    };
    Webhook {
        injector,
        ca: cert.der,
        dir,
    }
}

/// A TLS client trusting only `ca`; returns the server's leaf certificate too.
async fn tls_connect(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
) -> std::io::Result<(
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    Vec<u8>,
)> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(ca.clone())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name =
        ServerName::try_from("localhost").map_err(|e| std::io::Error::other(e.to_string()))?;
    let tls = connector.connect(name, tcp).await?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    Ok((tls, leaf))
}

struct Reply {
    status: u16,
    reason: String,
    body: Value,
}

async fn post(hook: &Webhook, path: &str, body: Vec<u8>) -> Reply {
    let (tls, _) = match tls_connect(hook.injector.addr, &hook.ca).await {
        Ok(t) => t,
        Err(err) => panic!("TLS connect: {err}"),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tls)).await {
        Ok(s) => s,
        Err(err) => panic!("handshake: {err}"),
    };
    tokio::spawn(conn);
    let request = hyper::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)));
    let response = match request {
        Ok(r) => sender.send_request(r).await,
        Err(err) => panic!("request: {err}"),
    };
    let response = match response {
        Ok(r) => r,
        Err(err) => panic!("send: {err}"),
    };
    let status = response.status().as_u16();
    let reason = response
        .headers()
        .get("reach-reason")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Reply {
        status,
        reason,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// An AdmissionReview for creating `pod` in namespace `agents`.
fn review(pod: &Value) -> Vec<u8> {
    let mut review = read_json("review.json");
    review["request"]["object"] = pod.clone();
    serde_json::to_vec(&review).unwrap_or_default()
}

fn pod(annotations: Value) -> Value {
    let mut pod = read_json("pod.json");
    pod["metadata"]["annotations"] = annotations;
    pod
}

/// The patch in a response, decoded.
fn patch_of(reply: &Reply) -> Option<Vec<Value>> {
    let encoded = reply.body.pointer("/response/patch")?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn ops(patch: &[Value]) -> Vec<Op> {
    patch
        .iter()
        .map(|o| {
            let op = if o["op"] == "replace" {
                "replace"
            } else {
                "add"
            };
            Op {
                op,
                path: o["path"].as_str().unwrap_or_default().to_owned(),
                value: o["value"].clone(),
            }
        })
        .collect()
}

fn annotated() -> Value {
    pod(json!({
        "agent-reach.io/inject": "enabled",
        "agent-reach.io/capabilities": "code-review, summarize",
        "agent-reach.io/agent-port": "9000",
        "agent-reach.io/max-concurrency": "6",
        "agent-reach.io/zone": "eu-west-1a",
        "agent-reach.io/probe-path": "/review",
    }))
}

#[tokio::test]
async fn an_annotated_pod_gets_a_native_sidecar_with_env_probes_and_mounts() {
    let hook = webhook("annotated", |_| {}).await;
    let reply = post(&hook, "/inject", review(&annotated())).await;
    assert_eq!(reply.status, 200);
    let response = &reply.body["response"];
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = patch_of(&reply).unwrap_or_default();
    // The drain token is made anew for each pod: masked, and the same in the hook and the env.
    let text = serde_json::to_string(&patch).unwrap_or_default();
    let token = text
        .split("\"AGENT_REACH_DRAIN_TOKEN\",\"value\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("none")
        .to_owned();
    assert_eq!(token.len(), 32, "{text}");
    assert_eq!(
        text.matches(token.as_str()).count(),
        2,
        "hook and env carry one token"
    );
    let patch: Vec<Value> =
        serde_json::from_str(&text.replace(token.as_str(), "<token>")).unwrap_or_default();

    // The exact patch, reviewed and checked in.
    let expected = read_json("annotated.patch.json");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let text = serde_json::to_string_pretty(&patch).unwrap_or_default();
        let _ = std::fs::write(fixture("annotated.patch.json"), text + "\n");
    } else {
        assert_eq!(
            Value::Array(patch.clone()),
            expected,
            "the patch changed; if on purpose, rerun with UPDATE_GOLDEN=1 and review the diff"
        );
    }

    // What the API server makes of it.
    let mut pod = annotated();
    assert_eq!(apply(&mut pod, &ops(&patch)), Ok(()));
    let sidecar = &pod["spec"]["initContainers"][0];
    assert_eq!(sidecar["name"], "agent-reach");
    assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
    assert_eq!(
        pod["spec"]["initContainers"][1]["name"], "migrate",
        "the pod's own init container runs after it"
    );
    assert_eq!(pod["spec"]["containers"].as_array().map(Vec::len), Some(1));
    let env: Vec<&str> = sidecar["env"]
        .as_array()
        .map(|e| e.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        env,
        [
            "POD_NAME",
            "POD_NAMESPACE",
            "POD_IP",
            "AGENT_REACH_POLICY",
            "AGENT_REACH_LOG",
            "AGENT_REACH_BOOTSTRAP",
            "AGENT_REACH_WORKLOAD",
            "AGENT_REACH_DRAIN_TOKEN"
        ]
    );
    // The agent drains its sidecar before it is told to stop.
    let pre_stop = &pod["spec"]["containers"][0]["lifecycle"]["preStop"]["httpGet"];
    assert_eq!(pre_stop["path"], "/drain");
    assert_eq!(pre_stop["httpHeaders"][0]["value"], "<token>");
    // The pod's `app` label: its replicas share a Redis task queue under it.
    assert_eq!(sidecar["env"][6]["value"], "coder");
    assert_eq!(
        sidecar["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(sidecar["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(sidecar["livenessProbe"]["httpGet"]["path"], "/live");
    assert_eq!(sidecar["startupProbe"]["httpGet"]["port"], "reach-admin");
    let mounts: Vec<&str> = sidecar["volumeMounts"]
        .as_array()
        .map(|m| m.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        mounts,
        [
            "agent-reach-policy",
            "agent-reach-gossip-key",
            "agent-reach-tasks"
        ]
    );
    let volumes: Vec<&str> = pod["spec"]["volumes"]
        .as_array()
        .map(|m| m.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        volumes,
        [
            "cache",
            "agent-reach-policy",
            "agent-reach-gossip-key",
            "agent-reach-tasks"
        ]
    );
    // The embedded task store: kept across container restarts, which an emptyDir outlives.
    assert_eq!(
        pod["spec"]["volumes"][3]["emptyDir"],
        json!({ "sizeLimit": "1Gi" })
    );
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 45);
    assert_eq!(pod["metadata"]["labels"]["agent-reach.io/injected"], "true");
    assert_eq!(pod["metadata"]["labels"]["app"], "coder");
    assert_eq!(
        pod["metadata"]["annotations"]["agent-reach.io/status"],
        "injected"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    assert_eq!(pod["metadata"]["annotations"]["prometheus.io/port"], "4191");

    // The sidecar's bootstrap, as the binary's `check` sees it.
    let bootstrap = sidecar["env"][5]["value"].as_str().unwrap_or_default();
    for line in [
        "address: 127.0.0.1:9000",
        "max_concurrency: 6",
        "zone: eu-west-1a",
        "- name: code-review",
        "- name: summarize",
        "path: /review",
        "- agent-reach-gossip.agents.svc.cluster.local:4190",
        "path: /var/lib/agent-reach/tasks/tasks.db",
    ] {
        assert!(
            bootstrap.contains(line),
            "`{line}` missing from:\n{bootstrap}"
        );
    }
    let file = hook.dir.0.join("bootstrap.yaml");
    let _ = std::fs::write(&file, bootstrap);
    let out = std::process::Command::new(BIN)
        .arg("check")
        .arg(&file)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(err) => panic!("run check: {err}"),
    };
    assert!(
        out.status.success(),
        "check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ok (bootstrap; tasks in /var/lib/agent-reach/tasks/tasks.db)"),
        "{stdout}"
    );
    hook.injector.shutdown().await;
}

#[tokio::test]
async fn a_pod_without_the_annotation_or_already_injected_is_left_alone() {
    let hook = webhook("alone", |_| {}).await;
    // No annotation at all, and opted out.
    for annotations in [json!({}), json!({ "agent-reach.io/inject": "disabled" })] {
        let reply = post(&hook, "/inject", review(&pod(annotations))).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body["response"]["allowed"], true);
        assert_eq!(reply.body["response"].get("patch"), None);
        assert_eq!(reply.body["response"].get("patchType"), None);
    }
    // Reinvocation: the injected pod comes back through the webhook and gets nothing twice.
    let first = post(&hook, "/inject", review(&annotated())).await;
    let mut injected = annotated();
    assert_eq!(
        apply(&mut injected, &ops(&patch_of(&first).unwrap_or_default())),
        Ok(())
    );
    let again = post(&hook, "/inject", review(&injected)).await;
    assert_eq!(again.body["response"]["allowed"], true);
    assert_eq!(again.body["response"].get("patch"), None);
    // A pod that already runs a container named like the sidecar (injected by hand) too.
    let mut by_hand = annotated();
    if let Some(list) = by_hand["spec"]["containers"].as_array_mut() {
        list.push(json!({ "name": "agent-reach", "image": "x" }));
    }
    let reply = post(&hook, "/inject", review(&by_hand)).await;
    assert_eq!(reply.body["response"].get("patch"), None);
    hook.injector.shutdown().await;
}

#[tokio::test]
async fn bad_annotations_are_denied_with_a_message_that_names_the_problem() {
    let hook = webhook("denied", |_| {}).await;
    let cases = [
        (
            json!({ "agent-reach.io/inject": "yes" }),
            "agent-reach: annotation agent-reach.io/inject: `yes` is not `enabled` or `disabled`",
        ),
        (
            json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/agent-port": "80000" }),
            "agent-reach: annotation agent-reach.io/agent-port: `80000` is not a port (1-65535)",
        ),
        (
            json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/agent-port": "4143" }),
            "agent-reach: annotation agent-reach.io/agent-port: `4143` is one of the sidecar's own ports (4140, 4143, 4191, 4190)",
        ),
        (
            json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/capabilities": "code_review" }),
            "agent-reach: annotation agent-reach.io/capabilities: `code_review` is not a capability name: use 1-63 lowercase letters, digits and `-`, not starting or ending with `-`",
        ),
        (
            json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/max-concurrency": "0" }),
            "agent-reach: annotation agent-reach.io/max-concurrency: `0` is not a whole number from 1 to 100000",
        ),
        (
            json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/probe-path": "review" }),
            "agent-reach: annotation agent-reach.io/probe-path: `review` is not a request path starting with `/`",
        ),
        (
            json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/capabilites": "x" }),
            "agent-reach: annotation agent-reach.io/capabilites is not one agent-reach reads (known: agent-reach.io/inject, agent-reach.io/status, agent-reach.io/intercept-exclude-ports, agent-reach.io/intercept-exclude-cidrs, agent-reach.io/agent-port, agent-reach.io/capabilities, agent-reach.io/config, agent-reach.io/max-concurrency, agent-reach.io/zone, agent-reach.io/probe-path, agent-reach.io/mtls, agent-reach.io/tasks, agent-reach.io/intercept, agent-reach.io/a2a, agent-reach.io/mcp, agent-reach.io/proxy-cpu-request, agent-reach.io/proxy-cpu-limit, agent-reach.io/proxy-memory-request, agent-reach.io/proxy-memory-limit, agent-reach.io/log-level)",
        ),
        (
            json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/config": "coder-bootstrap", "agent-reach.io/zone": "a" }),
            "agent-reach: annotation agent-reach.io/config names a whole bootstrap; agent-reach.io/zone cannot be set beside it",
        ),
    ];
    for (annotations, message) in cases {
        let reply = post(&hook, "/inject", review(&pod(annotations.clone()))).await;
        assert_eq!(reply.status, 200, "{annotations}");
        let response = &reply.body["response"];
        assert_eq!(response["allowed"], false, "{annotations}");
        assert_eq!(response["status"]["code"], 400);
        assert_eq!(response["status"]["message"], message, "{annotations}");
        assert_eq!(response.get("patch"), None);
    }
    // `$` would be expanded by the kubelet in the sidecar's environment.
    let reply = post(
        &hook,
        "/inject",
        review(&pod(json!({ "agent-reach.io/inject": "enabled", "agent-reach.io/probe-path": "/p$(POD_IP)" }))),
    )
    .await;
    assert_eq!(
        reply.body["response"]["status"]["message"],
        "agent-reach: annotation agent-reach.io/probe-path: `/p$(POD_IP)` contains `$`, which the kubelet would expand in the sidecar's environment"
    );
    // A container already listening on one of the sidecar's ports (Linkerd's proxy uses the
    // same defaults), and a pod Linkerd injects too.
    let mut taken = annotated();
    taken["spec"]["containers"][0]["ports"][0]["containerPort"] = json!(4191);
    let reply = post(&hook, "/inject", review(&taken)).await;
    assert_eq!(
        reply.body["response"]["status"]["message"],
        "agent-reach: container `coder` declares port 4191, which the sidecar listens on (4140, 4143, 4191, 4190); a pod meshed by Linkerd too needs the chart's sidecar.ports changed"
    );
    let mut linkerd = annotated();
    linkerd["metadata"]["annotations"]["linkerd.io/inject"] = json!("enabled");
    let reply = post(&hook, "/inject", review(&linkerd)).await;
    assert_eq!(reply.body["response"]["allowed"], false);
    assert!(reply.body["response"]["status"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("also injected by Linkerd")));
    // A pod whose own volume takes a name the sidecar needs.
    let mut clash = annotated();
    clash["spec"]["volumes"][0]["name"] = json!("agent-reach-policy");
    let reply = post(&hook, "/inject", review(&clash)).await;
    assert_eq!(
        reply.body["response"]["status"]["message"],
        "agent-reach: the pod already has a volume named `agent-reach-policy`, which the sidecar needs"
    );
    hook.injector.shutdown().await;
}

#[tokio::test]
async fn per_pod_resources_and_log_level_land_in_the_sidecar_and_bad_values_are_denied() {
    let hook = webhook("overrides", |_| {}).await;
    let mut pod = annotated();
    for (key, value) in [
        ("agent-reach.io/proxy-cpu-request", "100m"),
        ("agent-reach.io/proxy-cpu-limit", "2"),
        ("agent-reach.io/proxy-memory-request", "64Mi"),
        ("agent-reach.io/proxy-memory-limit", "1Gi"),
        ("agent-reach.io/log-level", "debug"),
    ] {
        pod["metadata"]["annotations"][key] = json!(value);
    }
    let reply = post(&hook, "/inject", review(&pod)).await;
    assert_eq!(reply.body["response"]["allowed"], true, "{}", reply.body);
    let patch = patch_of(&reply).unwrap_or_default();
    assert_eq!(apply(&mut pod, &ops(&patch)), Ok(()));
    let sidecar = &pod["spec"]["initContainers"][0];
    assert_eq!(
        sidecar["resources"],
        json!({ "requests": { "cpu": "100m", "memory": "64Mi" }, "limits": { "cpu": "2", "memory": "1Gi" } })
    );
    let log: Vec<&Value> = sidecar["env"]
        .as_array()
        .map(|env| {
            env.iter()
                .filter(|e| e["name"] == "AGENT_REACH_LOG")
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        log,
        [&json!({ "name": "AGENT_REACH_LOG", "value": "debug" })]
    );

    let cases = [
        (
            "agent-reach.io/proxy-cpu-request",
            "-250m",
            "agent-reach: annotation agent-reach.io/proxy-cpu-request: `-250m` is negative",
        ),
        (
            "agent-reach.io/proxy-memory-limit",
            "1GB",
            "agent-reach: annotation agent-reach.io/proxy-memory-limit: `1GB` is not a Kubernetes quantity (e.g. `500m`, `0.5`, `2` for CPU; `128Mi`, `1G`, `1e9` for memory)",
        ),
        (
            "agent-reach.io/proxy-memory-request",
            "1Gi",
            "agent-reach: annotation agent-reach.io/proxy-memory-request: `1Gi` is above the sidecar's memory limit `128Mi` (the chart's sidecar.resources)",
        ),
        (
            "agent-reach.io/log-level",
            "loud",
            "agent-reach: annotation agent-reach.io/log-level: `loud` is not a log level (trace, debug, info, warn, error, off) or a list of `target=level` directives such as `info,agent_reach::gossip=debug`",
        ),
    ];
    for (key, value, message) in cases {
        let mut bad = annotated();
        bad["metadata"]["annotations"][key] = json!(value);
        let reply = post(&hook, "/inject", review(&bad)).await;
        let response = &reply.body["response"];
        assert_eq!(response["allowed"], false, "{key}: {value}");
        assert_eq!(response["status"]["message"], message);
        assert_eq!(response.get("patch"), None);
    }
    hook.injector.shutdown().await;
}

#[tokio::test]
async fn a_namespace_that_opted_in_gets_every_pod_but_those_that_opt_out() {
    let hook = webhook("namespace", |_| {}).await;
    let plain = post(&hook, "/inject-namespace", review(&pod(json!({})))).await;
    let patch = patch_of(&plain).unwrap_or_default();
    assert!(!patch.is_empty(), "{:?}", plain.body);
    let mut pod_ = pod(json!({}));
    assert_eq!(apply(&mut pod_, &ops(&patch)), Ok(()));
    // No capability annotation: a caller-only agent, with the defaults.
    let bootstrap = pod_["spec"]["initContainers"][0]["env"][5]["value"]
        .as_str()
        .unwrap_or_default();
    assert!(bootstrap.contains("address: 127.0.0.1:8080"), "{bootstrap}");
    assert!(bootstrap.contains("capabilities: []"), "{bootstrap}");
    let out = post(
        &hook,
        "/inject-namespace",
        review(&pod(json!({ "agent-reach.io/inject": "disabled" }))),
    )
    .await;
    assert_eq!(out.body["response"].get("patch"), None);
    hook.injector.shutdown().await;
}

#[tokio::test]
async fn old_clusters_get_a_plain_first_container_that_starts_first_and_stops_last() {
    let hook = webhook("plain", |c| c.native_sidecar = false).await;
    let mut pod_ = annotated();
    pod_["spec"]["terminationGracePeriodSeconds"] = json!(120);
    let reply = post(&hook, "/inject", review(&pod_)).await;
    assert_eq!(
        apply(&mut pod_, &ops(&patch_of(&reply).unwrap_or_default())),
        Ok(())
    );
    let sidecar = &pod_["spec"]["containers"][0];
    assert_eq!(sidecar["name"], "agent-reach");
    assert_eq!(sidecar.get("restartPolicy"), None);
    assert_eq!(
        sidecar["lifecycle"]["postStart"]["exec"]["command"],
        json!([
            "agent-reach",
            "hook",
            "post-start",
            "--admin",
            "127.0.0.1:4191"
        ])
    );
    assert_eq!(
        sidecar["lifecycle"]["preStop"]["exec"]["command"],
        json!(["agent-reach", "hook", "pre-stop", "--delay", "5s"])
    );
    assert_eq!(pod_["spec"]["containers"][1]["name"], "coder");
    assert_eq!(
        pod_["spec"]["initContainers"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(
        pod_["spec"]["terminationGracePeriodSeconds"], 120,
        "a longer grace stays"
    );
    assert_eq!(
        pod_["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"], "coder",
        "kubectl logs and exec still default to the agent"
    );
    hook.injector.shutdown().await;
}

#[tokio::test]
async fn malformed_reviews_get_a_400_with_reach_reason_and_the_server_keeps_serving() {
    let hook = webhook("malformed", |_| {}).await;
    for body in [
        b"not json".to_vec(),
        br#"{"kind":"Pod"}"#.to_vec(),
        br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1beta1","request":{"uid":"x"}}"#.to_vec(),
        br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#.to_vec(),
    ] {
        let reply = post(&hook, "/inject", body).await;
        assert_eq!(reply.status, 400);
        assert_eq!(reply.reason, "bad_request");
        assert_eq!(reply.body["error"], "bad_request");
    }
    // A pod object with no spec: denied, not a crash.
    let reply = post(&hook, "/inject", review(&json!({ "metadata": {} }))).await;
    assert_eq!(reply.body["response"]["allowed"], false);
    // Other kinds and operations pass untouched.
    let mut update = read_json("review.json");
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["object"] = annotated();
    let reply = post(
        &hook,
        "/inject",
        serde_json::to_vec(&update).unwrap_or_default(),
    )
    .await;
    assert_eq!(reply.body["response"]["allowed"], true);
    assert_eq!(reply.body["response"].get("patch"), None);
    let reply = post(&hook, "/nope", Vec::new()).await;
    assert_eq!((reply.status, reply.reason.as_str()), (404, "not_found"));
    // Still serving, and the counts show it all.
    let reply = post(&hook, "/inject", review(&annotated())).await;
    assert!(patch_of(&reply).is_some());
    hook.injector.shutdown().await;
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let hook = webhook("renew", |c| {
        c.tls.reload_interval = agent_reach::config::HumanDuration::from_millis(50);
    })
    .await;
    let (_, first) = match tls_connect(hook.injector.addr, &hook.ca).await {
        Ok(t) => t,
        Err(err) => panic!("connect: {err}"),
    };
    assert_eq!(first, hook.ca.to_vec());
    // A broken pair mid-rotation is not swapped in: the old certificate keeps serving.
    let _ = std::fs::write(hook.dir.0.join("tls.key"), "not a key");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(tls_connect(hook.injector.addr, &hook.ca).await.is_ok());
    let renewed = write_cert(&hook.dir.0);
    let addr = hook.injector.addr;
    eventually(Duration::from_secs(5), "the renewed certificate is served", || {
        let renewed = renewed.der.clone();
        async move {
            matches!(tls_connect(addr, &renewed).await, Ok((_, leaf)) if leaf == renewed.to_vec())
        }
    })
    .await;
    hook.injector.shutdown().await;
}

#[test]
fn the_binary_injects_a_manifest_file_and_refuses_a_bad_one() {
    let dir = tempdir::new("cli");
    let manifest = dir.0.join("app.yaml");
    let pod = annotated();
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "coder", "namespace": "agents" },
        "spec": { "selector": { "matchLabels": { "app": "coder" } }, "template": pod },
    });
    let service = json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "coder" }, "spec": { "ports": [{ "port": 80 }] } });
    let text = format!(
        "{}---\n{}",
        yaml::to_string(&deployment).unwrap_or_default(),
        yaml::to_string(&service).unwrap_or_default()
    );
    let _ = std::fs::write(&manifest, text);
    let out = inject_file(&manifest, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<Value> = stdout
        .split("---\n")
        .filter_map(|d| yaml::from_str(d).ok())
        .collect();
    assert_eq!(docs.len(), 2);
    assert_eq!(
        docs[0]["spec"]["template"]["spec"]["initContainers"][0]["name"],
        "agent-reach"
    );
    assert_eq!(docs[1]["kind"], "Service");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 pod template(s) injected"));

    let bad = dir.0.join("bad.yaml");
    let _ = std::fs::write(
        &bad,
        "kind: Pod\nmetadata:\n  name: p\n  annotations: { agent-reach.io/inject: enabled, agent-reach.io/max-concurrency: lots }\nspec: { containers: [] }\n",
    );
    let out = inject_file(&bad, &[]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("document 1 (Pod p): annotation agent-reach.io/max-concurrency: `lots` is not a whole number"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The sidecar an injected pod runs: the binary started with nothing but the env the patch gave
/// it (listeners moved to free loopback ports, the key mount to a temp file), named after its pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_injected_sidecar_starts_from_its_env_and_takes_the_pods_name() {
    use std::io::{BufRead, BufReader};
    let hook = webhook("run", |_| {}).await;
    let reply = post(&hook, "/inject", review(&annotated())).await;
    let mut pod_ = annotated();
    assert_eq!(
        apply(&mut pod_, &ops(&patch_of(&reply).unwrap_or_default())),
        Ok(())
    );
    hook.injector.shutdown().await;
    let env = &pod_["spec"]["initContainers"][0]["env"];
    let value = |name: &str| {
        env.as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == name))
            .and_then(|v| v["value"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let key = hook.dir.0.join("gossip.key");
    let _ = std::fs::write(&key, "0123456789abcdef0123456789abcdef0123456789abcdef\n");
    // Only what a pod would differ in: its own network namespace has the ports free.
    let bootstrap = value("AGENT_REACH_BOOTSTRAP")
        .replace("127.0.0.1:4140", "127.0.0.1:0")
        .replace("0.0.0.0:4143", "127.0.0.1:0")
        .replace("0.0.0.0:4191", "127.0.0.1:0")
        .replace("0.0.0.0:4190", "127.0.0.1:0")
        .replace(
            "/var/run/agent-reach/gossip/key",
            &key.display().to_string(),
        );
    let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/policy.yaml");
    assert_eq!(
        value("AGENT_REACH_POLICY"),
        "/etc/agent-reach/policy/policy.yaml"
    );
    let child = std::process::Command::new(BIN)
        .arg("run")
        .env_remove("AGENT_REACH_CONFIG")
        .env("AGENT_REACH_BOOTSTRAP", bootstrap)
        .env("AGENT_REACH_POLICY", &policy)
        .env("POD_NAME", "coder-7d9f8b6c5-x2x9z")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(err) => panic!("spawn: {err}"),
    };
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = child.stderr.take();
    let _guard = Kill(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Some(stderr) = stderr {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        }
    });
    let admin = loop {
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) => l,
            Err(_) => panic!("the sidecar did not log its start"),
        };
        if let Some(start) = line.find("admin=") {
            if let Some(addr) = line[start + 6..]
                .split_whitespace()
                .next()
                .and_then(|a| a.parse::<SocketAddr>().ok())
            {
                break addr;
            }
        }
    };
    let status = support::get(&support::client(), &format!("http://{admin}/status")).await;
    assert_eq!(status.status, 200);
    let status = status.json();
    assert_eq!(status["agent"]["name"], "coder-7d9f8b6c5-x2x9z");
    assert_eq!(status["agent"]["address"], "127.0.0.1:9000");
    assert_eq!(status["agent"]["zone"], "eu-west-1a");
    assert_eq!(status["agent"]["capabilities"][1]["name"], "summarize");
    assert!(
        status["gossip"].is_object(),
        "gossip is on: {}",
        status["gossip"]
    );
}

/// The chart generates RSA keys in PKCS#1 (`BEGIN RSA PRIVATE KEY`, Helm's genSignedCert);
/// cert-manager writes ECDSA in PKCS#8 (the other tests). Both must serve.
#[tokio::test]
async fn an_rsa_pkcs1_key_as_helm_generates_it_serves() {
    let dir = tempdir::new("rsa");
    for file in ["rsa-pkcs1.crt", "rsa-pkcs1.key"] {
        let _ = std::fs::copy(fixture(file), dir.0.join(file));
    }
    let config = config(&dir.0, |c| {
        c.tls.cert_file = dir.0.join("rsa-pkcs1.crt");
        c.tls.key_file = dir.0.join("rsa-pkcs1.key");
    });
    let injector = match Injector::start(config).await {
        Ok(i) => i,
        Err(err) => panic!("injector with an RSA PKCS#1 key: {err}"),
    };
    let pem = std::fs::read(fixture("rsa-pkcs1.crt")).unwrap_or_default();
    let ca = {
        use rustls::pki_types::pem::PemObject;
        match CertificateDer::from_pem_slice(&pem) {
            Ok(c) => c,
            Err(err) => panic!("fixture: {err:?}"),
        }
    };
    let served = tls_connect(injector.addr, &ca).await;
    assert!(
        matches!(&served, Ok((_, leaf)) if *leaf == ca.to_vec()),
        "{:?}",
        served.err()
    );
    injector.shutdown().await;
}

#[test]
fn a_key_that_does_not_match_its_certificate_is_refused_at_start() {
    let dir = tempdir::new("mismatch");
    write_cert(&dir.0);
    let _ = std::fs::copy(fixture("rsa-pkcs1.key"), dir.0.join("tls.key"));
    let err = agent_reach::transport::certs::load_certified_key(
        &dir.0.join("tls.crt"),
        &dir.0.join("tls.key"),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("does not match the certificate"), "{err}");
}

#[tokio::test]
async fn the_sidecar_goes_after_a_meshs_network_setup_and_keeps_the_pods_own_scrape_settings() {
    let hook = webhook("mesh", |_| {}).await;
    let mut pod_ = annotated();
    pod_["spec"]["initContainers"] = json!([
        { "name": "istio-init", "image": "istio/proxyv2" },
        { "name": "migrate", "image": "python:3.12-slim" },
    ]);
    pod_["metadata"]["annotations"]["prometheus.io/path"] = json!("/custom");
    let reply = post(&hook, "/inject", review(&pod_)).await;
    assert_eq!(
        apply(&mut pod_, &ops(&patch_of(&reply).unwrap_or_default())),
        Ok(())
    );
    let names: Vec<&str> = pod_["spec"]["initContainers"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["istio-init", "agent-reach", "migrate"]);
    let annotations = &pod_["metadata"]["annotations"];
    assert_eq!(
        annotations["prometheus.io/path"], "/custom",
        "the pod's own setting stays"
    );
    assert_eq!(annotations["prometheus.io/port"], "4191");
    // A static pod's mirror is left alone (it may not mount Secrets).
    let mut mirror = annotated();
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("abc");
    let reply = post(&hook, "/inject", review(&mirror)).await;
    assert_eq!(reply.body["response"].get("patch"), None);
    hook.injector.shutdown().await;
}

#[tokio::test]
async fn an_oversized_or_non_review_body_is_refused_before_it_is_built_in_memory() {
    let hook = webhook("oversized", |_| {}).await;
    // 4 MiB of `[0,0,0,…]`: over the 3 MiB limit.
    let mut body = b"[".to_vec();
    body.extend(std::iter::repeat_n(b"0,".as_slice(), 2 << 20).flatten());
    body.extend(b"0]");
    let reply = post(&hook, "/inject", body).await;
    assert_eq!((reply.status, reply.reason.as_str()), (400, "bad_request"));
    // Under the limit but not a review: refused at its first token.
    let mut small = b"[".to_vec();
    small.extend(std::iter::repeat_n(b"0,".as_slice(), 1 << 20).flatten());
    small.extend(b"0]");
    let reply = post(&hook, "/inject", small).await;
    assert_eq!(reply.status, 400);
    assert!(reply.body["message"]
        .as_str()
        .is_some_and(|m| m.contains("not an admission.k8s.io/v1 AdmissionReview")));
    hook.injector.shutdown().await;
}

#[test]
fn manual_injection_takes_the_namespace_and_treats_nulls_as_missing() {
    let dir = tempdir::new("nulls");
    let manifest = dir.0.join("pod.yaml");
    let _ = std::fs::write(
        &manifest,
        "kind: Pod\nmetadata:\n  name: p\n  labels: null\n  annotations: { agent-reach.io/inject: enabled }\nspec:\n  initContainers: null\n  volumes: null\n  containers: [ { name: a, image: x } ]\n",
    );
    let out = inject_file(&manifest, &["-n", "team-a"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pod: Value = yaml::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(pod["spec"]["initContainers"][0]["name"], "agent-reach");
    // Policy, gossip key and the task store's emptyDir.
    assert_eq!(pod["spec"]["volumes"].as_array().map(Vec::len), Some(3));
    assert_eq!(pod["metadata"]["labels"]["agent-reach.io/injected"], "true");
    let text = serde_json::to_string(&pod).unwrap_or_default();
    assert!(
        text.contains("agent-reach-gossip.team-a.svc.cluster.local:4190"),
        "{text}"
    );
}

#[test]
fn a_pod_name_that_is_not_a_dns_label_becomes_one_that_stays_unique() {
    use agent_reach::config::Name;
    assert_eq!(
        Name::sanitized("coder-7d9f8-x2x9z", "agent").as_str(),
        "coder-7d9f8-x2x9z"
    );
    let (dotted, dashed) = (
        Name::sanitized("a.b", "agent"),
        Name::sanitized("a-b", "agent"),
    );
    assert_ne!(dotted, dashed, "a.b and a-b stay apart");
    assert!(dotted.as_str().starts_with("a-b-"), "{dotted}");
    let long = "x".repeat(80);
    let (one, two) = (
        Name::sanitized(&format!("{long}-1"), "agent"),
        Name::sanitized(&format!("{long}-2"), "agent"),
    );
    assert_ne!(one, two);
    assert!(one.as_str().len() <= 63);
    assert_eq!(Name::sanitized("...", "agent").as_str(), "agent");
}

/// The plain-container hooks: post-start waits for the sidecar's `/live` (and gives up with a
/// message), pre-stop holds the signal back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lifecycle_hooks_wait_for_live_and_hold_the_stop() {
    let agent = support::mock(testkit::MockConfig::new("coder-1")).await;
    let bootstrap = match agent_reach::Bootstrap::local("coder-1", agent.addr, &[support::CAP]) {
        Ok(b) => b,
        Err(err) => panic!("{err}"),
    };
    let sidecar = support::sidecar(bootstrap).await;
    let admin = sidecar.addrs.admin.to_string();
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let out = std::process::Command::new(BIN).args(&args).output();
            (out, started.elapsed())
        })
    };
    let (out, _) = run(vec![
        "hook".into(),
        "post-start".into(),
        "--admin".into(),
        admin,
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.is_ok_and(|o| o.status.success()),
        "post-start against a live sidecar"
    );
    let closed = support::any_port().to_string();
    let (out, took) = run(vec![
        "hook".into(),
        "post-start".into(),
        "--admin".into(),
        closed.clone(),
        "--timeout".into(),
        "300ms".into(),
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let out = out.unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains(&format!("did not answer http://{closed}/live within 300ms")));
    assert!(took < Duration::from_secs(10));
    let (out, took) = run(vec![
        "hook".into(),
        "pre-stop".into(),
        "--delay".into(),
        "200ms".into(),
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.is_ok_and(|o| o.status.success()));
    assert!(
        took >= Duration::from_millis(200),
        "held the stop for {took:?}"
    );
    sidecar.shutdown().await;
}

/// Opens a review that sends its head, with `await_continue` waits for the server to start
/// reading its body (`100 Continue`: the server polled it), then trickles a byte every 200 ms.
async fn slow_review(hook: &Webhook, await_continue: bool) -> tokio::task::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut tls, _) = match tls_connect(hook.injector.addr, &hook.ca).await {
        Ok(t) => t,
        Err(err) => panic!("TLS connect: {err}"),
    };
    let head = "POST /inject HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
                content-length: 100000\r\nexpect: 100-continue\r\n\r\n";
    if let Err(err) = tls.write_all(head.as_bytes()).await {
        panic!("write head: {err}");
    }
    let mut seen = Vec::new();
    let continued = tokio::time::timeout(Duration::from_secs(5), async {
        if !await_continue {
            return true;
        }
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains("100 Continue") {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        true
    })
    .await;
    assert_eq!(
        continued.ok(),
        Some(true),
        "the server starts reading the slow body"
    );
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tick.tick().await;
            if tls.write_all(b" ").await.is_err() {
                return;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_do_not_hold_up_other_reviews() {
    let hook = webhook("slow-bodies", |_| {}).await;
    // As many trickling clients as the injector parses reviews at once (4), each seen to be
    // in the server's hands, and two more.
    let mut slow = Vec::new();
    for i in 0..6 {
        slow.push(slow_review(&hook, i < 4).await);
    }
    // The slow ones run into the 10 s request timeout; an honest review is answered long before.
    let started = std::time::Instant::now();
    let reply = tokio::time::timeout(
        Duration::from_secs(3),
        post(&hook, "/inject", review(&annotated())),
    )
    .await;
    let reply = match reply {
        Ok(r) => r,
        Err(_) => panic!(
            "a review behind slow bodies was not answered within 3 s ({:?})",
            started.elapsed()
        ),
    };
    assert_eq!(reply.status, 200);
    assert!(patch_of(&reply).is_some(), "{:?}", reply.body);
    // The slow clients are still trickling: the review did not wait for them to give up.
    assert!(slow.iter().all(|t| !t.is_finished()));
    for task in slow {
        task.abort();
    }
    hook.injector.shutdown().await;
}
