//! Async tasks: where the bootstrap keeps them (per pod, restart-only) and the policy's final
//! fallback, escalation and callbacks (per fleet, reloaded live). `docs/tasks.md`.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use super::duration::HumanDuration;

/// Bootstrap `tasks`: the durable store of `prefer: respond-async` calls. Exactly one of `path`
/// (the embedded single-file store) and `store` (a shared Redis) is set.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TasksConfig {
    /// The embedded store's file, relative to the bootstrap file when relative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// A shared store, `redis://host:6379/0`: replicas of one caller share its tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The name of an environment variable holding `store` instead (the injector sets it from
    /// a Secret, so a password is never written in the pod's spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_from_env: Option<String>,
    /// The Redis key prefix; default `agent-reach:tasks:<workload>` (`AGENT_REACH_WORKLOAD`,
    /// which the injector sets from the pod's app label, else the agent name), so the replicas
    /// of one caller share a queue and other agents do not see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// How long a claimed task stays its runner's without a renewal: after it, another replica
    /// (or this one after a restart) takes the task over.
    #[serde(default = "default_lease")]
    pub lease: HumanDuration,
    /// Tasks run at once by this sidecar.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// The largest request body a task may carry (it is stored).
    #[serde(default = "default_max_payload")]
    pub max_payload_bytes: usize,
    /// The agent's response body is kept up to this size; a longer one is cut and marked.
    #[serde(default = "default_max_response")]
    pub max_response_bytes: usize,
    /// Finished tasks are kept this long, then removed.
    #[serde(default = "default_retention")]
    pub retention: HumanDuration,
    /// How long a task waits for an agent to serve its capability (none known yet — a sidecar
    /// just started, gossip still joining — or every one out of rotation: draining,
    /// unreachable) before its `final_fallback` applies. Waiting is not a failed round.
    #[serde(default = "default_max_wait")]
    pub max_wait: HumanDuration,
    /// The most tasks kept (finished ones included, until `retention` removes them): beyond
    /// it a submission is answered `503 task_store_full` with `retry-after`.
    #[serde(default = "default_max_tasks")]
    pub max_tasks: u64,
    /// The most bytes of stored task documents: beyond it, as for `max_tasks`.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
}

fn default_lease() -> HumanDuration {
    HumanDuration::from_secs(30)
}
fn default_workers() -> usize {
    4
}
fn default_max_payload() -> usize {
    1 << 20
}
fn default_max_response() -> usize {
    1 << 20
}
fn default_retention() -> HumanDuration {
    HumanDuration::from_secs(24 * 3600)
}
fn default_max_wait() -> HumanDuration {
    HumanDuration::from_secs(3600)
}
/// Sized so that a full store stays a small file; the embedded store's memory does not grow
/// with it (its page cache is bounded, `store/file.rs`).
fn default_max_tasks() -> u64 {
    100_000
}
fn default_max_bytes() -> u64 {
    256 << 20
}

impl TasksConfig {
    /// The embedded store at `path`, every other setting at its default.
    pub fn file(path: PathBuf) -> Self {
        Self {
            path: Some(path),
            store: None,
            store_from_env: None,
            prefix: None,
            lease: default_lease(),
            workers: default_workers(),
            max_payload_bytes: default_max_payload(),
            max_response_bytes: default_max_response(),
            retention: default_retention(),
            max_wait: default_max_wait(),
            max_tasks: default_max_tasks(),
            max_bytes: default_max_bytes(),
        }
    }

    /// The same, its file path taken relative to `base` (the bootstrap's directory).
    pub(crate) fn resolved(&self, base: Option<&Path>) -> Self {
        let mut out = self.clone();
        if let (Some(dir), Some(path)) = (base, &self.path) {
            if path.is_relative() {
                out.path = Some(dir.join(path));
            }
        }
        out
    }

