//! Which capability an outbound request is for (or that it asks for one by intent), and the
//! refusals that keep the outbound listener from ever acting as an open proxy.

use std::borrow::Cow;
use std::net::IpAddr;

use http::{Method, Request, Version};

use crate::config::{Name, ANY};
use crate::error::ReachError;
use crate::http::headers;

/// The authority suffix that names a capability: `code-review.reach`.
const SUFFIX: &str = ".reach";

/// What a call asks for.
#[derive(Debug, PartialEq)]
pub(in crate::outbound) enum Wanted {
    /// A capability by name: `reach-capability` or `<capability>.reach`.
    Named(Name),
    /// `any.reach` or `reach-intent` (or `reach-capability: any`): picked by the policy's intent
    /// rules, from the `reach-intent` text or else the body.
    Intent,
    /// Intent routing asked for, but a capability named too: the name wins, and the answer says so.
    Override(Name),
}

/// The path-prefix form of a capability on the loopback listener: for clients that ignore
/// `HTTP_PROXY` (Node's `fetch`) or take only https or loopback URLs (google-adk), a plain base
/// URL `http://127.0.0.1:4140/.reach/<capability>` names it. `/.reach/` is the sidecar's: the
/// outbound listener serves no agent, and a call naming its capability otherwise (header or
/// authority) is not read this way (`docs/calling.md`).
const PATH_PREFIX: &str = "/.reach/";

/// A call in the path-prefix form, turned into the header form: `reach-capability` set and the
/// prefix taken off its path. Its base (`http://<host>/.reach/<capability>`, what a card read
/// this way points back at) when it was one.
pub(in crate::outbound) fn path_prefix<B>(
    req: &mut Request<B>,
) -> Result<Option<String>, ReachError> {
    let Some(rest) = req.uri().path().strip_prefix(PATH_PREFIX) else {
        return Ok(None);
    };
    let host = host_of(req);
    let named_otherwise = req.headers().contains_key(headers::CAPABILITY)
        || host.as_deref().is_some_and(|h| h.ends_with(SUFFIX));
    if named_otherwise || !host.as_deref().is_none_or(is_loopback) {
        return Ok(None);
    }
    let (capability, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let name = Name::parse(capability).map_err(ReachError::BadRequest)?;
    let authority = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(ToString::to_string))
        .unwrap_or_else(|| "127.0.0.1".to_owned());
    let path = match req.uri().query() {
        Some(query) => format!("/{tail}?{query}"),
        None => format!("/{tail}"),
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(
        path.parse()
            .map_err(|_| ReachError::BadRequest(format!("`{path}` is not a path")))?,
    );
    *req.uri_mut() = http::Uri::from_parts(parts)
        .map_err(|e| ReachError::BadRequest(format!("the request's target: {e}")))?;
    req.headers_mut()
        .insert(headers::CAPABILITY, headers::value(name.as_str()));
    Ok(Some(format!("http://{authority}{}{name}", PATH_PREFIX)))
}

/// Resolves the capability from the `reach-capability` header or a `<capability>.reach` authority.
pub(crate) fn capability_of<B>(req: &Request<B>) -> Result<Name, ReachError> {
    match wanted(req, &headers::Head::of(req.headers()))? {
        Wanted::Named(name) | Wanted::Override(name) => Ok(name),
        Wanted::Intent => Err(ReachError::MissingCapability),
    }
}

/// What a call asks for: a capability by name (the cheap, common path: no allocation beyond the
/// name), by intent, or by name over an intent.
/// `head` is the request's head as read in one pass.
pub(in crate::outbound) fn wanted<B>(
    req: &Request<B>,
    head: &headers::Head<'_>,
) -> Result<Wanted, ReachError> {
    if req.method() == Method::CONNECT {
        let host = req
            .uri()
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        return Err(ReachError::ForeignHost { host });
    }
    let from_header = match head.capability {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| Name::parse(v.trim()).ok())
                .ok_or_else(|| {
                    ReachError::BadRequest(
                        "the `reach-capability` header is not a valid capability name".to_owned(),
                    )
                })?,
        ),
        None => None,
    };
    // `reach-capability: any` is no capability: the same ask as `any.reach`.
    let asked_any = from_header
        .as_ref()
        .is_some_and(|name| name.as_str() == ANY);
    let from_header = from_header.filter(|_| !asked_any);
    let intent =
        head.present.has(headers::Present::INTENT) && req.headers().contains_key(headers::INTENT);
    let named = |name| {
        if intent {
            Wanted::Override(name)
        } else {
            Wanted::Named(name)
        }
    };
    // An absolute-form URI (what HTTP_PROXY clients send) or an h2 `:authority`, else the Host header.
    let absolute = req.version() < Version::HTTP_2 && req.uri().authority().is_some();
    let host = host_of(req);

    if let Some(name) = host.as_deref().and_then(|h| h.strip_suffix(SUFFIX)) {
        if name == ANY {
            return Ok(from_header.map_or(Wanted::Intent, Wanted::Override));
        }
        let from_host = Name::parse(name).map_err(ReachError::BadRequest)?;
        if from_header.as_ref().is_some_and(|h| *h != from_host) {
            return Err(ReachError::BadRequest(format!(
                "the `reach-capability` header and the authority `{name}{SUFFIX}` name different capabilities"
            )));
        }
        return Ok(named(from_host));
    }
    let host_is_local = host.as_deref().is_none_or(is_loopback);
    match from_header {
        // A proxy-style request to some other host is refused even with the header: we never
        // connect to the host a client names.
        Some(_) if absolute && !host_is_local => Err(ReachError::ForeignHost {
            host: host.map(Cow::into_owned).unwrap_or_default(),
        }),
        Some(name) => Ok(named(name)),
        None if host_is_local && (intent || asked_any) => Ok(Wanted::Intent),
        None if host_is_local => Err(ReachError::MissingCapability),
        None => Err(ReachError::ForeignHost {
            host: host.map(Cow::into_owned).unwrap_or_default(),
        }),
    }
}

