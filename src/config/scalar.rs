//! Validated scalars for config files: each checks itself while parsing, so its error carries
//! the line and column of the bad value.

use std::fmt;

use serde::{de, Deserialize, Deserializer, Serialize};

/// A name usable as a DNS label: lowercase letters, digits and `-` (it appears in `<name>.reach`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(transparent)]
pub struct Name(String);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `raw` made into a name: lowercased, anything a DNS label cannot hold becomes `-`, and a
    /// name that had to change or be cut gets a short hash of the original, so `a.b` and `a-b`
    /// (or two long names with one prefix) stay apart. `fallback` if nothing is left.
    pub fn sanitized(raw: &str, fallback: &str) -> Self {
        if let Ok(name) = Self::parse(raw) {
            return name;
        }
        let cleaned: String = raw
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(56)
            .collect();
        let cleaned = cleaned.trim_matches('-');
        if cleaned.is_empty() {
            return Self(fallback.to_owned());
        }
        // FNV-1a: stable across builds, unlike the std hasher.
        let hash = raw.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Self(format!("{cleaned}-{:06x}", hash & 0xff_ffff))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let ok = !text.is_empty()
            && text.len() <= 63
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !text.starts_with('-')
            && !text.ends_with('-');
        if ok {
            Ok(Self(text.to_owned()))
        } else {
            Err(format!(
                "`{text}` is not a valid name: use 1-63 lowercase letters, digits and `-`, not starting or ending with `-`"
            ))
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor("a name", Name::parse))
    }
}

/// `host:port`, where host is an IP address or a DNS name.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Hash)]
#[serde(transparent)]
pub struct HostPort(String);

impl HostPort {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not a host:port address");
        let authority: http::uri::Authority = text.parse().map_err(|_| bad())?;
        if authority.port_u16().is_none() || authority.host().is_empty() || text.contains('@') {
            return Err(bad());
        }
        Ok(Self(text.to_owned()))
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor("a host:port address", HostPort::parse))
    }
}

/// An external target's endpoint: `host:port` (plain HTTP), `http://host[:port]`, or
/// `https://host[:port]` (TLS to `host`, port 443 by default). Shown as written.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Hash)]
#[serde(into = "String")]
pub struct TargetEndpoint {
    written: String,
    /// Where it is dialled: `host:port`.
    address: HostPort,
    tls: bool,
}

impl TargetEndpoint {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (rest, tls, port) = match text.split_once("://") {
            None => return HostPort::parse(text).map(Self::plain),
            Some(("https", rest)) => (rest, true, 443),
            Some(("http", rest)) => (rest, false, 80),
            Some((scheme, _)) => {
                return Err(format!(
                    "`{text}`: scheme `{scheme}` is not supported: an endpoint is `host:port`, `http://host[:port]` or `https://host[:port]`"
                ))
            }
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let bad = || {
            format!("`{text}` is not an endpoint: `http://host[:port]` or `https://host[:port]`, no path or user")
        };
        let authority: http::uri::Authority = rest.parse().map_err(|_| bad())?;
        if authority.host().is_empty() || rest.contains(['@', '/', '?', '#']) {
            return Err(bad());
        }
        let address = match authority.port_u16() {
            Some(_) => HostPort::parse(rest)?,
            None => HostPort::parse(&format!("{rest}:{port}"))?,
        };
        Ok(Self {
            written: text.to_owned(),
            address,
            tls,
        })
    }

    /// A plain `host:port` endpoint.
    pub(crate) fn plain(address: HostPort) -> Self {
        Self {
            written: address.to_string(),
            address,
            tls: false,
        }
    }

    /// `host:port`, always with the port.
    pub(crate) fn address(&self) -> &HostPort {
        &self.address
    }

    /// The host alone (a DNS name or an IP address, without brackets).
    pub(crate) fn host(&self) -> &str {
        let address = self.address.as_str();
        let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    }

    /// Whether it is called over TLS (`https://`).
    pub(crate) fn is_tls(&self) -> bool {
        self.tls
    }
}

impl From<TargetEndpoint> for String {
    fn from(endpoint: TargetEndpoint) -> Self {
        endpoint.written
    }
}

impl fmt::Display for TargetEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

impl<'de> Deserialize<'de> for TargetEndpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor(
            "an endpoint: host:port or https://host[:port]",
            TargetEndpoint::parse,
        ))
    }
}

/// How good an agent is at a tag, from 0 (not at all) to 1 (expert).
#[derive(Clone, Copy, Debug, Serialize, PartialEq, PartialOrd)]
#[serde(transparent)]
pub struct Proficiency(f64);

impl Proficiency {
    pub fn get(self) -> f64 {
        self.0
    }

