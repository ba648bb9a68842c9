//! Reading a model provider's rate-limit state from one answer's headers (and, on a 429, a
//! Gemini-style `RetryInfo.retryDelay` in its JSON body): OpenAI / Azure `x-ratelimit-*`,
//! Anthropic `anthropic-ratelimit-*`, the IETF `RateLimit` / `RateLimit-Policy` fields,
//! `retry-after` and `retry-after-ms`. Which header means what: docs/model-budgets.md.
//!
//! Nothing read here is trusted to block traffic for long: every duration is clamped to
//! [`MAX_BLOCK`], and a value that does not parse is dropped and counted, never guessed at.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

/// The longest any header may hold an agent out: a provider's (or a hostile proxy's) "reset in
/// a year" is read as this.
pub(crate) const MAX_BLOCK: Duration = Duration::from_secs(600);

/// One rate-limit window as an answer states it: requests or tokens of some kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Window {
    pub(crate) kind: Kind,
    pub(crate) limit: Option<u64>,
    pub(crate) remaining: Option<u64>,
    /// Until the window is full again, clamped to [`MAX_BLOCK`].
    pub(crate) reset: Option<Duration>,
}

/// What a window counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Requests,
    Tokens,
    InputTokens,
    OutputTokens,
    /// An IETF `RateLimit` quota: the unit is the server's.
    Quota,
}

/// Everything one answer said about the budget.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Reading {
    pub(crate) windows: Vec<Window>,
    /// `retry-after` / `retry-after-ms` / `RetryInfo.retryDelay`, clamped to [`MAX_BLOCK`].
    pub(crate) retry_after: Option<Duration>,
    /// Rate-limit values present but unreadable (or negative, like Azure's `-1`): ignored.
    pub(crate) malformed: u32,
}

impl Reading {
    /// Whether the answer said anything about a budget at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.retry_after.is_none()
    }
}

