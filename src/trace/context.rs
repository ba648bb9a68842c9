//! W3C Trace Context (`traceparent`): parsed from what a request carries, and written for the
//! next hop. A value that is not exactly well formed is ignored, and a new trace starts.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The header naming the caller's span: `00-<trace id>-<parent span id>-<flags>`.
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// Vendor data that travels with the trace; passed through unchanged.
pub(crate) const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// A span's place in its trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub(crate) sampled: bool,
}

impl SpanContext {
    /// A child of `parent`, or the root of a new trace (sampled with `ratio`) when there is none.
    pub(crate) fn child_of(parent: Option<&SpanContext>, ratio: f64) -> Self {
        match parent {
            Some(parent) => SpanContext {
                trace_id: parent.trace_id,
                span_id: span_id(),
                sampled: parent.sampled,
            },
            None => SpanContext {
                trace_id: nonzero(|| rand::random::<u128>().to_be_bytes()),
                span_id: span_id(),
                sampled: ratio >= 1.0 || rand::random::<f64>() < ratio,
            },
        }
    }

    /// The `traceparent` value naming this span as the parent of the next hop.
    pub(crate) fn traceparent(&self) -> HeaderValue {
        let mut text = [0u8; 55];
        text[..3].copy_from_slice(b"00-");
        hex(&self.trace_id, &mut text[3..35]);
        text[35] = b'-';
        hex(&self.span_id, &mut text[36..52]);
        text[52..].copy_from_slice(if self.sampled { b"-01" } else { b"-00" });
        HeaderValue::from_bytes(&text).unwrap_or(HeaderValue::from_static(""))
    }
}

/// The parent a request names in its `traceparent`, if it names one well formed.
pub(super) fn parent(headers: &HeaderMap) -> Option<SpanContext> {
    let mut values = headers.get_all(TRACEPARENT).iter();
    let value = values.next()?;
    // Two values: which one is the caller's is anybody's guess.
    if values.next().is_some() {
        return None;
    }
    parse(value.as_bytes())
}

/// Parses a `traceparent` value (W3C Trace Context, level 1 and later versions' prefix).
pub fn parse(value: &[u8]) -> Option<SpanContext> {
    let value = value.trim_ascii();
    if value.len() < 55 {
        return None;
    }
    let version = unhex::<1>(&value[0..2])?[0];
    // Version 00 is exactly 55 characters; a later version may append fields after a dash.
    let well_sized = match version {
        0xff => false,
        0 => value.len() == 55,
        _ => value.len() == 55 || value[55] == b'-',
    };
    if !well_sized || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let trace_id = unhex::<16>(&value[3..35])?;
    let span_id = unhex::<8>(&value[36..52])?;
    let flags = unhex::<1>(&value[53..55])?[0];
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(SpanContext {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// A new span id: random and never zero.
pub(super) fn span_id() -> [u8; 8] {
    nonzero(|| rand::random::<u64>().to_be_bytes())
}

fn nonzero<const N: usize>(make: impl Fn() -> [u8; N]) -> [u8; N] {
    loop {
        let id = make();
        if id != [0; N] {
            return id;
        }
    }
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

fn hex(bytes: &[u8], out: &mut [u8]) {
    for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
}

/// Lower-case hex only, as the specification requires.
fn unhex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_well_formed_traceparent_parses_and_round_trips() {
        let ctx = parse(GOOD.as_bytes());
        let ctx = ctx.unwrap_or_else(|| panic!("{GOOD} did not parse"));
        assert_eq!(ctx.trace_id[0], 0x4b);
        assert_eq!(ctx.span_id[7], 0xb7);
        assert!(ctx.sampled);
        assert_eq!(ctx.traceparent().as_bytes(), GOOD.as_bytes());
        let unsampled = parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert_eq!(unsampled.map(|c| c.sampled), Some(false));
        // A later version may append fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what";
        assert_eq!(parse(later.as_bytes()), Some(ctx));
    }

    #[test]
    fn malformed_values_are_ignored() {
        for bad in [
            "",
            "garbage",
            // Upper-case hex, zero ids, the forbidden version, wrong lengths and separators.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn without_a_parent_a_new_trace_starts_and_with_one_it_continues() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static("00-zz-bad-01"));
        let parent = parent(&headers);
        assert_eq!(parent, None);
        let root = SpanContext::child_of(parent.as_ref(), 1.0);
        assert!(root.sampled);
        assert_ne!(root.trace_id, [0; 16]);
        let child = SpanContext::child_of(Some(&root), 0.0);
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert!(child.sampled, "a child follows its parent's decision");
        assert!(!SpanContext::child_of(None, 0.0).sampled);
        // Two values: ignored.
        headers.insert(TRACEPARENT, HeaderValue::from_static(GOOD));
        headers.append(TRACEPARENT, HeaderValue::from_static(GOOD));
        assert_eq!(super::parent(&headers), None);
    }
}