    /// `x` held to 0..1 (NaN is 0): for proficiencies that do not come from a file.
    pub fn clamped(x: f64) -> Self {
        Self(if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) })
    }
}

impl<'de> Deserialize<'de> for Proficiency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(d)?;
        if (0.0..=1.0).contains(&value) {
            Ok(Self(value))
        } else {
            Err(de::Error::custom(format!(
                "proficiency {value} must be between 0 and 1"
            )))
        }
    }
}

/// A count that must be at least 1.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct PositiveCount(pub(super) usize);

impl PositiveCount {
    pub fn get(self) -> usize {
        self.0
    }
}

impl<'de> Deserialize<'de> for PositiveCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor("a whole number of at least 1", |value: f64| {
            if value >= 1.0 && value.fract() == 0.0 && value <= u32::MAX as f64 {
                Ok(Self(value as usize))
            } else {
                Err(format!("{value} must be a whole number of at least 1"))
            }
        }))
    }
}

/// A non-negative declared cost.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, PartialOrd)]
#[serde(transparent)]
pub struct Cost(pub f64);

impl<'de> Deserialize<'de> for Cost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor("a cost of at least 0", |value: f64| {
            if value >= 0.0 && value.is_finite() {
                Ok(Self(value))
            } else {
                Err(format!("cost {value} must be a number of at least 0"))
            }
        }))
    }
}

/// A request-head size limit: at least 8 KiB (hyper's floor), at most 1 MiB.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct HeaderBytes(pub(super) usize);

impl HeaderBytes {
    pub fn get(self) -> usize {
        self.0
    }
}

impl<'de> Deserialize<'de> for HeaderBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor("a byte count", |value: f64| {
            if (8192.0..=1048576.0).contains(&value) && value.fract() == 0.0 {
                Ok(Self(value as usize))
            } else {
                Err(format!(
                    "max_header_bytes {value} must be a whole number between 8192 and 1048576"
                ))
            }
        }))
    }
}

// Validation runs inside the visitor, while the parser still knows where the scalar is: an
// error raised after deserializing would point at the enclosing mapping instead.

struct StrVisitor<F>(&'static str, F);

impl<T, F: FnOnce(&str) -> Result<T, String>> de::Visitor<'_> for StrVisitor<F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        (self.1)(v).map_err(E::custom)
    }
}

pub(super) struct NumVisitor<F>(pub(super) &'static str, pub(super) F);

impl<T, F: FnOnce(f64) -> Result<T, String>> de::Visitor<'_> for NumVisitor<F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        (self.1)(v as f64).map_err(E::custom)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        (self.1)(v as f64).map_err(E::custom)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        (self.1)(v).map_err(E::custom)
    }
}

impl PositiveCount {
    pub fn new(value: usize) -> Option<Self> {
        (value >= 1).then_some(Self(value))
    }
}

// A probe's request parts are checked when the file is read: a probe that can never be sent
// would fail forever and keep its agent out of rotation.

pub(super) fn http_method<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_str(StrVisitor("an HTTP method", |t: &str| {
        http::Method::from_bytes(t.as_bytes())
            .map(|_| t.to_owned())
            .map_err(|_| format!("`{t}` is not an HTTP method"))
    }))
}

pub(super) fn http_path<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_str(StrVisitor("a request path", |t: &str| {
        let ok = t.starts_with('/') && t.parse::<http::uri::PathAndQuery>().is_ok();
        ok.then(|| t.to_owned())
            .ok_or_else(|| format!("`{t}` is not a request path starting with `/`"))
    }))
}

pub(super) fn http_headers<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    let headers = std::collections::BTreeMap::<String, String>::deserialize(d)?;
    for (name, value) in &headers {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(de::Error::custom(format!("`{name}` is not a header name")));
        }
        if http::HeaderValue::from_str(value).is_err() {
            return Err(de::Error::custom(format!(
                "the value of header `{name}` is not valid"
            )));
        }
    }
    Ok(headers)
}

