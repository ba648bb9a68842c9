//! The agent containers' kubelet probes under interception: each HTTP, TCP and gRPC probe is
//! moved to the sidecar's admin port (`GET /app-health/<container>/<kind>`), and the original
//! goes to the sidecar (`AGENT_REACH_APP_PROBES`), which runs it against the agent on loopback
//! (`src/admin/app_probe.rs`). Without this, the kubelet's probe of the agent's port would be
//! intercepted and judged as a call: refused under strict mTLS, `503 saturated` when the agent
//! is busy. An `exec` probe, and an HTTPS one (the sidecar does not speak TLS to its agent),
//! stay as they are.

use serde_json::{json, Map, Value};

use super::patch::Op;
use crate::config::{AppProbe, AppProbes};
pub(super) use crate::config::{APP_PROBES_ENV, DRAIN_TOKEN_ENV};

const KINDS: [(&str, &str); 3] = [
    ("livenessProbe", "livez"),
    ("readinessProbe", "readyz"),
    ("startupProbe", "startupz"),
];

/// The patch that moves the pod's probes to the admin port `admin`, and the originals the
/// sidecar runs. The ops name containers by their index before the sidecar is added.
pub(super) fn rewrite(pod: &Value, admin: u16) -> (Vec<Op>, AppProbes) {
    let mut ops = Vec::new();
    let mut probes = AppProbes::new();
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for (i, container) in containers.enumerate() {
        let name = container.get("name").and_then(Value::as_str).unwrap_or("");
        for (field, kind) in KINDS {
            let Some(probe) = container.get(field).and_then(Value::as_object) else {
                continue;
            };
            let Some(original) = original(container, probe) else {
                continue;
            };
            let mut moved: Map<String, Value> = probe
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "httpGet" | "tcpSocket" | "grpc"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            moved.insert(
                "httpGet".into(),
                json!({ "path": format!("/app-health/{name}/{kind}"), "port": admin, "scheme": "HTTP" }),
            );
            ops.push(Op::replace(
                format!("/spec/containers/{i}/{field}"),
                Value::Object(moved),
            ));
            probes.insert(format!("{name}/{kind}"), original);
        }
    }
    (ops, probes)
}

/// The `preStop` hooks that drain the sidecar before each agent container is told to stop: the
/// kubelet runs a container's `preStop` before it sends SIGTERM, so from that moment no new call
/// is admitted and the fleet hears the agent is draining, while calls in flight finish (`GET
/// /drain` on the admin port, with the pod's `token`). A container with a `preStop` of its own
/// keeps it.
pub(super) fn drain_hooks(pod: &Value, admin: u16, token: &str) -> Vec<Op> {
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let hook = json!({ "httpGet": { "path": "/drain", "port": admin, "scheme": "HTTP",
        "httpHeaders": [{ "name": crate::config::DRAIN_HEADER, "value": token }] } });
    let mut ops = Vec::new();
    for (i, container) in containers.enumerate() {
        match container.get("lifecycle") {
            Some(l) if l.get("preStop").is_some() => {}
            Some(l) if l.is_object() => ops.push(Op::add(
                format!("/spec/containers/{i}/lifecycle/preStop"),
                hook.clone(),
            )),
            _ => ops.push(Op::add(
                format!("/spec/containers/{i}/lifecycle"),
                json!({ "preStop": hook.clone() }),
            )),
        }
    }
    ops
}

/// What `probe` of `container` asks, as the sidecar will run it; `None` for an exec or HTTPS
/// probe, or a port that names none of the container's.
fn original(container: &Value, probe: &Map<String, Value>) -> Option<AppProbe> {
    let timeout_ms = probe
        .get("timeoutSeconds")
        .and_then(Value::as_u64)
        .map(|s| s.saturating_mul(1000));
    if let Some(get) = probe.get("httpGet") {
        if get
            .get("scheme")
            .and_then(Value::as_str)
            .is_some_and(|s| s.eq_ignore_ascii_case("https"))
        {
            return None;
        }
        let headers = get
            .get("httpHeaders")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|h| {
                Some((
                    h.get("name")?.as_str()?.to_owned(),
                    h.get("value")?.as_str()?.to_owned(),
                ))
            })
            .collect();
        return Some(AppProbe::Http {
            port: port(container, get.get("port")?)?,
            path: get
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("/")
                .to_owned(),
            headers,
            timeout_ms,
        });
    }
    if let Some(tcp) = probe.get("tcpSocket") {
        return Some(AppProbe::Tcp {
            port: port(container, tcp.get("port")?)?,
            timeout_ms,
        });
    }
    let grpc = probe.get("grpc")?;
    Some(AppProbe::Grpc {
        port: port(container, grpc.get("port")?)?,
        service: grpc
            .get("service")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        timeout_ms,
    })
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port(container: &Value, port: &Value) -> Option<u16> {
    if let Some(n) = port.as_u64() {
        return u16::try_from(n).ok();
    }
    let name = port.as_str()?;
    if let Ok(n) = name.parse::<u16>() {
        return Some(n);
    }
    container
        .get("ports")
        .and_then(Value::as_array)?
        .iter()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|p| p.get("containerPort")?.as_u64())
        .and_then(|n| u16::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_tcp_and_grpc_probes_move_to_the_admin_port_and_exec_and_https_stay() {
        let pod = json!({ "spec": { "containers": [{
            "name": "agent",
            "ports": [{ "name": "http", "containerPort": 8080 }],
            "livenessProbe": { "httpGet": { "path": "/healthz", "port": "http",
                "httpHeaders": [{ "name": "x-probe", "value": "1" }] }, "periodSeconds": 5, "timeoutSeconds": 2 },
            "readinessProbe": { "tcpSocket": { "port": 8080 } },
            "startupProbe": { "grpc": { "port": 9090, "service": "agent" } }
        }, {
            "name": "tool",
            "livenessProbe": { "exec": { "command": ["true"] } },
            "readinessProbe": { "httpGet": { "path": "/", "port": 8443, "scheme": "HTTPS" } }
        }]}});
        let (ops, probes) = rewrite(&pod, 4191);
        assert_eq!(ops.len(), 3);
        assert_eq!(probes.len(), 3);
        assert_eq!(ops[0].path, "/spec/containers/0/livenessProbe");
        assert_eq!(ops[0].value["httpGet"]["path"], "/app-health/agent/livez");
        assert_eq!(ops[0].value["httpGet"]["port"], 4191);
        assert_eq!(ops[0].value["periodSeconds"], 5, "timings kept");
        assert_eq!(
            probes["agent/livez"],
            AppProbe::Http {
                port: 8080,
                path: "/healthz".into(),
                headers: [("x-probe".to_owned(), "1".to_owned())].into(),
                timeout_ms: Some(2000),
            }
        );
        assert!(matches!(
            probes["agent/readyz"],
            AppProbe::Tcp { port: 8080, .. }
        ));
        assert!(matches!(
            probes["agent/startupz"],
            AppProbe::Grpc { port: 9090, .. }
        ));
        assert!(!probes.contains_key("tool/readyz"), "HTTPS stays");
    }
}
