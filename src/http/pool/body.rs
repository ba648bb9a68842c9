//! The response body of a pooled HTTP/1 connection (or an HTTP/2 stream): it drives the
//! connection while it is read, and gives the connection back to the pool when it ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::{Pool, Pooled, Slot};

/// A connection lent to one response body; back to the pool when the body has ended.
pub(super) struct Lease {
    pub(super) pool: Pool,
    pub(super) authority: Box<str>,
    pub(super) pooled: Pooled,
}

/// A response body from the pool: it drives its connection while it is read, so the bytes come
/// in on the task that reads them.
///
/// Boxed: the answer passes up through every outbound step by value, and a `Response` with the
/// body inline is 312 bytes against 120 (`docs/perf-levers.md`).
pub(crate) struct UpstreamBody(Box<Upstream>);

/// What an [`UpstreamBody`] holds.
struct Upstream {
    incoming: Incoming,
    lease: Option<Lease>,
    ended: bool,
    /// An HTTP/2 stream's claim on its connection (whose own task drives it).
    slot: Option<Slot>,
    /// Frames read ahead by [`UpstreamBody::hold`], passed on first.
    held: std::collections::VecDeque<Result<Frame<Bytes>, hyper::Error>>,
}

impl fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("ended", &self.0.ended)
            .finish_non_exhaustive()
    }
}

impl UpstreamBody {
    pub(super) fn new(incoming: Incoming, lease: Option<Lease>, slot: Option<Slot>) -> Self {
        Self(Box::new(Upstream {
            incoming,
            lease,
            ended: false,
            slot,
            held: std::collections::VecDeque::new(),
        }))
    }

    /// Reads the body ahead, up to `max` bytes and for `within` at most, and returns it when it
    /// ended in that: a small answer the sidecar reads (a 429's JSON, docs/model-budgets.md).
    /// Whatever was read is still passed on, first and unchanged.
    pub(crate) async fn hold(&mut self, max: usize, within: Duration) -> Option<Bytes> {
        let until = tokio::time::Instant::now() + within;
        // Frames already read ahead (`read_ahead`) are the answer's first bytes.
        let mut read = bytes::BytesMut::new();
        for data in self
            .0
            .held
            .iter()
            .filter_map(|f| f.as_ref().ok()?.data_ref())
        {
            read.extend_from_slice(data);
        }
        while !self.0.ended && !self.0.incoming.is_end_stream() && read.len() <= max {
            let next = std::future::poll_fn(|cx| self.poll_upstream(cx));
            let Ok(frame) = tokio::time::timeout_at(until, next).await else {
                return None;
            };
            let Some(frame) = frame else {
                break;
            };
            let failed = frame.is_err();
            if let Some(data) = frame.as_ref().ok().and_then(Frame::data_ref) {
                read.extend_from_slice(data);
            }
            self.0.held.push_back(frame);
            if failed {
                return None;
            }
        }
        let whole = self.0.ended || self.0.incoming.is_end_stream();
        (whole && read.len() <= max).then(|| read.freeze())
    }

    /// Reads the next frame ahead (it is still passed on first): a stream's first event, awaited
    /// under a deadline. A failure to read it is passed on too.
    pub(crate) async fn read_ahead(&mut self) -> Result<(), String> {
        let Some(frame) = std::future::poll_fn(|cx| self.poll_upstream(cx)).await else {
            return Ok(());
        };
        let read = frame.as_ref().map(|_| ()).map_err(ToString::to_string);
        self.0.held.push_back(frame);
        read
    }

    /// What a poll of `incoming` means for the connection.
    fn frame(
        &mut self,
        polled: Poll<Option<Result<Frame<Bytes>, hyper::Error>>>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &polled {
            Poll::Ready(None) => {
                self.0.ended = true;
                self.release();
            }
            Poll::Ready(Some(Err(_))) => self.0.lease = None,
            Poll::Ready(Some(Ok(_))) if self.0.incoming.is_end_stream() => self.0.ended = true,
            _ => {}
        }
        polled
    }

    fn release(&mut self) {
        // An HTTP/2 stream frees its room on the connection as soon as it ends.
        drop(self.0.slot.take());
        if let Some(lease) = self.0.lease.take() {
            lease.pool.release(&lease.authority, lease.pooled);
        }
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if self.0.ended || self.0.incoming.is_end_stream() {
            self.release();
        }
        // Otherwise the body was abandoned mid-way: dropping the connection closes it, as hyper
        // does when a response body is dropped early.
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        match this.0.held.pop_front() {
            Some(frame) => Poll::Ready(Some(frame)),
            None => this.poll_upstream(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.held.is_empty() && self.0.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let held: u64 = self
            .0
            .held
            .iter()
            .filter_map(|f| f.as_ref().ok()?.data_ref())
            .map(|d| d.len() as u64)
            .sum();
        let rest = self.0.incoming.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(held));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

impl UpstreamBody {
    /// The next frame from the connection, past any held ones.
    fn poll_upstream(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self;
        let Some(lease) = this.0.lease.as_mut() else {
            // No connection to drive (it closed): `incoming` holds what is left.
            let polled = Pin::new(&mut this.0.incoming).poll_frame(cx);
            return this.frame(polled);
        };
        let Pooled { wakes, conn, .. } = &mut lease.pooled;
        let incoming = &mut this.0.incoming;
        let polled = wakes.drive(cx, |inner| {
            let polled = Pin::new(&mut *incoming).poll_frame(inner);
            let Some(c) = conn.as_mut().filter(|_| polled.is_pending()) else {
                return polled;
            };
            // Nothing buffered: drive the connection, which feeds `incoming`, then look again.
            if c.as_mut().poll(inner).is_ready() {
                // Done; `incoming` now has its last frame or its error.
                *conn = None;
            }
            Pin::new(&mut *incoming).poll_frame(inner)
        });
        if conn.is_none() {
            this.0.lease = None;
        }
        match polled {
            Poll::Ready(_) => this.frame(polled),
            Poll::Pending => Poll::Pending,
        }
    }
}
