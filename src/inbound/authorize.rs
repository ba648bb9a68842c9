//! The one authorization decision of the inbound listener: every request is mapped to exactly
//! one of the agent's capabilities by what it will do at the agent — its path, normalized once —
//! and the fleet policy's `authorization` is asked about that capability (`docs/mtls.md`,
//! "Authorization"). Mesh, plaintext and intercepted connections are decided the same way, at
//! intake, before the call takes a slot or reaches the agent.
//!
//! Why the path and not the `reach-capability` header: the agent acts on the path; a header is
//! the caller's to write. So the header may only choose among the capabilities the path already
//! maps to (those tied for the most specific match), a request the path maps to nothing is
//! refused, and `default` is asked only about capabilities without an allow list.

use std::borrow::Cow;
use std::net::SocketAddr;

use crate::config::{Authorization, Capability, Snapshot};
use crate::error::ReachError;
use crate::identity::SpiffeId;
use crate::metrics::Metrics;

/// Why a request was not authorized; each is one wire answer (see [`Refusal::into_error`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Dot segments, encoded separators or percent signs, bad escapes: `400 bad_request`.
    AmbiguousPath(String),
    /// The header names a capability this agent does not serve: `404 unknown_capability`.
    UnknownCapability(String),
    /// The path maps to no capability (and no header named one): `404 unknown_capability`.
    Unmapped(String),
    /// The header names a capability whose paths do not cover the request's (most specifically):
    /// `400 capability_path_mismatch`.
    PathMismatch { capability: String, path: String },
    /// The policy does not let this caller call the capability: `403 forbidden`.
    Forbidden(String),
}

/// What was decided: the capability the call is, and the path to forward (normalized).
#[derive(Debug)]
pub(super) struct Authorized<'c, 'p> {
    pub(super) capability: &'c Capability,
    pub(super) path: Cow<'p, str>,
}

/// Maps the request at `path` (its `reach-capability` header `named`) to one of `capabilities`
/// and asks `authz` whether `caller` (none: no certificate) may call it. Pure.
pub(super) fn decide<'c, 'p>(
    capabilities: &'c [Capability],
    authz: &Authorization,
    named: Option<&str>,
    path: &'p str,
    caller: Option<&SpiffeId>,
) -> Result<Authorized<'c, 'p>, Refusal> {
    let path = normalize(path)?;
    let best = capabilities
        .iter()
        .filter_map(|c| specificity(c, &path))
        .max();
    let capability = match named {
        Some(name) => {
            let cap = capabilities
                .iter()
                .find(|c| c.name.as_str() == name)
                .ok_or_else(|| Refusal::UnknownCapability(name.to_owned()))?;
            if best.is_none() || specificity(cap, &path) != best {
                return Err(Refusal::PathMismatch {
                    capability: name.to_owned(),
                    path: path.into_owned(),
                });
            }
            cap
        }
        // Capabilities tied at the best match (A2A skills on one endpoint) serve the same
        // request: without a header, the first declared.
        None => capabilities
            .iter()
            .find(|c| best.is_some() && specificity(c, &path) == best)
            .ok_or_else(|| Refusal::Unmapped(path.to_string()))?,
    };
    if !authz.allows(Some(capability.name.as_str()), caller) {
        return Err(Refusal::Forbidden(capability.name.to_string()));
    }
    Ok(Authorized { capability, path })
}

/// How specifically `cap` covers `path`: declared paths as whole-segment prefixes (the longer
/// the more specific), no declared paths as the least specific match of all; `None`: it does not.
fn specificity(cap: &Capability, path: &str) -> Option<usize> {
    if cap.paths.is_empty() {
        return Some(0);
    }
    cap.paths
        .iter()
        .filter(|p| has_prefix(path, p))
        .map(|p| 1 + p.split('/').filter(|s| !s.is_empty()).count())
        .max()
}

/// `/review` covers `/review`, `/review/…` and `/review;v=1`, not `/reviewer`.
fn has_prefix(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    match path.strip_prefix(prefix) {
        Some(rest) => {
            prefix.is_empty() || rest.is_empty() || rest.starts_with('/') || rest.starts_with(';')
        }
        None => false,
    }
}

