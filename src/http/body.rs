//! The one response body type every listener returns, and constructors for it.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A streaming body that may come from an upstream, a buffer, or the sidecar itself.
pub type ReachBody = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> ReachBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn empty() -> ReachBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

pub fn boxed<B>(body: B) -> ReachBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}
