//! Configuration: the bootstrap and policy types, strict loading, and the one hot-swapped snapshot.

mod app_probes;
mod bootstrap;
mod bounds;
mod chains;
pub mod check;
mod duration;
mod intents;
mod mesh;
mod output_schema;
mod policy;
mod quality;
mod restart_only;
#[cfg(test)]
mod rule_tables;
mod scalar;
mod tasks;
pub mod warnings;
mod watch;
pub mod yaml;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;

pub(crate) use app_probes::DRAIN_HEADER;
pub use app_probes::{AppProbe, AppProbes, APP_PROBES_ENV, DRAIN_TOKEN_ENV};
pub use bootstrap::{
    A2aConfig, AgentProfile, Bootstrap, Capability, ExpectJson, GossipConfig, Intercept, Limits,
    Listen, McpConfig, McpTools, ProbeSpec, QueueConfig, RouteMode, SkillFacts, StaticPeer,
    ToolFacts, TracingConfig,
};
pub use chains::{ChainsPolicy, HedgeAfter, HedgePolicy};
pub use duration::{format_duration, parse_duration, HumanDuration};
pub(crate) use intents::{fold_padded, Keyword, ANY};
pub use intents::{IntentRule, IntentThreshold, Intents};
pub use mesh::{Authorization, CapabilityAuthorization, MtlsMode, MtlsPolicy, TlsFiles, Verdict};
pub(crate) use output_schema::SchemaSource;
pub use output_schema::{CompiledSchema, OutputSchema, SchemaDigest};
pub use policy::{
    AffinityMode, AffinityPolicy, BudgetGroupPolicy, CapabilityPolicy, EstimatesPolicy,
    ExternalTarget, FallbackPolicy, FinalFallback, Fraction, MetricsPolicy, ModelBudgetsPolicy,
    PeerProtocol, Policy, Pool, ProbesPolicy, Protocol, RateLimit, RetryBudgetPolicy, RetryPolicy,
    StatesPolicy, Timeouts, ValidationPolicy, WeightSets, Zones,
};
pub use quality::{Compare, GoldenTask, QualitySpec};
pub use restart_only::PendingRestart;
mod ca_bundle;
pub(crate) use ca_bundle::{read_ca_bundle, CaBundleError};
pub use scalar::{Cost, HeaderBytes, HostPort, Name, PositiveCount, Proficiency, TargetEndpoint};
pub use tasks::{EscalationPolicy, QueueRounds, TasksConfig};
pub(crate) use tasks::{Host, StoreLocation};
pub(crate) use watch::{spawn_watcher, OnReload, ReloadResult};

/// A config file that could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: String,
        line: usize,
        column: usize,
        message: String,
    },
}

/// Which of the two config files a document is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    Bootstrap,
    Policy,
    /// `agent-reach inject`'s file (the chart renders it).
    Injector,
}

impl FileKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FileKind::Bootstrap => "bootstrap",
            FileKind::Policy => "policy",
            FileKind::Injector => "injector",
        }
    }
}

/// Tells a bootstrap file (it has an `agent`) from a policy file.
pub(crate) fn detect_kind(path: &Path, text: &str) -> Result<FileKind, ConfigError> {
    let keys = yaml::top_level_keys(path, text)?;
    if keys.iter().any(|k| k == "sidecar") {
        return Ok(FileKind::Injector);
    }
    // `agent` is required in a bootstrap; the others appear only there.
    let bootstrap_only = ["agent", "listen", "limits", "watch_interval", "gossip"];
    if keys.iter().any(|k| bootstrap_only.contains(&k.as_str())) {
        Ok(FileKind::Bootstrap)
    } else {
        Ok(FileKind::Policy)
    }
}

/// Parses any strict config document (the injector's too) with file:line:col errors.
pub(crate) fn parse_yaml<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<T, ConfigError> {
    yaml::parse(path, text)
}

pub fn parse_bootstrap(path: &Path, text: &str) -> Result<Bootstrap, ConfigError> {
    let mut bootstrap: Bootstrap = yaml::parse_checked(path, text, bootstrap::RULES)?;
    // Schema files are read now, beside the bootstrap, so `check` and a reload refuse a
    // missing or broken one like any other bad value.
    let base = path.parent().filter(|p| !p.as_os_str().is_empty());
    bootstrap.resolve_baselines(base);
    if let Err((capability, written, message)) = bootstrap.resolve_schemas(base) {
        let (line, column) = yaml::locate(text, &written);
        return Err(ConfigError::Invalid {
            path: path.display().to_string(),
            line,
            column,
            message: format!("agent.capabilities[`{capability}`].output_schema: {message}"),
        });
    }
    Ok(bootstrap)
}