/// The path as the agent will read it, or a refusal where readers could disagree: unreserved
/// characters percent-decoded (`/p%61y` is `/pay`), runs of `/` merged (servers that merge them
/// would read `//pay` as `/pay`); dot segments (also encoded, or `..;`), encoded `/`, `\` and
/// `%`, a raw `\`, and malformed escapes refused. Borrowed when already normal (the usual case).
pub(super) fn normalize(path: &str) -> Result<Cow<'_, str>, Refusal> {
    if already_normal(path) {
        return Ok(Cow::Borrowed(path));
    }
    let refuse = || Refusal::AmbiguousPath(path.to_owned());
    let bytes = path.as_bytes();
    let plain = !bytes.contains(&b'%') && !path.contains("//") && !path.contains('\\');
    let normal: Cow<'_, str> = if plain {
        Cow::Borrowed(path)
    } else {
        let mut out = String::with_capacity(path.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'%' => {
                    let hex = path.get(i + 1..i + 3).ok_or_else(refuse)?;
                    let byte = u8::from_str_radix(hex, 16).map_err(|_| refuse())?;
                    if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                        out.push(char::from(byte));
                    } else if b"/\\%".contains(&byte) || byte < 0x20 {
                        return Err(refuse());
                    } else {
                        out.push('%');
                        out.push_str(&hex.to_ascii_uppercase());
                    }
                    i += 3;
                }
                b'\\' => return Err(refuse()),
                b'/' if out.ends_with('/') => i += 1,
                _ => {
                    // Multi-byte UTF-8 is copied whole (the `http` crate admits only ASCII here,
                    // but the function is total).
                    let ch = path[i..].chars().next().ok_or_else(refuse)?;
                    out.push(ch);
                    i += ch.len_utf8();
                }
            }
        }
        Cow::Owned(out)
    };
    let dot_segment = normal
        .split('/')
        .map(|segment| segment.split(';').next().unwrap_or(segment))
        .any(|segment| segment == "." || segment == "..");
    if dot_segment {
        return Err(refuse());
    }
    Ok(normal)
}