/// One provider window's headers: its kind, the `limit`, `remaining` and `reset` names, and how
/// its reset is written.
struct WindowHeaders {
    kind: Kind,
    names: [&'static str; 3],
    reset: ResetFn,
}

const fn openai(kind: Kind, names: [&'static str; 3]) -> WindowHeaders {
    WindowHeaders {
        kind,
        names,
        reset: duration_text,
    }
}

const fn anthropic(kind: Kind, names: [&'static str; 3]) -> WindowHeaders {
    WindowHeaders {
        kind,
        names,
        reset: rfc3339_from,
    }
}

/// OpenAI and Azure OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` (resets as
/// durations); Anthropic: `anthropic-ratelimit-{kind}-{limit,remaining,reset}` (RFC 3339). Whole
/// names, so an answer's reading builds none.
const WINDOWS: [WindowHeaders; 6] = [
    openai(
        Kind::Requests,
        [
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ],
    ),
    openai(
        Kind::Tokens,
        [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ],
    ),
    anthropic(
        Kind::Requests,
        [
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ],
    ),
    anthropic(
        Kind::Tokens,
        [
            "anthropic-ratelimit-tokens-limit",
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
        ],
    ),
    anthropic(
        Kind::InputTokens,
        [
            "anthropic-ratelimit-input-tokens-limit",
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
        ],
    ),
    anthropic(
        Kind::OutputTokens,
        [
            "anthropic-ratelimit-output-tokens-limit",
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
        ],
    ),
];

/// Reads every rate-limit header of an answer; `now` is the wall clock for absolute times.
pub(crate) fn read(headers: &HeaderMap, now: SystemTime) -> Reading {
    let mut reading = Reading::default();
    for w in &WINDOWS {
        let [limit, remaining, reset] = w.names;
        let window = window(
            &mut reading.malformed,
            w.kind,
            headers.get(limit),
            headers.get(remaining),
            headers.get(reset).map(|v| (v, w.reset)),
            now,
        );
        reading.windows.extend(window);
    }
    if let Some(w) = ietf(headers, &mut reading.malformed) {
        reading.windows.push(w);
    }
    reading.retry_after = retry_after(headers, now, &mut reading.malformed);
    reading
}

/// How a reset value is read: the text and the wall clock.
type ResetFn = fn(&str, SystemTime) -> Option<Duration>;

/// One window from its three values; `None` when none of them is there.
fn window(
    malformed: &mut u32,
    kind: Kind,
    limit: Option<&http::HeaderValue>,
    remaining: Option<&http::HeaderValue>,
    reset: Option<(&http::HeaderValue, ResetFn)>,
    now: SystemTime,
) -> Option<Window> {
    if limit.is_none() && remaining.is_none() && reset.is_none() {
        return None;
    }
    let mut count = |v: Option<&http::HeaderValue>| {
        let v = v?;
        let n = v.to_str().ok().and_then(|t| t.trim().parse::<u64>().ok());
        if n.is_none() {
            *malformed += 1;
        }
        n
    };
    let (limit, remaining) = (count(limit), count(remaining));
    let reset = reset.and_then(|(v, parse)| {
        let d = v.to_str().ok().and_then(|t| parse(t.trim(), now));
        if d.is_none() {
            *malformed += 1;
        }
        d
    });
    // A window with neither count is no news (Azure answers `-1` when it does not know).
    if limit.is_none() && remaining.is_none() {
        return None;
    }
    Some(Window {
        kind,
        limit,
        remaining: remaining.map(|r| limit.map_or(r, |l| r.min(l))),
        reset,
    })
}

/// The IETF fields: `RateLimit: "default";r=50;t=30` with `RateLimit-Policy: "default";q=100;w=60`,
/// or the older draft's `RateLimit: limit=100, remaining=50, reset=30`.
fn ietf(headers: &HeaderMap, malformed: &mut u32) -> Option<Window> {
    let text = headers.get("ratelimit")?;
    let Some(text) = text.to_str().ok() else {
        *malformed += 1;
        return None;
    };
    let policy = headers
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok());
    let param = |text: &str, keys: &[&str]| -> Option<Option<u64>> {
        let found = text
            .split([';', ','])
            .filter_map(|p| p.trim().split_once('='))
            .find(|(k, _)| keys.contains(&k.trim()))?;
        Some(found.1.trim().parse::<u64>().ok())
    };
    let remaining = param(text, &["r", "remaining"]);
    let reset = param(text, &["t", "reset"]);
    let limit = param(text, &["limit"]).or_else(|| policy.and_then(|p| param(p, &["q"])));
    let bad = [remaining, reset, limit]
        .iter()
        .filter(|v| matches!(v, Some(None)))
        .count();
    *malformed += u32::try_from(bad).unwrap_or(u32::MAX);
    let remaining = remaining.flatten()?;
    let limit = limit.flatten();
    Some(Window {
        kind: Kind::Quota,
        limit,
        remaining: Some(limit.map_or(remaining, |l| remaining.min(l))),
        reset: reset.flatten().map(|s| bound(Duration::from_secs(s))),
    })
}

/// `retry-after-ms` (milliseconds), else `retry-after` (seconds or an HTTP date).
fn retry_after(headers: &HeaderMap, now: SystemTime, malformed: &mut u32) -> Option<Duration> {
    if let Some(v) = headers.get("retry-after-ms") {
        match v.to_str().ok().and_then(|t| t.trim().parse::<f64>().ok()) {
            Some(ms) if ms.is_finite() && ms >= 0.0 => {
                return Some(bound(Duration::from_secs_f64(ms.min(1e9) / 1000.0)))
            }
            _ => *malformed += 1,
        }
    }
    let v = headers.get(http::header::RETRY_AFTER)?;
    let text = v.to_str().ok().map(str::trim);
    let read = text.and_then(|t| match t.parse::<u64>() {
        Ok(s) => Some(bound(Duration::from_secs(s))),
        Err(_) => httpdate::parse_http_date(t)
            .ok()
            .map(|at| bound(at.duration_since(now).unwrap_or_default())),
    });
    if read.is_none() {
        *malformed += 1;
    }
    read
}

/// A Gemini-style 429 body's `error.details[].retryDelay` (`"30s"`), clamped to [`MAX_BLOCK`].
pub(crate) fn retry_delay_in_body(body: &[u8]) -> Option<Duration> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let details = value.get("error")?.get("details")?.as_array()?;
    details
        .iter()
        .filter_map(|d| d.get("retryDelay")?.as_str())
        .find_map(|t| duration_text(t, UNIX_EPOCH))
}

fn bound(d: Duration) -> Duration {
    d.min(MAX_BLOCK)
}

/// A Go-style duration as OpenAI writes its resets: `6m0s`, `1s`, `20ms`, `1.5s`, `2h3m`; a bare
/// number is seconds (Azure). Clamped to [`MAX_BLOCK`].
pub(crate) fn duration_text(text: &str, _now: SystemTime) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() || text.len() > 32 {
        return None;
    }
    if let Ok(secs) = text.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| bound(Duration::from_secs_f64(secs.min(1e9))));
    }
    let mut total = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let split = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|i| *i > 0)?;
        let (number, tail) = rest.split_at(split);
        let number: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * scale;
        rest = tail;
    }
    (total.is_finite() && total >= 0.0).then(|| bound(Duration::from_secs_f64(total.min(1e9))))
}

/// An RFC 3339 time (`2026-12-03T17:06:38Z`, fractions and offsets allowed) as the time left
/// until it from `now` (zero when past), clamped to [`MAX_BLOCK`].
pub(crate) fn rfc3339_from(text: &str, now: SystemTime) -> Option<Duration> {
    let at = rfc3339(text)?;
    let now = now.duration_since(UNIX_EPOCH).ok()?.as_secs_f64();
    Some(bound(Duration::from_secs_f64((at - now).clamp(0.0, 1e9))))
}

