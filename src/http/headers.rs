//! Header names agent-reach speaks, and hop-by-hop handling (RFC 9110 §7.6.1).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Names the capability a call is for (outbound), or was routed as (inbound).
pub const CAPABILITY: HeaderName = HeaderName::from_static("reach-capability");
/// Why the sidecar itself answered: the error code of its JSON body.
pub const REASON: HeaderName = HeaderName::from_static("reach-reason");
/// The agent that served the request.
pub(crate) const AGENT: HeaderName = HeaderName::from_static("reach-agent");
/// The agent whose sidecar sent the request.
pub(crate) const CALLER: HeaderName = HeaderName::from_static("reach-caller");
/// The caller's SPIFFE ID, set by the callee's sidecar from the verified client certificate.
pub(crate) const CALLER_IDENTITY: HeaderName = HeaderName::from_static("reach-caller-identity");

/// Asks the outbound sidecar to pick the capability by the policy's intent rules from this text.
pub(crate) const INTENT: HeaderName = HeaderName::from_static("reach-intent");
/// On the answer to a call: the capability it went to and why (`docs/intents.md`).
pub(crate) const RESOLVED_CAPABILITY: HeaderName =
    HeaderName::from_static("reach-resolved-capability");

/// Which attempt of the caller's this is (1 for the first).
pub(crate) const ATTEMPT: HeaderName = HeaderName::from_static("reach-attempt");
/// How many attempts a routed call took (on the response to the agent).
pub(crate) const ATTEMPTS: HeaderName = HeaderName::from_static("reach-attempts");
/// Routing hints from the calling agent.
pub const TAGS: HeaderName = HeaderName::from_static("reach-tags");
pub(crate) const MODE: HeaderName = HeaderName::from_static("reach-mode");
/// An affinity key: calls carrying the same value go to the agent that answered the first
/// (`docs/affinity.md`).
pub(crate) const AFFINITY: HeaderName = HeaderName::from_static("reach-affinity");
/// MCP streamable HTTP's session, assigned by the server on `initialize`.
pub(crate) const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// The local agent reporting its own load on a response.
pub(crate) const BUSY: HeaderName = HeaderName::from_static("reach-busy");
pub(crate) const LOAD: HeaderName = HeaderName::from_static("reach-load");

/// A small count as a header value: static for 0–9 (no allocation), formatted above.
pub(crate) fn count(n: usize) -> HeaderValue {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match DIGITS.get(n) {
        Some(digit) => HeaderValue::from_static(digit),
        None => n.into(),
    }
}

const HOPS: usize = 8;
/// Headers that describe one connection and must not be forwarded. A `static`, not a `const`:
/// a `const` array of names is built and dropped at each use, every request.
static HOP_BY_HOP: [HeaderName; HOPS] = static_names(HOP_NAMES);
const HOP_NAMES: [&str; HOPS] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The lengths of the [`HOP_BY_HOP`] names and `te`, as bits.
const HOP_LENGTHS: u32 = {
    let mut lengths = 1 << "te".len();
    let mut i = 0;
    while i < HOPS {
        lengths |= 1 << HOP_NAMES[i].len();
        i += 1;
    }
    lengths
};

/// Whether a message's body is JSON by its `content-type` (`application/json` or `…+json`).
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split(';').next().unwrap_or("").trim();
            essence.eq_ignore_ascii_case("application/json") || essence.ends_with("+json")
        })
}

/// Whether a message's body is a stream of server-sent events by its `content-type`.
pub(crate) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// Removes every sidecar-internal `reach-*` header: for a service outside the mesh, which has no
/// use for them and should not learn the fleet's names. `traceparent` and `tracestate` stay.
pub(crate) fn strip_internal(headers: &mut HeaderMap) {
    let internal: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with("reach-"))
        .cloned()
        .collect();
    for name in internal {
        headers.remove(name);
    }
}

/// Removes hop-by-hop headers, including every header the `Connection` header names.
/// `te: trailers` survives: it is end-to-end in practice (gRPC needs it).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of them, and most others only `Connection: keep-alive`: one pass
    // over the names finds which are there, and only those are removed (each removal hashes).
    let mut found = [false; HOPS];
    let mut te = false;
    for name in headers.keys() {
        let name = name.as_str();
        // Most names are none of them by length alone (`host`, `date`, `content-type`).
        if name.len() >= 32 || HOP_LENGTHS & (1 << name.len()) == 0 {
            continue;
        }
        match hop_by_hop(name) {
            Some(i) => found[i] = true,
            None => te |= name == "te",
        }
    }
    if !te && !found.contains(&true) {
        return;
    }
    if found[0] {
        // Every header `Connection` names goes too; `Connection` itself with them.
        for token in named_by_connection(headers) {
            // Looked up by `&str`: no header name is made for it.
            headers.remove(token.as_str());
        }
        found[0] = false;
    }
    for (name, _) in HOP_BY_HOP.iter().zip(found).filter(|(_, f)| *f) {
        headers.remove(name);
    }
    if te {
        let keep_te = headers
            .get(header::TE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
        if !keep_te {
            headers.remove(header::TE);
        }
    }
}