pub fn parse_policy(path: &Path, text: &str) -> Result<Policy, ConfigError> {
    let mut policy: Policy = yaml::parse_checked(path, text, policy::RULES)?;
    // CA bundles are read now, beside the policy, so `check` and a reload refuse an unreadable
    // one like any other bad value.
    let base = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Err((written, message)) = policy::resolve_ca_files(&mut policy.targets, base) {
        let (line, column) = yaml::locate(text, &written);
        return Err(ConfigError::Invalid {
            path: path.display().to_string(),
            line,
            column,
            message,
        });
    }
    Ok(policy)
}

pub(crate) fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

pub fn load_bootstrap(path: &Path) -> Result<Bootstrap, ConfigError> {
    parse_bootstrap(path, &read_file(path)?)
}

pub fn load_policy(path: &Path) -> Result<Policy, ConfigError> {
    parse_policy(path, &read_file(path)?)
}

/// Everything a request needs from config, loaded once per request from one `ArcSwap`.
#[derive(Debug)]
pub struct Snapshot {
    pub bootstrap: Bootstrap,
    pub policy: Policy,
    /// Bumped on every accepted reload: within one store, one generation is one content (the
    /// registry indexes the configured peers once per generation).
    pub(crate) generation: u64,
    /// The agent's name as a header value (`reach-caller`, `reach-agent`), made once here, not
    /// copied into a new one for every request.
    pub(crate) agent_name: http::HeaderValue,
    /// The policy's estimate and state tunables, converted once here: every call's observation
    /// and every score read them, and building them each time showed in the profile
    /// (`docs/perf-levers.md`).
    pub(crate) estimate_params: crate::reach::EstimateParams,
    pub(crate) state_params: crate::reach::StateParams,
}

impl Snapshot {
    pub fn new(bootstrap: Bootstrap, policy: Policy, generation: u64) -> Self {
        // A name is checked at load to be a valid header value; empty if it were not.
        let agent_name = http::HeaderValue::from_str(bootstrap.agent.name.as_str())
            .unwrap_or_else(|_| http::HeaderValue::from_static(""));
        Self {
            estimate_params: policy.estimates.params(),
            state_params: policy.states.params(),
            bootstrap,
            policy,
            generation,
            agent_name,
        }
    }

    /// Whether the local agent declares a business probe for any capability.
    pub(crate) fn has_probes(&self) -> bool {
        self.bootstrap
            .agent
            .capabilities
            .iter()
            .any(|c| c.probe.is_some())
    }

    /// The mutual TLS mode in force: the policy's, or by default `permissive` where this
    /// sidecar has certificates and `disabled` where it has none.
    /// The mode for a connection intercepted from the agent's `port` (`None`: a direct one).
    pub(crate) fn mtls_mode_for(&self, port: Option<u16>) -> MtlsMode {
        port.and_then(|p| self.policy.mtls.ports.get(&p).copied())
            .unwrap_or_else(|| self.mtls_mode())
    }

    pub(crate) fn mtls_mode(&self) -> MtlsMode {
        match (self.policy.mtls.mode, &self.bootstrap.tls) {
            (Some(mode), _) => mode,
            (None, Some(_)) => MtlsMode::Permissive,
            (None, None) => MtlsMode::Disabled,
        }
    }

    /// Whether calls for `capability` are observed, not routed (policy `observe_only`, or the
    /// capability's own setting).
    pub(crate) fn observe_only(&self, capability: &str) -> bool {
        let policy = &self.policy;
        policy
            .capabilities
            .get(capability)
            .and_then(|c| c.observe_only)
            .unwrap_or(policy.observe_only)
    }

    /// The local agent's timeout for `capability`, or the policy default.
    pub(crate) fn capability_timeout(&self, capability: Option<&str>) -> std::time::Duration {
        let default = self.policy.timeouts.request.get();
        capability
            .and_then(|c| self.bootstrap.agent.capability(c))
            .map_or(default, |c| c.timeout_or(default))
    }
}

/// Where the running config came from, so the watcher can re-read it.
#[derive(Clone, Debug, Default)]
pub struct ConfigPaths {
    pub bootstrap: Option<PathBuf>,
    pub policy: Option<PathBuf>,
}

/// The live configuration: one atomically swapped snapshot.
#[derive(Debug)]
pub struct ConfigStore {
    current: ArcSwap<Snapshot>,
    pub(crate) paths: ConfigPaths,
    /// The last rejected reload, cleared when its file parses again.
    reload_error: std::sync::Mutex<Option<ReloadError>>,
    /// Restart-only keys whose file value differs from the running one, until it goes back.
    pending_restart: std::sync::Mutex<Vec<PendingRestart>>,
    /// Capabilities imported from the agent's A2A card, merged into every bootstrap that goes
    /// live (`merge_card`), so a file reload keeps them and a card change is a reload too.
    card: std::sync::Mutex<Vec<Capability>>,
    /// The capability imported from the local MCP server's tools (`src/mcp/mod.rs`), merged
    /// the same way (`merge_mcp`).
    mcp: std::sync::Mutex<Option<Capability>>,
}

