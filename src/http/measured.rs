//! A body wrapper that reports once when a streamed response ends, fails or is abandoned.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::BoxError;

/// How a streamed body finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyEnd {
    /// Every byte was delivered.
    Complete,
    /// The upstream failed mid-stream.
    Error,
    /// The receiver went away before the end.
    Abandoned,
}

type OnEnd = Box<dyn FnOnce(BodyEnd) + Send>;

pin_project_lite::pin_project! {
    /// Calls `on_end` exactly once: at end of stream, on error, or on drop.
    pub struct MeasuredBody<B> {
        #[pin]
        inner: B,
        on_end: Option<OnEnd>,
    }

    impl<B> PinnedDrop for MeasuredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(on_end) = this.project().on_end.take() {
                on_end(BodyEnd::Abandoned);
            }
        }
    }
}

impl<B> MeasuredBody<B> {
    pub fn new(inner: B, on_end: impl FnOnce(BodyEnd) + Send + 'static) -> Self {
        Self {
            inner,
            on_end: Some(Box::new(on_end)),
        }
    }
}

impl<B> Body for MeasuredBody<B>
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
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        let end = match &polled {
            Poll::Ready(None) => Some(BodyEnd::Complete),
            Poll::Ready(Some(Err(_))) => Some(BodyEnd::Error),
            _ => None,
        };
        if let Some(end) = end {
            if let Some(on_end) = this.on_end.take() {
                on_end(end);
            }
        }
        polled.map(|frame| frame.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
