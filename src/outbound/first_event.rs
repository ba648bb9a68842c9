//! The first-event deadline (`capabilities.<name>.first_event_timeout`, `docs/chains.md`): an
//! attempt's answer head, and for `text/event-stream` its first event, within the limit, or the
//! attempt is dropped before a byte reaches the caller. The event read early is held beside the
//! answer (`call::Noted`) and sent first by the record step, which boxes the answer's body.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::error::ReachError;
use crate::http::pool::UpstreamBody;

/// A stream's first data, read before the answer was taken.
#[derive(Clone, Debug)]
pub(super) struct HeldEvent(Bytes);

impl HeldEvent {
    /// `body` with the held data sent before it.
    pub(super) fn before<B>(self, body: B) -> Prepended<B> {
        Prepended {
            first: Some(self.0),
            inner: body,
        }
    }
}

/// The answer's head within `limit` and, for a stream, its first event in what is left of it
/// (read off the body: it goes first).
pub(super) async fn within<F>(
    forwarded: F,
    limit: Duration,
    target: &(dyn std::fmt::Display + Sync),
) -> Result<(Response<UpstreamBody>, Option<HeldEvent>), ReachError>
where
    F: std::future::Future<Output = Result<Response<UpstreamBody>, ReachError>>,
{
    let started = Instant::now();
    let late = || ReachError::FirstEventTimeout {
        target: target.to_string(),
        after: limit,
    };
    let mut response = tokio::time::timeout(limit, forwarded)
        .await
        .map_err(|_| late())??;
    if !is_stream(&response) {
        return Ok((response, None));
    }
    let left = limit.saturating_sub(started.elapsed());
    match tokio::time::timeout(left, response.body_mut().frame()).await {
        Err(_) => Err(late()),
        Ok(Some(Err(err))) => Err(ReachError::Upstream {
            target: target.to_string(),
            message: err.to_string(),
        }),
        Ok(Some(Ok(frame))) => {
            // Trailers first would mean an empty stream: nothing to hold.
            let held = frame.into_data().ok().map(HeldEvent);
            Ok((response, held))
        }
        Ok(None) => Ok((response, None)),
    }
}

fn is_stream<B>(response: &Response<B>) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

pin_project_lite::pin_project! {
    /// A body with data sent before it.
    pub(super) struct Prepended<B> {
        first: Option<Bytes>,
        #[pin]
        inner: B,
    }
}

impl<B> Body for Prepended<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        if let Some(first) = &self.first {
            let n = first.len() as u64;
            hint.set_lower(hint.lower().saturating_add(n));
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper.saturating_add(n));
            }
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_held_event_comes_first() {
        let body = http_body_util::Full::new(Bytes::from_static(b"data: 2\n\n"));
        let prepended = HeldEvent(Bytes::from_static(b"data: 1\n\n")).before(body);
        let all = prepended.collect().await.map(|c| c.to_bytes());
        assert_eq!(all.ok().as_deref(), Some(&b"data: 1\n\ndata: 2\n\n"[..]));
    }
}
