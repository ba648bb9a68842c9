//! `app_probes` in the bootstrap: the kubelet probes of the agent's containers that the
//! sidecar's admin port runs for them under interception (`src/admin/app_probe.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The environment variable the injector hands them to the sidecar in (JSON).
pub const APP_PROBES_ENV: &str = "AGENT_REACH_APP_PROBES";
/// The environment variable the injector hands the drain hook's token in.
pub const DRAIN_TOKEN_ENV: &str = "AGENT_REACH_DRAIN_TOKEN";
/// The header the agent container's `preStop` hook presents it in.
pub(crate) const DRAIN_HEADER: &str = "x-agent-reach-drain";

/// How long a probe may take when its original said nothing (the kubelet's default, 1 s).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// One original probe of an agent container, as the injector hands it over
/// (`AGENT_REACH_APP_PROBES`: `{"<container>/<livez|readyz|startupz>": probe}`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub enum AppProbe {
    Http {
        port: u16,
        #[serde(default = "root")]
        path: String,
        #[serde(default)]
        headers: BTreeMap<String, String>,
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    Tcp {
        port: u16,
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    Grpc {
        port: u16,
        #[serde(default)]
        service: String,
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
}

fn root() -> String {
    "/".to_owned()
}

/// The agent's probes by `<container>/<kind>`.
pub type AppProbes = BTreeMap<String, AppProbe>;

impl AppProbe {
    /// How long the probe may take.
    pub(crate) fn timeout(&self) -> Duration {
        let ms = match self {
            Self::Http { timeout_ms, .. }
            | Self::Tcp { timeout_ms, .. }
            | Self::Grpc { timeout_ms, .. } => *timeout_ms,
        };
        ms.map_or(DEFAULT_TIMEOUT, Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_read_as_the_injector_writes_them() {
        let text = r#"{"agent/livez": {"http": {"port": 8080, "path": "/healthz", "headers": {"x-probe": "1"}}},
                       "agent/readyz": {"tcp": {"port": 8080, "timeout_ms": 2000}},
                       "agent/startupz": {"grpc": {"port": 9090}}}"#;
        let probes: AppProbes = serde_json::from_str(text).unwrap_or_default();
        assert_eq!(probes.len(), 3);
        assert_eq!(probes["agent/readyz"].timeout(), Duration::from_secs(2));
        assert_eq!(probes["agent/livez"].timeout(), DEFAULT_TIMEOUT);
    }
}
