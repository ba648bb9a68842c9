//! The one body observer: a body passed through unchanged while an [`Observer`] sees its frames
//! and hears, exactly once, how it ended — every byte delivered, an error, or dropped before the
//! end. Every wrapper that acts when a body ends (the metrics of an answer and the slot it holds,
//! a connection's request in flight, an upload's state, the idempotency table's copy, the
//! affinity keys an answer assigns) is an observer here, so they agree on when that is.
//!
//! A body has ended when its inner body yields no more frames, fails, or says so
//! (`is_end_stream`) after a frame: hyper stops polling a body once it says it has ended, so the
//! last frame is the end even when no empty poll follows.

use std::ops::ControlFlow;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};

/// How a body finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyEnd {
    /// Every byte was delivered.
    Complete,
    /// The inner body failed mid-stream.
    Error,
    /// The receiver went away before the end.
    Abandoned,
}

/// Hears how a body ended, once.
pub(crate) trait OnEnd {
    fn end(self, end: BodyEnd);
}

/// Sees a body's frames as they pass, and how it ended.
pub(crate) trait Observer<D>: OnEnd {
    /// A frame on its way. `Break` ends the observation early: the observer is dropped, and
    /// `end` is not called.
    fn frame(&mut self, _frame: &Frame<D>) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

/// A closure called with the end.
impl<F: FnOnce(BodyEnd)> OnEnd for F {
    fn end(self, end: BodyEnd) {
        self(end);
    }
}

impl<D, F: FnOnce(BodyEnd)> Observer<D> for F {}

pin_project_lite::pin_project! {
    /// `inner`, observed by `O` until it ends (or `O` is done).
    pub(crate) struct Observed<B, O: OnEnd> {
        #[pin]
        inner: B,
        observer: Option<O>,
    }

    impl<B, O: OnEnd> PinnedDrop for Observed<B, O> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(observer) = this.project().observer.take() {
                observer.end(BodyEnd::Abandoned);
            }
        }
    }
}

impl<B, O: OnEnd> Observed<B, O> {
    /// `inner` observed by `observer`.
    pub(crate) fn new(inner: B, observer: O) -> Self {
        Self::maybe(inner, Some(observer))
    }

    /// `inner` observed by `observer`, if there is one; `None` passes it through unobserved.
    pub(crate) fn maybe(inner: B, observer: Option<O>) -> Self {
        Self { inner, observer }
    }
}

impl<B: std::fmt::Debug, O: OnEnd> std::fmt::Debug for Observed<B, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("inner", &self.inner)
            .field("observed", &self.observer.is_some())
            .finish()
    }
}

impl<B, O> Body for Observed<B, O>
where
    B: Body,
    O: Observer<B::Data>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let Some(observer) = this.observer.as_mut() else {
            return polled;
        };
        let end = match &polled {
            Poll::Pending => None,
            Poll::Ready(None) => Some(BodyEnd::Complete),
            Poll::Ready(Some(Err(_))) => Some(BodyEnd::Error),
            Poll::Ready(Some(Ok(frame))) => {
                if observer.frame(frame).is_break() {
                    *this.observer = None;
                    return polled;
                }
                this.inner.is_end_stream().then_some(BodyEnd::Complete)
            }
        };
        if let Some(end) = end {
            if let Some(observer) = this.observer.take() {
                observer.end(end);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use std::collections::VecDeque;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    use super::*;

    type Ends = Arc<Mutex<Vec<BodyEnd>>>;

    /// A body that yields its frames and errors, in order, then ends.
    struct Script(VecDeque<Result<Frame<Bytes>, &'static str>>);

    impl Body for Script {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
            Poll::Ready(self.get_mut().0.pop_front())
        }
    }

    fn recorder() -> (Ends, impl FnOnce(BodyEnd) + Send + 'static) {
        let ends = Ends::default();
        let seen = ends.clone();
        let on_end = move |end| seen.lock().unwrap_or_else(|p| p.into_inner()).push(end);
        (ends, on_end)
    }

    fn ends(ends: &Ends) -> Vec<BodyEnd> {
        ends.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    #[tokio::test]
    async fn a_sized_body_ends_with_its_last_frame() {
        let (seen, on_end) = recorder();
        let mut body = Observed::new(Full::new(Bytes::from_static(b"abc")), on_end);
        let frame = body.frame().await;
        assert!(matches!(frame, Some(Ok(_))));
        assert_eq!(ends(&seen), [BodyEnd::Complete], "no empty poll needed");
        drop(body);
        assert_eq!(ends(&seen), [BodyEnd::Complete], "once");
    }

    #[tokio::test]
    async fn an_error_and_a_drop_are_ends_too() {
        let (seen, on_end) = recorder();
        let frames = [Ok(Frame::data(Bytes::from_static(b"a"))), Err("reset")];
        let mut body = Observed::new(Script(frames.into()), on_end);
        assert!(matches!(body.frame().await, Some(Ok(_))));
        assert!(ends(&seen).is_empty());
        assert!(matches!(body.frame().await, Some(Err(_))));
        assert_eq!(ends(&seen), [BodyEnd::Error]);

        let (seen, on_end) = recorder();
        drop(Observed::new(Full::new(Bytes::from_static(b"abc")), on_end));
        assert_eq!(ends(&seen), [BodyEnd::Abandoned]);
    }
}