    /// Where the tasks are kept, or why the section is wrong.
    pub(crate) fn location(&self) -> Result<StoreLocation, String> {
        let from_env = match &self.store_from_env {
            Some(_) if self.store.is_some() => {
                return Err("tasks: set `store` or `store_from_env`, not both".to_owned())
            }
            Some(var) => Some(
                std::env::var(var)
                    .map_err(|_| format!("tasks.store_from_env: ${var} is not set"))?,
            ),
            None => None,
        };
        match (&self.path, from_env.as_ref().or(self.store.as_ref())) {
            (Some(path), None) => Ok(StoreLocation::File(path.clone())),
            (None, Some(url)) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                Ok(StoreLocation::Redis(url.clone()))
            }
            // Not echoed: the URL may carry a password.
            (None, Some(_)) => Err("tasks.store is not a redis:// or rediss:// URL".to_owned()),
            (Some(_), Some(_)) => {
                Err("tasks: set `path` (embedded store) or `store` (Redis), not both".to_owned())
            }
            (None, None) => Err("tasks: set `path` (embedded store) or `store` (Redis)".to_owned()),
        }
    }
}

/// Where a sidecar's tasks live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoreLocation {
    File(PathBuf),
    Redis(String),
}

/// Policy `retry.fallback.queue`: the whole chain again later, `delay` doubling up to
/// `max_delay`, `max_rounds` times.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueRounds {
    pub delay: HumanDuration,
    pub max_delay: HumanDuration,
    pub max_rounds: u32,
}

impl Default for QueueRounds {
    fn default() -> Self {
        Self {
            delay: HumanDuration::from_secs(30),
            max_delay: HumanDuration::from_secs(600),
            max_rounds: 5,
        }
    }
}

impl QueueRounds {
    /// The pause before round `round` (1-based: the first repeat waits `delay`).
    pub(crate) fn delay_before(&self, round: u32) -> std::time::Duration {
        let doublings = round.saturating_sub(1).min(20);
        self.delay
            .get()
            .saturating_mul(1 << doublings)
            .min(self.max_delay.get())
    }
}

/// Policy `escalation`: where a task goes when every agent failed it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EscalationPolicy {
    /// The webhook a person's tooling listens on (JSON POST). Without it, escalated tasks wait
    /// for `agent-reach tasks` alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// The HMAC-SHA256 key that signs each POST (`reach-signature: sha256=<hex>`); relative to
    /// the policy file. Re-read at every delivery, so a rotated key applies at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The task's payload is sent up to this size (a longer one is cut and marked).
    pub max_payload_bytes: usize,
}

impl EscalationPolicy {
    /// The key file, a relative path taken from `policy_dir` (the policy file's directory).
    pub(crate) fn key_path(&self, policy_dir: Option<&Path>) -> Option<PathBuf> {
        let key = self.key_file.as_ref()?;
        Some(match policy_dir {
            Some(dir) if key.is_relative() => dir.join(key),
            _ => key.clone(),
        })
    }
}

impl Default for EscalationPolicy {
    fn default() -> Self {
        Self {
            webhook: None,
            key_file: None,
            max_payload_bytes: 64 * 1024,
        }
    }
}

/// Policy `callbacks`: where a task's `reach-callback` may point, and how long its delivery is
/// tried. Empty by default: a callback is refused until an operator lists its host.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CallbacksPolicy {
    /// `hooks.example.com` (any port), `10.0.0.5:9000` (that IP and port), `*.example.org` (its
    /// subdomains, not itself). Link-local and unspecified addresses, userinfo and this
    /// sidecar's own listener ports are refused whatever is listed.
    pub allow_hosts: Vec<CallbackHost>,
    /// A delivery with no 2xx this long after its first try is given up.
    pub give_up_after: HumanDuration,
    /// ... or after this many tries, whichever comes first.
    pub max_tries: u32,
}

impl Default for CallbacksPolicy {
    fn default() -> Self {
        Self {
            allow_hosts: Vec::new(),
            give_up_after: HumanDuration::from_secs(3600),
            max_tries: 20,
        }
    }
}

impl CallbacksPolicy {
    /// Whether some entry of `allow_hosts` admits `host` on `port`.
    pub(crate) fn allows(&self, host: &Host, port: u16) -> bool {
        self.allow_hosts
            .iter()
            .any(|entry| entry.matches(host, port))
    }
}

/// One `callbacks.allow_hosts` entry, kept as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallbackHost {
    text: String,
    pattern: HostPattern,
    port: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPattern {
    /// That name, or that IP and no other (not its IPv4-mapped form either).
    Exact(Host),
    /// `*.<domain>`: a name with at least one label before `<domain>`.
    Subdomains(String),
}

