//! A pod's `agent-reach.io/*` annotations: the names, their validation, and the per-pod
//! settings they make (with the injector's defaults for those not given).

use serde_json::{Map, Value};

use super::config::InjectorConfig;
use super::overrides::{
    SidecarOverrides, LOG_LEVEL, PROXY_CPU_LIMIT, PROXY_CPU_REQUEST, PROXY_MEMORY_LIMIT,
    PROXY_MEMORY_REQUEST,
};
use crate::config::Name;

pub(super) const PREFIX: &str = "agent-reach.io/";
pub(super) const INJECT: &str = "agent-reach.io/inject";
pub(super) const STATUS: &str = "agent-reach.io/status";
pub(super) const AGENT_PORT: &str = "agent-reach.io/agent-port";
pub(super) const CAPABILITIES: &str = "agent-reach.io/capabilities";
pub(super) const CONFIG: &str = "agent-reach.io/config";
pub(super) const MAX_CONCURRENCY: &str = "agent-reach.io/max-concurrency";
pub(super) const ZONE: &str = "agent-reach.io/zone";
pub(super) const PROBE_PATH: &str = "agent-reach.io/probe-path";
/// `disabled`: no certificate for this pod's sidecar, though the injector gives them out.
pub(super) const MTLS: &str = "agent-reach.io/mtls";
/// `disabled`: no task store for this pod's sidecar (`prefer: respond-async` is refused).
pub(super) const TASKS: &str = "agent-reach.io/tasks";
/// `inbound`: an `init-net` init container redirects the agent's port to the sidecar;
/// `disabled`: not, though the injector's default is on.
pub(super) const INTERCEPT: &str = "agent-reach.io/intercept";
/// Ports of the agent `init-net` leaves alone (comma separated): connections to them reach the
/// agent itself, as Istio's and Linkerd's port exclusions do.
pub(super) const EXCLUDE_PORTS: &str = "agent-reach.io/intercept-exclude-ports";
/// Source networks (IPv4 CIDRs, comma separated) whose connections `init-net` leaves alone.
pub(super) const EXCLUDE_CIDRS: &str = "agent-reach.io/intercept-exclude-cidrs";
/// `enabled`: the sidecar reads the agent's A2A card (`/.well-known/agent-card.json`) and serves
/// each skill as a capability (`docs/a2a.md`).
pub(super) const A2A: &str = "agent-reach.io/a2a";
/// `enabled` (the server at `/mcp`) or the MCP endpoint's path: the sidecar reads the local MCP
/// server's tools and routes each tool call (`docs/mcp.md`).
pub(super) const MCP: &str = "agent-reach.io/mcp";
/// The label injected pods carry: the gossip Service, NetworkPolicy and PodMonitor select it.
pub(super) const INJECTED_LABEL: &str = "agent-reach.io/injected";
/// The release whose injector injected a pod: its gossip Service selects its own pods only.
pub(super) const RELEASE_LABEL: &str = "agent-reach.io/release";

const KNOWN: [&str; 20] = [
    INJECT,
    STATUS,
    EXCLUDE_PORTS,
    EXCLUDE_CIDRS,
    AGENT_PORT,
    CAPABILITIES,
    CONFIG,
    MAX_CONCURRENCY,
    ZONE,
    PROBE_PATH,
    MTLS,
    TASKS,
    INTERCEPT,
    A2A,
    MCP,
    PROXY_CPU_REQUEST,
    PROXY_CPU_LIMIT,
    PROXY_MEMORY_REQUEST,
    PROXY_MEMORY_LIMIT,
    LOG_LEVEL,
];

