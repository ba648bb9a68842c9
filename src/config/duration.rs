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
    let unit_nanos: u128 = match unit.trim() {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        other => {
            return Err(format!(
                "duration `{text}` has unknown unit `{other}` (use ms, s, m or h)"
            ))
        }
    };
    // In whole nanoseconds, not through a float: `5833052435ms` must be exactly that.
    let not_a_number = || format!("duration `{text}` does not start with a number");
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(not_a_number());
    }
    let out_of_range = || format!("duration `{text}` is out of range");
    let whole: u128 = match whole {
        "" => 0,
        // Only digits here: a failure means too many of them.
        digits => digits.parse().map_err(|_| out_of_range())?,
    };
    // Digits past the 20th are far below a nanosecond.
    let fraction = &fraction[..fraction.len().min(20)];
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| not_a_number())?
    };
    let nanos = whole
        .checked_mul(unit_nanos)
        .and_then(|n| n.checked_add(fraction * unit_nanos / scale))
        .filter(|n| *n <= MAX.as_nanos())
        .ok_or_else(out_of_range)?;
    // At most a year of nanoseconds: fits in u64.
    Ok(Duration::from_nanos(
        u64::try_from(nanos).map_err(|_| out_of_range())?,
    ))
}

/// The longest duration a config file may hold.
const MAX: Duration = Duration::from_secs(365 * 86_400);

/// Formats a duration the way `parse_duration` reads it, with the largest exact unit.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let sub_ms = d.subsec_nanos() % 1_000_000;
    if sub_ms != 0 {
        // Exact decimals, so the text parses back to the same duration.
        let fraction = format!("{sub_ms:06}");
        return format!("{ms}.{}ms", fraction.trim_end_matches('0'));
    }
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
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
        assert!(parse_duration("1.2.3s").is_err());
        assert!(parse_duration(".s").is_err());
        assert!(parse_duration("366d").is_err());
        assert!(parse_duration("8761h").is_err());
        assert!(parse_duration("99999999999999999999999999999999999999999999s").is_err());
    }

    #[test]
    fn parses_exactly() {
        // Through a float this was 5833052.435000001 s.
        assert_eq!(
            parse_duration("5833052435ms"),
            Ok(Duration::from_millis(5_833_052_435))
        );
        assert_eq!(parse_duration(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5.s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("0.000001ms"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_duration("8760h"), Ok(MAX));
        assert_eq!(format_duration(Duration::from_micros(1500)), "1.5ms");
    }

    mod fuzz {
        use proptest::prelude::*;

        use super::*;

        const YEAR_MS: u64 = 365 * 86_400_000;

        proptest! {
            #[test]
            fn arbitrary_text_never_panics(text in any::<String>()) {
                let _ = parse_duration(&text);
            }

            #[test]
            fn number_and_unit_shaped_text_never_panics(text in "[0-9.e+-]{0,30}(ms|s|m|h|d|)") {
                if let Ok(d) = parse_duration(&text) {
                    prop_assert!(d <= Duration::from_secs(365 * 86_400));
                }
            }

            /// Any duration up to the limit formats and parses back to itself.
            #[test]
            fn durations_round_trip(ms in 0..=YEAR_MS, nanos in prop_oneof![Just(0u64), 0..1_000_000u64]) {
                let d = (Duration::from_millis(ms) + Duration::from_nanos(nanos)).min(MAX);
                prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
            }

            #[test]
            fn each_unit_scales(n in 0u64..=8760, unit in prop::sample::select(vec![("ms", 1u64), ("s", 1000), ("m", 60_000), ("h", 3_600_000)])) {
                let (suffix, scale) = unit;
                prop_assert_eq!(parse_duration(&format!("{n}{suffix}")), Ok(Duration::from_millis(n * scale)));
            }
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["250ms", "30s", "5m", "1h", "1500ms"] {
            let d = parse_duration(text).unwrap_or_default();
            assert_eq!(format_duration(d), text);
        }
    }
}
