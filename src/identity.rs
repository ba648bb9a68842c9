//! Workload identity: a SPIFFE ID (`spiffe://<trust-domain>/<path>`), the URI SAN of a sidecar's
//! certificate, and the patterns authorization matches it with (`docs/mtls.md`).

use std::fmt;
use std::sync::Arc;

use serde::{de, Deserialize, Deserializer, Serialize};

const SCHEME: &str = "spiffe://";
/// SPIFFE caps an ID at 2048 bytes.
const MAX_LEN: usize = 2048;

/// A verified workload identity, e.g. `spiffe://prod.example/ns/billing/sa/payments`. Cheap to
/// clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SpiffeId(Arc<str>);

/// An identity pattern: a SPIFFE ID whose path segments (and trust domain) may be `*`, which
/// matches exactly one segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct IdentityPattern(String);

impl SpiffeId {
    pub fn parse(text: &str) -> Result<Self, String> {
        check(text, false)?;
        Ok(Self(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trust domain: `prod.example` in `spiffe://prod.example/ns/…`.
    pub(crate) fn trust_domain(&self) -> &str {
        let rest = self.0.strip_prefix(SCHEME).unwrap_or(&self.0);
        rest.split('/').next().unwrap_or_default()
    }

    /// The last path segment: the service account in `…/ns/<ns>/sa/<sa>`.
    pub(crate) fn leaf(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or_default()
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl<'de> Deserialize<'de> for SpiffeId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(de::Error::custom)
    }
}

impl IdentityPattern {
    pub fn parse(text: &str) -> Result<Self, String> {
        check(text, true)?;
        Ok(Self(text.to_owned()))
    }

    /// Whether `id` matches: segment by segment, `*` standing for any one segment.
    pub(crate) fn matches(&self, id: &SpiffeId) -> bool {
        let (Some(pattern), Some(id)) = (
            self.0.strip_prefix(SCHEME),
            id.as_str().strip_prefix(SCHEME),
        ) else {
            return false;
        };
        let mut want = pattern.split('/');
        let mut have = id.split('/');
        loop {
            match (want.next(), have.next()) {
                (None, None) => return true,
                (Some(w), Some(h)) if w == "*" || w == h => {}
                _ => return false,
            }
        }
    }
}

impl<'de> Deserialize<'de> for IdentityPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(de::Error::custom)
    }
}

/// A SPIFFE ID: the scheme, a trust domain of lowercase letters, digits, `.`, `-` and `_`, and
/// a path of non-empty segments of letters, digits, `.`, `-` and `_`. With `wildcards`, a
/// segment (or the trust domain) may be `*`.
fn check(text: &str, wildcards: bool) -> Result<(), String> {
    let bad = |why: &str| Err(format!("`{text}` is not a SPIFFE ID ({why})"));
    if text.len() > MAX_LEN {
        return bad("longer than 2048 bytes");
    }
    let Some(rest) = text.strip_prefix(SCHEME) else {
        return bad("it must start with `spiffe://`");
    };
    let mut parts = rest.split('/');
    let domain = parts.next().unwrap_or_default();
    let star = |s: &str| wildcards && s == "*";
    if domain.is_empty() {
        return bad("no trust domain");
    }
    if !star(domain)
        && !domain
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
    {
        return bad("a trust domain is lowercase letters, digits, `.`, `-` and `_`");
    }
    for segment in parts {
        if segment.is_empty() {
            return bad("an empty path segment");
        }
        if segment == "." || segment == ".." {
            return bad("a `.` or `..` segment");
        }
        if !star(segment)
            && !segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        {
            return bad("a path segment is letters, digits, `.`, `-` and `_`");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SpiffeId {
        SpiffeId::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn pattern(s: &str) -> IdentityPattern {
        IdentityPattern::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_star_matches_exactly_one_segment() {
        let billing = pattern("spiffe://prod.example/ns/billing/sa/*");
        assert!(billing.matches(&id("spiffe://prod.example/ns/billing/sa/payments")));
        assert!(!billing.matches(&id("spiffe://prod.example/ns/billing/sa")));
        assert!(!billing.matches(&id("spiffe://prod.example/ns/billing/sa/a/b")));
        assert!(!billing.matches(&id("spiffe://other.example/ns/billing/sa/payments")));
        let coder = pattern("spiffe://prod.example/ns/*/sa/coder");
        assert!(coder.matches(&id("spiffe://prod.example/ns/team-a/sa/coder")));
        assert!(!coder.matches(&id("spiffe://prod.example/ns/team-a/sa/reviewer")));
        assert!(pattern("spiffe://prod.example/ns/a/sa/b")
            .matches(&id("spiffe://prod.example/ns/a/sa/b")));
    }

    #[test]
    fn malformed_ids_and_patterns_are_refused_with_a_reason() {
        for bad in [
            "",
            "https://x/y",
            "spiffe://",
            "spiffe:///ns/a",
            "spiffe://Prod/ns/a",
            "spiffe://p/ns//a",
            "spiffe://p/ns/../a",
            "spiffe://p/ns/a b",
        ] {
            let err = SpiffeId::parse(bad).err();
            assert!(err.is_some_and(|e| e.contains("not a SPIFFE ID")), "{bad}");
        }
        assert!(
            SpiffeId::parse("spiffe://p/ns/*").is_err(),
            "no wildcard in an ID"
        );
        assert!(IdentityPattern::parse("spiffe://p/ns/*").is_ok());
        assert_eq!(id("spiffe://p/ns/a/sa/coder").leaf(), "coder");
    }
}
