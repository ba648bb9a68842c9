//! Reading the injector's file: the checks a chart mistake must fail (at `agent-reach check` or
//! start-up, not in every pod), and the sidecar's own ports, found by rendering a sample pod's
//! bootstrap as the sidecar will read it. Kept apart from the file's types (`config.rs`): it needs
//! the annotations' settings and the pod's bootstrap, and those need the types.

use std::path::Path;

use super::annotations::Settings;
use super::config::InjectorConfig;
use super::mtls;
use super::pod::bootstrap_text;
use super::tasks;
use crate::config::{self, ConfigError};

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
        mtls::check(&config).map_err(invalid)?;
        tasks::check(&config).map_err(invalid)?;
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
        let sample = Settings::sample(&config);
        let (_, bootstrap) = bootstrap_text(&config, &sample, "default")
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
        let bad_bootstrap = SHIPPED.replace("listen: \"[::]:4190\"", "listen: nowhere");
        let err = InjectorConfig::parse(path, &bad_bootstrap)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.is_some_and(|e| e.contains("bootstrap:")),
            "a bootstrap the sidecar would refuse"
        );
    }
}
