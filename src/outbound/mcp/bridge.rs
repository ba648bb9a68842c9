//! Answers of an older server to a client of the stateless revision (`docs/mcp.md`,
//! "Sessions"). A client and the servers behind its sidecar may speak different revisions; from
//! 2026-07-28 on, every result names its `resultType` and a list result carries its cache hints
//! (`ttlMs`, `cacheScope`), which a client of that revision requires and an older server never
//! sends. The sidecar speaks for the fleet, so it adds them, as the revision says a client reads
//! their absence: `"complete"`, not cached (`ttlMs: 0`), `"private"`. JSON answers are rewritten
//! whole; event streams event by event as they pass, progress untouched and unbuffered.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, Response};
use http_body::{Body, Frame};
use serde_json::Value;

use crate::http::{body, BoxError, ReachBody};
use crate::mcp::fetch::MAX_ANSWER_BYTES;
use crate::mcp::jsonrpc::{self, STATELESS_REVISION};

/// Whether a client of `client` revision needs the answers of a server of `server` revision
/// completed (revisions are dates: they order as text).
pub(super) fn needed(client: &str, server: &str) -> bool {
    client >= STATELESS_REVISION && server < STATELESS_REVISION
}

/// Completes a JSON-RPC answer's `result` for the stateless revision; `list`: a list method's,
/// with cache hints. Anything else (an error, a notification) is left as it is.
pub(super) fn complete(message: &mut Value, list: bool) {
    let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) else {
        return;
    };
    result
        .entry("resultType")
        .or_insert_with(|| Value::from("complete"));
    if list {
        result.entry("ttlMs").or_insert_with(|| Value::from(0));
        result
            .entry("cacheScope")
            .or_insert_with(|| Value::from("private"));
    }
}

/// The answer, completed as it passes: a JSON body (bounded) rewritten, an event stream's
/// answer events rewritten one by one.
pub(super) async fn answer(response: Response<ReachBody>, list: bool) -> Response<ReachBody> {
    let content_type = jsonrpc::content_type(response.headers());
    let (mut parts, incoming) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if content_type.starts_with("text/event-stream") {
        let events = Events {
            inner: incoming,
            pending: String::new(),
            ready: VecDeque::new(),
            list,
        };
        return Response::from_parts(parts, body::boxed(events));
    }
    if !content_type.starts_with("application/json") {
        return Response::from_parts(parts, incoming);
    }
    let bytes = match body::read_limited(incoming, MAX_ANSWER_BYTES).await {
        Ok(bytes) => bytes,
        Err(message) => {
            let err = crate::error::ReachError::Upstream {
                target: "the MCP server".to_owned(),
                message,
            };
            return err.into_response();
        }
    };
    let rewritten = serde_json::from_slice::<Value>(&bytes).ok().map(|mut v| {
        complete(&mut v, list);
        Bytes::from(v.to_string())
    });
    Response::from_parts(parts, body::full(rewritten.unwrap_or(bytes)))
}

pin_project_lite::pin_project! {
    /// An event stream whose answer events are completed; every other event passes as sent.
    struct Events {
        #[pin]
        inner: ReachBody,
        pending: String,
        ready: VecDeque<Bytes>,
        list: bool,
    }
}

impl Events {
    /// The complete events in `pending`, each rewritten when it is an answer; past
    /// [`MAX_ANSWER_BYTES`] of one unfinished event, what is pending passes on as it is.
    fn drain(pending: &mut String, list: bool, out: &mut VecDeque<Bytes>) {
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            out.push_back(Bytes::from(rewrite(&event, list)));
        }
        if pending.len() > MAX_ANSWER_BYTES {
            out.push_back(Bytes::from(std::mem::take(pending)));
        }
    }
}

/// One event: an answer's `data` completed; the rest of its lines kept.
fn rewrite(event: &str, list: bool) -> String {
    let Some(data) = jsonrpc::event_data(event) else {
        return event.to_owned();
    };
    let Ok(mut message) = serde_json::from_str::<Value>(&data) else {
        return event.to_owned();
    };
    if message.get("result").is_none() {
        return event.to_owned();
    }
    complete(&mut message, list);
    let mut out: String = event
        .lines()
        .filter(|l| !l.starts_with("data:") && !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(&format!("data: {message}\n\n"));
    out
}

impl Body for Events {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        loop {
            if let Some(ready) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(ready))));
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    if this.pending.is_empty() {
                        return Poll::Ready(None);
                    }
                    let rest = std::mem::take(this.pending);
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                }
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.pending.push_str(&String::from_utf8_lossy(&data));
                        if this.pending.contains('\r') {
                            *this.pending = this.pending.replace("\r\n", "\n");
                        }
                        Events::drain(this.pending, *this.list, this.ready);
                    }
                    // Trailers pass on.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use serde_json::json;

    /// A body that yields its frames, one per poll.
    struct Script(VecDeque<Frame<Bytes>>);

    impl Body for Script {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(Ok))
        }
    }

    #[test]
    fn only_an_older_servers_answers_to_a_stateless_client_are_completed() {
        assert!(needed("2026-07-28", "2025-11-25"));
        assert!(!needed("2025-11-25", "2025-06-18"));
        assert!(!needed("2026-07-28", "2026-07-28"));
    }

    #[test]
    fn a_result_gets_its_type_and_a_list_its_cache_hints_an_error_nothing() {
        let mut call = json!({ "jsonrpc": "2.0", "id": 1, "result": { "content": [] } });
        complete(&mut call, false);
        assert_eq!(call["result"]["resultType"], "complete");
        assert!(call["result"].get("ttlMs").is_none());
        let mut list = json!({ "jsonrpc": "2.0", "id": 2, "result": { "tools": [], "ttlMs": 5 } });
        complete(&mut list, true);
        assert_eq!(list["result"]["ttlMs"], 5);
        assert_eq!(list["result"]["cacheScope"], "private");
        let mut error = json!({ "jsonrpc": "2.0", "id": 3, "error": { "code": 1 } });
        complete(&mut error, true);
        assert!(error.get("result").is_none());
    }

    #[tokio::test]
    async fn an_event_streams_answer_is_completed_and_progress_passes_as_sent() {
        let progress = "event: message\ndata: {\"method\":\"notifications/progress\"}\n\n";
        let answer = "event: message\nid: 7\ndata: {\"id\":1,\"result\":{\"content\":[]}}\n\n";
        // The answer split across frames, as a server may send it.
        let (a, b) = answer.split_at(30);
        let frames = [progress, a, b]
            .into_iter()
            .map(|t| Frame::data(Bytes::from(t.to_owned())))
            .collect();
        let events = Events {
            inner: body::boxed(Script(frames)),
            pending: String::new(),
            ready: VecDeque::new(),
            list: false,
        };
        let text = events
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        assert!(text.starts_with(progress), "{text}");
        assert!(text.contains("id: 7\ndata: "), "{text}");
        let data = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or("");
        let message: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        assert_eq!(message["result"]["resultType"], "complete", "{text}");
    }
}
