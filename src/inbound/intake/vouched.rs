//! What the sidecar vouches for at intake: who the caller is, and the only `reach-*` and
//! forwarding headers the agent sees. `reach-*` headers are the sidecar's to set — a caller cannot name itself, set the agent's deadline format or smuggle
//! routing hints to the agent — so every one is dropped and the sidecar writes back only what
//! it vouches for, after hop-by-hop stripping (so `Connection: reach-…` cannot remove them).

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Request};

use crate::config::Snapshot;
use crate::error::ReachError;
use crate::http::deadline::{self, Deadline};
use crate::http::headers;
use crate::identity::SpiffeId;
use crate::registry::Registry;

/// The headers the sidecar re-adds once the caller's `reach-*` headers are gone.
#[derive(Debug, Default)]
pub(in crate::inbound) struct Vouched<'a> {
    pub(in crate::inbound) capability: Option<&'a str>,
    pub(in crate::inbound) deadline: Option<Deadline>,
    /// The deadline is the first `reach-deadline` value as sent (no `reach-timeout` tightened
    /// it): that value is kept without being parsed again.
    pub(in crate::inbound) deadline_as_sent: bool,
    /// A caller name the sidecar could check (see [`verified_caller`], [`caller_named_by`]).
    pub(in crate::inbound) caller: Option<&'a str>,
    /// The caller's SPIFFE ID, from the certificate it presented.
    pub(in crate::inbound) identity: Option<&'a SpiffeId>,
    /// The connection's client (`transport::ClientAddr`): the only `x-forwarded-for` the agent is given.
    pub(in crate::inbound) remote: Option<&'a HeaderValue>,
    /// `x-forwarded-client-cert` for the verified certificate (`transport::PeerTls`).
    pub(in crate::inbound) client_cert: Option<&'a HeaderValue>,
    /// The delegation chain, sealed for the agent (`src/chain/`): always written anew.
    pub(in crate::inbound) chain: Option<HeaderValue>,
    /// The [`IDENTITY_LIKE`] headers the policy lets through (`pass_identity_headers`).
    pub(in crate::inbound) pass: &'a [String],
}

/// Headers that name a client, its address, its certificate or the scheme and host it used:
/// set by the edge proxies and auth gateways an agent may sit behind, and believed by agents'
/// frameworks. From a caller they are claims nobody checked, so none reaches the agent unless
/// the policy's `pass_identity_headers` names it (`docs/security.md`).
pub(super) const IDENTITY_LIKE: [&str; 30] = [
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-forwarded-user",
    "x-forwarded-email",
    "x-forwarded-preferred-username",
    "x-forwarded-groups",
    "x-forwarded-access-token",
    "x-auth-request-user",
    "x-auth-request-email",
    "x-remote-user",
    "remote-user",
    "x-user",
    "ssl-client-cert",
    "x-ssl-client-cert",
    "x-client-cert",
    "x-ssl-client-verify",
    "x-ssl-client-dn",
    "x-ssl-client-s-dn",
    "client-cert",
    "client-cert-chain",
    "x-amzn-mtls-clientcert",
];

/// Whether `name` is an identity-like header the policy does not pass.
fn claims_identity(name: &str, pass: &[String]) -> bool {
    IDENTITY_LIKE.contains(&name) && !pass.iter().any(|p| p.eq_ignore_ascii_case(name))
}

/// Forwarding headers are the sidecar's too (Envoy's `SANITIZE_SET`): a caller's
/// `x-forwarded-client-cert` is replaced by the one made from the certificate it presented, and
/// its `x-forwarded-for` by the connection's peer address. `forwarded` is removed, not
/// rewritten: a chain the caller wrote cannot be checked, and one header for the peer is enough.
static FORWARDING: [HeaderName; 3] = [
    HeaderName::from_static("x-forwarded-client-cert"),
    HeaderName::from_static("x-forwarded-for"),
    http::header::FORWARDED,
];

