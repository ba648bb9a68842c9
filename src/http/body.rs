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

/// The whole of `body`, up to `max` bytes; `Err` saying why when it breaks off or is longer.
/// Read frame by frame: `Limited` over the boxed body trips the compiler's higher-ranked `From`
/// check inside a generic step.
pub(crate) async fn read_limited(mut body: ReachBody, max: usize) -> Result<Bytes, String> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                return Err(format!("over {max} bytes"));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}
