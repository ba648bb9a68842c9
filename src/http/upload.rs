//! A caller's request body, watched on its way upstream: whether it arrived whole, broke, or
//! stalled. A broken or slow upload is the caller's fault and must never count against the agent
//! it was going to (a few aborted uploads used to eject a healthy agent), and a body that stops
//! arriving must not hold an admission slot for the agent's whole timeout.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use super::observed::{BodyEnd, Observed, Observer, OnEnd};
use super::BoxError;
use crate::error::ReachError;

/// How far a caller's upload got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UploadState {
    /// Not read yet, or the last read got bytes: if it is unfinished, it is because the
    /// receiver stopped reading.
    Open,
    /// The receiver is reading and waiting for the caller's next bytes.
    Waiting,
    /// Every byte arrived.
    Complete,
    /// The caller's connection broke mid-body.
    Broken,
    /// No chunk arrived within the body read timeout.
    Stalled,
}

/// Shared view of an upload's state, kept by whoever forwards it. `None` for a body already
/// read whole: it is complete and stays so, and a call with one allocates nothing for it.
#[derive(Clone, Debug)]
pub(crate) struct UploadWatch(Option<Arc<AtomicU8>>);

impl Default for UploadWatch {
    /// The watch of a body still to be read: open.
    fn default() -> Self {
        Self(Some(Arc::default()))
    }
}

impl UploadWatch {
    /// The watch of a body already read whole.
    pub(crate) fn complete() -> Self {
        Self(None)
    }

    pub(crate) fn state(&self) -> UploadState {
        let Some(code) = &self.0 else {
            return UploadState::Complete;
        };
        match code.load(Ordering::Acquire) {
            1 => UploadState::Complete,
            2 => UploadState::Broken,
            3 => UploadState::Stalled,
            4 => UploadState::Waiting,
            _ => UploadState::Open,
        }
    }

    fn set(&self, state: UploadState) {
        let code = match state {
            UploadState::Open => 0,
            UploadState::Complete => 1,
            UploadState::Broken => 2,
            UploadState::Stalled => 3,
            UploadState::Waiting => 4,
        };
        if let Some(watched) = &self.0 {
            watched.store(code, Ordering::Release);
        }
    }

    /// The caller's fault, when its upload is why a request failed: a broken body, a stalled one,
    /// or (`timed_out`) one the receiver was still waiting on when the time ran out. A body the
    /// receiver had stopped reading (an agent that hangs without reading) is not the caller's.
    pub(crate) fn caller_fault(&self, timed_out: bool) -> Option<ReachError> {
        match self.state() {
            UploadState::Broken => Some(ReachError::ClientBody),
            UploadState::Stalled => Some(ReachError::BodyTimeout),
            UploadState::Waiting if timed_out => Some(ReachError::BodyTimeout),
            _ => None,
        }
    }
}

pin_project_lite::pin_project! {
    /// Passes the body through, recording how it ended (its observer is the [`UploadWatch`]); a
    /// gap longer than `gap` between chunks ends it with an error.
    pub(crate) struct WatchedUpload<B> {
        #[pin]
        inner: Observed<B, UploadWatch>,
        // Armed only while a read waits on the caller: a body that arrives with its head (most
        // do) never registers a timer, and time spent unread (in the admission queue, or behind
        // an agent that stopped reading) is not the caller's gap.
        timer: Option<Pin<Box<Sleep>>>,
        gap: Duration,
        watch: UploadWatch,
    }
}

impl<B: Body> WatchedUpload<B> {
    pub(crate) fn new(inner: B, gap: Duration) -> (Self, UploadWatch) {
        let watch = UploadWatch::default();
        if inner.is_end_stream() {
            watch.set(UploadState::Complete);
        }
        let body = Self {
            inner: Observed::new(inner, watch.clone()),
            timer: None,
            gap,
            watch: watch.clone(),
        };
        (body, watch)
    }
}

/// Bytes arriving keep an upload open; its end says whether it arrived whole or broke.
impl OnEnd for UploadWatch {
    fn end(self, end: BodyEnd) {
        match end {
            BodyEnd::Complete => self.set(UploadState::Complete),
            BodyEnd::Error => self.set(UploadState::Broken),
            // Dropped unread: how far it got stands.
            BodyEnd::Abandoned => {}
        }
    }
}

impl<D> Observer<D> for UploadWatch {
    fn frame(&mut self, _: &Frame<D>) -> ControlFlow<()> {
        self.set(UploadState::Open);
        ControlFlow::Continue(())
    }
}

