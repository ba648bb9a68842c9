//! Keeping a keyed request's response: a ticket settles its key with the response, through the
//! body tee that copies it as it streams to the caller.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};

use super::stored::Stored;
use super::table::{Held, IdempotencyTable, Slot, Ticket};
use crate::http::{body, BoxError, ReachBody};

impl Ticket {
    /// Settles the key with the original's response, driving its body to the end. A response the
    /// sidecar made itself (it carries `reach-reason`: the agent was never reached, or gave no
    /// answer) is passed to those waiting but not kept: a later retry may run the task.
    pub async fn settle(mut self, response: Response<ReachBody>) {
        use http_body_util::BodyExt;
        // Made by a sidecar, or refused by the agent before it ran (429, a 503 with
        // `retry-after`): nothing ran, so the key is free for the next try — waiters hear this
        // answer, but it is not kept (a kept 429 would refuse every retry of the key).
        let ran = !matches!(
            crate::classify::Class::of_response(&response),
            crate::classify::Class::Refused { .. } | crate::classify::Class::Shed { .. }
        );
        if !ran
            || response
                .headers()
                .contains_key(crate::http::headers::REASON)
        {
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let stored = Arc::new(Stored::new(parts.status, parts.headers, body));
            if let Some(key) = self.key.take() {
                self.table.settle_passing(&key, stored);
            }
            return;
        }
        let _ = self.record(response).into_body().collect().await;
    }

    /// Streams `response` to the caller while keeping a copy for duplicates.
    pub fn record<B>(mut self, response: Response<B>) -> Response<ReachBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, inner) = response.into_parts();
        let inner_len = inner.size_hint().exact();
        let head = (parts.status, parts.headers.clone());
        let max = self.table.max_body();
        let tee = Tee {
            inner,
            // Sized from the declared length: a doubling buffer would keep up to twice the body.
            buffer: Some(BytesMut::with_capacity(
                inner_len.map_or(0, |n| usize::try_from(n).unwrap_or(max).min(max)),
            )),
            max,
            head: Some(head),
            ticket: self.key.take().map(|k| (self.table.clone(), k)),
        };
        Response::from_parts(parts, body::boxed(tee))
    }
}

pin_project_lite::pin_project! {
    /// Passes a body through, copying it (up to `max`) into the table when it ends.
    struct Tee<B> {
        #[pin]
        inner: B,
        buffer: Option<BytesMut>,
        max: usize,
        head: Option<(StatusCode, HeaderMap)>,
        ticket: Option<(Arc<IdempotencyTable>, Held)>,
    }

    impl<B> PinnedDrop for Tee<B> {
        fn drop(this: Pin<&mut Self>) {
            // Abandoned mid-stream: the task ran, but we cannot replay it.
            if let Some((table, key)) = this.project().ticket.take() {
                table.settle(&key, Some(Slot::TooLarge));
            }
        }
    }
}

impl<B> Body for Tee<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let (Some(data), Some(buffer)) = (frame.data_ref(), this.buffer.as_mut()) {
                if buffer.len() + data.len() <= *this.max {
                    buffer.extend_from_slice(data);
                } else {
                    *this.buffer = None;
                }
            }
        }
        // hyper stops polling once a body says it has ended: settle on the last frame, too.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            if let Some((table, key)) = this.ticket.take() {
                let slot = match (this.buffer.take(), this.head.take()) {
                    (Some(buffer), Some((status, headers))) => {
                        Slot::Done(Arc::new(Stored::new(status, headers, exact(buffer))))
                    }
                    _ => Slot::TooLarge,
                };
                table.settle(&key, Some(slot));
            }
        }
        polled.map(|f| f.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The bytes of `buffer` in an allocation of their own size: what the budget counts is what
/// is held.
fn exact(buffer: BytesMut) -> Bytes {
    if buffer.capacity() > buffer.len() + buffer.len() / 8 {
        Bytes::copy_from_slice(&buffer)
    } else {
        buffer.freeze()
    }
}