/// Why a pod cannot be admitted as written: the denial message the user sees.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AnnotationError {
    #[error("annotation {key}: `{value}` {problem}")]
    Invalid {
        key: &'static str,
        value: String,
        problem: String,
    },
    #[error("annotation {key} is not one agent-reach reads (known: {known})")]
    Unknown { key: String, known: String },
    #[error("annotation {CONFIG} names a whole bootstrap; {other} cannot be set beside it")]
    Conflict { other: &'static str },
    #[error("the pod already has a {what} named `{name}`, which the sidecar needs")]
    NameTaken { what: &'static str, name: String },
    #[error("the sidecar's config would be invalid: {0}")]
    Bootstrap(String),
    #[error("container `{container}` declares port {port}, which the sidecar listens on ({ports}); a pod meshed by Linkerd too needs the chart's sidecar.ports changed")]
    PortTaken {
        container: String,
        port: u16,
        ports: String,
    },
    #[error("the pod is also injected by Linkerd (linkerd.io/inject: enabled), whose proxy uses the sidecar's default ports; set the chart's sidecar.ports to others, or drop one of the two")]
    Linkerd,
    #[error("the pod asks for {INTERCEPT}: inbound, but {mesh} redirects its traffic too; run one interceptor per pod (drop the annotation or the mesh's injection)")]
    TwoInterceptors { mesh: &'static str },
    #[error("the object is not a pod: {0}")]
    NotAPod(String),
    #[error("service account `{account}` has no certificate for mutual TLS (those that have: {known}); add it to the chart's mtls.certificate.serviceAccounts, or annotate the pod {MTLS}: disabled")]
    NoCertificate { account: String, known: String },
}

/// The per-pod settings, from annotations or the injector's defaults.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Settings {
    pub(crate) agent_port: u16,
    pub(crate) capabilities: Vec<Name>,
    pub(crate) max_concurrency: u32,
    pub(crate) zone: Option<String>,
    pub(crate) probe_path: Option<String>,
    /// A ConfigMap holding the whole bootstrap instead.
    pub(crate) config_map: Option<String>,
    /// The sidecar gets the injector's certificate volume and the bootstrap's `tls`.
    pub(crate) mtls: bool,
    /// The sidecar gets the injector's `tasks` (and, for the embedded store, its volume).
    pub(crate) tasks: bool,
    /// An `init-net` init container redirects the agent's port to the sidecar's inbound port.
    pub(crate) intercept: bool,
    /// Ports and source networks `init-net` leaves alone.
    pub(crate) exclude_ports: Vec<u16>,
    pub(crate) exclude_cidrs: Vec<String>,
    /// The bootstrap's `agent.a2a`: capabilities from the agent's card.
    pub(crate) a2a: bool,
    /// The bootstrap's `agent.mcp.path`: tools from the local MCP server.
    pub(crate) mcp: Option<String>,
    /// Resources and log level of this pod's sidecar, over the chart's.
    pub(crate) sidecar: SidecarOverrides,
}

impl Settings {
    /// What a pod with no annotation but `inject` gets: the injector's defaults, no capability.
    pub(super) fn defaults(config: &InjectorConfig) -> Self {
        Self {
            agent_port: config.defaults.agent_port,
            capabilities: Vec::new(),
            max_concurrency: config.defaults.max_concurrency,
            zone: None,
            probe_path: (!config.defaults.probe_path.is_empty())
                .then(|| config.defaults.probe_path.clone()),
            config_map: None,
            mtls: config.mtls.is_some(),
            tasks: config.tasks.enabled,
            intercept: config.intercept.default,
            exclude_ports: Vec::new(),
            exclude_cidrs: Vec::new(),
            a2a: false,
            mcp: None,
            sidecar: SidecarOverrides::default(),
        }
    }

    /// The defaults with one capability (checks the injector file, probe included).
    pub(super) fn sample(config: &InjectorConfig) -> Self {
        Self {
            capabilities: Name::parse("sample").into_iter().collect(),
            ..Self::defaults(config)
        }
    }

    pub(super) fn from_annotations(
        config: &InjectorConfig,
        annotations: &Map<String, Value>,
    ) -> Result<Self, AnnotationError> {
        let get = |key: &'static str| annotations.get(key).and_then(Value::as_str);
        let invalid = |key: &'static str, value: &str, problem: &str| AnnotationError::Invalid {
            key,
            value: value.to_owned(),
            problem: problem.to_owned(),
        };
        for key in annotations.keys() {
            if key.starts_with(PREFIX) && !KNOWN.contains(&key.as_str()) {
                return Err(AnnotationError::Unknown {
                    key: key.clone(),
                    known: KNOWN.join(", "),
                });
            }
        }
        let mut settings = Settings::defaults(config);
        // The container's own settings: they hold beside a whole bootstrap (`CONFIG`) too.
        settings.sidecar =
            SidecarOverrides::from_annotations(get, &config.sidecar).map_err(|e| {
                AnnotationError::Invalid {
                    key: e.key,
                    value: e.value,
                    problem: e.problem,
                }
            })?;
        match get(MTLS) {
            None => {}
            Some("disabled") => settings.mtls = false,
            Some("enabled") if config.mtls.is_some() => {}
            Some("enabled") => {
                return Err(invalid(
                    MTLS,
                    "enabled",
                    "asks for a certificate, but the injector gives none out (the chart's mtls.enabled)",
                ))
            }
            Some(other) => return Err(invalid(MTLS, other, "is not `enabled` or `disabled`")),
        }
        match get(TASKS) {
            None => {}
            Some("disabled") => settings.tasks = false,
            Some("enabled") if config.tasks.enabled => {}
            Some("enabled") => {
                return Err(invalid(
                    TASKS,
                    "enabled",
                    "asks for a task store, but the injector gives none out (the chart's tasks.enabled)",
                ))
            }
            Some(other) => return Err(invalid(TASKS, other, "is not `enabled` or `disabled`")),
        }
        match get(A2A) {
            None | Some("disabled") => {}
            Some("enabled") => settings.a2a = true,
            Some(other) => return Err(invalid(A2A, other, "is not `enabled` or `disabled`")),
        }
        match get(MCP) {
            None | Some("disabled") => {}
            Some("enabled") => settings.mcp = Some("/mcp".to_owned()),
            Some(path) if path.starts_with('/') && !path.contains(char::is_whitespace) => {
                settings.mcp = Some(path.to_owned())
            }
            Some(other) => {
                return Err(invalid(
                    MCP,
                    other,
                    "is not `enabled`, `disabled` or a path starting with `/`",
                ))
            }
        }
        match get(INTERCEPT) {
            None => {}
            Some("inbound") => settings.intercept = true,
            Some("disabled") => settings.intercept = false,
            Some(other) => return Err(invalid(INTERCEPT, other, "is not `inbound` or `disabled`")),
        }
        if let Some(list) = get(EXCLUDE_PORTS) {
            settings.exclude_ports = list
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| p.parse::<u16>().ok().filter(|p| *p > 0))
                .collect::<Option<Vec<u16>>>()
                .ok_or_else(|| {
                    invalid(
                        EXCLUDE_PORTS,
                        list,
                        "is not a comma-separated list of ports",
                    )
                })?;
        }
        if let Some(list) = get(EXCLUDE_CIDRS) {
            let cidrs: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            crate::intercept::rules::Plan::new(&[1], 2, &[])
                .and_then(|p| p.excluding_sources(&cidrs))
                .map_err(|e| invalid(EXCLUDE_CIDRS, list, &e.to_string()))?;
            settings.exclude_cidrs = cidrs;
        }
        // Beside a whole bootstrap (`CONFIG`) the volumes are still mounted; that bootstrap names
        // the files itself.
        if let Some(name) = get(CONFIG) {
            for other in [
                AGENT_PORT,
                CAPABILITIES,
                MAX_CONCURRENCY,
                ZONE,
                PROBE_PATH,
                A2A,
                MCP,
            ] {
                if annotations.contains_key(other) {
                    return Err(AnnotationError::Conflict { other });
                }
            }
            if !is_dns_subdomain(name) {
                return Err(invalid(CONFIG, name, "is not a ConfigMap name"));
            }
            settings.config_map = Some(name.to_owned());
            return Ok(settings);
        }
        if let Some(port) = get(AGENT_PORT) {
            settings.agent_port = port
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| invalid(AGENT_PORT, port, "is not a port (1-65535)"))?;
        }
        if config.sidecar_ports().contains(&settings.agent_port) {
            return Err(invalid(
                AGENT_PORT,
                &settings.agent_port.to_string(),
                &format!(
                    "is one of the sidecar's own ports ({})",
                    join(config.sidecar_ports())
                ),
            ));
        }
        if let Some(list) = get(CAPABILITIES) {
            for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let name = Name::parse(item).map_err(|_| {
                    invalid(
                        CAPABILITIES,
                        item,
                        "is not a capability name: use 1-63 lowercase letters, digits and `-`, not starting or ending with `-`",
                    )
                })?;
                if settings.capabilities.contains(&name) {
                    return Err(invalid(
                        CAPABILITIES,
                        list,
                        &format!("names `{item}` twice"),
                    ));
                }
                settings.capabilities.push(name);
            }
        }
        if let Some(n) = get(MAX_CONCURRENCY) {
            settings.max_concurrency = n
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=100_000).contains(n))
                .ok_or_else(|| {
                    invalid(MAX_CONCURRENCY, n, "is not a whole number from 1 to 100000")
                })?;
        }
        if let Some(zone) = get(ZONE) {
            let ok = !zone.is_empty()
                && zone.len() <= 63
                && zone
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
            if !ok {
                return Err(invalid(
                    ZONE,
                    zone,
                    "is not a zone name (1-63 letters, digits, `-`, `.`, `_`)",
                ));
            }
            settings.zone = Some(zone.to_owned());
        }
        if let Some(path) = get(PROBE_PATH) {
            let ok = path.starts_with('/')
                && path.len() <= 1024
                && path.bytes().all(|b| b.is_ascii_graphic());
            if !ok {
                return Err(invalid(
                    PROBE_PATH,
                    path,
                    "is not a request path starting with `/`",
                ));
            }
            if path.contains('$') {
                return Err(invalid(
                    PROBE_PATH,
                    path,
                    "contains `$`, which the kubelet would expand in the sidecar's environment",
                ));
            }
            settings.probe_path = Some(path.to_owned());
        }
        Ok(settings)
    }
}

fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

pub(super) fn join(ports: &[u16]) -> String {
    ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