/// The error a stalled upload ends with.
#[derive(Debug, thiserror::Error)]
#[error("no request body bytes arrived for {0:?}")]
pub(crate) struct Stalled(Duration);

impl<B> Body for WatchedUpload<B>
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
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.timer = None;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(*this.gap)))
                .as_mut()
                .poll(cx)
            {
                Poll::Ready(()) => {
                    this.watch.set(UploadState::Stalled);
                    Poll::Ready(Some(Err(Box::new(Stalled(*this.gap)))))
                }
                Poll::Pending => {
                    this.watch.set(UploadState::Waiting);
                    Poll::Pending
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A caller's body: read whole when it is small enough to keep (to replay on another peer, or to
/// fingerprint for an idempotency key), else handed back to stream once.
#[derive(Debug)]
pub(crate) enum Upload<B> {
    Buffered(Bytes),
    /// Too large to keep (or of unknown length): its declared length, if any.
    Stream(B, Option<u64>),
}

/// Reads `incoming` whole when it declares at most `max` bytes (or is already empty); a body
/// that breaks or stalls on the way is the caller's error.
pub(crate) async fn read<B>(
    headers: &http::HeaderMap,
    incoming: B,
    max: usize,
    gap: Duration,
) -> Result<Upload<B>, ReachError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    use http_body_util::{BodyExt, Limited};
    if incoming.is_end_stream() {
        // No body (a GET, most often): nothing to read, watch or buffer.
        return Ok(Upload::Buffered(Bytes::new()));
    }
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let small = declared.is_some_and(|n| n <= max as u64);
    if !small {
        return Ok(Upload::Stream(incoming, declared));
    }
    let (watched, watch) = WatchedUpload::new(incoming, gap);
    match Limited::new(watched, max).collect().await {
        Ok(collected) => Ok(Upload::Buffered(collected.to_bytes())),
        Err(_) => Err(watch.caller_fault(false).unwrap_or_else(|| {
            ReachError::BadRequest("the request body is longer than its content-length".to_owned())
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::channel::Channel;
    use http_body_util::BodyExt;

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_stalls_and_is_the_callers_fault() {
        let (mut tx, body) = Channel::<Bytes, std::io::Error>::new(4);
        let (body, watch) = WatchedUpload::new(body, Duration::from_secs(10));
        assert!(tx.try_send(Frame::data(Bytes::from_static(b"x"))).is_ok());
        let collected = tokio::spawn(body.collect());
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(collected.await.map(|r| r.is_err()).unwrap_or(false));
        assert_eq!(watch.state(), UploadState::Stalled);
        assert!(matches!(
            watch.caller_fault(false),
            Some(ReachError::BodyTimeout)
        ));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unread_body_is_not_the_callers_fault_and_the_gap_starts_at_the_first_read() {
        let (mut tx, body) = Channel::<Bytes, std::io::Error>::new(4);
        let (body, watch) = WatchedUpload::new(body, Duration::from_secs(10));
        assert!(tx.try_send(Frame::data(Bytes::from_static(b"x"))).is_ok());
        // Nobody reads it for longer than the gap (a queue wait, an agent not reading).
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            watch.caller_fault(true).is_none(),
            "the receiver never read"
        );
        let mut body = Box::pin(body);
        assert!(
            body.frame().await.is_some_and(|f| f.is_ok()),
            "no stall yet"
        );
        assert!(
            watch.caller_fault(true).is_none(),
            "the last read got bytes"
        );
        let next = tokio::spawn(async move { body.frame().await.map(|f| f.is_err()) });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            matches!(watch.caller_fault(true), Some(ReachError::BodyTimeout)),
            "the receiver waits on the caller"
        );
        assert_eq!(next.await.ok().flatten(), Some(true), "then it stalls");
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_body_is_the_callers_fault_and_a_whole_one_is_not() {
        let (tx, body) = Channel::<Bytes, std::io::Error>::new(4);
        let (body, watch) = WatchedUpload::new(body, Duration::from_secs(10));
        tx.abort(std::io::Error::other("reset"));
        assert!(body.collect().await.is_err());
        assert!(matches!(
            watch.caller_fault(false),
            Some(ReachError::ClientBody)
        ));

        let whole = http_body_util::Full::new(Bytes::from("x"));
        let (whole, watch) = WatchedUpload::new(whole, Duration::from_secs(1));
        assert!(whole.collect().await.is_ok());
        assert_eq!(watch.state(), UploadState::Complete);
        assert!(watch.caller_fault(true).is_none());
    }
}
