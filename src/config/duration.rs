//! Human durations in config files: `250ms`, `30s`, `5m`, `1h`, `1.5s`.

use std::fmt;
use std::time::Duration;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A duration written the way operators write it (`250ms`, `30s`, `5m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    pub const fn from_secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }

    pub fn get(self) -> Duration {
        self.0
    }
}

/// Parses `<number><unit>` where unit is one of `ms`, `s`, `m`, `h`; the number may have a fraction.
///
/// ```
/// use std::time::Duration;
/// use agent_reach::config::parse_duration;
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("30").is_err()); // a unit is required
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration `{text}` needs a unit (ms, s, m or h), e.g. `30s`"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("duration `{text}` does not start with a number"))?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "duration `{text}` has unknown unit `{other}` (use ms, s, m or h)"
            ))
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > 365.0 * 86_400.0 {
        return Err(format!("duration `{text}` is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a duration the way `parse_duration` reads it, with the largest exact unit.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 && !d.is_zero() {
        return format!("{}ms", d.as_secs_f64() * 1000.0);
    }
    if ms % 3_600_000 == 0 && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as `250ms`, `30s` or `5m`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                parse_duration(v).map(HumanDuration).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "duration `{v}` needs a unit, e.g. `{v}s` or `{v}ms`"
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "duration `{v}` needs a unit, e.g. `{v}s` or `{v}ms`"
                )))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "duration `{v}` needs a unit, e.g. `{v}s`"
                )))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_fractions() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn rejects_missing_or_unknown_units() {
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("30d").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1e400s").is_err());
    }

    #[test]
    fn formats_round_trip() {
        for text in ["250ms", "30s", "5m", "1h", "1500ms"] {
            let d = parse_duration(text).unwrap_or_default();
            assert_eq!(format_duration(d), text);
        }
    }
}