/// The host a request names: its absolute-form or h2 authority, else `Host` without the port.
/// Borrowed, and lowercased only when it is not already: the common call allocates nothing.
fn host_of<B>(req: &Request<B>) -> Option<Cow<'_, str>> {
    let host = match req.uri().host() {
        Some(host) => host,
        None => strip_port(req.headers().get(http::header::HOST)?.to_str().ok()?),
    };
    Some(if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    })
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split(']')
            .next()
            .map(|h| h.trim_start_matches('['))
            .unwrap_or(host);
    }
    // By byte: `rsplit_once(':')` runs a reverse char searcher, costlier than a byte scan.
    match host.bytes().rposition(|b| b == b':') {
        Some(colon) => host.get(..colon).unwrap_or(host),
        None => host,
    }
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "127.0.0.1"
        || host == "localhost"
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, host: Option<&str>, cap: Option<&str>) -> Request<()> {
        let mut b = Request::builder().uri(uri);
        if let Some(h) = host {
            b = b.header("host", h);
        }
        if let Some(c) = cap {
            b = b.header("reach-capability", c);
        }
        b.body(()).unwrap_or_default()
    }

    fn code(r: Result<Name, ReachError>) -> String {
        match r {
            Ok(n) => n.to_string(),
            Err(e) => e.code().to_owned(),
        }
    }

    #[test]
    fn the_port_is_cut_at_the_last_colon() {
        assert_eq!(strip_port("review.reach:4140"), "review.reach");
        assert_eq!(strip_port("review.reach"), "review.reach");
        assert_eq!(strip_port("[::1]:80"), "::1");
        assert_eq!(strip_port("a:b:c"), "a:b");
        assert_eq!(strip_port(":"), "");
    }

    #[test]
    fn names_the_capability_by_header_or_authority() {
        assert_eq!(
            code(capability_of(&req(
                "/x",
                Some("127.0.0.1:4140"),
                Some("code-review")
            ))),
            "code-review"
        );
        assert_eq!(
            code(capability_of(&req("/x", Some("code-review.reach"), None))),
            "code-review"
        );
        assert_eq!(
            code(capability_of(&req(
                "http://code-review.reach/x",
                None,
                None
            ))),
            "code-review"
        );
        assert_eq!(
            code(capability_of(&req("/x", Some("localhost"), Some("search")))),
            "search"
        );
    }

    #[test]
    fn is_never_an_open_proxy() {
        assert_eq!(
            code(capability_of(&req("http://example.com/", None, None))),
            "forbidden_host"
        );
        assert_eq!(
            code(capability_of(&req(
                "http://example.com/",
                None,
                Some("search")
            ))),
            "forbidden_host"
        );
        assert_eq!(
            code(capability_of(&req("/", Some("example.com"), None))),
            "forbidden_host"
        );
        assert_eq!(
            code(capability_of(&req("/", Some("127.0.0.1:4140"), None))),
            "missing_capability"
        );
        assert_eq!(
            code(capability_of(&req("/", Some("[::1]:4140"), None))),
            "missing_capability"
        );
    }

    fn with_intent(uri: &str, host: &str, cap: Option<&str>) -> Request<()> {
        let mut r = req(uri, Some(host), cap);
        r.headers_mut()
            .insert(headers::INTENT, http::HeaderValue::from_static("crawl it"));
        r
    }

    #[test]
    fn any_reach_or_an_intent_asks_for_intent_routing_and_a_name_overrides_it() {
        let w = |r: Request<()>| {
            wanted(&r, &headers::Head::of(r.headers())).map_err(|e| e.code().to_owned())
        };
        let name = |n: &str| Name::parse(n).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            w(req("/", Some("ANY.reach:4140"), None)),
            Ok(Wanted::Intent)
        );
        assert_eq!(w(req("http://any.reach/x", None, None)), Ok(Wanted::Intent));
        assert_eq!(
            w(req("/", Some("localhost"), Some("any"))),
            Ok(Wanted::Intent)
        );
        assert_eq!(
            w(with_intent("/", "127.0.0.1:4140", None)),
            Ok(Wanted::Intent)
        );
        assert_eq!(
            w(req("/", Some("any.reach"), Some("review"))),
            Ok(Wanted::Override(name("review")))
        );
        assert_eq!(
            w(with_intent("/", "127.0.0.1", Some("review"))),
            Ok(Wanted::Override(name("review")))
        );
        assert_eq!(
            w(with_intent("/", "review.reach", None)),
            Ok(Wanted::Override(name("review")))
        );
        assert_eq!(
            w(req("/", Some("localhost"), Some("review"))),
            Ok(Wanted::Named(name("review")))
        );
        // Still never an open proxy.
        assert_eq!(
            w(with_intent("http://example.com/", "example.com", None)),
            Err("forbidden_host".to_owned())
        );
        // The name-only entry point never resolves an intent.
        assert_eq!(
            code(capability_of(&req("/", Some("any.reach"), None))),
            "missing_capability"
        );
    }

    #[test]
    fn rejects_bad_or_conflicting_names() {
        assert_eq!(
            code(capability_of(&req(
                "/",
                Some("localhost"),
                Some("Bad Name")
            ))),
            "bad_request"
        );
        assert_eq!(
            code(capability_of(&req("/", Some("a.reach"), Some("b")))),
            "bad_request"
        );
    }
}
