//! Token accounting for an external target's answers: the `usage` of a JSON answer, or of a
//! stream's events (OpenAI's last chunk with `stream_options.include_usage`, Anthropic's
//! `message_start` and `message_delta`), counted as `gen_ai_client_token_usage` by token type,
//! model and provider, and a stream's time to its first event (docs/model-budgets.md,
//! "Tokens"). Only answers the endpoint marked with a
//! [`Watch`] are read: a peer sidecar's answer is passed through unread.

use std::ops::ControlFlow;
use std::sync::Arc;

use bytes::Bytes;
use http_body::Frame;

use crate::http::observed::{BodyEnd, Observer, OnEnd};
use crate::metrics::Metrics;

/// The most of a JSON answer held to find its `usage`; a larger one is not counted.
const MAX_JSON: usize = 256 * 1024;
/// The longest stream line held while it is incomplete.
const MAX_LINE: usize = 64 * 1024;

/// Marks an answer to read for tokens (kept beside it by the outbound steps): from which provider
/// (the target's name, a bounded label).
#[derive(Clone, Debug)]
pub(crate) struct Watch {
    pub(crate) provider: Arc<str>,
    pub(crate) metrics: Arc<Metrics>,
    /// When the request was sent: a stream's first event is timed from it.
    pub(crate) sent: std::time::Instant,
    /// The attempt's span, when the call is traced: ended with the tokens once they are read.
    pub(crate) span: Option<Arc<crate::trace::DeferredSpan>>,
    /// The budgets the tokens spent are learned into.
    pub(crate) budgets: Arc<super::ModelBudgets>,
}

pub(crate) use super::Usage;

impl Usage {
    /// Folds one JSON document's usage in (the largest figure of each type wins: streams report
    /// running totals).
    fn fold(&mut self, doc: &serde_json::Value) {
        let message = doc.get("message");
        let usage = doc
            .get("usage")
            .or_else(|| message.and_then(|m| m.get("usage")));
        if let Some(u) = usage.filter(|u| u.is_object()) {
            let count = |keys: [&str; 2]| keys.iter().find_map(|k| u.get(*k)?.as_u64());
            self.input = self
                .input
                .max(count(["prompt_tokens", "input_tokens"]).unwrap_or(0));
            self.output = self
                .output
                .max(count(["completion_tokens", "output_tokens"]).unwrap_or(0));
        }
        let model = doc
            .get("model")
            .or_else(|| message.and_then(|m| m.get("model")))
            .and_then(|m| m.as_str());
        if let (None, Some(m)) = (&self.model, model) {
            self.model = Some(m.chars().take(64).collect());
        }
    }
}

/// Reads an answer's body as it passes, then `then` hears the end.
pub(crate) struct Then<F> {
    watch: Option<(Watch, Reader)>,
    then: F,
}

/// A body's bytes as far as they are needed.
#[derive(Debug, Default)]
struct Reader {
    stream: bool,
    /// A stream's first data frame, from when the request was sent.
    first: Option<std::time::Duration>,
    held: Vec<u8>,
    usage: Usage,
    overflow: bool,
}

/// `then`, after reading the answer when it is marked (its `headers` say whether it streams).
pub(crate) fn then<F>(watch: Option<Watch>, headers: &http::HeaderMap, then: F) -> Then<F> {
    Then {
        watch: watch.map(|w| {
            let stream = crate::http::headers::is_event_stream(headers);
            let reader = Reader {
                stream,
                ..Reader::default()
            };
            (w, reader)
        }),
        then,
    }
}

impl<F> std::fmt::Debug for Then<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Then")
            .field("watched", &self.watch.is_some())
            .finish_non_exhaustive()
    }
}

