//! The injector's own file (`injector.yaml`, rendered by the Helm chart): where it listens, its
//! certificate, and what it adds to a pod — the sidecar container, its volumes and the bootstrap
//! every injected pod starts from.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{self, ConfigError, HumanDuration};

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
    pub termination_grace_seconds: u32,
    /// Scrape annotations added to pods that have none of their own.
    #[serde(default)]
    pub prometheus: Option<Prometheus>,
    #[serde(default)]
    pub defaults: Defaults,
    /// The sidecar, a Kubernetes `Container` (the chart's partial template).
    pub sidecar: serde_json::Value,
    /// Pod volumes the sidecar mounts (policy ConfigMap, gossip key Secret).
    #[serde(default)]
    pub volumes: Vec<serde_json::Value>,
    /// Every injected pod's bootstrap without `agent`, which comes from the pod's annotations.
    /// `{namespace}` in a gossip seed becomes the pod's namespace.
    pub bootstrap: serde_json::Map<String, serde_json::Value>,
    /// Derived at parse time from the bootstrap, as the sidecar will read it.
    #[serde(skip)]
    ports: Vec<u16>,
    #[serde(skip)]
    admin_port: u16,
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

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Prometheus {
    pub port: u16,
    #[serde(default = "default_metrics_path")]
    pub path: String,
}

/// Per-pod settings for pods without the annotation.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Defaults {
    pub agent_port: u16,
    pub max_concurrency: u32,
    /// `""`: no business probe unless the pod asks for one.
    pub probe_path: String,
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
    /// Parses and checks the file: the sidecar must be a named container, and the bootstrap
    /// must make a valid sidecar config once an agent is added (so a chart mistake fails here,
    /// at `agent-reach check` or start-up, not in every pod).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let mut config: InjectorConfig = config::parse_yaml(path, text)?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.display().to_string(),
            line: 1,
            column: 1,
            message,
        };
        if config.sidecar_name().is_none() {
            return Err(invalid(
                "sidecar: must be a container with a `name`".to_owned(),
            ));
        }
        if config.bootstrap.contains_key("agent") {
            return Err(invalid(
                "bootstrap: must not have `agent`; each pod's annotations fill it".to_owned(),
            ));
        }
        if config.defaults.agent_port == 0 || config.defaults.max_concurrency == 0 {
            return Err(invalid(
                "defaults: agent_port and max_concurrency must be at least 1".to_owned(),
            ));
        }
        // The kubelet expands `$(VAR)` and `$$` in env values, where the bootstrap goes.
        if serde_json::to_string(&config.bootstrap).is_ok_and(|t| t.contains('$')) {
            return Err(invalid(
                "bootstrap: must not contain `$` (the kubelet expands it in the sidecar's environment)"
                    .to_owned(),
            ));
        }
        for volume in &config.volumes {
            if volume.get("name").and_then(|n| n.as_str()).is_none() {
                return Err(invalid("volumes: every volume needs a `name`".to_owned()));
            }
        }
        let base = path.parent().unwrap_or(Path::new("."));
        for file in [&mut config.tls.cert_file, &mut config.tls.key_file] {
            if file.is_relative() {
                *file = base.join(&*file);
            }
        }
        let sample = super::annotations::Settings::sample(&config);
        let (_, bootstrap) = super::pod::bootstrap_text(&config, &sample, "default")
            .map_err(|e| invalid(format!("bootstrap: {e}")))?;
        let listen = &bootstrap.listen;
        config.admin_port = listen.admin.port();
        config.ports = [listen.outbound, listen.inbound, listen.admin]
            .iter()
            .map(|a| a.port())
            .chain(bootstrap.gossip.as_ref().map(|g| g.listen.port()))
            .collect();
        if config.ports.contains(&config.defaults.agent_port) {
            return Err(invalid(format!(
                "defaults.agent_port {} is one of the sidecar's own ports",
                config.defaults.agent_port
            )));
        }
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(path, &config::read_file(path)?)
    }

    pub fn sidecar_name(&self) -> Option<&str> {
        self.sidecar.get("name").and_then(|n| n.as_str())
    }

    /// The ports the sidecar itself listens on in the pod — outbound, inbound, admin, then
    /// gossip when on (an agent may not use them).
    pub fn sidecar_ports(&self) -> &[u16] {
        &self.ports
    }

    /// The sidecar's admin port (probes, `/live` for the post-start hook).
    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../config/injector.yaml");

    #[test]
    fn the_shipped_file_parses_and_mistakes_that_would_deny_every_pod_do_not() {
        let path = Path::new("injector.yaml");
        assert!(InjectorConfig::parse(path, SHIPPED).is_ok());
        let clash = SHIPPED.replace("agent_port: 8080", "agent_port: 4143");
        let err = InjectorConfig::parse(path, &clash)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("injector.yaml:1:1: defaults.agent_port 4143 is one of the sidecar's own ports")
        );
        let dollar = SHIPPED.replace("/var/run/agent-reach/gossip/key", "/keys/$(POD_NAME)");
        let err = InjectorConfig::parse(path, &dollar)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("must not contain `$`")));
        let no_name = SHIPPED.replace("  name: agent-reach\n", "");
        assert!(InjectorConfig::parse(path, &no_name).is_err());
        let bad_bootstrap = SHIPPED.replace("listen: 0.0.0.0:4190", "listen: nowhere");
        let err = InjectorConfig::parse(path, &bad_bootstrap)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.is_some_and(|e| e.contains("bootstrap:")),
            "a bootstrap the sidecar would refuse"
        );
    }
}
