//! An answer's body on its way to the caller, watched (for an A2A call) for the task and context
//! it names: the keys are bound before the frame that completes the answer (or the stream's first
//! event) is passed on, so the caller's follow-up cannot overtake its binding.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::keys;
use super::table::{Bounds, Key, Kind, Table};
use crate::http::pool::UpstreamBody;
use crate::metrics::Metrics;

/// The most of an answer held to find its ids: a Task with a long history is let through
/// unread, and only the request's keys are bound.
const MAX_WATCHED: usize = 256 * 1024;

/// What the watched answer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// One JSON-RPC response.
    Json,
    /// `text/event-stream`: the first event is a JSON-RPC response.
    Stream,
}

/// The keys to bind to the peer that answered, once the answer confirms them.
pub(super) struct Binding {
    pub(super) table: Arc<Table>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) capability: Arc<str>,
    pub(super) peer: Arc<str>,
    pub(super) request: Vec<(Kind, String)>,
    pub(super) bounds: Bounds,
}

impl Binding {
    /// Binds the request's keys now (they are then not bound again).
    pub(super) fn bind_request(&mut self) {
        let request = std::mem::take(&mut self.request);
        self.bind_all(request);
    }

    /// Binds the request's keys and `assigned` when the answer was a result (`Some`); an error
    /// answer (`None`) binds nothing.
    pub(super) fn finish(mut self, assigned: Option<Vec<(Kind, String)>>) {
        if let Some(mut assigned) = assigned {
            assigned.append(&mut self.request);
            self.bind_all(assigned);
        }
    }

    fn bind_all(&self, found: Vec<(Kind, String)>) {
        let now = tokio::time::Instant::now();
        let mut entries = None;
        for (kind, value) in found {
            let key = Key {
                capability: self.capability.clone(),
                kind,
                value: value.into(),
            };
            entries = Some(self.table.bind(key, &self.peer, now, self.bounds));
        }
        if let Some(n) = entries {
            self.metrics.affinity_entries(n);
        }
    }
}

/// A peer's answer, passed through; watched when it is an A2A call's.
pub(crate) struct Watched {
    inner: UpstreamBody,
    watch: Option<Box<Watch>>,
}

struct Watch {
    binding: Binding,
    shape: Shape,
    seen: Vec<u8>,
    /// The declared length, so the last frame is known as it arrives.
    expected: Option<u64>,
}

impl Watched {
    pub(super) fn plain(inner: UpstreamBody) -> Self {
        Watched { inner, watch: None }
    }

    pub(super) fn watching(inner: UpstreamBody, binding: Binding, shape: Shape) -> Self {
        let expected = inner.size_hint().exact();
        Watched {
            inner,
            watch: Some(Box::new(Watch {
                binding,
                shape,
                seen: Vec::new(),
                expected,
            })),
        }
    }

    /// Looks at a frame's bytes; binds when the answer (or the first event) is complete.
    fn see(&mut self, data: &Bytes) {
        let Some(watch) = self.watch.as_mut() else {
            return;
        };
        if watch.seen.len() + data.len() > MAX_WATCHED {
            // Too long to read: the request's keys still hold.
            if let Some(watch) = self.watch.take() {
                watch.binding.finish(Some(Vec::new()));
            }
            return;
        }
        watch.seen.extend_from_slice(data);
        let assigned = match watch.shape {
            Shape::Stream => keys::first_event(&watch.seen).map(|e| keys::of_a2a_response(&e)),
            Shape::Json => {
                let complete =
                    self.inner.is_end_stream() || watch.expected == Some(watch.seen.len() as u64);
                complete.then(|| keys::of_a2a_response(&watch.seen))
            }
        };
        if let Some(assigned) = assigned {
            self.end(assigned);
        }
    }

    fn end(&mut self, assigned: Option<Vec<(Kind, String)>>) {
        if let Some(watch) = self.watch.take() {
            watch.binding.finish(assigned);
        }
    }
}

impl Body for Watched {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if this.watch.is_some() {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        this.see(data);
                    }
                }
                Poll::Ready(None) => {
                    // The end without a length: what was seen is the whole answer.
                    let assigned = this.watch.as_ref().map(|w| match w.shape {
                        Shape::Json => keys::of_a2a_response(&w.seen),
                        Shape::Stream => Some(Vec::new()),
                    });
                    this.end(assigned.flatten());
                }
                Poll::Ready(Some(Err(_))) => this.watch = None,
                Poll::Pending => {}
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
