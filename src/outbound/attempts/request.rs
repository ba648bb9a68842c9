//! What goes to a peer for each attempt: the agent's request with the sidecar's own `reach-*`
//! headers, and its body — replayed when buffered, sent once when it streams.

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request};
use hyper::body::Incoming;

use crate::config::Snapshot;
use crate::http::upload::{Upload, UploadWatch, WatchedUpload};
use crate::http::{body, headers, ReachBody};

/// The call's body for each attempt: a buffered one replays, a streamed one goes once.
pub(in crate::outbound) struct Bodies {
    pub(in crate::outbound) replay: Option<Bytes>,
    stream: Option<WatchedUpload<Incoming>>,
    /// Whether the caller's upload broke or stalled (then nothing is held against a peer).
    pub(in crate::outbound) watch: UploadWatch,
}

impl Bodies {
    pub(in crate::outbound) fn of(upload: Upload<Incoming>, snapshot: &Snapshot) -> Self {
        match upload {
            Upload::Buffered(bytes) => Bodies {
                replay: Some(bytes),
                stream: None,
                watch: UploadWatch::complete(),
            },
            Upload::Stream(incoming, _) => {
                let gap = snapshot.bootstrap.limits.body_read_timeout.get();
                let (body, watch) = WatchedUpload::new(incoming, gap);
                Bodies {
                    replay: None,
                    stream: Some(body),
                    watch,
                }
            }
        }
    }

    pub(in crate::outbound) fn next(&mut self) -> Option<ReachBody> {
        match (&self.replay, self.stream.take()) {
            // An empty body boxes nothing (a GET's, most often).
            (Some(bytes), _) if bytes.is_empty() => Some(body::empty()),
            (Some(bytes), _) => Some(body::full(bytes.clone())),
            (None, Some(streamed)) => Some(body::boxed(streamed)),
            (None, None) => None,
        }
    }
}

/// The agent's request as a peer receives it: the sidecar's own `reach-*` headers added.
/// `headers` are the call's (see [`sent_headers`]).
pub(in crate::outbound) fn upstream_request(
    parts: &Parts,
    headers: HeaderMap,
    body: ReachBody,
    snapshot: &Snapshot,
    capability: &str,
    attempt: usize,
) -> Request<ReachBody> {
    let mut request = Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.headers_mut() = headers;
    let h = request.headers_mut();
    // Usually the agent named it already, exactly so: kept, not made again.
    if h.get(headers::CAPABILITY).is_none_or(|v| v != capability) {
        h.insert(headers::CAPABILITY, headers::value(capability));
    }
    h.insert(headers::CALLER, snapshot.agent_name.clone());
    h.insert(headers::ATTEMPT, headers::count(attempt));
    request
}

/// The call's headers for an attempt, a copy staying behind for the next. The attempt takes
/// the map the call arrived in: hyper reuses a connection's maps, so it has room for the
/// sidecar's headers, and the peer's answer is later parsed into it with room for
/// `reach-attempts`. A copy is exactly as long as its headers, and every insert into one
/// reallocated (`docs/perf-levers.md`).
pub(in crate::outbound) fn sent_headers(parts: &mut Parts) -> HeaderMap {
    let copy = parts.headers.clone();
    std::mem::replace(&mut parts.headers, copy)
}
