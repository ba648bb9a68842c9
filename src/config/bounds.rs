//! Range checks for config values, listed per file in one table (`bootstrap::RULES`,
//! `policy::RULES`), and a walk over the document that applies them where each value is written.
//!
//! Why a second walk and not checks in each field's type: many fields are plain `f64`/`u32`/
//! `usize` read all over the crate, and one table per file is easy to review and to extend. The
//! walk validates inside serde's visitor, while the parser still knows where the scalar is, so
//! every error carries the file, line and column like the loaders' other errors.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::duration::parse_duration;

/// What a key may hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Rule {
    /// A whole number in `min..=max`.
    Whole(u64, u64),
    /// A finite number in `min..=max`.
    Real(f64, f64),
    /// A finite number above `min` (exclusive) and at most `max`.
    Above(f64, f64),
    /// A duration in `min..=max`.
    Span(Duration, Duration),
    /// An `ip:port` on the loopback interface.
    Loopback,
    /// A request path starting with `/`.
    PathPrefix,
    /// Anything at all, `null` included (an expected JSON value): not walked.
    Any,
}

/// A table row: a dotted key path (`[]` after a key: any item of that list; `*`: any key)
/// and its rule.
pub(crate) type Row = (&'static str, Rule);

// Short names keep each table row on one line.
pub(crate) const ZERO: Duration = Duration::ZERO;
pub(crate) const MS: Duration = Duration::from_millis(1);
pub(crate) const MINUTE: Duration = Duration::from_secs(60);
pub(crate) const HOUR: Duration = Duration::from_secs(3600);
pub(crate) const DAY: Duration = Duration::from_secs(86_400);

pub(crate) const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

impl Rule {
    /// Checks a number (a number where this rule wants text is left to the typed parse).
    fn number(self, value: f64) -> Result<(), String> {
        let ok = value.is_finite()
            && match self {
                Rule::Whole(min, max) => {
                    value.fract() == 0.0 && value >= min as f64 && value <= max as f64
                }
                Rule::Real(min, max) => value >= min && value <= max,
                Rule::Above(min, max) => value > min && value <= max,
                // A wrong type: the typed parse says so.
                Rule::Span(..) | Rule::Loopback | Rule::PathPrefix | Rule::Any => true,
            };
        if ok {
            Ok(())
        } else {
            Err(format!("must be {self}, not {value}"))
        }
    }

    fn text(self, value: &str) -> Result<(), String> {
        match self {
            Rule::Span(min, max) => match parse_duration(value) {
                Ok(d) if d < min || d > max => Err(format!("must be {self}, not `{value}`")),
                // A bad duration is reported by the typed parse.
                _ => Ok(()),
            },
            Rule::Loopback => match value.parse::<SocketAddr>() {
                Ok(addr) if !addr.ip().is_loopback() => Err(format!(
                    "`{value}` is not a loopback address: the outbound listener routes for the local agent only, and bound elsewhere it would be an open proxy"
                )),
                _ => Ok(()),
            },
            Rule::PathPrefix => {
                if value.starts_with('/') && value.parse::<http::uri::PathAndQuery>().is_ok() {
                    Ok(())
                } else {
                    Err(format!("`{value}` is not a request path starting with `/`"))
                }
            }
            Rule::Whole(..) | Rule::Real(..) | Rule::Above(..) | Rule::Any => Ok(()),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use super::duration::format_duration as d;
        match *self {
            Rule::Whole(min, max) => write!(f, "a whole number from {min} to {max}"),
            Rule::Real(min, max) => write!(f, "a number from {min} to {max}"),
            Rule::Above(min, max) => write!(f, "a number above {min}, at most {max}"),
            Rule::Span(min, max) => write!(f, "a duration from {} to {}", d(min), d(max)),
            Rule::Loopback => f.write_str("a loopback ip:port"),
            Rule::PathPrefix => f.write_str("a request path starting with `/`"),
            Rule::Any => f.write_str("any value"),
        }
    }
}

/// The rule for a concrete key path (`agent.capabilities[].tags.python`), if any.
pub(crate) fn rule_for(rules: &[Row], path: &str) -> Option<Rule> {
    rules
        .iter()
        .find(|(pattern, _)| matches(pattern, path))
        .map(|(_, rule)| *rule)
}

fn matches(pattern: &str, path: &str) -> bool {
    let (mut p, mut k) = (pattern.split('.'), path.split('.'));
    loop {
        match (p.next(), k.next()) {
            (None, None) => return true,
            (Some(p), Some(k)) => {
                let same = match (p.strip_suffix("[]"), k.strip_suffix("[]")) {
                    (Some(p), Some(k)) => p == "*" || p == k,
                    (None, None) => p == "*" || p == k,
                    _ => false,
                };
                if !same {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

/// Walks one document, checking every value against `rules`; an empty value anywhere (a key
/// with nothing after it) is refused too: it is how a file cut short looks, and serde would
/// quietly read it as "all defaults" or "none".
pub(crate) struct Walk<'a> {
    pub(crate) rules: &'a [Row],
    pub(crate) path: String,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if rule_for(self.rules, &self.path) == Some(Rule::Any) {
            return d.deserialize_ignored_any(IgnoredAny).map(|_| ());
        }
        d.deserialize_any(self)
    }
}

impl Walk<'_> {
    fn check<E: de::Error>(&self, f: impl FnOnce(Rule) -> Result<(), String>) -> Result<(), E> {
        match rule_for(self.rules, &self.path) {
            Some(rule) => f(rule).map_err(E::custom),
            None => Ok(()),
        }
    }

    fn child(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a config value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.check(|r| r.number(v as f64))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.check(|r| r.number(v as f64))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.check(|r| r.number(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.check(|r| r.text(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        if self.path.is_empty() {
            return Ok(()); // the whole document: the typed parse says what it must be
        }
        Err(E::custom(
            "has no value (is the file cut short?): give it one, or leave the key out",
        ))
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let path = format!("{}[]", self.path);
        while seq
            .next_element_seed(Walk {
                rules: self.rules,
                path: path.clone(),
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Key>()? {
            map.next_value_seed(Walk {
                rules: self.rules,
                path: self.child(&key.0),
            })?;
        }
        Ok(())
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        // A tagged value (`!tag`): the typed parse decides whether it is allowed.
        let (IgnoredAny, variant) = data.variant()?;
        de::VariantAccess::newtype_variant_seed(variant, self)
    }
}

/// A mapping key as text, whatever scalar it is written as.
struct Key(String);

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
                Ok(Key("~".to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_items_and_any_key() {
        let rules: &[Row] = &[("a.b[].c.*", Rule::Any), ("x.*.*", Rule::Loopback)];
        assert_eq!(rule_for(rules, "a.b[].c.python"), Some(Rule::Any));
        assert_eq!(rule_for(rules, "a.b.c.python"), None);
        assert_eq!(rule_for(rules, "a.b[].c"), None);
        assert_eq!(rule_for(rules, "x.sync.cost"), Some(Rule::Loopback));
        assert_eq!(rule_for(rules, "x.sync"), None);
    }
}