/// Whether `path` is normal as it stands: no escape, no `\`, no `//`, no dot segment. One pass
/// over its bytes, where searching for each in turn walked it several times.
fn already_normal(path: &str) -> bool {
    let bytes = path.as_bytes();
    let mut start = 0;
    for i in 0..=bytes.len() {
        let end = i == bytes.len();
        match bytes.get(i).copied().unwrap_or(b'/') {
            b'%' | b'\\' => return false,
            b'/' => {
                let segment = &bytes[start..i];
                // Empty between two slashes: `//`.
                if segment.is_empty() && start > 0 && !end {
                    return false;
                }
                let name = segment.split(|&c| c == b';').next().unwrap_or(segment);
                if name == b"." || name == b".." {
                    return false;
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    true
}

/// Whether `caller` may call at least one of `capabilities`: who may read the agent's card (it
/// lists them all, and is answered by the sidecar, not forwarded).
pub(super) fn may_call_any(
    capabilities: &[Capability],
    authz: &Authorization,
    caller: Option<&SpiffeId>,
) -> bool {
    capabilities
        .iter()
        .any(|c| authz.allows(Some(c.name.as_str()), caller))
}

// === impl Refusal ===

impl Refusal {
    pub(super) fn into_error(self) -> ReachError {
        match self {
            Refusal::AmbiguousPath(path) => ReachError::BadRequest(format!(
                "the path `{path}` has dot segments, encoded separators or malformed escapes"
            )),
            Refusal::UnknownCapability(capability) => ReachError::UnknownCapability { capability },
            Refusal::Unmapped(path) => ReachError::NoCapabilityAt { path },
            Refusal::PathMismatch { capability, path } => {
                ReachError::CapabilityPathMismatch { capability, path }
            }
            Refusal::Forbidden(capability) => ReachError::Forbidden { capability },
        }
    }
}

/// [`decide`] for one request under `snapshot`: a refusal is counted and, for a forbidden call,
/// written to the decision log with the caller's identity and address.
pub(super) fn check<'s, 'p>(
    snapshot: &'s Snapshot,
    metrics: &Metrics,
    named: Option<&str>,
    path: &'p str,
    caller: Option<&SpiffeId>,
    remote: Option<SocketAddr>,
) -> Result<Authorized<'s, 'p>, ReachError> {
    let capabilities = &snapshot.bootstrap.agent.capabilities;
    let authz = &snapshot.policy.authorization;
    let refusal = match decide(capabilities, authz, named, path, caller) {
        Ok(authorized) => return Ok(authorized),
        Err(refusal) => refusal,
    };
    if let Refusal::Forbidden(capability) = &refusal {
        metrics.authz_denied(capability);
        if snapshot.policy.decision_log {
            tracing::info!(
                target: "agent_reach::decision",
                direction = "inbound",
                capability = capability.as_str(),
                caller_identity = caller.map(SpiffeId::as_str),
                remote = remote.map(tracing::field::display),
                status = 403u16,
                error = "forbidden",
                "forbidden"
            );
        }
    }
    Err(refusal.into_error())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::config::{CapabilityAuthorization, Name, Verdict};
    use crate::identity::IdentityPattern;
    use proptest::prelude::*;

    fn cap(name: &str, paths: &[&str]) -> Capability {
        let mut c = Capability::named(Name::parse(name).unwrap());
        c.paths = paths.iter().map(|p| (*p).to_owned()).collect();
        c
    }

    fn id(sa: &str) -> SpiffeId {
        SpiffeId::parse(&format!("spiffe://t/ns/a/sa/{sa}")).unwrap()
    }

    fn authz(default: Verdict, allow: &[(&str, &[&str])]) -> Authorization {
        Authorization {
            default,
            capabilities: allow
                .iter()
                .map(|(c, ids)| {
                    let allow = ids
                        .iter()
                        .map(|i| {
                            IdentityPattern::parse(&format!("spiffe://t/ns/a/sa/{i}")).unwrap()
                        })
                        .collect();
                    (
                        (*c).to_owned(),
                        CapabilityAuthorization {
                            allow: Some(allow),
                            served_by: None,
                        },
                    )
                })
                .collect(),
        }
    }

    fn name<'c>(d: &Result<Authorized<'c, '_>, Refusal>) -> Result<&'c str, Refusal> {
        d.as_ref()
            .map(|a| a.capability.name.as_str())
            .map_err(Clone::clone)
    }

    #[test]
    fn the_path_decides_and_the_header_only_chooses_among_equals() {
        let caps = [
            cap("payments", &["/pay"]),
            cap("review", &["/review"]),
            cap("chat", &[]),
            cap("skill-a", &["/a2a"]),
            cap("skill-b", &["/a2a"]),
        ];
        let policy = authz(Verdict::Allow, &[("payments", &["billing"])]);
        let coder = id("coder");
        let billing = id("billing");
        let mismatch = |c: &str, p: &str| {
            Err(Refusal::PathMismatch {
                capability: c.to_owned(),
                path: p.to_owned(),
            })
        };
        let forbidden = |c: &str| Err(Refusal::Forbidden(c.to_owned()));
        type Row<'a> = (
            Option<&'a str>,
            &'a str,
            Option<&'a SpiffeId>,
            Result<&'a str, Refusal>,
        );
        let table: Vec<Row<'_>> = vec![
            // Finding 1: leaving the header out does not skip the allow list.
            (None, "/pay", Some(&coder), forbidden("payments")),
            (
                Some("payments"),
                "/pay",
                Some(&coder),
                forbidden("payments"),
            ),
            (None, "/pay", None, forbidden("payments")),
            (None, "/pay/now", Some(&billing), Ok("payments")),
            // Finding 3: another capability's header does not cover the path.
            (
                Some("review"),
                "/pay",
                Some(&coder),
                mismatch("review", "/pay"),
            ),
            // A catch-all covers /pay, but less specifically than payments does.
            (Some("chat"), "/pay", Some(&coder), mismatch("chat", "/pay")),
            (None, "/anything", None, Ok("chat")),
            (Some("chat"), "/anything", None, Ok("chat")),
            (
                Some("nope"),
                "/pay",
                Some(&billing),
                Err(Refusal::UnknownCapability("nope".into())),
            ),
            // Tied capabilities: the header chooses, else the first declared.
            (None, "/a2a", None, Ok("skill-a")),
            (Some("skill-b"), "/a2a", None, Ok("skill-b")),
            // Path tricks.
            (
                Some("review"),
                "/review/../pay",
                Some(&coder),
                Err(Refusal::AmbiguousPath("/review/../pay".into())),
            ),
            (
                Some("review"),
                "/review/%2e%2e/pay",
                Some(&coder),
                Err(Refusal::AmbiguousPath("/review/%2e%2e/pay".into())),
            ),
            (None, "/p%61y", Some(&coder), forbidden("payments")),
            (None, "//pay", Some(&coder), forbidden("payments")),
            (
                None,
                "/pay;jsessionid=1",
                Some(&coder),
                forbidden("payments"),
            ),
            (
                None,
                "/review%2fx",
                None,
                Err(Refusal::AmbiguousPath("/review%2fx".into())),
            ),
            (
                None,
                "/review/%252e%252e/pay",
                None,
                Err(Refusal::AmbiguousPath("/review/%252e%252e/pay".into())),
            ),
        ];
        for (header, path, caller, want) in table {
            let got = decide(&caps, &policy, header, path, caller);
            assert_eq!(name(&got), want, "{header:?} {path} {caller:?}");
        }
        // Without a catch-all, a path no capability serves maps to nothing: refused, never
        // judged by `default`.
        let narrow = [cap("review", &["/review"])];
        let got = decide(&narrow, &policy, None, "/admin/mode", None);
        assert_eq!(name(&got), Err(Refusal::Unmapped("/admin/mode".into())));
        // Naming a capability there is a mismatch, not an unknown name.
        let got = decide(&narrow, &policy, Some("review"), "/admin/mode", None);
        assert_eq!(
            name(&got),
            Err(Refusal::PathMismatch {
                capability: "review".into(),
                path: "/admin/mode".into()
            })
        );
        // The path forwarded is the normalized one.
        let got = decide(&caps, &policy, None, "/review//p%61ge", None).unwrap();
        assert_eq!(got.path, "/review/page");
    }

    #[test]
    fn normal_paths_are_borrowed_and_escapes_of_reserved_characters_kept() {
        assert!(matches!(normalize("/review/x.y"), Ok(Cow::Borrowed(_))));
        assert_eq!(normalize("/a%20b").unwrap(), "/a%20b");
        assert_eq!(normalize("/a%3a").unwrap(), "/a%3A");
        for bad in [
            "/a%", "/a%zz", "/a%0a", "/..;/x", "/./x", "/x/%2E", "/x\\y", "/x%5cy",
        ] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
        for good in [
            "/review",
            "/review/...",
            "/a;b=1",
            "/",
            "/x/",
            "",
            "/.a/a.",
            "/a;..b",
        ] {
            assert!(matches!(normalize(good), Ok(Cow::Borrowed(_))), "{good}");
        }
        for dotted in ["/..", "..", "/x/.", "/x/..;y/z", "/./", "."] {
            assert!(normalize(dotted).is_err(), "{dotted}");
        }
        assert!(matches!(normalize("//x//y/"), Ok(Cow::Owned(p)) if p == "/x/y/"));
    }

    // === the reference model ===

    /// A capability as the model sees it: name, declared paths, allow list (none: `default`).
    type ModelCap = (String, Vec<String>, Option<Vec<String>>);

    /// The decision written the slow, obvious way: segments as lists, every capability scored.
    fn model(
        caps: &[ModelCap],
        default_allow: bool,
        named: Option<&str>,
        path: &str,
        caller: Option<&str>,
    ) -> Result<String, &'static str> {
        // Decode: unreserved characters; anything decoding to a separator or `%` is refused.
        let mut decoded = String::new();
        let mut chars = path.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '%' => {
                    let hi = chars.next().ok_or("ambiguous")?;
                    let lo = chars.next().ok_or("ambiguous")?;
                    let v = hi.to_digit(16).ok_or("ambiguous")? * 16
                        + lo.to_digit(16).ok_or("ambiguous")?;
                    let ch = char::from_u32(v).ok_or("ambiguous")?;
                    if ch.is_ascii_alphanumeric() || "-._~".contains(ch) {
                        decoded.push(ch);
                    } else if "/\\%".contains(ch) || v < 0x20 {
                        return Err("ambiguous");
                    } else {
                        decoded.push_str(&format!("%{hi}{lo}").to_uppercase());
                    }
                }
                '\\' => return Err("ambiguous"),
                other => decoded.push(other),
            }
        }
        let segments: Vec<&str> = decoded.split('/').filter(|s| !s.is_empty()).collect();
        let bare = |s: &str| s.split(';').next().unwrap_or("").to_owned();
        if segments.iter().any(|s| bare(s) == "." || bare(s) == "..") {
            return Err("ambiguous");
        }
        let score = |paths: &Vec<String>| -> Option<usize> {
            if paths.is_empty() {
                return Some(0);
            }
            paths
                .iter()
                .filter_map(|p| {
                    let want: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
                    if want.len() > segments.len() {
                        return None;
                    }
                    let whole = want.iter().zip(&segments).enumerate().all(|(i, (w, h))| {
                        // The last segment may carry `;params`.
                        *w == *h || (i == want.len() - 1 && bare(h) == *w && h.contains(';'))
                    });
                    whole.then_some(want.len() + 1)
                })
                .max()
        };
        let scored: Vec<(usize, &String, &Option<Vec<String>>)> = caps
            .iter()
            .filter_map(|(n, p, a)| score(p).map(|s| (s, n, a)))
            .collect();
        let best = scored.iter().map(|(s, ..)| *s).max();
        let chosen = match named {
            Some(n) => {
                let (_, paths, _) = caps.iter().find(|(c, ..)| c == n).ok_or("unknown")?;
                if best.is_none() || score(paths) != best {
                    return Err("mismatch");
                }
                n.to_owned()
            }
            None => scored
                .iter()
                .find(|(s, ..)| Some(*s) == best)
                .map(|(_, n, _)| (*n).clone())
                .ok_or("unknown")?,
        };
        let allow = &caps.iter().find(|(c, ..)| *c == chosen).ok_or("unknown")?.2;
        let allowed = match allow {
            Some(ids) => caller.is_some_and(|c| ids.iter().any(|i| i == c)),
            None => default_allow,
        };
        if allowed {
            Ok(chosen)
        } else {
            Err("forbidden")
        }
    }

    fn segment() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "pay", "review", "admin", "a2a", "x", "", "..", ".", "%2e%2e", "%2E.", "..;", "%2f",
            "%5C", "p%61y", "%70ay", "pay;v=1", "%252e", "a%20b", "a\\b", "%", "%g1", "re%76iew",
        ])
    }

    fn declared() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec(
            prop::collection::vec(
                prop::sample::select(vec!["pay", "review", "admin", "a2a", "x"]),
                1..3,
            )
            .prop_map(|s| format!("/{}", s.join("/"))),
            0..3,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn the_decision_always_equals_the_models(
            caps in prop::collection::vec(
                (declared(), prop::option::of(prop::collection::vec(prop::sample::select(vec!["coder", "billing"]), 0..2))),
                0..4,
            ),
            default_allow in any::<bool>(),
            named in prop::option::of(0usize..5),
            path in prop::collection::vec(segment(), 0..5).prop_map(|s| format!("/{}", s.join("/"))),
            caller in prop::option::of(prop::sample::select(vec!["coder", "billing", "intruder"])),
        ) {
            let caps: Vec<ModelCap> = caps
                .into_iter()
                .enumerate()
                .map(|(i, (paths, allow))| {
                    let allow = allow.map(|a| a.into_iter().map(str::to_owned).collect());
                    (format!("cap-{i}"), paths, allow)
                })
                .collect();
            let capabilities: Vec<Capability> = caps
                .iter()
                .map(|(n, p, _)| cap(n, &p.iter().map(String::as_str).collect::<Vec<_>>()))
                .collect();
            let allow: Vec<(&str, Vec<&str>)> = caps
                .iter()
                .filter_map(|(n, _, a)| a.as_ref().map(|a| (n.as_str(), a.iter().map(String::as_str).collect())))
                .collect();
            let allow: Vec<(&str, &[&str])> = allow.iter().map(|(n, a)| (*n, a.as_slice())).collect();
            let verdict = if default_allow { Verdict::Allow } else { Verdict::Deny };
            let policy = authz(verdict, &allow);
            // Index 4 names a capability nobody declares.
            let named = named.map(|i| format!("cap-{i}"));
            let caller_id = caller.map(id);
            let got = decide(&capabilities, &policy, named.as_deref(), &path, caller_id.as_ref());
            let want = model(&caps, default_allow, named.as_deref(), &path, caller);
            let got = match &got {
                Ok(a) => Ok(a.capability.name.to_string()),
                Err(Refusal::AmbiguousPath(_)) => Err("ambiguous"),
                Err(Refusal::UnknownCapability(_) | Refusal::Unmapped(_)) => Err("unknown"),
                Err(Refusal::PathMismatch { .. }) => Err("mismatch"),
                Err(Refusal::Forbidden(_)) => Err("forbidden"),
            };
            prop_assert_eq!(got, want, "path {}", path);
        }
    }
}
