//! `GET http://<capability>.reach/.well-known/agent-card.json` (or its path-prefix form
//! `http://127.0.0.1:4140/.reach/<capability>/.well-known/agent-card.json`): the card of a peer
//! that serves the capability, fetched through the normal routing, with every interface URL
//! pointed at the same form the card was asked in, its own path kept, so an A2A client that read
//! it through the proxy keeps calling through the proxy (and so through routing) rather than one
//! agent's own address.

use http::{header, HeaderValue, Method, Request, Response, StatusCode};

use crate::a2a::{rewrite_urls, CARD_PATH, MAX_CARD_BYTES};
use crate::error::ReachError;
use crate::http::{body, ReachBody};

/// The capability whose card a request asks for, if it asks for one.
pub(super) fn card_request<B>(req: &Request<B>) -> Option<String> {
    if req.method() != Method::GET || req.uri().path() != CARD_PATH {
        return None;
    }
    super::capability_of(req).ok().map(|c| c.to_string())
}

/// A successful card answer with its URLs rewritten onto `base` (the form the card was asked
/// in: `http://<capability>.reach` unless `prefixed` gives the path-prefix base); any other
/// answer as it came.
pub(super) async fn rewritten(
    capability: &str,
    prefixed: Option<&str>,
    response: Response<ReachBody>,
) -> Response<ReachBody> {
    if response.status() != StatusCode::OK {
        return response;
    }
    let (mut parts, incoming) = response.into_parts();
    let unreadable = |message: String| {
        ReachError::Upstream {
            target: format!("the agent card of {capability}"),
            message,
        }
        .into_response()
    };
    let bytes = match body::read_limited(incoming, MAX_CARD_BYTES).await {
        Ok(bytes) => bytes,
        Err(message) => return unreadable(message),
    };
    let mut card: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(card) => card,
        Err(err) => return unreadable(format!("not JSON: {err}")),
    };
    let base = prefixed.map_or_else(|| format!("http://{capability}.reach"), str::to_owned);
    rewrite_urls(&mut card, &base);
    let text = card.to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, body::full(text))
}