/// Seconds since the epoch of an RFC 3339 time.
fn rfc3339(text: &str) -> Option<f64> {
    let b = text.trim().as_bytes();
    if b.len() < 20 || b.len() > 40 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        std::str::from_utf8(b.get(from..to)?).ok()?.parse().ok()
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let mut i = 19;
    let mut fraction = 0.0;
    if b.get(i) == Some(&b'.') {
        let start = i;
        i += 1;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        fraction = std::str::from_utf8(b.get(start..i)?).ok()?.parse().ok()?;
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() => {
            let minutes = num(i + 1, i + 3)? * 60 + num(i + 4, i + 6)?;
            if *sign == b'+' {
                minutes * 60
            } else {
                -minutes * 60
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(60) - offset;
    Some(secs as f64 + fraction)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    fn at(text: &str) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs_f64(rfc3339(text).unwrap_or_default())
    }

    #[test]
    fn reads_openai_headers_with_go_durations() {
        let h = headers(&[
            ("x-ratelimit-limit-requests", "5000"),
            ("x-ratelimit-limit-tokens", "160000"),
            ("x-ratelimit-remaining-requests", "4999"),
            ("x-ratelimit-remaining-tokens", "159976"),
            ("x-ratelimit-reset-requests", "12ms"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        let r = read(&h, SystemTime::now());
        assert_eq!(r.malformed, 0);
        assert_eq!(
            r.windows,
            vec![
                Window {
                    kind: Kind::Requests,
                    limit: Some(5000),
                    remaining: Some(4999),
                    reset: Some(Duration::from_millis(12)),
                },
                Window {
                    kind: Kind::Tokens,
                    limit: Some(160_000),
                    remaining: Some(159_976),
                    reset: Some(Duration::from_secs(360)),
                },
            ]
        );
    }

    #[test]
    fn reads_anthropic_headers_with_rfc3339_resets() {
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", "2025-10-25T12:00:30Z"),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "7000"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2025-10-25T14:00:10.5+02:00",
            ),
        ]);
        let r = read(&h, at("2025-10-25T12:00:00Z"));
        assert_eq!(r.malformed, 0, "{r:?}");
        assert_eq!(r.windows.len(), 2);
        assert_eq!(r.windows[0].kind, Kind::Requests);
        assert_eq!(r.windows[0].reset, Some(Duration::from_secs(30)));
        assert_eq!(r.windows[1].kind, Kind::OutputTokens);
        assert_eq!(r.windows[1].remaining, Some(7000));
        assert_eq!(r.windows[1].reset, Some(Duration::from_millis(10_500)));
    }

    #[test]
    fn reads_both_ietf_forms_and_retry_after() {
        let h = headers(&[
            ("ratelimit", "\"default\";r=50;t=30"),
            ("ratelimit-policy", "\"default\";q=100;w=60"),
            ("retry-after", "7"),
        ]);
        let r = read(&h, SystemTime::now());
        assert_eq!(
            r.windows,
            vec![Window {
                kind: Kind::Quota,
                limit: Some(100),
                remaining: Some(50),
                reset: Some(Duration::from_secs(30)),
            }]
        );
        assert_eq!(r.retry_after, Some(Duration::from_secs(7)));
        let old = read(
            &headers(&[("ratelimit", "limit=10, remaining=0, reset=5")]),
            SystemTime::now(),
        );
        assert_eq!(old.windows[0].remaining, Some(0));
        assert_eq!(old.windows[0].limit, Some(10));
        let ms = read(&headers(&[("retry-after-ms", "1500")]), SystemTime::now());
        assert_eq!(ms.retry_after, Some(Duration::from_millis(1500)));
        let now = at("2015-10-21T07:28:00Z");
        let date = read(
            &headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:20 GMT")]),
            now,
        );
        assert_eq!(date.retry_after, Some(Duration::from_secs(20)));
    }

    #[test]
    fn hostile_and_malformed_values_are_ignored_counted_and_bounded() {
        let h = headers(&[
            ("x-ratelimit-limit-requests", "-1"),
            ("x-ratelimit-remaining-requests", "-1"),
            ("x-ratelimit-reset-requests", "0"),
            ("x-ratelimit-limit-tokens", "100"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "99999999h"),
            ("anthropic-ratelimit-requests-remaining", "lots"),
            ("anthropic-ratelimit-requests-reset", "9999-12-31T23:59:59Z"),
            ("retry-after", "315360000"),
        ]);
        let r = read(&h, SystemTime::now());
        // Azure's unknown `-1` twice, Anthropic's `lots`.
        assert_eq!(r.malformed, 3, "{r:?}");
        assert_eq!(r.windows.len(), 1, "{r:?}");
        assert_eq!(r.windows[0].reset, Some(MAX_BLOCK));
        assert_eq!(r.retry_after, Some(MAX_BLOCK));
        for bad in ["", "s", "1x", "1.2.3s", "NaN", "-5", "inf", "1e400"] {
            assert!(
                duration_text(bad, UNIX_EPOCH).is_none_or(|d| d <= MAX_BLOCK),
                "{bad}"
            );
        }
        for bad in ["2025-13-01T00:00:00Z", "2025-10-25 12:00:00", "x"] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn reads_a_gemini_retry_delay_from_a_429_body() {
        let body = br#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure"},
            {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"42s"}]}}"#;
        assert_eq!(retry_delay_in_body(body), Some(Duration::from_secs(42)));
        assert_eq!(retry_delay_in_body(b"not json"), None);
    }
}
