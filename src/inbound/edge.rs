//! The inbound edge: what a request from outside may carry in. `reach-*` headers are the
//! sidecar's to set — a caller cannot name itself, set the agent's deadline format or smuggle
//! routing hints to the agent — so every one is dropped and the sidecar writes back only what
//! it vouches for, after hop-by-hop stripping (so `Connection: reach-…` cannot remove them).

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, Request};

use crate::config::{Capability, Snapshot};
use crate::error::ReachError;
use crate::http::deadline::{self, Deadline};
use crate::http::headers;
use crate::identity::SpiffeId;
use crate::registry::Registry;

/// The headers the sidecar re-adds once the caller's `reach-*` headers are gone.
#[derive(Debug)]
pub(super) struct Vouched<'a> {
    pub(super) capability: Option<&'a str>,
    pub(super) deadline: Option<Deadline>,
    /// A caller name the sidecar could check (see [`verified_caller`], [`caller_named_by`]).
    pub(super) caller: Option<String>,
    /// The caller's SPIFFE ID, from the certificate it presented.
    pub(super) identity: Option<&'a SpiffeId>,
    pub(super) attempt: Option<u16>,
}

/// Strips hop-by-hop and every `reach-*` header, then writes back what is vouched for. A header
/// that already holds exactly the vouched value stays where it is (a peer sidecar's request
/// carries the same four): no rehashing and no allocation on the common path.
pub(super) fn rewrite(headers: &mut HeaderMap, vouched: Vouched<'_>) {
    headers::strip_hop_by_hop(headers);
    let mut unvouched: Vec<HeaderName> = Vec::new();
    for (name, value) in headers.iter() {
        if !name.as_str().starts_with("reach-") {
            continue;
        }
        let keep = match name.as_str() {
            "reach-capability" => vouched.capability.is_some_and(|c| value == c),
            "reach-deadline" => vouched.deadline.is_some_and(|d| d.is(value)),
            "reach-caller" => vouched.caller.as_deref().is_some_and(|c| value == c),
            "reach-caller-identity" => vouched.identity.is_some_and(|i| value == i.as_str()),
            "reach-attempt" => vouched.attempt.is_some_and(|a| {
                value.to_str().ok().and_then(|v| v.trim().parse().ok()) == Some(a)
            }),
            _ => false,
        };
        if !keep {
            unvouched.push(name.clone());
        }
    }
    for name in unvouched {
        headers.remove(name);
    }
    if let Some(capability) = vouched.capability {
        if !headers.contains_key(headers::CAPABILITY) {
            headers.insert(headers::CAPABILITY, headers::value(capability));
        }
    }
    if let Some(deadline) = vouched.deadline {
        if !headers.contains_key(deadline::DEADLINE) {
            headers.insert(deadline::DEADLINE, deadline.header_value());
        }
    }
    if let Some(caller) = vouched.caller {
        if !headers.contains_key(headers::CALLER) {
            headers.insert(headers::CALLER, headers::value(&caller));
        }
    }
    if let Some(identity) = vouched.identity {
        if !headers.contains_key(headers::CALLER_IDENTITY) {
            headers.insert(headers::CALLER_IDENTITY, headers::value(identity.as_str()));
        }
    }
    if let Some(attempt) = vouched.attempt {
        if !headers.contains_key(headers::ATTEMPT) {
            headers.insert(headers::ATTEMPT, attempt.into());
        }
    }
}

/// The caller's name as its sidecar sent it, kept only when it is a peer this sidecar knows and
/// the connection comes from that peer's address. Not authentication — anything on that host can
/// claim it — but a stranger on the network can no longer name itself anybody; mutual TLS is
/// what will make it an identity.
pub(super) fn verified_caller<B>(
    req: &Request<B>,
    remote: SocketAddr,
    registry: &Registry,
    snapshot: &Snapshot,
) -> Option<String> {
    let claimed = req.headers().get(headers::CALLER)?.to_str().ok()?.trim();
    let peer = registry.find(snapshot, claimed)?;
    let host = peer
        .address
        .rsplit_once(':')
        .map_or(peer.address.as_str(), |(h, _)| h);
    let ip: IpAddr = host.trim_matches(['[', ']']).parse().ok()?;
    // A dual-stack listener sees IPv4 peers as `::ffff:a.b.c.d`.
    (ip.to_canonical() == remote.ip().to_canonical()).then(|| peer.name.clone())
}

/// The caller's name when its certificate proved `identity`: the member it claims to be if that
/// member announced this identity, else a member with this identity at the connection's
/// address, else the identity's last segment (the service account). Never a name the
/// certificate does not back.
pub(super) fn caller_named_by<B>(
    req: &Request<B>,
    identity: &SpiffeId,
    remote: Option<SocketAddr>,
    registry: &Registry,
    snapshot: &Snapshot,
) -> String {
    let claimed = req
        .headers()
        .get(headers::CALLER)
        .and_then(|v| v.to_str().ok())
        .and_then(|name| registry.find(snapshot, name.trim()));
    if let Some(peer) = claimed.filter(|p| p.identity.as_ref() == Some(identity)) {
        return peer.name.clone();
    }
    let at_address = |p: &crate::registry::Peer| {
        let host = p
            .address
            .rsplit_once(':')
            .map_or(p.address.as_str(), |(h, _)| h);
        let ip: Option<IpAddr> = host.trim_matches(['[', ']']).parse().ok();
        ip.zip(remote)
            .is_some_and(|(ip, r)| ip.to_canonical() == r.ip().to_canonical())
    };
    registry
        .find_where(snapshot, |p| {
            p.identity.as_ref() == Some(identity) && at_address(p)
        })
        .map_or_else(|| identity.leaf().to_owned(), |p| p.name.clone())
}