/// A list of header names, lower-cased.
pub(super) fn header_names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    names
        .into_iter()
        .map(|name| match http::HeaderName::from_bytes(name.as_bytes()) {
            Ok(valid) => Ok(valid.as_str().to_owned()),
            Err(_) => Err(de::Error::custom(format!("`{name}` is not a header name"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::yaml;

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in any::<String>()) {
            let _ = Name::parse(&text);
            let _ = HostPort::parse(&text);
            let _ = TargetEndpoint::parse(&text);
            let _ = yaml::from_str::<Name>(&text);
            let _ = yaml::from_str::<HostPort>(&text);
            let _ = yaml::from_str::<PositiveCount>(&text);
            let _ = yaml::from_str::<HeaderBytes>(&text);
            let _ = yaml::from_str::<Cost>(&text);
            let _ = yaml::from_str::<Proficiency>(&text);
        }

        /// Whatever the pod or host is called, the sanitized name is a valid one.
        #[test]
        fn sanitized_names_are_valid(raw in any::<String>()) {
            let name = Name::sanitized(&raw, "agent");
            prop_assert_eq!(Name::parse(name.as_str()), Ok(name.clone()));
        }

        #[test]
        fn valid_names_round_trip(text in "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?") {
            let name = Name::parse(&text);
            prop_assert_eq!(name.as_ref().map(Name::as_str), Ok(text.as_str()));
            let sanitized = Name::sanitized(&text, "agent");
            prop_assert_eq!(sanitized.as_str(), text.as_str());
            let back: Result<Name, _> = yaml::from_str(&yaml::to_string(&name.ok()).unwrap_or_default());
            prop_assert_eq!(back.ok().map(|n| n.0), Some(text));
        }

        #[test]
        fn host_ports_round_trip(host in "[a-z][a-z0-9-]{0,20}(\\.[a-z][a-z0-9-]{0,20}){0,3}", port in any::<u16>()) {
            let text = format!("{host}:{port}");
            prop_assert_eq!(HostPort::parse(&text).map(|h| h.as_str().to_owned()), Ok(text.clone()));
            let ip = format!("{}:{port}", std::net::Ipv4Addr::from(port as u32 * 65_537));
            prop_assert!(HostPort::parse(&ip).is_ok(), "{}", ip);
        }

        /// Numbers are accepted exactly when they are in range, and come back as written.
        #[test]
        fn numbers_are_checked_and_round_trip(v in prop_oneof![any::<f64>(), -2.0..2.0f64, Just(f64::NAN)]) {
            let text = yaml::to_string(&v).unwrap_or_default();
            let proficiency = yaml::from_str::<Proficiency>(&text).ok().map(Proficiency::get);
            prop_assert_eq!(proficiency, (0.0..=1.0).contains(&v).then_some(v));
            let cost = yaml::from_str::<Cost>(&text).ok().map(|c| c.0);
            prop_assert_eq!(cost, (v >= 0.0 && v.is_finite()).then_some(v));
        }

        #[test]
        fn counts_are_checked_and_round_trip(n in any::<u64>()) {
            let text = n.to_string();
            let count = yaml::from_str::<PositiveCount>(&text).ok().map(PositiveCount::get);
            prop_assert_eq!(count, (1..=u64::from(u32::MAX)).contains(&n).then_some(n as usize));
            let bytes = yaml::from_str::<HeaderBytes>(&text).ok().map(HeaderBytes::get);
            prop_assert_eq!(bytes, (8192..=1 << 20).contains(&n).then_some(n as usize));
        }
    }

    #[test]
    fn target_endpoints_are_host_port_or_an_http_url_and_default_the_port() {
        let parsed = |t: &str| {
            TargetEndpoint::parse(t)
                .map(|e| (e.address().to_string(), e.host().to_owned(), e.is_tls()))
        };
        let ok = |a: &str, h: &str, tls| Ok((a.to_owned(), h.to_owned(), tls));
        assert_eq!(parsed("svc:8080"), ok("svc:8080", "svc", false));
        assert_eq!(
            parsed("https://api.example.com"),
            ok("api.example.com:443", "api.example.com", true)
        );
        assert_eq!(
            parsed("https://api.example.com/"),
            ok("api.example.com:443", "api.example.com", true)
        );
        assert_eq!(
            parsed("https://127.0.0.1:8443"),
            ok("127.0.0.1:8443", "127.0.0.1", true)
        );
        assert_eq!(parsed("https://[::1]:8443"), ok("[::1]:8443", "::1", true));
        assert_eq!(
            parsed("http://litellm.ai.svc"),
            ok("litellm.ai.svc:80", "litellm.ai.svc", false)
        );
        let refused = |t: &str| TargetEndpoint::parse(t).err().unwrap_or_default();
        assert!(
            refused("ftp://x:21").contains("scheme `ftp` is not supported"),
            "{}",
            refused("ftp://x:21")
        );
        assert!(refused("https://api.example.com/v1").contains("no path"));
        assert!(refused("https://user@api.example.com").contains("no path or user"));
        assert!(refused("https://").contains("is not an endpoint"));
        assert!(
            !refused("svc").is_empty(),
            "a plain endpoint still needs its port"
        );
        let shown = yaml::to_string(&TargetEndpoint::parse("https://api.example.com").ok());
        assert_eq!(
            shown.ok().as_deref().map(str::trim),
            Some("https://api.example.com")
        );
    }
}
