//! Mutual TLS and authorization settings: the bootstrap's certificate files (per pod) and the
//! policy's mode and per-capability allow lists (per fleet, reloaded live). `docs/mtls.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::identity::{IdentityPattern, SpiffeId};

/// Bootstrap `tls`: where this sidecar's certificate, key and trust bundle are. Relative paths
/// are relative to the bootstrap file. Re-read when they change.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// PEM chain, leaf first; its URI SAN is this workload's SPIFFE ID.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// PEM trust bundle: the CAs peers' certificates must chain to.
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The three paths, relative ones taken from `base` (the bootstrap's directory).
    pub fn resolved(&self, base: Option<&Path>) -> Self {
        let at = |p: &PathBuf| match base {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p.clone(),
        };
        Self {
            cert: at(&self.cert),
            key: at(&self.key),
            ca: at(&self.ca),
        }
    }
}

/// Policy `mtls`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MtlsPolicy {
    /// Unset: `permissive` where the bootstrap has `tls`, `disabled` where it has not.
    pub mode: Option<MtlsMode>,
    /// A mode per intercepted agent port (Istio's port-level mTLS), for connections `init-net`
    /// redirected from that port: `{8080: permissive}` keeps serving plaintext clients of the
    /// agent's port under a `strict` fleet. Ports the bootstrap does not intercept never match.
    /// A key may be quoted (`"8080"`, as Helm's `toYaml` writes it).
    #[serde(deserialize_with = "port_modes")]
    pub ports: BTreeMap<u16, MtlsMode>,
}

/// `mtls.ports`, its keys numbers or numeric strings.
fn port_modes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<u16, MtlsMode>, D::Error> {
    #[derive(Deserialize, PartialEq, Eq, PartialOrd, Ord)]
    #[serde(untagged)]
    enum Key {
        Number(u16),
        Text(String),
    }
    let raw = BTreeMap::<Key, MtlsMode>::deserialize(d)?;
    raw.into_iter()
        .map(|(key, mode)| match key {
            Key::Number(port) => Ok((port, mode)),
            Key::Text(text) => text
                .trim()
                .parse::<u16>()
                .map(|port| (port, mode))
                .map_err(|_| serde::de::Error::custom(format!("`{text}` is not a port"))),
        })
        .collect()
}

/// What the inbound listener accepts and what the caller speaks to peers.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MtlsMode {
    /// TLS with a verified client certificate only; peers are called over TLS only.
    Strict,
    /// TLS or plaintext accepted (a migration); peers that present an identity are called over
    /// TLS, the others in plaintext.
    Permissive,
    /// Plaintext both ways.
    Disabled,
}

impl MtlsMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Strict => "strict",
            Self::Permissive => "permissive",
            Self::Disabled => "disabled",
        }
    }
}

/// Policy `authorization`: which callers may call which of this fleet's capabilities.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Authorization {
    /// For a capability with no entry below (and for plain traffic naming no capability).
    pub default: Verdict,
    pub capabilities: BTreeMap<String, CapabilityAuthorization>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CapabilityAuthorization {
    /// Caller identities allowed; anyone else (a plaintext caller included) is refused. Unset:
    /// callers are judged by `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<IdentityPattern>>,
    /// The identities whose sidecars may serve it: a caller routes it only to a peer whose
    /// certificate says one of them, whatever other members claim (`docs/security.md`). Unset:
    /// any member may serve it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_by: Option<Vec<IdentityPattern>>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    #[default]
    Allow,
    Deny,
}

impl Authorization {
    /// Whether `caller` (none: it presented no certificate) may call `capability` (none: plain
    /// traffic).
    pub(crate) fn allows(&self, capability: Option<&str>, caller: Option<&SpiffeId>) -> bool {
        match capability
            .and_then(|c| self.capabilities.get(c))
            .and_then(|rule| rule.allow.as_ref())
        {
            Some(allow) => caller.is_some_and(|id| allow.iter().any(|p| p.matches(id))),
            None => self.default == Verdict::Allow,
        }
    }

    /// The identities that may serve `capability`, when the policy names them.
    pub(crate) fn served_by(&self, capability: &str) -> Option<&[IdentityPattern]> {
        self.capabilities.get(capability)?.served_by.as_deref()
    }

    /// Whether a peer whose verified identity is `server` (none: it has no certificate, or is
    /// reached in plaintext) may serve `capability`.
    pub fn may_serve(&self, capability: &str, server: Option<&SpiffeId>) -> bool {
        match self.served_by(capability) {
            Some(list) => server.is_some_and(|id| list.iter().any(|p| p.matches(id))),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_capabilities_need_a_matching_identity_and_the_rest_follow_the_default() {
        let yaml = "authorization:\n  default: deny\n  capabilities:\n    payments:\n      allow: [\"spiffe://prod.example/ns/billing/sa/*\"]\n";
        let policy = super::super::parse_policy(Path::new("p.yaml"), yaml);
        assert!(policy.is_ok(), "{policy:?}");
        let authz = policy.map(|p| p.authorization).unwrap_or_default();
        let billing = SpiffeId::parse("spiffe://prod.example/ns/billing/sa/api").ok();
        let coder = SpiffeId::parse("spiffe://prod.example/ns/dev/sa/coder").ok();
        assert!(authz.allows(Some("payments"), billing.as_ref()));
        assert!(!authz.allows(Some("payments"), coder.as_ref()));
        assert!(!authz.allows(Some("payments"), None), "plaintext is nobody");
        assert!(
            !authz.allows(Some("search"), billing.as_ref()),
            "default deny"
        );
        assert!(Authorization::default().allows(Some("search"), None));
    }

    #[test]
    fn served_by_names_who_may_serve_and_leaves_callers_to_the_default() {
        let yaml = "authorization:\n  default: allow\n  capabilities:\n    payments:\n      served_by: [\"spiffe://prod.example/ns/billing/sa/payee\"]\n";
        let authz = super::super::parse_policy(Path::new("p.yaml"), yaml)
            .map(|p| p.authorization)
            .unwrap_or_else(|e| panic!("{e}"));
        let payee = SpiffeId::parse("spiffe://prod.example/ns/billing/sa/payee").ok();
        let mallory = SpiffeId::parse("spiffe://prod.example/ns/dev/sa/mallory").ok();
        assert!(authz.may_serve("payments", payee.as_ref()));
        assert!(!authz.may_serve("payments", mallory.as_ref()));
        assert!(
            !authz.may_serve("payments", None),
            "plaintext serves nothing listed"
        );
        assert!(authz.may_serve("search", None), "no served_by: anyone");
        assert!(
            authz.allows(Some("payments"), None),
            "no allow list: the default judges callers"
        );
    }
}