impl CallbackHost {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "`{text}` is not a callback host ({why}): write `name`, `name:port`, `*.domain`, `ip` or `ip:port`"
            )
        };
        let t = text.trim();
        if t.is_empty()
            || t.contains("://")
            || t.contains(['/', '@', '?', '#'])
            || t.contains(char::is_whitespace)
        {
            return Err(bad("a host, not a URL"));
        }
        let (wildcard, rest) = match t.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, t),
        };
        let (host, port) = split_port(rest).ok_or_else(|| bad("the port is 1 to 65535"))?;
        let host = Host::parse(host).map_err(|e: String| bad(&e))?;
        let pattern = match (wildcard, host) {
            (false, host) => HostPattern::Exact(host),
            (true, Host::Name(domain)) => HostPattern::Subdomains(domain),
            (true, Host::Ip(_)) => return Err(bad("a wildcard takes a domain, not an IP")),
        };
        Ok(Self {
            text: t.to_owned(),
            pattern,
            port,
        })
    }

    fn matches(&self, host: &Host, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.pattern, host) {
            (HostPattern::Exact(entry), host) => entry == host,
            (HostPattern::Subdomains(domain), Host::Name(name)) => name
                .strip_suffix(domain.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
            (HostPattern::Subdomains(_), Host::Ip(_)) => false,
        }
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address (no port); `None` for a bad
/// port.
fn split_port(text: &str) -> Option<(&str, Option<u16>)> {
    let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0);
    if text.starts_with('[') {
        let end = text.find(']')?;
        let (host, after) = text.split_at(end + 1);
        return match after.strip_prefix(':') {
            Some(p) => Some((host, Some(port(p)?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    if text.matches(':').count() > 1 {
        return Some((text, None));
    }
    match text.rsplit_once(':') {
        Some((host, p)) => Some((host, Some(port(p)?))),
        None => Some((text, None)),
    }
}

impl std::str::FromStr for CallbackHost {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl fmt::Display for CallbackHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for CallbackHost {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for CallbackHost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checked inside the visitor, so the error points at the entry (line and column).
        struct Visit;
        impl de::Visitor<'_> for Visit {
            type Value = CallbackHost;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a callback host")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CallbackHost, E> {
                CallbackHost::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(Visit)
    }
}

/// A callback's host: an IP address as written, or a lowercase DNS name without its trailing
/// dot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Host {
    Ip(IpAddr),
    Name(String),
}

impl Host {
    /// `raw` as a URL or a config entry writes it (`[::1]` or `::1`, `Hooks.Example.com.`).
    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{raw}` is not a host name or an IP address: {why}");
        if let Some(inner) = raw.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            return inner
                .parse::<Ipv6Addr>()
                .map(|ip| Host::Ip(IpAddr::V6(ip)))
                .map_err(|_| bad("not an IPv6 address"));
        }
        if let Ok(ip) = raw.parse::<IpAddr>() {
            return Ok(Host::Ip(ip));
        }
        let name = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
        if name.is_empty() || name.len() > 253 {
            return Err(bad("empty or too long"));
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name.split('.').all(label_ok) {
            return Err(bad("use letters, digits, `-` and `.`"));
        }
        // `127.1`, `2852039166`, `0xa9fea9fe`: resolvers read these as IPv4 addresses, so as names
        // they would slip past the address checks.
        let last = name.rsplit('.').next().unwrap_or_default();
        let numeric = last.bytes().all(|b| b.is_ascii_digit())
            || last
                .strip_prefix("0x")
                .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        if numeric {
            return Err(bad(
                "a numeric host must be a dotted IPv4 address (a.b.c.d)",
            ));
        }
        Ok(Host::Name(name))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
            Host::Name(name) => f.write_str(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_host_entries_parse_strictly() {
        for ok in [
            "hooks.example.com",
            "hooks.example.com:8443",
            "*.example.org",
            "10.0.0.5",
            "10.0.0.5:9000",
            "fd00::7",
            "[fd00::7]:9000",
        ] {
            assert_eq!(
                CallbackHost::parse(ok).map(|h| h.to_string()),
                Ok(ok.into())
            );
        }
        for bad in [
            "",
            "*",
            "https://hooks.example.com",
            "hooks.example.com/path",
            "u:p@hooks.example.com",
            "hooks.example.com:0",
            "hooks.example.com:99999",
            "*.10.0.0.5",
            "a b",
            "127.1",
        ] {
            assert!(CallbackHost::parse(bad).is_err(), "{bad}");
        }
    }
}
