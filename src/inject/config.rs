//! The injector's own file (`injector.yaml`, rendered by the Helm chart): where it listens, its
//! certificate, and what it adds to a pod — the sidecar container, its volumes and the bootstrap
//! every injected pod starts from.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::config::HumanDuration;

/// `injector.yaml`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InjectorConfig {
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    pub tls: TlsFiles,
    /// An init container with `restartPolicy: Always` (Kubernetes ≥ 1.29): starts before the
    /// agent, stops after it. `false`: a plain container first in the pod, for older clusters.
    #[serde(default = "default_true")]
    pub native_sidecar: bool,
    /// Pods get at least this grace, so the sidecar's drain can finish.
    #[serde(default = "default_grace")]
    pub(crate) termination_grace_seconds: u32,
    /// Scrape annotations added to pods that have none of their own.
    #[serde(default)]
    pub(crate) prometheus: Option<Prometheus>,
    #[serde(default)]
    pub(crate) defaults: Defaults,
    /// The sidecar, a Kubernetes `Container` (the chart's partial template).
    pub(crate) sidecar: serde_json::Value,
    /// Pod volumes the sidecar mounts (policy ConfigMap, gossip key Secret).
    #[serde(default)]
    pub(crate) volumes: Vec<serde_json::Value>,
    /// Mutual TLS between sidecars: the certificate volume every sidecar mounts. Absent: no
    /// certificates (the fleet speaks plaintext).
    #[serde(default)]
    pub(crate) mtls: Option<Mtls>,
    /// Async tasks: where each sidecar keeps them (`tasks.rs`). On by default, with the embedded
    /// store on an `emptyDir`.
    #[serde(default)]
    pub(crate) tasks: Tasks,
    /// Inbound interception: the `init-net` init container (`crate::intercept`).
    #[serde(default)]
    pub(crate) intercept: Intercept,
    /// The Helm release that installed the injector: its pods are labelled with it
    /// (`agent-reach.io/release`), so the release's gossip Service selects only its own.
    #[serde(default)]
    pub(crate) release: Option<String>,
    /// Every injected pod's bootstrap without `agent`, which comes from the pod's annotations.
    /// `{namespace}` in a gossip seed becomes the pod's namespace.
    pub(crate) bootstrap: serde_json::Map<String, serde_json::Value>,
    /// Derived at parse time from the bootstrap, as the sidecar will read it (`load.rs`).
    #[serde(skip)]
    pub(super) ports: Vec<u16>,
    #[serde(skip)]
    pub(super) admin_port: u16,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// How often the files are read again (cert-manager and the chart rotate them in place).
    #[serde(default = "default_reload_interval")]
    pub reload_interval: HumanDuration,
}

/// `mtls`: where a pod's certificate comes from. The webhook names the volume, mounts it
/// read-only in the sidecar at `/var/run/agent-reach/tls` and names its `tls.crt`, `tls.key` and
/// `ca.crt` in the bootstrap's `tls` (`mtls.rs`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Mtls {
    /// A Kubernetes volume without its `name`: `csi` for csi-driver-spiffe (a certificate per
    /// pod), `secret` for a cert-manager Certificate's Secret (one per service account).
    /// `{service_account}` in a string becomes the pod's service account.
    pub(crate) volume: serde_json::Map<String, serde_json::Value>,
    /// When set, only pods running as one of these service accounts (`namespace/name`) are
    /// injected; any other is denied, since the Secret its volume would name does not exist and
    /// the pod would never start.
    #[serde(default)]
    pub(crate) service_accounts: Option<Vec<String>>,
}

/// `tasks`: the bootstrap's `tasks` every injected sidecar gets, unless its pod is annotated
/// `agent-reach.io/tasks: disabled`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Tasks {
    pub(crate) enabled: bool,
    /// `""`: the embedded store, a file on an `emptyDir` (kept across container restarts, lost
    /// with the pod). A `redis://` URL: the shared store, where replicas of one workload take
    /// over each other's tasks.
    pub(crate) store: String,
    /// The `emptyDir`'s `sizeLimit` (a Kubernetes quantity); `""` for none.
    pub(crate) size_limit: String,
    /// The store's URL from a Secret (`name`, `key`) instead of `store`: the pod's spec names
    /// the Secret, never the URL (and its password).
    pub(crate) store_secret: Option<SecretKey>,
}

/// A key of a Secret in the pod's namespace.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretKey {
    pub(crate) name: String,
    pub(crate) key: String,
}

impl Default for Tasks {
    fn default() -> Self {
        Self {
            enabled: true,
            store: String::new(),
            size_limit: "1Gi".to_owned(),
            store_secret: None,
        }
    }
}

/// `intercept`: whether pods without the `agent-reach.io/intercept` annotation are intercepted,
/// and the UID the sidecar runs under when they are.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Intercept {
    pub(crate) default: bool,
    pub(crate) proxy_uid: u32,
}

impl Default for Intercept {
    fn default() -> Self {
        Self {
            default: false,
            proxy_uid: crate::intercept::DEFAULT_PROXY_UID,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Prometheus {
    pub(crate) port: u16,
    #[serde(default = "default_metrics_path")]
    pub(crate) path: String,
}

/// Per-pod settings for pods without the annotation.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Defaults {
    pub(crate) agent_port: u16,
    pub(crate) max_concurrency: u32,
    /// `""`: no business probe unless the pod asks for one.
    pub(crate) probe_path: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            agent_port: 8080,
            max_concurrency: 4,
            probe_path: String::new(),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8443))
}
fn default_true() -> bool {
    true
}
fn default_grace() -> u32 {
    45
}
fn default_reload_interval() -> HumanDuration {
    HumanDuration::from_secs(10)
}
fn default_metrics_path() -> String {
    "/metrics".to_owned()
}

impl InjectorConfig {
    pub(crate) fn sidecar_name(&self) -> Option<&str> {
        self.sidecar.get("name").and_then(|n| n.as_str())
    }

    /// The ports the sidecar itself listens on in the pod — outbound, inbound, admin, then
    /// gossip when on (an agent may not use them).
    pub(crate) fn sidecar_ports(&self) -> &[u16] {
        &self.ports
    }

    /// The sidecar's inbound port (where `init-net` redirects to).
    pub(crate) fn inbound_port(&self) -> u16 {
        self.ports.get(1).copied().unwrap_or(4143)
    }

    /// The sidecar's admin port (probes, `/live` for the post-start hook).
    pub(crate) fn admin_port(&self) -> u16 {
        self.admin_port
    }
}
