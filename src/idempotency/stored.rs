//! A response kept for replay: what a duplicate of a finished keyed request gets.

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};

use super::REPLAYED;
use crate::http::{body, ReachBody};

/// A response kept for replay.
#[derive(Debug)]
pub(crate) struct Stored {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Stored {
    pub(super) fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers,
            body,
        }
    }

    /// What keeping it costs: the body, and the head at its text size plus map overhead.
    pub(super) fn size(&self) -> usize {
        let head: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 48)
            .sum();
        self.body.len() + head + 64
    }

    pub(crate) fn replay(&self) -> Response<ReachBody> {
        let mut response = Response::new(body::full(self.body.clone()));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers.clone();
        response
            .headers_mut()
            .insert(REPLAYED, http::HeaderValue::from_static("true"));
        response
    }
}