/// A config file change that was rejected: the running config stayed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReloadError {
    /// `bootstrap` or `policy`.
    pub(crate) file: &'static str,
    pub message: String,
    /// Wall-clock time of the rejection, milliseconds since the Unix epoch.
    pub(crate) unix_ms: u64,
}

impl ConfigStore {
    pub fn new(bootstrap: Bootstrap, policy: Policy, paths: ConfigPaths) -> Self {
        Self {
            current: ArcSwap::from_pointee(Snapshot::new(bootstrap, policy, 1)),
            paths,
            reload_error: std::sync::Mutex::new(None),
            pending_restart: std::sync::Mutex::new(Vec::new()),
            card: std::sync::Mutex::new(Vec::new()),
            mcp: std::sync::Mutex::new(None),
        }
    }

    /// Loads both files (a missing policy path means all defaults). Without a bootstrap file,
    /// `inline` is the bootstrap's text (`AGENT_REACH_BOOTSTRAP`, what the injector sets).
    pub fn load(paths: ConfigPaths, inline: Option<&str>) -> Result<Self, ConfigError> {
        let bootstrap = match (&paths.bootstrap, inline) {
            (Some(p), _) => load_bootstrap(p)?,
            (None, Some(text)) => parse_bootstrap(Path::new("$AGENT_REACH_BOOTSTRAP"), text)?,
            (None, None) => {
                return Err(ConfigError::Invalid {
                    path: "<none>".to_owned(),
                    line: 1,
                    column: 1,
                    message: "a bootstrap is required (--config, AGENT_REACH_CONFIG or AGENT_REACH_BOOTSTRAP)"
                        .to_owned(),
                })
            }
        };
        let policy = match &paths.policy {
            Some(p) => load_policy(p)?,
            None => Policy::default(),
        };
        Ok(Self::new(bootstrap, policy, paths))
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The last rejected reload, if its file has not parsed since.
    pub fn reload_error(&self) -> Option<ReloadError> {
        self.reload_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The restart-only keys the files changed, until a restart or until they go back.
    pub(crate) fn pending_restart(&self) -> Vec<PendingRestart> {
        self.pending_restart
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records a reload's result: an error is kept until that file parses again.
    pub(crate) fn reloaded(&self, file: &'static str, result: Result<(), String>) {
        let unix_ms = unix_ms_now();
        let mut kept = self.reload_error.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Err(message) => {
                *kept = Some(ReloadError {
                    file,
                    message,
                    unix_ms,
                })
            }
            // The other file's error stands until that file is fixed.
            Ok(()) if kept.as_ref().is_some_and(|e| e.file == file) => *kept = None,
            Ok(()) => {}
        }
    }

    /// Replaces the running snapshot if anything changed; restart-only keys (`RESTART_ONLY`)
    /// keep their running values. Returns whether a new snapshot went live.
    pub fn replace(&self, bootstrap: Bootstrap, policy: Policy) -> bool {
        self.apply(bootstrap, policy).0
    }

    /// Takes a new read of `file` (the other file's running config alongside): what may change
    /// goes live, and the restart-only keys it changes become the file's pending list.
    pub(crate) fn reload(&self, file: FileKind, bootstrap: Bootstrap, policy: Policy) -> Reloaded {
        let (went_live, held) = self.apply(bootstrap, policy);
        let held: Vec<String> = held
            .into_iter()
            .filter(|(kind, _)| *kind == file)
            .map(|(_, key)| key)
            .collect();
        let now = unix_ms_now();
        let mut pending = self
            .pending_restart
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (others, mine): (Vec<_>, Vec<_>) =
            pending.drain(..).partition(|p| p.file != file.as_str());
        *pending = others;
        pending.extend(held.iter().map(|key| {
            PendingRestart {
                key: key.clone(),
                file: file.as_str(),
                // Pending since the file first held a new value for it.
                since_unix_ms: mine
                    .iter()
                    .find(|p| &p.key == key)
                    .map_or(now, |p| p.since_unix_ms),
            }
        }));
        Reloaded { went_live, held }
    }

    /// Swaps in `bootstrap` and `policy` with the running restart-only values and the card's
    /// capabilities; returns whether anything went live, and the restart-only keys held back.
    fn apply(&self, bootstrap: Bootstrap, policy: Policy) -> (bool, Vec<(FileKind, String)>) {
        let old = self.current.load();
        let mut next = Snapshot::new(bootstrap, policy, old.generation + 1);
        let held = restart_only::hold(&old, &mut next);
        let capabilities = &mut next.bootstrap.agent.capabilities;
        strip_mcp(capabilities);
        merge_card(
            capabilities,
            &self.card.lock().unwrap_or_else(|p| p.into_inner()),
        );
        merge_mcp(
            capabilities,
            self.mcp.lock().unwrap_or_else(|p| p.into_inner()).as_ref(),
        );
        if next.bootstrap == old.bootstrap && next.policy == old.policy {
            return (false, held);
        }
        self.current.store(Arc::new(next));
        (true, held)
    }
}

/// What a reload of one file did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reloaded {
    /// A new snapshot went live.
    pub(crate) went_live: bool,
    /// The restart-only keys the file changed: they keep their running values.
    pub(crate) held: Vec<String>,
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl ConfigStore {
    /// Takes the capabilities of a new read of the agent's A2A card: the running bootstrap with
    /// them merged goes live like a reload. Returns whether anything changed.
    pub(crate) fn set_card_capabilities(&self, capabilities: Vec<Capability>) -> bool {
        *self.card.lock().unwrap_or_else(|p| p.into_inner()) = capabilities;
        let current = self.snapshot();
        self.replace(current.bootstrap.clone(), current.policy.clone())
    }
}

impl ConfigStore {
    /// Takes a new read of the local MCP server's tools as the capability `imported` (`None`:
    /// no import): merged like the card's. Returns whether anything changed.
    pub(crate) fn set_mcp_capability(&self, imported: Option<Capability>) -> bool {
        *self.mcp.lock().unwrap_or_else(|p| p.into_inner()) = imported;
        let current = self.snapshot();
        self.replace(current.bootstrap.clone(), current.policy.clone())
    }
}

/// Drops the last merge's MCP capability and the tools it gave a written one.
fn strip_mcp(capabilities: &mut Vec<Capability>) {
    capabilities.retain(|c| !c.mcp.as_ref().is_some_and(|m| m.imported));
    capabilities.iter_mut().for_each(|c| c.mcp = None);
}

/// Adds the MCP server's capability; a written (or card) capability of its name keeps its own
/// definition and gets the tools.
fn merge_mcp(capabilities: &mut Vec<Capability>, imported: Option<&Capability>) {
    let Some(imported) = imported else { return };
    let tools = imported.mcp.clone().unwrap_or_default();
    match capabilities.iter_mut().find(|c| c.name == imported.name) {
        Some(written) => {
            written.mcp = Some(McpTools {
                imported: false,
                ..tools
            })
        }
        None => capabilities.push(Capability {
            mcp: Some(McpTools {
                imported: true,
                ..tools
            }),
            ..imported.clone()
        }),
    }
}

/// Drops the card's capabilities from the last merge and adds the card's current ones; a
/// capability the file declares keeps the file's definition.
fn merge_card(capabilities: &mut Vec<Capability>, card: &[Capability]) {
    capabilities.retain(|c| c.card.is_none());
    let declared = capabilities.len();
    for cap in card {
        if !capabilities[..declared].iter().any(|c| c.name == cap.name) {
            capabilities.push(cap.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_endpoint_scheme_or_an_unreadable_ca_bundle_is_refused_with_its_line() {
        let target = |endpoint: &str, ca: &str| {
            format!("targets:\n  - name: llm\n    capability: llm\n    endpoints: [{endpoint}]\n    ca_file: {ca}\n")
        };
        let err = |text: &str| {
            parse_policy(Path::new("/nowhere/p.yaml"), text)
                .err()
                .map(|e| e.to_string())
        };
        let scheme = err(&target("ftp://x:21", "ca.pem")).unwrap_or_default();
        assert!(scheme.starts_with("/nowhere/p.yaml:4:"), "{scheme}");
        assert!(scheme.contains("scheme `ftp` is not supported"), "{scheme}");
        let missing = err(&target("https://x", "ca.pem")).unwrap_or_default();
        assert!(missing.starts_with("/nowhere/p.yaml:5:14: targets[`llm`].ca_file: cannot read the CA bundle `/nowhere/ca.pem`"), "{missing}");
        let dir = std::env::temp_dir().join(format!("reach-ca-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let junk = dir.join("junk.pem");
        let _ = std::fs::write(&junk, "not a certificate\n");
        let empty = err(&target("https://x", &junk.display().to_string())).unwrap_or_default();
        assert!(
            empty.contains(":5:14: targets[`llm`].ca_file: the CA bundle")
                && empty.contains("holds no certificate"),
            "{empty}"
        );
        let plain = err(&target("x:80", "ca.pem")).unwrap_or_default();
        assert!(plain.contains("no `https://` endpoint"), "{plain}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn model_budgets_steer_defaults_on_and_refuses_what_is_not_a_bool() {
        let parse = |text: &str| parse_policy(Path::new("p.yaml"), text);
        assert!(parse("{}").is_ok_and(|p| p.model_budgets.steer));
        assert!(parse("model_budgets: { steer: false }").is_ok_and(|p| !p.model_budgets.steer));
        let err = |text: &str| parse(text).err().map(|e| e.to_string()).unwrap_or_default();
        let not_bool = err("model_budgets:\n  steer: maybe\n");
        assert!(
            not_bool.starts_with("p.yaml:2:") && not_bool.contains("steer"),
            "{not_bool}"
        );
        let unknown = err("model_budgets: { steering: true }");
        assert!(unknown.contains("unknown field `steering`"), "{unknown}");
    }

    #[test]
    fn a_probe_that_could_never_be_sent_is_rejected_where_it_is_written() {
        let text = "agent:\n  name: a\n  address: 127.0.0.1:1\n  max_concurrency: 1\n  capabilities:\n    - name: c\n      probe: { path: review, headers: { bad header: x } }\n";
        let err = parse_bootstrap(Path::new("b.yaml"), text)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("b.yaml:7:22: agent.capabilities[0].probe.path: `review` is not a request path starting with `/`")
        );
    }

    #[test]
    fn a_capability_timeout_comes_from_its_expected_duration() {
        let text = "agent:\n  name: a\n  address: 127.0.0.1:1\n  max_concurrency: 1\n  capabilities:\n    - { name: codegen, expected_duration: 20s }\n    - { name: search, expected_duration: 2s, timeout: 5s }\n    - { name: other }\n";
        let bootstrap = parse_bootstrap(Path::new("b.yaml"), text);
        assert!(bootstrap.is_ok(), "{bootstrap:?}");
        let snapshot = bootstrap.map(|b| Snapshot::new(b, Policy::default(), 1));
        let timeout = |c: &str| {
            snapshot
                .as_ref()
                .map(|s| s.capability_timeout(Some(c)))
                .ok()
        };
        assert_eq!(
            timeout("codegen"),
            Some(std::time::Duration::from_secs(30)),
            "1.5 × 20 s"
        );
        assert_eq!(
            timeout("search"),
            Some(std::time::Duration::from_secs(5)),
            "explicit wins"
        );
        assert_eq!(
            timeout("other"),
            Some(std::time::Duration::from_secs(30)),
            "policy default"
        );
    }

    #[test]
    fn the_a2a_section_parses_and_is_checked_where_it_is_written() {
        let text = "agent:\n  name: a\n  address: 127.0.0.1:1\n  max_concurrency: 1\n  a2a: { proficiency: 0.7, tags: { sql: 0.9 }, refresh: 5s }\n";
        let bootstrap = parse_bootstrap(Path::new("b.yaml"), text);
        let a2a = bootstrap.ok().and_then(|b| b.agent.a2a);
        assert_eq!(
            a2a.as_ref().map(|a| a.card.as_str()),
            Some("/.well-known/agent-card.json")
        );
        assert_eq!(a2a.as_ref().map(|a| a.proficiency.get()), Some(0.7));
        let bad = text.replace("0.9", "1.5");
        let err = parse_bootstrap(Path::new("b.yaml"), &bad)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("agent.a2a.tags")),
            "{err:?}"
        );
    }

    /// Card capabilities survive a file reload, the file's own win, and a new card replaces the
    /// old card's set.
    #[test]
    fn card_capabilities_merge_into_every_snapshot() {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let file = Bootstrap::local("a", addr, &["explain"]).unwrap_or_else(|e| panic!("{e}"));
        let store = ConfigStore::new(file.clone(), Policy::default(), ConfigPaths::default());
        let from_card = |names: &[&str]| -> Vec<Capability> {
            let mut caps = Bootstrap::local("a", addr, names)
                .unwrap_or_else(|e| panic!("{e}"))
                .agent
                .capabilities;
            caps.iter_mut()
                .for_each(|c| c.card = Some(SkillFacts::default()));
            caps
        };
        let names = |store: &ConfigStore| -> Vec<(String, bool)> {
            let snapshot = store.snapshot();
            let caps = &snapshot.bootstrap.agent.capabilities;
            caps.iter()
                .map(|c| (c.name.to_string(), c.card.is_some()))
                .collect()
        };
        assert!(store.set_card_capabilities(from_card(&["explain", "sql-gen"])));
        let want = vec![("explain".to_owned(), false), ("sql-gen".to_owned(), true)];
        assert_eq!(names(&store), want);
        assert!(
            !store.replace(file.clone(), Policy::default()),
            "the same file: no change"
        );
        assert_eq!(names(&store), want);
        assert!(store.set_card_capabilities(from_card(&["chart"])));
        let want = vec![("explain".to_owned(), false), ("chart".to_owned(), true)];
        assert_eq!(names(&store), want);
    }

    /// The MCP server's tools: a capability of their own, or on the written one of its name;
    /// a file reload keeps them, a new read replaces them.
    #[test]
    fn mcp_tools_merge_into_every_snapshot() {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let file = Bootstrap::local("a", addr, &["explain"]).unwrap_or_else(|e| panic!("{e}"));
        let store = ConfigStore::new(file.clone(), Policy::default(), ConfigPaths::default());
        let imported = |name: &str, tools: &[&str]| {
            let mut cap = Capability::named(Name::sanitized(name, "mcp"));
            cap.mcp = Some(McpTools {
                imported: true,
                tools: tools
                    .iter()
                    .map(|t| ToolFacts {
                        name: (*t).to_owned(),
                        ..ToolFacts::default()
                    })
                    .collect(),
            });
            cap
        };
        let seen = |store: &ConfigStore| -> Vec<(String, usize)> {
            let snapshot = store.snapshot();
            let caps = &snapshot.bootstrap.agent.capabilities;
            caps.iter()
                .map(|c| {
                    let n = c.mcp.as_ref().map_or(0, |m| m.tools.len());
                    (c.name.to_string(), n)
                })
                .collect()
        };
        assert!(store.set_mcp_capability(Some(imported("mcp", &["search", "fetch"]))));
        assert_eq!(seen(&store), [("explain".into(), 0), ("mcp".into(), 2)]);
        assert!(!store.replace(file.clone(), Policy::default()));
        assert_eq!(seen(&store), [("explain".into(), 0), ("mcp".into(), 2)]);
        assert!(store.set_mcp_capability(Some(imported("explain", &["search"]))));
        assert_eq!(
            seen(&store),
            [("explain".into(), 1)],
            "the written one wins"
        );
        let written = store.snapshot().bootstrap.agent.capabilities[0].clone();
        assert!(written.mcp.is_some_and(|m| !m.imported));
        assert!(store.set_mcp_capability(None));
        assert_eq!(seen(&store), [("explain".into(), 0)]);
    }

    #[test]
    fn the_mcp_section_parses_and_is_checked_where_it_is_written() {
        let text = "agent:\n  name: a\n  address: 127.0.0.1:1\n  max_concurrency: 1\n  mcp: { path: /mcp, refresh: 60s }\n";
        let mcp = parse_bootstrap(Path::new("b.yaml"), text)
            .ok()
            .and_then(|b| b.agent.mcp);
        assert_eq!(mcp.as_ref().map(|m| m.path.as_str()), Some("/mcp"));
        assert_eq!(mcp.as_ref().map(|m| m.capability.as_str()), Some("mcp"));
        let bad = text.replace("60s", "1ms");
        let err = parse_bootstrap(Path::new("b.yaml"), &bad)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("b.yaml:5:") && e.contains("agent.mcp.refresh")),
            "{err:?}"
        );
    }

    /// A restart-only change stays pending (since its first reload) through other reloads and
    /// card changes, per file, and clears when the file goes back.
    #[test]
    fn pending_restart_keys_follow_their_file() {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let file = Bootstrap::local("a", addr, &["explain"]).unwrap_or_else(|e| panic!("{e}"));
        let store = ConfigStore::new(file.clone(), Policy::default(), ConfigPaths::default());
        let mut limited = file.clone();
        limited.limits.max_connections = 9;
        let reloaded = store.reload(FileKind::Bootstrap, limited.clone(), Policy::default());
        assert_eq!(
            reloaded,
            Reloaded {
                went_live: false,
                held: vec!["limits.max_connections".to_owned()]
            }
        );
        let pending = store.pending_restart();
        assert_eq!(pending.len(), 1);
        let since = pending[0].since_unix_ms;

        // A live change to the same file: it goes live, the key stays pending since then.
        let mut also = limited.clone();
        also.agent.zone = "z".to_owned();
        let reloaded = store.reload(FileKind::Bootstrap, also.clone(), Policy::default());
        assert!(reloaded.went_live);
        assert_eq!(store.snapshot().bootstrap.agent.zone, "z");
        assert_eq!(store.snapshot().bootstrap.limits.max_connections, 1_024);
        // The policy file and the card do not touch the bootstrap's pending keys.
        let running = store.snapshot().bootstrap.clone();
        let mut policy = Policy::default();
        policy.idempotency.max_keys = 5;
        let reloaded = store.reload(FileKind::Policy, running, policy);
        assert_eq!(reloaded.held, ["idempotency.max_keys"]);
        assert!(!store.set_card_capabilities(Vec::new()));
        let keys: Vec<(String, &str, bool)> = store
            .pending_restart()
            .into_iter()
            .map(|p| (p.key, p.file, p.since_unix_ms >= since))
            .collect();
        assert_eq!(
            keys,
            [
                ("limits.max_connections".to_owned(), "bootstrap", true),
                ("idempotency.max_keys".to_owned(), "policy", true)
            ]
        );
        assert_eq!(store.pending_restart()[0].since_unix_ms, since);

        // Back to the running value: no longer pending.
        let mut back = also;
        back.limits = file.limits.clone();
        let current = store.snapshot().policy.clone();
        assert!(store
            .reload(FileKind::Bootstrap, back, current)
            .held
            .is_empty());
        let keys: Vec<String> = store.pending_restart().into_iter().map(|p| p.key).collect();
        assert_eq!(keys, ["idempotency.max_keys"]);
    }

    #[test]
    fn the_example_policy_documents_the_defaults() {
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/policy.yaml"));
        let policy = load_policy(path);
        assert!(policy.is_ok(), "{policy:?}");
        assert_eq!(policy.ok(), Some(Policy::default()));
    }

    mod fuzz {
        use proptest::prelude::*;

        use super::*;

        fn example(name: &str) -> String {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("config")
                .join(name);
            std::fs::read_to_string(path).unwrap_or_default()
        }

        /// Parses `text` as both files: neither may panic, and an error must be `Invalid` with
        /// a position inside (or just past) the text.
        fn parses_or_points(text: &str) -> Result<(), TestCaseError> {
            let path = Path::new("f.yaml");
            let lines = text.lines().count() + 1;
            let results = [
                parse_bootstrap(path, text).map(|_| ()),
                parse_policy(path, text).map(|_| ()),
                detect_kind(path, text).map(|_| ()),
            ];
            for result in results {
                match result {
                    Ok(()) => {}
                    Err(ConfigError::Invalid { line, column, .. }) => {
                        prop_assert!(line >= 1 && column >= 1, "{line}:{column}");
                        prop_assert!(line <= lines, "line {line} of {lines}: {text:?}");
                    }
                    Err(err) => prop_assert!(false, "not a positioned error: {err}"),
                }
            }
            Ok(())
        }

        /// One edit to a document: what a bad merge, a truncated write or a typo does.
        #[derive(Clone, Debug)]
        enum Edit {
            Truncate(usize),
            Delete(usize, usize),
            Insert(usize, String),
            DuplicateLine(usize),
        }

        fn edit() -> impl Strategy<Value = Edit> {
            // YAML's meaningful bits, numbers that are not, and anything at all.
            let piece = prop_oneof![
                prop::sample::select(vec![
                    ":", "- ", "{", "}", "[", "]", "'", "\"", "#", " ", "\n", "\t", ",", "&a ",
                    "*a", "!!str ", "? ", "|", ">", "---\n", "...\n", ".nan", "-.inf", "1e999",
                    "-1", "0", "~", "null", "%", "@", "\u{feff}", "é",
                ])
                .prop_map(str::to_owned),
                any::<String>(),
            ];
            prop_oneof![
                any::<usize>().prop_map(Edit::Truncate),
                (any::<usize>(), 0usize..40).prop_map(|(at, n)| Edit::Delete(at, n)),
                (any::<usize>(), piece).prop_map(|(at, s)| Edit::Insert(at, s)),
                any::<usize>().prop_map(Edit::DuplicateLine),
            ]
        }

        /// The nearest char boundary at or before `at % (len + 1)`.
        fn boundary(text: &str, at: usize) -> usize {
            let mut at = at % (text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            at
        }

        fn apply(text: &str, edit: &Edit) -> String {
            match edit {
                Edit::Truncate(at) => text[..boundary(text, *at)].to_owned(),
                Edit::Delete(at, n) => {
                    let start = boundary(text, *at);
                    let end = boundary(text, start.saturating_add(*n).min(text.len()));
                    format!("{}{}", &text[..start], &text[end.max(start)..])
                }
                Edit::Insert(at, piece) => {
                    let at = boundary(text, *at);
                    format!("{}{piece}{}", &text[..at], &text[at..])
                }
                Edit::DuplicateLine(n) => {
                    let lines: Vec<&str> = text.lines().collect();
                    let n = n % lines.len().max(1);
                    let mut out: Vec<&str> = lines[..n.min(lines.len())].to_vec();
                    out.extend(lines.get(n));
                    out.extend(&lines[n.min(lines.len())..]);
                    out.join("\n")
                }
            }
        }

        proptest! {
            #[test]
            fn arbitrary_text_never_panics(text in any::<String>()) {
                parses_or_points(&text)?;
            }

            #[test]
            fn yaml_shaped_text_never_panics(
                text in "([a-z_]{1,12}|  |- |: |\\{|\\}|\\[|\\]|, |#|\n|'|\"|[0-9.]{1,6}|\\.nan|~|&a|\\*a){0,40}"
            ) {
                parses_or_points(&text)?;
            }

            #[test]
            fn edited_examples_parse_or_point_at_the_error(
                file in prop::sample::select(vec!["agent-reach.yaml", "policy.yaml"]),
                edits in prop::collection::vec(edit(), 1..4),
            ) {
                let mut text = example(file);
                for e in &edits {
                    text = apply(&text, e);
                }
                parses_or_points(&text)?;
            }
        }
    }

    /// The bootstrap's text with one capability whose `output_schema` is `schema` (YAML).
    fn bootstrap(schema: &str) -> String {
        format!("agent:\n  name: a\n  address: 127.0.0.1:1\n  max_concurrency: 1\n  capabilities:\n    - name: sql\n      output_schema: {schema}\n")
    }

    fn digest_of(b: &Bootstrap) -> Option<SchemaDigest> {
        let schema = b.agent.capabilities.first()?.output_schema.as_ref()?;
        schema.compiled().map(|c| c.digest())
    }

    #[test]
    fn an_inline_schema_is_compiled_at_load() {
        let text = bootstrap("{ type: object, required: [ok] }");
        let parsed = parse_bootstrap(Path::new("b.yaml"), &text);
        assert!(
            parsed.as_ref().is_ok_and(|b| digest_of(b).is_some()),
            "{parsed:?}"
        );
    }

    #[test]
    fn a_bad_schema_is_refused_where_it_is_written() {
        let text = bootstrap("{ type: 12 }");
        let err = parse_bootstrap(Path::new("b.yaml"), &text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.starts_with(
                "b.yaml:6:7: agent.capabilities[0]: output_schema: not a valid JSON Schema: "
            ),
            "{err}"
        );
    }

    #[test]
    fn a_schema_file_is_read_beside_the_bootstrap() {
        let dir = std::env::temp_dir().join(format!("reach-schema-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            dir.join("sql.yaml"),
            "type: object\nrequired: [ok]\nproperties: { ok: { type: boolean } }\n",
        );
        let _ = std::fs::write(dir.join("broken.json"), "{\"type\": \"nope\"}");
        let text = bootstrap("sql.yaml");
        let parsed = parse_bootstrap(&dir.join("agent-reach.yaml"), &text);
        let inline = parse_bootstrap(
            Path::new("b.yaml"),
            &bootstrap("{type: object, required: [ok], properties: {ok: {type: boolean}}}"),
        );
        assert!(
            parsed.as_ref().is_ok_and(|b| digest_of(b).is_some()),
            "{parsed:?}"
        );
        assert_eq!(
            parsed.ok().and_then(|b| digest_of(&b)),
            inline.ok().and_then(|b| digest_of(&b)),
            "the same schema, from a file or inline, has one digest"
        );
        for (name, why) in [
            ("missing.json", "cannot read"),
            ("broken.json", "not a valid JSON Schema"),
        ] {
            let err = parse_bootstrap(&dir.join("agent-reach.yaml"), &bootstrap(name))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains(":7:22: agent.capabilities[`sql`].output_schema"),
                "{err}"
            );
            assert!(err.contains(why), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_example_bootstrap_parses_to_the_same_value_twice() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/agent-reach.yaml"
        ));
        let a = load_bootstrap(path);
        let b = load_bootstrap(path);
        assert!(a.is_ok(), "{a:?}");
        assert_eq!(a.ok(), b.ok());
    }

    #[test]
    fn affinity_is_set_per_capability_and_bounded_where_it_is_written() {
        let text = "affinity: { max_entries: 10, idle_timeout: 5m }\ncapabilities:\n  chat: { affinity: fallback, protocol: a2a }\n";
        let policy = parse_policy(Path::new("p.yaml"), text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.affinity.max_entries, 10);
        assert_eq!(policy.affinity.idle_timeout, HumanDuration::from_secs(300));
        let chat = &policy.capabilities["chat"];
        assert_eq!(chat.affinity, AffinityMode::Fallback);
        assert_eq!(chat.protocol, Some(Protocol::A2a));
        let err = parse_policy(Path::new("p.yaml"), "affinity: { max_entries: 0 }\n").err();
        assert!(err.is_some_and(|e| e.to_string().contains("affinity.max_entries")));
    }

    #[test]
    fn the_peer_protocol_is_http1_unless_set_and_nothing_else_passes() {
        let parse = |text: &str| parse_policy(Path::new("p.yaml"), text);
        let default = parse("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(default.pool.peer_protocol, PeerProtocol::Http1);
        let h2 = parse("pool: { peer_protocol: http2 }\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h2.pool.peer_protocol, PeerProtocol::Http2);
        let err = parse("pool:\n  peer_protocol: h3\n")
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("p.yaml:2") && e.contains("http2")),
            "{err:?}"
        );
    }
}