/// Removes `Connection` (every value, one lookup) and returns the headers it names. Its usual
/// values, `keep-alive` and `close`, name hop-by-hop headers or none: nothing is split, trimmed
/// or allocated for them.
fn named_by_connection(headers: &mut HeaderMap) -> Vec<String> {
    let header::Entry::Occupied(entry) = headers.entry(header::CONNECTION) else {
        return Vec::new();
    };
    let mut named = Vec::new();
    for value in entry.remove_entry_mult().1 {
        let bytes = value.as_bytes();
        if bytes.eq_ignore_ascii_case(b"keep-alive") || bytes.eq_ignore_ascii_case(b"close") {
            continue;
        }
        let Ok(text) = value.to_str() else { continue };
        named.extend(
            text.split(',')
                .map(str::trim)
                .filter(|token| {
                    !token.is_empty()
                        && !HOP_BY_HOP
                            .iter()
                            .any(|h| h.as_str().eq_ignore_ascii_case(token))
                })
                .map(str::to_owned),
        );
    }
    named
}

/// Which of the headers the outbound steps read a call carries, found in one pass over its
/// names. A plain call carries none of them, and looking up a name that is not there hashes it
/// and probes the map, a dozen times a call; comparing a name with these
/// is one string match. A clear bit means the header is absent; a set one, look it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Present(u16);

impl Present {
    pub(crate) const CAPABILITY: Self = Self(1);
    pub(crate) const INTENT: Self = Self(1 << 1);
    /// `reach-deadline`.
    pub(crate) const DEADLINE: Self = Self(1 << 2);
    /// `reach-chain`.
    pub(crate) const CHAIN: Self = Self(1 << 3);
    pub(crate) const TAGS: Self = Self(1 << 4);
    pub(crate) const MODE: Self = Self(1 << 5);
    pub(crate) const AFFINITY: Self = Self(1 << 6);
    pub(crate) const MCP_SESSION: Self = Self(1 << 7);
    /// `idempotency-key`.
    pub(crate) const IDEMPOTENCY_KEY: Self = Self(1 << 8);
    /// `prefer`.
    pub(crate) const PREFER: Self = Self(1 << 9);
    /// `reach-timeout`.
    pub(crate) const TIMEOUT: Self = Self(1 << 10);

    /// Every bit set: look everything up (for callers that did not scan).
    #[cfg(test)]
    pub(crate) const ALL: Self = Self(u16::MAX);

    /// These and `other`.
    pub(crate) fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// These but `other`.
    pub(crate) fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// The headers of these that `headers` carries.
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        Head::of(headers).present
    }

    /// Which of these `name` is (0: none).
    fn bit(name: &HeaderName) -> u16 {
        match name.as_str() {
            "reach-capability" => Self::CAPABILITY.0,
            "reach-intent" => Self::INTENT.0,
            "reach-timeout" => Self::TIMEOUT.0,
            "reach-deadline" => Self::DEADLINE.0,
            "reach-chain" => Self::CHAIN.0,
            "reach-tags" => Self::TAGS.0,
            "reach-mode" => Self::MODE.0,
            "reach-affinity" => Self::AFFINITY.0,
            "mcp-session-id" => Self::MCP_SESSION.0,
            "idempotency-key" => Self::IDEMPOTENCY_KEY.0,
            "prefer" => Self::PREFER.0,
            _ => 0,
        }
    }

    /// Whether the header may be there (so is worth looking up).
    pub(crate) fn has(self, which: Self) -> bool {
        self.0 & which.0 != 0
    }
}

/// A request's head as both listeners first read it, in one pass over its headers: which of
/// [`Present`]'s it carries, and the first values of the two a peer's sidecar always sends and
/// every call is decided on. Looking each up again hashed its name and probed the map.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Head<'a> {
    pub(crate) present: Present,
    /// `reach-capability`.
    pub(crate) capability: Option<&'a HeaderValue>,
    /// `reach-deadline`.
    pub(crate) deadline: Option<&'a HeaderValue>,
}

impl<'a> Head<'a> {
    pub(crate) fn of(headers: &'a HeaderMap) -> Self {
        let mut head = Head {
            present: Present(0),
            capability: None,
            deadline: None,
        };
        // A name's values come one after another, its first first: the first seen is `get`'s.
        for (name, value) in headers {
            let bit = Present::bit(name);
            if bit == Present::CAPABILITY.0 {
                head.capability.get_or_insert(value);
            } else if bit == Present::DEADLINE.0 {
                head.deadline.get_or_insert(value);
            }
            head.present.0 |= bit;
        }
        head
    }
}

