//! An answer's body on its way to the caller, watched (for an A2A call) for the task and context
//! it names, (for an MCP call) for the `requestState` its server issued: the keys are bound before the frame that completes the answer (or the stream's first
//! event) is passed on, so the caller's follow-up cannot overtake its binding.

use std::ops::ControlFlow;
use std::sync::Arc;

use bytes::Bytes;
use http_body::{Body, Frame};

use super::keys;
use super::table::{Bounds, Key, Kind, Table};
use crate::http::observed::{BodyEnd, Observed, Observer, OnEnd};
use crate::http::pool::UpstreamBody;
use crate::metrics::Metrics;

/// The most of an answer held to find its ids: a Task with a long history is let through
/// unread, and only the request's keys are bound.
const MAX_WATCHED: usize = 256 * 1024;

use super::keys::Reader;

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
pub(crate) type Watched = Observed<UpstreamBody, Watcher>;

/// An answer that is not watched.
pub(super) fn plain(inner: UpstreamBody) -> Watched {
    Observed::maybe(inner, None)
}

/// An answer read for the keys it assigns, bound to the peer with the request's.
pub(super) fn watching(
    inner: UpstreamBody,
    binding: Binding,
    shape: Shape,
    reader: Reader,
) -> Watched {
    let expected = inner.size_hint().exact();
    let watch = Watch {
        binding: Some(binding),
        shape,
        reader,
        seen: Vec::new(),
        expected,
    };
    Observed::new(inner, Watcher(Box::new(watch)))
}

/// Reads an answer for its keys (boxed: the body of an answer not watched stays small).
pub(crate) struct Watcher(Box<Watch>);

struct Watch {
    /// Taken when the keys are bound.
    binding: Option<Binding>,
    shape: Shape,
    /// A2A's or MCP's reading of the answer.
    reader: Reader,
    seen: Vec<u8>,
    /// The declared length, so the last frame is known as it arrives.
    expected: Option<u64>,
}

impl Watcher {
    /// Binds (`Some`: the request's keys and those assigned) and stops watching.
    fn bind(&mut self, assigned: Option<Vec<(Kind, String)>>) -> ControlFlow<()> {
        if let Some(binding) = self.0.binding.take() {
            binding.finish(assigned);
        }
        ControlFlow::Break(())
    }
}

impl Observer<Bytes> for Watcher {
    /// Looks at a frame's bytes; binds when the answer (or the first event) is complete.
    fn frame(&mut self, frame: &Frame<Bytes>) -> ControlFlow<()> {
        let Some(data) = frame.data_ref() else {
            return ControlFlow::Continue(());
        };
        let watch = &mut *self.0;
        if watch.seen.len() + data.len() > MAX_WATCHED {
            // Too long to read: the request's keys still hold.
            return self.bind(Some(Vec::new()));
        }
        watch.seen.extend_from_slice(data);
        let assigned = match watch.shape {
            Shape::Stream => keys::first_event(&watch.seen).map(|e| (watch.reader)(&e)),
            // Complete by its declared length here; by its end otherwise (`end`).
            Shape::Json => (watch.expected == Some(watch.seen.len() as u64))
                .then(|| (watch.reader)(&watch.seen)),
        };
        match assigned {
            Some(assigned) => self.bind(assigned),
            None => ControlFlow::Continue(()),
        }
    }
}

impl OnEnd for Watcher {
    fn end(mut self, end: BodyEnd) {
        // A broken or abandoned answer binds nothing.
        if end != BodyEnd::Complete {
            return;
        }
        // The end without a length: what was seen is the whole answer.
        let assigned = match self.0.shape {
            Shape::Json => (self.0.reader)(&self.0.seen),
            Shape::Stream => Some(Vec::new()),
        };
        let _ = self.bind(assigned);
    }
}