/// `reach-attempt` as a small number, or nothing.
pub(super) fn attempt_of(headers: &HeaderMap) -> Option<u16> {
    headers
        .get(headers::ATTEMPT)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Refuses a call for `capability` to a path outside the prefixes it declares. Where paths are
/// declared, a path the agent might read differently than we do is refused too.
/// The capability an intercepted call (which names none: its client knows nothing of the mesh)
/// is measured as: the first whose `paths` cover the request's path, else the first that
/// declares no paths (it serves everything), else none (plain traffic, label `other`).
pub(super) fn capability_by_path<'c>(
    capabilities: &'c [Capability],
    path: &str,
) -> Option<&'c str> {
    capabilities
        .iter()
        .find(|c| c.paths.iter().any(|p| path_has_prefix(path, p)))
        .or_else(|| capabilities.iter().find(|c| c.paths.is_empty()))
        .map(|c| c.name.as_str())
}

pub(super) fn check_path(
    snapshot: &Snapshot,
    capability: Option<&str>,
    path: &str,
) -> Result<(), ReachError> {
    let agent = &snapshot.bootstrap.agent;
    let declared: Vec<&[String]> = match capability.and_then(|c| agent.capability(c)) {
        Some(cap) => vec![&cap.paths],
        // Plain traffic (no capability named) may reach what some capability serves.
        None => agent
            .capabilities
            .iter()
            .map(|c| c.paths.as_slice())
            .collect(),
    };
    if declared.is_empty() || declared.iter().any(|paths| paths.is_empty()) {
        return Ok(());
    }
    refuse_ambiguous(path)?;
    if declared
        .iter()
        .any(|paths| paths.iter().any(|p| path_has_prefix(path, p)))
    {
        return Ok(());
    }
    Err(ReachError::UnknownPath {
        capability: capability.unwrap_or("-").to_owned(),
        path: path.to_owned(),
    })
}

/// Refuses a path whose meaning depends on who reads it: dot segments (`/review/../admin`, also
/// percent-encoded or `..;` as some servers read it), encoded slashes and backslashes. The
/// agent might resolve them to a path the capability does not serve.
fn refuse_ambiguous(path: &str) -> Result<(), ReachError> {
    let lower = path.to_ascii_lowercase();
    let decoded = lower.replace("%2e", ".");
    let dot_segment = decoded
        .split('/')
        .map(|segment| segment.split(';').next().unwrap_or(segment))
        .any(|segment| segment == "." || segment == "..");
    let hidden_separator = ["%2f", "%5c", "\\"].iter().any(|s| lower.contains(s));
    if dot_segment || hidden_separator {
        return Err(ReachError::BadRequest(format!(
            "the path `{path}` has dot segments or encoded separators"
        )));
    }
    Ok(())
}

/// `/review` covers `/review` and `/review/…`, not `/reviewer`.
fn path_has_prefix(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || prefix.is_empty(),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn dot_segments_and_encoded_separators_are_refused() {
        for bad in [
            "/review/../admin",
            "/review/%2e%2E/admin",
            "/review/..;/admin",
            "/review/./x",
            "/review%2fadmin",
            "/review%5Cadmin",
            "/review\\admin",
        ] {
            assert!(refuse_ambiguous(bad).is_err(), "{bad}");
        }
        for good in ["/review", "/review/x.y", "/review/...", "/a;b=1"] {
            assert!(refuse_ambiguous(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn an_intercepted_call_is_measured_as_the_capability_its_path_names() {
        let text = "listen: { outbound: 127.0.0.1:0, inbound: 127.0.0.1:0, admin: 127.0.0.1:0 }\n\
                    agent:\n  name: a\n  address: 127.0.0.1:1\n  max_concurrency: 1\n  capabilities:\n\
                    \x20   - { name: review, paths: [/review] }\n\
                    \x20   - { name: chat }\n\
                    \x20   - { name: search, paths: [/search] }\n";
        let bootstrap = match crate::config::parse_bootstrap(std::path::Path::new("b"), text) {
            Ok(b) => b,
            Err(err) => panic!("{err}"),
        };
        let caps = &bootstrap.agent.capabilities;
        assert_eq!(capability_by_path(caps, "/search/x"), Some("search"));
        assert_eq!(capability_by_path(caps, "/review"), Some("review"));
        // No paths cover it: the capability that serves everything.
        assert_eq!(capability_by_path(caps, "/healthz"), Some("chat"));
        assert_eq!(capability_by_path(&caps[..1], "/healthz"), None);
    }

    #[test]
    fn path_prefixes_match_whole_segments() {
        assert!(path_has_prefix("/review", "/review"));
        assert!(path_has_prefix("/review/x", "/review/"));
        assert!(!path_has_prefix("/reviewer", "/review"));
        assert!(!path_has_prefix("/admin/mode", "/review"));
        assert!(path_has_prefix("/anything", "/"));
    }

    #[test]
    fn callers_reach_headers_are_replaced_after_hop_by_hop_stripping() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("reach-deadline, reach-caller"),
        );
        h.insert("reach-caller", HeaderValue::from_static("admin"));
        h.insert("reach-agent", HeaderValue::from_static("forged"));
        h.insert("reach-deadline", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        let vouched = Vouched {
            capability: Some("code-review"),
            deadline: Some(Deadline::after(std::time::Duration::from_secs(5))),
            caller: None,
            identity: None,
            attempt: Some(2),
        };
        rewrite(&mut h, vouched);
        assert!(h.get("reach-caller").is_none());
        assert!(h.get("reach-agent").is_none());
        assert!(h.get("reach-deadline").is_some_and(|v| v != "1"));
        assert_eq!(h["reach-capability"], "code-review");
        assert_eq!(h["reach-attempt"], "2");
        assert!(h.contains_key("x-kept"));
    }
}