impl<F: OnEnd> OnEnd for Then<F> {
    fn end(self, end: BodyEnd) {
        if let Some((watch, reader)) = self.watch {
            let first_token = reader.first;
            let usage = (end == BodyEnd::Complete)
                .then(|| reader.finish())
                .flatten();
            if let Some(usage) = &usage {
                let model = usage.model.as_deref();
                let m = &watch.metrics;
                m.token_usage(&watch.provider, model, usage.input, usage.output);
                watch.budgets.spent(&watch.provider, usage);
            }
            if let Some(span) = &watch.span {
                let answer = crate::trace::ModelAnswer {
                    model: usage.as_ref().and_then(|u| u.model.as_deref()),
                    tokens: usage.as_ref().map(|u| (u.input, u.output)),
                    first_token,
                };
                span.finish(&answer, end == BodyEnd::Error);
            }
        }
        self.then.end(end);
    }
}

impl<F: OnEnd> Observer<Bytes> for Then<F> {
    fn frame(&mut self, frame: &Frame<Bytes>) -> ControlFlow<()> {
        if let (Some((watch, reader)), Some(data)) = (self.watch.as_mut(), frame.data_ref()) {
            if reader.stream && reader.first.is_none() && !data.is_empty() {
                let ttft = watch.sent.elapsed();
                reader.first = Some(ttft);
                watch.metrics.time_to_first_token(&watch.provider, ttft);
            }
            reader.read(data);
        }
        // `then` must still hear the end: never break.
        ControlFlow::Continue(())
    }
}

impl Reader {
    fn read(&mut self, data: &[u8]) {
        if self.overflow {
            return;
        }
        self.held.extend_from_slice(data);
        if !self.stream {
            self.overflow = self.held.len() > MAX_JSON;
            return;
        }
        // Whole lines only; a stream's `data:` line that names `usage` is parsed.
        while let Some(end) = self.held.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.held.drain(..=end).collect();
            self.line(&line);
        }
        self.overflow = self.held.len() > MAX_LINE;
    }

    fn line(&mut self, line: &[u8]) {
        let Some(json) = line.strip_prefix(b"data:") else {
            return;
        };
        if !json.windows(5).any(|w| w == b"usage") && !json.windows(5).any(|w| w == b"model") {
            return;
        }
        if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(json) {
            self.usage.fold(&doc);
        }
    }

    /// The usage found, when the answer reported any.
    fn finish(mut self) -> Option<Usage> {
        if self.overflow {
            return None;
        }
        if self.stream {
            let rest = std::mem::take(&mut self.held);
            self.line(&rest);
        } else if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&self.held) {
            self.usage.fold(&doc);
        }
        (self.usage.input > 0 || self.usage.output > 0).then_some(self.usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(stream: bool, chunks: &[&str]) -> Option<Usage> {
        let mut r = Reader {
            stream,
            ..Reader::default()
        };
        for c in chunks {
            r.read(c.as_bytes());
        }
        r.finish()
    }

    #[test]
    fn reads_an_openai_json_answer() {
        let u = read(
            false,
            &[
                r#"{"id":"x","model":"gpt-4o-mini","choices":[],"#,
                r#""usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#,
            ],
        );
        assert_eq!(
            u,
            Some(Usage {
                input: 12,
                output: 5,
                model: Some("gpt-4o-mini".into())
            })
        );
    }

    #[test]
    fn reads_the_last_event_of_an_openai_stream_split_anywhere() {
        let u = read(
            true,
            &[
                "data: {\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\nda",
                "ta: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"comp",
                "letion_tokens\":2}}\n\ndata: [DONE]\n\n",
            ],
        );
        assert_eq!(u.map(|u| (u.input, u.output)), Some((7, 2)));
    }

    #[test]
    fn reads_anthropics_message_start_and_delta() {
        let u = read(
            true,
            &[
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-sonnet\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n",
            ],
        );
        assert_eq!(
            u,
            Some(Usage {
                input: 25,
                output: 15,
                model: Some("claude-sonnet".into())
            })
        );
    }

    #[test]
    fn an_answer_without_usage_or_too_large_counts_nothing() {
        assert_eq!(read(false, &["{\"ok\":true}"]), None);
        assert_eq!(read(false, &["not json"]), None);
        let huge = "x".repeat(MAX_JSON + 1);
        assert_eq!(read(false, &[&huge]), None);
    }
}