/// Strips hop-by-hop and every `reach-*` header, then writes back what is vouched for. A header
/// that already holds exactly the vouched value stays where it is (a peer sidecar's request
/// carries the same four): no rehashing and no allocation on the common path. `reach-attempt`,
/// the caller's count of its tries, passes through when its first value is a small number.
pub(in crate::inbound) fn rewrite(headers: &mut HeaderMap, vouched: Vouched<'_>) {
    headers::strip_hop_by_hop(headers);
    // One pass over the names finds what to drop; most requests carry no forwarding header, and
    // a peer sidecar's `reach-*` headers are kept (each removal hashes). Names the sidecar knows
    // are marked by their index in `VOUCHED` then `FORWARDING` (no copy); others, rare, are
    // copied.
    let mut drop_known = 0u16;
    let mut drop_other: Vec<HeaderName> = Vec::new();
    // Which of the vouched headers (in `VOUCHED` order) already hold their value: those are not
    // written again below.
    let mut held = [false; 5];
    let mut attempt: Option<u16> = None;
    let mut seen_attempt = false;
    for (name, value) in headers.iter() {
        // One string match per name, by length then bytes.
        let (slot, keep) = match name.as_str() {
            "x-forwarded-client-cert" => (VOUCHED.len(), false),
            "x-forwarded-for" => (VOUCHED.len() + 1, false),
            "forwarded" => (VOUCHED.len() + 2, false),
            "reach-capability" => (0, vouched.capability.is_some_and(|c| value == c)),
            // The first value only: a second one was not what the deadline was read from.
            "reach-deadline" => (1, vouched.deadline_as_sent && !held[1]),
            "reach-caller" => (2, vouched.caller.is_some_and(|c| value == c)),
            "reach-caller-identity" => (3, vouched.identity.is_some_and(|i| value == i.as_str())),
            "reach-attempt" => {
                let first = !std::mem::replace(&mut seen_attempt, true);
                if first {
                    attempt = value.to_str().ok().and_then(|v| v.trim().parse().ok());
                }
                (4, first && attempt.is_some())
            }
            other if other.starts_with("reach-") => (usize::MAX, false),
            other if claims_identity(other, vouched.pass) => (usize::MAX, false),
            _ => continue,
        };
        if keep {
            held[slot] = true;
        } else if slot < VOUCHED.len() + FORWARDING.len() {
            drop_known |= 1 << slot;
        } else if !drop_other.contains(name) {
            drop_other.push(name.clone());
        }
    }
    for (i, name) in VOUCHED.iter().chain(FORWARDING.iter()).enumerate() {
        if drop_known & (1 << i) != 0 {
            // A name with one value kept and another not goes whole, and is written back below.
            if let Some(slot) = held.get_mut(i) {
                *slot = false;
            }
            headers.remove(name);
        }
    }
    for name in drop_other {
        headers.remove(name);
    }
    if let Some(cert) = vouched.client_cert {
        headers.insert(FORWARDING[0].clone(), cert.clone());
    }
    if let Some(remote) = vouched.remote {
        headers.insert(FORWARDING[1].clone(), remote.clone());
    }
    if let Some(capability) = vouched.capability.filter(|_| !held[0]) {
        headers.insert(headers::CAPABILITY, headers::value(capability));
    }
    if let Some(deadline) = vouched.deadline.filter(|_| !held[1]) {
        headers.insert(deadline::DEADLINE, deadline.header_value());
    }
    if let Some(caller) = vouched.caller.filter(|_| !held[2]) {
        headers.insert(headers::CALLER, headers::value(caller));
    }
    if let Some(identity) = vouched.identity.filter(|_| !held[3]) {
        headers.insert(headers::CALLER_IDENTITY, headers::value(identity.as_str()));
    }
    if let Some(attempt) = attempt.filter(|_| !held[4]) {
        headers.insert(headers::ATTEMPT, attempt.into());
    }
    if let Some(chain) = vouched.chain {
        headers.insert(crate::chain::HEADER, chain);
    }
}

/// The headers the sidecar vouches for, in the order `rewrite` tracks them.
static VOUCHED: [HeaderName; 5] = [
    headers::CAPABILITY,
    deadline::DEADLINE,
    headers::CALLER,
    headers::CALLER_IDENTITY,
    headers::ATTEMPT,
];

/// The caller's name as its sidecar sent it, kept only when it is a peer this sidecar knows and
/// the connection comes from that peer's address. Not authentication — anything on that host can
/// claim it — but a stranger on the network can no longer name itself anybody; mutual TLS is
/// what will make it an identity.
pub(in crate::inbound) fn verified_caller<B>(
    req: &Request<B>,
    remote: SocketAddr,
    registry: &Registry,
    snapshot: &Snapshot,
) -> Option<String> {
    let claimed = req.headers().get(headers::CALLER)?.to_str().ok()?.trim();
    let peer = registry.find(snapshot, claimed)?;
    let ip = peer.ip()?;
    // A dual-stack listener sees IPv4 peers as `::ffff:a.b.c.d`.
    (ip.to_canonical() == remote.ip().to_canonical()).then(|| peer.name.clone())
}

