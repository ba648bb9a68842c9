//! Keeping a keyed request's response: a ticket settles its key with the response, through the
//! body tee that copies it as it streams to the caller.

use std::ops::ControlFlow;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame};

use super::stored::Stored;
use super::table::{Held, IdempotencyTable, Slot, Ticket};
use crate::http::observed::{BodyEnd, Observed, Observer, OnEnd};
use crate::http::{body, BoxError, ReachBody};

impl Ticket {
    /// Settles the key with the original's response, driving its body to the end. A response the
    /// sidecar made itself (it carries `reach-reason`: the agent was never reached, or gave no
    /// answer) is passed to those waiting but not kept: a later retry may run the task.
    pub(crate) async fn settle(mut self, response: Response<ReachBody>) {
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
    pub(crate) fn record<B>(mut self, response: Response<B>) -> Response<ReachBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let (parts, inner) = response.into_parts();
        let inner_len = inner.size_hint().exact();
        let head = (parts.status, parts.headers.clone());
        let max = self.table.max_body();
        let tee = self.key.take().map(|key| Tee {
            // Sized from the declared length: a doubling buffer would keep up to twice the body.
            buffer: Some(BytesMut::with_capacity(
                inner_len.map_or(0, |n| usize::try_from(n).unwrap_or(max).min(max)),
            )),
            max,
            head: Some(head),
            ticket: Some((self.table.clone(), key)),
        });
        let tee = Observed::maybe(inner, tee);
        Response::from_parts(parts, body::boxed(tee))
    }
}

/// Copies a body (up to `max`) as it passes, into the table when it ends.
struct Tee {
    buffer: Option<BytesMut>,
    max: usize,
    head: Option<(StatusCode, HeaderMap)>,
    ticket: Option<(Arc<IdempotencyTable>, Held)>,
}

impl Observer<Bytes> for Tee {
    fn frame(&mut self, frame: &Frame<Bytes>) -> ControlFlow<()> {
        if let (Some(data), Some(buffer)) = (frame.data_ref(), self.buffer.as_mut()) {
            if buffer.len() + data.len() <= self.max {
                buffer.extend_from_slice(data);
            } else {
                self.buffer = None;
            }
        }
        ControlFlow::Continue(())
    }
}

impl OnEnd for Tee {
    fn end(mut self, end: BodyEnd) {
        let Some((table, key)) = self.ticket.take() else {
            return;
        };
        // Broken or abandoned mid-stream: the task ran, but we cannot replay it.
        let slot = match (end, self.buffer.take(), self.head.take()) {
            (BodyEnd::Complete, Some(buffer), Some((status, headers))) => {
                Slot::Done(Arc::new(Stored::new(status, headers, exact(buffer))))
            }
            _ => Slot::TooLarge,
        };
        table.settle(&key, Some(slot));
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