/// Header names from lowercase literals, at compile time: a `static` list of names and the
/// strings it is matched by stay one list.
pub(crate) const fn static_names<const N: usize>(names: [&'static str; N]) -> [HeaderName; N] {
    let mut out = [const { HeaderName::from_static("-") }; N];
    let mut i = 0;
    while i < N {
        // A static name owns nothing: forgetting the placeholder leaks nothing.
        std::mem::forget(std::mem::replace(
            &mut out[i],
            HeaderName::from_static(names[i]),
        ));
        i += 1;
    }
    out
}

/// Which of [`HOP_BY_HOP`] `name` is: one string match (by length, then bytes) rather than a
/// comparison with each of the eight.
fn hop_by_hop(name: &str) -> Option<usize> {
    Some(match name {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "trailer" => 5,
        "transfer-encoding" => 6,
        "upgrade" => 7,
        _ => return None,
    })
}

/// An IP address as text, written by hand: `Display` for an address goes through the
/// formatter's padding machinery, on every call. IPv4-mapped IPv6 addresses
/// are written as IPv4.
pub(crate) fn ip_text(ip: std::net::IpAddr) -> String {
    match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => {
            let mut text = String::with_capacity(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text.push('.');
                }
                if octet >= 100 {
                    text.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    text.push(char::from(b'0' + octet / 10 % 10));
                }
                text.push(char::from(b'0' + octet % 10));
            }
            text
        }
        v6 => v6.to_string(),
    }
}

/// A header value from a string we produced; falls back to an empty value rather than panicking.
pub(crate) fn value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_header_a_step_reads_sets_its_bit_and_others_none() {
        let table = [
            (CAPABILITY, Present::CAPABILITY),
            (INTENT, Present::INTENT),
            (HeaderName::from_static("reach-timeout"), Present::TIMEOUT),
            (HeaderName::from_static("reach-deadline"), Present::DEADLINE),
            (HeaderName::from_static("reach-chain"), Present::CHAIN),
            (TAGS, Present::TAGS),
            (MODE, Present::MODE),
            (AFFINITY, Present::AFFINITY),
            (MCP_SESSION_ID, Present::MCP_SESSION),
            (
                header::HeaderName::from_static("idempotency-key"),
                Present::IDEMPOTENCY_KEY,
            ),
            (header::HeaderName::from_static("prefer"), Present::PREFER),
        ];
        for (name, bit) in table {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_static("a.reach"));
            let without = Present::of(&headers);
            headers.insert(name.clone(), HeaderValue::from_static("x"));
            let with = Present::of(&headers);
            assert!(!without.has(bit) && with.has(bit), "{name}");
            assert_eq!(with, Present(without.0 | bit.0), "{name} sets only its bit");
        }
        assert!(Present::ALL.has(Present::PREFER));
    }

    #[test]
    fn strip_internal_drops_every_reach_header_and_keeps_the_trace_context() {
        let mut h = HeaderMap::new();
        for name in [
            "reach-capability",
            "reach-deadline",
            "reach-chain",
            "reach-caller",
        ] {
            h.insert(name, HeaderValue::from_static("x"));
        }
        h.append("reach-tags", HeaderValue::from_static("a"));
        h.append("reach-tags", HeaderValue::from_static("b"));
        for name in ["traceparent", "tracestate", "authorization", "x-reach-note"] {
            h.insert(name, HeaderValue::from_static("y"));
        }
        strip_internal(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            ["authorization", "traceparent", "tracestate", "x-reach-note"]
        );
    }

    #[test]
    fn ip_text_is_what_display_writes() {
        for ip in [
            "0.0.0.0",
            "10.0.0.7",
            "127.0.0.1",
            "192.168.100.255",
            "8.80.9.199",
        ] {
            let ip: std::net::IpAddr = ip.parse().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(ip_text(ip), ip.to_string());
        }
        let mapped: std::net::IpAddr = "::ffff:10.1.2.3".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ip_text(mapped), "10.1.2.3");
        let v6: std::net::IpAddr = "fd00::1".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ip_text(v6), "fd00::1");
    }

    #[test]
    fn the_match_names_the_list() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop(name.as_str()), Some(i), "{name}");
            assert_ne!(HOP_LENGTHS & (1 << name.as_str().len()), 0, "{name}");
        }
        assert_ne!(HOP_LENGTHS & (1 << "te".len()), 0);
        assert_eq!(hop_by_hop("te"), None);
        assert_eq!(hop_by_hop("content-type"), None);
    }

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn every_connection_header_counts_and_tokens_ignore_case() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
        h.append(header::CONNECTION, HeaderValue::from_static("X-One , te"));
        h.insert("x-one", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn a_lone_keep_alive_goes_with_its_header_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Keep-Alive"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn keeps_te_trailers() {
        let mut h = HeaderMap::new();
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut h);
        assert!(h.contains_key(header::TE));
    }
}
