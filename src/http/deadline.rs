//! Request deadlines across hops: `reach-timeout: 5s` (relative, from the caller) and
//! `reach-deadline: <ms since the Unix epoch>` (absolute, what sidecars forward to each other),
//! so a callee never works on a call its caller has already given up on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::parse_duration;
use crate::error::ReachError;

pub(crate) const TIMEOUT: HeaderName = HeaderName::from_static("reach-timeout");
pub(crate) const DEADLINE: HeaderName = HeaderName::from_static("reach-deadline");

/// An absolute deadline, in milliseconds since the Unix epoch (wall clock: it crosses processes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Deadline(u64);

impl Deadline {
    pub(crate) fn after(d: Duration) -> Self {
        Self(now_ms().saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    }

    /// Time left; zero once passed.
    pub(crate) fn remaining(self) -> Duration {
        Duration::from_millis(self.0.saturating_sub(now_ms()))
    }

    pub(crate) fn header_value(self) -> HeaderValue {
        HeaderValue::from(self.0)
    }

    /// [`Deadline::from_headers`] for a request whose head was read into `head`: `reach-timeout`
    /// is looked up only when it is there (a peer's sidecar sends `reach-deadline` alone).
    pub(crate) fn from_head(
        headers: &HeaderMap,
        head: &crate::http::headers::Head<'_>,
    ) -> Result<Option<Self>, ReachError> {
        use crate::http::headers::Present;
        let timeout = match head.present.has(Present::TIMEOUT) {
            true => headers.get(&TIMEOUT),
            false => None,
        };
        let relative = match timeout.map(|v| v.to_str().unwrap_or("").trim()) {
            Some(t) => {
                Some(Self::after(parse_duration(t).map_err(|e| {
                    ReachError::BadRequest(format!("reach-timeout: {e}"))
                })?))
            }
            None => None,
        };
        let absolute = match head.deadline {
            Some(value) => Some(Self(epoch_ms(value.as_bytes()).ok_or_else(|| {
                let t = String::from_utf8_lossy(value.as_bytes());
                ReachError::BadRequest(format!(
                    "reach-deadline `{}` is not milliseconds since the Unix epoch",
                    t.trim()
                ))
            })?)),
            None => None,
        };
        Ok(match (relative, absolute) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// The tighter of `reach-timeout` and `reach-deadline`, if the request carries either.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, ReachError> {
        Self::from_head(headers, &crate::http::headers::Head::of(headers))
    }
}

/// The time one attempt may take: the target's own timeout, cut short by the deadline. The flag
/// says whether the deadline is what limits it.
pub(crate) fn attempt_timeout(own: Duration, deadline: Option<Deadline>) -> (Duration, bool) {
    within(own, deadline.map(Deadline::remaining))
}

/// [`attempt_timeout`] with the time `left` before the deadline already known.
pub(crate) fn within(own: Duration, left: Option<Duration>) -> (Duration, bool) {
    match left {
        Some(left) if left < own => (left, true),
        _ => (own, false),
    }
}

/// A `reach-deadline` value's milliseconds: decimal digits, blanks around them allowed. Read
/// from the bytes: every peer's request carries one, and `str` validation, trimming and `parse`
/// cost twice as much.
fn epoch_ms(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |ms, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
        ms.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tighter_of_timeout_and_deadline_wins() {
        let mut h = HeaderMap::new();
        h.insert(TIMEOUT, HeaderValue::from_static("2s"));
        h.insert(
            DEADLINE,
            Deadline::after(Duration::from_secs(60)).header_value(),
        );
        let d = Deadline::from_headers(&h)
            .ok()
            .flatten()
            .map(Deadline::remaining)
            .unwrap_or_default();
        assert!(
            d <= Duration::from_secs(2) && d > Duration::from_secs(1),
            "{d:?}"
        );
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let mut h = HeaderMap::new();
        h.insert(TIMEOUT, HeaderValue::from_static("soon"));
        assert!(matches!(
            Deadline::from_headers(&h),
            Err(ReachError::BadRequest(_))
        ));
        let mut h = HeaderMap::new();
        h.insert(DEADLINE, HeaderValue::from_static("tomorrow"));
        assert!(matches!(
            Deadline::from_headers(&h),
            Err(ReachError::BadRequest(_))
        ));
        assert!(matches!(
            Deadline::from_headers(&HeaderMap::new()),
            Ok(None)
        ));
    }

    #[test]
    fn a_deadline_is_decimal_digits_with_blanks_around() {
        for text in ["0", "1796432642440", " 17 ", "18446744073709551615"] {
            assert_eq!(
                epoch_ms(text.as_bytes()),
                text.trim().parse().ok(),
                "{text}"
            );
        }
        for text in [
            "",
            " ",
            "-1",
            "+1",
            "1.5",
            "1e3",
            "12a",
            "18446744073709551616",
        ] {
            assert_eq!(epoch_ms(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn a_passed_deadline_leaves_nothing() {
        assert_eq!(Deadline(1).remaining(), Duration::ZERO);
        let (t, by_deadline) = attempt_timeout(Duration::from_secs(30), Some(Deadline(1)));
        assert_eq!((t, by_deadline), (Duration::ZERO, true));
        assert_eq!(
            attempt_timeout(Duration::from_secs(3), None),
            (Duration::from_secs(3), false)
        );
    }

    proptest::proptest! {
        /// Whatever a caller puts in the deadline headers: a deadline, none, or a clear error;
        /// never a panic.
        #[test]
        fn arbitrary_deadline_headers_parse_or_are_refused(
            timeout in proptest::option::of("\\PC{0,40}"),
            deadline in proptest::option::of("\\PC{0,40}"),
        ) {
            let mut h = HeaderMap::new();
            for (name, text) in [(TIMEOUT, timeout), (DEADLINE, deadline)] {
                if let Some(value) = text.and_then(|t| HeaderValue::from_str(&t).ok()) {
                    h.insert(name, value);
                }
            }
            match Deadline::from_headers(&h) {
                Ok(Some(d)) => { let _ = attempt_timeout(Duration::from_secs(1), Some(d)); }
                Ok(None) => proptest::prop_assert!(h.is_empty()),
                Err(ReachError::BadRequest(_)) => {}
                Err(other) => proptest::prop_assert!(false, "unexpected error {other:?}"),
            }
        }

        #[test]
        fn any_millisecond_deadline_round_trips(ms in proptest::num::u64::ANY) {
            let mut h = HeaderMap::new();
            h.insert(DEADLINE, Deadline(ms).header_value());
            proptest::prop_assert_eq!(Deadline::from_headers(&h).ok().flatten(), Some(Deadline(ms)));
        }

        #[test]
        fn huge_relative_timeouts_saturate(n in proptest::num::u64::ANY, unit in "(ms|s|m|h|d)") {
            let mut h = HeaderMap::new();
            h.insert(TIMEOUT, HeaderValue::from_str(&format!("{n}{unit}")).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?);
            let _ = Deadline::from_headers(&h);
        }
    }
}
