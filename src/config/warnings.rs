//! What `agent-reach check` warns of when it reads a bootstrap and a policy together: settings
//! each valid alone that weaken what the pair promises (`docs/mtls.md`).

use super::{Bootstrap, Capability, MtlsMode, Policy};

/// What `agent-reach check` warns of in a bootstrap under a policy: static peers a `strict` caller
/// can check only as "some workload of the trust domain" (they name no `identity`), and
/// capabilities that share a path but not an allow list (the path decides; see
/// `inbound::authorize`).
pub fn warnings(bootstrap: &Bootstrap, policy: &Policy) -> Vec<String> {
    let mut out = Vec::new();
    let strict = policy.mtls.mode == Some(MtlsMode::Strict);
    let unnamed: Vec<&str> = bootstrap
        .peers
        .iter()
        .filter(|p| p.identity.is_none())
        .map(|p| p.name.as_str())
        .collect();
    if strict && !unnamed.is_empty() {
        out.push(format!(
            "mtls mode is strict and static peer(s) {} name no `identity`: they are called over TLS and accepted as any workload of the trust domain; set `peers[].identity` to check who they are",
            unnamed.join(", ")
        ));
    }
    let caps = &bootstrap.agent.capabilities;
    for (i, a) in caps.iter().enumerate() {
        for b in &caps[i + 1..] {
            let shared = a.paths.iter().find(|p| b.paths.contains(p));
            let rule = |c: &Capability| policy.authorization.capabilities.get(c.name.as_str());
            if let Some(path) = shared {
                if rule(a) != rule(b) {
                    out.push(format!(
                        "capabilities `{}` and `{}` share path `{path}` but not an allow list: a caller allowed either reaches what both serve there",
                        a.name, b.name
                    ));
                }
            }
        }
    }
    out
}

/// What `agent-reach check` warns of in a policy alone: a capability whose callers are listed
/// but whose servers are not — any member may claim to serve it and receive its calls.
pub fn policy_warnings(policy: &Policy) -> Vec<String> {
    policy
        .authorization
        .capabilities
        .iter()
        .filter(|(_, rule)| rule.allow.is_some() && rule.served_by.is_none())
        .map(|(name, _)| {
            format!(
                "capability `{name}` has an `allow` list but no `served_by`: any member of the mesh may claim to serve it and receive its calls (docs/security.md)"
            )
        })
        .collect()
}
