//! `retry-after` (RFC 9110 §10.2.3): how long an answer asks its caller to wait, bounded.

use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap};

/// The shortest and longest wait a `retry-after` is taken as: a zero would retry at once, and a
/// far date would bench an agent for longer than any outage worth waiting out.
const RETRY_AFTER_MIN: Duration = Duration::from_secs(1);
const RETRY_AFTER_MAX: Duration = Duration::from_secs(300);

/// `retry-after` as a wait from now, clamped to 1 s..5 min: delay-seconds, or an HTTP-date (the
/// IMF-fixdate form and RFC 9110's two obsolete ones; a date in the past is the minimum).
pub(crate) fn wait(headers: &HeaderMap) -> Option<Duration> {
    wait_at(headers, SystemTime::now())
}

/// [`wait`] with the clock given.
fn wait_at(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let date = httpdate::parse_http_date(text).ok()?;
            date.duration_since(now).unwrap_or(Duration::ZERO)
        }
    };
    Some(bounded(wait))
}

/// A wait an answer asked for, however it said it, clamped as [`wait`] clamps it.
pub(crate) fn bounded(wait: Duration) -> Duration {
    wait.clamp(RETRY_AFTER_MIN, RETRY_AFTER_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::headers::value;

    fn with_retry_after(text: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, value(text));
        h
    }

    /// 2026-12-01 08:00:00 UTC.
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_112_000)
    }

    #[test]
    fn retry_after_takes_delay_seconds_bounded() {
        let after = |t: &str| wait_at(&with_retry_after(t), now());
        assert_eq!(after("30"), Some(Duration::from_secs(30)));
        assert_eq!(after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(after("0"), Some(RETRY_AFTER_MIN));
        assert_eq!(after("86400"), Some(RETRY_AFTER_MAX));
        assert_eq!(wait_at(&HeaderMap::new(), now()), None);
    }

    #[test]
    fn retry_after_takes_an_http_date_in_each_form_as_a_wait_from_now() {
        let after = |t: &str| wait_at(&with_retry_after(t), now());
        let thirty = Some(Duration::from_secs(30));
        assert_eq!(
            after("Tue, 01 Dec 2026 08:00:30 GMT"),
            thirty,
            "IMF-fixdate"
        );
        assert_eq!(after("Tuesday, 01-Dec-26 08:00:30 GMT"), thirty, "RFC 850");
        assert_eq!(after("Tue Dec  1 08:00:30 2026"), thirty, "asctime");
        assert_eq!(
            after("Wed, 02 Dec 2026 08:00:00 GMT"),
            Some(RETRY_AFTER_MAX),
            "a day away: bounded"
        );
        assert_eq!(
            after("Tue, 01 Dec 2026 08:00:00 GMT"),
            Some(RETRY_AFTER_MIN),
            "now"
        );
        assert_eq!(
            after("Mon, 30 Nov 2026 08:00:00 GMT"),
            Some(RETRY_AFTER_MIN),
            "past"
        );
    }

    #[test]
    fn a_garbage_retry_after_is_ignored() {
        for text in [
            "soon",
            "-5",
            "1.5",
            "",
            "Tue, 41 Dec 2026 08:00:30 GMT",
            "Tue, 01 Dec 2026",
        ] {
            assert_eq!(wait_at(&with_retry_after(text), now()), None, "{text:?}");
        }
    }
}
