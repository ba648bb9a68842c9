//! Mutual TLS for an injected pod: the certificate volume (the injector's `mtls.volume`, made the
//! pod's own), its read-only mount in the sidecar, and the bootstrap's `tls` files in it.
//!
//! Why a volume and not a file the sidecar fetches: cert-manager's csi-driver-spiffe and a
//! Certificate's Secret both hand certificates to pods as files and renew them by rewriting the
//! files, which the sidecar watches (`docs/kubernetes.md`, "Mutual TLS"). The sidecar needs no
//! API access and no extra privilege for it.

use serde_json::{json, Value};

use super::annotations::AnnotationError;
use super::config::{InjectorConfig, Mtls};

/// Where the sidecar finds `tls.crt`, `tls.key` and `ca.crt` (what the bootstrap names).
pub(super) const TLS_DIR: &str = "/var/run/agent-reach/tls";
/// The pod volume holding them.
pub(super) const TLS_VOLUME: &str = "agent-reach-tls";
/// In the volume's strings, replaced by the pod's service account.
const SERVICE_ACCOUNT: &str = "{service_account}";

/// The bootstrap's `tls`: the three files in [`TLS_DIR`].
pub(super) fn bootstrap_tls() -> Value {
    json!({
        "cert": format!("{TLS_DIR}/tls.crt"),
        "key": format!("{TLS_DIR}/tls.key"),
        "ca": format!("{TLS_DIR}/ca.crt"),
    })
}

/// The sidecar's mount of the volume: read-only, the sidecar only reads (and re-reads) it.
pub(super) fn mount() -> Value {
    json!({ "name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": true })
}

/// The pod's certificate volume, or why the pod cannot have one.
pub(super) fn volume(mtls: &Mtls, pod: &Value, namespace: &str) -> Result<Value, AnnotationError> {
    let account = service_account(pod);
    if let Some(known) = &mtls.service_accounts {
        let wanted = format!("{namespace}/{account}");
        if !known.contains(&wanted) {
            return Err(AnnotationError::NoCertificate {
                account: wanted,
                known: if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                },
            });
        }
    }
    let mut volume = Value::Object(mtls.volume.clone());
    substitute(&mut volume, account);
    volume["name"] = json!(TLS_VOLUME);
    Ok(volume)
}

/// The service account the pod runs as. The API server's ServiceAccount admission fills
/// `serviceAccountName` before webhooks see the pod; a manifest injected by hand may leave it out.
fn service_account(pod: &Value) -> &str {
    ["/spec/serviceAccountName", "/spec/serviceAccount"]
        .iter()
        .find_map(|p| pod.pointer(p).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
}

fn substitute(value: &mut Value, account: &str) {
    match value {
        Value::String(text) if text.contains(SERVICE_ACCOUNT) => {
            *text = text.replace(SERVICE_ACCOUNT, account);
        }
        Value::Array(items) => items.iter_mut().for_each(|v| substitute(v, account)),
        Value::Object(map) => map.values_mut().for_each(|v| substitute(v, account)),
        _ => {}
    }
}

/// The checks of `mtls` a chart mistake must fail at start-up (or `agent-reach check`) rather
/// than in every pod.
pub(super) fn check(config: &InjectorConfig) -> Result<(), String> {
    let Some(mtls) = &config.mtls else {
        return Ok(());
    };
    if mtls.volume.is_empty() || mtls.volume.contains_key("name") {
        return Err(format!(
            "mtls.volume: must be a volume source (`csi: …`, `secret: …`) without `name`; the injector names it {TLS_VOLUME}"
        ));
    }
    if config.bootstrap.contains_key("tls") {
        return Err(
            "bootstrap: must not have `tls` beside `mtls`; the injector adds it to each pod's"
                .to_owned(),
        );
    }
    let named = |list: Option<&Value>, key: &str, value: &str| {
        list.and_then(Value::as_array).is_some_and(|l| {
            l.iter()
                .any(|v| v.get(key).and_then(Value::as_str) == Some(value))
        })
    };
    if named(config.sidecar.get("volumeMounts"), "mountPath", TLS_DIR)
        || named(config.sidecar.get("volumeMounts"), "name", TLS_VOLUME)
        || config
            .volumes
            .iter()
            .any(|v| v.get("name").and_then(Value::as_str) == Some(TLS_VOLUME))
    {
        return Err(format!(
            "sidecar: must not mount {TLS_DIR} or a volume {TLS_VOLUME} itself with `mtls` on; the injector adds them"
        ));
    }
    for account in mtls.service_accounts.iter().flatten() {
        let ok = account
            .split_once('/')
            .is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'));
        if !ok {
            return Err(format!(
                "mtls.service_accounts: `{account}` is not namespace/name"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret_source(accounts: Option<Vec<&str>>) -> Mtls {
        Mtls {
            volume: json!({ "secret": { "secretName": "reach-mtls-{service_account}" } })
                .as_object()
                .cloned()
                .unwrap_or_default(),
            service_accounts: accounts.map(|a| a.into_iter().map(str::to_owned).collect()),
        }
    }

    #[test]
    fn the_volume_takes_the_pods_service_account_or_default() {
        let mtls = secret_source(None);
        let pod = json!({ "spec": { "serviceAccountName": "coder" } });
        assert_eq!(
            volume(&mtls, &pod, "agents").ok(),
            Some(json!({ "name": TLS_VOLUME, "secret": { "secretName": "reach-mtls-coder" } }))
        );
        let bare = json!({ "spec": {} });
        assert_eq!(
            volume(&mtls, &bare, "agents")
                .ok()
                .map(|v| v["secret"]["secretName"].clone()),
            Some(json!("reach-mtls-default"))
        );
    }

    #[test]
    fn a_service_account_without_a_certificate_is_denied_with_the_list() {
        let mtls = secret_source(Some(vec!["agents/coder", "agents/writer"]));
        let pod = json!({ "spec": { "serviceAccountName": "coder" } });
        assert!(volume(&mtls, &pod, "agents").is_ok());
        let err = volume(&mtls, &pod, "billing").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("service account `billing/coder` has no certificate for mutual TLS (those that have: agents/coder, agents/writer); add it to the chart's mtls.certificate.serviceAccounts, or annotate the pod agent-reach.io/mtls: disabled")
        );
    }
}