/// The caller's name when its certificate proved `identity`: the member it claims to be if that
/// member announced this identity, else a member with this identity at the connection's
/// address, else the identity's last segment (the service account). Never a name the
/// certificate does not back.
pub(in crate::inbound) fn caller_named_by<B>(
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
        p.ip()
            .zip(remote)
            .is_some_and(|(ip, r)| ip.to_canonical() == r.ip().to_canonical())
    };
    registry
        .find_where(snapshot, |p| {
            p.identity.as_ref() == Some(identity) && at_address(p)
        })
        .map_or_else(|| identity.leaf().to_owned(), |p| p.name.clone())
}

/// `uri` with its path replaced by `path` (the normalized one), its query kept.
pub(in crate::inbound) fn with_path(uri: &http::Uri, path: &str) -> Result<http::Uri, ReachError> {
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(
        path_and_query
            .parse()
            .map_err(|_| ReachError::BadRequest(format!("the path `{path}` is not valid")))?,
    );
    http::Uri::from_parts(parts)
        .map_err(|_| ReachError::BadRequest(format!("the path `{path}` is not valid")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

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
        h.insert("reach-attempt", HeaderValue::from_static("2"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.insert(
            "x-forwarded-client-cert",
            HeaderValue::from_static("URI=spiffe://t/ns/a/sa/admin"),
        );
        h.insert("x-forwarded-for", HeaderValue::from_static("127.0.0.1"));
        h.insert("forwarded", HeaderValue::from_static("for=127.0.0.1"));
        for name in IDENTITY_LIKE {
            h.insert(name, HeaderValue::from_static("admin"));
        }
        let remote = HeaderValue::from_static("10.0.0.7");
        let pass = ["X-Forwarded-Proto".to_owned()];
        let vouched = Vouched {
            capability: Some("code-review"),
            deadline: Some(Deadline::after(std::time::Duration::from_secs(5))),
            remote: Some(&remote),
            pass: &pass,
            ..Vouched::default()
        };
        rewrite(&mut h, vouched);
        for name in IDENTITY_LIKE.iter().filter(|n| **n != "x-forwarded-proto") {
            assert!(h.get(*name).is_none(), "{name} reached the agent");
        }
        assert_eq!(h["x-forwarded-proto"], "admin", "passed by the policy");
        assert!(h.get("reach-caller").is_none());
        assert!(h.get("reach-agent").is_none());
        assert!(h.get("reach-deadline").is_some_and(|v| v != "1"));
        assert_eq!(h["reach-capability"], "code-review");
        assert_eq!(h["reach-attempt"], "2");
        assert!(h.contains_key("x-kept"));
        assert!(
            h.get("x-forwarded-client-cert").is_none(),
            "no certificate: no XFCC"
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.7");
        assert!(h.get("forwarded").is_none());
    }

    #[test]
    fn a_vouched_header_is_kept_as_sent_and_a_mixed_one_is_written_back_once() {
        let mut h = HeaderMap::new();
        h.insert("reach-capability", HeaderValue::from_static("code-review"));
        h.append("reach-attempt", HeaderValue::from_static("2"));
        h.append("reach-attempt", HeaderValue::from_static("9"));
        let vouched = Vouched {
            capability: Some("code-review"),
            caller: Some("front"),
            ..Vouched::default()
        };
        rewrite(&mut h, vouched);
        assert_eq!(h.get_all("reach-capability").iter().count(), 1);
        assert_eq!(h["reach-capability"], "code-review");
        let attempts: Vec<_> = h.get_all("reach-attempt").iter().collect();
        assert_eq!(attempts, ["2"], "the forged second value is gone");
        assert_eq!(h["reach-caller"], "front");
        assert!(h.get("x-forwarded-for").is_none());
    }

    #[test]
    fn a_deadline_as_sent_stays_once_and_an_attempt_that_is_no_number_goes() {
        let mut h = HeaderMap::new();
        h.append("reach-deadline", HeaderValue::from_static("1796401551929"));
        h.append("reach-deadline", HeaderValue::from_static("9999999999999"));
        h.insert("reach-attempt", HeaderValue::from_static("two"));
        let deadline = Deadline::from_headers(&h).unwrap_or_else(|e| panic!("{e}"));
        let vouched = Vouched {
            deadline,
            deadline_as_sent: true,
            ..Vouched::default()
        };
        rewrite(&mut h, vouched);
        let deadlines: Vec<_> = h.get_all("reach-deadline").iter().collect();
        assert_eq!(deadlines, ["1796401551929"], "the second value is gone");
        assert!(h.get("reach-attempt").is_none());
    }
}
